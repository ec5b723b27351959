// Equivalence of training on several in-process ranks with one rank: a
// hand-built one-layer MLP language model in Megatron-LM's tensor-parallel
// layout (column-parallel first projection, row-parallel second) and with
// data parallelism, 10 steps, losses and gathered final parameters within
// 1e-5 of the one-rank run's.
#include "BundleTestBuilder.h"

#include "comm/RankContext.h"
#include "comm/RunRanks.h"
#include "host/ParameterStore.h"
#include "host/ThreadPool.h"
#include "train/Trainer.h"

#include <cmath>
#include <mutex>
#include <sstream>

using namespace mtrt;
using namespace mtrt::test;

namespace {

constexpr int64_t V = 256, H = 8, F = 16, B = 4, S = 6;

/// train_step of logits = (gelu(e W1 + b1) W2 + b2) Wout, e = table[tokens],
/// for a grid [dp, tp] (dp = tp = 1: the one-rank bundle, without a grid or
/// collectives). W1 and b1 are split over the tensor axis by columns, W2 by
/// rows; the partial sums of the row-parallel product and of the input
/// gradient are all-reduced over it. Data ranks take B / dp rows; their mean
/// losses are averaged and the weight gradients summed over the data axis.
Json mlpManifest(int64_t dp, int64_t tp) {
  int64_t Fl = F / tp, Bl = B / dp;
  bool grid = dp * tp > 1;
  FunctionBuilder f("train_step");
  auto allReduce = [&](int64_t x, std::vector<int64_t> shape, int axis) {
    return f.op("all_reduce", {x}, std::move(shape),
                {{"grid_axes", {axis}}, {"reduction", "sum"}});
  };
  int64_t tokens = f.input({Bl, S});
  int64_t labels = f.input({Bl, S});
  int64_t table = f.op("get_parameter", {}, {V, H}, {{"parameter", 0}});
  int64_t w1 = f.op("get_parameter", {}, {H, Fl}, {{"parameter", 1}});
  int64_t b1 = f.op("get_parameter", {}, {Fl}, {{"parameter", 2}});
  int64_t w2 = f.op("get_parameter", {}, {Fl, H}, {{"parameter", 3}});
  int64_t b2 = f.op("get_parameter", {}, {H}, {{"parameter", 4}});
  int64_t wout = f.op("get_parameter", {}, {H, V}, {{"parameter", 5}});
  int64_t e = f.op("embedding", {table, tokens}, {Bl, S, H});
  int64_t h1 = f.op("linear", {e, w1, b1}, {Bl, S, Fl});
  Json tanh = {{"approximate", "tanh"}};
  int64_t a = f.op("gelu", {h1}, {Bl, S, Fl}, tanh);
  int64_t z = f.op("linear", {a, w2}, {Bl, S, H});
  if (tp > 1)
    z = allReduce(z, {Bl, S, H}, 1);
  int64_t h2 = f.op("bias_add", {z, b2}, {Bl, S, H});
  int64_t logits = f.op("linear", {h2, wout}, {Bl, S, V});
  Json ce = {{"reduction", "mean"}};
  int64_t loss = f.op("cross_entropy", {logits, labels}, {}, ce);
  if (dp > 1) {
    int64_t sum = allReduce(loss, {}, 0);
    int64_t inverse = f.op("fill", {}, {}, {{"value", 1.0 / double(dp)}});
    loss = f.op("mul", {sum, inverse}, {});
  }
  f.output(loss);
  int64_t dloss = f.op("fill", {}, {},
                       {{"value", 1.0 / double(dp)}, {"loss_seed", true}});
  int64_t dlogits =
      f.op("cross_entropy_grad", {dloss, logits, labels}, {Bl, S, V}, ce);
  int64_t dwout = f.op("linear_weight_grad", {h2, dlogits}, {H, V});
  int64_t dh2 =
      f.op("linear", {dlogits, wout}, {Bl, S, H}, {{"transpose_weight", true}});
  int64_t db2 = f.op("bias_grad", {dh2}, {H});
  int64_t dw2 = f.op("linear_weight_grad", {a, dh2}, {Fl, H});
  int64_t da =
      f.op("linear", {dh2, w2}, {Bl, S, Fl}, {{"transpose_weight", true}});
  int64_t dh1 = f.op("gelu_grad", {da, h1}, {Bl, S, Fl}, tanh);
  int64_t db1 = f.op("bias_grad", {dh1}, {Fl});
  int64_t dw1 = f.op("linear_weight_grad", {e, dh1}, {H, Fl});
  int64_t de =
      f.op("linear", {dh1, w1}, {Bl, S, H}, {{"transpose_weight", true}});
  if (tp > 1)
    de = allReduce(de, {Bl, S, H}, 1);
  int64_t dtable = f.op("embedding_grad", {de, tokens}, {V, H});
  std::vector<std::pair<int64_t, std::vector<int64_t>>> grads = {
      {dtable, {V, H}}, {dw1, {H, Fl}}, {db1, {Fl}},
      {dw2, {Fl, H}},   {db2, {H}},     {dwout, {H, V}}};
  for (size_t p = 0; p < grads.size(); ++p) {
    int64_t g = grads[p].first;
    if (dp > 1)
      g = allReduce(g, grads[p].second, 0);
    f.inst("accumulate_gradient", {g}, {}, {{"parameter", p}});
  }

  Json w1p = parameterJson("w1", {H, F}),
       b1p = parameterJson("b1", {F}, "zeros", 0, false),
       w2p = parameterJson("w2", {F, H});
  if (grid) {
    w1p["split_axes"] = {Json::array(), {1}};
    b1p["split_axes"] = {{1}};
    w2p["split_axes"] = {{1}, Json::array()};
  }
  Json model = modelJson(V, H, S, Bl, B);
  model["tensor_model_parallel_size"] = tp;
  model["data_parallel_size"] = dp;
  Json m = manifestJson(model,
                        {parameterJson("table", {V, H}), w1p, b1p, w2p,
                         parameterJson("b2", {H}, "zeros", 0, false),
                         parameterJson("wout", {H, V})},
                        {f.build()});
  if (grid)
    m["grid"] = {{"shape", {dp, tp}}};
  return m;
}

std::string corpus() {
  std::string text;
  for (int i = 0; i < 60; ++i)
    text += "The quick brown fox " + std::to_string(i * 7919 % 101) +
            " jumps over the lazy dog. ";
  return text;
}

train::TrainerOptions options() {
  train::TrainerOptions o;
  o.trainIters = 10;
  o.lr = 1e-2;
  o.lrWarmupIters = 2;
  o.evalInterval = 0;
  o.progressBar = false;
  o.threads = 1;
  o.clipGrad = 0.5; // small enough to clip: the global norm matters
  return o;
}

struct Run {
  std::vector<double> losses;
  std::vector<double> gradNorms;
  /// fp16: per rank, each iteration's loss scale, negated when skipped.
  std::vector<std::vector<double>> scales;
  /// Per parameter, the global tensor.
  std::vector<std::vector<float>> parameters;
};

Run runOneRank(const train::TrainerOptions &o = options()) {
  Bundle bundle = Bundle::parseManifest("one.mtb", mlpManifest(1, 1).dump());
  train::Trainer trainer(bundle, corpus(), "corpus", o);
  std::ostringstream log;
  trainer.train(log);
  Run run;
  for (const auto &record : trainer.history()) {
    run.losses.push_back(record.loss);
    run.gradNorms.push_back(record.gradNorm);
  }
  for (size_t p = 0; p < trainer.parameters().size(); ++p) {
    const host::Tensor &value = trainer.parameters().value(p);
    run.parameters.emplace_back(value.data<float>(),
                                value.data<float>() + value.numElements());
  }
  return run;
}

/// Trains on dp x tp in-process ranks; rank 0's losses, and every
/// parameter gathered from the shards (each element written by every rank
/// that holds it; replicas must agree).
Run runRanks(int64_t dp, int64_t tp,
             const train::TrainerOptions &o = options()) {
  Bundle bundle =
      Bundle::parseManifest("ranks.mtb", mlpManifest(dp, tp).dump());
  Run run;
  run.scales.resize(static_cast<size_t>(dp * tp));
  for (const Parameter &p : bundle.parameters())
    run.parameters.emplace_back(static_cast<size_t>(p.type.numElements), NAN);
  std::mutex mutex;
  comm::InProcessWorld world(static_cast<int>(dp * tp));
  auto errors = comm::runRanks(world, [&](comm::Communicator &c) {
    comm::RankContext rank(c, bundle.gridShape());
    train::Trainer trainer(bundle, corpus(), "corpus", o, &rank);
    std::ostringstream log;
    trainer.train(log);
    std::lock_guard<std::mutex> lock(mutex);
    for (const auto &record : trainer.history())
      run.scales[c.rank()].push_back(record.skipped ? -record.lossScale
                                                    : record.lossScale);
    if (c.rank() == 0)
      for (const auto &record : trainer.history()) {
        run.losses.push_back(record.loss);
        run.gradNorms.push_back(record.gradNorm);
      }
    host::ParameterStore &store = trainer.parameters();
    for (size_t p = 0; p < store.size(); ++p) {
      const Parameter &info = store.info(p);
      std::vector<int64_t> offsets = store.shardOffsets(p);
      const float *shard = store.value(p).data<float>();
      for (int64_t i = 0; i < info.localType.numElements; ++i) {
        int64_t index = shardElementIndex(info, offsets, i);
        float &slot = run.parameters[p][static_cast<size_t>(index)];
        EXPECT_TRUE(std::isnan(slot) || slot == shard[i])
            << info.name << " replicas disagree at " << index;
        slot = shard[i];
      }
    }
  });
  for (auto &error : errors)
    EXPECT_FALSE(error) << world.abortReason();
  return run;
}

void expectEquivalent(const Run &one, const Run &ranks) {
  ASSERT_EQ(ranks.losses.size(), one.losses.size());
  for (size_t i = 0; i < one.losses.size(); ++i) {
    EXPECT_NEAR(ranks.losses[i], one.losses[i], 1e-5 * one.losses[i])
        << "iteration " << i + 1;
    EXPECT_NEAR(ranks.gradNorms[i], one.gradNorms[i], 1e-5 * one.gradNorms[i])
        << "iteration " << i + 1;
  }
  EXPECT_LT(one.losses.back(), one.losses.front()); // it did train
  for (size_t p = 0; p < one.parameters.size(); ++p) {
    double scale = 0;
    for (float x : one.parameters[p])
      scale = std::max(scale, std::fabs(double(x)));
    for (size_t i = 0; i < one.parameters[p].size(); ++i)
      ASSERT_NEAR(ranks.parameters[p][i], one.parameters[p][i], 1e-5 * scale)
          << "parameter " << p << " element " << i;
  }
}

TEST(MultiRankTest, TensorParallelTwoEqualsOneRank) {
  expectEquivalent(runOneRank(), runRanks(1, 2));
}

TEST(MultiRankTest, DataParallelTwoEqualsOneRank) {
  expectEquivalent(runOneRank(), runRanks(2, 1));
}

TEST(MultiRankTest, DataAndTensorParallelTwoByTwoEqualsOneRank) {
  expectEquivalent(runOneRank(), runRanks(2, 2));
}

// fp16 loss scaling: a scale of 2^130 (inf in float) overflows the
// gradients until it has backed off far enough (the first overflow is held
// by the hysteresis). On a 2 x 2 grid every rank skips the same iterations
// and holds the same scale; this bundle's seed is 1/dp, so the grid's first
// clean seed is 2^128 / 2. Tensor parallelism alone (seed 1) skips as one
// rank does, down to a scale of 2^127, and then equals the one-rank run.
TEST(MultiRankTest, Fp16SkipsTogetherAndEqualsOneRank) {
  train::TrainerOptions o = options();
  o.trainIters = 14;
  o.lossScaling = train::LossScalerOptions{};
  o.lossScaling->initialScale = std::ldexp(1.0, 130);
  // Each iteration's scale after its update, negated when it was skipped.
  auto scales = [](std::vector<int> skipped, int clean) {
    std::vector<double> out;
    for (int e : skipped)
      out.push_back(-std::ldexp(1.0, e));
    out.resize(14, std::ldexp(1.0, clean));
    return out;
  };
  for (const std::vector<double> &rank : runRanks(2, 2, o).scales)
    EXPECT_EQ(rank, scales({130, 129, 128}, 128));

  ::Run one = runOneRank(o);
  ::Run ranks = runRanks(1, 2, o);
  EXPECT_EQ(one.scales.size(), 0u);
  for (const std::vector<double> &rank : ranks.scales)
    EXPECT_EQ(rank, scales({130, 129, 128, 127}, 127));
  // The skipped iterations' grad norms are NaN; compare the rest.
  for (::Run *run : {&one, &ranks}) {
    run->gradNorms.erase(run->gradNorms.begin(), run->gradNorms.begin() + 4);
    run->losses.erase(run->losses.begin(), run->losses.begin() + 4);
  }
  expectEquivalent(one, ranks);
}

/// The initial parameters of every rank of a [dp, tp] grid, gathered from
/// the shards, equal the one-rank store's: every 2-D split (w1 by columns, w2
/// by rows) and every split width.
void expectInitialShardsEqualOneRank(int64_t dp, int64_t tp) {
  host::ThreadPool pool(1);
  Bundle one = Bundle::parseManifest("one.mtb", mlpManifest(1, 1).dump());
  host::ParameterStore whole(one);
  whole.initialize(pool, 1234);
  Bundle ranks = Bundle::parseManifest("ranks.mtb", mlpManifest(dp, tp).dump());
  for (int64_t rank = 0; rank < dp * tp; ++rank) {
    std::vector<int64_t> coordinates =
        gridCoordinates(ranks.gridShape(), rank);
    host::ParameterStore store(ranks, DType::F32, coordinates);
    store.initialize(pool, 1234);
    for (size_t p = 0; p < store.size(); ++p) {
      const Parameter &info = store.info(p);
      std::vector<int64_t> offsets = store.shardOffsets(p);
      ASSERT_EQ(store.value(p).numElements(), info.localType.numElements);
      const float *shard = store.value(p).data<float>();
      const float *global = whole.value(p).data<float>();
      for (int64_t i = 0; i < info.localType.numElements; ++i) {
        int64_t index = shardElementIndex(info, offsets, i);
        ASSERT_EQ(shard[i], global[index])
            << info.name << " on rank " << rank << " (coordinates "
            << shapeString(coordinates) << "), local element " << i;
      }
    }
  }
}

TEST(MultiRankTest, InitialShardsEqualOneRankTwoWays) {
  expectInitialShardsEqualOneRank(1, 2);
}

TEST(MultiRankTest, InitialShardsEqualOneRankFourWays) {
  expectInitialShardsEqualOneRank(1, 4);
}

TEST(MultiRankTest, InitialShardsEqualOneRankTwoByFour) {
  expectInitialShardsEqualOneRank(2, 4);
}

TEST(MultiRankTest, TensorParallelFourEqualsOneRank) {
  expectEquivalent(runOneRank(), runRanks(1, 4));
}

TEST(MultiRankTest, SeveralRanksNeedARankContext) {
  Bundle bundle = Bundle::parseManifest("ranks.mtb", mlpManifest(1, 2).dump());
  expectError(
      [&] { train::Trainer(bundle, corpus(), "corpus", options()); },
      MTRT_STATUS_UNIMPLEMENTED,
      {"bundle 'ranks.mtb' is compiled for 2 ranks (grid [1, 2]); run them "
       "with megatron-train --in-process-ranks"});
}

} // namespace
