// The mixture-of-experts host kernels on small hand-worked cases: the
// permuted rows' layout, capacity dropping, the grouped GEMM against one
// linear layer per row, and the index checks.
#include "host/ThreadPool.h"
#include "host/kernels/Kernels.h"

#include "gtest/gtest.h"

#include <cmath>
#include <vector>

using namespace mtrt::host;

namespace {

ThreadPool &pool() {
  static ThreadPool instance(2);
  return instance;
}

// 4 tokens, top-2 of 3 experts: token 0 -> (2, 0), 1 -> (0, 1), 2 -> (2, 1),
// 3 -> (0, dropped).
const std::vector<int32_t> kIndices = {2, 0, 0, 1, 2, 1, 0, -1};

TEST(HostMoeKernelsTest, LayoutPutsExpertsInOrderAndTokensInOrderWithin) {
  MoeLayout layout;
  ASSERT_TRUE(moeLayout(4, 2, 3, kIndices.data(), layout).ok());
  // Expert 0 holds tokens 0, 1, 3 (rows 0-2), expert 1 tokens 1, 2 (rows
  // 3-4), expert 2 tokens 0, 2 (rows 5-6); row 7 is empty.
  EXPECT_EQ(layout.offsets, (std::vector<int64_t>{0, 3, 5, 7}));
  EXPECT_EQ(layout.position, (std::vector<int64_t>{5, 0, 1, 3, 6, 4, 2, -1}));
}

TEST(HostMoeKernelsTest, LayoutRefusesIndicesOutsideTheExperts) {
  MoeLayout layout;
  std::vector<int32_t> bad = {0, 3};
  KernelStatus status = moeLayout(1, 2, 3, bad.data(), layout);
  ASSERT_FALSE(status.ok());
  EXPECT_EQ(status.message(),
            "routing index 3 of token 0, slot 1 is outside the 3 experts "
            "(valid indices are 0 to 2, or -1 for a dropped slot)");
  bad = {-2, 0};
  EXPECT_FALSE(moeLayout(1, 2, 3, bad.data(), layout).ok());
}

TEST(HostMoeKernelsTest, PermuteAndWeightedUnpermute) {
  MoeLayout layout;
  ASSERT_TRUE(moeLayout(4, 2, 3, kIndices.data(), layout).ok());
  // Token t's row is [t + 1, 10 (t + 1)].
  std::vector<double> x = {1, 10, 2, 20, 3, 30, 4, 40};
  std::vector<double> rows(16, -7);
  moePermute<double>(pool(), 4, 2, 2, layout, x.data(), nullptr, rows.data());
  EXPECT_EQ(rows, (std::vector<double>{1, 10, 2, 20, 4, 40, 2, 20, 3, 30, 1, 10,
                                       3, 30, 0, 0}));
  std::vector<double> probs = {0.75, 0.25, 0.5, 0.5, 0.875, 0.125, 1.0, 0.0};
  std::vector<double> y(8);
  moeUnpermute<double>(pool(), 4, 2, 2, layout, rows.data(), probs.data(),
                       y.data());
  // Each token's two copies weighted back: the weights of a kept pair sum
  // to 1 here, so y = x; token 3's second slot is dropped.
  EXPECT_EQ(y, x);
  std::vector<double> dprobs(8);
  moeProbsGrad<double>(pool(), 4, 2, 2, layout, x.data(), rows.data(),
                       dprobs.data());
  // dot(x[t], x[t]) for kept slots, 0 for the dropped one.
  EXPECT_EQ(dprobs,
            (std::vector<double>{101, 101, 404, 404, 909, 909, 1616, 0}));
}

TEST(HostMoeKernelsTest, GroupedLinearIsEachRowsExpertsLinearLayer) {
  MoeLayout layout;
  ASSERT_TRUE(moeLayout(4, 2, 3, kIndices.data(), layout).ok());
  const int64_t in = 2, out = 3, rows = 8;
  std::vector<double> x(rows * in), w(3 * out * in); // [E, out, in]
  for (size_t i = 0; i < x.size(); ++i)
    x[i] = 0.5 * static_cast<double>(i) - 3;
  for (size_t i = 0; i < w.size(); ++i)
    w[i] = std::sin(static_cast<double>(i));
  std::vector<double> y(rows * out, -1);
  moeGroupedLinear<double>(pool(), rows, in, out, layout, x.data(), w.data(),
                           /*transposeWeight=*/true, y.data());
  const int64_t expertOfRow[] = {0, 0, 0, 1, 1, 2, 2, -1};
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t o = 0; o < out; ++o) {
      double expected = 0;
      if (expertOfRow[r] >= 0)
        for (int64_t i = 0; i < in; ++i)
          expected += x[r * in + i] * w[(expertOfRow[r] * out + o) * in + i];
      EXPECT_NEAR(y[r * out + o], expected, 1e-12) << "row " << r;
    }
  // The weight gradient: expert e's x_e^T dy_e, in [E, out, in].
  std::vector<double> dy(rows * out, 1.0), dw(w.size(), -1);
  moeGroupedLinearWeightGrad<double>(pool(), in, out, layout, x.data(),
                                     dy.data(), true, dw.data());
  for (int64_t e = 0; e < 3; ++e)
    for (int64_t o = 0; o < out; ++o)
      for (int64_t i = 0; i < in; ++i) {
        double expected = 0;
        for (int64_t r = 0; r < rows; ++r)
          if (expertOfRow[r] == e)
            expected += x[r * in + i];
        EXPECT_NEAR(dw[(e * out + o) * in + i], expected, 1e-12);
      }
}

