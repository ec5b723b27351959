/* Public C API of the mtrt runtime: statuses, version and device queries. */
#ifndef MTRT_MTRT_H
#define MTRT_MTRT_H

/*
 * Conventions (IREE's discipline):
 * - Names are mtrt_<noun>_<verb>; outputs come last and are named out_*.
 * - Every call that can fail returns an mtrt_status_t. NULL means success; a
 *   non-NULL status is owned by the caller and must be released with
 *   mtrt_status_free exactly once.
 * - On failure, out_* values are left zeroed (never half-written).
 * - No C++ types or exceptions cross this boundary.
 * - Unless a comment says otherwise, every function may be called from any
 *   thread at any time.
 */

#include <stddef.h>
#include <stdint.h>

/* The header version; the build parses these three lines, so keep the form.
 * The library you link may be newer or older: ask mtrt_version(). */
#define MTRT_VERSION_MAJOR 0
#define MTRT_VERSION_MINOR 1
#define MTRT_VERSION_PATCH 0

#if defined(_WIN32)
#if defined(MTRT_BUILDING_LIBRARY)
#define MTRT_API __declspec(dllexport)
#else
#define MTRT_API __declspec(dllimport)
#endif
#elif defined(__GNUC__) || defined(__clang__)
#define MTRT_API __attribute__((visibility("default")))
#else
#define MTRT_API
#endif

/* Dropping a status leaks it and hides an error, so the compiler warns. */
#if defined(__GNUC__) || defined(__clang__)
#define MTRT_MUST_USE_RESULT __attribute__((warn_unused_result))
#else
#define MTRT_MUST_USE_RESULT
#endif

#ifdef __cplusplus
extern "C" {
#endif

/*===------------------------------------------------------------------===*
 * Statuses
 *===------------------------------------------------------------------===*/

/* Canonical error codes; the values match absl, gRPC and IREE and are part
 * of the ABI. */
typedef enum mtrt_status_code_e {
  MTRT_STATUS_OK = 0,
  MTRT_STATUS_CANCELLED = 1,
  MTRT_STATUS_UNKNOWN = 2,
  MTRT_STATUS_INVALID_ARGUMENT = 3,
  MTRT_STATUS_DEADLINE_EXCEEDED = 4,
  MTRT_STATUS_NOT_FOUND = 5,
  MTRT_STATUS_ALREADY_EXISTS = 6,
  MTRT_STATUS_PERMISSION_DENIED = 7,
  MTRT_STATUS_RESOURCE_EXHAUSTED = 8,
  MTRT_STATUS_FAILED_PRECONDITION = 9,
  MTRT_STATUS_ABORTED = 10,
  MTRT_STATUS_OUT_OF_RANGE = 11,
  MTRT_STATUS_UNIMPLEMENTED = 12,
  MTRT_STATUS_INTERNAL = 13,
  MTRT_STATUS_UNAVAILABLE = 14,
  MTRT_STATUS_DATA_LOSS = 15
} mtrt_status_code_t;

/* The result of a call: NULL is success, anything else an error with a code
 * and a message.
 * Ownership: the caller that receives a non-NULL status owns it and frees it
 * with mtrt_status_free.
 * Thread-safety: a status is immutable; any number of threads may read it
 * concurrently, and one of them frees it once no thread reads it anymore. */
typedef struct mtrt_status_s *mtrt_status_t;

/* The code of `status`; MTRT_STATUS_OK for NULL. */
MTRT_API mtrt_status_code_t mtrt_status_code(mtrt_status_t status);

/* The message of `status`, NUL-terminated, owned by the status and valid
 * until mtrt_status_free(status); "" for NULL. */
MTRT_API const char *mtrt_status_message(mtrt_status_t status);

/* Releases `status`; NULL is accepted and ignored. */
MTRT_API void mtrt_status_free(mtrt_status_t status);

/* The name of `code` ("OK", "INVALID_ARGUMENT", ...), a static string owned by
 * the library; "UNRECOGNIZED_STATUS_CODE" for values outside the enum. */
MTRT_API const char *mtrt_status_code_string(mtrt_status_code_t code);

/*===------------------------------------------------------------------===*
 * Version
 *===------------------------------------------------------------------===*/

/* A plain value; copy it freely. */
typedef struct mtrt_version_t {
  int major;
  int minor;
  int patch;
} mtrt_version_t;

/* The version of the library actually loaded. */
MTRT_API mtrt_version_t mtrt_version(void);

/* The same version as "MAJOR.MINOR.PATCH": a static string owned by the
 * library. */
MTRT_API const char *mtrt_version_string(void);

/*===------------------------------------------------------------------===*
 * Devices
 *===------------------------------------------------------------------===*/

/* Where computation runs. */
typedef enum mtrt_backend_e {
  /* The CPU: always exactly one device. */
  MTRT_BACKEND_HOST = 0,
  /* NVIDIA GPUs; UNAVAILABLE when the library was built without CUDA. */
  MTRT_BACKEND_CUDA = 1
} mtrt_backend_t;

/* A snapshot of one device's properties; a plain value owned by whoever
 * declared it, filled in by mtrt_device_info. */
typedef struct mtrt_device_info_t {
  /* NUL-terminated; the CPU's "model name" from /proc/cpuinfo ("host" when
   * there is none) or the GPU's product name. */
  char name[256];
  /* Host: physical memory reported by sysconf (container limits are not
   * applied). CUDA: global memory. */
  uint64_t total_memory_bytes;
  /* CUDA compute capability (9 and 0 for sm_90); 0 and 0 for the host. */
  int compute_capability_major;
  int compute_capability_minor;
  /* CUDA: streaming multiprocessors. Host: logical cores, at least 1. */
  int multiprocessor_count;
} mtrt_device_info_t;

/* Stores in *out_count how many devices `backend` has. The host has one. For
 * CUDA, a machine without a GPU or without a driver has 0 (not an error);
 * a library built without CUDA returns UNAVAILABLE. */
MTRT_API MTRT_MUST_USE_RESULT mtrt_status_t
mtrt_device_count(mtrt_backend_t backend, int *out_count);

/* Fills *out_info with the properties of device `index` of `backend`.
 * OUT_OF_RANGE unless 0 <= index < the count from mtrt_device_count. */
MTRT_API MTRT_MUST_USE_RESULT mtrt_status_t mtrt_device_info(
    mtrt_backend_t backend, int index, mtrt_device_info_t *out_info);

#ifdef __cplusplus
} /* extern "C" */
#endif

#endif /* MTRT_MTRT_H */
