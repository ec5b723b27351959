// Tests of the host kernels that bundles for several ranks add: bias_add,
// the initialization of parameter shards by global position, and the
// vocabulary-parallel embedding and cross-entropy (blocks combined as the
// collectives combine them equal the whole-vocabulary kernels).
#include "host/ThreadPool.h"
#include "host/kernels/Kernels.h"

#include "gtest/gtest.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

using namespace mtrt::host;

namespace {

ThreadPool &pool() {
  static ThreadPool instance(3);
  return instance;
}

TEST(HostParallelKernelsTest, BiasAddMatchesANaiveLoop) {
  const int64_t rows = 37, n = 5;
  std::vector<double> x(rows * n), bias(n), y(rows * n);
  for (size_t i = 0; i < x.size(); ++i)
    x[i] = 0.25 * static_cast<double>(i) - 3;
  for (int64_t j = 0; j < n; ++j)
    bias[j] = 1.5 * static_cast<double>(j) + 0.125;
  biasAddForward<double>(pool(), rows, n, x.data(), bias.data(), y.data());
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t j = 0; j < n; ++j)
      EXPECT_EQ(y[r * n + j], x[r * n + j] + bias[j]) << r << ", " << j;
}

TEST(HostParallelKernelsTest, AWholeShardHasInitNormalsBits) {
  const std::vector<int64_t> shape = {7, 9, 4}, zeros = {0, 0, 0};
  int64_t n = 7 * 9 * 4;
  std::vector<float> whole(n), shard(n);
  initNormal<float>(pool(), n, whole.data(), 0.02, 1234, 3);
  initNormalShard<float>(pool(), 3, shape.data(), zeros.data(), shape.data(),
                         shard.data(), 0.02, 1234, 3);
  EXPECT_EQ(std::memcmp(whole.data(), shard.data(), sizeof(float) * n), 0);
}

TEST(HostParallelKernelsTest, AShardDrawsItsGlobalPositions) {
  // A [6, 8] tensor; the shard is rows [2, 4) and columns [4, 8).
  const std::vector<int64_t> shape = {6, 8}, offsets = {2, 4}, local = {2, 4};
  std::vector<double> whole(48), shard(8);
  initNormal<double>(pool(), 48, whole.data(), 0.5, 99, 7);
  initNormalShard<double>(pool(), 2, shape.data(), offsets.data(), local.data(),
                          shard.data(), 0.5, 99, 7);
  for (int64_t r = 0; r < 2; ++r)
    for (int64_t c = 0; c < 4; ++c)
      EXPECT_EQ(shard[r * 4 + c], whole[(r + 2) * 8 + (c + 4)])
          << r << ", " << c;
}

