// Elementwise kernels (gelu, silu, swiglu, dropout, add, mul) and softmax, forward and backward.
#include "core/Random.h"
#include "host/kernels/KernelSupport.h"

#include <cmath>
#include <vector>

namespace mtrt::host {

using detail::forEachElement;

namespace {

template <typename T> T sigmoid(T x) { return T(1) / (T(1) + std::exp(-x)); }

// sqrt(2 / pi) and 1 / sqrt(2 pi), correctly rounded to double.
constexpr double kSqrt2OverPi = 0.79788456080286535587989211986876;
constexpr double kInvSqrt2Pi = 0.39894228040143267793994605993438;
constexpr double kInvSqrt2 = 0.70710678118654752440084436210485;
constexpr double kGeluTanhCubic = 0.044715;

} // namespace

template <typename T>
void geluForward(ThreadPool &pool, int64_t n, const T *x, T *y,
                 GeluApproximation approximation) {
  if (approximation == GeluApproximation::Tanh) {
    forEachElement(pool, n, [&](int64_t i) {
      T v = x[i];
      T inner = T(kSqrt2OverPi) * (v + T(kGeluTanhCubic) * v * v * v);
      y[i] = T(0.5) * v * (T(1) + std::tanh(inner));
    });
    return;
  }
  forEachElement(pool, n, [&](int64_t i) {
    T v = x[i];
    y[i] = T(0.5) * v * (T(1) + std::erf(v * T(kInvSqrt2)));
  });
}

template <typename T>
void geluBackward(ThreadPool &pool, int64_t n, const T *x, const T *dy, T *dx,
                  GeluApproximation approximation) {
  if (approximation == GeluApproximation::Tanh) {
    forEachElement(pool, n, [&](int64_t i) {
      T v = x[i];
      T v2 = v * v;
      T t = std::tanh(T(kSqrt2OverPi) * (v + T(kGeluTanhCubic) * v2 * v));
      T dinner = T(kSqrt2OverPi) * (T(1) + T(3 * kGeluTanhCubic) * v2);
      T grad = T(0.5) * (T(1) + t) + T(0.5) * v * (T(1) - t * t) * dinner;
      dx[i] = dy[i] * grad;
    });
    return;
  }
  forEachElement(pool, n, [&](int64_t i) {
    T v = x[i];
    T cdf = T(0.5) * (T(1) + std::erf(v * T(kInvSqrt2)));
    T pdf = T(kInvSqrt2Pi) * std::exp(T(-0.5) * v * v);
    dx[i] = dy[i] * (cdf + v * pdf);
  });
}

template <typename T>
void siluForward(ThreadPool &pool, int64_t n, const T *x, T *y) {
  forEachElement(pool, n, [&](int64_t i) { y[i] = x[i] * sigmoid(x[i]); });
}

template <typename T>
void siluBackward(ThreadPool &pool, int64_t n, const T *x, const T *dy,
                  T *dx) {
  forEachElement(pool, n, [&](int64_t i) {
    T s = sigmoid(x[i]);
    dx[i] = dy[i] * (s * (T(1) + x[i] * (T(1) - s)));
  });
}

template <typename T>
void swigluForward(ThreadPool &pool, int64_t n, const T *gate, const T *up,
                   T *y) {
  forEachElement(pool, n, [&](int64_t i) {
    T g = gate[i];
    y[i] = g * sigmoid(g) * up[i];
  });
}

template <typename T>
void swigluBackward(ThreadPool &pool, int64_t n, const T *gate, const T *up,
                    const T *dy, T *dgate, T *dup) {
  forEachElement(pool, n, [&](int64_t i) {
    T g = gate[i];
    T u = up[i];
    T d = dy[i];
    T s = sigmoid(g);
    // Both are computed before either is stored: dgate or dup may alias an
    // input.
    T gradGate = d * u * (s * (T(1) + g * (T(1) - s)));
    T gradUp = d * (g * s);
    if (dgate)
      dgate[i] = gradGate;
    if (dup)
      dup[i] = gradUp;
  });
}

uint64_t GlobalTile::globalIndex(int64_t local) const {
  int64_t index = 0, stride = 1;
  for (size_t d = localShape.size(); d-- > 0;) {
    index += (local % localShape[d] + offsets[d]) * stride;
    local /= localShape[d];
    stride *= globalShape[d];
  }
  return static_cast<uint64_t>(index);
}

namespace {
template <typename T>
void applyDropout(ThreadPool &pool, int64_t n, const T *in, T *out, double p,
                  uint64_t seed, const random::MaskTile &tile) {
  if (p == 0) {
    forEachElement(pool, n, [&](int64_t i) { out[i] = in[i]; });
    return;
  }
  uint64_t key = random::seedKey(seed);
  uint32_t threshold = random::dropoutThreshold16(p);
  T scale = static_cast<T>(1.0 / (1.0 - p));
  forEachElement(pool, n, [&](int64_t i) {
    bool keep =
        random::dropoutTileKeep(key, tile, static_cast<uint64_t>(i), threshold);
    out[i] = keep ? in[i] * scale : T(0);
  });
}
} // namespace

template <typename T>
void dropoutForward(ThreadPool &pool, int64_t n, const T *x, T *y, double p,
                    uint64_t seed, const random::MaskTile &tile) {
  applyDropout(pool, n, x, y, p, seed, tile);
}

template <typename T>
void dropoutBackward(ThreadPool &pool, int64_t n, const T *dy, T *dx, double p,
                     uint64_t seed, const random::MaskTile &tile) {
  applyDropout(pool, n, dy, dx, p, seed, tile);
}

template <typename T>
void scaleForward(ThreadPool &pool, int64_t n, const T *x, T factor, T *y) {
  forEachElement(pool, n, [&](int64_t i) { y[i] = x[i] * factor; });
}

template <typename T>
void addForward(ThreadPool &pool, int64_t n, const T *a, const T *b, T *y) {
  forEachElement(pool, n, [&](int64_t i) { y[i] = a[i] + b[i]; });
}

template <typename T>
void biasAddForward(ThreadPool &pool, int64_t rows, int64_t n, const T *x,
                    const T *bias, T *y) {
  forEachElement(pool, rows * n,
                 [&](int64_t i) { y[i] = x[i] + bias[n ? i % n : 0]; });
}

template <typename T>
void accumulateInto(ThreadPool &pool, int64_t n, const T *x, T *y) {
  forEachElement(pool, n, [&](int64_t i) { y[i] += x[i]; });
}

template <typename T>
void mulForward(ThreadPool &pool, int64_t n, const T *a, const T *b, T *y) {
  forEachElement(pool, n, [&](int64_t i) { y[i] = a[i] * b[i]; });
}

template <typename T>
void mulBackward(ThreadPool &pool, int64_t n, const T *a, const T *b,
                 const T *dy, T *da, T *db) {
  forEachElement(pool, n, [&](int64_t i) {
    T gradA = dy[i] * b[i];
    T gradB = dy[i] * a[i];
    if (da)
      da[i] = gradA;
    if (db)
      db[i] = gradB;
  });
}

// Softmax works on "lines": line l = (o, in) has its elements at
// o * axisSize * inner + a * inner + in for a < axisSize.
template <typename T>
void softmaxForward(ThreadPool &pool, int64_t outer, int64_t axisSize,
                    int64_t inner, const T *x, T *y) {
  pool.parallelFor(
      0, outer * inner,
      [&](int64_t begin, int64_t end) {
        for (int64_t line = begin; line < end; ++line) {
          int64_t base = (line / inner) * axisSize * inner + line % inner;
          const T *xl = x + base;
          T *yl = y + base;
          T maxValue = xl[0];
          for (int64_t a = 1; a < axisSize; ++a)
            maxValue = std::max(maxValue, xl[a * inner]);
          double sum = 0;
          for (int64_t a = 0; a < axisSize; ++a) {
            T e = std::exp(xl[a * inner] - maxValue);
            yl[a * inner] = e;
            sum += e;
          }
          for (int64_t a = 0; a < axisSize; ++a)
            yl[a * inner] = static_cast<T>(yl[a * inner] / sum);
        }
      },
      detail::rowGrain(axisSize));
}

template <typename T>
void softmaxBackward(ThreadPool &pool, int64_t outer, int64_t axisSize,
                     int64_t inner, const T *y, const T *dy, T *dx) {
  pool.parallelFor(
      0, outer * inner,
      [&](int64_t begin, int64_t end) {
        for (int64_t line = begin; line < end; ++line) {
          int64_t base = (line / inner) * axisSize * inner + line % inner;
          double dot = 0;
          for (int64_t a = 0; a < axisSize; ++a)
            dot += static_cast<double>(dy[base + a * inner]) *
                   y[base + a * inner];
          T dotT = static_cast<T>(dot);
          for (int64_t a = 0; a < axisSize; ++a) {
            int64_t e = base + a * inner;
            dx[e] = y[e] * (dy[e] - dotT);
          }
        }
      },
      detail::rowGrain(axisSize));
}

#define MTRT_INSTANTIATE(T)                                                    \
  template void geluForward<T>(ThreadPool &, int64_t, const T *, T *,          \
                               GeluApproximation);                             \
  template void geluBackward<T>(ThreadPool &, int64_t, const T *, const T *,   \
                                T *, GeluApproximation);                       \
  template void siluForward<T>(ThreadPool &, int64_t, const T *, T *);         \
  template void siluBackward<T>(ThreadPool &, int64_t, const T *, const T *,   \
                                T *);                                          \
  template void swigluForward<T>(ThreadPool &, int64_t, const T *, const T *,  \
                                 T *);                                         \
  template void swigluBackward<T>(ThreadPool &, int64_t, const T *, const T *, \
                                  const T *, T *, T *);                        \
  template void dropoutForward<T>(ThreadPool &, int64_t, const T *, T *,       \
                                  double, uint64_t, const random::MaskTile &); \
  template void dropoutBackward<T>(ThreadPool &, int64_t, const T *, T *,      \
                                   double, uint64_t,                           \
                                   const random::MaskTile &);                  \
  template void addForward<T>(ThreadPool &, int64_t, const T *, const T *,     \
                              T *);                                            \
  template void scaleForward<T>(ThreadPool &, int64_t, const T *, T, T *);     \
  template void accumulateInto<T>(ThreadPool &, int64_t, const T *, T *);      \
  template void biasAddForward<T>(ThreadPool &, int64_t, int64_t, const T *,   \
                                  const T *, T *);                             \
  template void mulForward<T>(ThreadPool &, int64_t, const T *, const T *,     \
                              T *);                                            \
  template void mulBackward<T>(ThreadPool &, int64_t, const T *, const T *,    \
                               const T *, T *, T *);                           \
  template void softmaxForward<T>(ThreadPool &, int64_t, int64_t, int64_t,     \
                                  const T *, T *);                             \
  template void softmaxBackward<T>(ThreadPool &, int64_t, int64_t, int64_t,    \
                                   const T *, const T *, T *);
MTRT_INSTANTIATE_FLOAT_TYPES(MTRT_INSTANTIATE)
#undef MTRT_INSTANTIATE

} // namespace mtrt::host
