// The device side of fp16 loss scaling: the gradients times the inverse loss
// scale, and a found-inf flag.
#include "cuda/kernels/KernelSupport.cuh"
#include "cuda/kernels/LossScale.h"

namespace mtrt::cuda {

namespace {

__global__ void unscaleAndCheckFiniteKernel(int64_t n, float *grad,
                                            float factor, int *found) {
  bool local = false;
  MTRT_GRID_STRIDE(i, n) {
    float value = grad[i] * factor;
    grad[i] = value;
    local |= !isfinite(value);
  }
  // One store per warp that saw one; every writer writes 1.
  if (__any_sync(0xffffffffu, local) && threadIdx.x % detail::kWarp == 0)
    *found = 1;
}

} // namespace

void unscaleAndCheckFinite(cudaStream_t stream, int64_t n, float *grad,
                           float factor, int *foundNonFinite) {
  if (n > 0)
    unscaleAndCheckFiniteKernel<<<detail::blocksFor(n), detail::kThreads, 0,
                                  stream>>>(n, grad, factor, foundNonFinite);
}

} // namespace mtrt::cuda
