// Internal helpers for making mtrt_status_t values and guarding the C API.
#ifndef MTRT_SRC_CORE_STATUS_H
#define MTRT_SRC_CORE_STATUS_H

#include "core/Error.h"
#include "mtrt/mtrt.h"

#include <exception>
#include <new>

namespace mtrt {

/// Makes a status with `code` and a printf-style message. Never returns NULL:
/// when memory runs out it returns a shared RESOURCE_EXHAUSTED status that
/// mtrt_status_free knows not to release. `code` must not be OK.
mtrt_status_t makeStatus(mtrt_status_code_t code, const char *format, ...)
#if defined(__GNUC__) || defined(__clang__)
    __attribute__((format(printf, 2, 3)))
#endif
    ;

/// Runs `body` (returning mtrt_status_t) so that no exception leaves the C
/// API: an mtrt::Error becomes a status of its code and message, other
/// exceptions RESOURCE_EXHAUSTED or INTERNAL statuses; every message names
/// `apiName`.
template <typename Fn>
mtrt_status_t guardApi(const char *apiName, Fn &&body) noexcept {
  try {
    return body();
  } catch (const Error &e) {
    return makeStatus(e.code(), "%s: %s", apiName, e.what());
  } catch (const std::bad_alloc &) {
    return makeStatus(MTRT_STATUS_RESOURCE_EXHAUSTED, "%s: out of memory",
                      apiName);
  } catch (const std::exception &e) {
    return makeStatus(MTRT_STATUS_INTERNAL, "%s: unexpected exception: %s",
                      apiName, e.what());
  } catch (...) {
    return makeStatus(MTRT_STATUS_INTERNAL,
                      "%s: unexpected exception of unknown type", apiName);
  }
}

} // namespace mtrt

/// Returns from the enclosing function if `expr` yields a non-OK status.
#define MTRT_RETURN_IF_ERROR(expr)                                             \
  do {                                                                         \
    mtrt_status_t mtrtStatusTmp = (expr);                                      \
    if (mtrtStatusTmp)                                                         \
      return mtrtStatusTmp;                                                    \
  } while (false)

#endif // MTRT_SRC_CORE_STATUS_H
