// The structs behind the C API's opaque handles, and argument checks shared
// by the C entry points.
#ifndef MTRT_SRC_CAPI_HANDLES_H
#define MTRT_SRC_CAPI_HANDLES_H

#include "capi/Session.h"
#include "comm/Communicator.h"
#include "core/Bundle.h"
#include "core/Status.h"

#include <memory>

struct mtrt_bundle_s {
  std::shared_ptr<const mtrt::Bundle> bundle;
};

struct mtrt_communicator_s {
  std::unique_ptr<mtrt::comm::Communicator> communicator;
};

struct mtrt_session_s {
  std::unique_ptr<mtrt::capi::Session> session;
};

namespace mtrt::capi {

/// INVALID_ARGUMENT naming `apiName` and the argument unless `pointer` is
/// non-NULL.
inline mtrt_status_t checkNotNull(const char *apiName, const void *pointer,
                                  const char *argument) {
  if (pointer)
    return nullptr;
  return makeStatus(MTRT_STATUS_INVALID_ARGUMENT, "%s: %s must not be NULL",
                    apiName, argument);
}

} // namespace mtrt::capi

#endif // MTRT_SRC_CAPI_HANDLES_H
