// Tests of the gradient buffer (docs/BundleFormat.md, "Gradient reduction"):
// the manifest's gradient_buffer accepted and rejected, and on two
// in-process data-parallel ranks the reduction, the distributed optimizer's
// shards and its held state, against the replicated optimizer.
#include "BundleTestBuilder.h"

#include "comm/RankContext.h"
#include "comm/RunRanks.h"
#include "host/ParameterStore.h"
#include "host/ThreadPool.h"
#include "train/DataParallelBuffer.h"
#include "train/DistributedOptimizer.h"
#include "train/Optimizer.h"

#include <cmath>
#include <mutex>

using namespace mtrt;
using namespace mtrt::test;

namespace {

// Grid [2, 1]; parameters w [4, 6] and b [6], whole on every rank. The
// buffer holds b then w (30 elements) padded to `size`.
Json bufferManifest(bool distributed, int64_t size = 32) {
  FunctionBuilder reduce("reduce_gradients");
  int64_t in = reduce.input({size}, "f32");
  if (distributed)
    reduce.output(reduce.op(
        "reduce_scatter", {in}, {size / 2},
        {{"grid_axes", {0}}, {"scatter_axis", 0}, {"reduction", "sum"}}));
  else
    reduce.output(reduce.op("all_reduce", {in}, {size},
                            {{"grid_axes", {0}}, {"reduction", "sum"}}));
  Json functions = {reduce.build()};
  if (distributed) {
    FunctionBuilder gather("gather_parameters");
    int64_t shard = gather.input({size / 2}, "f32");
    gather.output(gather.op("all_gather", {shard}, {size},
                            {{"grid_axes", {0}}, {"gather_axis", 0}}));
    functions.push_back(gather.build());
  }
  Json m = manifestJson(modelJson(8, 4, 3, 2, 2),
                        {parameterJson("w", {4, 6}), parameterJson("b", {6})},
                        functions);
  m["version"] = 2;
  m["grid"] = {{"shape", {2, 1}}};
  m["gradient_buffer"] = {{"parameters", {1, 0}},
                          {"offsets", {0, 6}},
                          {"size", size},
                          {"grid_axes", {0}},
                          {"distributed_optimizer", distributed}};
  return m;
}

TEST(GradientBufferTest, TheLayoutIsRead) {
  Bundle bundle = Bundle::parseManifest("g.mtb", bufferManifest(true).dump());
  ASSERT_TRUE(bundle.hasGradientBuffer());
  const GradientBuffer &b = bundle.gradientBuffer();
  EXPECT_EQ(b.parameters, (std::vector<int64_t>{1, 0}));
  EXPECT_EQ(b.offsets, (std::vector<int64_t>{0, 6}));
  EXPECT_EQ(b.size, 32);
  EXPECT_EQ(b.gridAxes, (std::vector<int64_t>{0}));
  EXPECT_TRUE(b.distributedOptimizer);
  EXPECT_FALSE(Bundle::parseManifest("g.mtb", bufferManifest(false).dump())
                   .gradientBuffer()
                   .distributedOptimizer);
}

TEST(GradientBufferTest, BadLayoutsAreRejected) {
  Json m = bufferManifest(true);
  m["version"] = 1;
  expectManifestRejected(
      m, {"gradient_buffer: found a gradient_buffer in a version 1 "
          "manifest"});
  m = bufferManifest(true);
  m["gradient_buffer"]["offsets"][1] = 8;
  expectManifestRejected(
      m, {"gradient_buffer.offsets[1]: found 8, expected 6, where "
          "the previous parameter's shard ends"});
  m = bufferManifest(true);
  m["gradient_buffer"]["parameters"] = {1, 1};
  expectManifestRejected(
      m, {"gradient_buffer.parameters[1]: found parameter 1 again"});
  m = bufferManifest(true);
  m["gradient_buffer"]["parameters"] = {1};
  m["gradient_buffer"]["offsets"] = {0};
  expectManifestRejected(m, {"found no entry for parameter 0 ('w')",
                             "the distributed optimizer updates parameters"});
  m = bufferManifest(true);
  m["gradient_buffer"]["size"] = 29;
  expectManifestRejected(m, {"gradient_buffer.size: found 29, expected"});
  m = bufferManifest(true, 34);
  m["gradient_buffer"]["size"] = 33;
  expectManifestRejected(
      m, {"gradient_buffer.size: found 33, expected a multiple of "
          "the 2 ranks"});
  m = bufferManifest(true);
  m["functions"].erase(1);
  expectManifestRejected(
      m, {"functions: found no function \"gather_parameters\""});
  m = bufferManifest(false);
  m["gradient_buffer"]["size"] = 30;
  expectManifestRejected(
      m, {"functions.reduce_gradients: found [32] f32 -> [32] f32, "
          "expected [30] f32 -> [30] f32"});
  m = bufferManifest(false);
  m.erase("grid");
  m["functions"] = Json::array();
  m["gradient_buffer"]["grid_axes"] = Json::array();
  expectManifestRejected(
      m, {"gradient_buffer: found a gradient buffer in a bundle "
          "without a grid"});
  m = bufferManifest(false);
  m["gradient_buffer"]["bucket_size"] = 1;
  expectManifestRejected(
      m, {"gradient_buffer.bucket_size: found a field \"bucket_size\""});
}

/// Rank r's gradient of parameter p, element i.
float gradientOf(int rank, size_t p, int64_t i) {
  return static_cast<float>((rank + 1) * (p ? -0.5 : 0.25)) *
         static_cast<float>(i % 7 + 1);
}

struct RankResult {
  std::vector<std::vector<float>> values;
  size_t storeStateBytes = 0, optimizerStateBytes = 0;
  int64_t shardBegin = 0;
  std::vector<float> shard;
  double gradNorm = 0;
};

/// Runs one step on both ranks of `bundle` from the gradients `gradient`
/// gives (rank, parameter, element) and returns what each held.
std::vector<RankResult>
stepTwoRanks(const Bundle &bundle, const train::OptimizerConfig &config,
             float (*gradient)(int, size_t, int64_t) = gradientOf) {
  bool distributed = bundle.gradientBuffer().distributedOptimizer;
  comm::InProcessWorld world(2);
  std::vector<RankResult> results(2);
  std::mutex mutex;
  auto errors = comm::runRanks(world, [&](comm::Communicator &c) {
    comm::RankContext rank(c, bundle.gridShape());
    rank.prepare(bundle);
    host::ThreadPool pool(1);
    host::ParameterStore store(bundle, DType::F32, rank.coordinates(),
                               !distributed);
    store.initialize(pool, 7);
    for (size_t p = 0; p < store.size(); ++p)
      for (int64_t i = 0; i < store.gradient(p).numElements(); ++i)
        store.gradient(p).data<float>()[i] = gradient(c.rank(), p, i);
    train::DataParallelBuffer buffer(bundle, store, pool, rank);
    buffer.reduceGradients();
    RankResult result;
    result.shardBegin = buffer.shardSegments().front().begin;
    if (distributed) {
      const host::Tensor &shard = buffer.shard();
      result.shard.assign(shard.data<float>(),
                          shard.data<float>() + shard.numElements());
      train::DistributedOptimizer optimizer(store, buffer, pool, config, rank);
      result.gradNorm = optimizer.step(1, 0.5).gradNorm;
      result.optimizerStateBytes = optimizer.stateBytes();
    } else {
      train::Optimizer optimizer(store, pool, config, &rank);
      result.gradNorm = optimizer.step(1, 0.5).gradNorm;
    }
    result.storeStateBytes = store.optimizerStateBytes();
    for (size_t p = 0; p < store.size(); ++p)
      result.values.emplace_back(store.value(p).data<float>(),
                                 store.value(p).data<float>() +
                                     store.value(p).numElements());
    std::lock_guard<std::mutex> lock(mutex);
    results[c.rank()] = std::move(result);
  });
  for (auto &error : errors)
    if (error)
      ADD_FAILURE() << world.abortReason();
  return results;
}

TEST(GradientBufferTest, DistributedOptimizerEqualsTheReplicatedOne) {
  train::OptimizerConfig config;
  config.schedule.maxLr = 0.1;
  config.schedule.decayIters = 10;
  config.clipGrad = 1.0; // the norm below is larger: clipping is on
  Bundle replicated =
      Bundle::parseManifest("r.mtb", bufferManifest(false).dump());
  Bundle distributed =
      Bundle::parseManifest("d.mtb", bufferManifest(true).dump());
  std::vector<RankResult> r = stepTwoRanks(replicated, config);
  std::vector<RankResult> d = stepTwoRanks(distributed, config);
  ASSERT_EQ(r.size(), 2u);
  ASSERT_EQ(d.size(), 2u);

  // The reduce-scatter: rank k holds elements [16k, 16k + 16) of the summed
  // buffer (b at 0..5, w at 6..29, padding zero).
  for (int k = 0; k < 2; ++k) {
    EXPECT_EQ(d[k].shardBegin, 16 * k);
    ASSERT_EQ(d[k].shard.size(), 16u);
    for (int64_t e = 0; e < 16; ++e) {
      int64_t at = 16 * k + e;
      float expected = at < 6 ? gradientOf(0, 1, at) + gradientOf(1, 1, at)
                       : at < 30
                           ? gradientOf(0, 0, at - 6) + gradientOf(1, 0, at - 6)
                           : 0.0f;
      EXPECT_EQ(d[k].shard[e], expected) << "element " << at;
    }
  }
  // The gradient norm: sum over ranks of 0.5 * (g0 + g1), squared.
  double squares = 0;
  for (size_t p = 0; p < 2; ++p)
    for (int64_t i = 0; i < (p ? 6 : 24); ++i) {
      double g = 0.5 * (gradientOf(0, p, i) + gradientOf(1, p, i));
      squares += g * g;
    }
  for (int k = 0; k < 2; ++k) {
    EXPECT_NEAR(r[k].gradNorm, std::sqrt(squares), 1e-6 * std::sqrt(squares));
    EXPECT_NEAR(d[k].gradNorm, std::sqrt(squares), 1e-6 * std::sqrt(squares));
  }
  // Both ranks end with the same parameters, equal to the replicated
  // optimizer's (the same elementwise formulas; the norm's summation order
  // may differ in the last bit).
  for (int k = 0; k < 2; ++k)
    for (size_t p = 0; p < 2; ++p)
      for (size_t i = 0; i < r[0].values[p].size(); ++i) {
        EXPECT_EQ(d[k].values[p][i], d[0].values[p][i]);
        EXPECT_NEAR(d[k].values[p][i], r[0].values[p][i],
                    1e-6f * std::fabs(r[0].values[p][i]) + 1e-9f);
      }
  // The held AdamW state: two moments of all 30 elements per rank when
  // replicated; two of the rank's 16 buffer elements when distributed, none
  // in the store.
  EXPECT_EQ(r[0].storeStateBytes, 2 * 30 * sizeof(float));
  EXPECT_EQ(r[0].optimizerStateBytes, 0u);
  for (int k = 0; k < 2; ++k) {
    EXPECT_EQ(d[k].storeStateBytes, 0u);
    EXPECT_EQ(d[k].optimizerStateBytes, 2 * 16 * sizeof(float));
  }
}

// Grid [2, 1]; w [2, 6] and an expert bias b [8] (rate 0.05), whole on
// every rank, in a buffer of 32: w at 0..11, b at 12..19, so that the
// distributed optimizer's shards of 16 cut b in two.
Json expertBiasManifest(bool distributed) {
  Json m = bufferManifest(distributed);
  Json bias = parameterJson("b", {8}, "zeros", 0, /*weightDecay=*/false);
  bias["expert_bias_update_rate"] = 0.05;
  m["parameters"] = {parameterJson("w", {2, 6}), bias};
  m["version"] = 12;
  m["gradient_buffer"]["parameters"] = {0, 1};
  m["gradient_buffer"]["offsets"] = {0, 12};
  return m;
}

/// Rank r's gradients of expertBiasManifest's parameters: w's as
/// gradientOf, and for the bias integer tokens per expert.
float countOf(int rank, size_t p, int64_t e) {
  return p == 0 ? gradientOf(rank, 0, e)
                : static_cast<float>((rank + 1) * ((e * 3) % 5));
}

TEST(GradientBufferTest, ExpertBiasMovesBySignOfItsLoadAgainstTheMean) {
  train::OptimizerConfig config;
  config.schedule.maxLr = 0.1;
  config.schedule.decayIters = 10;
  config.clipGrad = 1.0;
  config.weightDecay = 0.1;
  for (bool distributed : {false, true}) {
    SCOPED_TRACE(distributed ? "distributed" : "replicated");
    Bundle bundle =
        Bundle::parseManifest("b.mtb", expertBiasManifest(distributed).dump());
    ASSERT_TRUE(bundle.parameters()[1].isExpertBias());
    std::vector<RankResult> r = stepTwoRanks(bundle, config, countOf);
    ASSERT_EQ(r.size(), 2u);
    // The counts summed over the ranks: 3 x (0, 3, 1, 4, 2, 0, 3, 1), mean
    // 5.25: the bias rises by the rate below the mean and falls above it.
    // Neither the gradient scale, clipping nor weight decay touch it.
    double mean = 0;
    for (int64_t e = 0; e < 8; ++e)
      mean += (countOf(0, 1, e) + countOf(1, 1, e)) / 8.0;
    EXPECT_EQ(mean, 5.25);
    for (int k = 0; k < 2; ++k)
      for (int64_t e = 0; e < 8; ++e) {
        float load = countOf(0, 1, e) + countOf(1, 1, e);
        EXPECT_EQ(r[k].values[1][e], load < mean ? 0.05f : -0.05f)
            << "rank " << k << ", expert " << e;
      }
    // The norm is w's alone: 0.5 (g0 + g1) squared and summed.
    double squares = 0;
    for (int64_t i = 0; i < 12; ++i) {
      double g = 0.5 * (gradientOf(0, 0, i) + gradientOf(1, 0, i));
      squares += g * g;
    }
    for (int k = 0; k < 2; ++k) {
      EXPECT_NEAR(r[k].gradNorm, std::sqrt(squares), 1e-6 * std::sqrt(squares));
      EXPECT_EQ(r[k].values[0], r[0].values[0]);
    }
  }
}

} // namespace
