// A counter-based random generator: every value is a pure function of (seed,
// stream, index).
//
// Dropout masks and parameter initialization are functions of an element's
// global position (for a mask: the sample and the position within it),
// never of a generator's state or of which thread, rank or micro-batch
// draws them, so they do not change with the thread count, the parallel
// layout or the split of a batch into micro-batches. Header-only and usable
// from CUDA device code, so the CUDA backend computes the same bits as the
// host.
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
//   dropout masks are keyed on the sample, never on the micro-batch that
//   carries it: sample s is the consumed-sample index of the sample (its
//   position in the order training reads the data: megatron-train's global
//   micro-batch m of an iteration that starts at `consumed` holds samples
//   consumed + m * microBatch * dataParallel + [0, microBatch *
//   dataParallel), data rank d's rows from d * microBatch), so data
//   parallelism, gradient accumulation and any split into micro-batches
//   draw, for each sample, the masks one rank draws. The keyed tensor's
//   first dimension is the micro-batch's samples; a sample's key is
//     sampleKey(seed, s) = streamKey(seed, s)
//                        = mix64(seedKey(seed) ^ s),
//     seedKey(seed)      = mix64(seed ^ 0x6A09E667F3BCC909),
//   with seed the op's seed, and `position` below counts row-major within
//   the sample's slice of the global tensor (dimensions 1 onwards).
//   dropout (mt.dropout, dropoutKeep): element (s, position) is kept
//     iff 16-bit lane (position % 4) of bitsFromKey(sampleKey(seed, s),
//     position / 4), i.e. bits >> (16 * (position % 4)) & 0xFFFF, is >=
//     dropoutThreshold16(p) = round(p * 65536): one draw serves four
//     consecutive positions of a sample (a quarter of the hashing of one
//     draw per element), and p is quantized to 2^-16. A rank's tile of the
//     global tensor (MaskTile: the tile's first sample and its slice of
//     each sample's dimensions) maps its element i to (s, position) with
//     maskSample and maskPosition.
//   attention dropout (mt.attention): the same rule over the probabilities
//     [B, Hq, S, Sk], sample s = the micro-batch's first sample + global
//     batch row b, position = (h * S + i) * Sk + j with h the global query
//     head.
//   initialization: seed = the run's seed, stream = the parameter's id,
//     index = the element's row-major index in the parameter's global shape.
//   Evaluation has no dropout.
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

/// What bitsFromKey's counter advances by from one index to the next
/// (splitmix64's increment, the golden ratio's 64 bits).
constexpr uint64_t kCounterStep = 0x9E3779B97F4A7C15ull;

/// The splitmix64 state of element `index` of the stream whose key is
/// `key`. It advances by kCounterStep from one index to the next, so loops
/// over consecutive draws step it instead of multiplying:
/// bitsFromKey(key, index + k) = mix64(drawCounter(key, index) + k *
/// kCounterStep).
MTRT_HOST_DEVICE inline uint64_t drawCounter(uint64_t key, uint64_t index) {
  return key + (index + 1) * kCounterStep;
}

/// 64 random bits for element `index` of a stream whose key is `key`.
MTRT_HOST_DEVICE inline uint64_t bitsFromKey(uint64_t key, uint64_t index) {
  return mix64(drawCounter(key, index));
}

/// 64 random bits for (seed, stream, index).
MTRT_HOST_DEVICE inline uint64_t randomBits(uint64_t seed, uint64_t stream,
                                            uint64_t index) {
  return bitsFromKey(streamKey(seed, stream), index);
}

/// The part of streamKey that depends on the seed alone: streamKey(seed,
/// stream) = mix64(seedKey(seed) ^ stream).
MTRT_HOST_DEVICE inline uint64_t seedKey(uint64_t seed) {
  return mix64(seed ^ 0x6A09E667F3BCC909ull);
}

/// The key of sample `sample`'s dropout masks of the op whose seed has key
/// `seedKey`: streamKey(seed, sample).
MTRT_HOST_DEVICE inline uint64_t sampleKey(uint64_t seedKey, uint64_t sample) {
  return mix64(seedKey ^ sample);
}

/// The top 24 bits as a float in [0, 1).
MTRT_HOST_DEVICE inline float uniformFloat(uint64_t bits) {
  return static_cast<float>(bits >> 40) * 0x1.0p-24f;
}

/// The top 53 bits as a double in [0, 1).
MTRT_HOST_DEVICE inline double uniformDouble(uint64_t bits) {
  return static_cast<double>(bits >> 11) * 0x1.0p-53;
}

/// The most dimensions of a sample's slice that a MaskTile describes (after
/// makeMaskTile merges the whole ones).
constexpr unsigned kMaskTileDims = 4;

