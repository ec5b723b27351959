// Overlapped communication on one GPU (issue 23): in-process ranks' collectives
// as kernels reading the peers' buffers (cuda::PeerGroup) against the host's
// fixed-order reduction, bit for bit, eager and replayed from a CUDA graph;
// three layouts trained with and without the overlap flags (identical losses
// and gradient norms, the multi-rank steps replayed as CUDA graphs, and the
// host's losses within tolerance); and a timeline from CUDA events in which
// collectives on the communication stream run beside GEMMs.
#include "CudaTestSupport.h"

#include "comm/FixedOrderReduce.h"
#include "comm/InProcessWorld.h"
#include "comm/RankContext.h"
#include "comm/RunRanks.h"
#include "core/Random.h"
#include "cuda/DeviceCollective.h"
#include "cuda/Executor.h"
#include "cuda/Gemm.h"
#include "cuda/ParameterStore.h"
#include "cuda/PeerCollective.h"
#include "cuda/Trainer.h"
#include "host/ParameterStore.h"
#include "host/ThreadPool.h"
#include "train/Trainer.h"

#include <atomic>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <iostream>
#include <map>
#include <mutex>
#include <optional>
#include <sstream>
#include <thread>

using namespace mtrt;
using namespace mtrt::test;

namespace {

void reportRankErrors(const std::vector<std::exception_ptr> &errors) {
  for (const auto &error : errors) {
    if (!error)
      continue;
    try {
      std::rethrow_exception(error);
    } catch (const std::exception &e) {
      ADD_FAILURE() << "a rank failed: " << e.what();
    }
  }
}

/// bf16 bits of `value`, rounded to nearest even (finite values).
uint16_t toBf16(float value) {
  uint32_t word;
  std::memcpy(&word, &value, sizeof(word));
  return static_cast<uint16_t>((word + 0x7fffu + ((word >> 16) & 1u)) >> 16);
}

float fromBf16(uint16_t bits) {
  uint32_t word = static_cast<uint32_t>(bits) << 16;
  float value;
  std::memcpy(&value, &word, sizeof(value));
  return value;
}

/// Rank r's values: magnitudes over six decades and both signs, so that the
/// order of a sum shows in its last bits.
std::vector<float> rankValues(int rank, size_t count) {
  std::vector<float> values(count);
  for (size_t i = 0; i < count; ++i) {
    uint64_t bits = random::randomBits(77, static_cast<uint64_t>(rank), i);
    double unit = static_cast<double>(bits >> 11) / 9007199254740992.0;
    double scale = std::pow(10.0, static_cast<int>(bits % 7) - 3);
    values[i] = static_cast<float>((unit - 0.5) * scale);
  }
  return values;
}

/// Device bytes of `values`, as fp32 or rounded to bf16.
cuda::DeviceBuffer upload(const std::vector<float> &values, DType dtype) {
  size_t element = dtype == DType::BF16 ? 2 : 4;
  cuda::DeviceBuffer buffer(values.size() * element, "test values");
  std::vector<unsigned char> bytes(values.size() * element);
  for (size_t i = 0; i < values.size(); ++i) {
    if (dtype == DType::BF16) {
      uint16_t bits = toBf16(values[i]);
      std::memcpy(bytes.data() + 2 * i, &bits, 2);
    } else {
      std::memcpy(bytes.data() + 4 * i, &values[i], 4);
    }
  }
  EXPECT_EQ(cudaMemcpy(buffer.data(), bytes.data(), bytes.size(),
                       cudaMemcpyHostToDevice),
            cudaSuccess);
  return buffer;
}

/// `count` elements at `data` (after `stream`'s work) as floats.
std::vector<float> download(const void *data, size_t count, DType dtype,
                            cudaStream_t stream) {
  EXPECT_EQ(cudaStreamSynchronize(stream), cudaSuccess);
  size_t element = dtype == DType::BF16 ? 2 : 4;
  std::vector<unsigned char> bytes(count * element);
  EXPECT_EQ(
      cudaMemcpy(bytes.data(), data, bytes.size(), cudaMemcpyDeviceToHost),
      cudaSuccess);
  std::vector<float> values(count);
  for (size_t i = 0; i < count; ++i) {
    if (dtype == DType::BF16) {
      uint16_t bits;
      std::memcpy(&bits, bytes.data() + 2 * i, 2);
      values[i] = fromBf16(bits);
    } else {
      std::memcpy(&values[i], bytes.data() + 4 * i, 4);
    }
  }
  return values;
}

/// The host's reduction of the ranks' values at [offset, offset + count):
/// comm::reduceInFixedOrder in fp32 (bf16 inputs widened first), rounded to
/// bf16 once for bf16.
std::vector<float> hostReduce(const std::vector<std::vector<float>> &ranks,
                              DType dtype, comm::ReduceOp op, size_t offset,
                              size_t count) {
  std::vector<std::vector<float>> stored = ranks;
  if (dtype == DType::BF16)
    for (auto &values : stored)
      for (float &x : values)
        x = fromBf16(toBf16(x));
  std::vector<const void *> in;
  for (const auto &values : stored)
    in.push_back(values.data());
  std::vector<float> out(count);
  comm::reduceInFixedOrder(
      DType::F32, op, in.data(), static_cast<int>(in.size()),
      static_cast<int64_t>(offset), static_cast<int64_t>(count), out.data());
  if (dtype == DType::BF16)
    for (float &x : out)
      x = fromBf16(toBf16(x));
  return out;
}

/// Bitwise equality of two float vectors; the first difference is reported.
void expectSameBits(const std::vector<float> &got,
                    const std::vector<float> &want, const std::string &what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  for (size_t i = 0; i < got.size(); ++i)
    if (std::memcmp(&got[i], &want[i], sizeof(float)) != 0) {
      ADD_FAILURE() << what << ": element " << i << " is " << got[i]
                    << ", the host's fixed order gives " << want[i];
      return;
    }
}

// Three ranks (the rank tree's uneven case: (x0 + x1) + x2), 1001 elements
// (all-reduce chunks of 334, 334 and 333), fp32 and bf16: every call of the
// peer path, in place and not, gives the host's fixed-order bits on every
// rank.
TEST(PeerGroupTest, GivesTheHostsFixedOrderBits) {
  MTRT_REQUIRE_GPU();
  const int ranks = 3;
  const size_t n = 1001;
  std::vector<std::vector<float>> values;
  for (int r = 0; r < ranks; ++r)
    values.push_back(rankValues(r, ranks * n));
  for (DType dtype : {DType::F32, DType::BF16}) {
    SCOPED_TRACE(dtypeName(dtype));
    comm::InProcessWorld world(ranks);
    auto errors = comm::runRanks(world, [&](comm::Communicator &c) {
      ASSERT_TRUE(cuda::PeerGroup::serves(c, dtype));
      cuda::Context context;
      cudaStream_t stream = context.stream();
      cuda::DeviceCollective collective(stream, "PeerGroupTest",
                                        /*peerKernels=*/true);
      ASSERT_TRUE(collective.runsOnDevice(c, dtype));
      int r = c.rank();
      comm::CallInfo info{"PeerGroupTest", 1};
      const std::vector<float> &mine = values[r];
      std::vector<std::vector<float>> heads;
      for (const auto &v : values)
        heads.emplace_back(v.begin(), v.begin() + n);
      std::vector<float> sum =
          hostReduce(heads, dtype, comm::ReduceOp::Sum, 0, n);
      std::vector<float> max =
          hostReduce(heads, dtype, comm::ReduceOp::Max, 0, n);

      cuda::DeviceBuffer x = upload(mine, dtype), y = upload(mine, dtype);
      collective.allReduce(c, x.data(), y.data(), n, dtype, comm::ReduceOp::Sum,
                           info);
      expectSameBits(download(y.data(), n, dtype, stream), sum,
                     "all-reduce sum, rank " + std::to_string(r));
      collective.allReduce(c, x.data(), x.data(), n, dtype, comm::ReduceOp::Sum,
                           info);
      expectSameBits(download(x.data(), n, dtype, stream), sum,
                     "all-reduce sum in place, rank " + std::to_string(r));
      cuda::DeviceBuffer m = upload(mine, dtype);
      collective.allReduce(c, m.data(), m.data(), n, dtype, comm::ReduceOp::Max,
                           info);
      expectSameBits(download(m.data(), n, dtype, stream), max,
                     "all-reduce max, rank " + std::to_string(r));

      // all-gather in place: rank r's block at r * n of the ranks' buffers.
      std::vector<float> gathered, placed(mine);
      for (int q = 0; q < ranks; ++q)
        gathered.insert(gathered.end(), values[q].begin() + q * n,
                        values[q].begin() + (q + 1) * n);
      cuda::DeviceBuffer g = upload(placed, dtype);
      size_t element = dtype == DType::BF16 ? 2 : 4;
      collective.allGather(c, static_cast<char *>(g.data()) + r * n * element,
                           g.data(), n, dtype, info);
      std::vector<float> want = gathered;
      if (dtype == DType::BF16)
        for (float &v : want)
          v = fromBf16(toBf16(v));
      expectSameBits(download(g.data(), ranks * n, dtype, stream), want,
                     "all-gather in place, rank " + std::to_string(r));

      // reduce-scatter in place: block r of the sum lands at r * n.
      cuda::DeviceBuffer s = upload(mine, dtype);
      char *block = static_cast<char *>(s.data()) + r * n * element;
      collective.reduceScatter(c, s.data(), block, n, dtype,
                               comm::ReduceOp::Sum, info);
      expectSameBits(download(block, n, dtype, stream),
                     hostReduce(values, dtype, comm::ReduceOp::Sum, r * n, n),
                     "reduce-scatter in place, rank " + std::to_string(r));

      cuda::DeviceBuffer b = upload(mine, dtype);
      collective.broadcast(c, b.data(), ranks * n, dtype, 2, info);
      want = values[2];
      if (dtype == DType::BF16)
        for (float &v : want)
          v = fromBf16(toBf16(v));
      expectSameBits(download(b.data(), ranks * n, dtype, stream), want,
                     "broadcast from rank 2, rank " + std::to_string(r));
    });
    reportRankErrors(errors);
  }
}

// The barrier's counters live on the device: a CUDA graph holding an
// all-reduce replays it correctly, each replay on new inputs, while the
// ranks' host threads never wait for each other.
TEST(PeerGroupTest, ReplaysFromACudaGraph) {
  MTRT_REQUIRE_GPU();
  const int ranks = 2;
  const size_t n = 4096;
  comm::InProcessWorld world(ranks);
  auto errors = comm::runRanks(world, [&](comm::Communicator &c) {
    cuda::Context context;
    cudaStream_t stream = context.stream();
    cuda::DeviceCollective collective(stream, "ReplaysFromACudaGraph",
                                      /*peerKernels=*/true);
    comm::CallInfo info{"ReplaysFromACudaGraph", 1};
    int r = c.rank();
    cuda::DeviceBuffer x = upload(rankValues(r, n), DType::F32);
    cuda::DeviceBuffer y = upload(rankValues(r, n), DType::F32);
    // The first call is eager: it makes the group's device state.
    collective.allReduce(c, x.data(), y.data(), n, DType::F32,
                         comm::ReduceOp::Sum, info);
    ASSERT_EQ(cudaStreamSynchronize(stream), cudaSuccess);
    cudaGraph_t graph = nullptr;
    cudaGraphExec_t exec = nullptr;
    ASSERT_EQ(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal),
              cudaSuccess);
    collective.allReduce(c, x.data(), y.data(), n, DType::F32,
                         comm::ReduceOp::Sum, info);
    ASSERT_EQ(cudaStreamEndCapture(stream, &graph), cudaSuccess);
    ASSERT_EQ(cudaGraphInstantiate(&exec, graph, 0), cudaSuccess);
    // The captured call, released at each launch.
    std::vector<cuda::DeviceCollective::CapturedCalls> calls =
        collective.takeCapturedCalls();
    ASSERT_EQ(calls.size(), 1u);
    ASSERT_EQ(calls[0].count, 1u);
    // An all-reduce meets its peers three times: operands ready, chunk
    // reduced, done (MTRT_PEER_TRACE reports the phases so counted).
    ASSERT_EQ(calls[0].barriers, 3u);
    for (int replay = 0; replay < 3; ++replay) {
      std::vector<std::vector<float>> inputs;
      for (int q = 0; q < ranks; ++q)
        inputs.push_back(rankValues(100 * (replay + 1) + q, n));
      ASSERT_EQ(cudaMemcpyAsync(x.data(), inputs[r].data(), n * sizeof(float),
                                cudaMemcpyHostToDevice, stream),
                cudaSuccess);
      EXPECT_EQ(calls[0].group->post(calls[0].rank, calls[0].count,
                                     calls[0].barriers),
                3u * (replay + 1));
      calls[0].group->await(calls[0].rank, "ReplaysFromACudaGraph");
      ASSERT_EQ(cudaGraphLaunch(exec, stream), cudaSuccess);
      expectSameBits(download(y.data(), n, DType::F32, stream),
                     hostReduce(inputs, DType::F32, comm::ReduceOp::Sum, 0, n),
                     "replay " + std::to_string(replay) + ", rank " +
                         std::to_string(r));
    }
    cudaGraphExecDestroy(exec);
    cudaGraphDestroy(graph);
  });
  reportRankErrors(errors);
}

