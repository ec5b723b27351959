// Tests of train::ExactSquareSum: the distributed optimizer's gradient norm
// is one number however the elements are split and ordered.
#include "train/ExactSquareSum.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <random>
#include <vector>

using mtrt::train::ExactSquareSum;

namespace {

/// Values over the whole float range: wide exponents, subnormals, zeros.
std::vector<float> wideFloats(size_t n, unsigned seed) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> mantissa(-1.0f, 1.0f);
  std::uniform_int_distribution<int> exponent(-40, 20);
  std::vector<float> x(n);
  for (size_t i = 0; i < n; ++i)
    x[i] = std::ldexp(mantissa(rng), exponent(rng));
  x[0] = 0.0f;
  x[1] = std::numeric_limits<float>::denorm_min();
  x[2] = -std::numeric_limits<float>::max() / 1e10f;
  x[3] = std::numeric_limits<float>::min();
  return x;
}

/// The exact sum of `x`'s squares split at `cuts` into accumulators merged
/// through their limbs, as ranks do.
double splitSum(const std::vector<float> &x, std::vector<size_t> cuts) {
  cuts.insert(cuts.begin(), 0);
  cuts.push_back(x.size());
  ExactSquareSum total(false);
  for (size_t k = 0; k + 1 < cuts.size(); ++k) {
    ExactSquareSum part(false);
    part.addSquares(x.data() + cuts[k],
                    static_cast<int64_t>(cuts[k + 1] - cuts[k]));
    total.addLimbs(part.limbs());
  }
  return total.value();
}

TEST(ExactSquareSumTest, OneValueWhateverTheSplitAndOrder) {
  std::vector<float> x = wideFloats(10007, 1);
  double whole = splitSum(x, {});
  EXPECT_EQ(whole, splitSum(x, {1, 5000}));
  EXPECT_EQ(whole, splitSum(x, {3333, 3334, 9999}));
  std::vector<float> shuffled = x;
  std::shuffle(shuffled.begin(), shuffled.end(), std::mt19937(7));
  EXPECT_EQ(whole, splitSum(shuffled, {4096}));
  // A plain float or double sum depends on the order; the exact one is the
  // sum itself: within a double's rounding of a long double reference.
  long double reference = 0;
  for (float v : x)
    reference += static_cast<long double>(v) * v;
  EXPECT_NEAR(whole, static_cast<double>(reference),
              1e-15 * static_cast<double>(reference));
}

TEST(ExactSquareSumTest, SmallAndLargeSquaresAreExact) {
  ExactSquareSum sum(false);
  float tiny = std::numeric_limits<float>::denorm_min();
  sum.addSquares(&tiny, 1);
  EXPECT_EQ(sum.value(), std::ldexp(1.0, -298));
  float values[] = {3.0f, 4.0f};
  ExactSquareSum pythagoras(false);
  pythagoras.addSquares(values, 2);
  EXPECT_EQ(pythagoras.value(), 25.0);
  // Squares 2^40 apart.
  float big = 1.0f, small = std::ldexp(1.0f, -20);
  ExactSquareSum mixed(false);
  for (int i = 0; i < 4; ++i)
    mixed.addSquares(&small, 1);
  mixed.addSquares(&big, 1);
  mixed.addSquares(&big, 1);
  EXPECT_EQ(mixed.value(), 2.0 + std::ldexp(1.0, -38));
}

TEST(ExactSquareSumTest, DoublesAndTheDeviceHistogram) {
  std::vector<double> d = {1e-300, -2.5, 1e150, 0.0, 3.0};
  ExactSquareSum forward(true), backward(true);
  forward.addSquares(d.data(), static_cast<int64_t>(d.size()));
  std::reverse(d.begin(), d.end());
  backward.addSquares(d.data(), static_cast<int64_t>(d.size()));
  EXPECT_EQ(forward.value(), backward.value());
  EXPECT_DOUBLE_EQ(forward.value(), 1e300);

  // The histogram a device kernel makes: per exponent, the squared
  // mantissas' sum (here of 1.5 and -1.5: mantissa 0xC00000, exponent 127).
  std::vector<uint64_t> histogram(2 * 256, 0);
  uint64_t m = 0xC00000;
  histogram[2 * 127] = 2 * m * m;
  ExactSquareSum fromDevice(false);
  fromDevice.addFloatHistogram(histogram.data());
  EXPECT_EQ(fromDevice.value(), 4.5);
}

TEST(ExactSquareSumTest, NonFiniteElementsGiveNaNOnEveryRank) {
  float x[] = {1.0f, std::numeric_limits<float>::infinity()};
  ExactSquareSum rank0(false), rank1(false);
  rank0.addSquares(x, 1);
  rank1.addSquares(x + 1, 1);
  ExactSquareSum total(false);
  total.addLimbs(rank0.limbs());
  total.addLimbs(rank1.limbs());
  EXPECT_TRUE(std::isnan(total.value()));
}

} // namespace
