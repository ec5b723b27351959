// A counter-based random generator: every value is a pure function of (seed, stream, index).
//
// Dropout masks and parameter initialization are functions of an element's
// global position, never of a generator's state or of which thread or rank
// draws them, so they do not change with the thread count or the parallel
// layout. Header-only and usable from CUDA device code, so the CUDA backend
// computes the same bits as the host.
//
// The exact formulas (all arithmetic on uint64_t, modulo 2^64):
//
//   mix64(z):                     the splitmix64 finalizer (Stafford's Mix13)
//     z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9
//     z = (z ^ (z >> 27)) * 0x94D049BB133111EB
//     return z ^ (z >> 31)
//
//   streamKey(seed, stream)  = mix64(mix64(seed ^ 0x6A09E667F3BCC909) ^ stream)
//   randomBits(seed, stream, index)
//                            = mix64(streamKey(seed, stream)
//                                    + (index + 1) * 0x9E3779B97F4A7C15)
//
// i.e. element `index` of a splitmix64 sequence whose state starts at the
// stream's key. Uniforms take the top bits, so they are exact binary
// fractions:
//
//   uniformFloat(bits)  = float(bits >> 40) * 2^-24   in [0, 1), 24 bits
//   uniformDouble(bits) = double(bits >> 11) * 2^-53  in [0, 1), 53 bits
//
// Normals use Box-Muller on two consecutive counters, in double:
//
//   u1 = 1 - uniformDouble(randomBits(seed, stream, 2 * index))      in (0, 1]
//   u2 = uniformDouble(randomBits(seed, stream, 2 * index + 1))      in [0, 1)
//   normal(seed, stream, index) = sqrt(-2 log u1) * cos(2 pi u2)
//
// The uniforms are bit-exact everywhere; a normal depends on the platform's
// double log and cos, which can differ in the last unit between libraries
// (rounded to float, such differences almost never show).
//
// Keys used by the runtime:
//   dropout (mt.dropout): seed = the op's seed, stream = the training step,
//     index = the element's row-major index in the op's tensor; an element
//     is kept iff uniformFloat(randomBits(...)) >= float(p).
//   attention dropout (mt.attention, attentionDropoutKeep): the same key
//     (seed, step), index = the row-major index in the global probability
//     tensor [B, Hq, S, Sk]; one draw serves four consecutive elements:
//     element index is kept iff 16-bit lane (index % 4) of
//     randomBits(seed, step, index / 4), i.e. bits >> (16 * (index % 4))
//     & 0xFFFF, is >= dropoutThreshold16(p) = round(p * 65536). A quarter
//     of the hashes of the per-element definition (attention's mask is the
//     larger part of its dropout cost); p is quantized to 2^-16.
//   initialization: seed = the run's seed, stream = the parameter's id,
//     index = the element's row-major index in the parameter's global shape.
#ifndef MTRT_SRC_CORE_RANDOM_H
#define MTRT_SRC_CORE_RANDOM_H

// NVRTC compiles without the host's standard headers: there the including
// source provides uint64_t (e.g. from <cuda/std/cstdint>); the global double
// sqrt, log and cos are built in.
#if !defined(__CUDACC_RTC__)
#include <cmath>
#include <cstdint>
#endif

#if defined(__CUDACC__)
#define MTRT_HOST_DEVICE __host__ __device__
#else
#define MTRT_HOST_DEVICE
#endif

namespace mtrt::random {

/// The splitmix64 output function: a bijection on 64 bits with full
/// avalanche.
MTRT_HOST_DEVICE inline uint64_t mix64(uint64_t z) {
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

/// The starting state of stream `stream` of `seed`. Loops over many indices
/// of one stream can compute it once and call bitsFromKey.
MTRT_HOST_DEVICE inline uint64_t streamKey(uint64_t seed, uint64_t stream) {
  return mix64(mix64(seed ^ 0x6A09E667F3BCC909ull) ^ stream);
}

/// 64 random bits for element `index` of a stream whose key is `key`.
MTRT_HOST_DEVICE inline uint64_t bitsFromKey(uint64_t key, uint64_t index) {
  return mix64(key + (index + 1) * 0x9E3779B97F4A7C15ull);
}

/// 64 random bits for (seed, stream, index).
MTRT_HOST_DEVICE inline uint64_t randomBits(uint64_t seed, uint64_t stream,
                                            uint64_t index) {
  return bitsFromKey(streamKey(seed, stream), index);
}

/// The top 24 bits as a float in [0, 1).
MTRT_HOST_DEVICE inline float uniformFloat(uint64_t bits) {
  return static_cast<float>(bits >> 40) * 0x1.0p-24f;
}

/// The top 53 bits as a double in [0, 1).
MTRT_HOST_DEVICE inline double uniformDouble(uint64_t bits) {
  return static_cast<double>(bits >> 11) * 0x1.0p-53;
}

/// Whether dropout with probability `p` keeps element `index` of the stream
/// with key `key`: kept iff uniformFloat >= float(p), so elements are kept
/// with probability 1 - p (to 2^-24).
MTRT_HOST_DEVICE inline bool dropoutKeep(uint64_t key, uint64_t index,
                                         float p) {
  return uniformFloat(bitsFromKey(key, index)) >= p;
}

/// attentionDropoutKeep's threshold for dropout probability p: round(p *
/// 65536), 0 for p <= 0, 65536 (nothing kept) for p >= 1.
MTRT_HOST_DEVICE inline uint32_t dropoutThreshold16(double p) {
  if (!(p > 0))
    return 0;
  if (p >= 1)
    return 65536;
  return static_cast<uint32_t>(p * 65536.0 + 0.5);
}

/// Lane `lane` (0-3) of a four-element attention dropout draw `bits`: kept
/// iff the lane's 16 bits are >= threshold16.
MTRT_HOST_DEVICE inline bool dropoutLaneKeep(uint64_t bits, unsigned lane,
                                             uint32_t threshold16) {
  return ((bits >> (16 * lane)) & 0xFFFFu) >= threshold16;
}

/// Whether attention dropout keeps element `index` of the probability
/// tensor (see the file comment): lane index % 4 of the draw index / 4.
MTRT_HOST_DEVICE inline bool attentionDropoutKeep(uint64_t key, uint64_t index,
                                                  uint32_t threshold16) {
  return dropoutLaneKeep(bitsFromKey(key, index >> 2),
                         static_cast<unsigned>(index & 3), threshold16);
}

/// A standard normal for element `index` of the stream with key `key`, by
/// Box-Muller over counters 2*index and 2*index+1 (see the file comment).
MTRT_HOST_DEVICE inline double normalFromKey(uint64_t key, uint64_t index) {
  double u1 = 1.0 - uniformDouble(bitsFromKey(key, 2 * index));
  double u2 = uniformDouble(bitsFromKey(key, 2 * index + 1));
  const double twoPi = 6.283185307179586476925286766559;
  return ::sqrt(-2.0 * ::log(u1)) * ::cos(twoPi * u2);
}

/// A standard normal for (seed, stream, index).
MTRT_HOST_DEVICE inline double normal(uint64_t seed, uint64_t stream,
                                      uint64_t index) {
  return normalFromKey(streamKey(seed, stream), index);
}

} // namespace mtrt::random

#endif // MTRT_SRC_CORE_RANDOM_H
