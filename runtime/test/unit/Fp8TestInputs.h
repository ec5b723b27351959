// Inputs of every class for the FP8 conversion tests (Fp8Test on the host,
// CudaFp8Test against the GPU): each finite code's value, the midpoints
// between neighbouring codes (exact ties) and their float neighbours, all of
// both signs; values past the largest finite, zeros, infinities, float
// subnormals; NaN; and `randomValues` random floats over 2^-30 .. 2^20 of
// both signs.
#ifndef MTRT_TEST_UNIT_FP8TESTINPUTS_H
#define MTRT_TEST_UNIT_FP8TESTINPUTS_H

#include "core/Fp8.h"

#include <cmath>
#include <limits>
#include <random>
#include <vector>

namespace mtrt::test {

inline std::vector<float> fp8TestInputs(fp8::Format format, int randomValues) {
  std::vector<float> xs;
  int maxCode = fp8::layoutOf(format).maxFinite;
  for (int code = 0; code <= maxCode; ++code) {
    float value = fp8::decode(static_cast<uint8_t>(code), format);
    float next = code < maxCode
                     ? fp8::decode(static_cast<uint8_t>(code + 1), format)
                     : 2 * value;
    float middle = static_cast<float>((double(value) + double(next)) / 2);
    for (float x : {value, middle, std::nextafter(middle, 0.0f),
                    std::nextafter(middle, 1e30f)}) {
      xs.push_back(x);
      xs.push_back(-x);
    }
  }
  for (float x : {0.0f, std::numeric_limits<float>::infinity(),
                  std::numeric_limits<float>::max(),
                  std::numeric_limits<float>::denorm_min(),
                  std::numeric_limits<float>::min(), 1e-30f, 3e5f}) {
    xs.push_back(x);
    xs.push_back(-x);
  }
  xs.push_back(std::numeric_limits<float>::quiet_NaN());
  std::mt19937 random(26);
  std::uniform_real_distribution<float> exponent(-30, 20);
  for (int i = 0; i < randomValues; ++i)
    xs.push_back((i % 2 ? -1 : 1) * std::exp2(exponent(random)));
  return xs;
}

} // namespace mtrt::test

#endif // MTRT_TEST_UNIT_FP8TESTINPUTS_H
