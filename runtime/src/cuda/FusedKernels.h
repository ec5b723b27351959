// The bundle's generated kernels (mt.fused groups, format versions 3 to 7),
// loaded once from its cubin (or its PTX, JIT-compiled by the driver, on GPUs
// the cubin does not run on) and launched per fused instruction.
#ifndef MTRT_SRC_CUDA_FUSEDKERNELS_H
#define MTRT_SRC_CUDA_FUSEDKERNELS_H

#include "core/Bundle.h"
#include "cuda/kernels/Kernels.h"

#include <cuda_runtime_api.h>

#include <cstdint>
#include <string>
#include <vector>

namespace mtrt::cuda {

/// Loads the kernels through the CUDA runtime's library API
/// (cudaLibraryLoadData, cudaLibraryGetKernel: no libcuda link). The launch
/// contract is include/megatron/Target/FusedKernels.h's: (n, vectors,
/// bf16 type mask, the mask tile and a seed key per dropout when the group
/// has dropout, operands..., results...); kernels of format versions 3 to
/// 5 take no type mask and f32 storage only; the dropout of kernels before
/// version 7 (keyed on the step) is refused.
class FusedKernelLibrary {
public:
  /// Throws Error naming the bundle when neither the cubin nor the PTX
  /// loads on the current device, or a named kernel is missing.
  FusedKernelLibrary(const Bundle &bundle);
  ~FusedKernelLibrary();
  FusedKernelLibrary(const FusedKernelLibrary &) = delete;
  FusedKernelLibrary &operator=(const FusedKernelLibrary &) = delete;

  /// Whether the PTX was loaded because the cubin does not run here.
  bool fromPtx() const { return fromPtx_; }

  /// Whether the kernels can store fused instruction operands and results
  /// in bf16: operand `index` (or result index - operands) of a fused
  /// instruction with `operands` operands.
  bool takesBf16(size_t index) const;

  /// Launches the kernel of fused instruction `inst` on `stream`:
  /// `operands` and `results` are its device elements (one shape of `n`
  /// elements, each fp32 or, where takesBf16, bf16), `tile` keys its
  /// dropouts (core/Random.h). `where` names the instruction for errors.
  /// Throws Error (FAILED_PRECONDITION) for a dropout in a kernel of a
  /// bundle before format version 7, whose masks are keyed on the step.
  /// With column sums (`sums`, fusedColumnSums: each results[summed]'s
  /// column sums into `out`, f32), `results` are the stored results only
  /// and the group's elements are [n / cols, cols]: where every pointer
  /// is 16-byte aligned and cols a multiple of 8, the kernel's column-sum
  /// form writes each sum's partial rows to `scratch` (one
  /// scratch::biasGradOpBytes(rows, cols) block after another) and
  /// columnSumTotals adds them up; else the kernel, then biasGrad of each
  /// summed result (the same bits).
  struct ColumnSum {
    size_t summed = 0;
    float *out = nullptr;
  };
  void launch(cudaStream_t stream, const Instruction &inst, int64_t n,
              const std::vector<InElements> &operands,
              const std::vector<OutElements> &results,
              const random::MaskTile &tile, const std::string &where,
              int64_t cols = 0, const std::vector<ColumnSum> &sums = {},
              void *scratch = nullptr) const;

private:
  cudaLibrary_t library_ = nullptr;
  std::vector<cudaKernel_t> kernels_;
  /// Each kernel's column-sum form (NAME_sums), null where it has none.
  std::vector<cudaKernel_t> sumKernels_;
  bool fromPtx_ = false;
  bool typeMask_ = false;
  bool sampleKeys_ = false;
  bool fourPositionDraws_ = false;
  int64_t version_ = 0;
  std::string bundleName_;
};

} // namespace mtrt::cuda

#endif // MTRT_SRC_CUDA_FUSEDKERNELS_H
