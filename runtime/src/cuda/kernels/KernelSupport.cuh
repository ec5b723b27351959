// Helpers shared by the CUDA kernels' .cu files: launch sizes, warp and block
// reductions with a fixed shape, instantiation macros.
#ifndef MTRT_SRC_CUDA_KERNELS_KERNELSUPPORT_CUH
#define MTRT_SRC_CUDA_KERNELS_KERNELSUPPORT_CUH

#include "cuda/kernels/Kernels.h"

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <map>
#include <tuple>

namespace mtrt::cuda::detail {

constexpr int kThreads = 256;
constexpr int kWarp = 32;

/// Blocks for a grid-stride loop over n elements: enough to fill the device
/// several times over, never more than the grid allows.
inline unsigned blocksFor(int64_t n, int threads = kThreads) {
  int64_t blocks = (n + threads - 1) / threads;
  return static_cast<unsigned>(std::max<int64_t>(1, std::min<int64_t>(blocks, 65535 * 8)));
}

/// min and max on int64_t, usable in host and device code.
__host__ __device__ inline int64_t imin(int64_t a, int64_t b) {
  return a < b ? a : b;
}
__host__ __device__ inline int64_t imax(int64_t a, int64_t b) {
  return a < b ? b : a;
}

/// A grid-stride loop over [0, n).
#define MTRT_GRID_STRIDE(i, n)                                                 \
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x +             \
                   threadIdx.x,                                                \
               mtrtStride = static_cast<int64_t>(gridDim.x) * blockDim.x;      \
       i < (n); i += mtrtStride)

template <typename T> __device__ inline T warpSum(T value) {
#pragma unroll
  for (int offset = kWarp / 2; offset > 0; offset /= 2)
    value += __shfl_xor_sync(0xffffffffu, value, offset);
  return value;
}

template <typename T> __device__ inline T warpMax(T value) {
#pragma unroll
  for (int offset = kWarp / 2; offset > 0; offset /= 2)
    value = max(value, __shfl_xor_sync(0xffffffffu, value, offset));
  return value;
}

/// The sum of `value` over the block, returned to every thread. `shared`
/// holds at least blockDim.x / 32 elements; blockDim.x is a multiple of 32.
/// Starts and ends with a barrier, so it can be called repeatedly.
template <typename T>
__device__ inline T blockSum(T value, T *shared) {
  int lane = threadIdx.x % kWarp, warp = threadIdx.x / kWarp;
  int warps = blockDim.x / kWarp;
  value = warpSum(value);
  __syncthreads();
  if (lane == 0)
    shared[warp] = value;
  __syncthreads();
  T total = T(0);
  for (int w = 0; w < warps; ++w)
    total += shared[w];
  return total;
}

/// The maximum of `value` over the block, as blockSum.
template <typename T>
__device__ inline T blockMax(T value, T *shared) {
  int lane = threadIdx.x % kWarp, warp = threadIdx.x / kWarp;
  int warps = blockDim.x / kWarp;
  value = warpMax(value);
  __syncthreads();
  if (lane == 0)
    shared[warp] = value;
  __syncthreads();
  T total = shared[0];
  for (int w = 1; w < warps; ++w)
    total = max(total, shared[w]);
  return total;
}

/// Records the first fault of a launch: *fault = tag if it holds 0.
__device__ inline void raiseFault(unsigned *fault, unsigned tag) {
  if (fault)
    atomicCAS(fault, 0u, tag);
}

/// Element i of `x` as float (a bf16 element widens exactly). The branch on
/// the storage type is uniform over the launch.
__device__ inline float load(InElements x, int64_t i) {
  if (x.bf16)
    return __bfloat162float(static_cast<const __nv_bfloat16 *>(x.data)[i]);
  return static_cast<const float *>(x.data)[i];
}

/// Stores `value` as element i of `y`, rounded to nearest even in bf16.
__device__ inline void store(OutElements y, int64_t i, float value) {
  if (y.bf16)
    static_cast<__nv_bfloat16 *>(y.data)[i] = __float2bfloat16_rn(value);
  else
    static_cast<float *>(y.data)[i] = value;
}

