// Rounding to bf16 on the host, which stores bf16 values in its float type
// (f32, or f64 for references) at the values bf16 holds: the executor
// rounds each result the bundle declares bf16, and a kernel rounds where
// its CUDA counterpart stores an intermediate in bf16 (linear_cross_entropy's
// chunk of logits), so both backends round at the same points.
#ifndef MTRT_SRC_HOST_KERNELS_BF16ROUNDING_H
#define MTRT_SRC_HOST_KERNELS_BF16ROUNDING_H

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>

namespace mtrt::host {

/// x rounded to the nearest bf16, ties to even (as __float2bfloat16_rn):
/// the 16 low bits go, with a carry when they are above half or exactly
/// half with an odd bit 16. NaN stays NaN.
inline float roundToBf16(float x) {
  uint32_t bits;
  std::memcpy(&bits, &x, sizeof bits);
  if ((bits & 0x7fffffffu) > 0x7f800000u)
    return x;
  bits += 0x7fffu + ((bits >> 16) & 1u);
  bits &= 0xffff0000u;
  std::memcpy(&x, &bits, sizeof bits);
  return x;
}

/// The same from f64 storage, without an intermediate f32 rounding: 8
/// significant bits (fewer below bf16's smallest normal, 2^-126), to
/// nearest even (the default rounding mode), beyond bf16's largest finite
/// value infinity.
inline double roundToBf16(double x) {
  if (!std::isfinite(x) || x == 0)
    return x;
  int exponent;
  std::frexp(x, &exponent);
  int quantum = std::max(exponent - 8, -133); // the last kept bit
  double rounded =
      std::ldexp(std::nearbyint(std::ldexp(x, -quantum)), quantum);
  constexpr double kMaxBf16 = 3.38953138925153547590470800371487866880e38;
  return std::fabs(rounded) > kMaxBf16 ? std::copysign(INFINITY, x) : rounded;
}

/// Rounds data[0, n) to bf16 in place (elementwise: any split of the range
/// over threads gives the same bits).
template <typename T> void roundAllToBf16(T *data, int64_t n) {
  for (int64_t i = 0; i < n; ++i)
    data[i] = static_cast<T>(roundToBf16(data[i]));
}

} // namespace mtrt::host

#endif // MTRT_SRC_HOST_KERNELS_BF16ROUNDING_H
