// The CUDA backend's device enumeration through the CUDA runtime API.
#include "core/Backend.h"
#include "cuda/CudaStatus.h"

#include <algorithm>
#include <cstring>

namespace {

/// True for the errors that mean "this machine has no usable GPU" rather than
/// "something broke": no device, no driver, or only the driver's link stub.
bool meansNoGpu(cudaError_t error) {
  return error == cudaErrorNoDevice || error == cudaErrorInsufficientDriver ||
         error == cudaErrorStubLibrary;
}

} // namespace

mtrt_status_t mtrt::cuda::deviceCount(int *outCount) {
  int count = 0;
  cudaError_t error = cudaGetDeviceCount(&count);
  if (meansNoGpu(error)) {
    // Clear the runtime's last-error slot so that later, unrelated checks do
    // not see this expected failure; its result is the error just handled.
    (void)cudaGetLastError();
    *outCount = 0;
    return nullptr;
  }
  if (error != cudaSuccess)
    return makeCudaStatus(error, "cudaGetDeviceCount(&count)");
  *outCount = count;
  return nullptr;
}

mtrt_status_t mtrt::cuda::deviceInfo(int index, mtrt_device_info_t *outInfo) {
  int count = 0;
  MTRT_RETURN_IF_ERROR(deviceCount(&count));
  MTRT_RETURN_IF_ERROR(
      checkDeviceIndex("mtrt_device_info", "cuda", index, count));

  cudaDeviceProp prop;
  std::memset(&prop, 0, sizeof(prop));
  MTRT_CUDA_RETURN_IF_ERROR(cudaGetDeviceProperties(&prop, index));

  size_t length = std::min(strnlen(prop.name, sizeof(prop.name)),
                           sizeof(outInfo->name) - 1);
  std::memcpy(outInfo->name, prop.name, length);
  outInfo->name[length] = '\0';
  outInfo->total_memory_bytes = static_cast<uint64_t>(prop.totalGlobalMem);
  outInfo->compute_capability_major = prop.major;
  outInfo->compute_capability_minor = prop.minor;
  outInfo->multiprocessor_count = prop.multiProcessorCount;
  return nullptr;
}
