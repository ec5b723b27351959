// Tests of the host executor on bundles for several ranks: the collectives
// against values computed here from every rank's input, and parameter shards.
#include "BundleTestBuilder.h"

#include "comm/RankContext.h"
#include "comm/RunRanks.h"
#include "host/Executor.h"
#include "host/ParameterStore.h"
#include "host/ThreadPool.h"
#include "host/kernels/Kernels.h"

#include <cmath>
#include <mutex>
#include <optional>

using namespace mtrt;
using namespace mtrt::test;

namespace {

// Grid [2, 2]; each rank's x [2, 3]. Outputs:
//   0 all_reduce(x) over [1], sum
//   1 all_gather(x) over [0, 1] on axis 1 -> [2, 12]
//   2 reduce_scatter(that) over [1] on axis 1, sum -> [2, 6]
//   3 all_slice(that) over [1, 0] on axis 1 -> [2, 3]
//   4 all_reduce(x) over [0], max
Json collectivesManifest() {
  FunctionBuilder f("f");
  int64_t x = f.input({2, 3}, "f32");
  f.output(f.op("all_reduce", {x}, {2, 3},
                {{"grid_axes", {1}}, {"reduction", "sum"}}));
  int64_t g = f.op("all_gather", {x}, {2, 12},
                   {{"grid_axes", {0, 1}}, {"gather_axis", 1}});
  f.output(g);
  f.output(
      f.op("reduce_scatter", {g}, {2, 6},
           {{"grid_axes", {1}}, {"scatter_axis", 1}, {"reduction", "sum"}}));
  f.output(f.op("all_slice", {g}, {2, 3},
                {{"grid_axes", {1, 0}}, {"slice_axis", -1}}));
  f.output(f.op("all_reduce", {x}, {2, 3},
                {{"grid_axes", {0}}, {"reduction", "max"}}));
  Json m = manifestJson(modelJson(8, 4, 3, 2, 2), Json::array(), {f.build()});
  m["grid"] = {{"shape", {2, 2}}};
  return m;
}

float input(int64_t rank, int64_t i, int64_t j) {
  return static_cast<float>(100 * rank + 10 * i + j) * (rank == 2 ? -1 : 1);
}

TEST(MultiRankExecutorTest, CollectivesMatchTheirDefinitions) {
  Bundle bundle = Bundle::parseManifest("c.mtb", collectivesManifest().dump());
  comm::InProcessWorld world(4);
  std::mutex mutex;
  std::vector<std::vector<host::Tensor>> outputs(4);
  auto errors = comm::runRanks(world, [&](comm::Communicator &c) {
    comm::RankContext rank(c, bundle.gridShape());
    rank.prepare(bundle);
    host::ThreadPool pool(1);
    host::ParameterStore store(bundle, DType::F32, rank.coordinates());
    host::Executor executor(bundle, "f", store, pool, &rank);
    std::vector<float> x(6);
    for (int64_t i = 0; i < 2; ++i)
      for (int64_t j = 0; j < 3; ++j)
        x[i * 3 + j] = input(c.rank(), i, j);
    auto result = executor.run({{DType::F32, {2, 3}, x.data()}}, {});
    std::lock_guard<std::mutex> lock(mutex);
    outputs[c.rank()] = std::move(result);
  });
  for (auto &error : errors)
    ASSERT_FALSE(error) << world.abortReason();
  for (int64_t r = 0; r < 4; ++r) {
    int64_t d = r / 2, t = r % 2;
    const auto &out = outputs[r];
    for (int64_t i = 0; i < 2; ++i)
      for (int64_t j = 0; j < 3; ++j) {
        EXPECT_EQ(out[0].data<float>()[i * 3 + j],
                  input(d * 2, i, j) + input(d * 2 + 1, i, j));
        EXPECT_EQ(out[4].data<float>()[i * 3 + j],
                  std::max(input(t, i, j), input(2 + t, i, j)));
        // all_slice over [1, 0]: the block of index t * 2 + d, which the
        // gather took from rank t * 2 + d.
        EXPECT_EQ(out[3].data<float>()[i * 3 + j], input(t * 2 + d, i, j));
      }
    for (int64_t i = 0; i < 2; ++i)
      for (int64_t k = 0; k < 12; ++k) {
        float gathered = input(k / 3, i, k % 3);
        EXPECT_EQ(out[1].data<float>()[i * 12 + k], gathered);
        if (k / 6 == t) {
          EXPECT_EQ(out[2].data<float>()[i * 6 + k % 6], 2 * gathered);
        }
      }
  }
}

TEST(MultiRankExecutorTest, ACollectiveNeedsARankContext) {
  Bundle bundle = Bundle::parseManifest("c.mtb", collectivesManifest().dump());
  host::ThreadPool pool(1);
  host::ParameterStore store(bundle);
  expectError([&] { host::Executor(bundle, "f", store, pool); },
              MTRT_STATUS_FAILED_PRECONDITION,
              {"instructions[0]", "all_reduce runs over 2 ranks",
               "no rank context", "--in-process-ranks"});
}

// The ring's exchange over grid [2, 3]: each rank's x [2, 3] passed along
// axis 1 (three ranks) by offset 1 within the group [0, 1] (six ranks, so
// the peers are 1 apart in the group's order), by -1 within the group [1],
// and by 3 (once around: the rank's own). Rank (a, b) receives from
// (a, (b - offset) mod 3).
Json shiftManifest() {
  FunctionBuilder f("f");
  int64_t x = f.input({2, 3}, "f32");
  f.output(f.op("shift", {x}, {2, 3},
                {{"grid_axes", {0, 1}}, {"shift_axis", 1}, {"offset", 1}}));
  f.output(f.op("shift", {x}, {2, 3},
                {{"grid_axes", {1}}, {"shift_axis", 1}, {"offset", -1}}));
  f.output(f.op("shift", {x}, {2, 3},
                {{"grid_axes", {1}}, {"shift_axis", 1}, {"offset", 3}}));
  Json m = manifestJson(modelJson(8, 4, 3, 2, 2), Json::array(), {f.build()});
  m["grid"] = {{"shape", {2, 3}}};
  return m;
}

TEST(MultiRankExecutorTest, ShiftRotatesAlongItsAxis) {
  Bundle bundle = Bundle::parseManifest("s.mtb", shiftManifest().dump());
  comm::InProcessWorld world(6);
  std::mutex mutex;
  std::vector<std::vector<host::Tensor>> outputs(6);
  auto errors = comm::runRanks(world, [&](comm::Communicator &c) {
    comm::RankContext rank(c, bundle.gridShape());
    rank.prepare(bundle);
    host::ThreadPool pool(1);
    host::ParameterStore store(bundle, DType::F32, rank.coordinates());
    host::Executor executor(bundle, "f", store, pool, &rank);
    std::vector<float> x(6);
    for (int64_t i = 0; i < 2; ++i)
      for (int64_t j = 0; j < 3; ++j)
        x[i * 3 + j] = input(c.rank(), i, j);
    auto result = executor.run({{DType::F32, {2, 3}, x.data()}}, {});
    std::lock_guard<std::mutex> lock(mutex);
    outputs[c.rank()] = std::move(result);
  });
  for (auto &error : errors)
    ASSERT_FALSE(error) << world.abortReason();
  for (int64_t r = 0; r < 6; ++r) {
    int64_t a = r / 3, b = r % 3;
    ASSERT_EQ(outputs[r].size(), 3u);
    for (int64_t i = 0; i < 2; ++i)
      for (int64_t j = 0; j < 3; ++j) {
        EXPECT_EQ(outputs[r][0].data<float>()[i * 3 + j],
                  input(a * 3 + (b + 2) % 3, i, j))
            << "rank " << r;
        EXPECT_EQ(outputs[r][1].data<float>()[i * 3 + j],
                  input(a * 3 + (b + 1) % 3, i, j))
            << "rank " << r;
        EXPECT_EQ(outputs[r][2].data<float>()[i * 3 + j], input(r, i, j))
            << "rank " << r;
      }
  }
}

TEST(MultiRankExecutorTest, AShiftAlongAnAxisOutsideItsGroupIsRefused) {
  Json m = shiftManifest();
  m["functions"][0]["instructions"][1]["attrs"]["shift_axis"] = 0;
  expectError([&] { Bundle::parseManifest("s.mtb", m.dump()); },
              MTRT_STATUS_INVALID_ARGUMENT,
              {"instructions[1].attrs.shift_axis: found 0",
               "one of the instruction's grid_axes [1]"});
}

// Sequence parallelism: position_ids split [data, tensor] over grid [2, 2]
// makes each rank's tile of the global [4, 8] positions: its 2 sequences'
// positions 4 t .. 4 t + 3.
TEST(MultiRankExecutorTest, PositionIdsOfASequenceTileAreGlobal) {
  FunctionBuilder f("f");
  f.output(f.op("position_ids", {}, {2, 4}, {{"split_axes", {{0}, {1}}}},
                "i32"));
  Json m = manifestJson(modelJson(8, 4, 3, 2, 2), Json::array(), {f.build()});
  m["grid"] = {{"shape", {2, 2}}};
  Bundle bundle = Bundle::parseManifest("p.mtb", m.dump());
  host::ThreadPool pool(1);
  for (int64_t d = 0; d < 2; ++d)
    for (int64_t t = 0; t < 2; ++t) {
      host::ParameterStore store(bundle, DType::F32, {d, t});
      host::Executor executor(bundle, "f", store, pool);
      auto out = executor.run({}, {});
      ASSERT_EQ(out.size(), 1u);
      for (int64_t b = 0; b < 2; ++b)
        for (int64_t i = 0; i < 4; ++i)
          EXPECT_EQ(out[0].data<int32_t>()[b * 4 + i], 4 * t + i)
              << "rank (" << d << ", " << t << ") sequence " << b;
    }
  // One list per dimension of the ids.
  m["functions"][0]["instructions"][0]["attrs"]["split_axes"] = {{1}};
  expectError([&] { Bundle::parseManifest("p.mtb", m.dump()); },
              MTRT_STATUS_INVALID_ARGUMENT,
              {"split_axes: found 1 lists",
               "one list per dimension of result 0 [2, 4]"});
}

// Context parallelism over grid [2, 2, 2] (data, context, tensor) with
// sequence parallelism: position_ids split [data, context + tensor] make
// each rank's tile of the load-balanced sequence (context rank c holds
// chunks c and 3 - c of 4), its tensor rank's half of those: the global
// positions that host::contextParallelPositions gives the context rank.
TEST(MultiRankExecutorTest, PositionIdsOfAContextParallelTileAreGlobal) {
  FunctionBuilder f("f");
  f.output(f.op("position_ids", {}, {2, 2},
                {{"split_axes", {{0}, {1, 2}}},
                 {"context_axis", 1},
                 {"context_size", 2}},
                "i32"));
  Json m = manifestJson(modelJson(8, 4, 3, 2, 2), Json::array(), {f.build()});
  m["grid"] = {{"shape", {2, 2, 2}}};
  Bundle bundle = Bundle::parseManifest("p.mtb", m.dump());
  host::ThreadPool pool(1);
  for (int64_t d = 0; d < 2; ++d)
    for (int64_t c = 0; c < 2; ++c)
      for (int64_t t = 0; t < 2; ++t) {
        host::ParameterStore store(bundle, DType::F32, {d, c, t});
        host::Executor executor(bundle, "f", store, pool);
        auto out = executor.run({}, {});
        ASSERT_EQ(out.size(), 1u);
        std::vector<int64_t> chunks(4);
        host::contextParallelPositions(c, 2, 8, chunks.data());
        for (int64_t b = 0; b < 2; ++b)
          for (int64_t i = 0; i < 2; ++i)
            EXPECT_EQ(out[0].data<int32_t>()[b * 2 + i], chunks[t * 2 + i])
                << "rank (" << d << ", " << c << ", " << t << ") sequence "
                << b;
      }
  // The layout names the grid's context axis, split along the sequence.
  Json wrongSize = m;
  wrongSize["functions"][0]["instructions"][0]["attrs"]["context_size"] = 4;
  expectError([&] { Bundle::parseManifest("p.mtb", wrongSize.dump()); },
              MTRT_STATUS_INVALID_ARGUMENT,
              {"context_axis: found 1 with context_size 4",
               "a grid axis of context_size ranks (grid [2, 2, 2])"});
  Json notSplit = m;
  notSplit["functions"][0]["instructions"][0]["attrs"]["split_axes"] = {
      {0}, {2}};
  expectError([&] { Bundle::parseManifest("p.mtb", notSplit.dump()); },
              MTRT_STATUS_INVALID_ARGUMENT,
              {"split_axes: found [2]",
               "the sequence split over context_axis 1"});
}

// Context parallelism's rotary embedding: on grid [2, 2] (data x context)
// every rank's rope and inverse rope (its batch row, its two load-balanced
// chunks of a sequence of 8) equal the rows of the whole sequence's
// rotation at the chunks' global positions; the layout is checked against
// the grid as position_ids' is.
TEST(MultiRankExecutorTest, RopeOfAContextParallelTileUsesGlobalPositions) {
  constexpr int64_t batch = 2, seq = 8, heads = 2, dim = 4;
  const std::vector<int64_t> shape = {1, seq / 2, heads, dim};
  Json attrs = {{"base", 10000.0},
                {"split_axes", {{0}, {1}, Json::array(), Json::array()}},
                {"context_axis", 1},
                {"context_size", 2}};
  FunctionBuilder f("f");
  int64_t x = f.input(shape, "f32"), y = f.value(shape), back = f.value(shape);
  f.inst("rope", {x}, {y}, attrs);
  Json inverse = attrs;
  inverse["inverse"] = true;
  f.inst("rope", {x}, {back}, inverse);
  f.output(y);
  f.output(back);
  Json m = manifestJson(modelJson(8, 4, 3, 2, 2), Json::array(), {f.build()});
  m["grid"] = {{"shape", {2, 2}}};
  Bundle bundle = Bundle::parseManifest("rope.mtb", m.dump());

  const int64_t width = heads * dim;
  std::vector<float> whole(batch * seq * width);
  for (size_t i = 0; i < whole.size(); ++i)
    whole[i] = std::sin(0.37f * static_cast<float>(i) + 0.5f);
  host::ThreadPool pool(1);
  RopeFrequencies frequencies(10000.0);
  std::vector<float> rotated(whole.size()), unrotated(whole.size());
  host::ropeForward<float>(pool, batch, seq, heads, dim, dim, frequencies,
                           whole.data(), rotated.data());
  host::ropeBackward<float>(pool, batch, seq, heads, dim, dim, frequencies,
                            whole.data(), unrotated.data());
  for (int64_t d = 0; d < 2; ++d)
    for (int64_t c = 0; c < 2; ++c) {
      std::vector<int64_t> positions(seq / 2);
      host::contextParallelPositions(c, 2, seq, positions.data());
      auto rows = [&](const std::vector<float> &from) {
        std::vector<float> out;
        for (int64_t p : positions)
          out.insert(out.end(), from.begin() + (d * seq + p) * width,
                     from.begin() + (d * seq + p + 1) * width);
        return out;
      };
      std::vector<float> mine = rows(whole);
      host::ParameterStore store(bundle, DType::F32, {d, c});
      host::Executor executor(bundle, "f", store, pool);
      std::vector<host::Tensor> out = executor.run(
          {host::TensorView{DType::F32, shape, mine.data()}}, {});
      ASSERT_EQ(out.size(), 2u);
      std::vector<float> wantY = rows(rotated), wantBack = rows(unrotated);
      for (size_t i = 0; i < wantY.size(); ++i) {
        EXPECT_NEAR(out[0].data<float>()[i], wantY[i], 1e-6)
            << "rank (" << d << ", " << c << ") element " << i;
        EXPECT_NEAR(out[1].data<float>()[i], wantBack[i], 1e-6)
            << "rank (" << d << ", " << c << ") element " << i;
      }
    }
  Json wrongAxis = m;
  wrongAxis["functions"][0]["instructions"][0]["attrs"]["context_axis"] = 0;
  expectError([&] { Bundle::parseManifest("rope.mtb", wrongAxis.dump()); },
              MTRT_STATUS_INVALID_ARGUMENT,
              {"split_axes: found [1]",
               "the sequence split over context_axis 0"});
}

// Context parallelism's dropout: on grid [2, 2, 2] (data x context x
// tensor, the sequence split over context then tensor ranks as under
// sequence parallelism) every rank's mask equals the rows of the one-rank
// run's at the global positions of its tile of the load-balanced sequence
// (keyed on global positions, four to a draw); CP4 on grid [4] too.
TEST(MultiRankExecutorTest, DropoutOfAContextParallelTileIsTheOneRankMask) {
  constexpr int64_t batch = 2, seq = 16, hidden = 6;
  // sequenceRanks: the ranks the sequence is split over (its axes').
  auto run = [&](std::vector<int64_t> grid, Json split, int64_t cp,
                 int64_t contextAxis, int64_t sequenceRanks) {
    int64_t ranks = 1;
    for (int64_t g : grid)
      ranks *= g;
    FunctionBuilder whole("f");
    whole.output(whole.op("dropout", {whole.input({batch, seq, hidden}, "f32")},
                          {batch, seq, hidden}, {{"p", 0.5}, {"seed", 9}}));
    Bundle one = Bundle::parseManifest(
        "one.mtb", manifestJson(modelJson(8, 4, 3, 2, 2), Json::array(),
                                {whole.build()})
                       .dump());
    std::vector<float> x(batch * seq * hidden);
    for (size_t i = 0; i < x.size(); ++i)
      x[i] = 1.0f + 0.01f * static_cast<float>(i);
    host::ThreadPool pool(1);
    host::ParameterStore oneStore(one, DType::F32);
    host::Executor oneExecutor(one, "f", oneStore, pool);
    std::vector<host::Tensor> reference = oneExecutor.run(
        {host::TensorView{DType::F32, {batch, seq, hidden}, x.data()}}, {});
    ASSERT_EQ(reference.size(), 1u);
    const float *wanted = reference[0].data<float>();
    int64_t dropped = 0;
    for (size_t i = 0; i < x.size(); ++i)
      dropped += wanted[i] == 0.0f;
    EXPECT_GT(dropped, 0);

    int64_t batchSplit = grid.size() == 3 ? grid[0] : 1;
    int64_t localBatch = batch / batchSplit, localSeq = seq / sequenceRanks;
    std::vector<int64_t> shape = {localBatch, localSeq, hidden};
    FunctionBuilder f("f");
    f.output(f.op("dropout", {f.input(shape, "f32")}, shape,
                  {{"p", 0.5},
                   {"seed", 9},
                   {"split_axes", split},
                   {"context_axis", contextAxis},
                   {"context_size", cp}}));
    Json m = manifestJson(modelJson(8, 4, 3, 2, 2), Json::array(), {f.build()});
    m["grid"] = {{"shape", grid}};
    Bundle bundle = Bundle::parseManifest("cp.mtb", m.dump());
    for (int64_t r = 0; r < ranks; ++r) {
      std::vector<int64_t> coords(grid.size());
      for (int64_t d = static_cast<int64_t>(grid.size()) - 1, left = r; d >= 0;
           --d) {
        coords[d] = left % grid[d];
        left /= grid[d];
      }
      int64_t b0 = grid.size() == 3 ? coords[0] * localBatch : 0;
      int64_t c = coords[contextAxis];
      int64_t t = grid.size() == 3 ? coords[2] : 0;
      std::vector<int64_t> chunkRows(seq / cp);
      host::contextParallelPositions(c, cp, seq, chunkRows.data());
      std::vector<float> mine, want;
      for (int64_t b = 0; b < localBatch; ++b)
        for (int64_t i = 0; i < localSeq; ++i) {
          int64_t pos = chunkRows[t * localSeq + i];
          size_t at = ((b0 + b) * seq + pos) * hidden;
          mine.insert(mine.end(), x.begin() + at, x.begin() + at + hidden);
          want.insert(want.end(), wanted + at, wanted + at + hidden);
        }
      host::ParameterStore store(bundle, DType::F32, coords);
      host::Executor executor(bundle, "f", store, pool);
      std::vector<host::Tensor> out =
          executor.run({host::TensorView{DType::F32, shape, mine.data()}}, {});
      ASSERT_EQ(out.size(), 1u);
      for (size_t i = 0; i < want.size(); ++i)
        ASSERT_EQ(out[0].data<float>()[i], want[i])
            << "rank " << r << " element " << i;
    }
  };
  run({2, 2, 2}, {{0}, {1, 2}, Json::array()}, 2, 1, 4);
  run({4}, {Json::array(), {0}, Json::array()}, 4, 0, 4);
}

// Context parallelism over grid [2]: each rank's queries (its two
// load-balanced chunks of a sequence of 8) against its own block and the
// other rank's (the ring's two steps), merged, and against both gathered;
// the backward's query gradient summed over the two steps. Against the
// whole sequence's attention kernels, with dropout keyed on global
// positions.
TEST(MultiRankExecutorTest, AttentionBlocksOfAContextParallelRank) {
  constexpr int64_t batch = 1, seq = 8, local = 4, heads = 2, dim = 4;
  const std::vector<int64_t> qShape = {batch, local, heads, dim};
  const std::vector<int64_t> kShape = {batch, local, 1, dim};
  const std::vector<int64_t> rows = {batch, heads, local};
  FunctionBuilder f("f");
  int64_t q = f.input(qShape, "f32"), kOwn = f.input(kShape, "f32"),
          vOwn = f.input(kShape, "f32"), kOther = f.input(kShape, "f32"),
          vOther = f.input(kShape, "f32"),
          kAll = f.input({batch, seq, 1, dim}, "f32"),
          vAll = f.input({batch, seq, 1, dim}, "f32"),
          dout = f.input(qShape, "f32");
  Json attrs = {{"causal", true},    {"dropout_p", 0.25}, {"seed", 11},
                {"context_axis", 0}, {"context_size", 2}, {"key_step", 0}};
  auto block = [&](int64_t k, int64_t v, std::optional<int64_t> step) {
    Json a = attrs;
    if (step)
      a["key_step"] = *step;
    else
      a.erase("key_step");
    int64_t o = f.value(qShape), l = f.value(rows);
    f.inst("attention_block", {q, k, v}, {o, l}, a);
    return std::make_pair(o, l);
  };
  auto [o0, l0] = block(kOwn, vOwn, 0);
  auto [o1, l1] = block(kOther, vOther, 1);
  int64_t o = f.value(qShape), l = f.value(rows);
  f.inst("attention_merge", {o0, l0, o1, l1}, {o, l});
  f.output(o);
  f.output(l);
  f.output(block(kAll, vAll, std::nullopt).first);
  int64_t delta = f.value(rows);
  f.inst("attention_delta", {o, dout}, {delta});
  for (int64_t step : {0, 1}) {
    int64_t dq = f.value(qShape), dk = f.value(kShape), dv = f.value(kShape);
    Json a = attrs;
    a["key_step"] = step;
    f.inst("attention_block_grad",
           {dout, q, step ? kOther : kOwn, step ? vOther : vOwn, l, delta},
           {dq, dk, dv}, a);
    f.output(dq);
  }
  Json m = manifestJson(modelJson(8, 4, 3, 2, 2), Json::array(), {f.build()});
  m["grid"] = {{"shape", {2}}};
  Bundle bundle = Bundle::parseManifest("cp.mtb", m.dump());

  // The whole sequence, and its attention by the one-rank kernels.
  auto values = [](int64_t n, int64_t salt) {
    std::vector<float> x(n);
    for (int64_t i = 0; i < n; ++i)
      x[i] = std::sin(0.7f * i + salt);
    return x;
  };
  std::vector<float> wq = values(seq * heads * dim, 1),
                     wk = values(seq * dim, 2), wv = values(seq * dim, 3),
                     wdout = values(seq * heads * dim, 4);
  host::AttentionParams whole;
  whole.batch = batch;
  whole.seqQ = whole.seqK = seq;
  whole.headsQ = heads;
  whole.headsKv = 1;
  whole.headDim = whole.headDimV = dim;
  whole.causal = true;
  whole.dropoutP = 0.25;
  whole.seed = 11;
  whole.firstSample = 5;
  host::ThreadPool pool(1);
  std::vector<float> wout(wq.size()), wlse(heads * seq), wdq(wq.size()),
      wdk(wk.size()), wdv(wv.size());
  host::attentionForward<float>(pool, whole, wq.data(), wk.data(), wv.data(),
                                wout.data(), wlse.data());
  host::attentionBackward<float>(pool, whole, wq.data(), wk.data(), wv.data(),
                                 wlse.data(), wdout.data(), wdq.data(),
                                 wdk.data(), wdv.data());
  auto positions = [](int64_t rank) {
    std::vector<int64_t> p(local);
    host::contextParallelPositions(rank, 2, seq, p.data());
    return p;
  };
  auto rowsOf = [](const std::vector<float> &x, int64_t width,
                   const std::vector<int64_t> &at) {
    std::vector<float> out;
    for (int64_t pos : at)
      out.insert(out.end(), x.begin() + pos * width,
                 x.begin() + (pos + 1) * width);
    return out;
  };
  std::vector<int64_t> both = positions(0);
  for (int64_t pos : positions(1))
    both.push_back(pos);
  std::vector<float> kAllRows = rowsOf(wk, dim, both),
                     vAllRows = rowsOf(wv, dim, both);
  for (int64_t r = 0; r < 2; ++r) {
    host::ParameterStore store(bundle, DType::F32, {r});
    host::Executor executor(bundle, "f", store, pool);
    std::vector<int64_t> mine = positions(r), theirs = positions(1 - r);
    std::vector<float> rq = rowsOf(wq, heads * dim, mine),
                       rk = rowsOf(wk, dim, mine), rv = rowsOf(wv, dim, mine),
                       ok = rowsOf(wk, dim, theirs),
                       ov = rowsOf(wv, dim, theirs),
                       rdout = rowsOf(wdout, heads * dim, mine);
    auto view = [](const std::vector<float> &x, std::vector<int64_t> shape) {
      return host::TensorView{DType::F32, std::move(shape), x.data()};
    };
    std::vector<host::Tensor> out = executor.run(
        {view(rq, qShape), view(rk, kShape), view(rv, kShape), view(ok, kShape),
         view(ov, kShape), view(kAllRows, {batch, seq, 1, dim}),
         view(vAllRows, {batch, seq, 1, dim}), view(rdout, qShape)},
        {0, 5});
    ASSERT_EQ(out.size(), 5u);
    std::vector<float> expected = rowsOf(wout, heads * dim, mine);
    std::vector<float> expectedDq = rowsOf(wdq, heads * dim, mine);
    for (size_t i = 0; i < expected.size(); ++i) {
      EXPECT_NEAR(out[0].data<float>()[i], expected[i], 1e-6) << r << " " << i;
      EXPECT_NEAR(out[2].data<float>()[i], expected[i], 1e-6) << r << " " << i;
      EXPECT_NEAR(out[3].data<float>()[i] + out[4].data<float>()[i],
                  expectedDq[i], 1e-5)
          << r << " " << i;
    }
    for (int64_t h = 0; h < heads; ++h)
      for (int64_t i = 0; i < local; ++i)
        EXPECT_NEAR(out[1].data<float>()[h * local + i],
                    wlse[h * seq + mine[i]], 1e-6);
  }
  // The ring step names a rank of the group.
  m["functions"][0]["instructions"][1]["attrs"]["key_step"] = 2;
  expectError([&] { Bundle::parseManifest("cp.mtb", m.dump()); },
              MTRT_STATUS_INVALID_ARGUMENT,
              {"key_step: found 2", "a ring step in [0, 2)"});
}

TEST(MultiRankExecutorTest, ParameterShardsHoldTheirGlobalValues) {
  Json w = parameterJson("w", {4, 6});
  w["split_axes"] = {{0}, {1}};
  Json m = manifestJson(modelJson(8, 4, 3, 2, 2), {w}, Json::array());
  m["grid"] = {{"shape", {2, 3}}};
  Bundle bundle = Bundle::parseManifest("p.mtb", m.dump());
  host::ThreadPool pool(1);
  host::ParameterStore whole(bundle, DType::F32, {0, 0});
  std::vector<float> global(24);
  host::initNormal<float>(pool, 24, global.data(), 0.02, 5, 0);
  host::ParameterStore shard(bundle, DType::F32, {1, 2});
  shard.initialize(pool, 5);
  EXPECT_EQ(shard.value(0).shape, (std::vector<int64_t>{2, 2}));
  EXPECT_EQ(shard.numElements(), 4);
  EXPECT_EQ(shard.shardOffsets(0), (std::vector<int64_t>{2, 4}));
  for (int64_t i = 0; i < 2; ++i)
    for (int64_t j = 0; j < 2; ++j)
      EXPECT_EQ(shard.value(0).data<float>()[i * 2 + j],
                global[(2 + i) * 6 + 4 + j]);
  expectError(
      [&] {
        host::ParameterStore(bundle, DType::F32, {2, 0});
      },
      MTRT_STATUS_INVALID_ARGUMENT,
      {"rank coordinates [2, 0] are not in bundle 'p.mtb''s grid "
       "[2, 3]"});
}

} // namespace