// Ranks whose calls differ (here the count) are refused on every rank,
// naming both calls, before any kernel reads a peer's buffer.
TEST(PeerGroupTest, RefusesCallsThatDiffer) {
  MTRT_REQUIRE_GPU();
  comm::InProcessWorld world(2);
  std::vector<std::string> messages(2);
  auto errors = comm::runRanks(world, [&](comm::Communicator &c) {
    cuda::Context context;
    cuda::DeviceCollective collective(context.stream(),
                                      "RefusesCallsThatDiffer",
                                      /*peerKernels=*/true);
    size_t n = c.rank() == 0 ? 8 : 16;
    cuda::DeviceBuffer x = upload(std::vector<float>(n, 1.0f), DType::F32);
    try {
      collective.allReduce(c, x.data(), x.data(), static_cast<int64_t>(n),
                           DType::F32, comm::ReduceOp::Sum,
                           {"RefusesCallsThatDiffer", 1});
    } catch (const Error &e) {
      EXPECT_EQ(e.code(), MTRT_STATUS_INVALID_ARGUMENT) << e.what();
      messages[static_cast<size_t>(c.rank())] = e.what();
    }
  });
  reportRankErrors(errors);
  for (const std::string &message : messages)
    EXPECT_NE(message.find("differs from rank"), std::string::npos)
        << "'" << message << "'";
}

