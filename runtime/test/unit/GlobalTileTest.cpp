// Tests that random streams keyed on global positions do not depend on the
// layout: a rank's tile of dropout, and of attention's dropout, draws exactly
// the global tensor's mask at its offsets; and the bundle's split_axes on
// random ops, accepted and rejected.
#include "BundleTestBuilder.h"

#include "host/ThreadPool.h"
#include "host/kernels/Kernels.h"

#include <cmath>
#include <vector>

using namespace mtrt;
using namespace mtrt::host;
using namespace mtrt::test;

namespace {

std::vector<float> ramp(int64_t n, float scale) {
  std::vector<float> x(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i)
    x[i] = scale * static_cast<float>(i % 13 + 1);
  return x;
}

/// Random.h's dropout key written out: element `position` of sample
/// `sample` is kept.
bool keeps(uint64_t seed, uint64_t sample, uint64_t position, double p) {
  uint64_t key = random::streamKey(seed, sample);
  uint64_t bits = random::bitsFromKey(key, position / 4);
  return ((bits >> (16 * (position % 4))) & 0xFFFF) >=
         static_cast<uint64_t>(p * 65536 + 0.5);
}

random::MaskTile maskTile(std::vector<int64_t> local,
                          std::vector<int64_t> global,
                          std::vector<int64_t> offsets, uint64_t first) {
  random::MaskTile tile;
  EXPECT_TRUE(random::makeMaskTile(local.data(), global.data(), offsets.data(),
                                   static_cast<unsigned>(local.size()), first,
                                   tile));
  return tile;
}

// x [4, 3, 6] of the micro-batch whose samples start at 20: each element
// keyed on (sample 20 + b, position s * 6 + h). Tiles two ways along the
// batch (data parallel) times three along the features (tensor parallel),
// and along the batch and sequence (sequence parallel), draw the keys of
// their elements.
TEST(GlobalTileTest, DropoutTilesDrawTheirSamplesAndPositions) {
  ThreadPool pool(2);
  const std::vector<int64_t> global = {4, 3, 6};
  const double p = 0.3;
  std::vector<float> x = ramp(4 * 3 * 6, 0.5f);
  float scale = static_cast<float>(1.0 / (1.0 - p));
  auto expected = [&](int64_t b, int64_t s, int64_t h) {
    float v = x[(b * 3 + s) * 6 + h];
    return keeps(11, 20 + b, s * 6 + h, p) ? v * scale : 0.0f;
  };
  int64_t dropped = 0;
  for (int64_t b = 0; b < 4; ++b)
    for (int64_t s = 0; s < 3; ++s)
      for (int64_t h = 0; h < 6; ++h)
        dropped += expected(b, s, h) == 0.0f;
  ASSERT_GT(dropped, 0);
  ASSERT_LT(dropped, 4 * 3 * 6);
  struct Split {
    std::vector<int64_t> local, offsets;
  };
  std::vector<Split> splits;
  for (int64_t d = 0; d < 2; ++d)
    for (int64_t t = 0; t < 3; ++t) {
      splits.push_back({{2, 3, 2}, {2 * d, 0, 2 * t}});
      splits.push_back({{2, 1, 6}, {2 * d, t, 0}});
    }
  splits.push_back({{4, 3, 6}, {0, 0, 0}});
  for (const Split &split : splits) {
    const std::vector<int64_t> &l = split.local, &o = split.offsets;
    random::MaskTile tile = maskTile(l, global, o, 20);
    int64_t n = l[0] * l[1] * l[2];
    std::vector<float> xt, yt(static_cast<size_t>(n)), back(yt.size());
    for (int64_t b = 0; b < l[0]; ++b)
      for (int64_t s = 0; s < l[1]; ++s)
        for (int64_t h = 0; h < l[2]; ++h)
          xt.push_back(x[((o[0] + b) * 3 + o[1] + s) * 6 + o[2] + h]);
    dropoutForward<float>(pool, n, xt.data(), yt.data(), p, 11, tile);
    dropoutBackward<float>(pool, n, xt.data(), back.data(), p, 11, tile);
    for (int64_t b = 0; b < l[0]; ++b)
      for (int64_t s = 0; s < l[1]; ++s)
        for (int64_t h = 0; h < l[2]; ++h) {
          int64_t local = (b * l[1] + s) * l[2] + h;
          float want = expected(o[0] + b, o[1] + s, o[2] + h);
          EXPECT_EQ(yt[local], want) << "tile at " << o[0] << ", " << o[1]
                                     << ", " << o[2] << ": " << local;
          EXPECT_EQ(back[local], want);
        }
  }
}

// The samples key the mask, not the micro-batch: eight samples from 40 as
// one micro-batch of 8, two of 4 (from 40 and 44) or four of 2 give the
// same masks.
TEST(GlobalTileTest, MicroBatchSplitsDrawTheSameMasks) {
  ThreadPool pool(2);
  const int64_t perSample = 3 * 5;
  std::vector<float> x = ramp(8 * perSample, 0.25f), whole(x.size());
  dropoutForward<float>(pool, 8 * perSample, x.data(), whole.data(), 0.2, 4,
                        maskTile({8, 3, 5}, {8, 3, 5}, {0, 0, 0}, 40));
  for (int64_t batch : {4, 2}) {
    std::vector<float> split(x.size());
    for (int64_t m = 0; m < 8 / batch; ++m) {
      int64_t at = m * batch * perSample;
      dropoutForward<float>(pool, batch * perSample, x.data() + at,
                            split.data() + at, 0.2, 4,
                            maskTile({batch, 3, 5}, {batch, 3, 5}, {0, 0, 0},
                                     40 + static_cast<uint64_t>(m * batch)));
    }
    EXPECT_EQ(split, whole) << "micro-batches of " << batch;
  }
}

// makeMaskTile merges a whole inner dimension into the one before it, and
// refuses more than kMaskTileDims split dimensions per sample.
TEST(GlobalTileTest, MaskTilesMergeWholeDimensions) {
  random::MaskTile whole = maskTile({2, 3, 4}, {4, 3, 4}, {2, 0, 0}, 10);
  EXPECT_EQ(whole.firstSample, 12u);
  EXPECT_EQ(whole.sampleElements, 12u);
  EXPECT_EQ(whole.dims, 0u);
  random::MaskTile sequence = maskTile({1, 2, 4}, {1, 6, 4}, {0, 2, 0}, 0);
  ASSERT_EQ(sequence.dims, 1u);
  EXPECT_EQ(sequence.local[0], 8u);
  EXPECT_EQ(sequence.global[0], 24u);
  EXPECT_EQ(sequence.offset[0], 8u);
  // Sequence and features split: two dimensions; element 3 of the tile is
  // sequence 2 + 1, feature 2 + 1 of [6, 4].
  random::MaskTile both = maskTile({1, 2, 2}, {1, 6, 4}, {0, 2, 2}, 0);
  EXPECT_EQ(both.dims, 2u);
  EXPECT_EQ(random::maskPosition(both, 3), (2u + 1u) * 4u + 2u + 1u);
  std::vector<int64_t> local = {1, 1, 2, 1, 2, 1, 2},
                       global = {1, 2, 4, 2, 4, 2, 4},
                       offsets = {0, 1, 2, 1, 2, 1, 2};
  random::MaskTile tile;
  EXPECT_FALSE(random::makeMaskTile(local.data(), global.data(), offsets.data(),
                                    7, 0, tile));
}

TEST(GlobalTileTest, AttentionTilesDropTheGlobalProbabilities) {
  ThreadPool pool(2);
  AttentionParams global;
  global.batch = 2;
  global.seqQ = global.seqK = 5;
  global.headsQ = 4;
  global.headsKv = 2;
  global.headDim = global.headDimV = 3;
  global.causal = true;
  global.dropoutP = 0.4;
  global.seed = 3;
  global.firstSample = 9;
  auto size = [](int64_t b, int64_t s, int64_t h, int64_t d) {
    return b * s * h * d;
  };
  std::vector<float> q = ramp(size(2, 5, 4, 3), 0.05f);
  std::vector<float> k = ramp(size(2, 5, 2, 3), -0.03f);
  std::vector<float> v = ramp(size(2, 5, 2, 3), 0.07f);
  std::vector<float> out(q.size()), lse(2 * 4 * 5);
  attentionForward<float>(pool, global, q.data(), k.data(), v.data(),
                          out.data(), lse.data());
  // Rank (d, t) of a [2, 2] grid: batch row d, query heads 2t..2t+1 and
  // their key/value head t. And as micro-batches of one sample each (no
  // batch offset; the first sample moves instead): the same outputs.
  for (bool microBatches : {false, true})
    for (int64_t d = 0; d < 2; ++d)
      for (int64_t t = 0; t < 2; ++t) {
        AttentionParams p = global;
        p.batch = 1;
        p.headsQ = 2;
        p.headsKv = 1;
        p.batchOffset = microBatches ? 0 : d;
        p.firstSample = microBatches ? 9 + static_cast<uint64_t>(d) : 9;
        p.headOffset = 2 * t;
        p.globalHeadsQ = 4;
        std::vector<float> qt, kt, vt, ot(size(1, 5, 2, 3)), lt(10);
        for (int64_t s = 0; s < 5; ++s) {
          for (int64_t h = 0; h < 2; ++h)
            for (int64_t e = 0; e < 3; ++e)
              qt.push_back(q[((d * 5 + s) * 4 + 2 * t + h) * 3 + e]);
          for (int64_t e = 0; e < 3; ++e) {
            kt.push_back(k[((d * 5 + s) * 2 + t) * 3 + e]);
            vt.push_back(v[((d * 5 + s) * 2 + t) * 3 + e]);
          }
        }
        attentionForward<float>(pool, p, qt.data(), kt.data(), vt.data(),
                                ot.data(), lt.data());
        for (int64_t s = 0; s < 5; ++s)
          for (int64_t h = 0; h < 2; ++h)
            for (int64_t e = 0; e < 3; ++e)
              EXPECT_EQ(ot[(s * 2 + h) * 3 + e],
                        out[((d * 5 + s) * 4 + 2 * t + h) * 3 + e])
                  << "rank (" << d << ", " << t << ")"
                  << (microBatches ? " as a micro-batch" : "");
      }
}

// Grid [2, 2]: dropout of x [2, 3, 4] split along the batch over axis 0;
// attention of q [2, 3, 2, 4] along batch and heads.
Json randomManifest() {
  FunctionBuilder f("f");
  int64_t x = f.input({2, 3, 4}, "f32");
  f.output(f.op(
      "dropout", {x}, {2, 3, 4},
      {{"p", 0.1}, {"seed", 1}, {"split_axes", Json::parse("[[0], [], []]")}}));
  int64_t q = f.input({2, 3, 2, 4}, "f32");
  int64_t kv = f.input({2, 3, 1, 4}, "f32");
  f.output(f.op("attention", {q, kv, kv}, {2, 3, 2, 4},
                {{"causal", true},
                 {"dropout_p", 0.1},
                 {"seed", 2},
                 {"split_axes", Json::parse("[[0], [], [1], []]")}}));
  Json m = manifestJson(modelJson(8, 4, 3, 2, 2), Json::array(), {f.build()});
  m["grid"] = {{"shape", {2, 2}}};
  return m;
}

void expectRejected(const Json &manifest,
                    std::initializer_list<std::string> parts) {
  expectError([&] { Bundle::parseManifest("r.mtb", manifest.dump()); },
              MTRT_STATUS_INVALID_ARGUMENT, parts);
}

Json &attrs(Json &m, int i) {
  return m["functions"][0]["instructions"][i]["attrs"];
}

TEST(GlobalTileTest, SplitAxesOfRandomOpsAreRead) {
  Bundle bundle = Bundle::parseManifest("r.mtb", randomManifest().dump());
  const auto &inst = bundle.functions()[0].instructions;
  EXPECT_EQ(inst[0].attrs.splitAxes,
            (std::vector<std::vector<int64_t>>{{0}, {}, {}}));
  EXPECT_EQ(inst[1].attrs.splitAxes,
            (std::vector<std::vector<int64_t>>{{0}, {}, {1}, {}}));
}

TEST(GlobalTileTest, BadSplitAxesAreRejected) {
  Json m = randomManifest();
  attrs(m, 0)["split_axes"] = Json::parse("[[0], []]");
  expectRejected(m, {"instructions[0].attrs.split_axes: found 2 lists",
                     "one list per dimension of operand 0 [2, 3, 4]"});
  m = randomManifest();
  attrs(m, 1)["split_axes"] = Json::parse("[[0], [1], [], []]");
  expectRejected(m, {"instructions[1].attrs.split_axes[1]: found [1]",
                     "attention splits only batch and heads"});
  m = randomManifest();
  attrs(m, 0)["split_axes"] = Json::parse("[[0], [0], []]");
  expectRejected(m, {"split_axes[1][0]: found 0",
                     "a grid axis that splits no other dimension"});
  m = randomManifest();
  attrs(m, 0)["split_axes"] = Json::parse("[[2], [], []]");
  expectRejected(m, {"split_axes[0][0]: found 2", "a grid axis in [0, 2)"});
  m = randomManifest();
  m.erase("grid");
  attrs(m, 1).erase("split_axes");
  expectRejected(m, {"instructions[0].attrs.split_axes",
                     "no split_axes (dropout) in a bundle without a "
                     "top-level \"grid\""});
}

// A split dropout's mask tile has room for kMaskTileDims dimensions per
// sample: a split tensor of six dimensions is refused.
TEST(GlobalTileTest, SplitDropoutOfTooManyDimensionsIsRejected) {
  FunctionBuilder f("f");
  int64_t x = f.input({2, 1, 1, 1, 1, 4}, "f32");
  f.output(f.op("dropout", {x}, {2, 1, 1, 1, 1, 4},
                {{"p", 0.1},
                 {"seed", 1},
                 {"split_axes", Json::parse("[[0], [], [], [], [], [1]]")}}));
  Json m = manifestJson(modelJson(8, 4, 3, 2, 2), Json::array(), {f.build()});
  m["grid"] = {{"shape", {2, 2}}};
  expectRejected(m, {"instructions[0].attrs.split_axes: found 6 lists",
                     "a split dropout of at most 5 dimensions",
                     "reshape the tensor to fewer dimensions"});
}

// The fused kernels' mapping of an element to its sample and position in
// 32-bit arithmetic (maskSamplePosition with fits32) gives maskSample's and
// maskPosition's integers, for whole samples and for tiles split along one
// or two dimensions; maskTileFits32 says when it may.
TEST(GlobalTileTest, MaskSamplePositionIn32BitsIsTheSame) {
  struct Case {
    std::vector<int64_t> local, global, offsets;
  };
  std::vector<Case> cases = {
      {{3, 5, 8}, {3, 5, 8}, {0, 0, 0}},      // whole samples
      {{3, 5, 4}, {3, 5, 8}, {0, 0, 4}},      // hidden split (TP)
      {{2, 3, 8}, {4, 6, 8}, {2, 3, 0}},      // sequence split (SP)
      {{2, 3, 2, 4}, {2, 6, 4, 12}, {0, 3, 2, 8}}, // two splits
  };
  for (const Case &c : cases) {
    random::MaskTile tile = maskTile(c.local, c.global, c.offsets, 11);
    uint64_t n = 1;
    for (int64_t extent : c.local)
      n *= static_cast<uint64_t>(extent);
    ASSERT_TRUE(random::maskTileFits32(tile, n));
    for (uint64_t i = 0; i < n; ++i) {
      uint64_t sample = 0, position = 0;
      random::maskSamplePosition(tile, i, true, sample, position);
      EXPECT_EQ(sample, random::maskSample(tile, i)) << i;
      EXPECT_EQ(position, random::maskPosition(tile, i)) << i;
    }
  }
  random::MaskTile big = maskTile({2, 1 << 20}, {2, 1 << 20}, {0, 0}, 0);
  EXPECT_TRUE(random::maskTileFits32(big, 2u << 20));
  EXPECT_FALSE(random::maskTileFits32(big, 1ull << 32));
  random::MaskTile wide =
      maskTile({1, 1 << 16, 4}, {1, 1 << 16, 1 << 16}, {0, 0, 8}, 0);
  EXPECT_FALSE(random::maskTileFits32(wide, 1 << 18));
}

} // namespace
