// The experts' grouped GEMMs (MoeGemm.h).
#include "cuda/MoeGemm.h"

#include "cuda/CudaCheck.h"

namespace mtrt::cuda {

namespace {

/// C = op(A) op(B) in fp32, or from bf16 operands with C bf16 or fp32;
/// the heuristic's first algorithm, as the shapes change with the routing.
void product(Gemm &gemm, bool bf16, int64_t m, int64_t n, int64_t k,
             const void *a, bool transA, const void *b, bool transB, void *c,
             bool bf16Result) {
  Bf16Operands operands;
  if (bf16) {
    operands.a = static_cast<const __nv_bfloat16 *>(a);
    operands.b = static_cast<const __nv_bfloat16 *>(b);
    operands.result = bf16Result;
  }
  GemmEpilogue epilogue;
  epilogue.untuned = true;
  gemm.run(1, m, n, k, static_cast<const float *>(a), transA,
           static_cast<const float *>(b), transB, static_cast<float *>(c),
           nullptr, false, operands, epilogue);
}

} // namespace

void groupedLinear(Gemm &gemm, cudaStream_t stream, const ExpertGroups &groups,
                   int64_t rows, int64_t in, int64_t out, const void *x,
                   const void *weight, bool transposeWeight, void *y,
                   bool bf16Result) {
  size_t element = groups.bf16 ? 2 : 4, resultElement = bf16Result ? 2 : 4;
  auto *xBytes = static_cast<const char *>(x);
  auto *wBytes = static_cast<const char *>(weight);
  auto *yBytes = static_cast<char *>(y);
  for (int64_t e = 0; e < groups.experts; ++e) {
    int64_t first = groups.offsets[e], count = groups.offsets[e + 1] - first;
    if (count > 0)
      product(gemm, groups.bf16, count, out, in,
              xBytes + static_cast<size_t>(first * in) * element, false,
              wBytes + static_cast<size_t>(e * in * out) * element,
              transposeWeight,
              yBytes + static_cast<size_t>(first * out) * resultElement,
              bf16Result);
  }
  int64_t kept = groups.offsets[groups.experts];
  if (kept < rows)
    MTRT_CUDA_CHECK(
        cudaMemsetAsync(
            yBytes + static_cast<size_t>(kept * out) * resultElement, 0,
            static_cast<size_t>((rows - kept) * out) * resultElement, stream),
        "zeroing the grouped GEMM's rows after the kept ones");
}

void groupedLinearWeightGrad(Gemm &gemm, cudaStream_t stream,
                             const ExpertGroups &groups, int64_t in,
                             int64_t out, const void *x, const void *dy,
                             bool transposeWeight, float *dweight) {
  size_t element = groups.bf16 ? 2 : 4;
  auto *xBytes = static_cast<const char *>(x);
  auto *dyBytes = static_cast<const char *>(dy);
  for (int64_t e = 0; e < groups.experts; ++e) {
    int64_t first = groups.offsets[e], count = groups.offsets[e + 1] - first;
    float *dw = dweight + e * in * out;
    if (count == 0) {
      MTRT_CUDA_CHECK(
          cudaMemsetAsync(dw, 0, sizeof(float) * static_cast<size_t>(in * out),
                          stream),
          "zeroing the weight gradient of an expert without rows");
      continue;
    }
    const char *xe = xBytes + static_cast<size_t>(first * in) * element;
    const char *dye = dyBytes + static_cast<size_t>(first * out) * element;
    if (transposeWeight)
      product(gemm, groups.bf16, out, in, count, dye, true, xe, false, dw,
              false);
    else
      product(gemm, groups.bf16, in, out, count, xe, true, dye, false, dw,
              false);
  }
}

} // namespace mtrt::cuda