// Graphs with barriers in flight and CUDA calls that may wait for the
// device exclude each other (PeerGroup::LaunchWindow, PeerGroup::Setup):
// a Setup waits for the open windows, a window opens beside another one
// even while a Setup waits (its peers must launch), and waits for a held
// Setup. Host threads only: no GPU needed.
TEST(PeerGroupTest, SetupsWaitForLaunchWindowsAndWindowsForSetups) {
  using namespace std::chrono_literals;
  std::atomic<int> step{0};
  std::atomic<bool> setupHeld{false}, secondWindowOpen{false};
  std::optional<cuda::PeerGroup::LaunchWindow> first;
  first.emplace();
  std::thread setup([&] {
    cuda::PeerGroup::Setup held;
    setupHeld = true;
    while (step < 2)
      std::this_thread::sleep_for(1ms);
  });
  std::this_thread::sleep_for(50ms);
  EXPECT_FALSE(setupHeld) << "a Setup began while a launch window was open";
  std::thread second([&] {
    cuda::PeerGroup::LaunchWindow window;
    secondWindowOpen = true;
    while (step < 1)
      std::this_thread::sleep_for(1ms);
  });
  for (int i = 0; i < 2000 && !secondWindowOpen; ++i)
    std::this_thread::sleep_for(1ms);
  EXPECT_TRUE(secondWindowOpen)
      << "a launch window waited for a Setup that only waited";
  first.reset();
  step = 1;
  second.join();
  for (int i = 0; i < 2000 && !setupHeld; ++i)
    std::this_thread::sleep_for(1ms);
  EXPECT_TRUE(setupHeld) << "the Setup still waited with no window open";
  std::atomic<bool> thirdWindowOpen{false};
  std::thread third([&] {
    cuda::PeerGroup::LaunchWindow window;
    thirdWindowOpen = true;
  });
  std::this_thread::sleep_for(50ms);
  EXPECT_FALSE(thirdWindowOpen) << "a launch window opened during a Setup";
  step = 2;
  setup.join();
  third.join();
  EXPECT_TRUE(thirdWindowOpen);
}

