// Ring attention's host pieces against the whole-sequence attention kernel:
// each context-parallel rank's queries over every rank's key/value block
// (ring order, or one gathered block), merged by the online softmax, with
// the backward's block gradients summed as the ring passes them back. Float64,
// so that agreement to 1e-12 shows the same function, dropout included.
#include "GradientCheck.h"
#include "host/ThreadPool.h"
#include "host/kernels/Kernels.h"

#include "gtest/gtest.h"

#include <cmath>
#include <limits>
#include <string>
#include <vector>

using namespace mtrt::host;
using namespace mtrt::test;

namespace {

using Positions = std::vector<int64_t>;

Positions positionsOf(int64_t rank, int64_t cp, int64_t seq) {
  Positions positions(static_cast<size_t>(seq / cp));
  contextParallelPositions(rank, cp, seq, positions.data());
  return positions;
}

/// Rows `positions` of x [batch, seq, width], as [batch, |positions|, width].
Vec gatherRows(const Vec &x, int64_t batch, int64_t seq, int64_t width,
               const Positions &positions) {
  int64_t n = static_cast<int64_t>(positions.size());
  Vec out(static_cast<size_t>(batch * n * width));
  for (int64_t b = 0; b < batch; ++b)
    for (int64_t i = 0; i < n; ++i)
      for (int64_t e = 0; e < width; ++e)
        out[(b * n + i) * width + e] = x[(b * seq + positions[i]) * width + e];
  return out;
}

/// The same for x [batch, heads, seq] (logsumexp and delta).
Vec gatherColumns(const Vec &x, int64_t rows, int64_t seq,
                  const Positions &positions) {
  int64_t n = static_cast<int64_t>(positions.size());
  Vec out(static_cast<size_t>(rows * n));
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t i = 0; i < n; ++i)
      out[r * n + i] = x[r * seq + positions[i]];
  return out;
}

void expectNear(const Vec &actual, const Vec &expected, const std::string &what,
                double tolerance = 1e-12) {
  ASSERT_EQ(actual.size(), expected.size()) << what;
  double worst = 0;
  size_t at = 0;
  for (size_t i = 0; i < actual.size(); ++i) {
    double error = std::abs(actual[i] - expected[i]) /
                   std::max(1.0, std::abs(expected[i]));
    if (!(error <= worst)) {
      worst = error;
      at = i;
    }
  }
  EXPECT_LE(worst, tolerance)
      << what << " at " << at << ": " << actual[at] << " vs " << expected[at];
}

TEST(ContextParallelPositions, LoadBalancedChunks) {
  EXPECT_EQ(positionsOf(0, 2, 8), (Positions{0, 1, 6, 7}));
  EXPECT_EQ(positionsOf(1, 2, 8), (Positions{2, 3, 4, 5}));
  EXPECT_EQ(positionsOf(0, 4, 16), (Positions{0, 1, 14, 15}));
  EXPECT_EQ(positionsOf(3, 4, 16), (Positions{6, 7, 8, 9}));
  EXPECT_EQ(positionsOf(0, 1, 4), (Positions{0, 1, 2, 3}));
}

struct RingCase {
  const char *name;
  int64_t cp, headsQ, headsKv;
  double dropoutP;
  bool allGather;
};

class RingAttention : public testing::TestWithParam<RingCase> {};

