// Data parallelism on one GPU: tiny-gpt compiled for DP=2 (with and without
// the distributed optimizer, fp32 and bf16), DP=2 x TP=2 and PP=2 x DP=2 (4
// layers, with and without the distributed optimizer: each pipeline rank
// reduces its own gradient buffer once per iteration), and with gradient
// buckets (--overlap-grad-reduce), each rank a thread with its own context and
// stream on device 0, talking through the in-process communicator. 5 iterations
// of cuda::Trainer against the one-rank cuda::Trainer from the same seed and
// samples, and against the host backend's trainer on the same grid: losses,
// gradient norms (the world's, clipping on), the replicas' parameters (the same
// on every data rank after the reduction or the gather) and the final
// parameters. The -nodrop bundles run without dropout; tiny-gpt's own (dropout
// 0.1) draws its masks over each data rank's tile of the global micro-batch,
// keyed on the global samples (core/Random.h), so the DP=2 run (micro-batch
// 4) draws the masks of the one-rank run (micro-batch 8, tiny-gpt.yaml's).
#include "CudaTestSupport.h"

#include "comm/InProcessWorld.h"
#include "comm/RankContext.h"
#include "comm/RunRanks.h"
#include "cuda/ParameterStore.h"
#include "cuda/Trainer.h"
#include "host/ParameterStore.h"
#include "train/Checkpoint.h"
#include "train/Trainer.h"

#include <cmath>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <mutex>
#include <sstream>
#include <unistd.h>

using namespace mtrt;
using namespace mtrt::test;

