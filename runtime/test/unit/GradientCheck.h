// Finite-difference gradient checks in double, shared by the host kernels'
// gradient tests (HostGradientTest.cpp, HostGradientAttentionTest.cpp).
//
// For each op, L = sum(forward(inputs) * u) with a random upstream gradient
// u; the backward kernel's gradients (given dy = u) are compared with
// central differences (L(x + h e_i) - L(x - h e_i)) / 2h, h = 1e-6, by the
// norm-wise relative error ||analytic - numeric||_2 / ||numeric||_2, which
// must be at most 1e-6. (Element-wise ratios are meaningless for elements
// near zero, where the difference is all rounding noise.)
#ifndef MTRT_TEST_UNIT_GRADIENTCHECK_H
#define MTRT_TEST_UNIT_GRADIENTCHECK_H

#include "host/ThreadPool.h"

#include "gtest/gtest.h"

#include <algorithm>
#include <cmath>
#include <functional>
#include <numeric>
#include <random>
#include <string>
#include <vector>

namespace mtrt::test {

using Vec = std::vector<double>;
using Forward = std::function<Vec()>;

inline host::ThreadPool &pool() {
  static host::ThreadPool instance(2);
  return instance;
}

inline Vec randomVec(size_t n, uint64_t seed, double lo = -1, double hi = 1) {
  std::mt19937_64 engine(seed);
  std::uniform_real_distribution<double> dist(lo, hi);
  Vec v(n);
  for (double &x : v)
    x = dist(engine);
  return v;
}

inline double dot(const Vec &a, const Vec &b) {
  return std::inner_product(a.begin(), a.end(), b.begin(), 0.0);
}

/// An input that the forward closure reads, and its analytic gradient.
struct Checked {
  std::string name;
  Vec *input;
  Vec analytic;
};

constexpr double kStep = 1e-6;
constexpr double kTolerance = 1e-6;

inline void expectGradientsMatch(const Forward &forward, const Vec &upstream,
                                 const std::vector<Checked> &checks) {
  for (const Checked &check : checks) {
    Vec &x = *check.input;
    ASSERT_EQ(check.analytic.size(), x.size()) << check.name;
    double diff = 0, norm = 0;
    for (size_t i = 0; i < x.size(); ++i) {
      double saved = x[i];
      x[i] = saved + kStep;
      double plus = dot(forward(), upstream);
      x[i] = saved - kStep;
      double minus = dot(forward(), upstream);
      x[i] = saved;
      double numeric = (plus - minus) / (2 * kStep);
      diff += (check.analytic[i] - numeric) * (check.analytic[i] - numeric);
      norm += numeric * numeric;
    }
    double relative = std::sqrt(diff) / std::max(std::sqrt(norm), 1e-12);
    EXPECT_LE(relative, kTolerance)
        << check.name << ": relative error " << relative << " (norm "
        << std::sqrt(norm) << ")";
    EXPECT_GT(norm, 0) << check.name << ": the gradient is identically zero";
  }
}

} // namespace mtrt::test

#endif // MTRT_TEST_UNIT_GRADIENTCHECK_H
