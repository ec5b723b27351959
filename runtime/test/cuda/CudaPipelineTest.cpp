// Pipeline parallelism on the GPU: tiny-gpt (untied embeddings, or tied ones
// held by the first and the last pipeline rank and summed over them; no
// dropout, 4 micro-batches of 2 per iteration) compiled for several pipeline
// layouts,
// trained 5 iterations as in-process ranks (threads, each with its own CUDA
// context and stream on device 0, the activations and gradients kept on the
// device and staged through the host to the in-process communicator),
// against the same model compiled for one rank on the GPU and (the PP=2
// layouts) against the host backend's run of the same bundle: every
// iteration's loss and gradient norm, and the evaluation loss after
// training. Layouts: PP=2 and PP=4 under 1F1B and interleaved (2 virtual
// stages per rank), TP=2 x PP=2, and tied: PP=2 1F1B and interleaved, TP=2 x
// PP=2; PP=2 1F1B with the fused output layer and loss
// (--fuse-linear-cross-entropy), untied, tied and bf16; FP8 GEMMs (hybrid,
// delayed scaling) under PP=2 1F1B and interleaved and TP=2 x PP=2. A world
// that hangs is aborted after a deadline, so the test fails instead of
// stalling.
#include "CudaTestSupport.h"

#include "comm/InProcessWorld.h"
#include "comm/RankContext.h"
#include "comm/RunRanks.h"
#include "cuda/Trainer.h"
#include "train/Trainer.h"

#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <iostream>
#include <mutex>
#include <sstream>
#include <thread>

using namespace mtrt;
using namespace mtrt::test;

