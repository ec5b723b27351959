// Statuses for failed CUDA runtime calls (the code: statusCodeFor, in
// CudaCheck.cpp, which the engine shares).
#include "cuda/CudaStatus.h"

mtrt_status_t mtrt::cuda::makeCudaStatus(cudaError_t error, const char *call) {
  return makeStatus(statusCodeFor(error), "%s failed: %s (%s)", call,
                    cudaGetErrorName(error), cudaGetErrorString(error));
}
