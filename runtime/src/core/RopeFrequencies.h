// RoPE's inverse frequencies, with Hugging Face's "linear", "llama3" and
// "yarn" scalings, in one formula the host kernels and the CUDA table kernel both
// evaluate (in double), so the two backends rotate by the same angles.
#ifndef MTRT_SRC_CORE_ROPEFREQUENCIES_H
#define MTRT_SRC_CORE_ROPEFREQUENCIES_H

#include "core/HostDevice.h"

#include <cmath>
#include <cstdint>

namespace mtrt {

/// rope's frequency attributes. A plain base (the implicit conversion) is
/// unscaled RoPE. factor alone divides every inverse frequency ("linear");
/// with originalMaxPositions > 0 it is Llama 3.1's blend ("llama3"), or
/// with betaFast > 0 YaRN's ramp ("yarn"). attentionFactor multiplies cos
/// and sin (YaRN's mscale).
struct RopeFrequencies {
  RopeFrequencies(double base = 10000.0) : base(base) {}
  double base;
  double factor = 1.0;
  double lowFreqFactor = 0.0;
  double highFreqFactor = 0.0;
  double originalMaxPositions = 0.0;
  double betaFast = 0.0;
  double betaSlow = 0.0;
  bool truncate = true;
  double attentionFactor = 1.0;
};

/// YaRN's dimension (of rotaryDim) at which a frequency turns `rotations`
/// times over the original context: rotaryDim ln(original / (2 pi r)) /
/// (2 ln base).
MTRT_HOST_DEVICE inline double yarnCorrectionDim(const RopeFrequencies &r,
                                                 double rotations,
                                                 int64_t rotaryDim) {
  return static_cast<double>(rotaryDim) *
         ::log(r.originalMaxPositions /
               (rotations * 2.0 * 3.14159265358979323846)) /
         (2.0 * ::log(r.base));
}

/// The inverse frequency of rotated pair i of rotaryDim features:
/// f = base^(-2i / rotaryDim), then scaled. llama3, by the wavelength
/// w = 2 pi / f: w < original / high keeps f, w > original / low gives
/// f / factor, and between, with s = (original / w - low) / (high - low),
/// (1 - s) f / factor + s f, as transformers' _compute_llama3_parameters.
MTRT_HOST_DEVICE inline double ropeInverseFrequency(const RopeFrequencies &r,
                                                    int64_t i,
                                                    int64_t rotaryDim) {
  double f = ::pow(r.base, -2.0 * static_cast<double>(i) /
                             static_cast<double>(rotaryDim));
  if (r.betaFast > 0.0) {
    // yarn, as transformers' _compute_yarn_parameters: pair i below the
    // dimension of beta_fast rotations keeps f, above that of beta_slow
    // gets f / factor, and a linear ramp blends them between.
    double low = yarnCorrectionDim(r, r.betaFast, rotaryDim);
    double high = yarnCorrectionDim(r, r.betaSlow, rotaryDim);
    if (r.truncate) {
      low = ::floor(low);
      high = ::ceil(high);
    }
    low = low > 0.0 ? low : 0.0;
    double top = static_cast<double>(rotaryDim - 1);
    high = high < top ? high : top;
    if (low == high)
      high += 0.001; // as transformers, against a zero-width ramp
    double ramp = (static_cast<double>(i) - low) / (high - low);
    ramp = ramp < 0.0 ? 0.0 : ramp > 1.0 ? 1.0 : ramp;
    return f / r.factor * ramp + f * (1.0 - ramp);
  }
  if (r.originalMaxPositions <= 0.0)
    return r.factor == 1.0 ? f : f / r.factor;
  double wavelength = 2.0 * 3.14159265358979323846 / f;
  if (wavelength < r.originalMaxPositions / r.highFreqFactor)
    return f;
  if (wavelength > r.originalMaxPositions / r.lowFreqFactor)
    return f / r.factor;
  double smooth = (r.originalMaxPositions / wavelength - r.lowFreqFactor) /
                  (r.highFreqFactor - r.lowFreqFactor);
  return (1.0 - smooth) * f / r.factor + smooth * f;
}

} // namespace mtrt

#endif // MTRT_SRC_CORE_ROPEFREQUENCIES_H