namespace {

/// The program partitionAttention makes of mt.attention and
/// mt.attention_grad under context parallelism (ForwardShardingModels.cpp,
/// test/dialects/mt/sharding-partition-context.mlir), over grid [cp]:
/// inputs q, k, v, dout of the rank's chunks; outputs out, dq, dk, dv.
/// The ring: cp steps of shifted keys and values, merged; the gradients of
/// keys and values move on with their block and a last shift takes them
/// home. The gathered form: one block over every rank's keys, dk and dv
/// reduce-scattered.
/// `wholeGradients` (the gathered form only): dk and dv all-reduced whole,
/// as when propagation gathered the keys and values.
Json contextParallelAttentionManifest(int64_t cp, bool ring,
                                      const std::vector<int64_t> &qShape,
                                      const std::vector<int64_t> &kShape,
                                      bool wholeGradients = false) {
  const std::vector<int64_t> rows = {qShape[0], qShape[2], qShape[1]};
  std::vector<int64_t> gatheredShape = kShape;
  gatheredShape[1] *= cp;
  FunctionBuilder f("f");
  int64_t q = f.input(qShape, "f32"), k = f.input(kShape, "f32"),
          v = f.input(kShape, "f32"), dout = f.input(qShape, "f32");
  Json attrs = {{"causal", true},
                {"dropout_p", 0.1},
                {"seed", 11},
                {"context_axis", 0},
                {"context_size", cp}};
  Json ringAttrs = {{"grid_axes", {0}}, {"shift_axis", 0}, {"offset", 1}};
  std::vector<int64_t> keys, values;
  std::vector<std::optional<int64_t>> steps;
  if (ring) {
    keys.push_back(k);
    values.push_back(v);
    for (int64_t s = 0; s < cp; ++s) {
      steps.push_back(s);
      if (s > 0) {
        keys.push_back(f.op("shift", {keys.back()}, kShape, ringAttrs));
        values.push_back(f.op("shift", {values.back()}, kShape, ringAttrs));
      }
    }
  } else {
    Json gather = {{"grid_axes", {0}}, {"gather_axis", 1}};
    keys.push_back(f.op("all_gather", {k}, gatheredShape, gather));
    values.push_back(f.op("all_gather", {v}, gatheredShape, gather));
    steps.push_back(std::nullopt);
  }
  auto withStep = [&](std::optional<int64_t> step) {
    Json a = attrs;
    if (step)
      a["key_step"] = *step;
    return a;
  };
  int64_t out = -1, lse = -1;
  for (size_t i = 0; i < keys.size(); ++i) {
    int64_t o = f.value(qShape), l = f.value(rows);
    f.inst("attention_block", {q, keys[i], values[i]}, {o, l},
           withStep(steps[i]));
    if (out < 0) {
      out = o;
      lse = l;
      continue;
    }
    int64_t mo = f.value(qShape), ml = f.value(rows);
    f.inst("attention_merge", {out, lse, o, l}, {mo, ml});
    out = mo;
    lse = ml;
  }
  int64_t delta = f.value(rows);
  f.inst("attention_delta", {out, dout}, {delta});
  int64_t dq = -1, dk = -1, dv = -1;
  for (size_t i = 0; i < keys.size(); ++i) {
    std::vector<int64_t> blockShape = ring ? kShape : gatheredShape;
    int64_t bq = f.value(qShape), bk = f.value(blockShape),
            bv = f.value(blockShape);
    f.inst("attention_block_grad", {dout, q, keys[i], values[i], lse, delta},
           {bq, bk, bv}, withStep(steps[i]));
    if (dq < 0) {
      dq = bq;
      dk = bk;
      dv = bv;
      continue;
    }
    dq = f.op("add", {dq, bq}, qShape);
    dk = f.op("add", {f.op("shift", {dk}, kShape, ringAttrs), bk}, kShape);
    dv = f.op("add", {f.op("shift", {dv}, kShape, ringAttrs), bv}, kShape);
  }
  if (ring) {
    dk = f.op("shift", {dk}, kShape, ringAttrs);
    dv = f.op("shift", {dv}, kShape, ringAttrs);
  } else {
    Json scatter = {{"grid_axes", {0}}, {"scatter_axis", 1},
                    {"reduction", "sum"}};
    Json sum = {{"grid_axes", {0}}, {"reduction", "sum"}};
    dk = wholeGradients ? f.op("all_reduce", {dk}, gatheredShape, sum)
                        : f.op("reduce_scatter", {dk}, kShape, scatter);
    dv = wholeGradients ? f.op("all_reduce", {dv}, gatheredShape, sum)
                        : f.op("reduce_scatter", {dv}, kShape, scatter);
  }
  for (int64_t r : {out, dq, dk, dv})
    f.output(r);
  Json m = manifestJson(modelJson(8, 4, 3, 2, 2), Json::array(), {f.build()});
  m["grid"] = {{"shape", {cp}}};
  return m;
}

} // namespace

