// The two 8-bit floating-point formats of Hopper's FP8 tensor cores (issue
// 26), as bit-exact encoders and decoders usable on the host and in CUDA
// kernels: the host backend's emulation of FP8 training is these functions,
// and CudaFp8Test checks them against the GPU's own conversion
// (`cvt.rn.satfinite.{e4m3,e5m2}x2.f32`) on every float class.
//
// - E4M3 ("e4m3fn", OCP FP8): 1 sign, 4 exponent (bias 7), 3 mantissa bits;
//   no infinities, one NaN pattern per sign (S.1111.111); largest finite
//   448 (0x7E), smallest subnormal 2^-9.
// - E5M2: 1 sign, 5 exponent (bias 15), 2 mantissa bits, IEEE-like:
//   infinities (S.11111.00) and NaNs; largest finite 57344 (0x7B),
//   smallest subnormal 2^-16.
//
// Encoding rounds the float to nearest, ties to even, in one step (no
// intermediate format), and saturates as Transformer Engine's casts do
// (`satfinite`): a magnitude beyond the largest finite value, infinities
// included, becomes the largest finite value of its sign; a NaN becomes
// 0x7F (the GPU's canonical NaN, sign dropped). Values below half the
// smallest subnormal become a zero of their sign.
#ifndef MTRT_CORE_FP8_H
#define MTRT_CORE_FP8_H

#if !defined(__CUDACC_RTC__)
#include <cmath>
#include <cstdint>
#include <cstring>
#endif

#if defined(__CUDACC__)
#define MTRT_FP8_HOST_DEVICE __host__ __device__
#else
#define MTRT_FP8_HOST_DEVICE
#endif

