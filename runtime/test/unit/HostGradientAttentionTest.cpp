// Gradient checks of the host attention, rope and embedding backward kernels
// against central differences in double; the method and tolerance are in
// GradientCheck.h.
#include "GradientCheck.h"
#include "host/ThreadPool.h"
#include "host/kernels/Kernels.h"

#include "gtest/gtest.h"

#include <cmath>
#include <functional>
#include <numeric>
#include <random>
#include <string>
#include <vector>

using namespace mtrt::host;
using namespace mtrt::test;

namespace {

//===----------------------------------------------------------------------===//
// Attention
//===----------------------------------------------------------------------===//

struct AttentionCase {
  const char *name;
  int64_t headsQ, headsKv, seqK, headDimV;
  bool causal;
  double dropoutP;
  double scale;
};

class AttentionGradient : public testing::TestWithParam<AttentionCase> {};

TEST_P(AttentionGradient, MatchesFiniteDifferences) {
  const AttentionCase &c = GetParam();
  AttentionParams p;
  p.batch = 2;
  p.seqQ = 5;
  p.seqK = c.seqK;
  p.headsQ = c.headsQ;
  p.headsKv = c.headsKv;
  p.headDim = 8;
  p.headDimV = c.headDimV;
  p.causal = c.causal;
  p.scale = c.scale;
  p.dropoutP = c.dropoutP;
  p.seed = 17;
  p.firstSample = 3;
  Vec q = randomVec(p.batch * p.seqQ * p.headsQ * p.headDim, 100);
  Vec k = randomVec(p.batch * p.seqK * p.headsKv * p.headDim, 101);
  Vec v = randomVec(p.batch * p.seqK * p.headsKv * p.headDimV, 102);
  Vec lse(p.batch * p.headsQ * p.seqQ);
  Forward forward = [&] {
    Vec out(p.batch * p.seqQ * p.headsQ * p.headDimV);
    attentionForward<double>(pool(), p, q.data(), k.data(), v.data(),
                             out.data(), lse.data());
    return out;
  };
  Vec u = randomVec(p.batch * p.seqQ * p.headsQ * p.headDimV, 103);
  forward();
  Vec dq(q.size()), dk(k.size()), dv(v.size());
  attentionBackward<double>(pool(), p, q.data(), k.data(), v.data(),
                            lse.data(), u.data(), dq.data(), dk.data(),
                            dv.data());
  expectGradientsMatch(forward, u,
                       {{"dq", &q, dq}, {"dk", &k, dk}, {"dv", &v, dv}});
}

INSTANTIATE_TEST_SUITE_P(
    Cases, AttentionGradient,
    testing::Values(
        AttentionCase{"MultiHead", 4, 4, 5, 8, false, 0, 0},
        AttentionCase{"Causal", 4, 4, 5, 8, true, 0, 0},
        AttentionCase{"GroupedQueryCausal", 4, 2, 5, 8, true, 0, 0},
        AttentionCase{"MultiQuery", 4, 1, 5, 8, false, 0, 0},
        AttentionCase{"LongerKeysSmallerValueHeads", 4, 2, 7, 6, false, 0,
                      0.3},
        AttentionCase{"Dropout", 4, 2, 5, 8, false, 0.3, 0},
        AttentionCase{"CausalDropout", 4, 2, 5, 8, true, 0.3, 0}),
    [](const testing::TestParamInfo<AttentionCase> &info) {
      return std::string(info.param.name);
    });

//===----------------------------------------------------------------------===//
// Rope
//===----------------------------------------------------------------------===//

class RopeGradient : public testing::TestWithParam<int64_t> {};

TEST_P(RopeGradient, MatchesFiniteDifferences) {
  int64_t rotaryDim = GetParam();
  const int64_t batch = 2, seq = 5, heads = 3, headDim = 8;
  Vec x = randomVec(batch * seq * heads * headDim, 110);
  Forward forward = [&] {
    Vec y(x.size());
    ropeForward<double>(pool(), batch, seq, heads, headDim, rotaryDim, 10000.0,
                        x.data(), y.data());
    return y;
  };
  Vec u = randomVec(x.size(), 111), dx(x.size());
  ropeBackward<double>(pool(), batch, seq, heads, headDim, rotaryDim, 10000.0,
                       u.data(), dx.data());
  expectGradientsMatch(forward, u, {{"dx", &x, dx}});
}
INSTANTIATE_TEST_SUITE_P(RotaryDims, RopeGradient, testing::Values(8, 4));

//===----------------------------------------------------------------------===//
// Embedding
//===----------------------------------------------------------------------===//

template <typename Id> void checkEmbedding() {
  const int64_t vocab = 6, hidden = 4;
  // Repeated ids and an unused row (5).
  std::vector<Id> ids = {1, 3, 1, 0, 4, 4, 4, 2, 0, 3};
  const int64_t count = static_cast<int64_t>(ids.size());
  Vec table = randomVec(vocab * hidden, 120);
  Forward forward = [&] {
    Vec out(count * hidden);
    KernelStatus status = embeddingForward<double, Id>(
        pool(), count, vocab, hidden, table.data(), ids.data(), out.data());
    EXPECT_TRUE(status.ok()) << status.message();
    return out;
  };
  Vec u = randomVec(count * hidden, 121), dtable(table.size(), 7.0);
  KernelStatus status = embeddingBackward<double, Id>(
      pool(), count, vocab, hidden, ids.data(), u.data(), dtable.data(),
      /*accumulate=*/false);
  ASSERT_TRUE(status.ok()) << status.message();
  expectGradientsMatch(forward, u, {{"dtable", &table, dtable}});
  for (int64_t j = 0; j < hidden; ++j)
    EXPECT_EQ(dtable[5 * hidden + j], 0.0);
}

TEST(HostGradient, EmbeddingInt32) { checkEmbedding<int32_t>(); }
TEST(HostGradient, EmbeddingInt64) { checkEmbedding<int64_t>(); }

} // namespace
