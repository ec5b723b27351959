// The Hopper forward of flash attention (HopperAttention.cu, compiled for
// sm_90a only): warpgroup MMA, TMA tile loads and warp specialization, the
// same out, logsumexp and dropout keep bits as flashAttentionForward.
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

} // namespace mtrt::cuda

#endif // MTRT_SRC_CUDA_KERNELS_HOPPERATTENTION_H