TEST_P(RingAttention, MatchesWholeSequence) {
  const RingCase &c = GetParam();
  AttentionParams whole;
  whole.batch = 2;
  whole.seqQ = whole.seqK = 16;
  whole.headsQ = c.headsQ;
  whole.headsKv = c.headsKv;
  whole.headDim = 8;
  whole.headDimV = 6;
  whole.causal = true;
  whole.dropoutP = c.dropoutP;
  whole.seed = 5;
  whole.firstSample = 7;
  const int64_t B = whole.batch, S = whole.seqQ, cp = c.cp, local = S / cp;
  const int64_t qWidth = whole.headsQ * whole.headDim;
  const int64_t kWidth = whole.headsKv * whole.headDim;
  const int64_t vWidth = whole.headsKv * whole.headDimV;
  const int64_t oWidth = whole.headsQ * whole.headDimV;
  const int64_t rows = B * whole.headsQ;
  Vec q = randomVec(B * S * qWidth, 1), k = randomVec(B * S * kWidth, 2);
  Vec v = randomVec(B * S * vWidth, 3), dout = randomVec(B * S * oWidth, 4);

  Vec out(B * S * oWidth), lse(rows * S);
  attentionForward<double>(pool(), whole, q.data(), k.data(), v.data(),
                           out.data(), lse.data());
  Vec dq(q.size()), dk(k.size()), dv(v.size());
  attentionBackward<double>(pool(), whole, q.data(), k.data(), v.data(),
                            lse.data(), dout.data(), dq.data(), dk.data(),
                            dv.data());

  std::vector<Positions> positions;
  std::vector<Vec> qs, ks, vs, douts;
  for (int64_t r = 0; r < cp; ++r) {
    positions.push_back(positionsOf(r, cp, S));
    qs.push_back(gatherRows(q, B, S, qWidth, positions[r]));
    ks.push_back(gatherRows(k, B, S, kWidth, positions[r]));
    vs.push_back(gatherRows(v, B, S, vWidth, positions[r]));
    douts.push_back(gatherRows(dout, B, S, oWidth, positions[r]));
  }
  // all_gather: every rank's keys and values in rank order, one block.
  Positions gathered;
  Vec kAll, vAll;
  for (int64_t r = 0; r < cp; ++r) {
    gathered.insert(gathered.end(), positions[r].begin(), positions[r].end());
  }
  kAll = gatherRows(k, B, S, kWidth, gathered);
  vAll = gatherRows(v, B, S, vWidth, gathered);

  AttentionParams block = whole;
  block.seqQ = local;
  std::vector<Vec> rankOut, rankLse;
  std::vector<Vec> rankDk(cp, Vec(B * local * kWidth)),
      rankDv(cp, Vec(B * local * vWidth));
  Vec dkAll(kAll.size()), dvAll(vAll.size());
  for (int64_t r = 0; r < cp; ++r) {
    Vec o(B * local * oWidth, 0.0);
    Vec l(rows * local, -std::numeric_limits<double>::infinity());
    // The ring: the rank's own block first, then rank r - 1's, r - 2's...
    for (int64_t step = 0; step < (c.allGather ? 1 : cp); ++step) {
      int64_t source = (r - step + cp) % cp;
      AttentionBlock where{
          positions[r].data(),
          c.allGather ? gathered.data() : positions[source].data(), S};
      block.seqK = c.allGather ? S : local;
      const Vec &kb = c.allGather ? kAll : ks[source];
      const Vec &vb = c.allGather ? vAll : vs[source];
      Vec bo(o.size()), bl(l.size());
      attentionBlockForward<double>(pool(), block, where, qs[r].data(),
                                    kb.data(), vb.data(), bo.data(), bl.data());
      attentionMergeBlock<double>(pool(), block, bo.data(), bl.data(), o.data(),
                                  l.data());
    }
    expectNear(o, gatherRows(out, B, S, oWidth, positions[r]),
               "out of rank " + std::to_string(r));
    expectNear(l, gatherColumns(lse, rows, S, positions[r]),
               "logsumexp of rank " + std::to_string(r));
    rankOut.push_back(o);
    rankLse.push_back(l);
  }
  for (int64_t r = 0; r < cp; ++r) {
    Vec delta(rows * local);
    attentionBackwardDelta<double>(pool(), block, rankOut[r].data(),
                                   douts[r].data(), delta.data());
    Vec dqr(qs[r].size(), 0.0);
    for (int64_t step = 0; step < (c.allGather ? 1 : cp); ++step) {
      int64_t source = (r - step + cp) % cp;
      AttentionBlock where{
          positions[r].data(),
          c.allGather ? gathered.data() : positions[source].data(), S};
      block.seqK = c.allGather ? S : local;
      // dK and dV travel back around the ring to the block's owner; under
      // all_gather they are reduce-scattered.
      attentionBlockBackward<double>(
          pool(), block, where, qs[r].data(),
          (c.allGather ? kAll : ks[source]).data(),
          (c.allGather ? vAll : vs[source]).data(), rankLse[r].data(),
          delta.data(), douts[r].data(), dqr.data(),
          (c.allGather ? dkAll : rankDk[source]).data(),
          (c.allGather ? dvAll : rankDv[source]).data());
    }
    expectNear(dqr, gatherRows(dq, B, S, qWidth, positions[r]),
               "dq of rank " + std::to_string(r));
  }
  for (int64_t r = 0; r < cp; ++r) {
    // Under all_gather rank r's rows of the gathered block are the r-th
    // `local` rows (dK and dV are reduce-scattered back to it).
    Positions slice(local);
    for (int64_t i = 0; i < local; ++i)
      slice[i] = r * local + i;
    Vec dkr = c.allGather ? gatherRows(dkAll, B, S, kWidth, slice) : rankDk[r];
    Vec dvr = c.allGather ? gatherRows(dvAll, B, S, vWidth, slice) : rankDv[r];
    expectNear(dkr, gatherRows(dk, B, S, kWidth, positions[r]),
               "dk of rank " + std::to_string(r));
    expectNear(dvr, gatherRows(dv, B, S, vWidth, positions[r]),
               "dv of rank " + std::to_string(r));
  }
}

