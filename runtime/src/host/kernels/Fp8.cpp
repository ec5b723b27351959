// FP8 casts on the host (docs/MixedPrecision.md, "FP8"): the codes are
// stored as their exact values in the float type, so the GEMMs that read
// them compute what the FP8 tensor cores compute, summed in the float type.
#include "host/kernels/Kernels.h"

#include "core/Fp8.h"
#include "host/ThreadPool.h"
#include "host/kernels/KernelSupport.h"

#include <cmath>
#include <mutex>

namespace mtrt::host {

template <typename T>
float fp8Amax(ThreadPool &pool, int64_t n, const T *x) {
  std::mutex mutex;
  float amax = 0.0f;
  bool nan = false;
  pool.parallelFor(
      0, n,
      [&](int64_t begin, int64_t end) {
        float local = 0.0f;
        bool localNan = false;
        for (int64_t i = begin; i < end; ++i) {
          float magnitude = std::fabs(static_cast<float>(x[i]));
          if (magnitude != magnitude)
            localNan = true;
          else if (magnitude > local)
            local = magnitude;
        }
        std::lock_guard<std::mutex> lock(mutex);
        amax = std::max(amax, local);
        nan = nan || localNan;
      },
      4096);
  return nan ? std::nanf("") : amax;
}

template <typename T>
float fp8Quantize(ThreadPool &pool, int64_t n, const T *x, float scale,
                  fp8::Format format, T *codes) {
  pool.parallelFor(
      0, n,
      [&](int64_t begin, int64_t end) {
        for (int64_t i = begin; i < end; ++i)
          codes[i] = static_cast<T>(fp8::decode(
              fp8::encode(static_cast<float>(x[i]) * scale, format), format));
      },
      4096);
  return fp8Amax(pool, n, x);
}

template <typename T>
void fp8Descale(ThreadPool &pool, int64_t rows, int64_t columns,
                float descale, const T *bias, T *y) {
  pool.parallelFor(
      0, rows,
      [&](int64_t begin, int64_t end) {
        for (int64_t r = begin; r < end; ++r) {
          T *row = y + r * columns;
          for (int64_t c = 0; c < columns; ++c)
            row[c] = row[c] * static_cast<T>(descale) +
                     (bias ? bias[c] : static_cast<T>(0));
        }
      },
      16);
}

#define MTRT_INSTANTIATE(T)                                                    \
  template float fp8Amax<T>(ThreadPool &, int64_t, const T *);                 \
  template float fp8Quantize<T>(ThreadPool &, int64_t, const T *, float,       \
                                fp8::Format, T *);                             \
  template void fp8Descale<T>(ThreadPool &, int64_t, int64_t, float,           \
                              const T *, T *);
MTRT_INSTANTIATE_FLOAT_TYPES(MTRT_INSTANTIATE)
#undef MTRT_INSTANTIATE

} // namespace mtrt::host
