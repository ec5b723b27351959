// Tests of the host's linear_cross_entropy kernel: for every chunk size, its
// loss and gradients equal the unfused ops' (linear, cross_entropy,
// cross_entropy_grad for a loss gradient of one, then the two gradient
// GEMMs), bit for bit with one chunk and within rounding with several; and
// typed bf16, the same ops with the logits and their gradient rounded to
// bf16 where the CUDA kernel stores them, whatever the thread count.
#include "host/ThreadPool.h"
#include "host/kernels/Bf16Rounding.h"
#include "host/kernels/Kernels.h"

#include "gtest/gtest.h"

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

class HostLinearCrossEntropy : public ::testing::TestWithParam<Case> {};

TEST_P(HostLinearCrossEntropy, EqualsTheUnfusedOps) {
  const Case c = GetParam();
  const int64_t rows = 23, in = 6, vocab = 11;
  std::vector<double> x(rows * in), w(in * vocab);
  for (size_t i = 0; i < x.size(); ++i)
    x[i] = std::sin(0.7 * static_cast<double>(i)) * 1.5;
  for (size_t i = 0; i < w.size(); ++i)
    w[i] = std::cos(0.3 * static_cast<double>(i) + 0.1);
  std::vector<int32_t> labels(rows);
  for (int64_t r = 0; r < rows; ++r)
    labels[r] = r % 5 == 3 ? -100 : static_cast<int32_t>((r * 7) % vocab);

  // The unfused ops.
  std::vector<double> logits(rows * vocab), dlogits(rows * vocab);
  std::vector<double> loss(1), one(1, 1.0), dx(rows * in), dw(in * vocab);
  linearForward<double>(pool(), rows, in, vocab, x.data(), w.data(),
                        c.transposeWeight, nullptr, logits.data());
  ASSERT_TRUE(crossEntropyForward<double>(pool(), rows, vocab, logits.data(),
                                          labels.data(), -100, c.reduction,
                                          loss.data())
                  .ok());
  ASSERT_TRUE(crossEntropyBackward<double>(pool(), rows, vocab, logits.data(),
                                           labels.data(), -100, c.reduction,
                                           one.data(), dlogits.data())
                  .ok());
  linearBackward<double>(pool(), rows, in, vocab, x.data(), w.data(),
                         c.transposeWeight, dlogits.data(), dx.data(),
                         dw.data(), nullptr, false);

  for (int64_t chunk : {int64_t(1), int64_t(4), int64_t(7), rows}) {
    std::vector<double> scratch(chunk * vocab), fusedLoss(1),
        fusedDx(rows * in), fusedDw(in * vocab, 1e9);
    linearCrossEntropy<double>(pool(), rows, in, vocab, chunk, x.data(),
                               w.data(), c.transposeWeight, labels.data(), -100,
                               c.reduction, /*bf16Logits=*/false,
                               scratch.data(), fusedLoss.data(),
                               fusedDx.data(), fusedDw.data());
    EXPECT_EQ(fusedLoss[0], loss[0]) << "chunk " << chunk;
    for (size_t i = 0; i < dx.size(); ++i)
      EXPECT_EQ(fusedDx[i], dx[i]) << "chunk " << chunk << ", dx " << i;
    for (size_t i = 0; i < dw.size(); ++i) {
      if (chunk == rows)
        EXPECT_EQ(fusedDw[i], dw[i]) << "dw " << i;
      else
        EXPECT_NEAR(fusedDw[i], dw[i], 1e-12) << "chunk " << chunk << ", dw "
                                              << i;
    }
  }
}

/// The fused op's results for bf16-valued x and W in f32 storage, with
/// its logits rounded to bf16 (a bf16-typed op), on `threads` threads.
struct Bf16Run {
  std::vector<float> loss, dx, dw;
};

