// The bench probes' (bench/*-probe.cpp) checks: a failed CUDA or cuBLASLt
// call prints its status and the line and exits with status 1.
#ifndef BENCH_PROBE_CHECK_H
#define BENCH_PROBE_CHECK_H

#include <cublasLt.h>
#include <cuda_runtime_api.h>

#include <cstdio>
#include <cstdlib>

#define CK(x)                                                                  \
  do {                                                                         \
    cudaError_t e_ = (x);                                                      \
    if (e_ != cudaSuccess) {                                                   \
      std::printf("CUDA %s at line %d\n", cudaGetErrorString(e_), __LINE__);   \
      std::exit(1);                                                            \
    }                                                                          \
  } while (0)

#define LT(x)                                                                  \
  do {                                                                         \
    cublasStatus_t s_ = (x);                                                   \
    if (s_ != CUBLAS_STATUS_SUCCESS) {                                         \
      std::printf("cuBLASLt status %d at line %d\n", int(s_), __LINE__);       \
      std::exit(1);                                                            \
    }                                                                          \
  } while (0)

#endif // BENCH_PROBE_CHECK_H
