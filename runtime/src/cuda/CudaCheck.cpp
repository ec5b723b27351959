// Error messages and status codes for failed CUDA runtime and cuBLASLt
// calls.
#include "cuda/CudaCheck.h"
#include "cuda/CudaStatus.h"

namespace mtrt::cuda {

mtrt_status_code_t statusCodeFor(cudaError_t error) {
  switch (error) {
  case cudaSuccess:
    return MTRT_STATUS_OK;
  case cudaErrorInvalidValue:
  case cudaErrorInvalidDevice:
    return MTRT_STATUS_INVALID_ARGUMENT;
  case cudaErrorMemoryAllocation:
    return MTRT_STATUS_RESOURCE_EXHAUSTED;
  case cudaErrorNoDevice:
  case cudaErrorInsufficientDriver:
  case cudaErrorStubLibrary:
  case cudaErrorDevicesUnavailable:
    return MTRT_STATUS_UNAVAILABLE;
  case cudaErrorNotSupported:
    return MTRT_STATUS_UNIMPLEMENTED;
  default:
    return MTRT_STATUS_INTERNAL;
  }
}

namespace {
std::string prefixed(const std::string &where) {
  return where.empty() ? std::string() : where + ": ";
}
} // namespace

void throwCudaError(cudaError_t error, const char *call,
                    const std::string &where) {
  std::string message = prefixed(where) + call + " failed: " +
                        cudaGetErrorName(error) + " (" +
                        cudaGetErrorString(error) + ")";
  if (error == cudaErrorMemoryAllocation)
    message += "; the device is out of memory: use a smaller micro-batch or "
               "model";
  throw Error(statusCodeFor(error), message);
}

void throwCublasError(cublasStatus_t status, const char *call,
                      const std::string &where) {
  mtrt_status_code_t code = MTRT_STATUS_INTERNAL;
  if (status == CUBLAS_STATUS_ALLOC_FAILED)
    code = MTRT_STATUS_RESOURCE_EXHAUSTED;
  else if (status == CUBLAS_STATUS_NOT_SUPPORTED ||
           status == CUBLAS_STATUS_ARCH_MISMATCH)
    code = MTRT_STATUS_UNIMPLEMENTED;
  else if (status == CUBLAS_STATUS_NOT_INITIALIZED)
    code = MTRT_STATUS_UNAVAILABLE;
  throw Error(code, prefixed(where) + call + " failed: " +
                        cublasLtGetStatusName(status) + " (" +
                        cublasLtGetStatusString(status) + ")");
}

} // namespace mtrt::cuda