/// One layout trained with and without the overlap flags.
struct OverlapLayout {
  const char *plain;
  const char *overlapped;
  bool bf16;
  bool pipeline;
  const char *name;
};

struct LayoutRun {
  /// Every rank's history, rank order.
  std::vector<std::vector<train::IterationRecord>> histories;
  /// Rank 0's log (the executors' graph summaries at its end).
  std::string log;
};

train::TrainerOptions overlapOptions() {
  train::TrainerOptions options;
  options.trainIters = 3;
  options.lr = 1e-3;
  options.lrWarmupIters = 1;
  options.evalInterval = 0;
  options.progressBar = false;
  options.seed = 1234;
  options.clipGrad = 0.5;
  options.globalBatchSize = 32;
  return options;
}

/// Every rank of `bundle` as a thread, on the GPU (GEMM algorithms from
/// the heuristic and deterministic attention, so two runs can be compared
/// bit for bit) or on the host.
LayoutRun trainRanks(const Bundle &bundle, bool onHost) {
  LayoutRun run;
  run.histories.resize(bundle.rankCount());
  std::mutex mutex;
  std::string text = multiRankCorpus();
  cuda::ContextOptions device;
  device.gemmTuning = false;
  device.deterministicAttention = true;
  device.peerCollectives = true;
  comm::InProcessWorld world(static_cast<int>(bundle.rankCount()));
  auto errors = comm::runRanks(world, [&](comm::Communicator &c) {
    comm::RankContext rank(c, bundle.gridShape());
    std::ostringstream log;
    std::vector<train::IterationRecord> history;
    if (onHost) {
      train::TrainerOptions options = overlapOptions();
      options.threads = 2;
      train::Trainer trainer(bundle, text, "corpus", options, &rank);
      trainer.train(log);
      history = trainer.history();
    } else {
      cuda::Trainer trainer(bundle, text, "corpus", overlapOptions(), device,
                            &rank);
      trainer.train(log);
      history = trainer.history();
    }
    std::lock_guard<std::mutex> lock(mutex);
    run.histories[static_cast<size_t>(c.rank())] = std::move(history);
    if (c.rank() == 0)
      run.log = log.str();
  });
  reportRankErrors(errors);
  return run;
}