namespace {

/// One run's history (rank 0's) and its final parameters, whole (gathered
/// from the ranks' shards).
struct TrainingRun {
  std::vector<train::IterationRecord> history;
  std::vector<host::Tensor> parameters;
  /// The largest relative difference between two ranks' copies of an
  /// element (data-parallel replicas, tensor-parallel replicas).
  double replicaDifference = 0;
  /// Whether the ranks' device stores held AdamW's moments.
  bool storeMoments = true;
};

train::TrainerOptions trainingOptions() {
  train::TrainerOptions options;
  options.trainIters = 5;
  options.lr = 1e-3;
  options.lrWarmupIters = 2;
  options.evalInterval = 0;
  options.progressBar = false;
  options.seed = 1234;
  options.clipGrad = 0.5; // small enough to clip: the world's norm matters
  // Two micro-batches per iteration on every layout: gradients accumulate
  // before the data-parallel reduction.
  options.globalBatchSize = 16;
  return options;
}

/// Writes a rank's shards into the whole tensors (NaN: not yet written);
/// copies of an element on several ranks update `worst`.
void gather(const host::ParameterStore &store, std::vector<host::Tensor> &whole,
            double &worst) {
  for (size_t p = 0; p < store.size(); ++p) {
    if (!store.holds(p)) // another pipeline rank's
      continue;
    const Parameter &info = store.info(p);
    std::vector<int64_t> offsets = store.shardOffsets(p);
    const float *shard = store.value(p).data<float>();
    for (int64_t i = 0; i < info.localType.numElements; ++i) {
      float &slot =
          whole[p].data<float>()[shardElementIndex(info, offsets, i)];
      if (!std::isnan(slot))
        worst = std::max(worst, std::abs(double(slot) - shard[i]) /
                                    std::max(1e-6, std::abs(double(slot))));
      slot = shard[i];
    }
  }
}

std::vector<host::Tensor> nanParameters(const Bundle &bundle) {
  std::vector<host::Tensor> out;
  for (const Parameter &p : bundle.parameters()) {
    out.emplace_back(DType::F32, p.type.shape);
    for (int64_t i = 0; i < p.type.numElements; ++i)
      out.back().data<float>()[i] = NAN;
  }
  return out;
}

TrainingRun oneRank(const Bundle &bundle,
                    const train::TrainerOptions &options) {
  cuda::Trainer trainer(bundle, multiRankCorpus(), "corpus", options);
  std::ostringstream log;
  trainer.train(log);
  trainer.copyParametersToHost();
  TrainingRun run;
  run.history = trainer.history();
  run.parameters = nanParameters(bundle);
  gather(trainer.host().parameters(), run.parameters, run.replicaDifference);
  return run;
}

/// Every rank of `bundle` as a thread: cuda::Trainer (on `device`), or the
/// host's train::Trainer when `onHost`.
TrainingRun ranks(const Bundle &bundle, const train::TrainerOptions &options,
                  bool onHost, const cuda::ContextOptions &device = {}) {
  TrainingRun run;
  run.parameters = nanParameters(bundle);
  std::mutex mutex;
  std::vector<std::vector<train::IterationRecord>> histories(
      bundle.rankCount());
  std::string text = multiRankCorpus();
  comm::InProcessWorld world(static_cast<int>(bundle.rankCount()));
  auto errors = comm::runRanks(world, [&](comm::Communicator &c) {
    comm::RankContext rank(c, bundle.gridShape());
    std::ostringstream log;
    std::vector<train::IterationRecord> history;
    std::unique_ptr<cuda::Trainer> gpu;
    std::unique_ptr<train::Trainer> host;
    bool moments = true;
    if (onHost) {
      train::TrainerOptions hostOptions = options;
      hostOptions.threads = 2;
      host = std::make_unique<train::Trainer>(bundle, text, "corpus",
                                              hostOptions, &rank);
      host->train(log);
      history = host->history();
    } else {
      gpu = std::make_unique<cuda::Trainer>(bundle, text, "corpus", options,
                                            device, &rank);
      gpu->train(log);
      gpu->copyParametersToHost();
      history = gpu->history();
      moments = gpu->parameters().hasOptimizerState();
    }
    host::ParameterStore &store =
        onHost ? host->parameters() : gpu->host().parameters();
    std::lock_guard<std::mutex> lock(mutex);
    gather(store, run.parameters, run.replicaDifference);
    run.storeMoments = moments;
    histories[static_cast<size_t>(c.rank())] = std::move(history);
  });
  for (auto &error : errors) {
    if (!error)
      continue;
    try {
      std::rethrow_exception(error);
    } catch (const std::exception &e) {
      ADD_FAILURE() << "a rank failed: " << e.what();
    }
  }
  // Every rank's loss is the bundle's (averaged over the data ranks).
  run.history = histories[0];
  for (size_t r = 1; r < histories.size(); ++r) {
    EXPECT_EQ(histories[r].size(), run.history.size()) << "rank " << r;
    for (size_t i = 0; i < std::min(histories[r].size(), run.history.size());
         ++i)
      EXPECT_EQ(histories[r][i].loss, run.history[i].loss)
          << "rank " << r << " logs another loss at iteration " << i + 1;
  }
  return run;
}

/// The largest relative loss difference over the iterations; expects each
/// within `loss` and each gradient norm within `norm` (relative).
double expectSameTraining(const TrainingRun &actual,
                          const TrainingRun &expected, double loss, double norm,
                          const std::string &what) {
  EXPECT_EQ(actual.history.size(), expected.history.size()) << what;
  double worst = 0;
  for (size_t i = 0;
       i < std::min(actual.history.size(), expected.history.size()); ++i) {
    const train::IterationRecord &a = actual.history[i],
                                 &e = expected.history[i];
    double relative = std::abs(a.loss - e.loss) / std::abs(e.loss);
    worst = std::max(worst, relative);
    EXPECT_LE(relative, loss) << what << ", iteration " << i + 1 << ": loss "
                              << a.loss << " vs " << e.loss;
    EXPECT_NEAR(a.gradNorm, e.gradNorm, norm * e.gradNorm)
        << what << ", iteration " << i + 1;
    EXPECT_EQ(a.learningRate, e.learningRate) << what;
  }
  return worst;
}

/// The largest relative difference of the final parameters (per tensor,
/// against its largest magnitude); every element must be written.
double parameterDifference(const TrainingRun &actual,
                           const TrainingRun &expected) {
  double worst = 0;
  for (size_t p = 0; p < expected.parameters.size(); ++p) {
    const host::Tensor &a = actual.parameters[p];
    for (int64_t i = 0; i < a.numElements(); ++i)
      if (std::isnan(a.data<float>()[i])) {
        ADD_FAILURE() << "parameter " << p << ": no rank wrote element " << i;
        return INFINITY;
      }
    worst = std::max(worst, relativeDifference(a, expected.parameters[p]));
  }
  return worst;
}

/// A layout: the one-rank bundle, the bundle of several ranks, bf16 or not.
struct Layout {
  const char *name;
  const char *one;
  const char *ranks;
  bool bf16;
  bool distributed;
  /// The global batch (a pipeline bundle's schedule fixes its micro-batches).
  int64_t globalBatch = 16;
};

class CudaDataParallelTest : public ::testing::TestWithParam<Layout> {};

const char *const kHowToMake =
    "megatron-compile models/tiny-gpt.yaml [--hidden-dropout 0 "
    "--attention-dropout 0] --data-parallel-size 2 --micro-batch-size 4 "
    "--global-batch-size 8 [--use-distributed-optimizer] "
    "[--tensor-model-parallel-size 2] [--bf16]; or the pipeline bundles' "
    "flags with --data-parallel-size 2";

TEST_P(CudaDataParallelTest, TrainingEqualsOneRankAndTheHost) {
  MTRT_REQUIRE_GPU();
  const Layout &layout = GetParam();
  Bundle one = loadTestBundle(layout.one, kHowToMake);
  Bundle grid = loadTestBundle(layout.ranks, kHowToMake);
  // A pipeline bundle has one gradient buffer per pipeline rank.
  ASSERT_TRUE(grid.hasGradientBuffer());
  ASSERT_EQ(grid.gradientBuffers().size(),
            grid.pipeline() ? static_cast<size_t>(grid.pipeline()->size) : 1u);
  for (const GradientBuffer &buffer : grid.gradientBuffers())
    ASSERT_EQ(buffer.distributedOptimizer, layout.distributed);
  train::TrainerOptions options = trainingOptions();
  options.globalBatchSize = layout.globalBatch;

  TrainingRun reference = oneRank(one, options);
  TrainingRun device = ranks(grid, options, false);
  TrainingRun host = ranks(grid, options, true);
  ASSERT_EQ(reference.history.size(), 5u);
  // Training made progress (not two broken runs that agree).
  EXPECT_LT(reference.history.back().loss, reference.history.front().loss);

  double lossTolerance = layout.bf16 ? 2e-2 : 1e-5;
  double normTolerance = layout.bf16 ? 5e-2 : 1e-4;
  double vsOne = expectSameTraining(device, reference, lossTolerance,
                                    normTolerance, "against one rank");
  double vsHost = expectSameTraining(device, host, lossTolerance, normTolerance,
                                     "against the host");
  // The data-parallel replicas hold the same values after every step: the
  // all-reduced gradients (or the gathered parameters) are the same bits.
  EXPECT_LE(device.replicaDifference, 1e-6);
  EXPECT_EQ(device.storeMoments, !layout.distributed)
      << "the distributed optimizer keeps only its shard's moments";
  double parametersVsOne = parameterDifference(device, reference);
  double parametersVsHost = parameterDifference(device, host);
  if (!layout.bf16) {
    EXPECT_LE(parametersVsOne, 1e-3);
    EXPECT_LE(parametersVsHost, 1e-3);
  }
  std::cout << "[ dp       ] " << layout.ranks << ": loss "
            << reference.history.front().loss << " -> "
            << reference.history.back().loss << " (one rank) / "
            << device.history.back().loss << " (grid) / "
            << host.history.back().loss
            << " (host grid); largest relative loss difference " << vsOne
            << " to one rank, " << vsHost << " to the host; final parameters "
            << parametersVsOne << " / " << parametersVsHost
            << "; replicas within " << device.replicaDifference << "\n";
}

// fp16 loss scaling under data parallelism (on an fp32 bundle: the device
// computes in fp32 either way): the unscale runs over the reduced gradients
// (the distributed optimizer's shard, or the all-reduced store), the
// found-inf flag is all-reduced over the world. A dynamic scale of 2^16
// (clean) trains as the host's grid and the one-rank run; a static scale of
// 2^200 (an infinite seed in float) skips every iteration on every rank,
// leaving the parameters as initialized, as on the host.
TEST(CudaDataParallelFp16Test, LossScalingAgreesWithTheHostAndOneRank) {
  MTRT_REQUIRE_GPU();
  Bundle one = loadTestBundle("tiny-gpt-nodrop", kHowToMake);
  for (const char *name :
       {"tiny-gpt-nodrop-dp2", "tiny-gpt-nodrop-dp2-distopt"}) {
    Bundle grid = loadTestBundle(name, kHowToMake);

    train::TrainerOptions clean = trainingOptions();
    clean.lossScaling = train::LossScalerOptions{};
    clean.lossScaling->initialScale = 65536;
    TrainingRun reference = oneRank(one, clean);
    TrainingRun device = ranks(grid, clean, false);
    TrainingRun host = ranks(grid, clean, true);
    double vsOne = expectSameTraining(device, reference, 1e-5, 1e-4, name);
    double vsHost = expectSameTraining(device, host, 1e-5, 1e-4, name);
    for (size_t i = 0; i < device.history.size(); ++i) {
      EXPECT_FALSE(device.history[i].skipped)
          << name << ", iteration " << i + 1;
      EXPECT_EQ(device.history[i].lossScale, 65536.0) << name;
    }

    train::TrainerOptions overflowing = trainingOptions();
    overflowing.lossScaling = train::LossScalerOptions{};
    overflowing.lossScaling->staticScale = std::ldexp(1.0, 200);
    TrainingRun skipped = ranks(grid, overflowing, false);
    TrainingRun hostSkipped = ranks(grid, overflowing, true);
    ASSERT_EQ(skipped.history.size(), 5u) << name;
    for (size_t i = 0; i < skipped.history.size(); ++i) {
      EXPECT_TRUE(skipped.history[i].skipped)
          << name << ": iteration " << i + 1 << " was not skipped";
      EXPECT_EQ(skipped.history[i].skipped, hostSkipped.history[i].skipped);
    }
    EXPECT_EQ(parameterDifference(skipped, hostSkipped), 0.0)
        << name << ": skipped iterations changed the parameters";
    std::cout << "[ dp fp16  ] " << name
              << ": scale 2^16, largest relative loss difference " << vsOne
              << " to one rank, " << vsHost
              << " to the host; scale 2^200: every iteration skipped\n";
  }
}

// Megatron-LM's --overlap-grad-reduce on the GPU: the same layouts compiled
// with gradient buckets (--ddp-bucket-size 40000: 7 buckets of tiny-gpt,
// each reduced in the last micro-batch once its gradients are complete, on
// the context's stream) train as the bundles that reduce the whole buffer
// after the step: the same losses and gradient norms, and the same final
// parameters, bit for bit (deterministic GEMM algorithms and attention, so
// that the two runs compute the same bits; each element's sum over the
// ranks is the same either way). DP=2 plain and with the distributed
// optimizer, and PP=2 x DP=2 (each pipeline rank's buffer in buckets,
// started in its last micro-batch's backward functions).
TEST(CudaDataParallelBucketTest, OverlapTrainsAsOneReduction) {
  MTRT_REQUIRE_GPU();
  const char *const howToMake =
      "the bundles of CudaDataParallelTest compiled with "
      "--overlap-grad-reduce --ddp-bucket-size=40000 "
      "(bench/make-device-dir.sh)";
  cuda::ContextOptions device;
  device.gemmTuning = false;
  device.deterministicAttention = true;
  struct Pair {
    const char *plain, *overlap;
    int64_t globalBatch;
  };
  for (const Pair &pair :
       {Pair{"tiny-gpt-nodrop-dp2", "tiny-gpt-nodrop-dp2-overlap", 16},
        Pair{"tiny-gpt-nodrop-dp2-distopt",
             "tiny-gpt-nodrop-dp2-distopt-overlap", 16},
        Pair{"tiny-gpt-l4-nodrop-pp2-dp2", "tiny-gpt-l4-nodrop-pp2-dp2-overlap",
             8}}) {
    Bundle plain = loadTestBundle(pair.plain, kHowToMake);
    Bundle overlap = loadTestBundle(pair.overlap, howToMake);
    for (const GradientBuffer &buffer : overlap.gradientBuffers())
      ASSERT_GT(buffer.buckets.size(), 1u) << pair.overlap;
    train::TrainerOptions options = trainingOptions();
    options.globalBatchSize = pair.globalBatch;
    TrainingRun off = ranks(plain, options, false, device);
    TrainingRun on = ranks(overlap, options, false, device);
    ASSERT_EQ(off.history.size(), 5u) << pair.plain;
    ASSERT_EQ(on.history.size(), off.history.size()) << pair.overlap;
    for (size_t i = 0; i < off.history.size(); ++i) {
      EXPECT_EQ(on.history[i].loss, off.history[i].loss)
          << pair.overlap << ", iteration " << i + 1;
      EXPECT_EQ(on.history[i].gradNorm, off.history[i].gradNorm)
          << pair.overlap << ", iteration " << i + 1;
    }
    double parameters = parameterDifference(on, off);
    EXPECT_EQ(parameters, 0.0) << pair.overlap;
    std::cout << "[ buckets  ] " << pair.overlap << ": loss "
              << on.history.front().loss << " -> " << on.history.back().loss
              << ", the same as " << pair.plain
              << "; final parameters differ by " << parameters << "\n";
  }
}

// Checkpoints under the distributed optimizer: AdamW's moments live in the
// device shard, not the store. 6 iterations saving at 3 and 6, then a run
// resumed from a copy of the checkpoint of 3: iterations 4 to 6 give the
// same losses and gradient norms, bit for bit (moments lost on the save or
// the load would change them).
TEST(CudaDataParallelCheckpointTest, DistributedOptimizerResumesExactly) {
  MTRT_REQUIRE_GPU();
  Bundle grid = loadTestBundle("tiny-gpt-nodrop-dp2-distopt", kHowToMake);
  namespace fs = std::filesystem;
  fs::path dir = fs::temp_directory_path() /
                 ("mtrt-dp-checkpoint-" + std::to_string(::getpid()));
  fs::remove_all(dir);
  train::TrainerOptions o = trainingOptions();
  o.trainIters = 6;
  o.lrDecayIters = 6;
  o.saveInterval = 3;
  o.save = (dir / "full").string();
  // The GEMMs' heuristic algorithms: a timed choice could differ between
  // the two runs.
  cuda::ContextOptions untuned;
  untuned.gemmTuning = false;
  TrainingRun full = ranks(grid, o, false, untuned);
  ASSERT_EQ(full.history.size(), 6u);

  std::string name = train::iterationDirectoryName(3);
  fs::create_directories(dir / "resumed");
  fs::copy(dir / "full" / name, dir / "resumed" / name,
           fs::copy_options::recursive);
  std::ofstream(dir / "resumed" / train::kLatestCheckpointFile) << 3;
  o.save = o.load = (dir / "resumed").string();
  TrainingRun resumed = ranks(grid, o, false, untuned);
  ASSERT_EQ(resumed.history.size(), 3u);
  for (size_t i = 0; i < 3; ++i) {
    const train::IterationRecord &a = resumed.history[i],
                                 &b = full.history[3 + i];
    EXPECT_EQ(a.iteration, b.iteration);
    EXPECT_EQ(a.loss, b.loss) << "iteration " << b.iteration;
    EXPECT_EQ(a.gradNorm, b.gradNorm) << "iteration " << b.iteration;
  }
  EXPECT_EQ(parameterDifference(resumed, full), 0.0);
  if (!::testing::Test::HasFailure())
    fs::remove_all(dir);
}

INSTANTIATE_TEST_SUITE_P(
    TinyGpt, CudaDataParallelTest,
    ::testing::Values(
        Layout{"Fp32Dp2", "tiny-gpt-nodrop", "tiny-gpt-nodrop-dp2", false,
               false},
        Layout{"Fp32Dp2DistributedOptimizer", "tiny-gpt-nodrop",
               "tiny-gpt-nodrop-dp2-distopt", false, true},
        Layout{"Bf16Dp2", "tiny-gpt-bf16-nodrop", "tiny-gpt-bf16-nodrop-dp2",
               true, false},
        Layout{"Bf16Dp2DistributedOptimizer", "tiny-gpt-bf16-nodrop",
               "tiny-gpt-bf16-nodrop-dp2-distopt", true, true},
        Layout{"Fp32Dp2Tp2DistributedOptimizer", "tiny-gpt-nodrop",
               "tiny-gpt-nodrop-dp2-tp2-distopt", false, true},
        // Dropout 0.1 over the data ranks' tiles, and over
        // DP=2 x TP=2 with sequence parallelism.
        Layout{"Fp32Dp2Dropout", "tiny-gpt", "tiny-gpt-dp2", false, false},
        Layout{"Fp32Dp2Tp2SequenceParallelDropout", "tiny-gpt",
               "tiny-gpt-dp2-tp2-sp-distopt", false, true},
        // 4 layers, untied embeddings (pipelines need them),
        // 1F1B, two micro-batches of 2 per data rank.
        Layout{"Fp32Pp2Dp2", "tiny-gpt-l4-nodrop", "tiny-gpt-l4-nodrop-pp2-dp2",
               false, false, 8}),
    [](const ::testing::TestParamInfo<Layout> &info) {
      return std::string(info.param.name);
    });

} // namespace