namespace mtrt::fp8 {

enum class Format : uint8_t { E4M3, E5M2 };

/// The layout of a format.
struct Layout {
  int exponentBits, mantissaBits, bias;
  uint8_t maxFinite; // the largest finite magnitude's code
};

MTRT_FP8_HOST_DEVICE inline Layout layoutOf(Format format) {
  return format == Format::E4M3 ? Layout{4, 3, 7, 0x7E}
                                : Layout{5, 2, 15, 0x7B};
}

MTRT_FP8_HOST_DEVICE inline uint32_t floatBits(float x) {
#if defined(__CUDA_ARCH__)
  return __float_as_uint(x);
#else
  uint32_t bits;
  std::memcpy(&bits, &x, sizeof bits);
  return bits;
#endif
}

MTRT_FP8_HOST_DEVICE inline float bitsFloat(uint32_t bits) {
#if defined(__CUDA_ARCH__)
  return __uint_as_float(bits);
#else
  float x;
  std::memcpy(&x, &bits, sizeof x);
  return x;
#endif
}

/// x rounded to the nearest `format` value (ties to even), saturated to the
/// largest finite magnitude; NaN gives 0x7F.
MTRT_FP8_HOST_DEVICE inline uint8_t encode(float x, Format format) {
  const Layout l = layoutOf(format);
  const uint32_t bits = floatBits(x);
  const uint32_t sign = (bits >> 24) & 0x80u;
  const uint32_t magnitude = bits & 0x7FFFFFFFu;
  if (magnitude > 0x7F800000u)
    return 0x7F;
  if (magnitude == 0x7F800000u)
    return static_cast<uint8_t>(sign | l.maxFinite);
  const int exponent = static_cast<int>(magnitude >> 23) - 127;
  const int minNormal = 1 - l.bias; // the smallest normal's exponent
  uint32_t code;
  if (exponent < minNormal) {
    // Subnormal (or zero): an integer count of the smallest subnormal,
    // 2^(minNormal - mantissaBits); scaling by a power of two is exact, and
    // rintf rounds to nearest even. A count of 2^mantissaBits is the
    // smallest normal's code.
    const float units = bitsFloat(magnitude) *
                        bitsFloat(static_cast<uint32_t>(
                                      127 - minNormal + l.mantissaBits)
                                  << 23);
    code = static_cast<uint32_t>(rintf(units));
  } else {
    // Normal: the float's mantissa cut to mantissaBits, rounded to nearest
    // even on the dropped bits (a carry moves into the exponent field).
    const int dropped = 23 - l.mantissaBits;
    const uint32_t mantissa = magnitude & 0x7FFFFFu;
    if (exponent + l.bias >= (1 << l.exponentBits))
      return static_cast<uint8_t>(sign | l.maxFinite);
    code = (static_cast<uint32_t>(exponent + l.bias) << l.mantissaBits) |
           (mantissa >> dropped);
    const uint32_t rest = mantissa & ((1u << dropped) - 1);
    const uint32_t half = 1u << (dropped - 1);
    if (rest > half || (rest == half && (code & 1u)))
      ++code;
  }
  if (code > l.maxFinite)
    code = l.maxFinite;
  return static_cast<uint8_t>(sign | code);
}

/// The value of `code` (exact in float).
MTRT_FP8_HOST_DEVICE inline float decode(uint8_t code, Format format) {
  const Layout l = layoutOf(format);
  const uint32_t sign = static_cast<uint32_t>(code & 0x80u) << 24;
  const uint32_t exponentField =
      (code >> l.mantissaBits) & ((1u << l.exponentBits) - 1);
  const uint32_t mantissa = code & ((1u << l.mantissaBits) - 1);
  const uint32_t top = (1u << l.exponentBits) - 1;
  if (format == Format::E4M3 && exponentField == top &&
      mantissa == (1u << l.mantissaBits) - 1)
    return bitsFloat(0x7FC00000u);
  if (format == Format::E5M2 && exponentField == top)
    return bitsFloat(mantissa ? 0x7FC00000u : (sign | 0x7F800000u));
  if (exponentField == 0) {
    // mantissa * 2^(1 - bias - mantissaBits), exact.
    const float unit = bitsFloat(
        static_cast<uint32_t>(127 + 1 - l.bias - l.mantissaBits) << 23);
    return bitsFloat(sign | floatBits(static_cast<float>(mantissa) * unit));
  }
  return bitsFloat(sign |
                   ((exponentField - l.bias + 127) << 23) |
                   (mantissa << (23 - l.mantissaBits)));
}

/// The largest finite magnitude: 448 (E4M3), 57344 (E5M2).
MTRT_FP8_HOST_DEVICE inline float maxFinite(Format format) {
  return decode(layoutOf(format).maxFinite, format);
}

//===----------------------------------------------------------------------===//
// Delayed scaling (Transformer Engine's recipe, Megatron-LM's --fp8-margin,
// --fp8-amax-history-len and --fp8-amax-compute-algo)
//===----------------------------------------------------------------------===//

/// Which amax of the history a scale is computed from.
enum class AmaxAlgorithm : uint8_t { MostRecent, Max };

/// Records `amax` as the newest of a history of `length` >= 1 amaxes
/// (history[0] the newest): the others move one place older, the oldest
/// drops out.
MTRT_FP8_HOST_DEVICE inline void pushAmax(float *history, int length,
                                          float amax) {
  for (int i = length - 1; i > 0; --i)
    history[i] = history[i - 1];
  history[0] = amax;
}

/// The amax a scale is computed from: the newest, or the largest of the
/// history (a NaN anywhere gives NaN, as a max over a tensor does).
MTRT_FP8_HOST_DEVICE inline float historyAmax(const float *history,
                                              int length,
                                              AmaxAlgorithm algorithm) {
  if (algorithm == AmaxAlgorithm::MostRecent)
    return history[0];
  float amax = history[0];
  for (int i = 1; i < length; ++i) {
    if (history[i] != history[i])
      return history[i];
    if (history[i] > amax)
      amax = history[i];
  }
  return amax;
}

/// The next scale (what a cast multiplies by before rounding) from `amax`:
/// maxFinite(format) / amax / 2^margin, in float (halved margin times,
/// exactly); `previous` when amax is 0
/// or not finite; the largest float when the quotient overflows (amax
/// subnormal).
MTRT_FP8_HOST_DEVICE inline float scaleFromAmax(float amax, float previous,
                                                Format format, int margin) {
  if (!(amax > 0.0f) || amax - amax != 0.0f)
    return previous;
  float scale = maxFinite(format) / amax;
  for (int i = 0; i < margin; ++i)
    scale *= 0.5f;
  for (int i = 0; i > margin; --i)
    scale *= 2.0f;
  if (scale - scale != 0.0f)
    return bitsFloat(0x7F7FFFFFu);
  return scale;
}

} // namespace mtrt::fp8

#endif // MTRT_CORE_FP8_H
