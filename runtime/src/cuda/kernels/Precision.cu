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

/// The casts' grids: at most this many blocks, looping over the rest, so
/// that the amax costs one atomicMax per block. One per warp, on the same
/// word from every block of a 134M-element cast, serialized in L2: the
/// casts took 52 ms of gpt-1.3b's FP8 step that way (bench/NOTES.md,
/// session 20).
constexpr unsigned kCastBlocks = 2048;

unsigned castBlocks(int64_t n) { return std::min(blocksFor(n), kCastBlocks); }

/// The block's largest `largest` into *amax by one atomicMax (as bits: for
/// non-negative floats, NaN above infinity above the finite values, their
/// order as unsigned integers). Every thread of the block calls it.
__device__ void recordAmax(unsigned largest, float *amax) {
  __shared__ unsigned warps[kThreads / 32];
  largest = detail::blockMax(largest, warps);
  if (threadIdx.x == 0)
    atomicMax(reinterpret_cast<unsigned *>(amax), largest);
}

// With `amax`, the largest |x| goes into *amax (recordAmax).
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
  if (amax)
    recordAmax(largest, amax);
}

/// castToFp8Kernel eight elements a thread: one 16-byte load of bf16 (two
/// of fp32) and one 8-byte store of codes, each element converted as there.
__global__ void castToFp8Vector(int64_t octets, InElements x, uint2 *y,
                                fp8::Format format, const float *scale,
                                float *amax) {
  const float factor = scale ? *scale : 1.0f;
  unsigned largest = 0;
  MTRT_GRID_STRIDE(i, octets) {
    float v[8];
    if (x.bf16) {
      uint4 raw = static_cast<const uint4 *>(x.data)[i];
      unsigned words[4] = {raw.x, raw.y, raw.z, raw.w};
      for (int w = 0; w < 4; ++w) {
        v[2 * w] = __uint_as_float(words[w] << 16);
        v[2 * w + 1] = __uint_as_float(words[w] & 0xffff0000u);
      }
    } else {
      float4 lo = static_cast<const float4 *>(x.data)[2 * i];
      float4 hi = static_cast<const float4 *>(x.data)[2 * i + 1];
      float all[8] = {lo.x, lo.y, lo.z, lo.w, hi.x, hi.y, hi.z, hi.w};
      for (int e = 0; e < 8; ++e)
        v[e] = all[e];
    }
    unsigned packed[2] = {0, 0};
    for (int e = 0; e < 8; ++e) {
      largest = max(largest, __float_as_uint(fabsf(v[e])));
      unsigned code = __nv_cvt_float_to_fp8(v[e] * factor, __NV_SATFINITE,
                                            interpretation(format));
      packed[e / 4] |= code << (8 * (e % 4));
    }
    y[i] = make_uint2(packed[0], packed[1]);
  }
  if (amax)
    recordAmax(largest, amax);
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
  if (n <= 0)
    return;
  // Arena values are 256-byte aligned; a view or an odd size takes the
  // element-wise kernel.
  bool vectorizable = n % 8 == 0 &&
                      reinterpret_cast<uintptr_t>(x.data) % 16 == 0 &&
                      reinterpret_cast<uintptr_t>(y) % 8 == 0;
  if (vectorizable)
    castToFp8Vector<<<castBlocks(n / 8), kThreads, 0, stream>>>(
        n / 8, x, reinterpret_cast<uint2 *>(y), format, scale, amax);
  else
    castToFp8Kernel<<<castBlocks(n), kThreads, 0, stream>>>(n, x, y, format,
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
