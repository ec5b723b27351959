// Whether a pointer is device memory, for the code paths that take host or
// device buffers alike.
#ifndef MTRT_SRC_CUDA_DEVICEMEMORY_H
#define MTRT_SRC_CUDA_DEVICEMEMORY_H

#include <cuda_runtime_api.h>

namespace mtrt::cuda {

/// True for device (or managed) memory of any device; false for host memory,
/// null, and pointers the CUDA runtime does not know (its error is cleared).
inline bool isDeviceMemory(const void *pointer) {
  if (!pointer)
    return false;
  cudaPointerAttributes attributes{};
  if (cudaPointerGetAttributes(&attributes, pointer) != cudaSuccess) {
    (void)cudaGetLastError();
    return false;
  }
  return attributes.type == cudaMemoryTypeDevice ||
         attributes.type == cudaMemoryTypeManaged;
}

} // namespace mtrt::cuda

#endif // MTRT_SRC_CUDA_DEVICEMEMORY_H
