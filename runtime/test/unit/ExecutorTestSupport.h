// Test helpers for executor tests: deterministic parameter values and
// central-difference gradient checks.
#ifndef MTRT_TEST_UNIT_EXECUTORTESTSUPPORT_H
#define MTRT_TEST_UNIT_EXECUTORTESTSUPPORT_H

#include "BundleTestBuilder.h"

#include "host/Executor.h"
#include "host/ParameterStore.h"
#include "host/ThreadPool.h"

#include <cmath>
#include <string>
#include <vector>

namespace mtrt::test {

/// Sets every parameter of a float64 store to smooth, generic values: about
/// 1 for parameters named "*norm*" / "ln_*" (norm weights), elsewhere
/// `scale` * sin(...) so that nothing is symmetric or zero.
inline void setGenericValues(host::ParameterStore &store, double scale) {
  for (size_t p = 0; p < store.size(); ++p) {
    host::Tensor &t = store.value(p);
    const std::string &name = store.info(p).name;
    bool norm = name.find("norm") != std::string::npos ||
                name.find("ln_") != std::string::npos;
    for (int64_t i = 0; i < t.numElements(); ++i) {
      double s = std::sin(1.7 * static_cast<double>(i) +
                          0.9 * static_cast<double>(p) + 0.3);
      t.data<double>()[i] = norm ? 1.0 + 0.2 * s : scale * s;
    }
  }
}

/// Runs `function` (inputs: tokens and labels [B, S]; output: a scalar loss)
/// and returns the loss.
inline double lossOf(host::Executor &executor, std::vector<int32_t> &tokens,
                     std::vector<int32_t> &labels, int64_t batch, int64_t seq) {
  std::vector<host::Tensor> out =
      executor.run({{DType::I32, {batch, seq}, tokens.data()},
                    {DType::I32, {batch, seq}, labels.data()}},
                   {3, 3});
  return out[0].data<double>()[0];
}

/// Compares every parameter's accumulated gradient with central
/// differences (five-point) of the loss, in float64: |fd - grad| <= 1e-6 |grad|
/// + 1e-9. The manifest's `function` must accumulate each parameter's full
/// gradient.
inline void checkGradients(const Json &manifest, const std::string &function,
                           int64_t batch, int64_t seq,
                           std::vector<int32_t> tokens,
                           std::vector<int32_t> labels, double scale) {
  Bundle bundle = Bundle::parseManifest("gradcheck", manifest.dump());
  host::ThreadPool pool(2);
  host::ParameterStore store(bundle, DType::F64);
  setGenericValues(store, scale);
  host::Executor executor(bundle, function, store, pool);
  store.zeroGradients(pool);
  lossOf(executor, tokens, labels, batch, seq);
  std::vector<std::vector<double>> grads;
  for (size_t p = 0; p < store.size(); ++p) {
    const host::Tensor &g = store.gradient(p);
    grads.emplace_back(g.data<double>(), g.data<double>() + g.numElements());
  }
  // The five-point stencil: truncation error O(h^4), rounding error about
  // 1e-16 |loss| / h, both far below the tolerance.
  const double h = 1e-4;
  int64_t checked = 0;
  for (size_t p = 0; p < store.size(); ++p) {
    double *values = store.value(p).data<double>();
    for (int64_t i = 0; i < store.value(p).numElements(); ++i) {
      double saved = values[i];
      auto at = [&](double offset) {
        values[i] = saved + offset;
        return lossOf(executor, tokens, labels, batch, seq);
      };
      double fd = (at(-2 * h) - 8 * at(-h) + 8 * at(h) - at(2 * h)) / (12 * h);
      values[i] = saved;
      double grad = grads[p][i];
      EXPECT_NEAR(fd, grad, 1e-6 * std::abs(grad) + 1e-9)
          << store.info(p).name << "[" << i << "]";
      ++checked;
    }
    EXPECT_GT(store.value(p).numElements(), 0) << store.info(p).name;
  }
  EXPECT_GT(checked, 0);
}

} // namespace mtrt::test

#endif // MTRT_TEST_UNIT_EXECUTORTESTSUPPORT_H
