// RoPE's inverse frequencies, with Hugging Face's "linear" and "llama3"
// scalings, in one formula the host kernels and the CUDA table kernel both
// evaluate (in double), so the two backends rotate by the same angles.
#ifndef MTRT_SRC_CORE_ROPEFREQUENCIES_H
#define MTRT_SRC_CORE_ROPEFREQUENCIES_H

#include <cmath>
#include <cstdint>

#if defined(__CUDACC__)
#define MTRT_HOST_DEVICE __host__ __device__
#else
#define MTRT_HOST_DEVICE
#endif

namespace mtrt {

/// rope's frequency attributes. A plain base (the implicit conversion) is
/// unscaled RoPE. factor alone divides every inverse frequency ("linear");
/// with originalMaxPositions > 0 it is Llama 3.1's blend ("llama3").
struct RopeFrequencies {
  RopeFrequencies(double base = 10000.0) : base(base) {}
  double base;
  double factor = 1.0;
  double lowFreqFactor = 0.0;
  double highFreqFactor = 0.0;
  double originalMaxPositions = 0.0;
};

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