class CudaOverlapTest : public ::testing::TestWithParam<OverlapLayout> {};

const char *const kOverlapHowToMake =
    "bench/make-device-dir.sh (the CudaOverlapTest bundles: tiny-gpt with "
    "and without --overlap-collectives, --overlap-grad-reduce, "
    "--tp-comm-overlap)";

// The same bundle with and without overlap: the same losses and gradient
// norms on every rank, bit for bit; both within tolerance of the host's
// losses (fp32 1e-5 relative, bf16 2e-2); and the trainer's summaries say
// that the multi-rank step functions were replayed from CUDA graphs.
TEST_P(CudaOverlapTest, SameLossesWithAndWithoutOverlapAsCudaGraphs) {
  MTRT_REQUIRE_GPU();
  const OverlapLayout &layout = GetParam();
  Bundle plain = loadTestBundle(layout.plain, kOverlapHowToMake);
  Bundle overlapped = loadTestBundle(layout.overlapped, kOverlapHowToMake);
  ASSERT_GT(plain.rankCount(), 1u);
  LayoutRun without = trainRanks(plain, false);
  LayoutRun with = trainRanks(overlapped, false);
  LayoutRun host = trainRanks(plain, true);
  double worstHost = 0;
  for (size_t r = 0; r < with.histories.size(); ++r) {
    ASSERT_EQ(with.histories[r].size(), 3u) << "rank " << r;
    ASSERT_EQ(without.histories[r].size(), 3u) << "rank " << r;
    for (size_t i = 0; i < 3; ++i) {
      const train::IterationRecord &a = without.histories[r][i];
      const train::IterationRecord &b = with.histories[r][i];
      EXPECT_EQ(a.loss, b.loss) << "rank " << r << ", iteration " << i + 1;
      EXPECT_EQ(a.gradNorm, b.gradNorm)
          << "rank " << r << ", iteration " << i + 1;
      // Both runs against the host, so that a failure says which is off.
      double reference = host.histories[r][i].loss;
      for (const train::IterationRecord *run : {&a, &b}) {
        double relative = std::abs(run->loss - reference) / std::abs(reference);
        worstHost = std::max(worstHost, relative);
        EXPECT_LE(relative, layout.bf16 ? 2e-2 : 1e-5)
            << "rank " << r << ", iteration " << i + 1 << ", "
            << (run == &a ? "without" : "with") << " overlap: GPU " << run->loss
            << ", host " << reference;
      }
    }
  }
  // Multi-rank step functions replayed as CUDA graphs: train_step, or each
  // pipeline stage's forward and backward functions (rank 0's summaries);
  // without eager module loading the summaries say why not, and a device
  // script that expects graphs (MTRT_CUDA_TEST_EXPECT_GRAPHS=1) fails then.
  bool graphs = cuda::PeerGroup::eagerModuleLoading();
  const char *expect = std::getenv("MTRT_CUDA_TEST_EXPECT_GRAPHS");
  if (expect && std::string(expect) == "1") {
    EXPECT_TRUE(graphs)
        << "MTRT_CUDA_TEST_EXPECT_GRAPHS=1, but CUDA_MODULE_LOADING is not "
           "EAGER, so the multi-rank steps cannot run as CUDA graphs; set "
           "CUDA_MODULE_LOADING=EAGER for this run";
  }
  for (const std::string *log : {&without.log, &with.log}) {
    int graphed = 0;
    std::istringstream lines(*log);
    for (std::string line; std::getline(lines, line);) {
      if (line.rfind("train_step", 0) != 0 ||
          line.find("CUDA graph") == std::string::npos)
        continue;
      if (graphs) {
        EXPECT_NE(line.find("CUDA graph of"), std::string::npos) << line;
        EXPECT_EQ(line.find("replayed in 0 of"), std::string::npos) << line;
      } else {
        EXPECT_NE(line.find("CUDA_MODULE_LOADING=EAGER"), std::string::npos)
            << line;
      }
      ++graphed;
    }
    EXPECT_EQ(graphed, layout.pipeline ? 2 : 1) << *log;
  }
  if (!graphs)
    std::cout << "[ overlap  ] CUDA_MODULE_LOADING is not EAGER: the steps "
                 "ran without CUDA graphs\n";
  std::cout << "[ overlap  ] " << layout.name << ": losses "
            << with.histories[0][0].loss << " -> " << with.histories[0][2].loss
            << " equal with and without overlap on all "
            << with.histories.size()
            << " ranks; largest relative difference to the host " << worstHost
            << "\n";
  std::istringstream lines(with.log);
  for (std::string line; std::getline(lines, line);)
    if (line.find("CUDA graph") != std::string::npos)
      std::cout << "[ overlap  ]   " << line << "\n";
}