Bf16Run runBf16(int threads, const Case &c, int64_t rows, int64_t in,
                int64_t vocab, int64_t chunk, const std::vector<float> &x,
                const std::vector<float> &w,
                const std::vector<int32_t> &labels) {
  ThreadPool threadPool(threads);
  Bf16Run run{std::vector<float>(1), std::vector<float>(rows * in),
              std::vector<float>(in * vocab)};
  std::vector<float> scratch(chunk * vocab);
  linearCrossEntropy<float>(threadPool, rows, in, vocab, chunk, x.data(),
                            w.data(), c.transposeWeight, labels.data(), -100,
                            c.reduction, /*bf16Logits=*/true, scratch.data(),
                            run.loss.data(), run.dx.data(), run.dw.data());
  return run;
}

TEST_P(HostLinearCrossEntropy, Bf16RoundsWhereTheUnfusedOpsStoreBf16) {
  const Case c = GetParam();
  const int64_t rows = 40, in = 16, vocab = 37;
  std::vector<float> x(rows * in), w(in * vocab);
  for (size_t i = 0; i < x.size(); ++i)
    x[i] = roundToBf16(std::sin(0.7f * static_cast<float>(i)) * 1.5f);
  for (size_t i = 0; i < w.size(); ++i)
    w[i] = roundToBf16(std::cos(0.3f * static_cast<float>(i) + 0.1f));
  std::vector<int32_t> labels(rows);
  for (int64_t r = 0; r < rows; ++r)
    labels[r] = r % 5 == 3 ? -100 : static_cast<int32_t>((r * 7) % vocab);

  // The unfused bf16 program: the linear's logits and cross_entropy_grad's
  // gradient are bf16 values, the loss f32.
  std::vector<float> logits(rows * vocab), dlogits(rows * vocab);
  std::vector<float> loss(1), one(1, 1.0f), dx(rows * in), dw(in * vocab);
  linearForward<float>(pool(), rows, in, vocab, x.data(), w.data(),
                       c.transposeWeight, nullptr, logits.data());
  roundAllToBf16(logits.data(), rows * vocab);
  ASSERT_TRUE(crossEntropyForward<float>(pool(), rows, vocab, logits.data(),
                                         labels.data(), -100, c.reduction,
                                         loss.data())
                  .ok());
  ASSERT_TRUE(crossEntropyBackward<float>(pool(), rows, vocab, logits.data(),
                                          labels.data(), -100, c.reduction,
                                          one.data(), dlogits.data())
                  .ok());
  roundAllToBf16(dlogits.data(), rows * vocab);
  linearBackward<float>(pool(), rows, in, vocab, x.data(), w.data(),
                        c.transposeWeight, dlogits.data(), dx.data(),
                        dw.data(), nullptr, false);

  for (int64_t chunk : {int64_t(7), rows}) {
    Bf16Run fused = runBf16(3, c, rows, in, vocab, chunk, x, w, labels);
    EXPECT_EQ(fused.loss[0], loss[0]) << "chunk " << chunk;
    EXPECT_EQ(fused.dx, dx) << "chunk " << chunk;
    for (size_t i = 0; i < dw.size(); ++i) {
      if (chunk == rows)
        EXPECT_EQ(fused.dw[i], dw[i]) << "dw " << i;
      else
        EXPECT_NEAR(fused.dw[i], dw[i], 1e-6f) << "chunk " << chunk
                                               << ", dw " << i;
    }
    // Each rounding is elementwise: the thread count changes no bit.
    Bf16Run single = runBf16(1, c, rows, in, vocab, chunk, x, w, labels);
    EXPECT_EQ(single.loss, fused.loss) << "chunk " << chunk;
    EXPECT_EQ(single.dx, fused.dx) << "chunk " << chunk;
    EXPECT_EQ(single.dw, fused.dw) << "chunk " << chunk;
  }
}

INSTANTIATE_TEST_SUITE_P(
    Layouts, HostLinearCrossEntropy,
    ::testing::Values(Case{true, LossReduction::Mean},
                      Case{false, LossReduction::Mean},
                      Case{true, LossReduction::Sum}));

TEST(HostScale, MultipliesEveryElement) {
  std::vector<float> x = {1.5f, -2.0f, 0.25f}, y(3);
  scaleForward<float>(pool(), 3, x.data(), 4.0f, y.data());
  EXPECT_EQ(y, (std::vector<float>{6.0f, -8.0f, 1.0f}));
}

} // namespace