/// Where a rank's tile of a dropout's tensor lies among the samples and
/// positions that key the mask: its rows (dimension 0) are samples
/// firstSample, firstSample + 1, ...; each holds sampleElements elements,
/// row-major over `dims` dimensions, dimension d being [offset[d], offset[d]
/// + local[d]) of global[d]. dims = 0: the tile holds whole samples, and
/// element i is position i % sampleElements. Plain data, passed by value to
/// the CUDA kernels.
struct MaskTile {
  uint64_t firstSample;
  uint64_t sampleElements;
  uint64_t dims;
  uint64_t local[kMaskTileDims];
  uint64_t global[kMaskTileDims];
  uint64_t offset[kMaskTileDims];
};

/// The sample of the tile's element i (row-major in the tile).
MTRT_HOST_DEVICE inline uint64_t maskSample(const MaskTile &tile, uint64_t i) {
  return tile.firstSample + i / tile.sampleElements;
}

/// The position within its sample of the tile's element i: row-major in
/// the sample's slice of the global tensor.
MTRT_HOST_DEVICE inline uint64_t maskPosition(const MaskTile &tile,
                                              uint64_t i) {
  uint64_t local = i % tile.sampleElements;
  if (tile.dims == 0)
    return local;
  uint64_t position = 0, stride = 1;
  for (uint64_t d = tile.dims; d-- > 0;) {
    position += (local % tile.local[d] + tile.offset[d]) * stride;
    local /= tile.local[d];
    stride *= tile.global[d];
  }
  return position;
}

#if !defined(__CUDACC_RTC__)
/// The MaskTile of a tile of `rank` dimensions (local shape, global shape,
/// offsets; dimension 0 the samples) of the micro-batch whose global row 0
/// is sample `firstSample`. Adjacent dimensions merge where the inner one
/// is whole, and a whole slice needs none; returns false when more than
/// kMaskTileDims remain (BundleOpChecker admits at most kMaskTileDims + 1
/// dimensions, so the runtime's tiles always fit). A rank-0 tensor is one
/// sample of one element.
inline bool makeMaskTile(const int64_t *local, const int64_t *global,
                         const int64_t *offsets, unsigned rank,
                         uint64_t firstSample, MaskTile &tile) {
  tile = MaskTile{};
  tile.firstSample =
      firstSample + (rank ? static_cast<uint64_t>(offsets[0]) : 0);
  tile.sampleElements = 1;
  uint64_t merged[3][kMaskTileDims + 1];
  unsigned dims = 0;
  for (unsigned d = 1; d < rank; ++d) {
    uint64_t l = static_cast<uint64_t>(local[d]);
    uint64_t g = static_cast<uint64_t>(global[d]);
    uint64_t o = static_cast<uint64_t>(offsets[d]);
    tile.sampleElements *= l;
    if (dims > 0 && l == g) { // whole: extends the dimension before it
      merged[0][dims - 1] *= g;
      merged[1][dims - 1] *= g;
      merged[2][dims - 1] *= g;
      continue;
    }
    if (dims == kMaskTileDims + 1)
      return false;
    merged[0][dims] = l;
    merged[1][dims] = g;
    merged[2][dims] = o;
    ++dims;
  }
  if (dims == 1 && merged[0][0] == merged[1][0])
    dims = 0; // the whole slice: position = the element's index in it
  if (dims > kMaskTileDims)
    return false;
  tile.dims = dims;
  for (unsigned d = 0; d < dims; ++d) {
    tile.local[d] = merged[0][d];
    tile.global[d] = merged[1][d];
    tile.offset[d] = merged[2][d];
  }
  return true;
}
#endif

/// dropoutKeep's threshold for dropout probability p: round(p * 65536), 0
/// for p <= 0, 65536 (nothing kept) for p >= 1.
MTRT_HOST_DEVICE inline uint32_t dropoutThreshold16(double p) {
  if (!(p > 0))
    return 0;
  if (p >= 1)
    return 65536;
  return static_cast<uint32_t>(p * 65536.0 + 0.5);
}

/// Lane `lane` (0-3) of a four-position dropout draw `bits`: kept iff the
/// lane's 16 bits are >= threshold16.
MTRT_HOST_DEVICE inline bool dropoutLaneKeep(uint64_t bits, unsigned lane,
                                             uint32_t threshold16) {
  return ((bits >> (16 * lane)) & 0xFFFFu) >= threshold16;
}

/// Whether dropout keeps position `position` of the sample whose key is
/// `key` (sampleKey; see the file comment): lane position % 4 of the draw
/// position / 4.
MTRT_HOST_DEVICE inline bool dropoutKeep(uint64_t key, uint64_t position,
                                         uint32_t threshold16) {
  return dropoutLaneKeep(bitsFromKey(key, position >> 2),
                         static_cast<unsigned>(position & 3), threshold16);
}