TEST(HostMoeKernelsTest, ExpertBiasSelectsButDoesNotWeigh) {
  // 2 tokens, 4 experts, sigmoid top-2 normalized. Without a bias token 0
  // takes experts 0 and 1; a bias of 0.5 on expert 3 makes it take 0 and
  // 3, weighted by their sigmoids alone; moving the bias without changing
  // the choice changes nothing, and its VJP is the unbiased one's.
  std::vector<double> logits = {2, 1, 0, -1, 0, 0.5, 1, 1.5};
  MoeRouter router;
  router.tokens = 2;
  router.experts = 4;
  router.topk = 2;
  router.sigmoid = true;
  router.normalize = true;
  std::vector<double> bias = {0, 0, 0, 0.5};
  router.expertBias = bias.data();
  std::vector<double> probs(4), probs2(4);
  std::vector<int32_t> indices(4), indices2(4);
  moeRouteForward<double>(pool(), router, logits.data(), probs.data(),
                          indices.data());
  EXPECT_EQ(indices, (std::vector<int32_t>{0, 3, 3, 2}));
  auto sig = [](double x) { return 1.0 / (1.0 + std::exp(-x)); };
  EXPECT_NEAR(probs[0], sig(2) / (sig(-1) + sig(2)), 1e-15);
  EXPECT_NEAR(probs[1], sig(-1) / (sig(-1) + sig(2)), 1e-15);
  bias[3] = 0.6;
  bias[1] = -0.01;
  moeRouteForward<double>(pool(), router, logits.data(), probs2.data(),
                          indices2.data());
  EXPECT_EQ(indices2, indices);
  EXPECT_EQ(probs2, probs);
  std::vector<double> dprobs = {1, -2, 0.5, 3}, dlogits(8), dlogits2(8);
  moeRouteBackward<double>(pool(), router, logits.data(), indices.data(),
                           dprobs.data(), dlogits.data());
  bias[3] = 0.5;
  moeRouteBackward<double>(pool(), router, logits.data(), indices.data(),
                           dprobs.data(), dlogits2.data());
  EXPECT_EQ(dlogits, dlogits2);
  EXPECT_EQ(dlogits[1], 0.0); // expert 1: not chosen with the bias
}

TEST(HostMoeKernelsTest, CapacityKeepsTheHighestWeightsOrTheFirstTokens) {
  // 4 tokens, 2 experts, top-1: every token prefers expert 0, with softmax
  // weights rising with the token; capacity ceil(4 / 2 * 0.5) = 1.
  std::vector<double> logits = {1, 0, 2, 0, 3, 0, 4, 0};
  MoeRouter router;
  router.tokens = 4;
  router.experts = 2;
  router.topk = 1;
  router.normalize = false; // the full softmax's entry
  router.capacityFactor = 0.5;
  std::vector<double> probs(4);
  std::vector<int32_t> indices(4);
  moeRouteForward<double>(pool(), router, logits.data(), probs.data(),
                          indices.data());
  EXPECT_EQ(indices, (std::vector<int32_t>{-1, -1, -1, 0}));
  EXPECT_NEAR(probs[3], 1.0 / (1.0 + std::exp(-4.0)), 1e-15);
  EXPECT_EQ(probs[0], 0.0);
  router.dropByPosition = true;
  moeRouteForward<double>(pool(), router, logits.data(), probs.data(),
                          indices.data());
  EXPECT_EQ(indices, (std::vector<int32_t>{0, -1, -1, -1}));
  EXPECT_NEAR(probs[0], 1.0 / (1.0 + std::exp(-1.0)), 1e-15);
}

TEST(HostMoeKernelsTest, CapacityTiesKeepTheEarlierToken) {
  // Dropping by weight ranks an expert's slots by (weight, token position):
  // 4 tokens with equal logits, top-1 of 2 experts, capacity 1 each. Every
  // token prefers expert 0 (ties to the lower expert) with the same weight,
  // so token 0 is kept, whatever order the tokens were scored in; with a
  // logit 1e-9 higher, token 2 takes the place.
  std::vector<double> logits = {1, 0, 1, 0, 1, 0, 1, 0};
  MoeRouter router;
  router.tokens = 4;
  router.experts = 2;
  router.topk = 1;
  router.normalize = false;
  router.capacityFactor = 0.5;
  std::vector<double> probs(4);
  std::vector<int32_t> indices(4);
  moeRouteForward<double>(pool(), router, logits.data(), probs.data(),
                          indices.data());
  EXPECT_EQ(indices, (std::vector<int32_t>{0, -1, -1, -1}));
  logits[4] = 1.0 + 1e-9;
  moeRouteForward<double>(pool(), router, logits.data(), probs.data(),
                          indices.data());
  EXPECT_EQ(indices, (std::vector<int32_t>{-1, -1, 0, -1}));
}

