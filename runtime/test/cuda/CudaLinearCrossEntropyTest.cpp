// linear_cross_entropy and scale (megatron-compile
// --fuse-linear-cross-entropy, docs/Memory.md), and the vocabulary-parallel
// linear_vocab_max, linear_vocab_partials and
// linear_vocab_cross_entropy_grad, on the cuda backend: the op
// against the host's on the same inputs (loss, dx, dweight; tied and untied
// weights, chunks that do not divide the tokens, an odd vocabulary, ignored
// labels; fp32, and typed bf16 as mt-mixed-precision types it), and tiny-gpt
// compiled with the fusion training on the GPU as the unfused bundle does,
// in fp32 and bf16.
#include "BundleTestBuilder.h"
#include "CudaTestSupport.h"

#include "cuda/Executor.h"
#include "cuda/ParameterStore.h"
#include "cuda/Trainer.h"
#include "host/Executor.h"
#include "host/ParameterStore.h"
#include "host/ThreadPool.h"
#include "train/Trainer.h"

#include <cmath>
#include <iostream>
#include <sstream>

using namespace mtrt;
using namespace mtrt::test;

namespace {

struct FusedCase {
  bool transposeWeight;
  const char *reduction;
  int64_t chunkRows;
  DType labels;
};

std::string caseName(const FusedCase &c) {
  return std::string(c.transposeWeight ? "tied" : "untied") + "_" +
         c.reduction + "_chunk" + std::to_string(c.chunkRows) +
         (c.labels == DType::I64 ? "_i64" : "_i32");
}

/// How the op is typed: fp32; an fp32 op in a bf16 bundle whose x is a
/// bf16 GEMM's result (format version 1: the runtime picks the types); or
/// typed bf16 as mt-mixed-precision types it (format version 8: x and W
/// casts to bf16, dx bf16, the loss and dweight f32).
enum class Typing { Fp32, Bf16Bundle, TypedBf16 };

/// One function: x [2, 37, 24] (74 tokens), the weight ([24, 333], or
/// [333, 24] transposed), labels with three ignored; the fused op's loss,
/// dx and dweight, and dx scaled by a seed (mt.scale), all outputs (bf16
/// ones cast to f32).
class LinearCrossEntropyOp : public ::testing::TestWithParam<FusedCase> {
protected:
  void check(Typing typing, double tolerance) {
    const bool bf16 = typing == Typing::Bf16Bundle;
    const bool typed = typing == Typing::TypedBf16;
    const char *activation = typed ? "bf16" : "f32";
    const FusedCase c = GetParam();
    const int64_t in = 24, vocab = 333;
    const std::vector<int64_t> rows = {2, 37}, act = {2, 37, in};
    FunctionBuilder f("op");
    std::vector<host::Tensor> inputs;
    auto input = [&](std::vector<int64_t> shape, double scale) {
      int64_t v = f.input(shape, "f32");
      inputs.push_back(randomTensor(shape, 200 + inputs.size(), scale));
      return v;
    };
    int64_t x = bf16 ? input({2, 37, 16}, 1.0) : input(act, 1.0);
    if (bf16) {
      int64_t w0 = input({16, in}, 0.4);
      x = f.op("linear", {x, w0}, act);
    }
    std::vector<int64_t> wShape =
        c.transposeWeight ? std::vector<int64_t>{vocab, in}
                          : std::vector<int64_t>{in, vocab};
    int64_t w = input(wShape, 0.5);
    if (typed) {
      x = f.op("cast", {x}, act, Json::object(), "bf16");
      w = f.op("cast", {w}, wShape, Json::object(), "bf16");
    }
    int64_t labels = f.input(rows, c.labels == DType::I64 ? "i64" : "i32");
    inputs.push_back(randomIds(rows, vocab, 31, c.labels));
    for (int64_t r : {0, 17, 73}) {
      if (c.labels == DType::I64)
        inputs.back().data<int64_t>()[r] = -100;
      else
        inputs.back().data<int32_t>()[r] = -100;
    }
    int64_t seed = input({}, 1.0);
    int64_t loss = f.value({}), dx = f.value(act, activation),
            dw = f.value(wShape);
    f.inst("linear_cross_entropy", {x, w, labels}, {loss, dx, dw},
           {{"reduction", c.reduction},
            {"ignore_index", -100},
            {"chunk_rows", c.chunkRows},
            {"transpose_weight", c.transposeWeight}});
    int64_t scaled = f.op("scale", {dx, seed}, act, Json::object(), activation);
    f.output(loss);
    f.output(typed ? f.op("cast", {dx}, act) : dx);
    f.output(dw);
    f.output(typed ? f.op("cast", {scaled}, act) : scaled);

    Json model = modelJson(256, 8, 4, 2, 2);
    model["precision"] = bf16 || typed ? "bf16" : "fp32";
    Json manifest =
        manifestJson(model, Json::array(), Json::array({f.build()}));
    if (typed)
      manifest["version"] = 8;
    Bundle bundle = Bundle::parseManifest("lce-test", manifest.dump());
    host::ThreadPool pool(2);
    host::ParameterStore hostStore(bundle, DType::F32);
    std::vector<host::TensorView> views;
    for (const host::Tensor &t : inputs)
      views.push_back(viewOf(t));
    host::Executor hostExecutor(bundle, "op", hostStore, pool);
    std::vector<host::Tensor> expected = hostExecutor.run(views, {0, 0});
    MTRT_REQUIRE_GPU();

    cuda::ContextOptions options;
    options.bf16Values = bf16;
    cuda::Context context(options);
    cuda::ParameterStore deviceStore(bundle, context);
    cuda::Executor deviceExecutor(bundle, "op", deviceStore);
    std::vector<host::Tensor> actual = deviceExecutor.run(views, {0, 0});
    ASSERT_EQ(actual.size(), 4u);
    const char *names[] = {"loss", "dx", "dweight", "scaled dx"};
    double worst = 0;
    double leastCosine = 1;
    for (size_t i = 0; i < actual.size(); ++i) {
      expectClose(actual[i], expected[i], tolerance, names[i]);
      worst = std::max(worst, relativeDifference(actual[i], expected[i]));
      leastCosine =
          std::min(leastCosine, cosineSimilarity(actual[i], expected[i]));
      // Typed bf16, both backends round at the same points: a logit whose
      // fp32 sum lands on the other side of a bf16 rounding is the only
      // difference.
      if (typed && i > 0) {
        EXPECT_GE(cosineSimilarity(actual[i], expected[i]), 0.9999)
            << names[i];
      }
    }
    // The loss is a real one (about log(333) for random logits), and the
    // ignored rows' dx is zero.
    EXPECT_GT(expected[0].data<float>()[0], 1.0f);
    for (int64_t e = 0; e < in; ++e)
      EXPECT_EQ(actual[1].data<float>()[17 * in + e], 0.0f);
    std::cout << "[ parity   ] linear_cross_entropy " << caseName(c)
              << (bf16 ? " in a bf16 bundle" : "")
              << (typed ? " typed bf16" : "") << ": loss host "
              << expected[0].data<float>()[0] << " cuda "
              << actual[0].data<float>()[0]
              << ", largest relative difference " << worst
              << ", least cosine similarity " << leastCosine << "\n";
  }
};

TEST_P(LinearCrossEntropyOp, MatchesTheHostInFp32) {
  check(Typing::Fp32, 1e-5);
}

// The linear before it in bf16 (so x differs by bf16 rounding): the fused
// op reads the fp32 value the plan gives it.
TEST_P(LinearCrossEntropyOp, MatchesTheHostInABf16Bundle) {
  check(Typing::Bf16Bundle, 2e-2);
}

// Typed bf16 (mt-mixed-precision's types): cuBLASLt bf16 GEMMs with fp32
// accumulation, the chunk's logits and their gradient in bf16, dx in bf16,
// against the host's emulation of the same roundings. A logit one bf16 step
// apart moves its row's softmax by at most 2^-8 of that logit's share, and
// dx and dweight hold bf16-rounded terms: 1e-2 of the largest element
// (the loss much closer, about 1e-4).
TEST_P(LinearCrossEntropyOp, MatchesTheHostTypedBf16) {
  check(Typing::TypedBf16, 1e-2);
}

INSTANTIATE_TEST_SUITE_P(
    Layouts, LinearCrossEntropyOp,
    ::testing::Values(FusedCase{false, "mean", 16, DType::I32},
                      FusedCase{true, "mean", 16, DType::I32},
                      FusedCase{true, "sum", 30, DType::I64},
                      FusedCase{false, "sum", 7, DType::I64},
                      FusedCase{true, "mean", 128, DType::I32}),
    [](const auto &info) { return caseName(info.param); });

/// The vocabulary-parallel output layer's chunked ops (megatron-compile
/// --fuse-linear-cross-entropy under tensor parallelism) on one rank's
/// whole vocabulary (their blocks across ranks: CudaTensorParallelTest's
/// FusedLoss cases): linear_vocab_max, linear_vocab_partials from its
/// maxima, vocab_cross_entropy and linear_vocab_cross_entropy_grad, all
/// outputs, against the host's on the same inputs; fp32 and typed bf16.
/// (Ignored labels: HostLinearVocabTest's gradient rows.)
class LinearVocabOps : public ::testing::TestWithParam<FusedCase> {
protected:
  void check(bool typed, double tolerance) {
    const char *activation = typed ? "bf16" : "f32";
    const FusedCase c = GetParam();
    const int64_t in = 24, vocab = 333;
    const std::vector<int64_t> rows = {2, 37}, act = {2, 37, in};
    FunctionBuilder f("op");
    std::vector<host::Tensor> inputs;
    auto input = [&](std::vector<int64_t> shape, double scale) {
      int64_t v = f.input(shape, "f32");
      inputs.push_back(randomTensor(shape, 300 + inputs.size(), scale));
      return v;
    };
    int64_t x = input(act, 1.0);
    std::vector<int64_t> wShape = c.transposeWeight
                                      ? std::vector<int64_t>{vocab, in}
                                      : std::vector<int64_t>{in, vocab};
    int64_t w = input(wShape, 0.5);
    if (typed) {
      x = f.op("cast", {x}, act, Json::object(), "bf16");
      w = f.op("cast", {w}, wShape, Json::object(), "bf16");
    }
    // No ignored labels: vocab_partials, fused or not, takes labels of the
    // vocabulary only (the runtime checks them against it).
    int64_t labels = f.input(rows, c.labels == DType::I64 ? "i64" : "i32");
    inputs.push_back(randomIds(rows, vocab, 37, c.labels));
    int64_t seed = input({}, 1.0);
    Json chunk = {{"chunk_rows", c.chunkRows},
                  {"transpose_weight", c.transposeWeight}};
    int64_t max = f.op("linear_vocab_max", {x, w}, rows, chunk);
    std::vector<int64_t> pairs = {2, 37, 2};
    int64_t partials =
        f.op("linear_vocab_partials", {x, w, labels, max}, pairs, chunk);
    Json lossAttrs = {{"reduction", c.reduction}, {"ignore_index", -100}};
    int64_t loss = f.op("vocab_cross_entropy", {partials, labels},
                        std::vector<int64_t>{}, lossAttrs);
    Json gradAttrs = chunk;
    gradAttrs["reduction"] = c.reduction;
    gradAttrs["ignore_index"] = -100;
    int64_t dx = f.value(act, activation), dw = f.value(wShape);
    f.inst("linear_vocab_cross_entropy_grad",
           {x, w, labels, max, partials, seed}, {dx, dw}, gradAttrs);
    f.output(max);
    f.output(partials);
    f.output(loss);
    f.output(typed ? f.op("cast", {dx}, act) : dx);
    f.output(dw);

    Json model = modelJson(256, 8, 4, 2, 2);
    model["precision"] = typed ? "bf16" : "fp32";
    Json manifest =
        manifestJson(model, Json::array(), Json::array({f.build()}));
    if (typed)
      manifest["version"] = 8;
    Bundle bundle = Bundle::parseManifest("lvce-test", manifest.dump());
    host::ThreadPool pool(2);
    host::ParameterStore hostStore(bundle, DType::F32);
    std::vector<host::TensorView> views;
    for (const host::Tensor &t : inputs)
      views.push_back(viewOf(t));
    host::Executor hostExecutor(bundle, "op", hostStore, pool);
    std::vector<host::Tensor> expected = hostExecutor.run(views, {0, 0});
    MTRT_REQUIRE_GPU();

    cuda::Context context;
    cuda::ParameterStore deviceStore(bundle, context);
    cuda::Executor deviceExecutor(bundle, "op", deviceStore);
    std::vector<host::Tensor> actual = deviceExecutor.run(views, {0, 0});
    ASSERT_EQ(actual.size(), 5u);
    const char *names[] = {"max", "partials", "loss", "dx", "dweight"};
    double worst = 0;
    for (size_t i = 0; i < actual.size(); ++i) {
      expectClose(actual[i], expected[i], tolerance, names[i]);
      worst = std::max(worst, relativeDifference(actual[i], expected[i]));
      if (typed && i > 2) {
        EXPECT_GE(cosineSimilarity(actual[i], expected[i]), 0.9999) << names[i];
      }
    }
    EXPECT_GT(expected[2].data<float>()[0], 1.0f);
    std::cout << "[ parity   ] linear_vocab_* " << caseName(c)
              << (typed ? " typed bf16" : "") << ": loss host "
              << expected[2].data<float>()[0] << " cuda "
              << actual[2].data<float>()[0] << ", largest relative difference "
              << worst << "\n";
  }
};

TEST_P(LinearVocabOps, MatchesTheHostInFp32) { check(false, 1e-5); }

// As LinearCrossEntropyOp's typed case: the chunk's logits and their
// gradient bf16 on both backends.
TEST_P(LinearVocabOps, MatchesTheHostTypedBf16) { check(true, 1e-2); }

INSTANTIATE_TEST_SUITE_P(
    Layouts, LinearVocabOps,
    ::testing::Values(FusedCase{false, "mean", 16, DType::I32},
                      FusedCase{true, "mean", 16, DType::I32},
                      FusedCase{true, "sum", 30, DType::I64},
                      FusedCase{false, "sum", 7, DType::I64},
                      FusedCase{true, "mean", 128, DType::I32}),
    [](const auto &info) { return caseName(info.param); });

/// tiny-gpt (tied output layer, no dropout) compiled without and with
/// --fuse-linear-cross-entropy (300 tokens a chunk: 1024 tokens in four
/// chunks, the last of 124): on the GPU, one train_step's loss and every
/// gradient, then training step by step.
struct FusedBundles {
  const char *unfused;
  const char *fused;
  double stepTolerance; // one step's loss (and fp32 gradients: 10x)
  double lossTolerance; // the losses over the training run
  bool bf16;            // gradients compared by cosine similarity
};

class FusedBundleTest : public ::testing::TestWithParam<FusedBundles> {};

TEST_P(FusedBundleTest, TrainsOnTheGpuAsTheUnfusedBundle) {
  MTRT_REQUIRE_GPU();
  const FusedBundles b = GetParam();
  const char *howToMake = "megatron-compile models/tiny-gpt.yaml "
                          "--hidden-dropout=0 --attention-dropout=0 "
                          "[--bf16] [--fuse-linear-cross-entropy "
                          "--linear-cross-entropy-chunk-rows=300]";
  Bundle unfused = loadTestBundle(b.unfused, howToMake);
  Bundle fused = loadTestBundle(b.fused, howToMake);

  host::ThreadPool pool(0);
  host::ParameterStore initial(unfused, DType::F32);
  initial.initialize(pool, 1234);
  initial.zeroGradients(pool);
  // A store uploads into its own bundle's: the fused bundle's, from the same
  // seed, holds the same parameters.
  host::ParameterStore initialFused(fused, DType::F32);
  initialFused.initialize(pool, 1234);
  initialFused.zeroGradients(pool);
  ASSERT_EQ(initialFused.size(), initial.size());
  for (size_t p = 0; p < initial.size(); ++p)
    ASSERT_EQ(relativeDifference(initialFused.value(p), initial.value(p)), 0.0)
        << initial.info(p).name;
  const Function *train = unfused.findFunction("train_step");
  std::vector<int64_t> shape = train->values[train->inputs[0]].shape;
  host::Tensor tokens = randomIds(shape, 256, 3);
  host::Tensor labels = randomIds(shape, 256, 4);
  std::vector<host::TensorView> inputs = {viewOf(tokens), viewOf(labels)};
  cuda::Context context;
  cuda::ParameterStore unfusedStore(unfused, context);
  cuda::ParameterStore fusedStore(fused, context);
  unfusedStore.upload(initial);
  fusedStore.upload(initialFused);
  double expected, actual;
  size_t unfusedArena, fusedArena;
  {
    cuda::Executor executor(unfused, "train_step", unfusedStore);
    expected = executor.run(inputs, {5, 5})[0].data<float>()[0];
    unfusedArena = executor.arenaBytes();
  }
  {
    cuda::Executor executor(fused, "train_step", fusedStore);
    actual = executor.run(inputs, {5, 5})[0].data<float>()[0];
    fusedArena = executor.arenaBytes();
  }
  EXPECT_NEAR(actual, expected, b.stepTolerance * std::abs(expected));
  double worst = 0;
  ASSERT_EQ(fusedStore.size(), unfusedStore.size());
  for (size_t p = 0; p < unfusedStore.size(); ++p) {
    host::Tensor want = unfusedStore.gradientToHost(p);
    host::Tensor got = fusedStore.gradientToHost(p);
    worst = std::max(worst, relativeDifference(got, want));
    if (b.bf16)
      EXPECT_GE(cosineSimilarity(got, want), 0.999)
          << "gradient of " << initial.info(p).name;
    else
      expectClose(got, want, 10 * b.stepTolerance,
                  "gradient of " + initial.info(p).name);
  }
  std::cout << "[ parity   ] " << b.fused << " against " << b.unfused
            << " on the GPU, one train_step: loss " << expected << " / "
            << actual << ", largest relative gradient difference " << worst
            << "; train_step arena " << unfusedArena << " -> " << fusedArena
            << " bytes\n";

  train::TrainerOptions options;
  options.trainIters = 10;
  options.lr = 1e-3;
  options.lrWarmupIters = 2;
  options.evalIters = 0;
  options.progressBar = false;
  options.seed = 1234;
  std::string corpus = multiRankCorpus();
  cuda::Trainer unfusedTrainer(unfused, corpus, "corpus", options);
  cuda::Trainer fusedTrainer(fused, corpus, "corpus", options);
  std::ostringstream unfusedLog, fusedLog;
  unfusedTrainer.train(unfusedLog);
  fusedTrainer.train(fusedLog);
  const auto &want = unfusedTrainer.history();
  const auto &got = fusedTrainer.history();
  ASSERT_EQ(got.size(), want.size());
  double worstLoss = 0;
  for (size_t i = 0; i < want.size(); ++i) {
    double loss = std::abs(got[i].loss - want[i].loss) / std::abs(want[i].loss);
    worstLoss = std::max(worstLoss, loss);
    EXPECT_LE(loss, b.lossTolerance) << "iteration " << i + 1 << ": unfused "
                                     << want[i].loss << ", fused "
                                     << got[i].loss;
  }
  // Training made progress (the check is not between two broken runs).
  EXPECT_LT(want.back().loss, want.front().loss - 0.3);
  std::cout << "[ parity   ] " << b.fused << ", " << want.size()
            << " iterations: loss " << want.front().loss << " -> "
            << want.back().loss << " (unfused) / " << got.back().loss
            << " (fused); largest relative loss difference " << worstLoss
            << "\n";
}

// fp32 without TF32: the same products, summed in other orders (dweight
// over four chunks). bf16: both output layers typed bf16 (bf16 GEMMs, bf16
// logits and dlogits, fp32 statistics and dweight), rounding at the same
// points but for GEMMs of other shapes (a chunk's 300 rows), so a few
// logits round the other way: one step's loss and 10 iterations' within
// 1e-3 (fp32 fused against bf16 unfused, before the op was typed: 1.0e-4
// on the H200), gradients' cosine similarity at least 0.999, as
// CudaMixedPrecisionTest asks of the host and the GPU.
INSTANTIATE_TEST_SUITE_P(
    TinyGpt, FusedBundleTest,
    ::testing::Values(FusedBundles{"tiny-gpt-nodrop", "tiny-gpt-lce-nodrop",
                                   1e-5, 1e-4, false},
                      FusedBundles{"tiny-gpt-bf16-nodrop",
                                   "tiny-gpt-bf16-lce-nodrop", 1e-3, 1e-3,
                                   true}),
    [](const auto &info) {
      std::string name = info.param.fused;
      for (char &ch : name)
        if (ch == '-')
          ch = '_';
      return name;
    });

} // namespace