// Context parallelism's attention as the partition makes it, CP2 and CP4,
// the ring, the gathered keys and the keys gathered by propagation (dk and
// dv all-reduced whole), grouped-query heads (2 and 1), causal,
// dropout 0.1: every rank's out, dq, dk and dv against the rows of its
// chunks of the whole sequence's attention and its gradients (float32,
// within 1e-5).
TEST(MultiRankExecutorTest, ContextParallelAttentionEqualsTheWholeSequence) {
  constexpr int64_t batch = 1, heads = 2, dim = 4;
  for (int64_t cp : {2, 4})
    for (int mode : {0, 1, 2}) {
      // The ring; the gathered keys with dk and dv reduce-scattered; with
      // them all-reduced whole (the rows in rank order).
      bool ring = mode == 0, wholeGradients = mode == 2;
      SCOPED_TRACE("cp " + std::to_string(cp) + " mode " +
                   std::to_string(mode));
      const int64_t seq = 8 * cp, local = seq / cp;
      const std::vector<int64_t> qShape = {batch, local, heads, dim};
      const std::vector<int64_t> kShape = {batch, local, 1, dim};
      Bundle bundle = Bundle::parseManifest(
          "cp.mtb",
          contextParallelAttentionManifest(cp, ring, qShape, kShape,
                                           wholeGradients)
              .dump());
      auto values = [](int64_t n, int64_t salt) {
        std::vector<float> x(n);
        for (int64_t i = 0; i < n; ++i)
          x[i] = std::sin(0.37f * i + salt);
        return x;
      };
      std::vector<float> wq = values(seq * heads * dim, 1),
                         wk = values(seq * dim, 2), wv = values(seq * dim, 3),
                         wdout = values(seq * heads * dim, 4);
      host::AttentionParams whole;
      whole.batch = batch;
      whole.seqQ = whole.seqK = seq;
      whole.headsQ = heads;
      whole.headsKv = 1;
      whole.headDim = whole.headDimV = dim;
      whole.causal = true;
      whole.dropoutP = 0.1;
      whole.seed = 11;
      whole.firstSample = 5;
      host::ThreadPool wholePool(1);
      std::vector<float> wout(wq.size()), wlse(heads * seq), wdq(wq.size()),
          wdk(wk.size()), wdv(wv.size());
      host::attentionForward<float>(wholePool, whole, wq.data(), wk.data(),
                                    wv.data(), wout.data(), wlse.data());
      host::attentionBackward<float>(wholePool, whole, wq.data(), wk.data(),
                                     wv.data(), wlse.data(), wdout.data(),
                                     wdq.data(), wdk.data(), wdv.data());
      auto rowsOf = [](const std::vector<float> &x, int64_t width,
                       const std::vector<int64_t> &at) {
        std::vector<float> out;
        for (int64_t pos : at)
          out.insert(out.end(), x.begin() + pos * width,
                     x.begin() + (pos + 1) * width);
        return out;
      };
      comm::InProcessWorld world(static_cast<int>(cp));
      std::mutex mutex;
      std::vector<std::vector<host::Tensor>> outputs(cp);
      auto errors = comm::runRanks(world, [&](comm::Communicator &c) {
        comm::RankContext rank(c, bundle.gridShape());
        rank.prepare(bundle);
        host::ThreadPool pool(1);
        host::ParameterStore store(bundle, DType::F32, rank.coordinates());
        host::Executor executor(bundle, "f", store, pool, &rank);
        std::vector<int64_t> mine(local);
        host::contextParallelPositions(c.rank(), cp, seq, mine.data());
        std::vector<float> rq = rowsOf(wq, heads * dim, mine),
                           rk = rowsOf(wk, dim, mine),
                           rv = rowsOf(wv, dim, mine),
                           rdout = rowsOf(wdout, heads * dim, mine);
        auto view = [](const std::vector<float> &x,
                       std::vector<int64_t> shape) {
          return host::TensorView{DType::F32, std::move(shape), x.data()};
        };
        auto result = executor.run({view(rq, qShape), view(rk, kShape),
                                    view(rv, kShape), view(rdout, qShape)},
                                   {0, 5});
        std::lock_guard<std::mutex> lock(mutex);
        outputs[c.rank()] = std::move(result);
      });
      for (auto &error : errors)
        ASSERT_FALSE(error) << world.abortReason();
      for (int64_t r = 0; r < cp; ++r) {
        std::vector<int64_t> mine(local);
        host::contextParallelPositions(r, cp, seq, mine.data());
        ASSERT_EQ(outputs[r].size(), 4u);
        // Whole gradients hold every rank's rows, in rank order.
        std::vector<int64_t> all;
        for (int64_t owner = 0; owner < cp; ++owner) {
          std::vector<int64_t> theirs(local);
          host::contextParallelPositions(owner, cp, seq, theirs.data());
          all.insert(all.end(), theirs.begin(), theirs.end());
        }
        const std::vector<int64_t> &keyRows = wholeGradients ? all : mine;
        const std::vector<float> expected[] = {
            rowsOf(wout, heads * dim, mine), rowsOf(wdq, heads * dim, mine),
            rowsOf(wdk, dim, keyRows), rowsOf(wdv, dim, keyRows)};
        for (size_t o = 0; o < 4; ++o)
          for (size_t i = 0; i < expected[o].size(); ++i) {
            ASSERT_EQ(outputs[r][o].numElements(),
                      static_cast<int64_t>(expected[o].size()));
            EXPECT_NEAR(outputs[r][o].data<float>()[i], expected[o][i], 1e-5)
                << "rank " << r << " output " << o << " element " << i;
          }
      }
    }
}