INSTANTIATE_TEST_SUITE_P(
    Cases, RingAttention,
    testing::Values(RingCase{"P2pCp2", 2, 4, 4, 0, false},
                    RingCase{"P2pCp4GroupedQuery", 4, 4, 2, 0, false},
                    RingCase{"P2pCp2Dropout", 2, 4, 2, 0.1, false},
                    RingCase{"P2pCp4Dropout", 4, 2, 1, 0.3, false},
                    RingCase{"AllGatherCp2Dropout", 2, 4, 2, 0.1, true},
                    RingCase{"AllGatherCp4", 4, 4, 4, 0, true}),
    [](const testing::TestParamInfo<RingCase> &info) {
      return std::string(info.param.name);
    });

// A block that a row sees nothing of leaves the running result alone, and
// the first block a row sees replaces the empty start (out 0, lse -inf).
TEST(AttentionMergeBlock, EmptyBlocksAndEmptyStart) {
  AttentionParams p;
  p.batch = 1;
  p.seqQ = 2;
  p.seqK = 2;
  p.headsQ = p.headsKv = 1;
  p.headDim = p.headDimV = 2;
  p.causal = true;
  const double inf = std::numeric_limits<double>::infinity();
  Vec out{0, 0, 0, 0}, lse{-inf, -inf};
  Vec blockOut{1, 2, 3, 4}, blockLse{0.5, -inf};
  attentionMergeBlock<double>(pool(), p, blockOut.data(), blockLse.data(),
                              out.data(), lse.data());
  EXPECT_EQ(out, (Vec{1, 2, 0, 0}));
  EXPECT_EQ(lse[0], 0.5);
  EXPECT_EQ(lse[1], -inf);

  // Queries at positions 0 and 1 against keys at 2 and 3: all masked.
  int64_t queries[] = {0, 1}, keys[] = {2, 3};
  Vec q = randomVec(4, 9), k = randomVec(4, 10), v = randomVec(4, 11);
  Vec o(4, 7.0), l(2, 7.0);
  attentionBlockForward<double>(pool(), p, AttentionBlock{queries, keys, 4},
                                q.data(), k.data(), v.data(), o.data(),
                                l.data());
  EXPECT_EQ(o, (Vec{0, 0, 0, 0}));
  EXPECT_EQ(l[0], -inf);
  EXPECT_EQ(l[1], -inf);
}

// Float32, as the host backend trains: the ring agrees with the whole
// kernel to float rounding.
TEST(RingAttentionFloat, Cp2WithinFloatRounding) {
  AttentionParams whole;
  whole.batch = 1;
  whole.seqQ = whole.seqK = 8;
  whole.headsQ = 2;
  whole.headsKv = 1;
  whole.headDim = whole.headDimV = 4;
  whole.causal = true;
  whole.dropoutP = 0.1;
  whole.seed = 3;
  Vec q64 = randomVec(8 * 2 * 4, 21), k64 = randomVec(8 * 4, 22),
      v64 = randomVec(8 * 4, 23);
  std::vector<float> q(q64.begin(), q64.end()), k(k64.begin(), k64.end()),
      v(v64.begin(), v64.end());
  std::vector<float> out(8 * 2 * 4), lse(2 * 8);
  attentionForward<float>(pool(), whole, q.data(), k.data(), v.data(),
                          out.data(), lse.data());
  // Rank 1 of CP2 holds positions 2, 3, 4, 5; it sees keys of both ranks.
  Positions mine = positionsOf(1, 2, 8), other = positionsOf(0, 2, 8);
  auto rows = [](const std::vector<float> &x, int64_t width,
                 const Positions &at) {
    std::vector<float> r;
    for (int64_t pos : at)
      r.insert(r.end(), x.begin() + pos * width, x.begin() + (pos + 1) * width);
    return r;
  };
  AttentionParams block = whole;
  block.seqQ = block.seqK = 4;
  std::vector<float> qr = rows(q, 8, mine);
  std::vector<float> o(4 * 2 * 4, 0.0f),
      l(2 * 4, -std::numeric_limits<float>::infinity());
  for (const Positions *keys : {&mine, &other}) {
    std::vector<float> kb = rows(k, 4, *keys), vb = rows(v, 4, *keys);
    std::vector<float> bo(o.size()), bl(l.size());
    attentionBlockForward<float>(
        pool(), block, AttentionBlock{mine.data(), keys->data(), 8}, qr.data(),
        kb.data(), vb.data(), bo.data(), bl.data());
    attentionMergeBlock<float>(pool(), block, bo.data(), bl.data(), o.data(),
                               l.data());
  }
  std::vector<float> expected = rows(out, 8, mine);
  for (size_t i = 0; i < o.size(); ++i)
    EXPECT_NEAR(o[i], expected[i], 1e-6) << i;
  for (int64_t h = 0; h < 2; ++h)
    for (int64_t i = 0; i < 4; ++i)
      EXPECT_NEAR(l[h * 4 + i], lse[h * 8 + mine[i]], 1e-6);
}

} // namespace
