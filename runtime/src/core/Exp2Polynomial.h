//===- Exp2Polynomial.h - 2^x on the FMA units ------------------*- C++ -*-===//
//
// 2^x by rounding x to an integer n and a polynomial in the rest f, 2^n
// added into the result's exponent bits: a handful of adds and FMAs where
// ex2.approx runs on the special function units, which do 16 results a
// clock a multiprocessor on Hopper against 128 FMAs. FlashAttention-4 moves
// part of a softmax's exponentials onto the FMA units this way; the
// Hopper attention forward can take a share of its probabilities from it
// (MTRT_CUDA_HOPPER_EXP2_FMA, runtime/README.md). Host and device compute
// the same bits (the rounding is an add's, the polynomial explicit FMAs).
//
//===----------------------------------------------------------------------===//
#ifndef MTRT_SRC_CORE_EXP2POLYNOMIAL_H
#define MTRT_SRC_CORE_EXP2POLYNOMIAL_H

#include "core/Fp8.h"
#include "core/HostDevice.h"

#include <cmath>
#include <cstdint>

namespace mtrt {

/// 2^x within 2.6e-6 of it relatively for x in [-126, 128), 0 below -126
/// (so -inf, a masked score, gives 0 as ex2 does). The polynomial is the
/// degree-4 minimax (relative error) of 2^f on [-0.5, 0.5]; n is x rounded
/// to the nearest integer by adding and subtracting 1.5 * 2^23, which also
/// leaves n in the sum's low bits.
MTRT_HOST_DEVICE inline float exp2Polynomial(float x) {
  float clamped = fmaxf(x, -127.f);
  float shifted = clamped + 0x1.8p23f;
  float f = clamped - (shifted - 0x1.8p23f);
  float p = fmaf(0x1.3997d6p-7f, f, 0x1.ca1440p-5f);
  p = fmaf(p, f, 0x1.ec06dap-3f);
  p = fmaf(p, f, 0x1.62e0dcp-1f);
  p = fmaf(p, f, 0x1.ffffe8p-1f);
  // n's bits in the sum's mantissa: shifted by 23 they add n to p's
  // exponent (the sum's own exponent bits shift out).
  // (Fp8.h's bit casts: intrinsics on the device, memcpy on the host.)
  float result =
      fp8::bitsFloat(fp8::floatBits(p) + (fp8::floatBits(shifted) << 23));
  return x < -126.f ? 0.f : result;
}

} // namespace mtrt

#endif // MTRT_SRC_CORE_EXP2POLYNOMIAL_H
