// Flash attention through cuDNN's fused attention engines (cuDNN 9's backend
// graph API), beside the own kernels of kernels/FlashAttention.cu.
//
// Why: at issue 22's shapes (causal, bf16, no dropout) cuDNN's Hopper kernels
// (wgmma, TMA, warp specialization) run about twice as fast as the own
// mma.sync kernels (bench/NOTES.md, session 16). The own kernels stay for
// dropout (whose keep mask must be the host's, bit for bit), fp32 tensors,
// the deterministic backward, and wherever cuDNN declines a shape.
//
// The graphs are the operation patterns cuDNN's runtime fusion engines take
// as scaled dot-product attention: the forward Q K^T, a scale, the causal
// mask (row and column indices, compare, select), the softmax with its
// statistics (max, subtract, exp, sum, log: the natural logsumexp that the
// own kernels keep, [batch, headsQ, seqQ] fp32) and the product with V; the
// backward the same scores rebuilt from the logsumexp, then dV, dP, dS, dK
// and dQ (through an fp32 accumulator). Tensors keep the FlashLayout strides
// of the own kernels (q, k, v in place in the qkv GEMM's result).
//
// Building a plan (heuristics, then the first engine configuration that
// finalizes) takes milliseconds to seconds: plans are cached per shape and
// layout, and built before a CUDA graph captures their launches.
#ifndef MTRT_SRC_CUDA_CUDNNATTENTION_H
#define MTRT_SRC_CUDA_CUDNNATTENTION_H

#include "cuda/kernels/Kernels.h"

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

namespace mtrt::cuda {

/// "" when this build has cuDNN and the loaded library is one it can use
/// (cuDNN 9, the major version of the headers it was built with), else why
/// not (no cuDNN in the build, no libcudnn at run time, another major
/// version).
std::string cudnnAttentionUnavailableReason();

/// "" when the shapes and tensors are ones this project sends to cuDNN,
/// else why not: dropout, fp32 tensors, unequal head dimensions, head
/// dimensions not a multiple of 8 or over 128, causal with unequal
/// sequences. cuDNN itself may still decline (CudnnAttention::prepare).
std::string cudnnAttentionUnsupportedReason(const AttentionParams &params,
                                            const FlashTensors &io);

/// One device's cuDNN handle and its cached plans.
///
/// Thread-safety: one thread uses an instance (as a Context).
class CudnnAttention {
public:
  /// Creates the handle; throws Error (UNAVAILABLE) with
  /// cudnnAttentionUnavailableReason when cuDNN cannot be used.
  CudnnAttention();
  ~CudnnAttention();
  CudnnAttention(const CudnnAttention &) = delete;
  CudnnAttention &operator=(const CudnnAttention &) = delete;

  /// The loaded library's version, as cudnnGetVersion (e.g. 91900).
  static size_t libraryVersion();

  /// Builds (or finds) the forward plan, or with `backward` the backward
  /// plan, for these shapes and io's layouts (pointers are not read).
  /// Returns "" and sets *workspaceBytes to the plan's own workspace (the
  /// backward's softmax sums and dq accumulator not counted: see
  /// backwardScratchBytes), or returns why cuDNN declined (no engine
  /// finalizes the graph). Throws Error for a failing cuDNN call.
  std::string prepare(const AttentionParams &params, const FlashTensors &io,
                      bool backward, size_t *workspaceBytes);

  /// io.out and logsumexp [batch, headsQ, seqQ], as flashAttentionForward
  /// without dropout; outCopy (packed bf16, the copy the gradient reads)
  /// may be null, and so may io.out when outCopy is not. `workspace` holds
  /// workspaceBytes (at least what prepare reported, else Error
  /// FAILED_PRECONDITION naming both). Asynchronous on `stream`.
  void forward(cudaStream_t stream, const AttentionParams &params,
               const FlashTensors &io, __nv_bfloat16 *outCopy, float *logsumexp,
               void *workspace, size_t workspaceBytes);

  /// The backward's scratch for a plan needing `workspaceBytes` of its own:
  /// the softmax sums (a float per query row), the fp32 dq accumulator,
  /// then the plan's workspace, each 256-byte aligned.
  static size_t backwardScratchBytes(const AttentionParams &params,
                                     size_t workspaceBytes);

  /// io.dq, io.dk, io.dv (all required) from io.q, k, v, dout, the
  /// forward's packed bf16 `out` and its logsumexp. `scratch` holds
  /// scratchBytes (at least backwardScratchBytes of the plan's workspace,
  /// else Error FAILED_PRECONDITION).
  void backward(cudaStream_t stream, const AttentionParams &params,
                const FlashTensors &io, const __nv_bfloat16 *out,
                const float *logsumexp, void *scratch, size_t scratchBytes);

private:
  struct Plan;
  const Plan &plan(const AttentionParams &params, const FlashTensors &io,
                   bool backward);

  void *handle_ = nullptr;
  std::map<std::vector<int64_t>, std::unique_ptr<Plan>> plans_;
};

} // namespace mtrt::cuda

#endif // MTRT_SRC_CUDA_CUDNNATTENTION_H