namespace {

struct TrainingRun {
  std::vector<train::IterationRecord> history;
  double evalLoss = 0;
  std::string log;
};

train::TrainerOptions trainOptions() {
  train::TrainerOptions options;
  options.trainIters = 5;
  options.lr = 1e-3;
  options.lrWarmupIters = 2;
  options.evalInterval = 5;
  options.evalIters = 1;
  options.progressBar = false;
  options.seed = 1234;
  options.clipGrad = 0.5; // small enough to clip: the world's norm matters
  return options;
}

/// A layout's whole run may take this long (tiny-gpt takes seconds) before
/// its world is aborted; a rank that then still does not return ends the
/// process (the rest of the suite cannot run with it).
constexpr std::chrono::seconds kWorldDeadline{240};
constexpr std::chrono::seconds kAbortGrace{60};

/// Runs `rankMain` on every rank of `bundle` as threads of an in-process
/// world; fails the test with each rank's own error.
void runInProcess(const Bundle &bundle,
                  const std::function<void(comm::RankContext &)> &rankMain) {
  comm::InProcessOptions options;
  options.timeout = std::chrono::seconds(60); // one call's wait
  comm::InProcessWorld world(static_cast<int>(bundle.rankCount()), options);
  std::mutex mutex;
  std::condition_variable finished;
  bool done = false;
  std::thread supervisor([&] {
    std::unique_lock<std::mutex> lock(mutex);
    if (finished.wait_for(lock, kWorldDeadline, [&] { return done; }))
      return;
    world.abort("the test's deadline passed (a hang)");
    if (finished.wait_for(lock, kAbortGrace, [&] { return done; }))
      return;
    std::fprintf(stderr, "CudaPipelineTest: the ranks of %s hang after the "
                         "world's abort; ending the process\n",
                 bundle.name().c_str());
    std::_Exit(1);
  });
  auto errors = comm::runRanks(world, [&](comm::Communicator &c) {
    comm::RankContext rank(c, bundle.gridShape());
    rankMain(rank);
  });
  {
    std::lock_guard<std::mutex> lock(mutex);
    done = true;
  }
  finished.notify_all();
  supervisor.join();
  for (auto &error : errors) {
    if (!error)
      continue;
    try {
      std::rethrow_exception(error);
    } catch (const std::exception &e) {
      ADD_FAILURE() << "a rank failed: " << e.what();
    }
  }
}

/// The bundle's PP ranks, on the GPU or on the host; rank 0's history (the
/// others must report the same losses).
TrainingRun pipelineRun(const Bundle &bundle, bool gpu) {
  std::vector<TrainingRun> ranks(bundle.rankCount());
  runInProcess(bundle, [&](comm::RankContext &rank) {
    TrainingRun &run = ranks[static_cast<size_t>(rank.rank())];
    std::ostringstream log;
    if (gpu) {
      cuda::Trainer trainer(bundle, multiRankCorpus(), "corpus", trainOptions(),
                            {}, &rank);
      trainer.train(log);
      run.history = trainer.history();
      run.evalLoss = trainer.evaluate();
    } else {
      train::Trainer trainer(bundle, multiRankCorpus(), "corpus",
                             trainOptions(), &rank);
      trainer.train(log);
      run.history = trainer.history();
      run.evalLoss = trainer.evaluate();
    }
    run.log = log.str();
  });
  for (const TrainingRun &run : ranks) {
    EXPECT_EQ(run.history.size(), ranks[0].history.size());
    for (size_t i = 0; i < run.history.size() && i < ranks[0].history.size();
         ++i)
      EXPECT_EQ(run.history[i].loss, ranks[0].history[i].loss)
          << "the ranks report different losses at iteration " << i + 1;
    EXPECT_EQ(run.evalLoss, ranks[0].evalLoss);
  }
  return ranks[0];
}

double relative(double actual, double expected) {
  return std::abs(actual - expected) / std::abs(expected);
}

struct Case {
  const char *name;
  const char *one;      // the one-rank bundle
  const char *pipeline; // the same model, laid out over several ranks
  int64_t pipelineSize;
  bool bf16;
  bool againstHost; // also against the host backend's run of `pipeline`
};

class CudaPipelineTest : public ::testing::TestWithParam<Case> {};

TEST_P(CudaPipelineTest, InProcessRanksEqualOneRank) {
  MTRT_REQUIRE_GPU();
  const Case &c = GetParam();
  const char *howToMake =
      "megatron-compile models/tiny-gpt.yaml --num-layers 4|8 "
      "[--untie-embeddings-and-output-weights] --hidden-dropout 0 "
      "--attention-dropout 0 --micro-batch-size 2 --global-batch-size 8 "
      "[--bf16 [--fp8-format hybrid --fp8-amax-history-len 4 "
      "--fp8-amax-compute-algo max]] [--pipeline-model-parallel-size 2|4 "
      "--pipeline-schedule "
      "1f1b|interleaved --virtual-pipeline-model-parallel-size 2] "
      "[--tensor-model-parallel-size 2] [--fuse-linear-cross-entropy "
      "--linear-cross-entropy-chunk-rows 100]";
  Bundle one = loadTestBundle(c.one, howToMake);
  Bundle pp = loadTestBundle(c.pipeline, howToMake);
  ASSERT_NE(pp.pipeline(), nullptr) << c.pipeline << " has no pipeline";
  ASSERT_EQ(pp.pipeline()->size, c.pipelineSize);

  TrainingRun reference;
  {
    cuda::Trainer trainer(one, multiRankCorpus(), "corpus", trainOptions());
    std::ostringstream log;
    trainer.train(log);
    reference.history = trainer.history();
    reference.evalLoss = trainer.evaluate();
  }
  TrainingRun gpu = pipelineRun(pp, true);
  TrainingRun onHost;
  if (c.againstHost)
    onHost = pipelineRun(pp, false);
  EXPECT_NE(gpu.log.find("idle fraction per pipeline rank"), std::string::npos)
      << gpu.log;

  // Against the one-rank GPU run: the same kernels over the same
  // micro-batches. Against the host's run: fp32 to rounding; bf16 within
  // mixed precision's error of the host's fp32.
  double lossTolerance = c.bf16 ? 2e-2 : 1e-5;
  double normTolerance = c.bf16 ? 5e-2 : 1e-4;
  ASSERT_EQ(reference.history.size(), 5u);
  ASSERT_EQ(gpu.history.size(), 5u);
  if (c.againstHost) {
    ASSERT_EQ(onHost.history.size(), 5u);
  }
  double worstOne = 0, worstHost = 0;
  for (size_t i = 0; i < 5; ++i) {
    double one = relative(gpu.history[i].loss, reference.history[i].loss);
    worstOne = std::max(worstOne, one);
    EXPECT_LE(one, lossTolerance)
        << "iteration " << i + 1 << ": " << c.name << " "
        << gpu.history[i].loss << ", one rank " << reference.history[i].loss;
    EXPECT_LE(relative(gpu.history[i].gradNorm, reference.history[i].gradNorm),
              normTolerance)
        << "iteration " << i + 1 << ": grad norm " << c.name << " "
        << gpu.history[i].gradNorm << ", one rank "
        << reference.history[i].gradNorm;
    if (!c.againstHost)
      continue;
    double hostDifference =
        relative(gpu.history[i].loss, onHost.history[i].loss);
    worstHost = std::max(worstHost, hostDifference);
    EXPECT_LE(hostDifference, lossTolerance)
        << "iteration " << i + 1 << ": GPU " << gpu.history[i].loss
        << ", host " << onHost.history[i].loss;
    EXPECT_LE(relative(gpu.history[i].gradNorm, onHost.history[i].gradNorm),
              normTolerance)
        << "iteration " << i + 1 << ": grad norm GPU "
        << gpu.history[i].gradNorm << ", host " << onHost.history[i].gradNorm;
  }
  EXPECT_LE(relative(gpu.evalLoss, reference.evalLoss), lossTolerance)
      << "eval loss: " << c.name << " " << gpu.evalLoss << ", one rank "
      << reference.evalLoss;
  if (c.againstHost) {
    EXPECT_LE(relative(gpu.evalLoss, onHost.evalLoss), lossTolerance)
        << "eval loss: GPU " << gpu.evalLoss << ", host " << onHost.evalLoss;
  }
  std::cout << "[ pipeline ] " << c.pipeline << ", 5 iterations: loss "
            << reference.history.front().loss << " -> "
            << reference.history.back().loss << " (one rank, GPU) / "
            << gpu.history.back().loss << " (" << c.name << ", GPU)";
  if (c.againstHost)
    std::cout << " / " << onHost.history.back().loss << " (host)";
  std::cout << "; largest relative loss difference " << worstOne
            << " against one rank";
  if (c.againstHost)
    std::cout << ", " << worstHost << " against the host";
  std::cout << "; eval loss " << gpu.evalLoss << " vs " << reference.evalLoss
            << " (one rank)\n";
}

INSTANTIATE_TEST_SUITE_P(
    TinyGpt, CudaPipelineTest,
    ::testing::Values(
        Case{"Fp32Pp2OneFOneB", "tiny-gpt-l4-nodrop",
             "tiny-gpt-l4-nodrop-pp2-1f1b", 2, false, true},
        Case{"Fp32Pp2Interleaved", "tiny-gpt-l4-nodrop",
             "tiny-gpt-l4-nodrop-pp2-interleaved", 2, false, true},
        Case{"Bf16Pp2OneFOneB", "tiny-gpt-l4-bf16-nodrop",
             "tiny-gpt-l4-bf16-nodrop-pp2-1f1b", 2, true, true},
        Case{"Bf16Pp2Interleaved", "tiny-gpt-l4-bf16-nodrop",
             "tiny-gpt-l4-bf16-nodrop-pp2-interleaved", 2, true, true},
        // FP8 GEMMs (hybrid, delayed scaling): each stage's forward updates
        // its activations' and weights' metas and stashes the scales it
        // cast with for its backward.
        Case{"Fp8Pp2OneFOneB", "tiny-gpt-l4-fp8-nodrop",
             "tiny-gpt-l4-fp8-nodrop-pp2-1f1b", 2, true, true},
        Case{"Fp8Pp2Interleaved", "tiny-gpt-l4-fp8-nodrop",
             "tiny-gpt-l4-fp8-nodrop-pp2-interleaved", 2, true, false},
        Case{"Fp8Tp2Pp2", "tiny-gpt-l4-fp8-nodrop",
             "tiny-gpt-l4-fp8-nodrop-tp2-pp2", 2, true, false},
        Case{"Fp32Pp4OneFOneB", "tiny-gpt-l4-nodrop",
             "tiny-gpt-l4-nodrop-pp4-1f1b", 4, false, false},
        Case{"Fp32Pp4Interleaved", "tiny-gpt-l8-nodrop",
             "tiny-gpt-l8-nodrop-pp4-interleaved", 4, false, false},
        Case{"Bf16Pp4OneFOneB", "tiny-gpt-l4-bf16-nodrop",
             "tiny-gpt-l4-bf16-nodrop-pp4-1f1b", 4, true, false},
        Case{"Fp32Tp2Pp2", "tiny-gpt-l4-nodrop", "tiny-gpt-l4-nodrop-tp2-pp2",
             2, false, false},
        Case{"Bf16Tp2Pp2", "tiny-gpt-l4-bf16-nodrop",
             "tiny-gpt-l4-bf16-nodrop-tp2-pp2", 2, true, false},
        Case{"Fp32TiedPp2OneFOneB", "tiny-gpt-l4-tied-nodrop",
             "tiny-gpt-l4-tied-nodrop-pp2-1f1b", 2, false, true},
        Case{"Fp32TiedPp2Interleaved", "tiny-gpt-l4-tied-nodrop",
             "tiny-gpt-l4-tied-nodrop-pp2-interleaved", 2, false, false},
        Case{"Fp32TiedTp2Pp2", "tiny-gpt-l4-tied-nodrop",
             "tiny-gpt-l4-tied-nodrop-tp2-pp2", 2, false, true},
        // The fused output layer and loss on the last stage (its forward
        // stashes the unit gradients for its backward), against the
        // unfused one-rank run: untied, tied (the last stage's copy of the
        // table) and typed bf16.
        Case{"Fp32Pp2OneFOneBFusedLoss", "tiny-gpt-l4-nodrop",
             "tiny-gpt-l4-nodrop-pp2-1f1b-lce", 2, false, true},
        Case{"Fp32TiedPp2OneFOneBFusedLoss", "tiny-gpt-l4-tied-nodrop",
             "tiny-gpt-l4-tied-nodrop-pp2-1f1b-lce", 2, false, true},
        Case{"Bf16Pp2OneFOneBFusedLoss", "tiny-gpt-l4-bf16-nodrop",
             "tiny-gpt-l4-bf16-nodrop-pp2-1f1b-lce", 2, true, true}),
    [](const ::testing::TestParamInfo<Case> &info) {
      return std::string(info.param.name);
    });

} // namespace
