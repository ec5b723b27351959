// Tests of gradient buckets (docs/BundleFormat.md, "Gradient buckets",
// --overlap-grad-reduce): the manifest's buckets accepted and refused, and
// on two in-process data-parallel ranks the bucketed reduction, started
// from the step's instructions, equal to the whole buffer's bit for bit.
#include "BundleTestBuilder.h"

#include "comm/RankContext.h"
#include "comm/RunRanks.h"
#include "host/ParameterStore.h"
#include "host/ThreadPool.h"
#include "train/DataParallelBuffer.h"

#include <mutex>

using namespace mtrt;
using namespace mtrt::test;

namespace {

/// An all-reduce over the data axis of `size` elements, named `name`.
Json allReduceFunction(const std::string &name, int64_t size) {
  FunctionBuilder f(name);
  int64_t in = f.input({size}, "f32");
  f.output(f.op("all_reduce", {in}, {size},
                {{"grid_axes", {0}}, {"reduction", "sum"}}));
  return f.build();
}

// Grid [2, 1]; parameters w [4, 6] and b [6]. The buffer holds b then w (30
// elements, padded to 32 with the distributed optimizer) in two buckets,
// [b] and [w + padding]; train_step (tokens, labels -> loss) accumulates b
// at instruction 1 and w at instruction 3.
Json bucketManifest(bool distributed) {
  int64_t size = distributed ? 32 : 30;
  FunctionBuilder step("train_step");
  step.input({2, 3});
  step.input({2, 3});
  int64_t gb = step.op("fill", {}, {6}, {{"value", 1.0}});
  step.inst("accumulate_gradient", {gb}, {}, {{"parameter", 1}});
  int64_t gw = step.op("fill", {}, {4, 6}, {{"value", 1.0}});
  step.inst("accumulate_gradient", {gw}, {}, {{"parameter", 0}});
  step.output(step.op("fill", {}, {}, {{"value", 0.0}}));
  Json functions = {step.build(),
                    allReduceFunction("reduce_gradients_bucket0", 6),
                    allReduceFunction("reduce_gradients_bucket1", size - 6)};
  FunctionBuilder reduce("reduce_gradients");
  int64_t in = reduce.input({size}, "f32");
  if (distributed) {
    reduce.output(reduce.op(
        "reduce_scatter", {in}, {size / 2},
        {{"grid_axes", {0}}, {"scatter_axis", 0}, {"reduction", "sum"}}));
    FunctionBuilder gather("gather_parameters");
    int64_t shard = gather.input({size / 2}, "f32");
    gather.output(gather.op("all_gather", {shard}, {size},
                            {{"grid_axes", {0}}, {"gather_axis", 0}}));
    functions.push_back(gather.build());
  } else {
    reduce.output(reduce.op("all_reduce", {in}, {size},
                            {{"grid_axes", {0}}, {"reduction", "sum"}}));
  }
  functions.push_back(reduce.build());
  Json m = manifestJson(modelJson(8, 4, 3, 2, 2),
                        {parameterJson("w", {4, 6}), parameterJson("b", {6})},
                        functions);
  m["version"] = 9;
  m["grid"] = {{"shape", {2, 1}}};
  m["gradient_buffer"] = {
      {"parameters", {1, 0}},
      {"offsets", {0, 6}},
      {"size", size},
      {"grid_axes", {0}},
      {"distributed_optimizer", distributed},
      {"buckets",
       {{{"offset", 0},
         {"size", 6},
         {"reduce_function", "reduce_gradients_bucket0"},
         {"ready_after", {{"function", "train_step"}, {"instruction", 1}}}},
        {{"offset", 6},
         {"size", size - 6},
         {"reduce_function", "reduce_gradients_bucket1"},
         {"ready_after", {{"function", "train_step"}, {"instruction", 3}}}}}}};
  return m;
}

TEST(GradientBucketTest, TheBucketsAreRead) {
  Bundle bundle = Bundle::parseManifest("g.mtb", bucketManifest(true).dump());
  const std::vector<GradientBucket> &buckets = bundle.gradientBuffer().buckets;
  ASSERT_EQ(buckets.size(), 2u);
  EXPECT_EQ(buckets[0].offset, 0);
  EXPECT_EQ(buckets[0].size, 6);
  EXPECT_EQ(buckets[0].reduceFunction, "reduce_gradients_bucket0");
  EXPECT_EQ(buckets[0].readyFunction, "train_step");
  EXPECT_EQ(buckets[0].readyAfter, 1);
  EXPECT_EQ(buckets[1].offset, 6);
  EXPECT_EQ(buckets[1].size, 26);
  EXPECT_EQ(buckets[1].readyAfter, 3);
  // Without ready_after, after the step.
  Json m = bucketManifest(false);
  m["gradient_buffer"]["buckets"][1].erase("ready_after");
  Bundle later = Bundle::parseManifest("g.mtb", m.dump());
  EXPECT_TRUE(later.gradientBuffer().buckets[1].readyFunction.empty());
}

TEST(GradientBucketTest, BadBucketsAreRefused) {
  Json m = bucketManifest(false);
  m["version"] = 8;
  expectManifestRejected(m, {"gradient_buffer.buckets: found buckets in a version 8 "
                     "manifest, expected none before format version 9"});
  m = bucketManifest(false);
  m["gradient_buffer"]["buckets"][1]["offset"] = 7;
  expectManifestRejected(m, {"gradient_buffer.buckets[1].offset: found 7"});
  m = bucketManifest(false);
  m["gradient_buffer"]["buckets"][0]["size"] = 5;
  expectManifestRejected(m, {"gradient_buffer.buckets[0].size: found 5, expected a "
                     "size that ends the bucket where a parameter's gradient "
                     "starts"});
  m = bucketManifest(false);
  m["gradient_buffer"]["buckets"][1]["size"] = 20;
  expectManifestRejected(m, {"gradient_buffer.buckets[1].size: found 20, expected 24: "
                     "the last bucket ends where the buffer does"});
  m = bucketManifest(false);
  m["gradient_buffer"]["buckets"][1]["reduce_function"] =
      "reduce_gradients_bucket0";
  expectManifestRejected(m, {"functions.reduce_gradients_bucket0: found [6] f32 -> "
                     "[6] f32, expected [24] f32 -> [24] f32"});
  m = bucketManifest(false);
  m["gradient_buffer"]["buckets"][0]["ready_after"]["function"] =
      "reduce_gradients";
  expectManifestRejected(m, {"gradient_buffer.buckets[0].ready_after.function: found "
                     "\"reduce_gradients\", expected train_step, a training "
                     "function that accumulates into this buffer"});
  m = bucketManifest(false);
  m["gradient_buffer"]["buckets"][1]["ready_after"]["instruction"] = 2;
  expectManifestRejected(m, {"gradient_buffer.buckets[1].ready_after.instruction: "
                     "found 2 of train_step",
                     "parameter 0 ('w') is accumulated at instruction 3 of "
                     "train_step"});
  m = bucketManifest(false);
  m["gradient_buffer"]["buckets"][1]["ready_after"]["instruction"] = 5;
  expectManifestRejected(m, {"gradient_buffer.buckets[1].ready_after.instruction: "
                     "found 5"});
  m = bucketManifest(false);
  m["gradient_buffer"]["buckets"][0]["stream"] = 1;
  expectManifestRejected(
      m, {"gradient_buffer.buckets[0].stream: found a field \"stream\""});
  m = bucketManifest(false);
  m["gradient_buffer"]["buckets"] = Json::array();
  expectManifestRejected(m, {"gradient_buffer.buckets: found [], expected at least "
                     "one bucket"});
}

/// Rank r's gradient of parameter p, element i.
float gradientOf(int rank, size_t p, int64_t i) {
  return static_cast<float>((rank + 1) * (p ? -0.3 : 0.7)) *
         static_cast<float>(i % 5 + 1) / 3.0f;
}

/// On both ranks of `bundle`: the gradients set, bucket 0 started after
/// train_step's instruction 1 (the rest by reduceGradients), and what the
/// rank then holds: the store's gradients, or the distributed optimizer's
/// shard; and the buffer's log line.
std::vector<std::pair<std::vector<float>, std::string>>
reduceOnTwoRanks(const Bundle &bundle) {
  bool distributed = bundle.gradientBuffer().distributedOptimizer;
  comm::InProcessWorld world(2);
  std::vector<std::pair<std::vector<float>, std::string>> results(2);
  std::mutex mutex;
  auto errors = comm::runRanks(world, [&](comm::Communicator &c) {
    comm::RankContext rank(c, bundle.gridShape());
    rank.prepare(bundle);
    host::ThreadPool pool(1);
    host::ParameterStore store(bundle, DType::F32, rank.coordinates(),
                               !distributed);
    for (size_t p = 0; p < store.size(); ++p)
      for (int64_t i = 0; i < store.gradient(p).numElements(); ++i)
        store.gradient(p).data<float>()[i] = gradientOf(c.rank(), p, i);
    train::DataParallelBuffer buffer(bundle, store, pool, rank);
    for (size_t position = 0; position < 2; ++position)
      buffer.afterInstruction("train_step", position);
    buffer.reduceGradients();
    std::vector<float> held;
    if (distributed) {
      const host::Tensor &shard = buffer.shard();
      held.assign(shard.data<float>(),
                  shard.data<float>() + shard.numElements());
    } else {
      for (size_t p = 0; p < store.size(); ++p)
        held.insert(held.end(), store.gradient(p).data<float>(),
                    store.gradient(p).data<float>() +
                        store.gradient(p).numElements());
    }
    std::string line = buffer.bucketed() ? buffer.describeBuckets() : "";
    std::lock_guard<std::mutex> lock(mutex);
    results[c.rank()] = {std::move(held), std::move(line)};
  });
  for (auto &error : errors)
    if (error)
      ADD_FAILURE() << world.abortReason();
  return results;
}

TEST(GradientBucketTest, BucketsReduceAsTheWholeBuffer) {
  for (bool distributed : {false, true}) {
    Json m = bucketManifest(distributed);
    Bundle bucketed = Bundle::parseManifest("b.mtb", m.dump());
    m["gradient_buffer"].erase("buckets");
    Bundle whole = Bundle::parseManifest("w.mtb", m.dump());
    auto b = reduceOnTwoRanks(bucketed);
    auto w = reduceOnTwoRanks(whole);
    for (int k = 0; k < 2; ++k) {
      ASSERT_EQ(b[k].first.size(), w[k].first.size());
      for (size_t e = 0; e < b[k].first.size(); ++e)
        EXPECT_EQ(b[k].first[e], w[k].first[e])
            << (distributed ? "distributed, " : "") << "rank " << k
            << ", element " << e;
      EXPECT_EQ(b[k].second,
                "gradient buckets (--overlap-grad-reduce): 2 over " +
                    std::to_string(distributed ? 32 : 30) +
                    " elements; the last iteration reduced 1 during the "
                    "last micro-batch's backward pass and 1 after it");
    }
  }
}

// The distributed optimizer's per-bucket shards (--overlap-grad-reduce with
// --use-distributed-optimizer) and --overlap-param-gather: b [6] in bucket 0
// padded to 8, w [4, 6] in bucket 1 at 8; each bucket reduce-scattered and
// gathered by functions of its own. train_step reads b at instruction 1
// (after its get_parameter at 0) and w at instruction 3.
Json shardedManifest() {
  FunctionBuilder step("train_step");
  step.input({2, 3});
  step.input({2, 3});
  int64_t b = step.op("get_parameter", {}, {6}, {{"parameter", 1}});
  int64_t b2 = step.op("add", {b, b}, {6});
  int64_t w = step.op("get_parameter", {}, {4, 6}, {{"parameter", 0}});
  int64_t w2 = step.op("add", {w, w}, {4, 6});
  step.inst("accumulate_gradient", {b2}, {}, {{"parameter", 1}});
  step.inst("accumulate_gradient", {w2}, {}, {{"parameter", 0}});
  step.output(step.op("fill", {}, {}, {{"value", 0.0}}));
  auto scatter = [](const std::string &name, int64_t size) {
    FunctionBuilder f(name);
    int64_t in = f.input({size}, "f32");
    f.output(
        f.op("reduce_scatter", {in}, {size / 2},
             {{"grid_axes", {0}}, {"scatter_axis", 0}, {"reduction", "sum"}}));
    return f.build();
  };
  auto gather = [](const std::string &name, int64_t size) {
    FunctionBuilder f(name);
    int64_t in = f.input({size / 2}, "f32");
    f.output(f.op("all_gather", {in}, {size},
                  {{"grid_axes", {0}}, {"gather_axis", 0}}));
    return f.build();
  };
  Json functions = {step.build(),
                    scatter("reduce_gradients_bucket0", 8),
                    gather("gather_parameters_bucket0", 8),
                    scatter("reduce_gradients_bucket1", 24),
                    gather("gather_parameters_bucket1", 24),
                    scatter("reduce_gradients", 32),
                    gather("gather_parameters", 32)};
  Json m = manifestJson(modelJson(8, 4, 3, 2, 2),
                        {parameterJson("w", {4, 6}), parameterJson("b", {6})},
                        functions);
  m["version"] = 10;
  m["grid"] = {{"shape", {2, 1}}};
  m["gradient_buffer"] = {
      {"parameters", {1, 0}},
      {"offsets", {0, 8}},
      {"size", 32},
      {"grid_axes", {0}},
      {"distributed_optimizer", true},
      {"overlap_param_gather", true},
      {"buckets",
       {{{"offset", 0},
         {"size", 8},
         {"reduce_function", "reduce_gradients_bucket0"},
         {"gather_function", "gather_parameters_bucket0"},
         {"gather_before", {{"function", "train_step"}, {"instruction", 1}}}},
        {{"offset", 8},
         {"size", 24},
         {"reduce_function", "reduce_gradients_bucket1"},
         {"gather_function", "gather_parameters_bucket1"},
         {"gather_before",
          {{"function", "train_step"}, {"instruction", 3}}}}}}};
  return m;
}

TEST(GradientBucketTest, PerBucketShardsAreRead) {
  Bundle bundle = Bundle::parseManifest("s.mtb", shardedManifest().dump());
  const GradientBuffer &buffer = bundle.gradientBuffer();
  EXPECT_TRUE(buffer.bucketShards());
  EXPECT_TRUE(buffer.overlapParamGather);
  EXPECT_EQ(buffer.buckets[1].gatherFunction, "gather_parameters_bucket1");
  EXPECT_EQ(buffer.buckets[1].gatherBeforeFunction, "train_step");
  EXPECT_EQ(buffer.buckets[1].gatherBefore, 3);
  // Rank 1 holds elements 4..8 of bucket 0 and 20..32 of bucket 1: b's
  // last 2 elements (then padding) and w's last 12.
  train::BufferShard shard = train::bufferShard(bundle, {1, 0});
  ASSERT_EQ(shard.size, 16);
  ASSERT_EQ(shard.segments.size(), 2u);
  EXPECT_EQ(shard.segments[0].begin, 4);
  EXPECT_EQ(shard.segments[1].begin, 20);
  EXPECT_EQ(shard.segments[1].shardOffset, 4);
  ASSERT_EQ(shard.pieces.size(), 2u);
  EXPECT_EQ(shard.pieces[0].parameter, 1u);
  EXPECT_EQ(shard.pieces[0].parameterOffset, 4);
  EXPECT_EQ(shard.pieces[0].count, 2);
  EXPECT_EQ(shard.pieces[1].parameter, 0u);
  EXPECT_EQ(shard.pieces[1].shardOffset, 4);
  EXPECT_EQ(shard.pieces[1].parameterOffset, 12);
  EXPECT_EQ(shard.pieces[1].count, 12);
}

// A pipeline stage's forward function gathers the buckets it reads before
// its first micro-batch: train_step here reads b (bucket 0) and w (1).
TEST(GradientBucketTest, BucketsReadByAFunction) {
  Bundle bundle = Bundle::parseManifest("s.mtb", shardedManifest().dump());
  EXPECT_EQ(train::bucketsReadBy(bundle.gradientBuffer(),
                                 *bundle.findFunction("train_step")),
            (std::vector<size_t>{0, 1}));
  EXPECT_TRUE(train::bucketsReadBy(bundle.gradientBuffer(),
                                   *bundle.findFunction("reduce_gradients"))
                  .empty());
}

TEST(GradientBucketTest, BadPerBucketShardsAreRefused) {
  Json m = shardedManifest();
  m["gradient_buffer"]["buckets"][1]["gather_before"]["instruction"] = 4;
  expectManifestRejected(
      m, {"gradient_buffer.buckets[1].gather_before.instruction: found 4, "
          "expected at most 3: instruction 3 of train_step reads a parameter "
          "of the bucket"});
  m = shardedManifest();
  m["gradient_buffer"]["buckets"][1]["gather_before"]["function"] =
      "reduce_gradients";
  expectManifestRejected(
      m, {"gradient_buffer.buckets[1].gather_before.function: found "
          "\"reduce_gradients\", expected train_step"});
  m = shardedManifest();
  m["gradient_buffer"]["buckets"][1].erase("gather_function");
  expectManifestRejected(
      m, {"gradient_buffer.buckets[1].gather_function: found none, expected "
          "a gather_function on every bucket or on none"});
  m = shardedManifest();
  m["gradient_buffer"]["buckets"][0]["gather_function"] =
      "gather_parameters_bucket1";
  expectManifestRejected(m, {"functions.gather_parameters_bucket1: found "
                             "[12] f32 -> [24] f32, expected [4] f32 -> [8] "
                             "f32"});
  m = shardedManifest();
  m["gradient_buffer"]["offsets"] = {0, 7};
  m["gradient_buffer"]["buckets"][0]["size"] = 7;
  m["gradient_buffer"]["buckets"][1]["offset"] = 7;
  m["gradient_buffer"]["buckets"][1]["size"] = 25;
  expectManifestRejected(m, {"a multiple of the 2 ranks"});
  m = shardedManifest();
  m["gradient_buffer"]["overlap_param_gather"] = false;
  expectManifestRejected(m, {"found a bucket with gather_before, expected "
                             "none without overlap_param_gather"});
  m = shardedManifest();
  m["gradient_buffer"]["offsets"] = {2, 8};
  expectManifestRejected(m, {"gradient_buffer.offsets: found padding before "
                             "offset 2, expected padding only at the end of "
                             "a bucket"});
}

/// Rank r's value of parameter p, element i, after its optimizer step.
float valueOf(int rank, size_t p, int64_t i) {
  return static_cast<float>(rank * 10 + static_cast<int>(p)) +
         static_cast<float>(i) / 8.0f;
}

// On two ranks: the buckets' reduce-scatters give each rank the whole
// reduction's sums of its shard; the gathers deferred by gatherParameters
// run before the instructions that read their parameters first (none
// before) and write every rank's part of each parameter.
TEST(GradientBucketTest, PerBucketShardsReduceAndGather) {
  Bundle bundle = Bundle::parseManifest("s.mtb", shardedManifest().dump());
  comm::InProcessWorld world(2);
  std::mutex mutex;
  std::vector<std::vector<float>> shards(2), values(2);
  auto errors = comm::runRanks(world, [&](comm::Communicator &c) {
    comm::RankContext rank(c, bundle.gridShape());
    rank.prepare(bundle);
    host::ThreadPool pool(1);
    host::ParameterStore store(bundle, DType::F32, rank.coordinates(), false);
    for (size_t p = 0; p < store.size(); ++p)
      for (int64_t i = 0; i < store.gradient(p).numElements(); ++i)
        store.gradient(p).data<float>()[i] = gradientOf(c.rank(), p, i);
    train::DataParallelBuffer buffer(bundle, store, pool, rank);
    for (size_t position = 0; position < 5; ++position)
      buffer.afterInstruction("train_step", position);
    buffer.reduceGradients();
    const host::Tensor &shard = buffer.shard();
    // Each rank's own part of the values is updated; the rest is stale
    // until the gathers.
    for (size_t p = 0; p < store.size(); ++p)
      for (int64_t i = 0; i < store.value(p).numElements(); ++i)
        store.value(p).data<float>()[i] = valueOf(c.rank(), p, i);
    buffer.gatherParameters(/*deferred=*/true);
    EXPECT_TRUE(buffer.parameterGatherPending());
    buffer.beforeInstruction("train_step", 1); // bucket 0: b
    bool wPending = buffer.parameterGatherPending();
    buffer.beforeInstruction("train_step", 3); // bucket 1: w
    EXPECT_TRUE(wPending);
    EXPECT_FALSE(buffer.parameterGatherPending());
    std::lock_guard<std::mutex> lock(mutex);
    shards[c.rank()].assign(shard.data<float>(),
                            shard.data<float>() + shard.numElements());
    for (size_t p = 0; p < store.size(); ++p)
      values[c.rank()].insert(
          values[c.rank()].end(), store.value(p).data<float>(),
          store.value(p).data<float>() + store.value(p).numElements());
  });
  for (auto &error : errors)
    if (error)
      ADD_FAILURE() << world.abortReason();
  // Rank 1's shard: b[4..6), 2 of padding, w[12..24).
  std::vector<float> expected;
  for (int64_t i = 4; i < 6; ++i)
    expected.push_back(gradientOf(0, 1, i) + gradientOf(1, 1, i));
  expected.insert(expected.end(), {0.0f, 0.0f});
  for (int64_t i = 12; i < 24; ++i)
    expected.push_back(gradientOf(0, 0, i) + gradientOf(1, 0, i));
  EXPECT_EQ(shards[1], expected);
  // Both ranks hold w (index 0) from rank 0's first half and rank 1's
  // second, and b (index 1) likewise.
  for (int k = 0; k < 2; ++k) {
    for (int64_t i = 0; i < 24; ++i)
      EXPECT_EQ(values[k][i], valueOf(i < 12 ? 0 : 1, 0, i)) << "w " << i;
    for (int64_t i = 0; i < 6; ++i)
      EXPECT_EQ(values[k][24 + i], valueOf(i < 4 ? 0 : 1, 1, i)) << "b " << i;
  }
}

} // namespace
