// The NCCL communicator on the one GPU: a world of one rank (NCCL refuses two
// ranks on one device), every call on device and host buffers with exact
// results, in place, split, abort. Skipped, with the reason, without a GPU
// or without libnccl.so.2 on the library path. Several ranks and the
// watchdog: mtrt-nccl-check (docs/Parallelism.md).
#include "CudaTestSupport.h"

#include "comm/NcclCommunicator.h"
#include "cuda/DeviceCollective.h"

#include <cuda_runtime_api.h>

#include <numeric>

using namespace mtrt;
using namespace mtrt::comm;

namespace {

class NcclCommunicatorTest : public ::testing::Test {
protected:
  void SetUp() override {
    MTRT_REQUIRE_GPU();
    LaunchEnvironment env; // rank 0 of 1: no rendezvous
    env.launcher = "test";
    try {
      world = NcclCommunicator::create(env);
    } catch (const Error &e) {
      if (e.code() == MTRT_STATUS_UNAVAILABLE &&
          std::string(e.what()).find("libnccl.so.2") != std::string::npos)
        GTEST_SKIP() << e.what();
      throw;
    }
  }

  /// n floats on the device, copied from `values`.
  float *deviceCopy(const std::vector<float> &values) {
    void *data = nullptr;
    EXPECT_EQ(cudaMalloc(&data, values.size() * sizeof(float)), cudaSuccess);
    EXPECT_EQ(cudaMemcpy(data, values.data(), values.size() * sizeof(float),
                         cudaMemcpyHostToDevice),
              cudaSuccess);
    buffers.push_back(data);
    return static_cast<float *>(data);
  }
  std::vector<float> hostCopy(const float *data, size_t n) {
    std::vector<float> values(n);
    EXPECT_EQ(cudaStreamSynchronize(world->stream()), cudaSuccess);
    EXPECT_EQ(cudaMemcpy(values.data(), data, n * sizeof(float),
                         cudaMemcpyDeviceToHost),
              cudaSuccess);
    return values;
  }
  void TearDown() override {
    world.reset();
    for (void *data : buffers)
      cudaFree(data);
  }

