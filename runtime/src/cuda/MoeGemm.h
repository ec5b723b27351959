// The experts' grouped GEMMs of the mixture-of-experts layer: one cuBLASLt
// GEMM per expert on its rows of the permuted tokens, from the expert
// offsets on the host (the executor reads them back once per instruction,
// cuda/MoeOps.cpp; mtrt-moe-bench does the same).
#ifndef MTRT_SRC_CUDA_MOEGEMM_H
#define MTRT_SRC_CUDA_MOEGEMM_H

#include "cuda/Gemm.h"

#include <cstdint>

namespace mtrt::cuda {

/// Rows [offsets[e], offsets[e + 1]) of the permuted tokens are expert e's
/// (experts + 1 host offsets; the kept rows end at offsets[experts]). The
/// operands are fp32, or bf16 (`bf16`) multiplied on the tensor cores with
/// fp32 accumulation.
struct ExpertGroups {
  const int32_t *offsets = nullptr;
  int64_t experts = 0;
  bool bf16 = false;
};

/// y [rows, out] = x_e [count_e, in] @ W_e for each expert, W [E, in, out]
/// (or [E, out, in] with `transposeWeight`); y is bf16 when `bf16Result`
/// (bf16 operands only), and zero from the kept rows to `rows`. Throws
/// Error as Gemm::run, or for a failed memset.
void groupedLinear(Gemm &gemm, cudaStream_t stream, const ExpertGroups &groups,
                   int64_t rows, int64_t in, int64_t out, const void *x,
                   const void *weight, bool transposeWeight, void *y,
                   bool bf16Result);

/// dW_e = x_e^T dy_e ([in, out]), or dy_e^T x_e ([out, in]) with
/// `transposeWeight`, in fp32; zero for an expert without rows.
void groupedLinearWeightGrad(Gemm &gemm, cudaStream_t stream,
                             const ExpertGroups &groups, int64_t in,
                             int64_t out, const void *x, const void *dy,
                             bool transposeWeight, float *dweight);

} // namespace mtrt::cuda

#endif // MTRT_SRC_CUDA_MOEGEMM_H
