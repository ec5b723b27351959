// Tests of the host's chunked vocabulary-parallel output layer
// (linear_vocab_max, linear_vocab_partials, linear_vocab_cross_entropy_grad)
// on two vocabulary blocks, as two tensor-parallel ranks hold them: for
// every chunk size each equals the unfused ops of its block (linear, then
// vocab_max, vocab_partials, vocab_cross_entropy_grad and the two gradient
// GEMMs), bit for bit but for the weight gradient's chunk order; the blocks'
// statistics, loss and summed dx equal the whole vocabulary's cross-entropy
// in float64; typed bf16, the same ops with the logits and their gradient
// rounded to bf16, whatever the thread count.
#include "host/ThreadPool.h"
#include "host/kernels/Bf16Rounding.h"
#include "host/kernels/Kernels.h"

#include "gtest/gtest.h"

#include <algorithm>
#include <cmath>
#include <vector>

using namespace mtrt::host;

namespace {

ThreadPool &pool() {
  static ThreadPool instance(3);
  return instance;
}

struct Case {
  bool transposeWeight;
  LossReduction reduction;
};

constexpr int64_t kBlocks = 2;

/// The inputs: x [rows, in], the whole weight's blocks (each [in, vocab],
/// or [vocab, in] transposed) and labels over the whole vocabulary, with
/// some ignored.
template <typename T> struct Inputs {
  int64_t rows, in, vocab; // vocab: one block's
  std::vector<T> x;
  std::vector<std::vector<T>> blocks;
  std::vector<int32_t> labels;
};

template <typename T>
Inputs<T> makeInputs(const Case &c, int64_t rows, int64_t in, int64_t vocab,
                     bool bf16Values) {
  Inputs<T> inputs{rows, in, vocab, std::vector<T>(rows * in), {}, {}};
  auto value = [&](double v) {
    return bf16Values ? static_cast<T>(roundToBf16(static_cast<float>(v)))
                      : static_cast<T>(v);
  };
  for (int64_t i = 0; i < rows * in; ++i)
    inputs.x[i] = value(std::sin(0.7 * static_cast<double>(i)) * 1.5);
  int64_t whole = vocab * kBlocks;
  for (int64_t b = 0; b < kBlocks; ++b) {
    std::vector<T> w(in * vocab);
    for (int64_t i = 0; i < in; ++i)
      for (int64_t v = 0; v < vocab; ++v) {
        double g = std::cos(
            0.3 * static_cast<double>(i * whole + b * vocab + v) + 0.1);
        w[c.transposeWeight ? v * in + i : i * vocab + v] = value(g);
      }
    inputs.blocks.push_back(w);
  }
  for (int64_t r = 0; r < rows; ++r)
    inputs.labels.push_back(r % 5 == 3 ? -100
                                       : static_cast<int32_t>((r * 7) % whole));
  return inputs;
}

/// One block's results, and the blocks' combined statistics.
template <typename T> struct Results {
  std::vector<std::vector<T>> max, partials, dx, dw;
  std::vector<T> globalMax, globalPartials;
};

/// The unfused ops of each block (the logits and their gradient rounded to
/// bf16 with `bf16`), the all-reduces as sums and maxima in block order.
template <typename T>
Results<T> unfused(const Case &c, const Inputs<T> &p, bool bf16,
                   const T *dloss) {
  Results<T> out;
  int64_t rows = p.rows, vocab = p.vocab;
  std::vector<std::vector<T>> logits;
  out.globalMax.assign(rows, -INFINITY);
  for (int64_t b = 0; b < kBlocks; ++b) {
    std::vector<T> l(rows * vocab), m(rows);
    linearForward<T>(pool(), rows, p.in, vocab, p.x.data(), p.blocks[b].data(),
                     c.transposeWeight, nullptr, l.data());
    if (bf16)
      roundAllToBf16(l.data(), rows * vocab);
    vocabMax<T>(pool(), rows, vocab, l.data(), m.data());
    for (int64_t r = 0; r < rows; ++r)
      out.globalMax[r] = std::max(out.globalMax[r], m[r]);
    logits.push_back(l);
    out.max.push_back(m);
  }
  out.globalPartials.assign(rows * 2, T(0));
  for (int64_t b = 0; b < kBlocks; ++b) {
    std::vector<T> partials(rows * 2);
    vocabPartials<T, int32_t>(pool(), rows, vocab, b * vocab, logits[b].data(),
                              p.labels.data(), out.globalMax.data(),
                              partials.data());
    for (int64_t i = 0; i < rows * 2; ++i)
      out.globalPartials[i] += partials[i];
    out.partials.push_back(partials);
  }
  for (int64_t b = 0; b < kBlocks; ++b) {
    std::vector<T> dlogits(rows * vocab), dx(rows * p.in), dw(p.in * vocab);
    vocabCrossEntropyGrad<T, int32_t>(
        pool(), rows, vocab, b * vocab, logits[b].data(), p.labels.data(), -100,
        c.reduction, dloss, out.globalMax.data(), out.globalPartials.data(),
        dlogits.data());
    if (bf16)
      roundAllToBf16(dlogits.data(), rows * vocab);
    linearBackward<T>(pool(), rows, p.in, vocab, p.x.data(), p.blocks[b].data(),
                      c.transposeWeight, dlogits.data(), dx.data(), dw.data(),
                      nullptr, false);
    out.dx.push_back(dx);
    out.dw.push_back(dw);
  }
  return out;
}

/// The chunked ops of each block, fed the unfused run's combined statistics
/// (so that each op is compared alone).
template <typename T>
Results<T> fused(ThreadPool &threads, const Case &c, const Inputs<T> &p,
                 int64_t chunk, bool bf16, const T *dloss,
                 const Results<T> &statistics) {
  Results<T> out;
  int64_t rows = p.rows, vocab = p.vocab;
  std::vector<T> scratch(chunk * vocab);
  for (int64_t b = 0; b < kBlocks; ++b) {
    std::vector<T> m(rows, T(-7)), partials(rows * 2, T(-7)),
        dx(rows * p.in, T(-7)), dw(p.in * vocab, T(1e9));
    const T *w = p.blocks[b].data();
    linearVocabMax<T>(threads, rows, p.in, vocab, chunk, p.x.data(), w,
                      c.transposeWeight, bf16, scratch.data(), m.data());
    linearVocabPartials<T, int32_t>(
        threads, rows, p.in, vocab, chunk, b * vocab, p.x.data(), w,
        c.transposeWeight, p.labels.data(), statistics.globalMax.data(), bf16,
        scratch.data(), partials.data());
    linearVocabCrossEntropyGrad<T, int32_t>(
        threads, rows, p.in, vocab, chunk, b * vocab, p.x.data(), w,
        c.transposeWeight, p.labels.data(), -100, c.reduction, dloss,
        statistics.globalMax.data(), statistics.globalPartials.data(), bf16,
        scratch.data(), dx.data(), dw.data());
    out.max.push_back(m);
    out.partials.push_back(partials);
    out.dx.push_back(dx);
    out.dw.push_back(dw);
  }
  return out;
}

class HostLinearVocab : public ::testing::TestWithParam<Case> {};

TEST_P(HostLinearVocab, EqualsTheUnfusedOpsOfEachBlock) {
  const Case c = GetParam();
  Inputs<double> p = makeInputs<double>(c, 23, 6, 11, false);
  const double dloss = 0.75;
  Results<double> want = unfused(c, p, false, &dloss);
  for (int64_t chunk : {int64_t(1), int64_t(4), int64_t(7), p.rows}) {
    Results<double> got = fused(pool(), c, p, chunk, false, &dloss, want);
    for (int64_t b = 0; b < kBlocks; ++b) {
      EXPECT_EQ(got.max[b], want.max[b]) << "chunk " << chunk;
      EXPECT_EQ(got.partials[b], want.partials[b]) << "chunk " << chunk;
      EXPECT_EQ(got.dx[b], want.dx[b]) << "chunk " << chunk;
      for (size_t i = 0; i < want.dw[b].size(); ++i) {
        if (chunk == p.rows)
          EXPECT_EQ(got.dw[b][i], want.dw[b][i]) << "dw " << i;
        else
          EXPECT_NEAR(got.dw[b][i], want.dw[b][i], 1e-12)
              << "chunk " << chunk << ", dw " << i;
      }
    }
  }
}

TEST_P(HostLinearVocab, BlocksMakeTheWholeVocabularysLoss) {
  // The float64 reference: cross_entropy over the whole vocabulary's
  // logits (the blocks side by side) and its gradient's dx.
  const Case c = GetParam();
  Inputs<double> p = makeInputs<double>(c, 23, 6, 11, false);
  const double dloss = 1.0;
  Results<double> want = unfused(c, p, false, &dloss);
  int64_t rows = p.rows, vocab = p.vocab, whole = vocab * kBlocks;
  std::vector<double> logits(rows * whole), dlogits(rows * whole);
  for (int64_t b = 0; b < kBlocks; ++b) {
    std::vector<double> block(rows * vocab);
    linearForward<double>(pool(), rows, p.in, vocab, p.x.data(),
                          p.blocks[b].data(), c.transposeWeight, nullptr,
                          block.data());
    for (int64_t r = 0; r < rows; ++r)
      std::copy(block.begin() + r * vocab, block.begin() + (r + 1) * vocab,
                logits.begin() + r * whole + b * vocab);
  }
  std::vector<double> loss(1), vocabLoss(1);
  ASSERT_TRUE(crossEntropyForward<double>(pool(), rows, whole, logits.data(),
                                          p.labels.data(), -100, c.reduction,
                                          loss.data())
                  .ok());
  ASSERT_TRUE(crossEntropyBackward<double>(pool(), rows, whole, logits.data(),
                                           p.labels.data(), -100, c.reduction,
                                           &dloss, dlogits.data())
                  .ok());
  // The chunked ops' own statistics, combined as the all-reduces do.
  std::vector<double> scratch(3 * vocab), max(rows, -INFINITY),
      partials(rows * 2, 0.0), dx(rows * p.in, 0.0);
  for (int64_t b = 0; b < kBlocks; ++b) {
    std::vector<double> m(rows);
    linearVocabMax<double>(pool(), rows, p.in, vocab, 3, p.x.data(),
                           p.blocks[b].data(), c.transposeWeight, false,
                           scratch.data(), m.data());
    for (int64_t r = 0; r < rows; ++r)
      max[r] = std::max(max[r], m[r]);
  }
  for (int64_t b = 0; b < kBlocks; ++b) {
    std::vector<double> part(rows * 2);
    linearVocabPartials<double, int32_t>(
        pool(), rows, p.in, vocab, 3, b * vocab, p.x.data(), p.blocks[b].data(),
        c.transposeWeight, p.labels.data(), max.data(), false, scratch.data(),
        part.data());
    for (int64_t i = 0; i < rows * 2; ++i)
      partials[i] += part[i];
  }
  vocabCrossEntropy<double, int32_t>(rows, partials.data(), p.labels.data(),
                                     -100, c.reduction, vocabLoss.data());
  EXPECT_NEAR(vocabLoss[0], loss[0], 1e-12);
  for (int64_t b = 0; b < kBlocks; ++b) {
    std::vector<double> part(rows * p.in), dw(p.in * vocab);
    linearVocabCrossEntropyGrad<double, int32_t>(
        pool(), rows, p.in, vocab, 3, b * vocab, p.x.data(), p.blocks[b].data(),
        c.transposeWeight, p.labels.data(), -100, c.reduction, &dloss,
        max.data(), partials.data(), false, scratch.data(), part.data(),
        dw.data());
    for (int64_t i = 0; i < rows * p.in; ++i)
      dx[i] += part[i];
  }
  std::vector<double> wholeDx(rows * p.in);
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t i = 0; i < p.in; ++i) {
      double sum = 0;
      for (int64_t v = 0; v < whole; ++v) {
        const std::vector<double> &w = p.blocks[v / vocab];
        int64_t local = v % vocab;
        sum += dlogits[r * whole + v] *
               w[c.transposeWeight ? local * p.in + i : i * vocab + local];
      }
      wholeDx[r * p.in + i] = sum;
    }
  for (int64_t i = 0; i < rows * p.in; ++i)
    EXPECT_NEAR(dx[i], wholeDx[i], 1e-12) << "dx " << i;
}

