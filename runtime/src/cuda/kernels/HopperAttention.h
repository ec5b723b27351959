// The Hopper forward and backward of flash attention (HopperAttention.cu,
// compiled for sm_90a only): warpgroup MMA, TMA tile loads and warp
// specialization, the same out, logsumexp and dropout keep bits as
// flashAttentionForward, and the gradients of flashAttentionBackward (the
// same keep bits read back).
#ifndef MTRT_SRC_CUDA_KERNELS_HOPPERATTENTION_H
#define MTRT_SRC_CUDA_KERNELS_HOPPERATTENTION_H

#include "cuda/kernels/Kernels.h"

#include <string>

namespace mtrt::cuda {

/// Draws the dropout keep bits flashAttentionForward draws first (params'
/// dropoutP > 0) into `mask` (of flashAttentionMaskBytes), for another
/// forward that reads the same decisions (FlashAttention.cu).
void flashAttentionDropoutMask(cudaStream_t stream,
                               const AttentionParams &params, uint64_t *mask);

/// Empty when hopperAttentionForward takes this call on the current device,
/// else why not: flashAttentionUnsupportedReason's rules, then head
/// dimension 64 or 128, bf16 inputs, q/k/v strides and data pointers at
/// multiples of 8 elements (16 bytes, the tensor copy engine's rule), a
/// device of compute capability 9.0.
std::string hopperAttentionUnsupportedReason(const AttentionParams &params,
                                             const FlashTensors &io);

/// io.out and logsumexp as flashAttentionForward (out and outCopy may be
/// null); with dropout the keep bits are drawn into `mask` (of
/// flashAttentionMaskBytes) by the own forward's mask kernel first, so that
/// the gradient and the host read the same decisions.
void hopperAttentionForward(cudaStream_t stream, const AttentionParams &params,
                            const FlashTensors &io, __nv_bfloat16 *outCopy,
                            float *logsumexp, uint64_t *mask);

/// Empty when hopperAttentionBackward takes this call on the current
/// device, else why not: hopperAttentionUnsupportedReason's rules, dout's
/// as q's (16-byte aligned rows), and no deterministic dq asked for
/// (FlashTensors::deterministic: the Hopper backward adds dq by fp32
/// reductions in a varying order; the own kernels give fixed bits).
std::string hopperAttentionBackwardUnsupportedReason(const AttentionParams &params,
                                                     const FlashTensors &io);

/// io.dq, io.dk, io.dv (each may be null; fp32 or bf16 by io.outputsBf16)
/// as flashAttentionBackward, from bf16 q, k, v, dout, the forward's bf16
/// out copy (flashAttentionSavedOutputBytes), logsumexp and, with dropout,
/// its mask (the keep bits drawn by the forward, read back). `scratch`:
/// flashAttentionBackwardScratchBytes (delta, then the fp32 dq sums).
void hopperAttentionBackward(cudaStream_t stream, const AttentionParams &params,
                             const FlashTensors &io, const __nv_bfloat16 *out,
                             const float *logsumexp, const uint64_t *mask,
                             void *scratch);

} // namespace mtrt::cuda

#endif // MTRT_SRC_CUDA_KERNELS_HOPPERATTENTION_H
