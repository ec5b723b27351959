// Checkpoints of the GPU trainer (cuda/TrainerCheckpoint.cpp): a resumed run
// continues bit for bit (fp32, bf16, fp16 with its loss scaler), and a
// checkpoint saved by either backend loads on the other.
#include "BundleTestBuilder.h"
#include "CudaTestSupport.h"

#include "cuda/ParameterStore.h"
#include "cuda/Trainer.h"
#include "host/ParameterStore.h"
#include "train/Checkpoint.h"
#include "train/Trainer.h"

#include <cmath>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <sstream>
#include <unistd.h>

using namespace mtrt;
using namespace mtrt::test;
namespace fs = std::filesystem;

namespace {

/// About 45 KB: tiny-gpt's 128-token samples fill an epoch of 12 iterations.
std::string corpus() {
  std::string text;
  for (int i = 0; i < 1000; ++i)
    text += "the cat sat on the mat; the dog ate the hat. ";
  return text;
}

/// 8 iterations of 2 micro-batches; the schedule's length is given, so a
/// run of 4 has the same learning rates as the first 4 of 8.
train::TrainerOptions trainOptions() {
  train::TrainerOptions o;
  o.trainIters = 8;
  o.lr = 3e-2;
  o.lrWarmupIters = 2;
  o.lrDecayIters = 8;
  o.lrDecayStyle = host::LrDecayStyle::Cosine;
  o.evalInterval = 0;
  o.threads = 2;
  o.progressBar = false;
  return o;
}

/// fp16: a start of 2^130 (inf in float) skips the first iterations, and a
/// window of 4 grows the scale within the run.
train::TrainerOptions fp16Options() {
  train::TrainerOptions o = trainOptions();
  o.trainIters = 12;
  o.lrDecayIters = 12;
  o.lossScaling = train::LossScalerOptions{};
  o.lossScaling->initialScale = std::ldexp(1.0, 130);
  o.lossScaling->window = 4;
  return o;
}

/// The GEMMs' heuristic algorithm: a timed choice could differ between two
/// trainers (megatron-train's runs are compared in
/// test/integration/cuda-checkpoint-resume.test).
cuda::ContextOptions untunedDevice() {
  cuda::ContextOptions device;
  device.gemmTuning = false;
  return device;
}

std::string readFile(const std::string &path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

/// A --save directory holding only `from`'s checkpoint of `iteration`, as
/// if the run had stopped there.
void copyCheckpoint(const std::string &from, int64_t iteration,
                    const std::string &to) {
  std::string name = train::iterationDirectoryName(iteration);
  fs::create_directories(to);
  fs::copy(fs::path(from) / name, fs::path(to) / name,
           fs::copy_options::recursive);
  std::ofstream(fs::path(to) / train::kLatestCheckpointFile)
      << iteration;
}

class CudaCheckpointTest : public CudaTest {
protected:
  void SetUp() override {
    CudaTest::SetUp();
    if (IsSkipped())
      return;
    const auto *info = ::testing::UnitTest::GetInstance()->current_test_info();
    std::string name = std::string(info->test_suite_name()) + "-" +
                       info->name() + "-" + std::to_string(::getpid());
    for (char &c : name)
      if (c == '/')
        c = '_';
    dir = (fs::temp_directory_path() / ("mtrt-" + name)).string();
    fs::remove_all(dir);
    fs::create_directories(dir);
  }
  void TearDown() override {
    if (!dir.empty() && !HasFailure())
      fs::remove_all(dir);
  }
  std::string path(const std::string &name) const {
    return (fs::path(dir) / name).string();
  }
  /// A fresh directory per test (kept when the test fails).
  std::string dir;

  /// Trains `bundle` on the GPU with `o`; returns the history (and the log).
  std::vector<train::IterationRecord>
  trainOnGpu(const Bundle &bundle, const train::TrainerOptions &o,
             std::string *logText = nullptr) {
    cuda::Trainer trainer(bundle, corpus(), "corpus", o, untunedDevice());
    std::ostringstream log;
    trainer.train(log);
    if (logText)
      *logText = log.str();
    return trainer.history();
  }

  /// Trains 2n iterations saving at n and 2n, then resumes a copy of the
  /// checkpoint of n to 2n: iterations n+1..2n, every logged value and the
  /// final checkpoint's bytes are identical.
  void expectBitIdenticalResume(const Bundle &bundle,
                                train::TrainerOptions o) {
    int64_t half = o.trainIters / 2;
    o.saveInterval = half;
    o.save = path("full");
    std::vector<train::IterationRecord> full = trainOnGpu(bundle, o);

    copyCheckpoint(path("full"), half, path("resumed"));
    o.save = o.load = path("resumed");
    std::string log;
    std::vector<train::IterationRecord> resumed = trainOnGpu(bundle, o, &log);
    EXPECT_NE(log.find("successfully loaded checkpoint from " +
                       path("resumed") + "/" +
                       train::iterationDirectoryName(half)),
              std::string::npos)
        << log;
    ASSERT_EQ(full.size(), static_cast<size_t>(o.trainIters));
    ASSERT_EQ(resumed.size(), static_cast<size_t>(o.trainIters - half));
    for (size_t i = 0; i < resumed.size(); ++i) {
      const train::IterationRecord &a = resumed[i], &b = full[half + i];
      EXPECT_EQ(a.iteration, b.iteration);
      // Exact, or both NaN (an fp16 iteration that skipped its step).
      auto same = [](double x, double y) {
        return x == y || (std::isnan(x) && std::isnan(y));
      };
      EXPECT_TRUE(same(a.loss, b.loss))
          << "iteration " << b.iteration << ": " << a.loss << " vs "
          << b.loss;
      EXPECT_TRUE(same(a.gradNorm, b.gradNorm))
          << "iteration " << b.iteration << ": " << a.gradNorm << " vs "
          << b.gradNorm;
      EXPECT_EQ(a.learningRate, b.learningRate) << "iteration " << b.iteration;
      EXPECT_EQ(a.lossScale, b.lossScale) << "iteration " << b.iteration;
      EXPECT_EQ(a.skipped, b.skipped) << "iteration " << b.iteration;
    }
    std::string last = train::iterationDirectoryName(o.trainIters);
    std::string shard = "mp_rank_00_000.safetensors";
    std::string a = readFile(path("full") + "/" + last + "/" + shard);
    EXPECT_FALSE(a.empty());
    EXPECT_TRUE(a == readFile(path("resumed") + "/" + last + "/" + shard))
        << "the final checkpoints' parameters or moments differ";
  }
};

Bundle bigram() {
  return Bundle::parseManifest("bigram.mtb",
                               bigramManifest(256, 16, 4, 16, 8).dump());
}

TEST_F(CudaCheckpointTest, Fp32ResumeIsBitIdentical) {
  expectBitIdenticalResume(bigram(), trainOptions());
}

// tiny-gpt has dropout: the resumed run's masks continue from the
// checkpoint's micro-step.
TEST_F(CudaCheckpointTest, TinyGptWithDropoutResumesBitIdentically) {
  expectBitIdenticalResume(loadTestBundle("tiny-gpt"), trainOptions());
}

// bf16: the loaded fp32 masters are rounded into the GEMMs' bf16 copies
// again; a stale copy would change the first resumed loss.
TEST_F(CudaCheckpointTest, Bf16ResumeIsBitIdentical) {
  expectBitIdenticalResume(loadTestBundle("tiny-gpt-bf16"), trainOptions());
}

// FP8 with delayed scaling: the scales and amax histories go through the
// host store into the checkpoint and back onto the device; resumed with
// fresh scales, the first resumed step would cast with scale 1.
TEST_F(CudaCheckpointTest, Fp8ResumeKeepsTheScalingState) {
  expectBitIdenticalResume(loadTestBundle("tiny-gpt-fp8-hybrid"),
                           trainOptions());
}

// fp16: the loss scaler's scale and trackers and the count of skipped
// iterations resume (the checkpoint's optimizer_step is the updates).
TEST_F(CudaCheckpointTest, Fp16ResumeKeepsTheLossScaler) {
  train::TrainerOptions o = fp16Options();
  expectBitIdenticalResume(bigram(), o);
  train::CheckpointManifest manifest = train::readCheckpointManifest(
      path("full") + "/" + train::iterationDirectoryName(6));
  EXPECT_EQ(manifest.state.lossScale["kind"], "dynamic");
  EXPECT_LT(manifest.state.optimizerStep, 6) << "no iteration was skipped";
  EXPECT_GT(manifest.state.optimizerStep, 0) << "no iteration trained";
}

/// Whether every parameter and moment of `store` equals the checkpoint's.
void expectStoreEqualsCheckpoint(host::ParameterStore &store,
                                 const std::string &iterationDir) {
  train::CheckpointManifest manifest =
      train::readCheckpointManifest(iterationDir);
  for (size_t i = 0; i < store.size(); ++i) {
    const std::string &name = store.info(i).name;
    std::pair<const char *, host::Tensor *> kinds[] = {
        {"model/", &store.value(i)},
        {"optimizer/exp_avg/", &store.expAvg(i)},
        {"optimizer/exp_avg_sq/", &store.expAvgSq(i)}};
    for (auto [prefix, tensor] : kinds) {
      std::vector<float> saved =
          train::readWholeTensor(manifest, prefix + name);
      std::vector<float> held(tensor->data<float>(),
                              tensor->data<float>() + tensor->numElements());
      EXPECT_TRUE(saved == held) << prefix << name;
    }
  }
}

// A host checkpoint loads on the GPU: the device holds its every bit, and
// training on continues as the host's uninterrupted run does (within fp32
// rounding of differently ordered sums).
TEST_F(CudaCheckpointTest, HostCheckpointLoadsOnTheGpu) {
  Bundle bundle = bigram();
  train::TrainerOptions o = trainOptions();
  o.trainIters = 4;
  o.save = path("host");
  {
    train::Trainer host(bundle, corpus(), "corpus", o);
    std::ostringstream log;
    host.train(log);
  }
  o.load = path("host");
  o.save.clear();
  {
    // Loaded, nothing to train: what the device holds is the checkpoint.
    cuda::Trainer gpu(bundle, corpus(), "corpus", o, untunedDevice());
    std::ostringstream log;
    gpu.train(log);
    EXPECT_NE(log.str().find("nothing to train"), std::string::npos)
        << log.str();
    gpu.copyParametersToHost();
    expectStoreEqualsCheckpoint(gpu.host().parameters(),
                                path("host") + "/iter_0000004");
  }
  train::TrainerOptions whole = trainOptions();
  std::vector<train::IterationRecord> expected;
  {
    train::Trainer host(bundle, corpus(), "corpus", whole);
    std::ostringstream log;
    host.train(log);
    expected = host.history();
  }
  o.trainIters = 8;
  std::vector<train::IterationRecord> actual = trainOnGpu(bundle, o);
  ASSERT_EQ(actual.size(), 4u);
  for (size_t i = 0; i < actual.size(); ++i) {
    EXPECT_EQ(actual[i].iteration, expected[4 + i].iteration);
    EXPECT_NEAR(actual[i].loss, expected[4 + i].loss,
                1e-5 * expected[4 + i].loss)
        << "iteration " << actual[i].iteration;
    EXPECT_EQ(actual[i].learningRate, expected[4 + i].learningRate);
  }
}

// A GPU checkpoint loads on the host: its store holds every bit the device
// had, and the host's continuation follows the GPU's.
TEST_F(CudaCheckpointTest, GpuCheckpointLoadsOnTheHost) {
  Bundle bundle = bigram();
  train::TrainerOptions o = trainOptions();
  o.saveInterval = 4;
  o.save = path("gpu");
  std::vector<train::IterationRecord> expected;
  {
    cuda::Trainer gpu(bundle, corpus(), "corpus", o, untunedDevice());
    std::ostringstream log;
    gpu.train(log);
    expected = gpu.history();
    // The device's final state is the final checkpoint's.
    gpu.copyParametersToHost();
    expectStoreEqualsCheckpoint(gpu.host().parameters(),
                                path("gpu") + "/iter_0000008");
  }
  copyCheckpoint(path("gpu"), 4, path("at4"));
  o.save.clear();
  o.saveInterval = 0;
  o.load = path("at4");
  train::Trainer host(bundle, corpus(), "corpus", o);
  std::ostringstream log;
  host.train(log);
  const std::vector<train::IterationRecord> &actual = host.history();
  ASSERT_EQ(actual.size(), 4u) << log.str();
  for (size_t i = 0; i < actual.size(); ++i) {
    EXPECT_EQ(actual[i].iteration, expected[4 + i].iteration);
    EXPECT_NEAR(actual[i].loss, expected[4 + i].loss,
                1e-5 * expected[4 + i].loss)
        << "iteration " << actual[i].iteration;
  }
}

// An existing checkpoint is never overwritten: a GPU run that would save
// over one stops before training, and the checkpoint keeps its bytes.
TEST_F(CudaCheckpointTest, ExistingCheckpointIsNeverOverwritten) {
  Bundle bundle = bigram();
  train::TrainerOptions o = trainOptions();
  o.trainIters = 2;
  o.lrDecayIters = 2;
  o.lrWarmupIters = 1;
  o.save = path("ckpt");
  trainOnGpu(bundle, o);
  std::string shard = path("ckpt") + "/iter_0000002/mp_rank_00_000.safetensors";
  std::string before = readFile(shard);
  ASSERT_FALSE(before.empty());
  try {
    cuda::Trainer again(bundle, corpus(), "corpus", o, untunedDevice());
    std::ostringstream log;
    again.train(log);
    FAIL() << "the second save was not refused";
  } catch (const Error &e) {
    EXPECT_EQ(e.code(), MTRT_STATUS_ALREADY_EXISTS) << e.what();
    EXPECT_NE(std::string(e.what()).find("already exists"), std::string::npos)
        << e.what();
  }
  EXPECT_TRUE(readFile(shard) == before);
}

} // namespace
