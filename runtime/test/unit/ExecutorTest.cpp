// Tests of the host executor: losses and gradients against float64 references,
// runtime checks, memory.
#include "BundleTestBuilder.h"

#include "host/Executor.h"
#include "host/ParameterStore.h"
#include "host/ThreadPool.h"

#include <cmath>

using namespace mtrt;
using namespace mtrt::host;
using namespace mtrt::test;

namespace {

constexpr int64_t V = 8, H = 4, B = 2, S = 3;

/// Reads element i of a float or double tensor as double.
double at(const Tensor &t, int64_t i) {
  return t.dtype == DType::F64 ? t.data<double>()[i]
                               : static_cast<double>(t.data<float>()[i]);
}

/// The bigram model's loss and gradients, computed here in double from the
/// store's parameter values, independently of the kernels.
struct Reference {
  double loss = 0;
  std::vector<double> dtable, dw, db;
};

Reference reference(const ParameterStore &store,
                    const std::vector<int32_t> &tokens,
                    const std::vector<int32_t> &labels) {
  const Tensor &table = store.value(0), &w = store.value(1),
               &b = store.value(2);
  int64_t rows = static_cast<int64_t>(tokens.size());
  Reference ref;
  ref.dtable.assign(V * H, 0);
  ref.dw.assign(H * V, 0);
  ref.db.assign(V, 0);
  for (int64_t r = 0; r < rows; ++r) {
    std::vector<double> x(H), logits(V), p(V);
    for (int64_t h = 0; h < H; ++h)
      x[h] = at(table, tokens[r] * H + h);
    double max = -1e300;
    for (int64_t v = 0; v < V; ++v) {
      logits[v] = at(b, v);
      for (int64_t h = 0; h < H; ++h)
        logits[v] += x[h] * at(w, h * V + v);
      max = std::max(max, logits[v]);
    }
    double sum = 0;
    for (int64_t v = 0; v < V; ++v)
      sum += std::exp(logits[v] - max);
    ref.loss += (max + std::log(sum) - logits[labels[r]]) / rows;
    for (int64_t v = 0; v < V; ++v) {
      double d = (std::exp(logits[v] - max) / sum - (v == labels[r])) / rows;
      ref.db[v] += d;
      for (int64_t h = 0; h < H; ++h) {
        ref.dw[h * V + v] += x[h] * d;
        ref.dtable[tokens[r] * H + h] += d * at(w, h * V + v);
      }
    }
  }
  return ref;
}

void expectClose(const Tensor &actual, const std::vector<double> &expected,
                 double relative, double scale, const char *what) {
  ASSERT_EQ(actual.numElements(), static_cast<int64_t>(expected.size()));
  double largest = 0;
  for (double e : expected)
    largest = std::max(largest, std::abs(e));
  for (size_t i = 0; i < expected.size(); ++i)
    EXPECT_NEAR(at(actual, static_cast<int64_t>(i)), scale * expected[i],
                relative * scale * largest)
        << what << "[" << i << "]";
}

class ExecutorTest : public ::testing::TestWithParam<DType> {
protected:
  ExecutorTest()
      : bundle(
            Bundle::parseManifest("bigram", bigramManifest(V, H, B, S).dump())),
        pool(2), store(bundle, GetParam()) {
    store.initialize(pool, 7);
    // A bias that is not zero, so that its path is checked.
    for (int64_t v = 0; v < V; ++v) {
      if (GetParam() == DType::F64)
        store.value(2).data<double>()[v] = 0.1 * static_cast<double>(v) - 0.3;
      else
        store.value(2).data<float>()[v] = 0.1f * static_cast<float>(v) - 0.3f;
    }
  }

  std::vector<TensorView> inputs() {
    return {{DType::I32, {B, S}, tokens.data()},
            {DType::I32, {B, S}, labels.data()}};
  }
  double tolerance() const { return GetParam() == DType::F64 ? 1e-13 : 2e-6; }