/// Three blocks of an 12-token vocabulary, combined as the all-reduces
/// combine them (max, then sums), give cross_entropy's loss and gradient.
TEST(HostParallelKernelsTest, VocabularyBlocksGiveTheWholeCrossEntropy) {
  const int64_t rows = 5, vocab = 12, blocks = 3, block = vocab / blocks;
  const int64_t ignore = -100;
  std::vector<double> logits(rows * vocab);
  for (size_t i = 0; i < logits.size(); ++i)
    logits[i] = std::sin(0.7 * static_cast<double>(i)) * 4;
  std::vector<int32_t> labels = {3, 11, static_cast<int32_t>(ignore), 0, 6};
  for (LossReduction reduction :
       {LossReduction::Mean, LossReduction::Sum, LossReduction::None}) {
    int64_t lossCount = reduction == LossReduction::None ? rows : 1;
    std::vector<double> wholeLoss(lossCount), dloss(lossCount, 0.75);
    std::vector<double> wholeGrad(rows * vocab);
    ASSERT_TRUE(crossEntropyForward<double>(pool(), rows, vocab, logits.data(),
                                            labels.data(), ignore, reduction,
                                            wholeLoss.data())
                    .ok());
    ASSERT_TRUE(crossEntropyBackward<double>(pool(), rows, vocab,
                                             logits.data(), labels.data(),
                                             ignore, reduction, dloss.data(),
                                             wholeGrad.data())
                    .ok());
    // Each block's logits, contiguous as a rank holds them.
    std::vector<std::vector<double>> local(blocks);
    for (int64_t b = 0; b < blocks; ++b)
      for (int64_t r = 0; r < rows; ++r)
        local[b].insert(local[b].end(),
                        logits.begin() + r * vocab + b * block,
                        logits.begin() + r * vocab + (b + 1) * block);
    std::vector<double> max(rows, -INFINITY), partials(rows * 2, 0.0);
    for (int64_t b = 0; b < blocks; ++b) {
      std::vector<double> m(rows);
      vocabMax<double>(pool(), rows, block, local[b].data(), m.data());
      for (int64_t r = 0; r < rows; ++r)
        max[r] = std::max(max[r], m[r]);
    }
    for (int64_t b = 0; b < blocks; ++b) {
      std::vector<double> p(rows * 2);
      vocabPartials<double>(pool(), rows, block, b * block, local[b].data(),
                            labels.data(), max.data(), p.data());
      for (int64_t i = 0; i < rows * 2; ++i)
        partials[i] += p[i];
    }
    std::vector<double> loss(lossCount);
    vocabCrossEntropy<double>(rows, partials.data(), labels.data(), ignore,
                              reduction, loss.data());
    for (int64_t i = 0; i < lossCount; ++i)
      EXPECT_NEAR(loss[i], wholeLoss[i], 1e-12 * std::abs(wholeLoss[i]) + 1e-15)
          << i;
    for (int64_t b = 0; b < blocks; ++b) {
      std::vector<double> grad(rows * block);
      vocabCrossEntropyGrad<double>(pool(), rows, block, b * block,
                                    local[b].data(), labels.data(), ignore,
                                    reduction, dloss.data(), max.data(),
                                    partials.data(), grad.data());
      for (int64_t r = 0; r < rows; ++r)
        for (int64_t v = 0; v < block; ++v)
          EXPECT_NEAR(grad[r * block + v], wholeGrad[r * vocab + b * block + v],
                      1e-13)
              << "row " << r << ", token " << b * block + v;
    }
  }
}