/// Elements 4q to 4q + 3 of `x` in one access (16 bytes in fp32, 8 in
/// bf16): the pointer is 16-byte aligned (vectorizable()).
__device__ inline float4 load4(InElements x, int64_t q) {
  if (x.bf16) {
    uint2 raw = static_cast<const uint2 *>(x.data)[q];
    return make_float4(__uint_as_float(raw.x << 16),
                       __uint_as_float(raw.x & 0xffff0000u),
                       __uint_as_float(raw.y << 16),
                       __uint_as_float(raw.y & 0xffff0000u));
  }
  return static_cast<const float4 *>(x.data)[q];
}

__device__ inline void store4(OutElements y, int64_t q, float4 v) {
  if (y.bf16) {
    __nv_bfloat162 lo = __floats2bfloat162_rn(v.x, v.y);
    __nv_bfloat162 hi = __floats2bfloat162_rn(v.z, v.w);
    uint2 raw;
    raw.x = *reinterpret_cast<unsigned *>(&lo);
    raw.y = *reinterpret_cast<unsigned *>(&hi);
    static_cast<uint2 *>(y.data)[q] = raw;
  } else {
    static_cast<float4 *>(y.data)[q] = v;
  }
}

/// Blocks of `kernel` the current device runs at once with `threads`
/// threads and `sharedBytes` of dynamic shared memory each (one wave: a
/// backward's blocks take equal shares of the rows), asked once per thread,
/// kernel, size and device; 1 << 30 if the device cannot say.
template <typename Kernel>
int64_t residentBlocks(Kernel kernel, int threads, size_t sharedBytes = 0) {
  int device = 0, processors = 0, perProcessor = 0;
  if (cudaGetDevice(&device) != cudaSuccess)
    return int64_t(1) << 30;
  using Key = std::tuple<const void *, int, size_t, int>;
  thread_local std::map<Key, int64_t> known;
  Key key{reinterpret_cast<const void *>(kernel), threads, sharedBytes, device};
  if (auto found = known.find(key); found != known.end())
    return found->second;
  if (cudaDeviceGetAttribute(&processors, cudaDevAttrMultiProcessorCount,
                             device) != cudaSuccess ||
      cudaOccupancyMaxActiveBlocksPerMultiprocessor(
          &perProcessor, kernel, threads, sharedBytes) != cudaSuccess)
    return int64_t(1) << 30;
  int64_t blocks = std::max<int64_t>(1, int64_t(processors) * perProcessor);
  known.emplace(key, blocks);
  return blocks;
}

/// Column sums of partial rows (f32 or f64): out0[j] = float(sum over p of
/// double(partial0[p, j])), in order within each of 32 strided groups of
/// rows, then over the groups in order; blockIdx.y = 1 does the same from
/// partial1 into out1. Block (32, 32), grid (ceil(columns / 32), 1 or 2).
template <typename Partial>
__global__ void partialRowTotalsKernel(int64_t partialRows, int64_t columns,
                                       const Partial *partial0, float *out0,
                                       const Partial *partial1, float *out1) {
  __shared__ double shared[kWarp][kWarp + 1];
  const Partial *partial = blockIdx.y ? partial1 : partial0;
  float *out = blockIdx.y ? out1 : out0;
  int64_t j = static_cast<int64_t>(blockIdx.x) * kWarp + threadIdx.x;
  double sum = 0;
  if (j < columns)
    for (int64_t p = threadIdx.y; p < partialRows; p += kWarp)
      sum += partial[p * columns + j];
  shared[threadIdx.y][threadIdx.x] = sum;
  __syncthreads();
  if (threadIdx.y != 0 || j >= columns)
    return;
  double total = 0;
  for (int y = 0; y < kWarp; ++y)
    total += shared[y][threadIdx.x];
  out[j] = static_cast<float>(total);
}

/// Whether a pointer allows load4/store4.
inline bool vectorizable(const void *p) {
  return reinterpret_cast<uintptr_t>(p) % 16 == 0;
}

} // namespace mtrt::cuda::detail

#define MTRT_CUDA_INSTANTIATE_ID_TYPES(MACRO) MACRO(int32_t) MACRO(int64_t)

#endif // MTRT_SRC_CUDA_KERNELS_KERNELSUPPORT_CUH