  std::unique_ptr<NcclCommunicator> world;
  std::vector<void *> buffers;
};

std::vector<float> ramp(size_t n, float start) {
  std::vector<float> values(n);
  std::iota(values.begin(), values.end(), start);
  return values;
}

TEST_F(NcclCommunicatorTest, AWorldOfOneRunsEveryCallExactly) {
  EXPECT_EQ(world->rank(), 0);
  EXPECT_EQ(world->size(), 1);
  EXPECT_EQ(world->name(), "world[0]");
  const size_t n = 1000;
  std::vector<float> x = ramp(n, -3.5f);
  float *send = deviceCopy(x);
  float *recv = deviceCopy(std::vector<float>(n, 0));
  CallInfo info{"NcclCommunicatorTest", 4};
  world->allReduce(send, recv, n, ReduceOp::Sum, info);
  EXPECT_EQ(hostCopy(recv, n), x);
  world->allReduce(send, recv, n, ReduceOp::Max, info);
  EXPECT_EQ(hostCopy(recv, n), x);
  world->allGather(send, recv, n, info);
  EXPECT_EQ(hostCopy(recv, n), x);
  world->reduceScatter(send, recv, n, ReduceOp::Sum, info);
  EXPECT_EQ(hostCopy(recv, n), x);
  float *buffer = deviceCopy(x);
  world->broadcast(buffer, n, 0, info);
  EXPECT_EQ(hostCopy(buffer, n), x);
  world->sendRecv(send, 0, recv, 0, n, info);
  EXPECT_EQ(hostCopy(recv, n), x);
  // In place.
  world->allReduce(buffer, buffer, n, ReduceOp::Sum, info);
  EXPECT_EQ(hostCopy(buffer, n), x);
  // Host buffers are staged through the device, and ready on return.
  std::vector<float> hostOut(n, 0);
  world->allReduce(x.data(), hostOut.data(), n, ReduceOp::Sum, info);
  EXPECT_EQ(hostOut, x);
  std::vector<double> doubles = {1.5, -2.25, 1e300};
  std::vector<double> doublesOut(3, 0);
  world->allReduce(doubles.data(), doublesOut.data(), 3, ReduceOp::Sum, info);
  EXPECT_EQ(doublesOut, doubles);
  world->barrier(info);
}

// DeviceCollective passes NCCL the device buffers and orders the calls
// between the caller's stream and the communicator's with events: the
// copies before a call on the caller's stream are seen by it, and the copy
// after it sees its result.
TEST_F(NcclCommunicatorTest, DeviceCollectiveOrdersCallsOnTheCallersStream) {
  EXPECT_TRUE(world->takesDeviceMemory());
  EXPECT_EQ(world->deviceStream(), static_cast<void *>(world->stream()));
  cudaStream_t mine = nullptr;
  ASSERT_EQ(cudaStreamCreateWithFlags(&mine, cudaStreamNonBlocking),
            cudaSuccess);
  {
    cuda::DeviceCollective collective(mine, "NcclCommunicatorTest");
    const size_t n = 1 << 20;
    std::vector<float> x = ramp(n, 0.5f);
    float *send = deviceCopy(std::vector<float>(n, 0));
    float *recv = deviceCopy(std::vector<float>(n, 0));
    std::vector<float> out(n, 0);
    CallInfo info{"DeviceCollectiveTest", 1};
    for (int round = 0; round < 3; ++round) {
      ASSERT_EQ(cudaMemcpyAsync(send, x.data(), n * sizeof(float),
                                cudaMemcpyHostToDevice, mine),
                cudaSuccess);
      collective.allReduce(*world, send, recv, n, DType::F32, ReduceOp::Sum,
                           info);
      collective.allGather(*world, recv, recv, n, DType::F32, info);
      ASSERT_EQ(cudaMemcpyAsync(out.data(), recv, n * sizeof(float),
                                cudaMemcpyDeviceToHost, mine),
                cudaSuccess);
      ASSERT_EQ(cudaStreamSynchronize(mine), cudaSuccess);
      EXPECT_EQ(out, x);
      // Clear both for the next round: a stale result would show.
      ASSERT_EQ(cudaMemsetAsync(recv, 0, n * sizeof(float), mine),
                cudaSuccess);
      ASSERT_EQ(cudaMemsetAsync(send, 0, n * sizeof(float), mine),
                cudaSuccess);
      for (float &v : x)
        v += 1.0f;
    }
  }
  EXPECT_EQ(cudaStreamSynchronize(mine), cudaSuccess);
  EXPECT_EQ(cudaStreamDestroy(mine), cudaSuccess);
}

// Calls enqueued through DeviceCollective on a stream being captured are
// captured (cuda::Executor's step functions with ContextOptions::ncclGraphs),
// not watched, and replayed with the inputs of each launch; a call on host
// buffers, which the host must wait for, is refused during a capture.
TEST_F(NcclCommunicatorTest, CallsOnDeviceBuffersAreCapturedInACudaGraph) {
  cudaStream_t mine = nullptr;
  ASSERT_EQ(cudaStreamCreateWithFlags(&mine, cudaStreamNonBlocking),
            cudaSuccess);
  {
    cuda::DeviceCollective collective(mine, "NcclCommunicatorTest");
    const size_t n = 4096;
    float *send = deviceCopy(std::vector<float>(n, 0));
    float *recv = deviceCopy(std::vector<float>(n, 0));
    CallInfo info{"captured", 2};
    ASSERT_EQ(cudaStreamBeginCapture(mine, cudaStreamCaptureModeThreadLocal),
              cudaSuccess);
    collective.allReduce(*world, send, recv, n, DType::F32, ReduceOp::Sum,
                         info);
    collective.allGather(*world, recv, recv, n, DType::F32, info);
    std::vector<float> host(n, 1.0f);
    try {
      world->allReduce(host.data(), host.data(), n, ReduceOp::Sum, info);
      ADD_FAILURE() << "a call on host buffers was captured";
    } catch (const Error &e) {
      EXPECT_EQ(e.code(), MTRT_STATUS_FAILED_PRECONDITION);
      EXPECT_NE(std::string(e.what()).find("capture calls on device buffers "
                                           "only"),
                std::string::npos)
          << e.what();
    }
    cudaGraph_t graph = nullptr;
    ASSERT_EQ(cudaStreamEndCapture(mine, &graph), cudaSuccess);
    cudaGraphExec_t exec = nullptr;
    ASSERT_EQ(cudaGraphInstantiate(&exec, graph, 0), cudaSuccess);
    std::vector<float> x = ramp(n, -7.25f), out(n, 0);
    for (int replay = 0; replay < 3; ++replay) {
      ASSERT_EQ(cudaMemcpyAsync(send, x.data(), n * sizeof(float),
                                cudaMemcpyHostToDevice, mine),
                cudaSuccess);
      ASSERT_EQ(cudaMemsetAsync(recv, 0, n * sizeof(float), mine), cudaSuccess);
      ASSERT_EQ(cudaGraphLaunch(exec, mine), cudaSuccess);
      ASSERT_EQ(cudaMemcpyAsync(out.data(), recv, n * sizeof(float),
                                cudaMemcpyDeviceToHost, mine),
                cudaSuccess);
      ASSERT_EQ(cudaStreamSynchronize(mine), cudaSuccess);
      EXPECT_EQ(out, x) << "replay " << replay;
      for (float &v : x)
        v += 2.0f;
    }
    // A call after the capture is watched again, and completes.
    std::vector<float> last = hostCopy(send, n);
    ASSERT_EQ(cudaMemset(recv, 0, n * sizeof(float)), cudaSuccess);
    world->allReduce(send, recv, n, ReduceOp::Sum, info);
    EXPECT_EQ(hostCopy(recv, n), last);
    cudaGraphExecDestroy(exec);
    cudaGraphDestroy(graph);
  }
  EXPECT_EQ(cudaStreamSynchronize(mine), cudaSuccess);
  EXPECT_EQ(cudaStreamDestroy(mine), cudaSuccess);
}

TEST_F(NcclCommunicatorTest, SplitMakesANamedGroupOrNone) {
  CallInfo info{"split", -1};
  std::unique_ptr<Communicator> tp = world->split(0, 0, "tp", info);
  ASSERT_NE(tp, nullptr);
  EXPECT_EQ(tp->size(), 1);
  EXPECT_EQ(tp->name(), "tp[0]");
  EXPECT_EQ(tp->members(), std::vector<int>{0});
  std::vector<float> x = {1, 2, 3}, y(3, 0);
  tp->allReduce(x.data(), y.data(), 3, ReduceOp::Sum, info);
  EXPECT_EQ(y, x);
  EXPECT_EQ(world->split(Communicator::kNoColor, 0, "none", info), nullptr);
}

TEST_F(NcclCommunicatorTest, AnAbortFailsTheNextCallNamingTheRank) {
  world->abort("the test stops here");
  std::vector<float> x = {1}, y = {0};
  try {
    world->allReduce(x.data(), y.data(), 1, ReduceOp::Sum, {"after", 9});
    FAIL() << "the call after abort() returned";
  } catch (const Error &e) {
    EXPECT_EQ(e.code(), MTRT_STATUS_ABORTED);
    EXPECT_STREQ(e.what(), "rank 0 aborted the run: the test stops here");
  }
}

} // namespace
