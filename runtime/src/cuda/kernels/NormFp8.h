// The norms' forward with FP8 codes for their result (Norms.cu): the
// executor's fused FP8 casts (Fp8Ops.cpp), where an fp8_quantize is the
// only reader of a norm's result.
#ifndef MTRT_SRC_CUDA_KERNELS_NORMFP8_H
#define MTRT_SRC_CUDA_KERNELS_NORMFP8_H

#include "cuda/kernels/Kernels.h"

namespace mtrt::cuda {

/// Where a norm writes FP8 codes instead of its result: codes of
/// y * *scale in `format`, *amax = max(*amax, |y|) (the caller zeroes it),
/// y rounded to bf16 first when the result is held in bf16: castToFp8's
/// bits from the result the plain kernel would store. No codes: the plain
/// kernel.
struct NormFp8Out {
  uint8_t *codes = nullptr;
  const float *scale = nullptr;
  float *amax = nullptr;
  fp8::Format format = fp8::Format::E4M3;
};

/// layerNormForward and rmsNormForward writing `fp8`'s codes; y names the
/// result's storage (its data is not written).
void layerNormToFp8(cudaStream_t stream, int64_t rows, int64_t hidden,
                    NormRows x, const float *weight, const float *bias,
                    double eps, NormRowsOut y, NormFp8Out fp8);
void rmsNormToFp8(cudaStream_t stream, int64_t rows, int64_t hidden, NormRows x,
                  const float *weight, double eps, NormRowsOut y,
                  NormFp8Out fp8);

} // namespace mtrt::cuda

#endif // MTRT_SRC_CUDA_KERNELS_NORMFP8_H
