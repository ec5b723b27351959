// The status object behind mtrt_status_t and its C API.
#include "core/Status.h"

#include <cstdarg>
#include <cstdio>
#include <cstdlib>
#include <cstring>

struct mtrt_status_s {
  mtrt_status_code_t code;
  // Points just past the struct (one allocation) or, for the out-of-memory
  // status, at a string literal.
  const char *message;
};

namespace {
// Handed out when a status cannot be allocated; never freed.
mtrt_status_s outOfMemoryStatus = {
    MTRT_STATUS_RESOURCE_EXHAUSTED,
    "out of memory while reporting an error (the original message is lost)"};
} // namespace

mtrt_status_t mtrt::makeStatus(mtrt_status_code_t code, const char *format,
                               ...) {
  va_list args;
  va_start(args, format);
  va_list argsCopy;
  va_copy(argsCopy, args);
  int length = std::vsnprintf(nullptr, 0, format, args);
  va_end(args);
  if (length < 0) {
    // Only a malformed format gets here; keep the format itself.
    va_end(argsCopy);
    return makeStatus(code, "%s", format);
  }

  size_t size = sizeof(mtrt_status_s) + static_cast<size_t>(length) + 1;
  auto *status = static_cast<mtrt_status_s *>(std::malloc(size));
  if (!status) {
    va_end(argsCopy);
    return &outOfMemoryStatus;
  }
  char *message = reinterpret_cast<char *>(status + 1);
  std::vsnprintf(message, static_cast<size_t>(length) + 1, format, argsCopy);
  va_end(argsCopy);
  status->code = code;
  status->message = message;
  return status;
}

extern "C" {

MTRT_API mtrt_status_code_t mtrt_status_code(mtrt_status_t status) {
  return status ? status->code : MTRT_STATUS_OK;
}

MTRT_API const char *mtrt_status_message(mtrt_status_t status) {
  return status ? status->message : "";
}

MTRT_API void mtrt_status_free(mtrt_status_t status) {
  if (status != &outOfMemoryStatus)
    std::free(status);
}

MTRT_API const char *mtrt_status_code_string(mtrt_status_code_t code) {
  switch (code) {
  case MTRT_STATUS_OK:
    return "OK";
  case MTRT_STATUS_CANCELLED:
    return "CANCELLED";
  case MTRT_STATUS_UNKNOWN:
    return "UNKNOWN";
  case MTRT_STATUS_INVALID_ARGUMENT:
    return "INVALID_ARGUMENT";
  case MTRT_STATUS_DEADLINE_EXCEEDED:
    return "DEADLINE_EXCEEDED";
  case MTRT_STATUS_NOT_FOUND:
    return "NOT_FOUND";
  case MTRT_STATUS_ALREADY_EXISTS:
    return "ALREADY_EXISTS";
  case MTRT_STATUS_PERMISSION_DENIED:
    return "PERMISSION_DENIED";
  case MTRT_STATUS_RESOURCE_EXHAUSTED:
    return "RESOURCE_EXHAUSTED";
  case MTRT_STATUS_FAILED_PRECONDITION:
    return "FAILED_PRECONDITION";
  case MTRT_STATUS_ABORTED:
    return "ABORTED";
  case MTRT_STATUS_OUT_OF_RANGE:
    return "OUT_OF_RANGE";
  case MTRT_STATUS_UNIMPLEMENTED:
    return "UNIMPLEMENTED";
  case MTRT_STATUS_INTERNAL:
    return "INTERNAL";
  case MTRT_STATUS_UNAVAILABLE:
    return "UNAVAILABLE";
  case MTRT_STATUS_DATA_LOSS:
    return "DATA_LOSS";
  }
  return "UNRECOGNIZED_STATUS_CODE";
}

} // extern "C"
