/* Proves mtrt.h is valid C11 and that the API links and runs from C. */
#include "c_test_support.h"

#include <string.h>

/* Checks that `status` has `code`, then frees it. */
static void checkCode(mtrt_status_t status, mtrt_status_code_t code) {
  if (mtrt_status_code(status) != code)
    fprintf(stderr, "expected %s, got %s: %s\n", mtrt_status_code_string(code),
            mtrt_status_code_string(mtrt_status_code(status)),
            mtrt_status_message(status));
  CHECK(mtrt_status_code(status) == code);
  mtrt_status_free(status);
}

int main(void) {
  mtrt_version_t version = mtrt_version();
  char expected[64];
  snprintf(expected, sizeof(expected), "%d.%d.%d", version.major, version.minor,
           version.patch);
  CHECK(strcmp(mtrt_version_string(), expected) == 0);
  CHECK(version.major == MTRT_VERSION_MAJOR);

  int count = -1;
  checkCode(mtrt_device_count(MTRT_BACKEND_HOST, &count), MTRT_STATUS_OK);
  CHECK(count == 1);

  mtrt_device_info_t info;
  checkCode(mtrt_device_info(MTRT_BACKEND_HOST, 0, &info), MTRT_STATUS_OK);
  CHECK(info.total_memory_bytes > 0);
  CHECK(info.multiprocessor_count >= 1);
  CHECK(memchr(info.name, '\0', sizeof(info.name)) != NULL);

  checkCode(mtrt_device_count(MTRT_BACKEND_HOST, NULL),
            MTRT_STATUS_INVALID_ARGUMENT);
  checkCode(mtrt_device_info(MTRT_BACKEND_HOST, 1, &info),
            MTRT_STATUS_OUT_OF_RANGE);

  /* Either backend outcome is valid from C; the unit tests pin down which. */
  mtrt_status_t status = mtrt_device_count(MTRT_BACKEND_CUDA, &count);
  CHECK(status == NULL || mtrt_status_code(status) == MTRT_STATUS_UNAVAILABLE);
  CHECK(mtrt_status_message(status) != NULL);
  mtrt_status_free(status);

  if (failures) {
    fprintf(stderr, "%d check(s) failed\n", failures);
    return 1;
  }
  printf("api_c_test: all checks passed\n");
  return 0;
}
