// Layer norm and RMS norm, forward and backward, with row statistics in double.
#include "host/kernels/KernelSupport.h"

#include <cmath>
#include <vector>

namespace mtrt::host {

template <typename T>
void layerNormForward(ThreadPool &pool, int64_t rows, int64_t hidden,
                      const T *x, const T *weight, const T *bias, double eps,
                      T *y, T *mean, T *rstd) {
  pool.parallelFor(
      0, rows,
      [&](int64_t begin, int64_t end) {
        for (int64_t r = begin; r < end; ++r) {
          const T *xr = x + r * hidden;
          double sum = 0;
          for (int64_t j = 0; j < hidden; ++j)
            sum += xr[j];
          double mu = sum / static_cast<double>(hidden);
          double squares = 0;
          for (int64_t j = 0; j < hidden; ++j) {
            double d = xr[j] - mu;
            squares += d * d;
          }
          double variance = squares / static_cast<double>(hidden);
          T meanT = static_cast<T>(mu);
          T rstdT = static_cast<T>(1.0 / std::sqrt(variance + eps));
          mean[r] = meanT;
          rstd[r] = rstdT;
          T *yr = y + r * hidden;
          for (int64_t j = 0; j < hidden; ++j) {
            T value = (xr[j] - meanT) * rstdT * weight[j];
            yr[j] = bias ? value + bias[j] : value;
          }
        }
      },
      detail::rowGrain(hidden));
}

template <typename T>
void layerNormBackward(ThreadPool &pool, int64_t rows, int64_t hidden,
                       const T *x, const T *weight, const T *mean,
                       const T *rstd, const T *dy, T *dx, T *dweight, T *dbias,
                       bool accumulate, int64_t sequence) {
  auto xhat = [&](int64_t r, int64_t j) {
    return (x[r * hidden + j] - mean[r]) * rstd[r];
  };
  if (dx) {
    pool.parallelFor(
        0, rows,
        [&](int64_t begin, int64_t end) {
          for (int64_t r = begin; r < end; ++r) {
            const T *dyr = dy + r * hidden;
            double sumG = 0, sumGXhat = 0;
            for (int64_t j = 0; j < hidden; ++j) {
              T g = dyr[j] * weight[j];
              sumG += g;
              sumGXhat += static_cast<double>(g) * xhat(r, j);
            }
            T meanG = static_cast<T>(sumG / static_cast<double>(hidden));
            T meanGXhat =
                static_cast<T>(sumGXhat / static_cast<double>(hidden));
            T *dxr = dx + r * hidden;
            for (int64_t j = 0; j < hidden; ++j) {
              T g = dyr[j] * weight[j];
              dxr[j] = rstd[r] * (g - meanG - xhat(r, j) * meanGXhat);
            }
          }
        },
        detail::rowGrain(hidden));
  }
  if (dweight)
    detail::canonicalRowSums<T, double>(
        pool, rows, sequence, hidden, dweight, accumulate,
        [&](int64_t r, int64_t j) { return dy[r * hidden + j] * xhat(r, j); });
  if (dbias)
    detail::canonicalRowSums<T, double>(
        pool, rows, sequence, hidden, dbias, accumulate,
        [&](int64_t r, int64_t j) { return dy[r * hidden + j]; });
}

template <typename T>
void rmsNormForward(ThreadPool &pool, int64_t rows, int64_t hidden,
                    const T *x, const T *weight, double eps, T *y, T *rstd) {
  pool.parallelFor(
      0, rows,
      [&](int64_t begin, int64_t end) {
        for (int64_t r = begin; r < end; ++r) {
          const T *xr = x + r * hidden;
          double squares = 0;
          for (int64_t j = 0; j < hidden; ++j)
            squares += static_cast<double>(xr[j]) * xr[j];
          double meanSquare = squares / static_cast<double>(hidden);
          T rstdT = static_cast<T>(1.0 / std::sqrt(meanSquare + eps));
          rstd[r] = rstdT;
          T *yr = y + r * hidden;
          for (int64_t j = 0; j < hidden; ++j)
            yr[j] = xr[j] * rstdT * weight[j];
        }
      },
      detail::rowGrain(hidden));
}

template <typename T>
void rmsNormBackward(ThreadPool &pool, int64_t rows, int64_t hidden, const T *x,
                     const T *weight, const T *rstd, const T *dy, T *dx,
                     T *dweight, bool accumulate, int64_t sequence) {
  if (dx) {
    pool.parallelFor(
        0, rows,
        [&](int64_t begin, int64_t end) {
          for (int64_t r = begin; r < end; ++r) {
            const T *xr = x + r * hidden;
            const T *dyr = dy + r * hidden;
            double sumGXhat = 0;
            for (int64_t j = 0; j < hidden; ++j)
              sumGXhat += static_cast<double>(dyr[j] * weight[j]) *
                          (xr[j] * rstd[r]);
            T meanGXhat =
                static_cast<T>(sumGXhat / static_cast<double>(hidden));
            T *dxr = dx + r * hidden;
            for (int64_t j = 0; j < hidden; ++j) {
              T g = dyr[j] * weight[j];
              dxr[j] = rstd[r] * (g - xr[j] * rstd[r] * meanGXhat);
            }
          }
        },
        detail::rowGrain(hidden));
  }
  if (dweight)
    detail::canonicalRowSums<T, double>(pool, rows, sequence, hidden, dweight,
                                        accumulate, [&](int64_t r, int64_t j) {
                                          return dy[r * hidden + j] *
                                                 (x[r * hidden + j] * rstd[r]);
                                        });
}

#define MTRT_INSTANTIATE(T)                                                    \
  template void layerNormForward<T>(ThreadPool &, int64_t, int64_t, const T *, \
                                    const T *, const T *, double, T *, T *,    \
                                    T *);                                      \
  template void layerNormBackward<T>(                                          \
      ThreadPool &, int64_t, int64_t, const T *, const T *, const T *,         \
      const T *, const T *, T *, T *, T *, bool, int64_t);                     \
  template void rmsNormForward<T>(ThreadPool &, int64_t, int64_t, const T *,   \
                                  const T *, double, T *, T *);                \
  template void rmsNormBackward<T>(ThreadPool &, int64_t, int64_t, const T *,  \
                                   const T *, const T *, const T *, T *, T *,  \
                                   bool, int64_t);
MTRT_INSTANTIATE_FLOAT_TYPES(MTRT_INSTANTIATE)
#undef MTRT_INSTANTIATE

} // namespace mtrt::host