INSTANTIATE_TEST_SUITE_P(
    TinyGpt, CudaOverlapTest,
    ::testing::Values(
        // TP2 + SP with --tp-comm-overlap --overlap-collectives.
        OverlapLayout{"tiny-gpt-gb32-tp2-sp", "tiny-gpt-gb32-tp2-sp-overlap",
                      false, false, "TP2+SP fp32"},
        OverlapLayout{"tiny-gpt-bf16-gb32-tp2-sp",
                      "tiny-gpt-bf16-gb32-tp2-sp-overlap", true, false,
                      "TP2+SP bf16"},
        // DP2 with the distributed optimizer, --overlap-grad-reduce
        // --overlap-param-gather --overlap-collectives.
        OverlapLayout{"tiny-gpt-gb32-dp2-distopt",
                      "tiny-gpt-gb32-dp2-distopt-overlap", false, false,
                      "DP2 distopt fp32"},
        OverlapLayout{"tiny-gpt-bf16-gb32-dp2-distopt",
                      "tiny-gpt-bf16-gb32-dp2-distopt-overlap", true, false,
                      "DP2 distopt bf16"},
        // TP2 x PP2 x DP2 + SP, distributed optimizer, all four flags.
        OverlapLayout{"tiny-gpt-gb32-tp2-pp2-dp2",
                      "tiny-gpt-gb32-tp2-pp2-dp2-overlap", false, true,
                      "TP2xPP2xDP2 fp32"},
        OverlapLayout{"tiny-gpt-bf16-gb32-tp2-pp2-dp2",
                      "tiny-gpt-bf16-gb32-tp2-pp2-dp2-overlap", true, true,
                      "TP2xPP2xDP2 bf16"}),
    [](const ::testing::TestParamInfo<OverlapLayout> &info) {
      std::string name = info.param.name;
      std::string out;
      for (char ch : name)
        if (std::isalnum(static_cast<unsigned char>(ch)))
          out += ch;
      return out;
    });

/// One product shape of a GEMM cut into row chunks.
struct ChunkedGemm {
  int64_t m, n, k;
  bool transB, bias, bf16, bf16Result;
};