TEST(HostMoeKernelsTest, TopKTiesGoToTheLowerExpert) {
  std::vector<double> logits = {0.5, 0.5, 0.5};
  MoeRouter router;
  router.tokens = 1;
  router.experts = 3;
  router.topk = 2;
  router.normalize = true;
  std::vector<double> probs(2);
  std::vector<int32_t> indices(2);
  moeRouteForward<double>(pool(), router, logits.data(), probs.data(),
                          indices.data());
  EXPECT_EQ(indices, (std::vector<int32_t>{0, 1}));
  EXPECT_EQ(probs, (std::vector<double>{0.5, 0.5}));
}

// Group-limited routing over 3 groups of 2 experts, keeping 1: each group
// is scored by the sum of its 2 scores. The logits' sums pick group 0
// (5 > 2 > 1); the sigmoids' pick group 1 (1.462 > 1.266 > 1.245), whose
// tie goes to the lower expert. The plain top-2 would be experts 0 and 2.
TEST(HostMoeKernelsTest, GroupLimitedRoutingScoresGroupsByTheWeightsScores) {
  std::vector<double> logits = {6, -1, 1, 1, 0.5, 0.5};
  MoeRouter router;
  router.tokens = 1;
  router.experts = 6;
  router.topk = 2;
  router.normalize = true;
  router.numGroups = 3;
  router.groupTopk = 1;
  std::vector<double> probs(2);
  std::vector<int32_t> indices(2);
  moeRouteForward<double>(pool(), router, logits.data(), probs.data(),
                          indices.data());
  EXPECT_EQ(indices, (std::vector<int32_t>{0, 1}));
  EXPECT_DOUBLE_EQ(probs[0], 1.0 / (1.0 + std::exp(-7.0)));

  router.sigmoid = true;
  moeRouteForward<double>(pool(), router, logits.data(), probs.data(),
                          indices.data());
  EXPECT_EQ(indices, (std::vector<int32_t>{2, 3}));
  EXPECT_EQ(probs, (std::vector<double>{0.5, 0.5}));
  // The backward pass recomputes the same experts: only theirs get a
  // gradient.
  std::vector<double> dprobs = {1, 0}, dlogits(6, -7);
  moeRouteBackward<double>(pool(), router, logits.data(), indices.data(),
                           dprobs.data(), dlogits.data());
  EXPECT_EQ(dlogits[0], 0.0);
  EXPECT_EQ(dlogits[1], 0.0);
  EXPECT_NE(dlogits[2], 0.0);
  EXPECT_NE(dlogits[3], 0.0);
  EXPECT_EQ(dlogits[4], 0.0);
  EXPECT_EQ(dlogits[5], 0.0);
}

} // namespace

namespace {

// Expert parallelism's blocks: 3 tokens, top-2 of 4 experts over 2 ranks
// (rank 0 experts 0-1, rank 1 experts 2-3): token 0 -> (0, 3), 1 -> (2, 1),
// 2 -> (1, dropped). Permuted rows: expert 0 token 0, expert 1 tokens 1
// and 2, expert 2 token 1, expert 3 token 0, then one zero row.
const std::vector<int32_t> kSplitIndices = {0, 3, 2, 1, 1, -1};

TEST(HostMoeKernelsTest, DispatchBlocksHoldEachRanksExpertsThenZeros) {
  MoeLayout layout;
  ASSERT_TRUE(moeLayout(3, 2, 4, kSplitIndices.data(), layout).ok());
  const std::vector<float> rows = {10, 11, 12, 13, 14, 0};
  std::vector<float> blocks(12, -1);
  moeDispatchBlocks<float>(6, 1, 2, layout, /*combine=*/false, rows.data(),
                           blocks.data());
  EXPECT_EQ(blocks, (std::vector<float>{10, 11, 12, 0, 0, 0, //
                                        13, 14, 0, 0, 0, 0}));
  std::vector<int32_t> experts(12, 7);
  moeDispatchExperts(6, 2, layout, experts.data());
  EXPECT_EQ(experts, (std::vector<int32_t>{0, 1, 1, -1, -1, -1, //
                                           0, 1, -1, -1, -1, -1}));
  std::vector<float> back(6, -1);
  moeDispatchBlocks<float>(6, 1, 2, layout, /*combine=*/true, blocks.data(),
                           back.data());
  EXPECT_EQ(back, rows);
}

} // namespace
