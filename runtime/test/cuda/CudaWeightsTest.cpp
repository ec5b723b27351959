// The parameter side of the step on the device: the multi-tensor AdamW
// against the host's, bit for bit in fp32; the store's persistent bf16
// copies following every change of the fp32 masters (upload, which a
// checkpoint load goes through, and the optimizer); weight gradients
// accumulated by their GEMM (beta = 1) against a written product plus
// accumulate_gradient.
#include "BundleTestBuilder.h"
#include "CudaTestSupport.h"

#include "cuda/CudaCheck.h"
#include "cuda/Executor.h"
#include "cuda/Optimizer.h"
#include "cuda/ParameterStore.h"
#include "cuda/kernels/Kernels.h"
#include "host/Executor.h"
#include "host/ParameterStore.h"
#include "host/ThreadPool.h"
#include "train/Optimizer.h"

#include <cstring>

using namespace mtrt;
using namespace mtrt::test;

namespace {

/// A bundle whose `op` function reads parameters w [40, 24] (through
/// linear), b [24] (the bias, no weight decay), a large table t
/// [70000 / 10, 10] (more than two AdamW chunks, read by nothing) and writes
/// w's and b's gradients through linear_weight_bias_grad and
/// accumulate_gradient.
Bundle weightsBundle(const std::string &precision) {
  FunctionBuilder f("op");
  int64_t x = f.input({48, 40}, "f32"), dy = f.input({48, 24}, "f32");
  int64_t w = f.op("get_parameter", {}, {40, 24}, {{"parameter", 0}});
  int64_t b = f.op("get_parameter", {}, {24}, {{"parameter", 1}});
  f.output(f.op("linear", {x, w, b}, {48, 24}));
  int64_t dw = f.value({40, 24}), db = f.value({24});
  f.inst("linear_weight_bias_grad", {x, dy}, {dw, db}, Json::object());
  f.inst("accumulate_gradient", {dw}, {}, {{"parameter", 0}});
  f.inst("accumulate_gradient", {db}, {}, {{"parameter", 1}});
  Json model = modelJson(256, 8, 4, 2, 2);
  model["precision"] = precision;
  Json parameters = Json::array(
      {parameterJson("w", {40, 24}), parameterJson("b", {24}, "normal", 0.5, false),
       parameterJson("t", {7000, 10})});
  return Bundle::parseManifest(
      "weights-" + precision,
      manifestJson(model, parameters, Json::array({f.build()})).dump());
}

/// Copies a device bf16 array to the host as floats (exact).
std::vector<float> bf16ToHost(const __nv_bfloat16 *data, int64_t n) {
  std::vector<__nv_bfloat16> raw(static_cast<size_t>(n));
  MTRT_CUDA_CHECK(cudaMemcpy(raw.data(), data, raw.size() * sizeof(raw[0]),
                             cudaMemcpyDeviceToHost),
                  "copying a bf16 copy to the host");
  std::vector<float> out;
  for (__nv_bfloat16 v : raw)
    out.push_back(__bfloat162float(v));
  return out;
}

/// Expects parameter i's bf16 copy to be its fp32 value rounded to nearest.
void expectBf16CopyOf(const cuda::ParameterStore &store, size_t i,
                      const std::string &when) {
  ASSERT_NE(store.bf16Value(i), nullptr) << store.info(i).name;
  host::Tensor value = store.valueToHost(i);
  std::vector<float> copy = bf16ToHost(store.bf16Value(i), store.count(i));
  int64_t wrong = 0;
  for (int64_t e = 0; e < store.count(i); ++e)
    wrong += copy[e] !=
             __bfloat162float(__float2bfloat16_rn(value.data<float>()[e]));
  EXPECT_EQ(wrong, 0) << store.info(i).name << " " << when << ": " << wrong
                      << " of " << store.count(i)
                      << " elements of the bf16 copy are not the value's";
}

void fillGradients(host::ParameterStore &store, uint64_t seed) {
  for (size_t p = 0; p < store.size(); ++p) {
    host::Tensor g = randomTensor(store.gradient(p).shape, seed + p, 0.3);
    std::memcpy(store.gradient(p).buffer.data(), g.buffer.data(),
                g.buffer.size());
  }
}

bool sameBits(const host::Tensor &a, const host::Tensor &b) {
  return a.buffer.size() == b.buffer.size() &&
         std::memcmp(a.buffer.data(), b.buffer.data(), a.buffer.size()) == 0;
}

// Which parameters get a bf16 copy (no GPU needed): those a GEMM reads as
// operand A or B straight from get_parameter, in any function; not a bias,
// a parameter read by other ops only, or one a GEMM reads through another
// op.
TEST(GemmReadParametersTest, OperandsOfGemmsReadStraightFromTheStore) {
  EXPECT_EQ(cuda::ParameterStore::gemmReadParameters(weightsBundle("bf16")),
            (std::vector<bool>{true, false, false}));
  FunctionBuilder first("first"), second("second");
  int64_t x = first.input({4, 6}, "f32");
  int64_t table = first.op("get_parameter", {}, {10, 6}, {{"parameter", 0}});
  first.output(first.op("linear", {x, table}, {4, 10},
                        {{"transpose_weight", true}}));
  int64_t ids = second.input({4}, "i32");
  int64_t again = second.op("get_parameter", {}, {10, 6}, {{"parameter", 0}});
  int64_t rows = second.op("embedding", {again, ids}, {4, 6});
  int64_t scale = second.op("get_parameter", {}, {6, 6}, {{"parameter", 1}});
  int64_t shifted = second.op("add", {scale, scale}, {6, 6});
  second.output(second.op("matmul", {rows, shifted}, {4, 6}));
  int64_t gate = second.op("get_parameter", {}, {6, 6}, {{"parameter", 2}});
  second.output(second.op("matmul", {gate, rows}, {6, 4},
                          {{"transpose_rhs", true}}));
  Json model = modelJson(10, 6, 4, 1, 1);
  model["precision"] = "bf16";
  Bundle bundle = Bundle::parseManifest(
      "reads",
      manifestJson(model,
                   Json::array({parameterJson("table", {10, 6}),
                                parameterJson("scale", {6, 6}),
                                parameterJson("gate", {6, 6})}),
                   Json::array({first.build(), second.build()}))
          .dump());
  EXPECT_EQ(cuda::ParameterStore::gemmReadParameters(bundle),
            (std::vector<bool>{true, false, true}));
}

class CudaWeightsTest : public CudaTest {};

// One launch over every parameter (three, one over several chunks, one
// without weight decay) gives the host's values and moments bit for bit,
// step after step (from the scaled, clipped gradients, which the device
// does not write back: nothing reads them after the update).
TEST_F(CudaWeightsTest, MultiTensorAdamWEqualsTheHostsBitForBit) {
  Bundle bundle = weightsBundle("fp32");
  host::ThreadPool pool(2);
  host::ParameterStore hostStore(bundle, DType::F32);
  hostStore.initialize(pool, 3);
  cuda::ParameterStore deviceStore(bundle, *context);
  train::OptimizerConfig config;
  config.weightDecay = 0.1;
  config.clipGrad = 0.5; // the random gradients' norm is far above: clipped
  config.schedule.maxLr = 1e-2;
  config.schedule.minLr = 1e-3;
  config.schedule.warmupIters = 1;
  config.schedule.decayIters = 10;
  train::Optimizer hostOptimizer(hostStore, pool, config);
  cuda::Optimizer deviceOptimizer(deviceStore, config);
  for (int64_t iteration = 1; iteration <= 3; ++iteration) {
    fillGradients(hostStore, 50 * iteration);
    deviceStore.upload(hostStore);
    train::OptimizerStepResult expected =
        hostOptimizer.step(iteration, 0.5);
    train::OptimizerStepResult actual = deviceOptimizer.step(iteration, 0.5);
    EXPECT_NEAR(actual.gradNorm, expected.gradNorm, 1e-9 * expected.gradNorm);
    EXPECT_EQ(actual.learningRate, expected.learningRate);
    host::ParameterStore back(bundle, DType::F32);
    deviceStore.download(back);
    for (size_t p = 0; p < hostStore.size(); ++p) {
      const std::string &name = hostStore.info(p).name;
      EXPECT_TRUE(sameBits(back.value(p), hostStore.value(p)))
          << name << " at iteration " << iteration;
      EXPECT_TRUE(sameBits(back.expAvg(p), hostStore.expAvg(p))) << name;
      EXPECT_TRUE(sameBits(back.expAvgSq(p), hostStore.expAvgSq(p))) << name;
    }
  }
}

// The multi-tensor AdamW moves four elements at a time where a chunk's
// offsets allow and one at a time elsewhere (parameters of any length
// follow each other in the flat arrays): both give the same bits. The same
// state is stepped once through one chunk from offset 0 (groups of four and
// a tail of 3) and once through chunks from offsets 0, 5 (one at a time)
// and 400 (groups of four again), with and without the gradients' scaling.
TEST_F(CudaWeightsTest, AdamWChunksAtAnyOffsetGiveTheSameBits) {
  const int64_t n = 1003;
  std::vector<float> start(4 * n);
  for (size_t i = 0; i < start.size(); ++i)
    start[i] = static_cast<float>(std::sin(0.37 * double(i) + 0.1) *
                                  (i >= size_t(3 * n) ? 1e-3 : 1.0));
  for (int64_t i = 3 * n; i < 4 * n; ++i) // the second moments: >= 0
    start[i] = std::abs(start[i]);
  auto run = [&](const std::vector<std::pair<int64_t, int64_t>> &pieces,
                 bool scale) {
    cuda::DeviceBuffer state(sizeof(float) * 4 * n, "AdamW state"),
        copy(sizeof(__nv_bfloat16) * n, "bf16 copies"),
        table(sizeof(cuda::AdamWChunk) * pieces.size(), "chunks");
    MTRT_CUDA_CHECK(cudaMemcpy(state.data(), start.data(), state.size(),
                               cudaMemcpyHostToDevice),
                    "uploading");
    std::vector<cuda::AdamWChunk> chunks;
    for (auto [begin, count] : pieces) {
      cuda::AdamWChunk chunk;
      chunk.begin = chunk.stateBegin = chunk.gradBegin = chunk.bf16Begin = begin;
      chunk.count = static_cast<int32_t>(count);
      chunk.weightDecay = 1;
      chunks.push_back(chunk);
    }
    MTRT_CUDA_CHECK(cudaMemcpy(table.data(), chunks.data(), table.size(),
                               cudaMemcpyHostToDevice),
                    "uploading");
    cuda::AdamWScalars s;
    s.decay = 0.999f;
    s.beta1 = 0.9f;
    s.beta2 = 0.95f;
    s.oneMinusBeta1 = 0.1f;
    s.oneMinusBeta2 = 0.05f;
    s.stepSize = 1e-2f;
    s.bias2Sqrt = 0.3f;
    s.eps = 1e-8f;
    s.applyScale = s.applyClip = scale;
    s.gradScale = 0.5f;
    s.clipCoefficient = 0.25f;
    float *base = state.as<float>();
    MTRT_CUDA_CHECK_LAUNCH(
        cuda::adamwStepChunks(context->stream(),
                              static_cast<int64_t>(chunks.size()),
                              table.as<cuda::AdamWChunk>(), base, base + n,
                              base + 2 * n, base + 3 * n,
                              copy.as<__nv_bfloat16>(), s),
        "AdamW");
    context->synchronize("AdamW");
    std::vector<float> out(4 * n);
    MTRT_CUDA_CHECK(cudaMemcpy(out.data(), state.data(), state.size(),
                               cudaMemcpyDeviceToHost),
                    "downloading");
    for (float v : bf16ToHost(copy.as<__nv_bfloat16>(), n))
      out.push_back(v);
    return out;
  };
  for (bool scale : {false, true}) {
    std::vector<float> pieces = run({{0, 5}, {5, 395}, {400, n - 400}}, scale);
    std::vector<float> one = run({{0, n}}, scale);
    ASSERT_EQ(pieces.size(), one.size());
    int64_t differ = 0, changed = 0;
    for (size_t at = 0; at < one.size(); ++at) {
      differ += std::memcmp(&pieces[at], &one[at], sizeof(float)) != 0;
      changed += at < start.size() && one[at] != start[at];
    }
    EXPECT_EQ(differ, 0) << "scaled " << scale;
    EXPECT_GT(changed, 2 * n) << "scaled " << scale;
  }
}

// Under bf16 the parameters GEMMs read as an operand (w; not the bias b,
// which the epilogue reads in fp32, nor the table t) have a bf16 copy that
// follows upload (a checkpoint load's path), the optimizer and initialize.
// The GEMM then reads the refreshed copy.
TEST_F(CudaWeightsTest, Bf16CopiesFollowEveryChangeOfTheMasters) {
  Bundle bundle = weightsBundle("bf16");
  std::vector<bool> read = cuda::ParameterStore::gemmReadParameters(bundle);
  EXPECT_EQ(read, (std::vector<bool>{true, false, false}));
  host::ThreadPool pool(2);
  host::ParameterStore first(bundle, DType::F32);
  first.initialize(pool, 3);
  cuda::ParameterStore store(bundle, *context);
  EXPECT_EQ(store.bf16Value(1), nullptr);
  EXPECT_EQ(store.bf16Value(2), nullptr);
  store.upload(first);
  expectBf16CopyOf(store, 0, "after upload");

  train::OptimizerConfig config;
  config.schedule.maxLr = 1e-1;
  config.schedule.minLr = 1e-1;
  config.schedule.decayIters = 10;
  cuda::Optimizer optimizer(store, config);
  fillGradients(first, 9);
  store.upload(first);
  optimizer.step(1, 1.0);
  host::Tensor stepped = store.valueToHost(0);
  EXPECT_FALSE(sameBits(stepped, first.value(0)));
  expectBf16CopyOf(store, 0, "after an optimizer step");

  store.initialize(77);
  expectBf16CopyOf(store, 0, "after initialize");

  // A checkpoint of other values: the store's copy and the GEMM follow.
  host::ParameterStore loaded(bundle, DType::F32);
  loaded.initialize(pool, 1234);
  store.upload(loaded);
  expectBf16CopyOf(store, 0, "after loading other values");
  host::Tensor x = randomTensor({48, 40}, 1), dy = randomTensor({48, 24}, 2);
  std::vector<host::TensorView> inputs = {viewOf(x), viewOf(dy)};
  host::Executor hostExecutor(bundle, "op", loaded, pool);
  cuda::Executor deviceExecutor(bundle, "op", store);
  host::Tensor expected = std::move(hostExecutor.run(inputs, {})[0]);
  host::Tensor actual = std::move(deviceExecutor.run(inputs, {})[0]);
  expectClose(actual, expected, 2e-2, "linear over the loaded weights");
}

/// The executor runs linear_weight_bias_grad + accumulate_gradient as one
/// GEMM with beta = 1 into the parameter's gradient: it adds to what the
/// gradient held (here nonzero), as the host's accumulate does.
void expectAccumulatedGradients(cuda::Context &context,
                                const std::string &precision,
                                double tolerance) {
  Bundle bundle = weightsBundle(precision);
  host::ThreadPool pool(2);
  host::ParameterStore hostStore(bundle, DType::F32);
  hostStore.initialize(pool, 3);
  fillGradients(hostStore, 21);
  cuda::ParameterStore deviceStore(bundle, context);
  deviceStore.upload(hostStore);
  host::Tensor x = randomTensor({48, 40}, 1), dy = randomTensor({48, 24}, 2);
  std::vector<host::TensorView> inputs = {viewOf(x), viewOf(dy)};
  host::Executor hostExecutor(bundle, "op", hostStore, pool);
  cuda::Executor deviceExecutor(bundle, "op", deviceStore);
  EXPECT_EQ(deviceExecutor.gemmAccumulationCount(), 1u);
  for (int run = 0; run < 2; ++run) {
    hostExecutor.run(inputs, {});
    deviceExecutor.run(inputs, {});
  }
  for (size_t p = 0; p < hostStore.size(); ++p)
    expectClose(deviceStore.gradientToHost(p), hostStore.gradient(p),
                tolerance, precision + " gradient of " + hostStore.info(p).name);
}

TEST_F(CudaWeightsTest, WeightGradientsAccumulatedByTheGemmInFp32) {
  expectAccumulatedGradients(*context, "fp32", 1e-5);
}

TEST_F(CudaWeightsTest, WeightGradientsAccumulatedByTheGemmInBf16) {
  expectAccumulatedGradients(*context, "bf16", 2e-2);
}

/// C (+)= A^T B with and without beta = 1, in fp32 (CUBLAS_COMPUTE_32F):
/// accumulating in the GEMM equals writing the product and adding it, bit
/// for bit, with the same (untuned) algorithm; the bias gradient epilogue
/// writes the same sums either way.
TEST_F(CudaWeightsTest, GemmAccumulationEqualsWriteThenAccumulate) {
  int64_t rows = 96, in = 40, out = 24;
  host::Tensor a = randomTensor({rows, in}, 1), b = randomTensor({rows, out}, 2),
               c = randomTensor({in, out}, 3);
  size_t cBytes = c.buffer.size();
  cuda::DeviceBuffer da(a.buffer.size(), "A"), db(b.buffer.size(), "B"),
      accumulated(cBytes, "C accumulated"), written(cBytes, "C written"),
      product(cBytes, "the product"), biasAccumulated(sizeof(float) * out, "bias"),
      biasWritten(sizeof(float) * out, "bias"),
      scratch(cuda::columnSumScratchBytes(rows, out), "scratch");
  cudaStream_t stream = context->stream();
  auto upload = [&](const cuda::DeviceBuffer &to, const host::Tensor &from) {
    MTRT_CUDA_CHECK(cudaMemcpy(to.data(), from.buffer.data(),
                               from.buffer.size(), cudaMemcpyHostToDevice),
                    "uploading");
  };
  upload(da, a);
  upload(db, b);
  upload(accumulated, c);
  upload(written, c);
  cuda::Gemm gemm(stream, /*tf32=*/false, /*tuning=*/false);
  cuda::GemmEpilogue epilogue;
  epilogue.kind = cuda::GemmEpilogue::Kind::BiasGradB;
  epilogue.scratch = scratch.data();
  epilogue.biasGrad = biasAccumulated.as<float>();
  gemm.run(1, in, out, rows, da.as<float>(), true, db.as<float>(), false,
           accumulated.as<float>(), nullptr, /*accumulate=*/true, {}, epilogue);
  epilogue.biasGrad = biasWritten.as<float>();
  gemm.run(1, in, out, rows, da.as<float>(), true, db.as<float>(), false,
           product.as<float>(), nullptr, /*accumulate=*/false, {}, epilogue);
  MTRT_CUDA_CHECK_LAUNCH(cuda::accumulateInto(stream, in * out, product.as<float>(),
                                        written.as<float>()),
                         "accumulating");
  context->synchronize("the products");
  host::Tensor viaGemm(DType::F32, {in, out}), viaAdd(DType::F32, {in, out});
  host::Tensor biasGemm(DType::F32, {out}), biasAdd(DType::F32, {out});
  auto download = [&](host::Tensor &to, const cuda::DeviceBuffer &from) {
    MTRT_CUDA_CHECK(cudaMemcpy(to.buffer.data(), from.data(), to.buffer.size(),
                               cudaMemcpyDeviceToHost),
                    "downloading");
  };
  download(viaGemm, accumulated);
  download(viaAdd, written);
  download(biasGemm, biasAccumulated);
  download(biasAdd, biasWritten);
  EXPECT_TRUE(sameBits(viaGemm, viaAdd))
      << "relative difference " << relativeDifference(viaGemm, viaAdd);
  EXPECT_TRUE(sameBits(biasGemm, biasAdd));
  // And it is the sum: C + A^T B on the host.
  host::Tensor reference(DType::F32, {in, out});
  for (int64_t i = 0; i < in; ++i)
    for (int64_t j = 0; j < out; ++j) {
      double sum = 0;
      for (int64_t r = 0; r < rows; ++r)
        sum += double(a.data<float>()[r * in + i]) * b.data<float>()[r * out + j];
      reference.data<float>()[i * out + j] =
          static_cast<float>(sum + c.data<float>()[i * out + j]);
    }
  expectClose(viaGemm, reference, 1e-5, "C + A^T B");
}

/// With tuning on, an accumulating product times its candidates into the
/// scratch and adds into C exactly once.
TEST_F(CudaWeightsTest, TunedAccumulatingGemmAddsOnce) {
  int64_t rows = 256, in = 128, out = 192;
  host::Tensor a = randomTensor({rows, in}, 4), b = randomTensor({rows, out}, 5),
               c = randomTensor({in, out}, 6);
  cuda::DeviceBuffer da(a.buffer.size(), "A"), db(b.buffer.size(), "B"),
      dc(c.buffer.size(), "C"), scratch(c.buffer.size(), "scratch");
  MTRT_CUDA_CHECK(cudaMemcpy(da.data(), a.buffer.data(), a.buffer.size(),
                             cudaMemcpyHostToDevice),
                  "uploading");
  MTRT_CUDA_CHECK(cudaMemcpy(db.data(), b.buffer.data(), b.buffer.size(),
                             cudaMemcpyHostToDevice),
                  "uploading");
  MTRT_CUDA_CHECK(cudaMemcpy(dc.data(), c.buffer.data(), c.buffer.size(),
                             cudaMemcpyHostToDevice),
                  "uploading");
  cuda::Gemm gemm(context->stream(), false, /*tuning=*/true);
  cuda::GemmEpilogue epilogue;
  epilogue.tuningScratch = scratch.as<float>();
  gemm.run(1, in, out, rows, da.as<float>(), true, db.as<float>(), false,
           dc.as<float>(), nullptr, true, {}, epilogue);
  context->synchronize("the product");
  host::Tensor result(DType::F32, {in, out}), reference(DType::F32, {in, out});
  MTRT_CUDA_CHECK(cudaMemcpy(result.buffer.data(), dc.data(),
                             result.buffer.size(), cudaMemcpyDeviceToHost),
                  "downloading");
  for (int64_t i = 0; i < in; ++i)
    for (int64_t j = 0; j < out; ++j) {
      double sum = c.data<float>()[i * out + j];
      for (int64_t r = 0; r < rows; ++r)
        sum += double(a.data<float>()[r * in + i]) * b.data<float>()[r * out + j];
      reference.data<float>()[i * out + j] = static_cast<float>(sum);
    }
  expectClose(result, reference, 1e-5, "C + A^T B after tuning");
  ASSERT_FALSE(gemm.tuningChoices().empty());
  EXPECT_NE(gemm.tuningChoices().back().find("accumulating"),
            std::string::npos)
      << gemm.tuningChoices().back();
}

/// A tuned bias-gradient product with bf16 operands (a weight gradient's):
/// the first run (which times the algorithms) and the second (the choice)
/// each give C = A^T B and the bias gradient, B's column sums, as the
/// host's float64 sums of the bf16 operands. The fp32 operand pointers are
/// null: the bias gradient reads the bf16 ones, in cuBLASLt's epilogue or,
/// where cuBLASLt has no algorithm with it, in the column-sum kernel.
TEST_F(CudaWeightsTest, TunedBiasGradientProductMatchesTheHost) {
  int64_t rows = 2048, in = 256, out = 384;
  host::Tensor a = randomTensor({rows, in}, 7),
               b = randomTensor({rows, out}, 8);
  auto rounded = [](const host::Tensor &t) {
    std::vector<__nv_bfloat16> values(static_cast<size_t>(t.numElements()));
    for (int64_t i = 0; i < t.numElements(); ++i)
      values[i] = __float2bfloat16_rn(t.data<float>()[i]);
    return values;
  };
  std::vector<__nv_bfloat16> ha = rounded(a), hb = rounded(b);
  cuda::DeviceBuffer da(sizeof(__nv_bfloat16) * ha.size(), "A"),
      db(sizeof(__nv_bfloat16) * hb.size(), "B"),
      dc(sizeof(float) * in * out, "C"), dbias(sizeof(float) * out, "bias"),
      scratch(cuda::columnSumScratchBytes(rows, out), "scratch");
  MTRT_CUDA_CHECK(
      cudaMemcpy(da.data(), ha.data(), da.size(), cudaMemcpyHostToDevice),
      "uploading");
  MTRT_CUDA_CHECK(
      cudaMemcpy(db.data(), hb.data(), db.size(), cudaMemcpyHostToDevice),
      "uploading");
  host::Tensor cReference(DType::F32, {in, out}),
      biasReference(DType::F32, {out});
  for (int64_t j = 0; j < out; ++j) {
    double sum = 0;
    for (int64_t r = 0; r < rows; ++r)
      sum += __bfloat162float(hb[r * out + j]);
    biasReference.data<float>()[j] = static_cast<float>(sum);
    for (int64_t i = 0; i < in; ++i) {
      double product = 0;
      for (int64_t r = 0; r < rows; ++r)
        product += double(__bfloat162float(ha[r * in + i])) *
                   __bfloat162float(hb[r * out + j]);
      cReference.data<float>()[i * out + j] = static_cast<float>(product);
    }
  }
  cuda::Gemm gemm(context->stream(), false, /*tuning=*/true);
  cuda::Bf16Operands operands{da.as<__nv_bfloat16>(), db.as<__nv_bfloat16>(),
                              false};
  cuda::GemmEpilogue epilogue;
  epilogue.kind = cuda::GemmEpilogue::Kind::BiasGradB;
  epilogue.biasGrad = dbias.as<float>();
  epilogue.scratch = scratch.data();
  for (const char *run : {"the tuning run", "the second run"}) {
    // NaN bytes: an output left unwritten fails.
    MTRT_CUDA_CHECK(cudaMemset(dc.data(), 0xff, dc.size()), "clearing");
    MTRT_CUDA_CHECK(cudaMemset(dbias.data(), 0xff, dbias.size()), "clearing");
    gemm.run(1, in, out, rows, nullptr, true, nullptr, false, dc.as<float>(),
             nullptr, false, operands, epilogue);
    context->synchronize(run);
    host::Tensor c(DType::F32, {in, out}), bias(DType::F32, {out});
    MTRT_CUDA_CHECK(cudaMemcpy(c.buffer.data(), dc.data(), c.buffer.size(),
                               cudaMemcpyDeviceToHost),
                    "downloading");
    MTRT_CUDA_CHECK(cudaMemcpy(bias.buffer.data(), dbias.data(),
                               bias.buffer.size(), cudaMemcpyDeviceToHost),
                    "downloading");
    expectClose(c, cReference, 1e-5, std::string("A^T B, ") + run);
    expectClose(bias, biasReference, 1e-5,
                std::string("the bias gradient, ") + run);
  }
}

} // namespace
