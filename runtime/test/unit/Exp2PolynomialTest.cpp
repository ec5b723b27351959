// Tests of mtrt::exp2Polynomial (core/Exp2Polynomial.h), the exponential
// that the Hopper attention forward may take on the FMA units: its error
// against exp2 over the range a softmax uses, and what it gives at the
// edges (a masked score's -inf, underflow).
#include "core/Exp2Polynomial.h"

#include <gtest/gtest.h>

#include <cmath>
#include <limits>

namespace {

TEST(Exp2PolynomialTest, WithinItsBoundOfExp2) {
  // Every 1/4096 over [-126, 20], and every float of [-1, 1] in steps of
  // 2^-20 (the rounding's ties and the polynomial's interval ends).
  double worst = 0, worstAt = 0;
  auto check = [&](float x) {
    double exact = std::exp2(static_cast<double>(x));
    double error = std::abs(mtrt::exp2Polynomial(x) - exact) / exact;
    if (error > worst) {
      worst = error;
      worstAt = x;
    }
  };
  for (int i = -126 * 4096; i <= 20 * 4096; ++i)
    check(static_cast<float>(i) / 4096.f);
  for (int i = -(1 << 20); i <= (1 << 20); ++i)
    check(std::ldexp(static_cast<float>(i), -20));
  EXPECT_LT(worst, 2.7e-6) << "at " << worstAt;
}

TEST(Exp2PolynomialTest, ZeroBelowTheNormalRange) {
  EXPECT_EQ(mtrt::exp2Polynomial(-std::numeric_limits<float>::infinity()), 0.f);
  EXPECT_EQ(mtrt::exp2Polynomial(-126.5f), 0.f);
  EXPECT_EQ(mtrt::exp2Polynomial(-1000.f), 0.f);
  float smallest = mtrt::exp2Polynomial(-126.f);
  EXPECT_NEAR(smallest / std::numeric_limits<float>::min(), 1.0, 3e-6);
  // Exact powers of two come out within the bound too.
  for (int n = -126; n <= 20; ++n)
    EXPECT_NEAR(mtrt::exp2Polynomial(static_cast<float>(n)) /
                    std::ldexp(1.0, n),
                1.0, 2.7e-6)
        << "2^" << n;
}

} // namespace
