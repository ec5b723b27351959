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

TEST(GlobalTileTest, DropoutTilesAreSlicesOfTheGlobalMask) {
  ThreadPool pool(2);
  const std::vector<int64_t> global = {4, 3, 6};
  std::vector<float> x = ramp(4 * 3 * 6, 0.5f), y(x.size());
  dropoutForward<float>(pool, static_cast<int64_t>(x.size()), x.data(),
                        y.data(), 0.3, 11, 5);
  int64_t dropped = 0;
  for (float v : y)
    dropped += v == 0.0f;
  ASSERT_GT(dropped, 0);
  ASSERT_LT(dropped, static_cast<int64_t>(y.size()));
  // Two ways along the batch (data parallel) times three along the features
  // (tensor parallel): each tile of [2, 3, 2].
  for (int64_t d = 0; d < 2; ++d)
    for (int64_t t = 0; t < 3; ++t) {
      GlobalTile tile{{2, 3, 2}, global, {2 * d, 0, 2 * t}};
      std::vector<float> xt, yt(12);
      for (int64_t b = 0; b < 2; ++b)
        for (int64_t s = 0; s < 3; ++s)
          for (int64_t h = 0; h < 2; ++h)
            xt.push_back(x[((2 * d + b) * 3 + s) * 6 + 2 * t + h]);
      dropoutForward<float>(pool, 12, xt.data(), yt.data(), 0.3, 11, 5, &tile);
      std::vector<float> back(12);
      dropoutBackward<float>(pool, 12, xt.data(), back.data(), 0.3, 11, 5,
                             &tile);
      for (int64_t b = 0; b < 2; ++b)
        for (int64_t s = 0; s < 3; ++s)
          for (int64_t h = 0; h < 2; ++h) {
            int64_t local = (b * 3 + s) * 2 + h;
            float expected = y[((2 * d + b) * 3 + s) * 6 + 2 * t + h];
            EXPECT_EQ(yt[local], expected) << d << " " << t << " " << local;
            EXPECT_EQ(back[local], expected);
          }
    }
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
  global.step = 9;
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
  // their key/value head t.
  for (int64_t d = 0; d < 2; ++d)
    for (int64_t t = 0; t < 2; ++t) {
      AttentionParams p = global;
      p.batch = 1;
      p.headsQ = 2;
      p.headsKv = 1;
      p.batchOffset = d;
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
                << "rank (" << d << ", " << t << ")";
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

} // namespace