/// C = A B (+ bias) over `rows` rows from `row` on, with the heuristic's
/// algorithm (no tuning), taking the algorithm of `algorithmRows` rows.
void runRows(cuda::Gemm &gemm, const ChunkedGemm &g, int64_t row, int64_t rows,
             int64_t algorithmRows, const cuda::DeviceBuffer &a,
             const cuda::DeviceBuffer &a16, const cuda::DeviceBuffer &b,
             const cuda::DeviceBuffer &b16, const cuda::DeviceBuffer &bias,
             cuda::DeviceBuffer &c) {
  size_t cElement = g.bf16Result ? 2 : 4;
  cuda::Bf16Operands operands;
  if (g.bf16) {
    operands.a = a16.as<__nv_bfloat16>() + row * g.k;
    operands.b = b16.as<__nv_bfloat16>();
    operands.result = g.bf16Result;
  }
  gemm.run(
      1, rows, g.n, g.k, a.as<float>() + row * g.k, false, b.as<float>(),
      g.transB, reinterpret_cast<float *>(c.as<char>() + row * g.n * cElement),
      g.bias ? bias.as<float>() : nullptr, false, operands, {}, algorithmRows);
}

// --tp-comm-overlap runs a GEMM in row chunks (Attributes::wholeRows): each
// chunk with its whole's cuBLASLt algorithm gives the whole's bits, row for
// row, for the shapes of CudaOverlapTest's tiny GPT (M 1024, chunks of 256;
// the forward with a bias, the backward's transposed weight, fp32 and bf16
// operands, a bf16 result) and of a 1.3B-parameter layer at TP2 (M 8192,
// chunks of 2048). The test also says where the chunks' own heuristic
// choices would have differed (the bits that --tp-comm-overlap changed
// before).
TEST(CudaOverlapGemmTest, RowChunksTakeTheWholesAlgorithm) {
  MTRT_REQUIRE_GPU();
  cuda::Context context;
  cudaStream_t stream = context.stream();
  cuda::Gemm gemm(stream, /*tf32=*/false, /*tuning=*/false);
  const int64_t chunks = 4;
  for (const ChunkedGemm &g : {
           ChunkedGemm{1024, 192, 128, false, true, false, false},
           ChunkedGemm{1024, 128, 256, true, false, false, false},
           ChunkedGemm{1024, 192, 128, false, true, true, false},
           ChunkedGemm{1024, 128, 256, true, false, true, false},
           ChunkedGemm{1024, 256, 128, true, false, true, true},
           ChunkedGemm{8192, 3072, 2048, false, true, true, false},
           ChunkedGemm{8192, 2048, 4096, true, false, true, false},
       }) {
    std::string what =
        "[" + std::to_string(g.m) + " x " + std::to_string(g.k) + "] @ [" +
        std::to_string(g.k) + " x " + std::to_string(g.n) + "]" +
        (g.transB ? " (B transposed)" : "") + (g.bias ? " + bias" : "") +
        (g.bf16 ? " bf16" : " fp32") + (g.bf16Result ? ", bf16 C" : "");
    SCOPED_TRACE(what);
    std::vector<float> av = rankValues(1, static_cast<size_t>(g.m * g.k));
    std::vector<float> bv = rankValues(2, static_cast<size_t>(g.k * g.n));
    std::vector<float> biasv = rankValues(3, static_cast<size_t>(g.n));
    cuda::DeviceBuffer a = upload(av, DType::F32), b = upload(bv, DType::F32);
    cuda::DeviceBuffer a16 = upload(av, DType::BF16);
    cuda::DeviceBuffer b16 = upload(bv, DType::BF16);
    cuda::DeviceBuffer bias = upload(biasv, DType::F32);
    size_t count = static_cast<size_t>(g.m * g.n);
    DType cType = g.bf16Result ? DType::BF16 : DType::F32;
    cuda::DeviceBuffer whole(count * 4, "whole"), shared(count * 4, "shared"),
        own(count * 4, "own");
    int64_t rows = g.m / chunks;
    runRows(gemm, g, 0, g.m, 0, a, a16, b, b16, bias, whole);
    for (int64_t j = 0; j < chunks; ++j) {
      runRows(gemm, g, j * rows, rows, g.m, a, a16, b, b16, bias, shared);
      runRows(gemm, g, j * rows, rows, 0, a, a16, b, b16, bias, own);
    }
    std::vector<float> want = download(whole.data(), count, cType, stream);
    expectSameBits(download(shared.data(), count, cType, stream), want,
                   what + ", chunks with the whole's algorithm");
    std::vector<float> alone = download(own.data(), count, cType, stream);
    size_t differ = 0;
    for (size_t i = 0; i < count; ++i)
      differ += std::memcmp(&alone[i], &want[i], sizeof(float)) != 0;
    std::cout << "[ gemm     ] " << what << ": chunks of " << rows
              << " rows with the whole's algorithm give its bits; with "
                 "their own, "
              << differ << " of " << count << " elements differ\n";
  }
  for (const std::string &line : gemm.algorithmsNotShared())
    ADD_FAILURE() << line;
}

