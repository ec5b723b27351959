// MTRT_HOST_DEVICE: a function of a core header that both the host and the
// CUDA kernels call (__host__ __device__ under nvcc, nothing elsewhere).
// core/Random.h defines it the same way itself, and core/Fp8.h its own
// MTRT_FP8_HOST_DEVICE, since NVRTC reads those headers alone.
#ifndef MTRT_SRC_CORE_HOSTDEVICE_H
#define MTRT_SRC_CORE_HOSTDEVICE_H

#if defined(__CUDACC__)
#define MTRT_HOST_DEVICE __host__ __device__
#else
#define MTRT_HOST_DEVICE
#endif

#endif // MTRT_SRC_CORE_HOSTDEVICE_H
