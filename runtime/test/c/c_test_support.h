/* Helpers shared by the C API's C tests: checks that count failures and
 * statuses printed for FileCheck. */
#ifndef MTRT_TEST_C_C_TEST_SUPPORT_H
#define MTRT_TEST_C_C_TEST_SUPPORT_H

#include "mtrt/mtrt.h"

#include <stdio.h>
#include <stdlib.h>

static int failures = 0;

#define CHECK(cond)                                                            \
  do {                                                                         \
    if (!(cond)) {                                                             \
      fprintf(stderr, "%s:%d: CHECK failed: %s\n", __FILE__, __LINE__, #cond); \
      ++failures;                                                              \
    }                                                                          \
  } while (0)

/* Aborts the test when `status` is not OK: later steps depend on it. */
#define MUST(expr)                                                             \
  do {                                                                         \
    mtrt_status_t mustStatus = (expr);                                         \
    if (mustStatus) {                                                          \
      fprintf(stderr, "%s:%d: %s failed: %s: %s\n", __FILE__, __LINE__, #expr, \
              mtrt_status_code_string(mtrt_status_code(mustStatus)),           \
              mtrt_status_message(mustStatus));                                \
      exit(1);                                                                 \
    }                                                                          \
  } while (0)

/* Prints "what: CODE: message" for FileCheck, checks that the status is an
 * error with `code`, and frees it. */
static inline void expectError(const char *what, mtrt_status_t status,
                        mtrt_status_code_t code) {
  printf("%s: %s: %s\n", what, mtrt_status_code_string(mtrt_status_code(status)),
         mtrt_status_message(status));
  if (mtrt_status_code(status) != code) {
    fprintf(stderr, "%s: expected %s\n", what, mtrt_status_code_string(code));
    ++failures;
  }
  mtrt_status_free(status);
}

/* Fills a host tensor descriptor of a [rows, cols] batch. */
static inline mtrt_tensor_t hostTensor(void *data, mtrt_dtype_t dtype, int64_t rows,
                                int64_t cols) {
  mtrt_tensor_t t = {0};
  t.data = data;
  t.dtype = dtype;
  t.backend = MTRT_BACKEND_HOST;
  t.device = 0;
  t.rank = 2;
  t.shape[0] = rows;
  t.shape[1] = cols;
  return t;
}

static inline int finish(const char *name) {
  if (failures) {
    fprintf(stderr, "%s: %d check(s) failed\n", name, failures);
    return 1;
  }
  printf("%s: all checks passed\n", name);
  return 0;
}

#endif /* MTRT_TEST_C_C_TEST_SUPPORT_H */
