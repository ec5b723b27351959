// Tests of the host's linear_cross_entropy kernel: for every chunk size, its
// loss and gradients equal the unfused ops' (linear, cross_entropy,
// cross_entropy_grad for a loss gradient of one, then the two gradient
// GEMMs), bit for bit with one chunk and within rounding with several.
#include "host/ThreadPool.h"
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
                               c.reduction, scratch.data(), fusedLoss.data(),
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
