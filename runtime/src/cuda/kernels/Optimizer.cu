// AdamW over every parameter in one launch (with the gradient scaling and
// clipping before it, and the bf16 copies after it), and the sum of squares
// behind the global gradient norm. Compiled without FMA contraction
// (CMakeLists.txt): with the same inputs, an AdamW step gives the host's
// bits.
#include "cuda/kernels/KernelSupport.cuh"

namespace mtrt::cuda {

namespace {

constexpr int kReduceThreads = 256;
constexpr int64_t kMaxPartials = 1024;
constexpr int64_t kElementsPerThread = 16;
constexpr int kAdamWThreads = 512;

/// AdamW on one element (with the gradient's scaling and clipping):
/// host::adamwStep's order of operations.
struct AdamWElement {
  float p, g, m, v;
  __device__ void step(const AdamWScalars &s, float decay) {
    if (s.applyScale)
      g = g * s.gradScale;
    if (s.applyClip)
      g = g * s.clipCoefficient;
    p = p * decay;
    m = s.beta1 * m + s.oneMinusBeta1 * g;
    v = s.beta2 * v + s.oneMinusBeta2 * g * g;
    p = p - s.stepSize * (m / (sqrtf(v) / s.bias2Sqrt + s.eps));
  }
};

// One block per chunk; its threads stride through the chunk (coalesced),
// four elements at a time (16-byte accesses, 8 for the bf16 copy) where the
// arrays (`vectorBases`) and the chunk's offsets allow.
__global__ void adamwChunksKernel(const AdamWChunk *chunks, float *param,
                                  const float *grad, float *expAvg,
                                  float *expAvgSq, __nv_bfloat16 *bf16,
                                  AdamWScalars s, bool vectorBases) {
  AdamWChunk chunk = chunks[blockIdx.x];
  float decay = chunk.weightDecay ? s.decay : 1.0f;
  bool hasCopy = chunk.bf16Begin >= 0;
  int32_t quads = vectorBases && chunk.begin % 4 == 0 &&
                          chunk.stateBegin % 4 == 0 &&
                          chunk.gradBegin % 4 == 0 &&
                          (!hasCopy || chunk.bf16Begin % 4 == 0)
                      ? chunk.count / 4
                      : 0;
  for (int32_t q = threadIdx.x; q < quads; q += blockDim.x) {
    int64_t i = chunk.begin + 4 * int64_t(q), k = chunk.stateBegin + 4 * int64_t(q);
    int64_t gi = chunk.gradBegin + 4 * int64_t(q);
    float4 p4 = *reinterpret_cast<const float4 *>(param + i);
    float4 g4 = *reinterpret_cast<const float4 *>(grad + gi);
    float4 m4 = *reinterpret_cast<const float4 *>(expAvg + k);
    float4 v4 = *reinterpret_cast<const float4 *>(expAvgSq + k);
    AdamWElement e[4] = {{p4.x, g4.x, m4.x, v4.x},
                         {p4.y, g4.y, m4.y, v4.y},
                         {p4.z, g4.z, m4.z, v4.z},
                         {p4.w, g4.w, m4.w, v4.w}};
#pragma unroll
    for (int j = 0; j < 4; ++j)
      e[j].step(s, decay);
    *reinterpret_cast<float4 *>(expAvg + k) =
        make_float4(e[0].m, e[1].m, e[2].m, e[3].m);
    *reinterpret_cast<float4 *>(expAvgSq + k) =
        make_float4(e[0].v, e[1].v, e[2].v, e[3].v);
    *reinterpret_cast<float4 *>(param + i) =
        make_float4(e[0].p, e[1].p, e[2].p, e[3].p);
    if (hasCopy) {
      __nv_bfloat162 lo = __floats2bfloat162_rn(e[0].p, e[1].p);
      __nv_bfloat162 hi = __floats2bfloat162_rn(e[2].p, e[3].p);
      uint2 raw;
      raw.x = *reinterpret_cast<unsigned *>(&lo);
      raw.y = *reinterpret_cast<unsigned *>(&hi);
      *reinterpret_cast<uint2 *>(bf16 + chunk.bf16Begin + 4 * int64_t(q)) =
          raw;
    }
  }
  for (int32_t j = 4 * quads + threadIdx.x; j < chunk.count;
       j += blockDim.x) {
    int64_t i = chunk.begin + j, k = chunk.stateBegin + j,
            gi = chunk.gradBegin + j;
    AdamWElement e{param[i], grad[gi], expAvg[k], expAvgSq[k]};
    e.step(s, decay);
    expAvg[k] = e.m;
    expAvgSq[k] = e.v;
    param[i] = e.p;
    if (hasCopy)
      bf16[chunk.bf16Begin + j] = __float2bfloat16_rn(e.p);
  }
}

bool aligned16(const void *p) {
  return reinterpret_cast<uintptr_t>(p) % 16 == 0;
}

int64_t partialsFor(int64_t n) {
  int64_t blocks =
      (n + kReduceThreads * kElementsPerThread - 1) /
      (kReduceThreads * kElementsPerThread);
  return std::max<int64_t>(1, std::min<int64_t>(blocks, kMaxPartials));
}

__global__ void sumOfSquaresPartialKernel(int64_t n, const float *x,
                                          float scale, double *partial) {
  __shared__ double shared[kReduceThreads / detail::kWarp];
  double sum = 0;
  auto add = [&](float element) {
    float value = element * scale;
    sum += static_cast<double>(value) * value;
  };
  // Groups of four (16-byte loads, two in flight) where x is aligned, then
  // the rest one at a time.
  int64_t quads = reinterpret_cast<uintptr_t>(x) % 16 == 0 ? n / 4 : 0;
  const auto *x4 = reinterpret_cast<const float4 *>(x);
  int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  int64_t q = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  for (; q + stride < quads; q += 2 * stride) {
    float4 a = x4[q], b = x4[q + stride];
    add(a.x), add(a.y), add(a.z), add(a.w);
    add(b.x), add(b.y), add(b.z), add(b.w);
  }
  if (q < quads) {
    float4 a = x4[q];
    add(a.x), add(a.y), add(a.z), add(a.w);
  }
  MTRT_GRID_STRIDE(t, n - 4 * quads) add(x[4 * quads + t]);
  sum = detail::blockSum(sum, shared);
  if (threadIdx.x == 0)
    partial[blockIdx.x] = sum;
}

// One block per chunk: its sum of squares into partial[chunk].
__global__ void sumOfSquaresOfChunksKernel(const AdamWChunk *chunks,
                                           const float *grad, float scale,
                                           double *partial) {
  __shared__ double shared[kReduceThreads / detail::kWarp];
  AdamWChunk chunk = chunks[blockIdx.x];
  double sum = 0;
  for (int32_t j = threadIdx.x; j < chunk.count; j += blockDim.x) {
    float value = grad[chunk.gradBegin + j] * scale;
    sum += static_cast<double>(value) * value;
  }
  sum = detail::blockSum(sum, shared);
  if (threadIdx.x == 0)
    partial[blockIdx.x] = sum;
}

__global__ void sumPartialsKernel(int64_t count, const double *partial,
                                  double *out) {
  __shared__ double shared[kMaxPartials / detail::kWarp];
  double sum = 0;
  for (int64_t i = threadIdx.x; i < count; i += blockDim.x)
    sum += partial[i];
  sum = detail::blockSum(sum, shared);
  if (threadIdx.x == 0)
    *out = sum;
}

} // namespace

size_t sumOfSquaresOfChunksScratchBytes(int64_t chunkCount) {
  return sizeof(double) * static_cast<size_t>(std::max<int64_t>(chunkCount, 1));
}

void sumOfSquaresOfChunks(cudaStream_t stream, int64_t chunkCount,
                          const AdamWChunk *chunks, const float *grad,
                          float scale, double *out, void *scratch) {
  auto *partial = static_cast<double *>(scratch);
  if (chunkCount > 0)
    sumOfSquaresOfChunksKernel<<<static_cast<unsigned>(chunkCount),
                                 kReduceThreads, 0, stream>>>(chunks, grad,
                                                              scale, partial);
  sumPartialsKernel<<<1, kMaxPartials, 0, stream>>>(chunkCount, partial, out);
}

void adamwStepChunks(cudaStream_t stream, int64_t chunkCount,
                     const AdamWChunk *chunks, float *param, const float *grad,
                     float *expAvg, float *expAvgSq, __nv_bfloat16 *bf16,
                     const AdamWScalars &scalars) {
  // Blocks of a grid's x dimension: up to 2^31 - 1 chunks.
  if (chunkCount > 0)
    adamwChunksKernel<<<static_cast<unsigned>(chunkCount), kAdamWThreads, 0,
                        stream>>>(chunks, param, grad, expAvg, expAvgSq, bf16,
                                  scalars,
                                  aligned16(param) && aligned16(grad) &&
                                      aligned16(expAvg) &&
                                      aligned16(expAvgSq) &&
                                      (!bf16 || aligned16(bf16)));
}

size_t sumOfSquaresScratchBytes(int64_t n) {
  return sizeof(double) * static_cast<size_t>(partialsFor(n));
}

void sumOfSquares(cudaStream_t stream, int64_t n, const float *x, float scale,
                  double *out, void *scratch) {
  auto *partial = static_cast<double *>(scratch);
  int64_t blocks = partialsFor(n);
  sumOfSquaresPartialKernel<<<static_cast<unsigned>(blocks), kReduceThreads,
                              0, stream>>>(n, x, scale, partial);
  sumPartialsKernel<<<1, kMaxPartials, 0, stream>>>(blocks, partial, out);
}

namespace {

constexpr int kHistogramThreads = 256;
constexpr int kHistogramWarps = kHistogramThreads / 32;
/// Elements per block and flush: a bin then holds at most 2^16 squared
/// mantissas below 2^48, below 2^64.
constexpr int64_t kHistogramTile = int64_t(1) << 16;

/// Adds `value` to the 128-bit (low, high) pair at `at`.
__device__ void atomicAdd128(unsigned long long *at, unsigned long long value) {
  unsigned long long old = atomicAdd(at, value);
  if (old + value < old)
    atomicAdd(at + 1, 1ull);
}

/// Each block takes tiles of kHistogramTile elements; each warp adds the
/// squared mantissas of float(x * scale) into its own shared bins (by
/// biased exponent; bin 255 counts non-finite elements), and the block
/// adds its bins to the global 128-bit ones after each tile. A warp round
/// whose lanes all fall in one bin adds its squares first (a butterfly)
/// and makes one atomic: 32 lanes' atomics to one shared word would
/// serialize.
/// Integer sums: the result does not depend on the order.
__global__ void __launch_bounds__(kHistogramThreads)
    squareHistogramKernel(int64_t n, const float *__restrict__ x, float scale,
                          unsigned long long *histogram) {
  __shared__ unsigned long long bins[kHistogramWarps][kSquareHistogramBins];
  constexpr unsigned kAll = 0xffffffffu;
  constexpr uint32_t kNone = 256; // a lane with nothing to add
  int lane = threadIdx.x % 32;
  unsigned long long *mine = bins[threadIdx.x / 32];
  for (int64_t tile = blockIdx.x; tile * kHistogramTile < n;
       tile += gridDim.x) {
    for (int i = threadIdx.x; i < kHistogramWarps * kSquareHistogramBins;
         i += kHistogramThreads)
      bins[0][i] = 0;
    __syncthreads();
    int64_t begin = tile * kHistogramTile;
    int64_t end = min(n, begin + kHistogramTile);
    // Every lane takes part in every round (the shuffles need the whole
    // warp); lanes past the end add nothing.
    for (int64_t base = begin + (threadIdx.x - lane); base < end;
         base += kHistogramThreads) {
      int64_t i = base + lane;
      uint32_t bin = kNone;
      unsigned long long square = 0;
      if (i < end) {
        uint32_t bits = __float_as_uint(x[i] * scale);
        uint32_t exponent = (bits >> 23) & 0xff;
        unsigned long long mantissa = bits & 0x7fffff;
        if (exponent == 0xff) {
          bin = 255;
          square = 1;
        } else if (exponent != 0 || mantissa != 0) {
          if (exponent != 0)
            mantissa |= 1ull << 23;
          bin = exponent;
          square = mantissa * mantissa;
        }
      }
      // A whole warp in one bin: a butterfly, then one atomic; else each
      // lane adds its own (lanes of one bin serialize on it).
      if (__all_sync(kAll, bin == __shfl_sync(kAll, bin, 0))) {
        for (int offset = 16; offset > 0; offset /= 2)
          square += __shfl_xor_sync(kAll, square, offset);
        if (lane == 0 && bin != kNone)
          atomicAdd(&mine[bin], square);
      } else if (bin != kNone) {
        atomicAdd(&mine[bin], square);
      }
    }
    __syncthreads();
    for (int b = threadIdx.x; b < kSquareHistogramBins; b += kHistogramThreads) {
      // The warps' bins of one tile: at most 2^16 squares in all.
      unsigned long long total = 0;
      for (int w = 0; w < kHistogramWarps; ++w)
        total += bins[w][b];
      if (total != 0)
        atomicAdd128(histogram + 2 * b, total);
    }
    __syncthreads();
  }
}

} // namespace

void squareHistogram(cudaStream_t stream, int64_t n, const float *x,
                     float scale, uint64_t *histogram) {
  if (n <= 0)
    return;
  int64_t tiles = (n + kHistogramTile - 1) / kHistogramTile;
  unsigned blocks = static_cast<unsigned>(std::min<int64_t>(tiles, 1024));
  squareHistogramKernel<<<blocks, kHistogramThreads, 0, stream>>>(
      n, x, scale, reinterpret_cast<unsigned long long *>(histogram));
}

} // namespace mtrt::cuda
