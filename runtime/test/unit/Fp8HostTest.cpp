// The host backend's FP8 instructions (docs/BundleFormat.md, "FP8"): casts
// rounded as core/Fp8.h rounds, the GEMM of the codes divided by both
// scales, and delayed scaling's state advanced by fp8_update, against a
// reference computed here in double from the formats' arithmetic.
#include "BundleTestBuilder.h"

#include "core/Fp8.h"
#include "host/Executor.h"
#include "host/ParameterStore.h"
#include "host/ThreadPool.h"

#include <cmath>

using namespace mtrt;
using namespace mtrt::host;
using namespace mtrt::test;

namespace {

constexpr int64_t Rows = 4, In = 16, Out = 8;

/// The value x * scale takes as a code of `format`.
double code(double x, float scale, fp8::Format format) {
  return fp8::decode(fp8::encode(static_cast<float>(x) * scale, format),
                     format);
}

/// x and w (in the function's inputs' order) with magnitudes over several
/// binades, and amaxes 3.5 and 0.75.
std::vector<float> inputValues(int64_t n, double amax, int salt) {
  std::vector<float> v(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i)
    v[i] = static_cast<float>(amax * std::sin(0.37 * (i + 1) + salt) *
                              std::pow(2.0, -(i % 5)));
  v[static_cast<size_t>(n / 2)] = static_cast<float>(-amax);
  return v;
}

/// A function that casts x [Rows, In] (E4M3) and w [In, Out] (E5M2 when
/// `hybrid`) with their metas' scales, multiplies them in FP8 and records
/// both amaxes.
Json fp8Manifest(bool hybrid, int64_t historyLength, const char *algorithm) {
  const char *wFormat = hybrid ? "f8e5m2" : "f8e4m3";
  FunctionBuilder f("step");
  int64_t x = f.input({Rows, In}, "f32");
  int64_t w = f.input({In, Out}, "f32");
  int64_t sx = f.op("fp8_scale", {}, {}, {{"meta", 0}});
  int64_t xq = f.value({Rows, In}, "f8e4m3"), ax = f.value({});
  f.inst("fp8_quantize", {x, sx}, {xq, ax});
  int64_t sw = f.op("fp8_scale", {}, {}, {{"meta", 1}});
  int64_t wq = f.value({In, Out}, wFormat), aw = f.value({});
  f.inst("fp8_quantize", {w, sw}, {wq, aw});
  int64_t y = f.op("fp8_linear", {xq, sx, wq, sw}, {Rows, Out});
  f.inst("fp8_update", {ax}, {}, {{"meta", 0}});
  f.inst("fp8_update", {aw}, {}, {{"meta", 1}});
  f.output(y);
  Json m = manifestJson(modelJson(8, 4, 3, 2, 2), Json::array(),
                        Json::array({f.build()}));
  m["version"] = 10;
  m["fp8"] = {{"format", hybrid ? "hybrid" : "e4m3"},
              {"scaling", "delayed"},
              {"amax_history_len", historyLength},
              {"amax_compute_algo", algorithm},
              {"margin", 0},
              {"metas",
               {{{"name", "x"}, {"format", "f8e4m3"}},
                {{"name", "w"}, {"format", wFormat}}}}};
  return m;
}

} // namespace

// Two steps: the first casts with scale 1, the second with the scales the
// first step's amaxes gave (max_finite / amax); both products equal the
// double sums of the codes divided by the scales.
TEST(Fp8HostTest, DelayedScalingCastsMultipliesAndUpdates) {
  for (bool hybrid : {false, true}) {
    Bundle bundle =
        Bundle::parseManifest("fp8", fp8Manifest(hybrid, 2, "max").dump());
    fp8::Format wFormat = hybrid ? fp8::Format::E5M2 : fp8::Format::E4M3;
    ThreadPool pool(3);
    ParameterStore store(bundle, DType::F32);
    ASSERT_TRUE(store.hasFp8());
    Executor executor(bundle, "step", store, pool);
    std::vector<float> x = inputValues(Rows * In, 3.5, 0);
    std::vector<float> w = inputValues(In * Out, 0.75, 1);
    float sx = 1.0f, sw = 1.0f;
    for (int step = 0; step < 2; ++step) {
      std::vector<Tensor> out = executor.run(
          {{DType::F32, {Rows, In}, x.data()}, {DType::F32, {In, Out}, w.data()}},
          {});
      ASSERT_EQ(out.size(), 1u);
      double descale = (1.0 / sx) * (1.0 / sw);
      for (int64_t r = 0; r < Rows; ++r)
        for (int64_t c = 0; c < Out; ++c) {
          double sum = 0;
          for (int64_t k = 0; k < In; ++k)
            sum += code(x[r * In + k], sx, fp8::Format::E4M3) *
                   code(w[k * Out + c], sw, wFormat);
          double expected = sum * descale;
          EXPECT_NEAR(out[0].data<float>()[r * Out + c], expected,
                      1e-5 * (1 + std::fabs(expected)))
              << "step " << step << " hybrid " << hybrid << " at " << r
              << ", " << c;
        }
      // fp8_update: the history's newest amax is the input's, and the next
      // scale is max_finite / amax (the history holds one amax, then two
      // equal ones).
      float xAmax = 3.5f, wAmax = 0.75f;
      EXPECT_EQ(store.fp8().history(0)[0], xAmax);
      EXPECT_EQ(store.fp8().history(1)[0], wAmax);
      EXPECT_EQ(store.fp8().history(0)[1], step == 0 ? 0.0f : xAmax);
      sx = fp8::maxFinite(fp8::Format::E4M3) / xAmax;
      sw = fp8::maxFinite(wFormat) / wAmax;
      EXPECT_EQ(store.fp8().scale(0), sx);
      EXPECT_EQ(store.fp8().scale(1), sw);
    }
    // initialize() starts the state afresh.
    store.initialize(pool, 1);
    EXPECT_EQ(store.fp8().scale(0), 1.0f);
    EXPECT_EQ(store.fp8().history(0)[0], 0.0f);
  }
}

