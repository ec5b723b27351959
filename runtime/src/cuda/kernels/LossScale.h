// fp16 loss scaling's kernel: unscale the gradients and flag inf or nan.
#ifndef MTRT_SRC_CUDA_KERNELS_LOSSSCALE_H
#define MTRT_SRC_CUDA_KERNELS_LOSSSCALE_H

#include <cuda_runtime_api.h>

#include <cstdint>

namespace mtrt::cuda {

/// grad[i] *= factor for i < n (one float multiply, as
/// host::scaleAndCheckFinite), and *foundNonFinite = 1 if any product is inf
/// or nan (it is never cleared here: the caller zeroes it first). Megatron-
/// LM's _unscale_main_grads_and_check_for_nan on one flat array.
void unscaleAndCheckFinite(cudaStream_t stream, int64_t n, float *grad,
                           float factor, int *foundNonFinite);

} // namespace mtrt::cuda

#endif // MTRT_SRC_CUDA_KERNELS_LOSSSCALE_H
