// Attention dropout's mask words: how flashDropoutMaskKernel
// (FlashAttention.cu) draws them and which words exist, the rule the kernels
// that read the mask (the own and the Hopper attention, forward and
// backward) follow too. Bit j of word rowIndex(b, h, i) * keyBlocks + kb is
// dropoutKeep(sampleKey(b), probabilityRow(h, i) + 64 kb + j), the host's
// keep decision for P[b, h, i, 64 kb + j] (core/Random.h).
#ifndef MTRT_CUDA_KERNELS_ATTENTIONMASK_CUH
#define MTRT_CUDA_KERNELS_ATTENTIONMASK_CUH

#include "core/Random.h"

#include <cstdint>

namespace mtrt::cuda {

/// Keys of a mask word.
constexpr int kMaskWordKeys = 64;

/// Whether query row i (< seqQ) has a word at key block kb: the blocks
/// that hold keys (kb < keyBlocks) and, causal, those its 64-row block
/// reaches (kb <= i / 64). The mask kernel writes exactly these words and
/// the kernels that read the mask read only these.
__host__ __device__ inline bool maskWordSeen(int i, int kb, int keyBlocks,
                                             bool causal) {
  return kb < keyBlocks && (!causal || kb <= i / kMaskWordKeys);
}

/// The keep bits of the 16 positions from `first` of the sample whose key
/// is `key`: four draws of four lanes where `first` is a multiple of 4
/// (random::dropoutKeepSpread, the lanes compared at once), else a draw a
/// bit.
__device__ inline uint32_t drawMaskBits16(uint64_t key, uint64_t first,
                                          uint32_t threshold16,
                                          const random::DropoutLanes &lanes) {
  if ((first & 3) == 0) {
    uint64_t counter = random::drawCounter(key, first >> 2);
    uint32_t spread = 0;
#pragma unroll
    for (int n = 0; n < 4; ++n)
      spread |= random::dropoutKeepSpread(
                    random::mix64(counter + n * random::kCounterStep), lanes)
                << (4 * n);
    return random::dropoutGatherNibbles(spread);
  }
  uint32_t bits16 = 0;
  for (int j = 0; j < 16; ++j)
    bits16 |=
        static_cast<uint32_t>(random::dropoutKeep(key, first + j, threshold16))
        << j;
  return bits16;
}

/// A mask word from the 16 bits of each of the four lanes of a quad (lane
/// % 4 = quarter: bits 16 quarter .. +15); every lane of the warp calls it,
/// the quad's lanes all get the word.
__device__ inline uint64_t quadMaskWord(uint32_t bits16, int quarter) {
  // Quarters 0 and 1 make the word's low half, 2 and 3 its high half.
  uint32_t half = bits16 << (16 * (quarter & 1));
  half |= __shfl_xor_sync(0xffffffffu, half, 1);
  uint32_t other = __shfl_xor_sync(0xffffffffu, half, 2);
  return (quarter & 2) ? other | static_cast<uint64_t>(half) << 32
                       : half | static_cast<uint64_t>(other) << 32;
}

} // namespace mtrt::cuda

#endif // MTRT_CUDA_KERNELS_ATTENTIONMASK_CUH