// most_recent takes the newest amax even when the history holds a larger
// one; max takes the largest.
TEST(Fp8HostTest, TheComputeAlgorithmPicksTheAmax) {
  for (const char *algorithm : {"most_recent", "max"}) {
    Bundle bundle =
        Bundle::parseManifest("fp8", fp8Manifest(false, 4, algorithm).dump());
    ThreadPool pool(1);
    ParameterStore store(bundle, DType::F32);
    Executor executor(bundle, "step", store, pool);
    std::vector<float> w = inputValues(In * Out, 0.75, 1);
    for (double amax : {3.5, 1.25}) {
      std::vector<float> x = inputValues(Rows * In, amax, 0);
      executor.run({{DType::F32, {Rows, In}, x.data()},
                    {DType::F32, {In, Out}, w.data()}},
                   {});
    }
    float expected = fp8::maxFinite(fp8::Format::E4M3) /
                     (std::string(algorithm) == "max" ? 3.5f : 1.25f);
    EXPECT_EQ(store.fp8().scale(0), expected) << algorithm;
  }
}

// fp8_current_scale: max_finite / amax / 2^margin of the tensor itself.
TEST(Fp8HostTest, CurrentScalingUsesTheTensorsOwnAmax) {
  FunctionBuilder f("scale");
  int64_t x = f.input({Rows, In}, "f32");
  f.output(f.op("fp8_current_scale", {x}, {},
                {{"format", "f8e5m2"}, {"margin", 2}}));
  Json m = manifestJson(modelJson(8, 4, 3, 2, 2), Json::array(),
                        Json::array({f.build()}));
  m["version"] = 10;
  Bundle bundle = Bundle::parseManifest("fp8", m.dump());
  ThreadPool pool(2);
  ParameterStore store(bundle, DType::F32);
  EXPECT_FALSE(store.hasFp8());
  Executor executor(bundle, "scale", store, pool);
  std::vector<float> values = inputValues(Rows * In, 3.5, 0);
  std::vector<Tensor> out =
      executor.run({{DType::F32, {Rows, In}, values.data()}}, {});
  EXPECT_EQ(out[0].data<float>()[0],
            fp8::maxFinite(fp8::Format::E5M2) / 3.5f / 4.0f);
}

// The reader refuses what the tensor cores cannot run and metas that do not
// exist, naming the value and the limit.
TEST(Fp8HostTest, TheReaderRefusesImpossibleFp8Instructions) {
  Json twoE5m2 = fp8Manifest(true, 1, "max");
  Json &values = twoE5m2["functions"][0]["values"];
  values[3]["dtype"] = "f8e5m2"; // x's codes too
  expectManifestRejected(twoE5m2, {"f8e4m3 when the input is f8e5m2",
                                   "at most one E5M2 operand"});
  Json noMeta = fp8Manifest(false, 1, "max");
  noMeta["functions"][0]["instructions"][0]["attrs"]["meta"] = 2;
  expectManifestRejected(noMeta, {"an FP8 meta index in [0, 2)"});
  Json badFormat = fp8Manifest(false, 1, "max");
  badFormat["fp8"]["metas"][1]["format"] = "bf16";
  expectManifestRejected(badFormat, {"\"f8e4m3\" or \"f8e5m2\""});
}
