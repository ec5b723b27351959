// Rounding fp32 tensors to bf16 for the mixed-precision GEMMs, and to the
// FP8 formats (issue 26) by the GPU's own conversions.
#include "cuda/kernels/KernelSupport.cuh"

#include <cuda_bf16.h>
#include <cuda_fp8.h>

namespace mtrt::cuda {

namespace {

using detail::blocksFor;
using detail::kThreads;

// Four elements per thread where the pointers allow 16-byte loads (arena
// pieces are 256-byte aligned), one at a time otherwise.
__global__ void roundToBf16Vector(int64_t quads, const float4 *x,
                                  __nv_bfloat162 *y) {
  MTRT_GRID_STRIDE(i, quads) {
    float4 v = x[i];
    y[2 * i] = __floats2bfloat162_rn(v.x, v.y);
    y[2 * i + 1] = __floats2bfloat162_rn(v.z, v.w);
  }
}

__global__ void roundToBf16Scalar(int64_t begin, int64_t n, const float *x,
                                  __nv_bfloat16 *y) {
  MTRT_GRID_STRIDE(i, n - begin) { y[begin + i] = __float2bfloat16_rn(x[begin + i]); }
}

__global__ void widenBf16Kernel(int64_t n, const __nv_bfloat16 *x, float *y) {
  MTRT_GRID_STRIDE(i, n) { y[i] = __bfloat162float(x[i]); }
}

__device__ inline __nv_fp8_interpretation_t interpretation(fp8::Format f) {
  return f == fp8::Format::E4M3 ? __NV_E4M3 : __NV_E5M2;
}

// With `amax`, each warp's largest |x| (as bits: for non-negative floats,
// NaN above infinity above the finite values, their order as unsigned
// integers) goes into *amax by one atomicMax.
__global__ void castToFp8Kernel(int64_t n, InElements x, uint8_t *y,
                                fp8::Format format, const float *scale,
                                float *amax) {
  const float factor = scale ? *scale : 1.0f;
  unsigned largest = 0;
  MTRT_GRID_STRIDE(i, n) {
    float value = detail::load(x, i);
    largest = max(largest, __float_as_uint(fabsf(value)));
    y[i] = static_cast<uint8_t>(__nv_cvt_float_to_fp8(
        value * factor, __NV_SATFINITE, interpretation(format)));
  }
  if (amax) {
    largest = __reduce_max_sync(0xffffffffu, largest);
    if (threadIdx.x % 32 == 0)
      atomicMax(reinterpret_cast<unsigned *>(amax), largest);
  }
}

__global__ void widenFp8Kernel(int64_t n, const uint8_t *x, float *y,
                               fp8::Format format) {
  MTRT_GRID_STRIDE(i, n) {
    __half_raw h = __nv_cvt_fp8_to_halfraw(
        static_cast<__nv_fp8_storage_t>(x[i]), interpretation(format));
    y[i] = __half2float(__half(h));
  }
}

} // namespace

void castToFp8(cudaStream_t stream, int64_t n, InElements x, uint8_t *y,
               fp8::Format format, const float *scale, float *amax) {
  if (n > 0)
    castToFp8Kernel<<<blocksFor(n), kThreads, 0, stream>>>(n, x, y, format,
                                                          scale, amax);
}

void widenFp8(cudaStream_t stream, int64_t n, const uint8_t *x, float *y,
              fp8::Format format) {
  if (n > 0)
    widenFp8Kernel<<<blocksFor(n), kThreads, 0, stream>>>(n, x, y, format);
}

void widenBf16(cudaStream_t stream, int64_t n, const __nv_bfloat16 *x,
               float *y) {
  if (n > 0)
    widenBf16Kernel<<<blocksFor(n), kThreads, 0, stream>>>(n, x, y);
}

void roundToBf16(cudaStream_t stream, int64_t n, const float *x,
                 __nv_bfloat16 *y) {
  if (n <= 0)
    return;
  bool aligned = reinterpret_cast<uintptr_t>(x) % 16 == 0 &&
                 reinterpret_cast<uintptr_t>(y) % 8 == 0;
  int64_t quads = aligned ? n / 4 : 0;
  if (quads)
    roundToBf16Vector<<<blocksFor(quads), kThreads, 0, stream>>>(
        quads, reinterpret_cast<const float4 *>(x),
        reinterpret_cast<__nv_bfloat162 *>(y));
  if (4 * quads < n)
    roundToBf16Scalar<<<blocksFor(n - 4 * quads), kThreads, 0, stream>>>(
        4 * quads, n, x, y);
}

} // namespace mtrt::cuda