TEST_P(HostLinearVocab, Bf16RoundsWhereTheUnfusedOpsStoreBf16) {
  const Case c = GetParam();
  Inputs<float> p = makeInputs<float>(c, 40, 16, 37, true);
  const float dloss = 1.0f;
  Results<float> want = unfused(c, p, true, &dloss);
  for (int64_t chunk : {int64_t(7), p.rows}) {
    Results<float> got = fused(pool(), c, p, chunk, true, &dloss, want);
    ThreadPool one(1);
    Results<float> single = fused(one, c, p, chunk, true, &dloss, want);
    for (int64_t b = 0; b < kBlocks; ++b) {
      EXPECT_EQ(got.max[b], want.max[b]) << "chunk " << chunk;
      EXPECT_EQ(got.partials[b], want.partials[b]) << "chunk " << chunk;
      EXPECT_EQ(got.dx[b], want.dx[b]) << "chunk " << chunk;
      for (size_t i = 0; i < want.dw[b].size(); ++i)
        EXPECT_NEAR(got.dw[b][i], want.dw[b][i], 1e-6f)
            << "chunk " << chunk << ", dw " << i;
      // Each rounding is elementwise: the thread count changes no bit.
      EXPECT_EQ(single.partials[b], got.partials[b]) << "chunk " << chunk;
      EXPECT_EQ(single.dx[b], got.dx[b]) << "chunk " << chunk;
      EXPECT_EQ(single.dw[b], got.dw[b]) << "chunk " << chunk;
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Layouts, HostLinearVocab,
                         ::testing::Values(Case{true, LossReduction::Mean},
                                           Case{false, LossReduction::Mean},
                                           Case{true, LossReduction::Sum}));

} // namespace
