// Gradient checks of the host backward kernels (norms, linear, matmul,
// activations, loss, shapes) against central differences in double; the
// method and tolerance are in GradientCheck.h.
// Attention, rope and embedding are in HostGradientAttentionTest.cpp.
#include "GradientCheck.h"
#include "host/ThreadPool.h"
#include "host/kernels/Kernels.h"

#include "gtest/gtest.h"

#include <cmath>
#include <functional>
#include <numeric>
#include <random>
#include <string>
#include <tuple>
#include <vector>

using namespace mtrt::host;
using namespace mtrt::test;

namespace {

//===----------------------------------------------------------------------===//
// Norms
//===----------------------------------------------------------------------===//

class LayerNormGradient : public testing::TestWithParam<bool> {};

TEST_P(LayerNormGradient, MatchesFiniteDifferences) {
  bool withBias = GetParam();
  const int64_t rows = 10, hidden = 8; // B=2, S=5, H=8
  Vec x = randomVec(rows * hidden, 1), w = randomVec(hidden, 2, 0.5, 1.5),
      b = randomVec(hidden, 3);
  Vec mean(rows), rstd(rows);
  Forward forward = [&] {
    Vec y(rows * hidden);
    layerNormForward<double>(pool(), rows, hidden, x.data(), w.data(),
                             withBias ? b.data() : nullptr, 1e-5, y.data(),
                             mean.data(), rstd.data());
    return y;
  };
  Vec u = randomVec(rows * hidden, 4);
  forward();
  Vec dx(x.size()), dw(w.size()), db(b.size());
  layerNormBackward<double>(pool(), rows, hidden, x.data(), w.data(),
                            mean.data(), rstd.data(), u.data(), dx.data(),
                            dw.data(), withBias ? db.data() : nullptr, false);
  std::vector<Checked> checks = {{"dx", &x, dx}, {"dweight", &w, dw}};
  if (withBias)
    checks.push_back({"dbias", &b, db});
  expectGradientsMatch(forward, u, checks);
}
INSTANTIATE_TEST_SUITE_P(Bias, LayerNormGradient, testing::Bool());

TEST(HostGradient, RmsNorm) {
  const int64_t rows = 10, hidden = 8;
  Vec x = randomVec(rows * hidden, 5), w = randomVec(hidden, 6, 0.5, 1.5);
  Vec rstd(rows);
  Forward forward = [&] {
    Vec y(rows * hidden);
    rmsNormForward<double>(pool(), rows, hidden, x.data(), w.data(), 1e-6,
                           y.data(), rstd.data());
    return y;
  };
  Vec u = randomVec(rows * hidden, 7);
  forward();
  Vec dx(x.size()), dw(w.size());
  rmsNormBackward<double>(pool(), rows, hidden, x.data(), w.data(),
                          rstd.data(), u.data(), dx.data(), dw.data(), false);
  expectGradientsMatch(forward, u, {{"dx", &x, dx}, {"dweight", &w, dw}});
}

//===----------------------------------------------------------------------===//
// Linear and matmul
//===----------------------------------------------------------------------===//

// (transposeWeight, withBias)
class LinearGradient
    : public testing::TestWithParam<std::tuple<bool, bool>> {};

TEST_P(LinearGradient, MatchesFiniteDifferences) {
  // Plain variables: C++17 lambdas cannot capture structured bindings.
  const bool transposeWeight = std::get<0>(GetParam());
  const bool withBias = std::get<1>(GetParam());
  const int64_t rows = 10, in = 8, out = 6;
  Vec x = randomVec(rows * in, 10), w = randomVec(in * out, 11),
      b = randomVec(out, 12);
  Forward forward = [&] {
    Vec y(rows * out);
    linearForward<double>(pool(), rows, in, out, x.data(), w.data(),
                          transposeWeight, withBias ? b.data() : nullptr,
                          y.data());
    return y;
  };
  Vec u = randomVec(rows * out, 13);
  Vec dx(x.size()), dw(w.size()), db(b.size());
  linearBackward<double>(pool(), rows, in, out, x.data(), w.data(),
                         transposeWeight, u.data(), dx.data(), dw.data(),
                         withBias ? db.data() : nullptr, false);
  std::vector<Checked> checks = {{"dx", &x, dx}, {"dweight", &w, dw}};
  if (withBias)
    checks.push_back({"dbias", &b, db});
  expectGradientsMatch(forward, u, checks);
}
INSTANTIATE_TEST_SUITE_P(Layouts, LinearGradient,
                         testing::Combine(testing::Bool(), testing::Bool()));

// (transposeLhs, transposeRhs)
class MatmulGradient
    : public testing::TestWithParam<std::tuple<bool, bool>> {};

TEST_P(MatmulGradient, MatchesFiniteDifferences) {
  const bool transposeLhs = std::get<0>(GetParam());
  const bool transposeRhs = std::get<1>(GetParam());
  const int64_t batch = 2, m = 3, n = 4, k = 5;
  Vec lhs = randomVec(batch * m * k, 20), rhs = randomVec(batch * k * n, 21);
  Forward forward = [&] {
    Vec y(batch * m * n);
    matmulForward<double>(pool(), batch, m, n, k, lhs.data(), transposeLhs,
                          rhs.data(), transposeRhs, y.data());
    return y;
  };
  Vec u = randomVec(batch * m * n, 22);
  Vec dl(lhs.size()), dr(rhs.size());
  matmulBackward<double>(pool(), batch, m, n, k, lhs.data(), transposeLhs,
                         rhs.data(), transposeRhs, u.data(), dl.data(),
                         dr.data(), false);
  expectGradientsMatch(forward, u, {{"dlhs", &lhs, dl}, {"drhs", &rhs, dr}});
}
INSTANTIATE_TEST_SUITE_P(Transposes, MatmulGradient,
                         testing::Combine(testing::Bool(), testing::Bool()));

//===----------------------------------------------------------------------===//
// Activations and elementwise ops
//===----------------------------------------------------------------------===//

class GeluGradient : public testing::TestWithParam<GeluApproximation> {};

TEST_P(GeluGradient, MatchesFiniteDifferences) {
  GeluApproximation approximation = GetParam();
  Vec x = randomVec(80, 30, -4, 4);
  Forward forward = [&] {
    Vec y(x.size());
    geluForward<double>(pool(), x.size(), x.data(), y.data(), approximation);
    return y;
  };
  Vec u = randomVec(x.size(), 31), dx(x.size());
  geluBackward<double>(pool(), x.size(), x.data(), u.data(), dx.data(),
                       approximation);
  expectGradientsMatch(forward, u, {{"dx", &x, dx}});
}
INSTANTIATE_TEST_SUITE_P(Approximations, GeluGradient,
                         testing::Values(GeluApproximation::None,
                                         GeluApproximation::Tanh));

TEST(HostGradient, Silu) {
  Vec x = randomVec(80, 32, -6, 6);
  Forward forward = [&] {
    Vec y(x.size());
    siluForward<double>(pool(), x.size(), x.data(), y.data());
    return y;
  };
  Vec u = randomVec(x.size(), 33), dx(x.size());
  siluBackward<double>(pool(), x.size(), x.data(), u.data(), dx.data());
  expectGradientsMatch(forward, u, {{"dx", &x, dx}});
}

TEST(HostGradient, Swiglu) {
  Vec gate = randomVec(80, 34, -4, 4), up = randomVec(80, 35);
  Forward forward = [&] {
    Vec y(gate.size());
    swigluForward<double>(pool(), gate.size(), gate.data(), up.data(),
                          y.data());
    return y;
  };
  Vec u = randomVec(gate.size(), 36), dg(gate.size()), du(up.size());
  swigluBackward<double>(pool(), gate.size(), gate.data(), up.data(),
                         u.data(), dg.data(), du.data());
  expectGradientsMatch(forward, u, {{"dgate", &gate, dg}, {"dup", &up, du}});
}

TEST(HostGradient, Dropout) {
  Vec x = randomVec(80, 37);
  // Eight samples of ten elements from sample 4.
  mtrt::random::MaskTile tile{4, 10, 0, {}, {}, {}};
  Forward forward = [&] {
    Vec y(x.size());
    dropoutForward<double>(pool(), x.size(), x.data(), y.data(), 0.25, 9, tile);
    return y;
  };
  Vec u = randomVec(x.size(), 38), dx(x.size());
  dropoutBackward<double>(pool(), x.size(), u.data(), dx.data(), 0.25, 9, tile);
  expectGradientsMatch(forward, u, {{"dx", &x, dx}});
}

TEST(HostGradient, Mul) {
  Vec a = randomVec(80, 39), b = randomVec(80, 40);
  Forward forward = [&] {
    Vec y(a.size());
    mulForward<double>(pool(), a.size(), a.data(), b.data(), y.data());
    return y;
  };
  Vec u = randomVec(a.size(), 41), da(a.size()), db(b.size());
  mulBackward<double>(pool(), a.size(), a.data(), b.data(), u.data(),
                      da.data(), db.data());
  expectGradientsMatch(forward, u, {{"da", &a, da}, {"db", &b, db}});
}

TEST(HostGradient, AddIsTheIdentityOnBothOperands) {
  Vec a = randomVec(80, 42), b = randomVec(80, 43);
  Forward forward = [&] {
    Vec y(a.size());
    addForward<double>(pool(), a.size(), a.data(), b.data(), y.data());
    return y;
  };
  Vec u = randomVec(a.size(), 44);
  expectGradientsMatch(forward, u, {{"da", &a, u}, {"db", &b, u}});
}

// (outer, axis, inner): the last axis, and a middle one.
class SoftmaxGradient
    : public testing::TestWithParam<std::tuple<int64_t, int64_t, int64_t>> {};

TEST_P(SoftmaxGradient, MatchesFiniteDifferences) {
  const int64_t outer = std::get<0>(GetParam());
  const int64_t axis = std::get<1>(GetParam());
  const int64_t inner = std::get<2>(GetParam());
  Vec x = randomVec(outer * axis * inner, 45, -3, 3);
  Forward forward = [&] {
    Vec y(x.size());
    softmaxForward<double>(pool(), outer, axis, inner, x.data(), y.data());
    return y;
  };
  Vec u = randomVec(x.size(), 46), dx(x.size());
  Vec y = forward();
  softmaxBackward<double>(pool(), outer, axis, inner, y.data(), u.data(),
                          dx.data());
  expectGradientsMatch(forward, u, {{"dx", &x, dx}});
}
INSTANTIATE_TEST_SUITE_P(Axes, SoftmaxGradient,
                         testing::Values(std::make_tuple(10, 8, 1),
                                         std::make_tuple(2, 5, 8)));

//===----------------------------------------------------------------------===//
// Cross entropy
//===----------------------------------------------------------------------===//

class CrossEntropyGradient
    : public testing::TestWithParam<std::tuple<LossReduction, bool>> {};

template <typename Id>
void checkCrossEntropy(LossReduction reduction) {
  const int64_t rows = 10, vocab = 7;
  Vec logits = randomVec(rows * vocab, 50, -3, 3);
  std::vector<Id> labels = {3, -100, 0, 6, 2, -100, 5, 1, -100, 4};
  int64_t outputs = reduction == LossReduction::None ? rows : 1;
  Forward forward = [&] {
    Vec loss(outputs);
    KernelStatus status = crossEntropyForward<double, Id>(
        pool(), rows, vocab, logits.data(), labels.data(), -100, reduction,
        loss.data());
    EXPECT_TRUE(status.ok()) << status.message();
    return loss;
  };
  Vec u = randomVec(outputs, 51), dlogits(logits.size());
  KernelStatus status = crossEntropyBackward<double, Id>(
      pool(), rows, vocab, logits.data(), labels.data(), -100, reduction,
      u.data(), dlogits.data());
  ASSERT_TRUE(status.ok()) << status.message();
  expectGradientsMatch(forward, u, {{"dlogits", &logits, dlogits}});
  // Ignored rows get no gradient at all.
  for (int64_t v = 0; v < vocab; ++v)
    EXPECT_EQ(dlogits[1 * vocab + v], 0.0);
}

TEST_P(CrossEntropyGradient, MatchesFiniteDifferences) {
  auto [reduction, wideLabels] = GetParam();
  if (wideLabels)
    checkCrossEntropy<int64_t>(reduction);
  else
    checkCrossEntropy<int32_t>(reduction);
}
INSTANTIATE_TEST_SUITE_P(
    Reductions, CrossEntropyGradient,
    testing::Combine(testing::Values(LossReduction::None, LossReduction::Sum,
                                     LossReduction::Mean),
                     testing::Bool()));

//===----------------------------------------------------------------------===//
// Shapes: the backward of transpose is the inverse transpose, of split a
// concat and of concat a split.
//===----------------------------------------------------------------------===//

TEST(HostGradient, Transpose) {
  const int64_t shape[] = {2, 3, 4};
  const int64_t permutation[] = {2, 0, 1};
  const int64_t permuted[] = {4, 2, 3};
  int64_t inverse[3];
  inversePermutation(3, permutation, inverse);
  Vec x = randomVec(24, 60);
  Forward forward = [&] {
    Vec y(x.size());
    transposeForward<double>(pool(), 3, shape, permutation, x.data(),
                             y.data());
    return y;
  };
  Vec u = randomVec(x.size(), 61), dx(x.size());
  transposeForward<double>(pool(), 3, permuted, inverse, u.data(), dx.data());
  expectGradientsMatch(forward, u, {{"dx", &x, dx}});
}

TEST(HostGradient, SplitAndConcat) {
  // [2, 3 + 1 + 2, 4] split along the middle axis.
  const int64_t outer = 2, inner = 4;
  const int64_t sizes[] = {3, 1, 2};
  Vec x = randomVec(outer * 6 * inner, 62);
  Forward split = [&] {
    Vec a(outer * 3 * inner), b(outer * 1 * inner), c(outer * 2 * inner);
    double *outputs[] = {a.data(), b.data(), c.data()};
    splitForward<double>(pool(), outer, inner, 3, sizes, x.data(), outputs);
    Vec all = a;
    all.insert(all.end(), b.begin(), b.end());
    all.insert(all.end(), c.begin(), c.end());
    return all;
  };
  Vec u = randomVec(x.size(), 63), dx(x.size());
  const double *pieces[] = {u.data(), u.data() + outer * 3 * inner,
                            u.data() + outer * 4 * inner};
  concatForward<double>(pool(), outer, inner, 3, sizes, pieces, dx.data());
  expectGradientsMatch(split, u, {{"split dx", &x, dx}});

  // And concat, whose backward is split.
  Vec p = randomVec(outer * 3 * inner, 64), q = randomVec(outer * inner, 65),
      r = randomVec(outer * 2 * inner, 66);
  Forward concat = [&] {
    Vec y(outer * 6 * inner);
    const double *inputs[] = {p.data(), q.data(), r.data()};
    concatForward<double>(pool(), outer, inner, 3, sizes, inputs, y.data());
    return y;
  };
  Vec dp(p.size()), dq(q.size()), dr(r.size());
  double *grads[] = {dp.data(), dq.data(), dr.data()};
  splitForward<double>(pool(), outer, inner, 3, sizes, u.data(), grads);
  expectGradientsMatch(concat, u,
                       {{"dp", &p, dp}, {"dq", &q, dq}, {"dr", &r, dr}});
}

} // namespace
