// The CUDA backend's kernel blocks, read off a bundle function without a GPU:
// which attention and cross-entropy forwards keep state for which gradient,
// whether the flash kernels run an attention, and each instruction's block
// (core/OpScratch.h's sizes, the ones the compiler's plan uses). The CUDA
// executor runs in these; checkCudaMemoryPlan checks a bundle's plan against
// them on any machine (mtrt-run --check-cuda-plan).
#ifndef MTRT_SRC_CORE_SCRATCHPLAN_H
#define MTRT_SRC_CORE_SCRATCHPLAN_H

#include "core/Bundle.h"
#include "core/OpScratch.h"
#include "host/kernels/Kernels.h"

#include <cstddef>
#include <cstdint>
#include <vector>

namespace mtrt {

/// The shape the scratch sizes read from attention parameters.
scratch::AttentionShape attentionScratchShape(const host::AttentionParams &p);

/// Whether the CUDA backend runs this attention with the flash kernels:
/// under mixed precision, for the shapes they take.
bool runsFlashAttention(const host::AttentionParams &p, bool mixedPrecision);

struct ScratchPlan {
  static constexpr size_t kNoPartner = ~size_t(0);
  /// By instruction: the flash attention_grad an attention keeps its state
  /// for, and back (kNoPartner: none).
  std::vector<size_t> attentionPartner;
  /// By instruction: the cross_entropy_grad a cross_entropy keeps its
  /// logsumexps for, and back.
  std::vector<size_t> lossPartner;
  /// By instruction: its kernel block's bytes (0: none) and the last
  /// instruction that reads it (itself, or the partner gradient).
  std::vector<uint64_t> bytes;
  std::vector<size_t> keptUntil;
  /// By instruction: a paired attention whose output the compiler's memory
  /// plan leaves as the forward wrote it through its gradient (nothing made
  /// from the forward through the gradient, a result or a side buffer,
  /// overlaps the output's bytes, but a reshape of those bytes in place).
  /// Where the backend runs in that plan, the gradient reads the output
  /// there and the forward writes no copy of it (the copy's bytes in its
  /// block stay unused).
  std::vector<bool> outputHeld;
};

/// The kernel blocks of `fn` on the CUDA backend; `mixedPrecision`: the
/// bundle's model precision is bf16. Each GEMM's block holds cuBLASLt's
/// workspace when `gemmWorkspace` (planWorkspaceInGemmBlocks).
ScratchPlan planScratch(const Function &fn, bool mixedPrecision,
                        bool gemmWorkspace);

/// Whether `fn`'s memory plan gives each GEMM instruction cuBLASLt's
/// workspace at the end of its kernel block (the compiler's plans since
/// issue 21, or no GEMM at all). Older plans, and functions without one,
/// leave it out: the CUDA backend then allocates the workspace itself
/// (cuda/Gemm), outside the plan. A plan that holds it for some GEMMs only
/// was not written by any compiler: it is treated as holding it, so the
/// load-time check refuses it, naming the first GEMM without it.
bool planHoldsGemmWorkspace(const Function &fn);

/// Where cuBLASLt's workspace starts in GEMM instruction `inst`'s block.
uint64_t gemmWorkspaceOffset(const Function &fn, const Instruction &inst);

/// The length of the bf16 vector (scratch::gemmBf16VectorBytes) a GEMM with
/// a declared bf16 result and a bias keeps in its block (cuBLASLt's bias in
/// D's type), else 0; and where in the block it starts.
int64_t gemmBf16VectorColumns(const Function &fn, const Instruction &inst);
uint64_t gemmBf16VectorOffset(const Function &fn, const Instruction &inst);

/// Checks `fn`'s memory plan against the CUDA backend's needs, as the CUDA
/// executor does when it loads the bundle: every value's declared bytes and
/// every kernel block of planScratch, and the attention views
/// (readAttentionViews). Throws Error (FAILED_PRECONDITION) naming the
/// instruction and both figures when the plan gives less, or when it has no
/// side buffers, or views the flash kernels cannot run in; INVALID_ARGUMENT for
/// a bundle before format version 8 (its bf16 storage is the CUDA backend's
/// choice, not its types). Sets `gemmWorkspace` to planHoldsGemmWorkspace(fn).
void checkCudaMemoryPlan(const Bundle &bundle, const Function &fn,
                         bool &gemmWorkspace);

} // namespace mtrt

#endif // MTRT_SRC_CORE_SCRATCHPLAN_H
