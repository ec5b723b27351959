// AdamW, the gradient-norm helpers (sum of squares, scaling) and Megatron-LM's learning-rate schedule.
#include "host/kernels/KernelSupport.h"

#include <atomic>
#include <cmath>
#include <vector>

namespace mtrt::host {

namespace {
constexpr double kPi = 3.14159265358979323846264338327950288;
} // namespace

template <typename T>
void adamwStep(ThreadPool &pool, int64_t n, T *param, const T *grad,
               T *expAvg, T *expAvgSq, const AdamWParams &params) {
  double step = static_cast<double>(params.step);
  double biasCorrection1 = 1.0 - std::pow(params.beta1, step);
  double biasCorrection2 = 1.0 - std::pow(params.beta2, step);
  const T decay = static_cast<T>(1.0 - params.lr * params.weightDecay);
  const T beta1 = static_cast<T>(params.beta1);
  const T beta2 = static_cast<T>(params.beta2);
  const T oneMinusBeta1 = static_cast<T>(1.0 - params.beta1);
  const T oneMinusBeta2 = static_cast<T>(1.0 - params.beta2);
  const T stepSize = static_cast<T>(params.lr / biasCorrection1);
  const T bias2Sqrt = static_cast<T>(std::sqrt(biasCorrection2));
  const T eps = static_cast<T>(params.eps);
  detail::forEachElement(pool, n, [&](int64_t i) {
    T g = grad[i];
    T p = param[i] * decay;
    T m = beta1 * expAvg[i] + oneMinusBeta1 * g;
    T v = beta2 * expAvgSq[i] + oneMinusBeta2 * g * g;
    expAvg[i] = m;
    expAvgSq[i] = v;
    param[i] = p - stepSize * (m / (std::sqrt(v) / bias2Sqrt + eps));
  });
}

template <typename T>
double sumOfSquares(ThreadPool &pool, int64_t n, const T *x) {
  // Fixed blocks, not per-thread partial sums: the order of the additions
  // must not depend on the thread count.
  constexpr int64_t kBlock = 4096;
  int64_t blocks = (n + kBlock - 1) / kBlock;
  std::vector<double> partial(static_cast<size_t>(blocks), 0.0);
  pool.parallelFor(
      0, blocks,
      [&](int64_t begin, int64_t end) {
        for (int64_t block = begin; block < end; ++block) {
          double sum = 0;
          for (int64_t i = block * kBlock, e = std::min(n, i + kBlock); i < e;
               ++i)
            sum += static_cast<double>(x[i]) * x[i];
          partial[block] = sum;
        }
      },
      4);
  double total = 0;
  for (double value : partial)
    total += value;
  return total;
}

template <typename T>
void scaleInPlace(ThreadPool &pool, int64_t n, T *x, double factor) {
  T f = static_cast<T>(factor);
  detail::forEachElement(pool, n, [&](int64_t i) { x[i] *= f; });
}

template <typename T>
bool scaleAndCheckFinite(ThreadPool &pool, int64_t n, T *x, double factor) {
  T f = static_cast<T>(factor);
  std::atomic<bool> found{false};
  pool.parallelFor(
      0, n,
      [&](int64_t begin, int64_t end) {
        bool local = false;
        for (int64_t i = begin; i < end; ++i) {
          T value = x[i] * f;
          x[i] = value;
          local |= !std::isfinite(value);
        }
        if (local)
          found.store(true, std::memory_order_relaxed);
      },
      4096);
  return found.load();
}

double learningRate(const LrSchedule &schedule, int64_t iteration) {
  double maxLr = schedule.maxLr, minLr = schedule.minLr;
  if (schedule.warmupIters > 0 && iteration <= schedule.warmupIters)
    return schedule.warmupInitLr +
           (maxLr - schedule.warmupInitLr) * static_cast<double>(iteration) /
               static_cast<double>(schedule.warmupIters);
  if (schedule.style == LrDecayStyle::Constant)
    return maxLr;
  if (iteration > schedule.decayIters)
    return minLr;
  int64_t decaySteps = schedule.decayIters - schedule.warmupIters;
  if (decaySteps <= 0)
    return maxLr;
  double ratio = static_cast<double>(iteration - schedule.warmupIters) /
                 static_cast<double>(decaySteps);
  double coefficient;
  if (schedule.style == LrDecayStyle::Linear)
    coefficient = 1.0 - ratio;
  else
    coefficient = 0.5 * (std::cos(kPi * ratio) + 1.0);
  return minLr + coefficient * (maxLr - minLr);
}

#define MTRT_INSTANTIATE(T)                                                    \
  template void adamwStep<T>(ThreadPool &, int64_t, T *, const T *, T *, T *,  \
                             const AdamWParams &);                             \
  template double sumOfSquares<T>(ThreadPool &, int64_t, const T *);           \
  template void scaleInPlace<T>(ThreadPool &, int64_t, T *, double);          \
  template bool scaleAndCheckFinite<T>(ThreadPool &, int64_t, T *, double);
MTRT_INSTANTIATE_FLOAT_TYPES(MTRT_INSTANTIATE)
#undef MTRT_INSTANTIATE

} // namespace mtrt::host
