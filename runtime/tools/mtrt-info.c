/* mtrt-info: prints the runtime's version and the devices of each backend. */
#include "mtrt/mtrt.h"

#include <inttypes.h>
#include <stdio.h>

/* Prints the devices of `backend`. Returns 0 when the backend was listed or
 * is merely unavailable in this build, 1 on any other error. */
static int printBackend(mtrt_backend_t backend, const char *name) {
  int count = 0;
  mtrt_status_t status = mtrt_device_count(backend, &count);
  if (status) {
    mtrt_status_code_t code = mtrt_status_code(status);
    printf("backend %s: %s: %s\n", name, mtrt_status_code_string(code),
           mtrt_status_message(status));
    mtrt_status_free(status);
    return code == MTRT_STATUS_UNAVAILABLE ? 0 : 1;
  }
  printf("backend %s: %d device%s\n", name, count, count == 1 ? "" : "s");
  for (int i = 0; i < count; ++i) {
    mtrt_device_info_t info;
    status = mtrt_device_info(backend, i, &info);
    if (status) {
      fprintf(stderr, "mtrt-info: device %d of backend %s: %s: %s\n", i, name,
              mtrt_status_code_string(mtrt_status_code(status)),
              mtrt_status_message(status));
      mtrt_status_free(status);
      return 1;
    }
    printf("  [%d] %s\n", i, info.name);
    printf("      memory: %.1f GiB (%" PRIu64 " bytes)\n",
           (double)info.total_memory_bytes / (1024.0 * 1024.0 * 1024.0),
           info.total_memory_bytes);
    if (backend == MTRT_BACKEND_HOST) {
      printf("      logical cores: %d\n", info.multiprocessor_count);
    } else {
      printf("      compute capability: %d.%d\n", info.compute_capability_major,
             info.compute_capability_minor);
      printf("      multiprocessors: %d\n", info.multiprocessor_count);
    }
  }
  return 0;
}

int main(void) {
  printf("mtrt %s\n", mtrt_version_string());
  int failed = printBackend(MTRT_BACKEND_HOST, "host");
  failed |= printBackend(MTRT_BACKEND_CUDA, "cuda");
  return failed;
}