/// Whether an op runs cuBLASLt GEMMs.
bool isGemm(Op op) {
  std::string name = opName(op);
  return name.rfind("linear", 0) == 0 || name.rfind("matmul", 0) == 0;
}

// The timeline: train_step of a TP2 + SP bf16 GPT (hidden 1024, sequence
// 512, micro-batch 8: GEMMs of tens of microseconds) with
// --tp-comm-overlap --overlap-collectives, profiled on both ranks (CUDA events
// around every instruction on the compute stream and every collective on the
// communication stream). Rank 0's collectives run while GEMMs run: the test
// prints each collective's interval and the GEMMs it overlaps, and the
// totals.
TEST(CudaOverlapTimelineTest, CollectivesRunBesideGemms) {
  MTRT_REQUIRE_GPU();
  Bundle bundle =
      loadTestBundle("gpt-h1024-bf16-tp2-sp-overlap", kOverlapHowToMake);
  ASSERT_EQ(bundle.rankCount(), 2u);
  const Function &fn = *bundle.findFunction("train_step");
  std::vector<cuda::Executor::TimelineEntry> timeline;
  comm::InProcessWorld world(2);
  auto errors = comm::runRanks(world, [&](comm::Communicator &c) {
    comm::RankContext rank(c, bundle.gridShape());
    rank.prepare(bundle);
    host::ThreadPool pool(1);
    host::ParameterStore hostStore(bundle, DType::F32, rank.coordinates());
    hostStore.initialize(pool, 1234);
    hostStore.zeroGradients(pool);
    cuda::ContextOptions options;
    options.profile = true;
    options.peerCollectives = true;
    cuda::Context context(options);
    cuda::ParameterStore store(bundle, context);
    store.upload(hostStore);
    cuda::Executor executor(bundle, "train_step", store, &rank);
    std::vector<int64_t> shape = fn.values[fn.inputs[0]].shape;
    host::Tensor tokens = randomIds(shape, 256, 3);
    host::Tensor labels = randomIds(shape, 256, 4);
    for (int run = 0; run < 4; ++run)
      executor.run({viewOf(tokens), viewOf(labels)}, {5, 5});
    if (c.rank() == 0)
      timeline = executor.timeline();
  });
  reportRankErrors(errors);
  ASSERT_FALSE(timeline.empty());
  double commMs = 0, besideGemmMs = 0, besideAnyMs = 0;
  int collectives = 0, overlapping = 0;
  std::ostringstream shown;
  for (const auto &comm : timeline) {
    if (!comm.communication)
      continue;
    ++collectives;
    commMs += comm.endMs - comm.startMs;
    // Compute intervals do not overlap each other (one stream).
    double gemm = 0, any = 0;
    std::map<std::string, double> byGemm;
    for (const auto &work : timeline) {
      if (work.communication)
        continue;
      double overlap = std::min(comm.endMs, work.endMs) -
                       std::max(comm.startMs, work.startMs);
      if (overlap <= 0)
        continue;
      Op op = fn.instructions[work.position].op;
      any += overlap;
      if (isGemm(op)) {
        gemm += overlap;
        byGemm[std::string(opName(op)) + "#" + std::to_string(work.position)] +=
            overlap;
      }
    }
    besideGemmMs += gemm;
    besideAnyMs += any;
    if (gemm > 0) {
      ++overlapping;
      if (overlapping <= 8) {
        shown << "[ timeline ]   " << opName(fn.instructions[comm.position].op)
              << "#" << comm.position << " [" << comm.startMs * 1e3 << ", "
              << comm.endMs * 1e3 << "] us beside";
        for (auto &[name, ms] : byGemm)
          shown << " " << name << " " << ms * 1e3 << " us";
        shown << "\n";
      }
    }
  }
  double stepMs = timeline.back().endMs;
  std::cout << "[ timeline ] rank 0's train_step: " << stepMs * 1e3 << " us; "
            << collectives << " collectives on the communication "
            << "stream, " << commMs * 1e3 << " us in all; " << overlapping
            << " of them overlap GEMMs, " << besideGemmMs * 1e3
            << " us beside GEMMs, " << besideAnyMs * 1e3
            << " us beside any compute instruction\n"
            << shown.str();
  EXPECT_GT(overlapping, 0);
  EXPECT_GT(besideGemmMs, 0.0);
}

} // namespace
