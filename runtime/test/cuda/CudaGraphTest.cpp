// CUDA graphs (ContextOptions::cudaGraphs): the step replayed from its graph
// gives the bits of the step run instruction by instruction, with dropout on
// (the graph's dropout keys updated per step), over several steps, with
// inputs copied in or bound in place from device memory.
#include "CudaTestSupport.h"

#include "cuda/CudaCheck.h"
#include "cuda/Executor.h"
#include "cuda/ParameterStore.h"

#include <cstring>
#include <iostream>

using namespace mtrt;
using namespace mtrt::test;

namespace {

/// One executor of train_step on its own context and parameters, with or
/// without graphs; the same seed gives both the same parameters.
struct Runner {
  Runner(const Bundle &bundle, bool graphs) {
    cuda::ContextOptions options;
    options.cudaGraphs = graphs;
    // The heuristic's GEMM algorithms: timing could pick different ones in
    // the two contexts, and their sums round differently.
    options.gemmTuning = false;
    context = std::make_unique<cuda::Context>(options);
    store = std::make_unique<cuda::ParameterStore>(bundle, *context);
    store->initialize(1234);
    executor = std::make_unique<cuda::Executor>(bundle, "train_step", *store);
  }
  std::unique_ptr<cuda::Context> context;
  std::unique_ptr<cuda::ParameterStore> store;
  std::unique_ptr<cuda::Executor> executor;
};

/// Expects the same bits in both tensors.
void expectIdentical(const host::Tensor &actual, const host::Tensor &expected,
                     const std::string &what) {
  ASSERT_EQ(actual.shape, expected.shape) << what;
  ASSERT_EQ(actual.buffer.size(), expected.buffer.size()) << what;
  EXPECT_EQ(std::memcmp(actual.buffer.data(), expected.buffer.data(),
                        actual.buffer.size()),
            0)
      << what << ": differs (largest relative difference "
      << relativeDifference(actual, expected) << ")";
}

class CudaGraphTest : public ::testing::TestWithParam<const char *> {
protected:
  void SetUp() override {
    MTRT_REQUIRE_GPU();
    bundle = std::make_unique<Bundle>(loadTestBundle(GetParam()));
    train = bundle->findFunction("train_step");
    ASSERT_NE(train, nullptr);
  }

  /// Step s's tokens and labels (ids below 256, the byte vocabulary).
  std::vector<host::Tensor> batch(uint64_t s) const {
    std::vector<int64_t> shape = train->values[train->inputs[0]].shape;
    DType type = train->values[train->inputs[0]].dtype;
    std::vector<host::Tensor> inputs;
    inputs.push_back(randomIds(shape, 256, 100 + 2 * s, type));
    inputs.push_back(randomIds(shape, 256, 101 + 2 * s, type));
    return inputs;
  }

  std::unique_ptr<Bundle> bundle;
  const Function *train = nullptr;
};

// Steps out of order and repeated (each keyed on samples from its step):
// the graph's kernels follow the micro-batch they are given, not a count of
// runs.
constexpr uint64_t kSteps[] = {0, 1, 2, 3, 3, 7, 4, 5};
constexpr int64_t kRuns = sizeof(kSteps) / sizeof(kSteps[0]);

TEST_P(CudaGraphTest, ReplayedStepsEqualTheStepsRunOneByOne) {
  Runner plain(*bundle, false), graphed(*bundle, true);
  for (uint64_t step : kSteps) {
    std::vector<host::Tensor> inputs = batch(step);
    std::vector<host::TensorView> views = {viewOf(inputs[0]),
                                           viewOf(inputs[1])};
    std::vector<host::Tensor> expected =
        plain.executor->run(views, {step, step});
    std::vector<host::Tensor> actual =
        graphed.executor->run(views, {step, step});
    ASSERT_EQ(actual.size(), expected.size());
    for (size_t i = 0; i < actual.size(); ++i)
      expectIdentical(actual[i], expected[i],
                      "step " + std::to_string(step) + " output " +
                          std::to_string(i));
  }
  // The gradients summed over every step.
  for (size_t p = 0; p < plain.store->size(); ++p)
    expectIdentical(graphed.store->gradientToHost(p),
                    plain.store->gradientToHost(p),
                    "gradient of " + plain.store->info(p).name);
  EXPECT_EQ(plain.executor->graphReplays(), 0);
  EXPECT_EQ(graphed.executor->graphReplays(), kRuns - 1)
      << graphed.executor->graphSummary();
  std::cout << "[ graphs   ] " << GetParam() << ": "
            << graphed.executor->graphSummary();
}

// Batches bound from device memory (the C API's GPU batches, a pipeline
// backward's stash slots): one graph per set of bound buffers, captured at
// its first replay and replayed (its steps refreshed) when they come back.
TEST_P(CudaGraphTest, DeviceBatchesInOtherBuffersAreCapturedAgain) {
  Runner plain(*bundle, false), graphed(*bundle, true);
  size_t bytes = batch(0)[0].buffer.size();
  // Two pairs of buffers, used in turn: A A B A B B.
  cuda::DeviceBuffer buffers[2][2] = {{cuda::DeviceBuffer(bytes, "tokens A"),
                                       cuda::DeviceBuffer(bytes, "labels A")},
                                      {cuda::DeviceBuffer(bytes, "tokens B"),
                                       cuda::DeviceBuffer(bytes, "labels B")}};
  const int pairs[] = {0, 0, 1, 0, 1, 1};
  uint64_t step = 0;
  for (int pair : pairs) {
    std::vector<host::Tensor> inputs = batch(step);
    std::vector<host::TensorView> views;
    for (size_t i = 0; i < 2; ++i) {
      MTRT_CUDA_CHECK(cudaMemcpy(buffers[pair][i].data(),
                                 inputs[i].buffer.data(), bytes,
                                 cudaMemcpyHostToDevice),
                      "uploading a test batch");
      views.push_back(
          {inputs[i].dtype, inputs[i].shape, buffers[pair][i].data()});
    }
    // The copies done before either stream reads the buffers.
    MTRT_CUDA_CHECK(cudaDeviceSynchronize(), "uploading a test batch");
    std::vector<host::Tensor> expected =
        plain.executor->run(views, {step, step}, true);
    std::vector<host::Tensor> actual =
        graphed.executor->run(views, {step, step}, true);
    for (size_t i = 0; i < actual.size(); ++i)
      expectIdentical(actual[i], expected[i],
                      "step " + std::to_string(step) + " output " +
                          std::to_string(i));
    ++step;
  }
  EXPECT_EQ(graphed.executor->graphReplays(), 5)
      << graphed.executor->graphSummary();
  // Captured at runs 2 (A) and 3 (B); runs 4 (A), 5 and 6 (B) replay them.
  EXPECT_NE(graphed.executor->graphSummary().find(
                "2 input binding(s), captured 2 time(s)"),
            std::string::npos)
      << graphed.executor->graphSummary();
}

INSTANTIATE_TEST_SUITE_P(Models, CudaGraphTest,
                         ::testing::Values("tiny-gpt", "tiny-gpt-fused",
                                           "tiny-gpt-bf16",
                                           "tiny-gpt-bf16-fused"),
                         [](const auto &info) {
                           std::string name = info.param;
                           for (char &ch : name)
                             if (ch == '-')
                               ch = '_';
                           return name;
                         });

} // namespace
