// Maps CUDA runtime errors to mtrt status codes and messages.
#include "cuda/CudaStatus.h"

mtrt_status_code_t mtrt::cuda::statusCodeFor(cudaError_t error) {
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

mtrt_status_t mtrt::cuda::makeCudaStatus(cudaError_t error, const char *call) {
  return makeStatus(statusCodeFor(error), "%s failed: %s (%s)", call,
                    cudaGetErrorName(error), cudaGetErrorString(error));
}