/// The four lanes of dropout draws compared at once (SIMD within a 32-bit
/// register), for kernels that draw whole words of keep bits: lane f of a
/// half-word is kept iff f >= threshold16, i.e. iff f + (65536 -
/// threshold16) carries out of bit 15. The low 15 bits of each half-word
/// and of that addend sum without crossing into the other half-word; the
/// carry out of bit 15 is the majority of the two bit-15s and that sum's
/// bit 15, and with the addend's bit 15 fixed the majority is an OR (addend
/// >= 32768) or an AND. Equal to dropoutLaneKeep for every threshold16 in
/// [0, 65536].
struct DropoutLanes {
  uint32_t addend15; // (65536 - threshold16) & 0x7FFF in both half-words
  bool orCarry;      // 65536 - threshold16 >= 32768
  uint32_t all;      // 0x80008000 when everything is kept (threshold16 0)
  uint32_t none;     // 0 when nothing is (threshold16 >= 65536), else ~0
};

MTRT_HOST_DEVICE inline DropoutLanes dropoutLanes(uint32_t threshold16) {
  DropoutLanes lanes{};
  uint32_t addend = threshold16 >= 65536 ? 0 : 65536 - threshold16;
  lanes.addend15 = (addend & 0x7FFFu) * 0x00010001u;
  lanes.orCarry = addend >= 32768;
  lanes.all = threshold16 == 0 ? 0x80008000u : 0u;
  lanes.none = threshold16 >= 65536 ? 0u : ~0u;
  return lanes;
}

/// The keep bits of a 32-bit word's two lanes: bit 15 for the low
/// half-word, bit 31 for the high one (the other bits zero).
MTRT_HOST_DEVICE inline uint32_t dropoutKeepPair(uint32_t word,
                                                 const DropoutLanes &lanes) {
  uint32_t sum = (word & 0x7FFF7FFFu) + lanes.addend15;
  uint32_t carry = lanes.orCarry ? (word | sum) : (word & sum);
  return ((carry & 0x80008000u) | lanes.all) & lanes.none;
}

/// A draw's four keep bits spread for packing: lane 0 at bit 0, lane 1 at
/// bit 16, lane 2 at bit 2, lane 3 at bit 18. Spread draws shifted left by
/// 4 n (n < 4) do not overlap; dropoutGatherNibbles packs their OR into
/// bits 4 n + lane.
MTRT_HOST_DEVICE inline uint32_t dropoutKeepSpread(uint64_t bits,
                                                   const DropoutLanes &lanes) {
  uint32_t low = dropoutKeepPair(static_cast<uint32_t>(bits), lanes);
  uint32_t high = dropoutKeepPair(static_cast<uint32_t>(bits >> 32), lanes);
  return (low >> 15) | (high >> 13);
}

/// Bits 4 n + lane (16 in all) from the OR of up to four dropoutKeepSpread
/// results, each shifted left by 4 n.
MTRT_HOST_DEVICE inline uint32_t dropoutGatherNibbles(uint32_t spread) {
  return (spread | (spread >> 15)) & 0xFFFFu;
}

/// Whether dropout keeps the tile's element i, for the op whose seed has
/// key `seedKey` (see the file comment); threshold16 =
/// dropoutThreshold16(p).
MTRT_HOST_DEVICE inline bool dropoutTileKeep(uint64_t seedKey,
                                             const MaskTile &tile, uint64_t i,
                                             uint32_t threshold16) {
  return dropoutKeep(sampleKey(seedKey, maskSample(tile, i)),
                     maskPosition(tile, i), threshold16);
}

/// Whether every element index below `n`, every sample's element count and
/// every position of the tile fit in 32 bits, so that maskSamplePosition
/// may divide in 32 bits.
MTRT_HOST_DEVICE inline bool maskTileFits32(const MaskTile &tile, uint64_t n) {
  const uint64_t limit = 0xFFFFFFFFull;
  uint64_t positions = tile.sampleElements;
  if (tile.dims != 0) {
    positions = 1;
    for (uint64_t d = 0; d < tile.dims; ++d) {
      if (tile.global[d] > limit)
        return false;
      positions *= tile.global[d];
      if (positions > limit)
        return false;
    }
  }
  return n <= limit && tile.sampleElements <= limit && positions <= limit;
}

/// maskSample and maskPosition of the tile's element i together; `fits32`
/// (maskTileFits32 for an n above i) divides in 32 bits, which GPUs do many
/// times faster than in 64, for the same integers.
MTRT_HOST_DEVICE inline void maskSamplePosition(const MaskTile &tile,
                                                uint64_t i, bool fits32,
                                                uint64_t &sample,
                                                uint64_t &position) {
  if (!fits32) {
    sample = maskSample(tile, i);
    position = maskPosition(tile, i);
    return;
  }
  const uint32_t elements = static_cast<uint32_t>(tile.sampleElements);
  const uint32_t index = static_cast<uint32_t>(i);
  sample = tile.firstSample + index / elements;
  uint32_t local = index % elements;
  if (tile.dims == 0) {
    position = local;
    return;
  }
  uint32_t at = 0, stride = 1;
  for (uint64_t d = tile.dims; d-- > 0;) {
    const uint32_t extent = static_cast<uint32_t>(tile.local[d]);
    at += (local % extent + static_cast<uint32_t>(tile.offset[d])) * stride;
    local /= extent;
    stride *= static_cast<uint32_t>(tile.global[d]);
  }
  position = at;
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
