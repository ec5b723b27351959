// The runtime's version query, taken from the macros in the public header.
#include "mtrt/mtrt.h"

#define MTRT_STRINGIFY_IMPL(x) #x
#define MTRT_STRINGIFY(x) MTRT_STRINGIFY_IMPL(x)
// Assembled by the preprocessor from the same macros as mtrt_version().
#define MTRT_VERSION_STRING                                                    \
  MTRT_STRINGIFY(MTRT_VERSION_MAJOR)                                           \
  "." MTRT_STRINGIFY(MTRT_VERSION_MINOR) "." MTRT_STRINGIFY(MTRT_VERSION_PATCH)

extern "C" {

MTRT_API mtrt_version_t mtrt_version(void) {
  return {MTRT_VERSION_MAJOR, MTRT_VERSION_MINOR, MTRT_VERSION_PATCH};
}

MTRT_API const char *mtrt_version_string(void) { return MTRT_VERSION_STRING; }

} // extern "C"