  Bundle bundle;
  ThreadPool pool;
  ParameterStore store;
  std::vector<int32_t> tokens = {1, 5, 7, 0, 5, 2};
  std::vector<int32_t> labels = {5, 7, 0, 3, 2, 2};
};

TEST_P(ExecutorTest, LossAndGradientsMatchAFloat64Reference) {
  Executor executor(bundle, "train_step", store, pool);
  store.zeroGradients(pool);
  std::vector<Tensor> outputs = executor.run(inputs(), {});
  ASSERT_EQ(outputs.size(), 1u);
  EXPECT_EQ(outputs[0].dtype, GetParam());
  EXPECT_TRUE(outputs[0].shape.empty());

  Reference ref = reference(store, tokens, labels);
  EXPECT_NEAR(at(outputs[0], 0), ref.loss, tolerance() * ref.loss);
  expectClose(store.gradient(0), ref.dtable, tolerance(), 1, "dtable");
  expectClose(store.gradient(1), ref.dw, tolerance(), 1, "dW");
  expectClose(store.gradient(2), ref.db, tolerance(), 1, "db");

  // accumulate_gradient adds: a second micro-batch doubles the gradients.
  executor.run(inputs(), {1, 1});
  expectClose(store.gradient(1), ref.dw, tolerance(), 2, "dW twice");
  expectClose(store.gradient(0), ref.dtable, tolerance(), 2, "dtable twice");
}

TEST_P(ExecutorTest, EvalAndPredictShareTheParameters) {
  Executor train(bundle, "train_step", store, pool);
  Executor eval(bundle, "eval_step", store, pool);
  Executor predict(bundle, "predict_step", store, pool);
  double loss = at(train.run(inputs(), {})[0], 0);
  EXPECT_EQ(at(eval.run(inputs(), {})[0], 0), loss);
  std::vector<Tensor> logits = predict.run({inputs()[0]}, {});
  EXPECT_EQ(logits[0].shape, (std::vector<int64_t>{B, S, V}));
  // Row 0's logits are table[1] @ W + b.
  for (int64_t v = 0; v < V; ++v) {
    double expected = at(store.value(2), v);
    for (int64_t h = 0; h < H; ++h)
      expected += at(store.value(0), 1 * H + h) * at(store.value(1), h * V + v);
    EXPECT_NEAR(at(logits[0], v), expected, 1e-6);
  }
}

INSTANTIATE_TEST_SUITE_P(FloatTypes, ExecutorTest,
                         ::testing::Values(DType::F32, DType::F64),
                         [](const auto &info) {
                           return std::string(dtypeName(info.param));
                         });

class ExecutorChecksTest : public ::testing::Test {
protected:
  ExecutorChecksTest()
      : bundle(
            Bundle::parseManifest("bigram", bigramManifest(V, H, B, S).dump())),
        pool(1), store(bundle) {
    store.initialize(pool, 1);
  }
  Bundle bundle;
  ThreadPool pool;
  ParameterStore store;
};

TEST_F(ExecutorChecksTest, TokenIdsOutsideTheVocabularyAreNamed) {
  Executor executor(bundle, "train_step", store, pool);
  std::vector<int32_t> tokens = {1, 2, 3, 4, 9, 0}, labels(6, 1);
  expectError(
      [&] {
        executor.run({{DType::I32, {B, S}, tokens.data()},
                      {DType::I32, {B, S}, labels.data()}},
                     {});
      },
      MTRT_STATUS_OUT_OF_RANGE,
      {"train_step: instructions[3] (embedding)", "holds id 9 at element 4",
       "outside [0, 8)", "vocabulary size is 8"});
  tokens[4] = 4;
  labels[2] = -1;
  expectError(
      [&] {
        executor.run({{DType::I32, {B, S}, tokens.data()},
                      {DType::I32, {B, S}, labels.data()}},
                     {});
      },
      MTRT_STATUS_OUT_OF_RANGE,
      {"train_step: instructions[5] (cross_entropy)",
       "holds label -1 at element 2", "ignore_index is -100"});
  // The executor recovers: ignored labels are fine, and a good run works.
  labels[2] = -100;
  executor.run({{DType::I32, {B, S}, tokens.data()},
                {DType::I32, {B, S}, labels.data()}},
               {});
}

TEST_F(ExecutorChecksTest, InputsMustMatchTheSignature) {
  Executor executor(bundle, "train_step", store, pool);
  std::vector<int64_t> wide(B * S, 1);
  std::vector<int32_t> narrow(B * S, 1);
  expectError(
      [&] {
        executor.run({{DType::I64, {B, S}, wide.data()},
                      {DType::I32, {B, S}, narrow.data()}},
                     {});
      },
      MTRT_STATUS_INVALID_ARGUMENT,
      {"train_step: inputs[0] (value 0): found [2, 3] i64, expected [2, 3] "
       "i32"});
  expectError(
      [&] {
        executor.run({{DType::I32, {B, S}, narrow.data()}}, {});
      },
      MTRT_STATUS_INVALID_ARGUMENT, {"train_step: got 1 inputs, expected 2"});
  expectError([&] { Executor(bundle, "decode_step", store, pool); },
              MTRT_STATUS_NOT_FOUND,
              {"bundle 'bigram' has no function 'decode_step'",
               "train_step, eval_step, predict_step"});
}

TEST_F(ExecutorChecksTest, FreedValuesAreReusedAcrossRuns) {
  Executor executor(bundle, "train_step", store, pool);
  std::vector<int32_t> tokens(B * S, 1);
  std::vector<TensorView> in = {{DType::I32, {B, S}, tokens.data()},
                                {DType::I32, {B, S}, tokens.data()}};
  executor.run(in, {});
  size_t peak = executor.peakBytes();
  for (int i = 0; i < 3; ++i)
    executor.run(in, {});
  EXPECT_EQ(executor.peakBytes(), peak);
  // Frees matter: the peak is below the sum of every value's size.
  size_t total = 0;
  for (const TensorType &t : executor.function().values)
    total += static_cast<size_t>(t.numElements) * 4;
  EXPECT_GT(peak, 0u);
  EXPECT_LT(peak, total);
}

// Mixed precision (format version 8): the host stores a value declared bf16
// in its float type and rounds it to nearest even where it is written, ties
// to even, overflow to infinity; a cast to f32 is exact. Both float types
// give the same values (f64 storage rounds without an f32 step).
TEST(ExecutorTypesTest, Bf16ValuesAreRoundedToNearestEven) {
  FunctionBuilder f("op");
  int64_t x = f.input({8}, "f32");
  int64_t narrow = f.op("cast", {x}, {8}, Json::object(), "bf16");
  int64_t doubled = f.op("add", {narrow, narrow}, {8}, Json::object(), "bf16");
  f.output(f.op("cast", {narrow}, {8}));
  f.output(f.op("cast", {doubled}, {8}));
  Json m = manifestJson(modelJson(V, H, S, B, B), Json::array(),
                        Json::array({f.build()}));
  m["version"] = 8;
  Bundle bundle = Bundle::parseManifest("bf16", m.dump());
  const double tie = 1 + std::ldexp(1.0, -8), oddTie = 1 + 3 * std::ldexp(1.0, -8);
  const double above = tie + std::ldexp(1.0, -20);
  const std::vector<double> inputs = {tie,   oddTie, above, -above,
                                      0.1f,  -1.5,   0.0,   3.4e38};
  const std::vector<double> rounded = {
      1.0, 1 + std::ldexp(1.0, -6), 1 + std::ldexp(1.0, -7),
      -(1 + std::ldexp(1.0, -7)), 0.10009765625, -1.5, 0.0, INFINITY};
  for (DType floatType : {DType::F32, DType::F64}) {
    ThreadPool pool(1);
    ParameterStore store(bundle, floatType);
    Executor executor(bundle, "op", store, pool);
    std::vector<float> single(inputs.begin(), inputs.end());
    std::vector<double> wide(single.begin(), single.end());
    const void *data = floatType == DType::F32
                           ? static_cast<const void *>(single.data())
                           : static_cast<const void *>(wide.data());
    std::vector<Tensor> out = executor.run({{floatType, {8}, data}}, {});
    ASSERT_EQ(out.size(), 2u);
    for (size_t i = 0; i < inputs.size(); ++i) {
      auto at = [&](const Tensor &t) {
        return floatType == DType::F32 ? double(t.data<float>()[i])
                                       : t.data<double>()[i];
      };
      EXPECT_EQ(at(out[0]), rounded[i])
          << dtypeName(floatType) << " storage, input " << inputs[i];
      EXPECT_EQ(at(out[1]), 2 * rounded[i])
          << dtypeName(floatType) << " storage, input " << inputs[i];
    }
  }
}

// A value declared f16 is refused: fp16 training keeps its values f32.
TEST(ExecutorTypesTest, F16ValuesAreRefused) {
  FunctionBuilder f("op");
  int64_t x = f.input({8}, "f32");
  f.output(f.op("cast", {f.op("cast", {x}, {8}, Json::object(), "f16")}, {8}));
  Json m = manifestJson(modelJson(V, H, S, B, B), Json::array(),
                        Json::array({f.build()}));
  Bundle bundle = Bundle::parseManifest("half", m.dump());
  ThreadPool pool(1);
  ParameterStore store(bundle, DType::F32);
  expectError([&] { Executor(bundle, "op", store, pool); },
              MTRT_STATUS_UNIMPLEMENTED,
              {"bundle 'half': op.values[1] is f16",
               "recompile the model with megatron-compile"});
}

TEST(ExecutorTypesTest, HalfPrecisionIsRejectedOnTheHost) {
  Json m = bigramManifest(V, H, B, S);
  for (Json &f : m["functions"])
    for (Json &v : f["values"])
      if (v["dtype"] == "f32")
        v["dtype"] = "bf16";
  for (Json &p : m["parameters"])
    p["dtype"] = "bf16";
  Bundle bundle = Bundle::parseManifest("half", m.dump());
  expectError([&] { ParameterStore store(bundle); }, MTRT_STATUS_UNIMPLEMENTED,
              {"parameters[0] (embedding.word_embeddings.weight) is bf16",
               "compile the model with precision fp32"});
}

} // namespace
