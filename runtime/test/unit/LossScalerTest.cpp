// fp16 loss scaling: the scaler's state machine (Megatron-LM's
// DynamicGradScaler), the unscale-and-check kernel, the found-inf flag agreed
// over ranks, and training with skipped iterations.
#include "BundleTestBuilder.h"
#include "StatusMatchers.h"

#include "comm/InProcessWorld.h"
#include "comm/RankContext.h"
#include "comm/RunRanks.h"
#include "host/ParameterStore.h"
#include "host/ThreadPool.h"
#include "host/kernels/Kernels.h"
#include "train/LossScaler.h"
#include "train/Optimizer.h"
#include "train/Trainer.h"

#include <cmath>
#include <limits>
#include <sstream>

using namespace mtrt;
using namespace mtrt::test;
using namespace mtrt::train;

namespace {

LossScalerOptions dynamicOptions(double initial, double min, int64_t window,
                                 int64_t hysteresis) {
  LossScalerOptions o;
  o.initialScale = initial;
  o.minScale = min;
  o.window = window;
  o.hysteresis = hysteresis;
  return o;
}

TEST(LossScalerTest, MegatronDefaults) {
  LossScaler scaler{LossScalerOptions{}};
  EXPECT_TRUE(scaler.isDynamic());
  EXPECT_EQ(scaler.scale(), std::ldexp(1.0, 32));
  EXPECT_EQ(scaler.hysteresisTracker(), 2);
  EXPECT_EQ(scaler.describe(), "dynamic loss scaling from 4294967296 (min 1, "
                               "window 1000, hysteresis 2)");
}

TEST(LossScalerTest, BacksOffAfterHysteresisOverflows) {
  LossScaler scaler(dynamicOptions(1024, 1, 1000, 2));
  scaler.update(true); // hysteresis 2 -> 1: the scale holds
  EXPECT_EQ(scaler.scale(), 1024);
  EXPECT_EQ(scaler.hysteresisTracker(), 1);
  scaler.update(false); // a clean step does not reset the hysteresis
  EXPECT_EQ(scaler.hysteresisTracker(), 1);
  EXPECT_EQ(scaler.growthTracker(), 1);
  scaler.update(true); // 1 -> 0: halves; the growth count restarts
  EXPECT_EQ(scaler.scale(), 512);
  EXPECT_EQ(scaler.growthTracker(), 0);
  scaler.update(true); // every further overflow halves until a growth
  EXPECT_EQ(scaler.scale(), 256);
  EXPECT_EQ(scaler.hysteresisTracker(), -1);
}

TEST(LossScalerTest, GrowsAfterAWindowOfCleanIterations) {
  LossScaler scaler(dynamicOptions(8, 1, 3, 2));
  scaler.update(true);
  scaler.update(false);
  scaler.update(false);
  EXPECT_EQ(scaler.scale(), 8);
  scaler.update(false); // the third clean one in a row
  EXPECT_EQ(scaler.scale(), 16);
  EXPECT_EQ(scaler.growthTracker(), 0);
  EXPECT_EQ(scaler.hysteresisTracker(), 2); // reset by the growth
  // An overflow inside the window restarts it.
  scaler.update(false);
  scaler.update(false);
  scaler.update(true);
  scaler.update(false);
  scaler.update(false);
  EXPECT_EQ(scaler.scale(), 16);
  scaler.update(false);
  EXPECT_EQ(scaler.scale(), 32);
}

TEST(LossScalerTest, NeverBacksOffBelowTheMinimum) {
  LossScaler scaler(dynamicOptions(8, 2, 1000, 1));
  for (int i = 0; i < 10; ++i)
    scaler.update(true);
  EXPECT_EQ(scaler.scale(), 2);
}

TEST(LossScalerTest, StaticScaleNeverChanges) {
  LossScalerOptions o;
  o.staticScale = 128;
  LossScaler scaler(o);
  EXPECT_FALSE(scaler.isDynamic());
  for (int i = 0; i < 5; ++i)
    scaler.update(i % 2 == 0);
  for (int i = 0; i < 3000; ++i)
    scaler.update(false);
  EXPECT_EQ(scaler.scale(), 128);
  EXPECT_EQ(scaler.state(), (nlohmann::json{{"kind", "static"},
                                            {"scale", 128.0}}));
  EXPECT_EQ(scaler.describe(), "static loss scale 128");
}

TEST(LossScalerTest, StateRoundTripsThroughACheckpoint) {
  LossScaler a(dynamicOptions(1024, 1, 4, 3));
  a.update(true);
  a.update(true);
  a.update(true); // 3 -> 0: 512
  a.update(false);
  LossScaler b(dynamicOptions(1024, 1, 4, 3));
  std::string note = b.restore(a.state());
  EXPECT_EQ(note, "loss scale 512 (growth tracker 1, hysteresis tracker 0)");
  EXPECT_EQ(b.state(), a.state());
  for (bool found : {false, false, false, true, false}) {
    a.update(found);
    b.update(found);
    EXPECT_EQ(a.scale(), b.scale());
  }
  // A checkpoint of an fp32 run (kind none) leaves the flags' start.
  LossScaler c(dynamicOptions(1024, 1, 4, 3));
  EXPECT_EQ(c.restore({{"kind", "none"}, {"scale", 1.0}}),
            "no dynamic loss scale in the checkpoint (kind none): starting "
            "from --initial-loss-scale 1024");
  EXPECT_EQ(c.scale(), 1024);
  expectError([&] { c.restore({{"kind", "dynamic"}, {"scale", 4.0}}); },
              MTRT_STATUS_DATA_LOSS,
              {"the checkpoint's loss_scale has no number \"growth_tracker\"",
               "docs/Checkpoints.md"});
  expectError([&] { c.restore({{"kind", "bf16"}}); }, MTRT_STATUS_DATA_LOSS,
              {"kind is not none, static or dynamic"});
}

TEST(LossScalerTest, RejectsBadOptions) {
  expectError([] { LossScaler(dynamicOptions(0, 1, 1000, 2)); },
              MTRT_STATUS_INVALID_ARGUMENT,
              {"--initial-loss-scale: found 0, expected a finite scale > 0"});
  expectError([] { LossScaler(dynamicOptions(4, 8, 1000, 2)); },
              MTRT_STATUS_INVALID_ARGUMENT,
              {"--min-loss-scale: found 8, above --initial-loss-scale 4"});
  expectError([] { LossScaler(dynamicOptions(4, 1, 0, 2)); },
              MTRT_STATUS_INVALID_ARGUMENT,
              {"--loss-scale-window: found 0, expected clean iterations >= 1"});
  expectError([] { LossScaler(dynamicOptions(4, 1, 10, 0)); },
              MTRT_STATUS_INVALID_ARGUMENT,
              {"--hysteresis: found 0"});
  LossScalerOptions o;
  o.staticScale = -1;
  expectError([&] { LossScaler{o}; }, MTRT_STATUS_INVALID_ARGUMENT,
              {"--loss-scale: found -1"});
}

TEST(LossScalerTest, UnscaleIsExactAndFindsInfAndNan) {
  host::ThreadPool pool(2);
  std::vector<float> x(10000);
  for (size_t i = 0; i < x.size(); ++i)
    x[i] = std::sin(float(i)) * 1e4f;
  std::vector<float> expected = x;
  for (float &v : x)
    v *= 65536.0f;
  EXPECT_FALSE(host::scaleAndCheckFinite<float>(
      pool, int64_t(x.size()), x.data(), 1.0 / 65536.0));
  EXPECT_EQ(x, expected); // powers of two scale exactly
  x[7777] = std::numeric_limits<float>::infinity();
  EXPECT_TRUE(host::scaleAndCheckFinite<float>(pool, int64_t(x.size()),
                                               x.data(), 0.5));
  x[7777] = 0;
  x[3] = std::nanf("");
  EXPECT_TRUE(host::scaleAndCheckFinite<float>(pool, int64_t(x.size()),
                                               x.data(), 0.5));
}

TEST(LossScalerTest, AnyRankFindingInfMakesEveryRankSkip) {
  for (int finder : {-1, 0, 2}) {
    comm::InProcessWorld world(3);
    std::vector<int> skipped(3, -1);
    auto errors = comm::runRanks(world, [&](comm::Communicator &c) {
      comm::RankContext rank(c, {3});
      skipped[c.rank()] = foundOnAnyRank(c.rank() == finder, &rank, 7);
    });
    for (auto &error : errors)
      EXPECT_FALSE(error) << world.abortReason();
    for (int r = 0; r < 3; ++r)
      EXPECT_EQ(skipped[r], finder >= 0) << "rank " << r << ", finder "
                                         << finder;
  }
}

std::string corpus() {
  std::string text;
  for (int i = 0; i < 120; ++i)
    text += "the cat sat on the mat; the dog ate the hat. ";
  return text;
}

TrainerOptions trainOptions() {
  TrainerOptions o;
  o.trainIters = 12;
  o.lr = 3e-2;
  o.lrWarmupIters = 3;
  o.evalInterval = 0;
  o.threads = 2;
  o.progressBar = false;
  return o;
}

std::vector<float> values(Trainer &trainer) {
  std::vector<float> out;
  host::ParameterStore &store = trainer.parameters();
  for (size_t p = 0; p < store.size(); ++p)
    for (host::Tensor *t : {&store.value(p), &store.expAvg(p),
                            &store.expAvgSq(p)})
      out.insert(out.end(), t->data<float>(),
                 t->data<float>() + t->numElements());
  return out;
}

TEST(LossScalerTest, Fp16TrainingEqualsFloat32WithoutOverflow) {
  Bundle bundle = Bundle::parseManifest(
      "bigram.mtb", bigramManifest(256, 16, 4, 16, 8).dump());
  Trainer fp32(bundle, corpus(), "corpus", trainOptions());
  std::ostringstream log;
  fp32.train(log);
  TrainerOptions o = trainOptions();
  o.lossScaling = LossScalerOptions{};
  Trainer fp16(bundle, corpus(), "corpus", o);
  fp16.train(log);
  ASSERT_EQ(fp16.history().size(), 12u);
  for (size_t i = 0; i < 12; ++i) {
    // Scaling by 2^32 and back is exact: the same bits.
    EXPECT_EQ(fp16.history()[i].loss, fp32.history()[i].loss);
    EXPECT_EQ(fp16.history()[i].gradNorm, fp32.history()[i].gradNorm);
    EXPECT_FALSE(fp16.history()[i].skipped);
    EXPECT_EQ(fp16.history()[i].lossScale, std::ldexp(1.0, 32));
  }
  EXPECT_EQ(values(fp16), values(fp32));
}

TEST(LossScalerTest, OverflowingIterationsLeaveParametersAndMomentsAlone) {
  Bundle bundle = Bundle::parseManifest(
      "bigram.mtb", bigramManifest(256, 16, 4, 16, 8).dump());
  TrainerOptions o = trainOptions();
  // 2^130 is inf in float: every gradient overflows until the scale has
  // backed off to 2^127 (hysteresis 2: the first overflow holds it).
  o.lossScaling = LossScalerOptions{};
  o.lossScaling->initialScale = std::ldexp(1.0, 130);
  o.trainIters = 4;
  Trainer skipping(bundle, corpus(), "corpus", o);
  std::vector<float> before = values(skipping);
  std::ostringstream log;
  skipping.train(log);
  std::vector<double> scales;
  for (const IterationRecord &r : skipping.history()) {
    EXPECT_TRUE(r.skipped) << "iteration " << r.iteration;
    EXPECT_TRUE(std::isnan(r.gradNorm));
    EXPECT_EQ(r.learningRate, 0); // the schedule did not move
    scales.push_back(std::log2(r.lossScale));
  }
  EXPECT_EQ(scales, (std::vector<double>{130, 129, 128, 127}));
  EXPECT_EQ(skipping.skippedIterations(), 4);
  EXPECT_EQ(values(skipping), before);
  EXPECT_NE(log.str().find(
                "loss scale: 170141183460469231731687303715884105728.0 |"),
            std::string::npos)
      << log.str();
  EXPECT_NE(log.str().find("number of skipped iterations:   4"),
            std::string::npos)
      << log.str();
}

TEST(LossScalerTest, Fp16NeedsAMarkedSeed) {
  Json manifest = bigramManifest(256, 16, 4, 16, 8);
  for (Json &inst : manifest["functions"][0]["instructions"])
    if (inst["op"] == "fill")
      inst["attrs"].erase("loss_seed");
  Bundle bundle = Bundle::parseManifest("old.mtb", manifest.dump());
  TrainerOptions o = trainOptions();
  o.lossScaling = LossScalerOptions{};
  expectError([&] { Trainer(bundle, corpus(), "corpus", o); },
              MTRT_STATUS_INVALID_ARGUMENT,
              {"--fp16: bundle 'old.mtb''s train_step has no fill marked "
               "loss_seed",
               "recompile it"});
}

} // namespace
