// Turns failed CUDA runtime calls into statuses naming the call and the error.
#ifndef MTRT_SRC_CUDA_CUDASTATUS_H
#define MTRT_SRC_CUDA_CUDASTATUS_H

#include "core/Status.h"

#include <cuda_runtime_api.h>

namespace mtrt::cuda {

/// The status code a CUDA runtime error maps to.
mtrt_status_code_t statusCodeFor(cudaError_t error);

/// A status for `error` returned by `call` (its source text).
mtrt_status_t makeCudaStatus(cudaError_t error, const char *call);

} // namespace mtrt::cuda

/// Evaluates a CUDA runtime call and returns a status from the enclosing
/// function when it fails. Every CUDA call in the runtime goes through this.
#define MTRT_CUDA_RETURN_IF_ERROR(call)                                        \
  do {                                                                         \
    cudaError_t mtrtCudaError = (call);                                        \
    if (mtrtCudaError != cudaSuccess)                                          \
      return ::mtrt::cuda::makeCudaStatus(mtrtCudaError, #call);               \
  } while (false)

#endif // MTRT_SRC_CUDA_CUDASTATUS_H
