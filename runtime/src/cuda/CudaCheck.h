// Checks for CUDA runtime and cuBLASLt calls inside the C++ engine: a failure
// becomes an mtrt::Error naming the call, the error and where it happened.
#ifndef MTRT_SRC_CUDA_CUDACHECK_H
#define MTRT_SRC_CUDA_CUDACHECK_H

#include "core/Bundle.h"

#include <cublasLt.h>
#include <cuda_runtime_api.h>

#include <string>

namespace mtrt::cuda {

/// Throws Error for `error` returned by `call` (its source text); `where`
/// names the function and instruction (or the operation) it served. The code
/// is the CUDA status mapping of CudaStatus.h (RESOURCE_EXHAUSTED for out of
/// memory, INTERNAL for a failed kernel, ...).
[[noreturn]] void throwCudaError(cudaError_t error, const char *call,
                                 const std::string &where);

/// The same for a cuBLAS(Lt) status.
[[noreturn]] void throwCublasError(cublasStatus_t status, const char *call,
                                   const std::string &where);

} // namespace mtrt::cuda

/// Evaluates a CUDA runtime call; on failure throws Error naming the call,
/// the error and `where` (a std::string expression, evaluated only then).
#define MTRT_CUDA_CHECK(call, where)                                           \
  do {                                                                         \
    cudaError_t mtrtCudaError = (call);                                        \
    if (mtrtCudaError != cudaSuccess)                                          \
      ::mtrt::cuda::throwCudaError(mtrtCudaError, #call, (where));             \
  } while (false)

/// The same for a cuBLASLt call.
#define MTRT_CUBLAS_CHECK(call, where)                                         \
  do {                                                                         \
    cublasStatus_t mtrtCublasStatus = (call);                                  \
    if (mtrtCublasStatus != CUBLAS_STATUS_SUCCESS)                             \
      ::mtrt::cuda::throwCublasError(mtrtCublasStatus, #call, (where));        \
  } while (false)

/// Checks a kernel launch: the launch's own error (bad configuration) now;
/// faults during the kernel surface at the next synchronizing call.
#define MTRT_CUDA_CHECK_LAUNCH(launch, where)                                  \
  do {                                                                         \
    launch;                                                                    \
    cudaError_t mtrtCudaError = cudaGetLastError();                            \
    if (mtrtCudaError != cudaSuccess)                                          \
      ::mtrt::cuda::throwCudaError(mtrtCudaError, #launch, (where));           \
  } while (false)

#endif // MTRT_SRC_CUDA_CUDACHECK_H
