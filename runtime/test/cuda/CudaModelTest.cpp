// The cuda backend against the host backend on compiled models (tiny-gpt and
// tiny-llama from models/, compiled by megatron-compile; "-lce": with
// --fuse-linear-cross-entropy, bench/make-device-dir.sh): initialization,
// one train_step's loss and gradients, and training step by step from the
// same seed.
#include "CudaTestSupport.h"

#include "cuda/CudaCheck.h"
#include "cuda/Executor.h"
#include "cuda/Optimizer.h"
#include "cuda/ParameterStore.h"
#include "cuda/Trainer.h"
#include "host/Executor.h"
#include "host/ParameterStore.h"
#include "host/ThreadPool.h"
#include "train/Optimizer.h"
#include "train/Trainer.h"

#include <cstring>
#include <iostream>
#include <sstream>

using namespace mtrt;
using namespace mtrt::test;

namespace {

/// A deterministic text of about `bytes` bytes: words drawn by the
/// counter-based generator, so that a model has something to learn.
std::string syntheticCorpus(size_t bytes) {
  static const char *const words[] = {
      "the",   "cat",  "sat",    "on",    "mat",   "a",      "dog",
      "ran",   "to",   "house",  "and",   "then",  "slept",  "under",
      "tree",  "by",   "river",  "while", "birds", "sang",   "songs",
      "about", "old",  "kings",  "who",   "ruled", "lands",  "far",
      "away",  "from", "quiet",  "seas",  ".",     ",",      "it"};
  constexpr uint64_t kWords = sizeof(words) / sizeof(words[0]);
  std::string text;
  for (uint64_t i = 0; text.size() < bytes; ++i) {
    text += words[random::randomBits(99, 1, i) % kWords];
    text += ' ';
  }
  return text;
}

class CudaModelTest : public ::testing::TestWithParam<const char *> {
protected:
  void SetUp() override {
    MTRT_REQUIRE_GPU();
    bundle = std::make_unique<Bundle>(loadTestBundle(
        GetParam(), "megatron-compile models/<model>.yaml [--bf16]"));
    context = std::make_unique<cuda::Context>();
  }
  std::unique_ptr<Bundle> bundle;
  std::unique_ptr<cuda::Context> context;
};

TEST_P(CudaModelTest, DeviceInitializationMatchesTheHost) {
  host::ThreadPool pool(0);
  host::ParameterStore hostStore(*bundle, DType::F32);
  hostStore.initialize(pool, 1234);
  cuda::ParameterStore deviceStore(*bundle, *context);
  deviceStore.initialize(1234);
  for (size_t p = 0; p < hostStore.size(); ++p)
    expectClose(deviceStore.valueToHost(p), hostStore.value(p), 1e-6,
                hostStore.info(p).name);
}

TEST_P(CudaModelTest, TrainStepLossAndEveryGradientMatchTheHost) {
  host::ThreadPool pool(0);
  host::ParameterStore hostStore(*bundle, DType::F32);
  hostStore.initialize(pool, 1234);
  hostStore.zeroGradients(pool);
  cuda::ParameterStore deviceStore(*bundle, *context);
  deviceStore.upload(hostStore);
  const Function *train = bundle->findFunction("train_step");
  std::vector<int64_t> shape = train->values[train->inputs[0]].shape;
  host::Tensor tokens = randomIds(shape, 256, 3);
  host::Tensor labels = randomIds(shape, 256, 4);
  std::vector<host::TensorView> inputs = {viewOf(tokens), viewOf(labels)};
  host::Executor hostExecutor(*bundle, "train_step", hostStore, pool);
  cuda::Executor deviceExecutor(*bundle, "train_step", deviceStore);
  // Samples from 5 key the dropout masks (tiny-gpt has dropout, tiny-llama
  // none).
  double expected = hostExecutor.run(inputs, {5, 5})[0].data<float>()[0];
  double actual = deviceExecutor.run(inputs, {5, 5})[0].data<float>()[0];
  EXPECT_NEAR(actual, expected, 1e-5 * std::abs(expected));
  double worst = 0;
  for (size_t p = 0; p < hostStore.size(); ++p) {
    host::Tensor gradient = deviceStore.gradientToHost(p);
    worst = std::max(worst, relativeDifference(gradient, hostStore.gradient(p)));
    expectClose(gradient, hostStore.gradient(p), 1e-4,
                "gradient of " + hostStore.info(p).name);
  }
  std::cout << "[ parity   ] " << GetParam() << " train_step: loss host "
            << expected << " cuda " << actual << " (relative difference "
            << std::abs(actual - expected) / std::abs(expected)
            << "), largest relative gradient difference " << worst << "\n";
}

// One micro-batch per iteration: the gradients can stay in train_step's
// arena (ParameterStore::GradientStorage::Arena, docs/Memory.md) instead of
// the store's buffer. Both give the same gradients, to rounding (the GEMM
// writes its product instead of adding it to zero, and cuBLASLt may pick
// another algorithm for that); and AdamW reading them in the arena gives,
// from the same gradients, the bits it gives reading the store's.
TEST_P(CudaModelTest, GradientsInTheArenaEqualTheStoresGradients) {
  const Function *train = bundle->findFunction("train_step");
  ASSERT_TRUE(cuda::ParameterStore::gradientsFitArena(*bundle, *train));
  host::ThreadPool pool(0);
  host::ParameterStore hostStore(*bundle, DType::F32);
  hostStore.initialize(pool, 1234);
  std::vector<int64_t> shape = train->values[train->inputs[0]].shape;
  host::Tensor tokens = randomIds(shape, 256, 3);
  host::Tensor labels = randomIds(shape, 256, 4);
  std::vector<host::TensorView> inputs = {viewOf(tokens), viewOf(labels)};
  cuda::ParameterStore inStore(*bundle, *context);
  cuda::ParameterStore inArena(*bundle, *context, true,
                               cuda::ParameterStore::GradientStorage::Arena);
  EXPECT_EQ(inArena.gradients(), nullptr);
  inStore.upload(hostStore);
  inArena.upload(hostStore);
  cuda::Executor storeStep(*bundle, "train_step", inStore);
  cuda::Executor arenaStep(*bundle, "train_step", inArena);
  EXPECT_GT(storeStep.gemmAccumulationCount(), 0u);
  EXPECT_EQ(arenaStep.gemmAccumulationCount(), 0u);
  inArena.bindGradients(arenaStep.gradientSlots());
  train::OptimizerConfig config;
  config.schedule.maxLr = 1e-3;
  config.clipGrad = 0; // the clip coefficient would round the norm's order
  cuda::Optimizer storeOptimizer(inStore, config),
      arenaOptimizer(inArena, config);
  inStore.zeroGradients();
  double storeLoss = storeStep.run(inputs, {5, 5})[0].data<float>()[0];
  double arenaLoss = arenaStep.run(inputs, {5, 5})[0].data<float>()[0];
  EXPECT_EQ(arenaLoss, storeLoss);
  double worst = 0;
  for (size_t p = 0; p < inStore.size(); ++p) {
    host::Tensor gradient = inArena.gradientToHost(p);
    worst = std::max(worst,
                     relativeDifference(gradient, inStore.gradientToHost(p)));
    expectClose(gradient, inStore.gradientToHost(p), 1e-6,
                "gradient of " + inStore.info(p).name);
    // The same gradients on both sides for the optimizer.
    MTRT_CUDA_CHECK(cudaMemcpy(inStore.gradient(p), inArena.gradient(p),
                               sizeof(float) * size_t(inStore.count(p)),
                               cudaMemcpyDeviceToDevice),
                    "copying a gradient");
  }
  train::OptimizerStepResult storeResult = storeOptimizer.step(1, 0.5);
  train::OptimizerStepResult arenaResult = arenaOptimizer.step(1, 0.5);
  EXPECT_NEAR(arenaResult.gradNorm, storeResult.gradNorm,
              1e-12 * storeResult.gradNorm);
  for (size_t p = 0; p < inStore.size(); ++p) {
    host::Tensor a = inArena.valueToHost(p), b = inStore.valueToHost(p);
    EXPECT_EQ(std::memcmp(a.buffer.data(), b.buffer.data(), a.buffer.size()),
              0)
        << "value of " << inStore.info(p).name;
    a = inArena.gradientToHost(p), b = inStore.gradientToHost(p);
    EXPECT_EQ(std::memcmp(a.buffer.data(), b.buffer.data(), a.buffer.size()),
              0)
        << "scaled gradient of " << inStore.info(p).name;
  }
  std::cout << "[ arena    ] " << GetParam()
            << ": largest relative gradient difference " << worst
            << ", gradient norm " << storeResult.gradNorm << " (store) / "
            << arenaResult.gradNorm << " (arena)\n";
}

// The acceptance check of the backend: the same seed trains to the host's
// losses step by step (relative difference <= 1e-4 in fp32 without TF32),
// the same evaluation loss and the same final parameters.
TEST_P(CudaModelTest, TrainingMatchesTheHostStepByStep) {
  train::TrainerOptions options;
  options.trainIters = 20;
  options.lr = 1e-3;
  options.minLr = 1e-4;
  options.lrWarmupIters = 3;
  options.lrDecayStyle = host::LrDecayStyle::Cosine;
  options.evalInterval = 10;
  options.evalIters = 2;
  options.progressBar = false;
  options.seed = 1234;
  std::string corpus = syntheticCorpus(60000);

  train::Trainer hostTrainer(*bundle, corpus, "synthetic", options);
  cuda::Trainer deviceTrainer(*bundle, corpus, "synthetic", options);
  std::ostringstream hostLog, deviceLog;
  hostTrainer.train(hostLog);
  deviceTrainer.train(deviceLog);

  const auto &expected = hostTrainer.history();
  const auto &actual = deviceTrainer.history();
  ASSERT_EQ(actual.size(), expected.size());
  double worstLoss = 0, worstNorm = 0;
  for (size_t i = 0; i < expected.size(); ++i) {
    double loss = std::abs(actual[i].loss - expected[i].loss) /
                  std::abs(expected[i].loss);
    double norm = std::abs(actual[i].gradNorm - expected[i].gradNorm) /
                  std::abs(expected[i].gradNorm);
    worstLoss = std::max(worstLoss, loss);
    worstNorm = std::max(worstNorm, norm);
    // The acceptance: fp32 within 1e-5 over the first 5 steps.
    if (i < 5) {
      EXPECT_LE(loss, 1e-5) << "iteration " << i + 1;
    }
    EXPECT_LE(loss, 1e-4) << "iteration " << i + 1 << ": loss host "
                          << expected[i].loss << ", cuda " << actual[i].loss;
    EXPECT_LE(norm, 1e-3) << "iteration " << i + 1 << ": grad norm host "
                          << expected[i].gradNorm << ", cuda "
                          << actual[i].gradNorm;
    EXPECT_EQ(actual[i].learningRate, expected[i].learningRate);
  }
  // Training made progress (the check is not between two broken runs).
  EXPECT_LT(expected.back().loss, expected.front().loss - 0.5);

  double hostEval = hostTrainer.evaluate(), deviceEval = deviceTrainer.evaluate();
  EXPECT_NEAR(deviceEval, hostEval, 1e-4 * hostEval);

  deviceTrainer.copyParametersToHost();
  host::ParameterStore &trained = deviceTrainer.host().parameters();
  double worstParameter = 0;
  for (size_t p = 0; p < trained.size(); ++p) {
    double difference = relativeDifference(trained.value(p),
                                           hostTrainer.parameters().value(p));
    worstParameter = std::max(worstParameter, difference);
    EXPECT_LE(difference, 1e-3) << trained.info(p).name;
  }
  std::cout << "[ parity   ] " << GetParam() << ": " << expected.size()
            << " iterations, loss " << expected.front().loss << " -> "
            << expected.back().loss << " (host) / " << actual.back().loss
            << " (cuda); largest relative loss difference " << worstLoss
            << ", grad-norm difference " << worstNorm
            << ", final-parameter difference " << worstParameter
            << "; eval loss host " << hostEval << " cuda " << deviceEval
            << "\n";
  std::cout << "cuda log:\n" << deviceLog.str();
}

INSTANTIATE_TEST_SUITE_P(Models, CudaModelTest,
                         ::testing::Values("tiny-gpt", "tiny-llama",
                                           "tiny-gpt-fused", "tiny-gpt-lce",
                                           "tiny-llama-lce"),
                         [](const auto &info) {
                           std::string name = info.param;
                           for (char &ch : name)
                             if (ch == '-')
                               ch = '_';
                           return name;
                         });

// Mixed precision (bundles compiled with --bf16) against the host backend,
// which runs the same typed bundle, rounding to bf16 where the IR stores
// bf16 (format version 8; before, it computed in fp32): the bounds, loss
// within 2e-2 relative and every gradient's cosine similarity at least
// 0.999 on one step, losses within 2e-2 over 5 training steps.
class CudaMixedPrecisionTest : public CudaModelTest {};

TEST_P(CudaMixedPrecisionTest, TrainStepLossAndGradientsAgreeWithTheHost) {
  ASSERT_EQ(bundle->model().precision, "bf16");
  host::ThreadPool pool(0);
  host::ParameterStore hostStore(*bundle, DType::F32);
  hostStore.initialize(pool, 1234);
  hostStore.zeroGradients(pool);
  cuda::ParameterStore deviceStore(*bundle, *context);
  deviceStore.upload(hostStore);
  const Function *train = bundle->findFunction("train_step");
  std::vector<int64_t> shape = train->values[train->inputs[0]].shape;
  host::Tensor tokens = randomIds(shape, 256, 3);
  host::Tensor labels = randomIds(shape, 256, 4);
  std::vector<host::TensorView> inputs = {viewOf(tokens), viewOf(labels)};
  host::Executor hostExecutor(*bundle, "train_step", hostStore, pool);
  cuda::Executor deviceExecutor(*bundle, "train_step", deviceStore);
  EXPECT_TRUE(deviceExecutor.mixedPrecision());
  double expected = hostExecutor.run(inputs, {5, 5})[0].data<float>()[0];
  double actual = deviceExecutor.run(inputs, {5, 5})[0].data<float>()[0];
  EXPECT_NEAR(actual, expected, 2e-2 * std::abs(expected));
  double worst = 1, difference = 0, norm = 0;
  for (size_t p = 0; p < hostStore.size(); ++p) {
    host::Tensor device = deviceStore.gradientToHost(p);
    const host::Tensor &reference = hostStore.gradient(p);
    double cosine = cosineSimilarity(device, reference);
    worst = std::min(worst, cosine);
    EXPECT_GE(cosine, 0.999) << "gradient of " << hostStore.info(p).name;
    for (int64_t i = 0; i < reference.numElements(); ++i) {
      double x = elementAt(device, i), y = elementAt(reference, i);
      difference += (x - y) * (x - y);
      norm += y * y;
    }
  }
  // The whole gradient within 2e-2 of the host's in norm: bf16 rounding
  // gives about 3e-3; an instruction writing past its result (a bf16 GEMM
  // result's bias vector did, under full recomputation) gave 5.6e-2.
  double relative = std::sqrt(difference / norm);
  EXPECT_LE(relative, 2e-2) << "the gradient's relative difference";
  std::cout << "[ parity   ] " << GetParam() << " bf16 train_step: loss host "
            << expected << " cuda " << actual << " (relative difference "
            << std::abs(actual - expected) / std::abs(expected)
            << "), smallest gradient cosine similarity " << worst
            << ", the gradient's relative difference " << relative << "\n";
}

TEST_P(CudaMixedPrecisionTest, FiveTrainingStepsAgreeWithTheHost) {
  train::TrainerOptions options;
  options.trainIters = 5;
  options.lr = 1e-3;
  options.lrWarmupIters = 1;
  options.evalIters = 0;
  options.progressBar = false;
  options.seed = 1234;
  std::string corpus = syntheticCorpus(60000);
  train::Trainer hostTrainer(*bundle, corpus, "synthetic", options);
  cuda::Trainer deviceTrainer(*bundle, corpus, "synthetic", options);
  std::ostringstream hostLog, deviceLog;
  hostTrainer.train(hostLog);
  deviceTrainer.train(deviceLog);
  const auto &expected = hostTrainer.history();
  const auto &actual = deviceTrainer.history();
  ASSERT_EQ(actual.size(), expected.size());
  double worst = 0;
  for (size_t i = 0; i < expected.size(); ++i) {
    double loss = std::abs(actual[i].loss - expected[i].loss) /
                  std::abs(expected[i].loss);
    worst = std::max(worst, loss);
    EXPECT_LE(loss, 2e-2) << "iteration " << i + 1 << ": loss host "
                          << expected[i].loss << ", cuda " << actual[i].loss;
  }
  std::cout << "[ parity   ] " << GetParam() << " bf16, " << expected.size()
            << " iterations: loss " << expected.front().loss << " -> "
            << expected.back().loss << " (host) / " << actual.back().loss
            << " (cuda); largest relative loss difference " << worst << "\n";
}

INSTANTIATE_TEST_SUITE_P(Models, CudaMixedPrecisionTest,
                         ::testing::Values("tiny-gpt-bf16", "tiny-llama-bf16",
                                           "tiny-gpt-bf16-fused",
                                           "tiny-gpt-bf16-l8-s64-full",
                                           "tiny-gpt-bf16-lce"),
                         [](const auto &info) {
                           std::string name = info.param;
                           for (char &ch : name)
                             if (ch == '-')
                               ch = '_';
                           return name;
                         });

} // namespace
