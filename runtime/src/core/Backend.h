// Per-backend device queries that core/Device.cpp dispatches to.
#ifndef MTRT_SRC_CORE_BACKEND_H
#define MTRT_SRC_CORE_BACKEND_H

#include "mtrt/mtrt.h"

// Callers have checked that the out pointers are non-NULL; implementations
// check the index themselves since only they know the count.
namespace mtrt::host {
mtrt_status_t deviceCount(int *outCount);
mtrt_status_t deviceInfo(int index, mtrt_device_info_t *outInfo);
} // namespace mtrt::host

#if MTRT_HAVE_CUDA
namespace mtrt::cuda {
mtrt_status_t deviceCount(int *outCount);
mtrt_status_t deviceInfo(int index, mtrt_device_info_t *outInfo);
} // namespace mtrt::cuda
#endif

namespace mtrt {
/// OUT_OF_RANGE unless 0 <= index < count, naming `apiName`, the backend, the
/// index and the count.
mtrt_status_t checkDeviceIndex(const char *apiName, const char *backendName,
                               int index, int count);
} // namespace mtrt

#endif // MTRT_SRC_CORE_BACKEND_H