/// In float, 2 or 4 blocks of a 256-token vocabulary (each more than half a
/// canonical leaf), their sums added as the all-reduce's rank tree adds
/// them, give cross_entropy's loss and gradient bit for bit.
TEST(HostParallelKernelsTest, VocabularyBlocksGiveCrossEntropysBits) {
  const int64_t rows = 6, vocab = 256, ignore = -100;
  std::vector<float> logits(rows * vocab);
  for (size_t i = 0; i < logits.size(); ++i)
    logits[i] = static_cast<float>(std::sin(0.37 * static_cast<double>(i)) * 6);
  std::vector<int32_t> labels = {3, 255, static_cast<int32_t>(ignore),
                                 0, 130, 64};
  std::vector<float> wholeLoss(1), dloss(1, 0.75f), wholeGrad(rows * vocab);
  ASSERT_TRUE(crossEntropyForward<float>(pool(), rows, vocab, logits.data(),
                                         labels.data(), ignore,
                                         LossReduction::Mean, wholeLoss.data())
                  .ok());
  ASSERT_TRUE(crossEntropyBackward<float>(
                  pool(), rows, vocab, logits.data(), labels.data(), ignore,
                  LossReduction::Mean, dloss.data(), wholeGrad.data())
                  .ok());
  for (int64_t blocks : {2, 4}) {
    int64_t block = vocab / blocks;
    std::vector<std::vector<float>> local(blocks), partial(blocks);
    std::vector<float> max(rows, -INFINITY);
    for (int64_t b = 0; b < blocks; ++b) {
      for (int64_t r = 0; r < rows; ++r)
        local[b].insert(local[b].end(), logits.begin() + r * vocab + b * block,
                        logits.begin() + r * vocab + (b + 1) * block);
      std::vector<float> m(rows);
      vocabMax<float>(pool(), rows, block, local[b].data(), m.data());
      for (int64_t r = 0; r < rows; ++r)
        max[r] = std::max(max[r], m[r]);
    }
    for (int64_t b = 0; b < blocks; ++b) {
      partial[b].resize(rows * 2);
      vocabPartials<float>(pool(), rows, block, b * block, local[b].data(),
                           labels.data(), max.data(), partial[b].data());
    }
    std::vector<float> partials(rows * 2);
    for (int64_t i = 0; i < rows * 2; ++i)
      partials[i] = blocks == 2 ? partial[0][i] + partial[1][i]
                                : (partial[0][i] + partial[1][i]) +
                                      (partial[2][i] + partial[3][i]);
    std::vector<float> loss(1);
    vocabCrossEntropy<float>(rows, partials.data(), labels.data(), ignore,
                             LossReduction::Mean, loss.data());
    EXPECT_EQ(loss[0], wholeLoss[0]) << blocks << " blocks";
    for (int64_t b = 0; b < blocks; ++b) {
      std::vector<float> grad(rows * block);
      vocabCrossEntropyGrad<float>(pool(), rows, block, b * block,
                                   local[b].data(), labels.data(), ignore,
                                   LossReduction::Mean, dloss.data(),
                                   max.data(), partials.data(), grad.data());
      for (int64_t r = 0; r < rows; ++r)
        for (int64_t v = 0; v < block; ++v)
          ASSERT_EQ(grad[r * block + v], wholeGrad[r * vocab + b * block + v])
              << blocks << " blocks, row " << r << ", token " << b * block + v;
    }
  }
}

/// The blocks' masked lookups sum to the whole lookup; each block's
/// gradient is its rows of the whole table's gradient.
TEST(HostParallelKernelsTest, VocabularyBlocksGiveTheWholeEmbedding) {
  const int64_t count = 7, vocab = 8, hidden = 3, blocks = 2;
  const int64_t block = vocab / blocks;
  std::vector<double> table(vocab * hidden), dout(count * hidden);
  for (size_t i = 0; i < table.size(); ++i)
    table[i] = 0.5 * static_cast<double>(i) - 2;
  for (size_t i = 0; i < dout.size(); ++i)
    dout[i] = 0.25 * static_cast<double>(i) + 1;
  std::vector<int64_t> ids = {7, 0, 3, 4, 3, 5, 7};
  std::vector<double> whole(count * hidden), wholeGrad(vocab * hidden);
  ASSERT_TRUE(embeddingForward<double>(pool(), count, vocab, hidden,
                                       table.data(), ids.data(), whole.data())
                  .ok());
  ASSERT_TRUE(embeddingBackward<double>(pool(), count, vocab, hidden,
                                        ids.data(), dout.data(),
                                        wholeGrad.data(), false)
                  .ok());
  std::vector<double> sum(count * hidden, 0.0);
  for (int64_t b = 0; b < blocks; ++b) {
    const double *rows = table.data() + b * block * hidden;
    std::vector<double> out(count * hidden), grad(block * hidden);
    vocabEmbeddingForward<double>(pool(), count, block, hidden, b * block, rows,
                                  ids.data(), out.data());
    for (size_t i = 0; i < sum.size(); ++i)
      sum[i] += out[i];
    vocabEmbeddingBackward<double>(pool(), count, block, hidden, b * block,
                                   ids.data(), dout.data(), grad.data());
    for (int64_t i = 0; i < block * hidden; ++i)
      EXPECT_EQ(grad[i], wholeGrad[b * block * hidden + i]) << b << ", " << i;
  }
  EXPECT_EQ(sum, whole);
}

} // namespace
