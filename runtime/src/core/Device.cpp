// The device C API: argument checks, then dispatch to the chosen backend.
#include "core/Backend.h"
#include "core/Status.h"

#include <cstring>

namespace {

#if !MTRT_HAVE_CUDA
mtrt_status_t cudaUnavailable(const char *apiName) {
  return mtrt::makeStatus(
      MTRT_STATUS_UNAVAILABLE,
      "%s: the CUDA backend is unavailable because the mtrt runtime was "
      "built without CUDA; reconfigure with -DMTRT_ENABLE_CUDA=ON",
      apiName);
}
#endif

mtrt_status_t unknownBackend(const char *apiName, mtrt_backend_t backend) {
  return mtrt::makeStatus(MTRT_STATUS_INVALID_ARGUMENT,
                          "%s: unknown backend %d; expected MTRT_BACKEND_HOST "
                          "(%d) or MTRT_BACKEND_CUDA (%d)",
                          apiName, static_cast<int>(backend),
                          static_cast<int>(MTRT_BACKEND_HOST),
                          static_cast<int>(MTRT_BACKEND_CUDA));
}

} // namespace

mtrt_status_t mtrt::checkDeviceIndex(const char *apiName,
                                     const char *backendName, int index,
                                     int count) {
  if (index >= 0 && index < count)
    return nullptr;
  if (count == 0)
    return makeStatus(MTRT_STATUS_OUT_OF_RANGE,
                      "%s: device index %d is out of range: backend '%s' has "
                      "0 devices",
                      apiName, index, backendName);
  return makeStatus(MTRT_STATUS_OUT_OF_RANGE,
                    "%s: device index %d is out of range: backend '%s' has "
                    "%d device%s (valid indices 0..%d)",
                    apiName, index, backendName, count, count == 1 ? "" : "s",
                    count - 1);
}

extern "C" {

MTRT_API mtrt_status_t mtrt_device_count(mtrt_backend_t backend,
                                         int *out_count) {
  static const char *const kApi = "mtrt_device_count";
  mtrt_status_t status = mtrt::guardApi(kApi, [&]() -> mtrt_status_t {
    if (!out_count)
      return mtrt::makeStatus(MTRT_STATUS_INVALID_ARGUMENT,
                              "%s: out_count must not be NULL", kApi);
    *out_count = 0;
    switch (backend) {
    case MTRT_BACKEND_HOST:
      return mtrt::host::deviceCount(out_count);
    case MTRT_BACKEND_CUDA:
#if MTRT_HAVE_CUDA
      return mtrt::cuda::deviceCount(out_count);
#else
      return cudaUnavailable(kApi);
#endif
    }
    return unknownBackend(kApi, backend);
  });
  if (status && out_count)
    *out_count = 0;
  return status;
}

MTRT_API mtrt_status_t mtrt_device_info(mtrt_backend_t backend, int index,
                                        mtrt_device_info_t *out_info) {
  static const char *const kApi = "mtrt_device_info";
  mtrt_status_t status = mtrt::guardApi(kApi, [&]() -> mtrt_status_t {
    if (!out_info)
      return mtrt::makeStatus(MTRT_STATUS_INVALID_ARGUMENT,
                              "%s: out_info must not be NULL", kApi);
    std::memset(out_info, 0, sizeof(*out_info));
    switch (backend) {
    case MTRT_BACKEND_HOST:
      return mtrt::host::deviceInfo(index, out_info);
    case MTRT_BACKEND_CUDA:
#if MTRT_HAVE_CUDA
      return mtrt::cuda::deviceInfo(index, out_info);
#else
      return cudaUnavailable(kApi);
#endif
    }
    return unknownBackend(kApi, backend);
  });
  // A backend may have filled some fields before failing.
  if (status && out_info)
    std::memset(out_info, 0, sizeof(*out_info));
  return status;
}

} // extern "C"
