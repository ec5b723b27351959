// Elementwise kernels (gelu, silu, swiglu, dropout, add, mul, scale,
// accumulate) and softmax, forward and backward, with
// host/kernels/Elementwise.cpp's formulas. Compiled without FMA contraction
// (CMakeLists.txt), so each product and sum rounds like the host's.
// Operands and results are fp32 or bf16 each (InElements, OutElements); the
// arithmetic is fp32 either way, so fp32 storage gives the bits it always
// did.
#include "core/OpScratch.h"
#include "core/Random.h"
#include "cuda/CudaCheck.h"
#include "cuda/kernels/KernelSupport.cuh"

#include <cuda_fp8.h>

namespace mtrt::cuda {

namespace {

using detail::blocksFor;
using detail::kThreads;

// The host's constants, rounded to float where the host rounds them to T.
constexpr double kSqrt2OverPi = 0.79788456080286535587989211986876;
constexpr double kInvSqrt2Pi = 0.39894228040143267793994605993438;
constexpr double kInvSqrt2 = 0.70710678118654752440084436210485;
constexpr double kGeluTanhCubic = 0.044715;

__device__ inline float sigmoid(float x) { return 1.0f / (1.0f + expf(-x)); }

/// The storage of an elementwise launch: In operands and Out results (a
/// null result is not written).
template <int In, int Out> struct Storage {
  InElements in[In];
  OutElements out[Out];
};

/// Elements 8o to 8o + 7 of `x` in 16-byte accesses (two in fp32, one in
/// bf16): the pointer is 16-byte aligned (vectorizable()).
__device__ inline void load8(InElements x, int64_t o, float (&out)[8]) {
  if (x.bf16) {
    uint4 raw = static_cast<const uint4 *>(x.data)[o];
    unsigned words[4] = {raw.x, raw.y, raw.z, raw.w};
#pragma unroll
    for (int k = 0; k < 4; ++k) {
      out[2 * k] = __uint_as_float(words[k] << 16);
      out[2 * k + 1] = __uint_as_float(words[k] & 0xffff0000u);
    }
    return;
  }
  const auto *p = static_cast<const float4 *>(x.data) + 2 * o;
  float4 lo = p[0], hi = p[1];
  float values[8] = {lo.x, lo.y, lo.z, lo.w, hi.x, hi.y, hi.z, hi.w};
#pragma unroll
  for (int e = 0; e < 8; ++e)
    out[e] = values[e];
}

/// Stores elements 8o to 8o + 7 of `y` as load8 reads them, rounded to
/// nearest even in bf16.
__device__ inline void store8(OutElements y, int64_t o, const float (&in)[8]) {
  if (y.bf16) {
    unsigned words[4];
#pragma unroll
    for (int k = 0; k < 4; ++k) {
      __nv_bfloat162 pair = __floats2bfloat162_rn(in[2 * k], in[2 * k + 1]);
      words[k] = *reinterpret_cast<unsigned *>(&pair);
    }
    static_cast<uint4 *>(y.data)[o] =
        make_uint4(words[0], words[1], words[2], words[3]);
    return;
  }
  auto *p = static_cast<float4 *>(y.data) + 2 * o;
  p[0] = make_float4(in[0], in[1], in[2], in[3]);
  p[1] = make_float4(in[4], in[5], in[6], in[7]);
}

/// Runs `f(i, x, y)` on every element i: x[k] is operand k's element i, y[k]
/// result k's. The first `octs` groups of eight move in 16-byte accesses
/// (load8/store8: bf16 elements as well as fp32 ones move 16 bytes at a
/// time), the rest one at a time; each element's arithmetic is the same
/// either way.
/// `f` is a __grid_constant__: a functor that passes its members by
/// reference (Dropout's mask tile) would otherwise have every thread copy
/// it to local memory.
template <int In, int Out, typename F>
__global__ void mapKernel(int64_t n, int64_t octs, Storage<In, Out> s,
                          __grid_constant__ const F f) {
  MTRT_GRID_STRIDE(o, octs) {
    float a[In][8], r[Out][8];
#pragma unroll
    for (int k = 0; k < In; ++k)
      load8(s.in[k], o, a[k]);
#pragma unroll
    for (int lane = 0; lane < 8; ++lane) {
      float x[In], y[Out];
#pragma unroll
      for (int k = 0; k < In; ++k)
        x[k] = a[k][lane];
      f(8 * o + lane, x, y);
#pragma unroll
      for (int k = 0; k < Out; ++k)
        r[k][lane] = y[k];
    }
#pragma unroll
    for (int k = 0; k < Out; ++k)
      if (s.out[k].data)
        store8(s.out[k], o, r[k]);
  }
  MTRT_GRID_STRIDE(t, n - 8 * octs) {
    int64_t i = 8 * octs + t;
    float x[In], y[Out];
#pragma unroll
    for (int k = 0; k < In; ++k)
      x[k] = detail::load(s.in[k], i);
    f(i, x, y);
#pragma unroll
    for (int k = 0; k < Out; ++k)
      if (s.out[k].data)
        detail::store(s.out[k], i, y[k]);
  }
}

template <int In, int Out, typename F>
void launchMap(cudaStream_t stream, int64_t n, Storage<In, Out> s, F f) {
  if (n <= 0)
    return;
  bool aligned = true;
  for (const InElements &x : s.in)
    aligned = aligned && detail::vectorizable(x.data);
  for (const OutElements &y : s.out)
    aligned = aligned && detail::vectorizable(y.data);
  int64_t octs = aligned ? n / 8 : 0;
  mapKernel<<<blocksFor(std::max<int64_t>(octs, n - 8 * octs)), kThreads, 0,
              stream>>>(n, octs, s, f);
}

/// The value `y` holds once `value` is stored in it (bf16 rounds).
__device__ inline float asStored(OutElements y, float value) {
  return y.bf16 ? __bfloat162float(__float2bfloat16_rn(value)) : value;
}

/// Column sums (bias gradients) of [rows, cols] values, one definition on
/// every path: a chunk's rows (kColumnSumRowsPerChunk) are kChunkGroups
/// groups of kRowsPerGroup; each group's f32 sum in increasing row order,
/// the chunk's partial[c, j] = the f32 sum of its groups' sums in order
/// (from 0), and the totals partialRowTotalsKernel's f64 sums over the
/// chunks. The same values give the same bits whether they are summed where
/// they are written (mapColumnSums) or read back (biasGrad), by the vector
/// kernel or the scalar one. (The kernel is bound by its arithmetic, not
/// by memory or its last wave: bench/NOTES.md, session 25.)
constexpr int64_t kRowsPerChunk = mtrt::scratch::kColumnSumRowsPerChunk;
constexpr int kRowsPerGroup = 8;
constexpr int kChunkGroups = static_cast<int>(kRowsPerChunk) / kRowsPerGroup;
static_assert(kChunkGroups * kRowsPerGroup == kRowsPerChunk,
              "a chunk is whole groups");
/// Column octets of a mapColumnSumsKernel block (one warp a group).
constexpr int kSumOctets = detail::kWarp;

/// mapKernel's map of In operands to one result over [rows, 8 colOctets]
/// elements, also summing the result's columns as stored. Block (32, 8):
/// blockIdx.y is the chunk, threadIdx.y the group, and thread x takes
/// column octet c = 32 blockIdx.x + x of the group's rows; the block then
/// adds its groups' sums in order and writes partial[chunk, 8c + e]. A
/// null result is summed but not written (biasGrad: the identity of its
/// operand); the result may be an operand (in place): each element is read
/// before it is written.
template <int In, typename F>
__global__ void __launch_bounds__(kSumOctets * kChunkGroups)
    mapColumnSumsKernel(int64_t rows, int64_t colOctets, Storage<In, 1> s,
                        __grid_constant__ const F f, float *partial) {
  __shared__ float groupSums[kChunkGroups][kSumOctets * 8];
  int64_t c = static_cast<int64_t>(blockIdx.x) * kSumOctets + threadIdx.x;
  float sums[8] = {};
  int64_t begin = blockIdx.y * kRowsPerChunk + threadIdx.y * kRowsPerGroup;
  int64_t end = detail::imin(rows, begin + kRowsPerGroup);
  // Row o's results into `sums` (and the result).
  auto finish = [&](int64_t o, const float (&a)[In][8]) {
    float r[8];
#pragma unroll
    for (int lane = 0; lane < 8; ++lane) {
      float x[In], y[1];
#pragma unroll
      for (int k = 0; k < In; ++k)
        x[k] = a[k][lane];
      f(8 * o + lane, x, y);
      r[lane] = y[0];
      sums[lane] += asStored(s.out[0], y[0]);
    }
    if (s.out[0].data)
      store8(s.out[0], o, r);
  };
  // Two rows at a time, their loads issued together.
  if (c < colOctets) {
    int64_t o = begin * colOctets + c, last = end * colOctets;
    for (; o + colOctets < last; o += 2 * colOctets) {
      float a[In][8], b[In][8];
#pragma unroll
      for (int k = 0; k < In; ++k) {
        load8(s.in[k], o, a[k]);
        load8(s.in[k], o + colOctets, b[k]);
      }
      finish(o, a);
      finish(o + colOctets, b);
    }
    if (o < last) {
      float a[In][8];
#pragma unroll
      for (int k = 0; k < In; ++k)
        load8(s.in[k], o, a[k]);
      finish(o, a);
    }
  }
#pragma unroll
  for (int e = 0; e < 8; ++e)
    groupSums[threadIdx.y][8 * threadIdx.x + e] = sums[e];
  __syncthreads();
  // Thread t of the block adds column t's group sums.
  int t = threadIdx.y * kSumOctets + threadIdx.x;
  int64_t j = 8 * static_cast<int64_t>(blockIdx.x) * kSumOctets + t;
  if (j >= 8 * colOctets)
    return;
  float total = 0;
#pragma unroll
  for (int g = 0; g < kChunkGroups; ++g)
    total += groupSums[g][t];
  partial[blockIdx.y * 8 * colOctets + j] = total;
}

/// The scalar kernel's partial sums of values already stored: thread j of
/// block row `chunk` sums column j of the chunk's groups, as
/// mapColumnSumsKernel does.
__global__ void columnPartialsKernel(int64_t rows, int64_t cols, InElements x,
                                     float *partial) {
  int64_t j = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (j >= cols)
    return;
  float total = 0;
  for (int g = 0; g < kChunkGroups; ++g) {
    int64_t begin = blockIdx.y * kRowsPerChunk + g * kRowsPerGroup;
    int64_t end = detail::imin(rows, begin + kRowsPerGroup);
    float sum = 0;
    for (int64_t r = begin; r < end; ++r)
      sum += detail::load(x, r * cols + j);
    total += sum;
  }
  partial[blockIdx.y * cols + j] = total;
}

/// The totals of the chunks' partial rows into `sums`.
void columnTotals(cudaStream_t stream, int64_t chunks, int64_t cols,
                  const float *partial, float *sums) {
  dim3 grid(static_cast<unsigned>((cols + detail::kWarp - 1) / detail::kWarp));
  detail::partialRowTotalsKernel<float>
      <<<grid, dim3(detail::kWarp, detail::kWarp), 0, stream>>>(
          chunks, cols, partial, sums, nullptr, nullptr);
}

/// launchMap over [rows, cols] elements, and sums[j] = the sum over rows of
/// the result's column j as stored: in the map's own pass where every
/// pointer is 16-byte aligned and cols a multiple of 8, else the map and
/// then the scalar kernel over its result. `scratch`:
/// scratch::columnSumBytes(rows, cols).
template <int In, typename F>
void mapColumnSums(cudaStream_t stream, int64_t rows, int64_t cols,
                   Storage<In, 1> s, F f, float *sums, void *scratch) {
  if (cols <= 0)
    return;
  auto *partial = static_cast<float *>(scratch);
  int64_t chunks = mtrt::scratch::columnSumChunks(rows);
  if (rows <= 0) {
    MTRT_CUDA_CHECK(cudaMemsetAsync(sums, 0, sizeof(float) * cols, stream),
                    "column sums of no rows");
    return;
  }
  bool aligned = detail::vectorizable(s.out[0].data);
  for (const InElements &x : s.in)
    aligned = aligned && detail::vectorizable(x.data);
  if (aligned && cols % 8 == 0) {
    int64_t colOctets = cols / 8;
    mapColumnSumsKernel<In, F>
        <<<dim3(
               static_cast<unsigned>((colOctets + kSumOctets - 1) / kSumOctets),
               static_cast<unsigned>(chunks)),
           dim3(kSumOctets, kChunkGroups), 0, stream>>>(rows, colOctets, s, f,
                                                        partial);
  } else {
    InElements stored = s.in[0];
    if (s.out[0].data) {
      launchMap(stream, rows * cols, s, f);
      stored = InElements(s.out[0].data, s.out[0].bf16);
    }
    auto columnBlocks = static_cast<unsigned>((cols + kThreads - 1) / kThreads);
    columnPartialsKernel<<<dim3(columnBlocks, static_cast<unsigned>(chunks)),
                           kThreads, 0, stream>>>(rows, cols, stored, partial);
  }
  columnTotals(stream, chunks, cols, partial, sums);
}

struct Identity {
  __device__ void operator()(int64_t, const float *x, float *y) const {
    y[0] = x[0];
  }
};

/// y = x * factor[0] (a device scalar: the loss gradient's seed).
struct ScaleBy {
  const float *factor;
  __device__ void operator()(int64_t, const float *x, float *y) const {
    y[0] = x[0] * *factor;
  }
};

struct GeluTanh {
  __device__ void operator()(int64_t, const float *x, float *y) const {
    float v = x[0];
    float inner = float(kSqrt2OverPi) * (v + float(kGeluTanhCubic) * v * v * v);
    y[0] = 0.5f * v * (1.0f + tanhf(inner));
  }
};

/// The tanh GeLU for results stored in bf16: 0.5 v (1 + tanh u) = v
/// sigmoid(2 u), in a dozen instructions: the hardware's approximate
/// exponential and reciprocal (ex2.approx.ftz, rcp.approx.ftz: relative
/// errors near 2^-22, where bf16 keeps 2^-8; a flushed exponential is a
/// sigmoid of exactly 1) and explicit fused multiply-adds (this file is
/// compiled without contraction, for the fp32 formulas' host bits). fp32
/// results keep GeluTanh, the host's formula. (With __expf and __frcp_rn,
/// whose IEEE reciprocal takes a slow-path check, gelu_grad's kernel was
/// bound by the multiprocessors, not memory: bench/NOTES.md, session 25.)
__device__ inline float approxExp2(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
  return y;
}
__device__ inline float approxReciprocal(float x) {
  float y;
  asm("rcp.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
  return y;
}
constexpr double kLog2E = 1.4426950408889634073599246810019;
__device__ inline float geluTanhSigmoid(float v) {
  // exp(-2 u) = 2^(-2 sqrt(2 / pi) log2(e) (v + 0.044715 v^3))
  float inner = __fmaf_rn(float(kGeluTanhCubic) * v * v, v, v);
  return approxReciprocal(
      1.0f + approxExp2(float(-2 * kSqrt2OverPi * kLog2E) * inner));
}

struct GeluTanhToBf16 {
  __device__ void operator()(int64_t, const float *x, float *y) const {
    y[0] = x[0] * geluTanhSigmoid(x[0]);
  }
};

struct GeluErf {
  __device__ void operator()(int64_t, const float *x, float *y) const {
    float v = x[0];
    y[0] = 0.5f * v * (1.0f + erff(v * float(kInvSqrt2)));
  }
};

struct GeluTanhBackward { // x, dy -> dx
  __device__ void operator()(int64_t, const float *x, float *y) const {
    float v = x[0];
    float v2 = v * v;
    float t = tanhf(float(kSqrt2OverPi) * (v + float(kGeluTanhCubic) * v2 * v));
    float dinner = float(kSqrt2OverPi) * (1.0f + float(3 * kGeluTanhCubic) * v2);
    float grad = 0.5f * (1.0f + t) + 0.5f * v * (1.0f - t * t) * dinner;
    y[0] = x[1] * grad;
  }
};

/// GeluTanhBackward for results stored in bf16, as GeluTanhToBf16: with s =
/// sigmoid(2 u), 1 + t = 2 s and 1 - t^2 = 4 s (1 - s).
struct GeluTanhBackwardToBf16 { // x, dy -> dx
  __device__ void operator()(int64_t, const float *x, float *y) const {
    float v = x[0];
    float s = geluTanhSigmoid(v);
    // 2 dinner = 2 sqrt(2 / pi) (1 + 3 0.044715 v^2); s (1 - s).
    float twiceDinner = __fmaf_rn(float(6 * kSqrt2OverPi * kGeluTanhCubic),
                                  v * v, float(2 * kSqrt2OverPi));
    float spread = __fmaf_rn(-s, s, s);
    y[0] = x[1] * __fmaf_rn(v * spread, twiceDinner, s);
  }
};

struct GeluErfBackward { // x, dy -> dx
  __device__ void operator()(int64_t, const float *x, float *y) const {
    float v = x[0];
    float cdf = 0.5f * (1.0f + erff(v * float(kInvSqrt2)));
    float pdf = float(kInvSqrt2Pi) * expf(-0.5f * v * v);
    y[0] = x[1] * (cdf + v * pdf);
  }
};

struct Silu {
  __device__ void operator()(int64_t, const float *x, float *y) const {
    y[0] = x[0] * sigmoid(x[0]);
  }
};

struct SiluBackward { // x, dy -> dx
  __device__ void operator()(int64_t, const float *x, float *y) const {
    float v = x[0];
    float s = sigmoid(v);
    y[0] = x[1] * (s * (1.0f + v * (1.0f - s)));
  }
};

struct Swiglu { // gate, up -> y
  __device__ void operator()(int64_t, const float *x, float *y) const {
    float g = x[0];
    y[0] = g * sigmoid(g) * x[1];
  }
};

/// sigmoid(x) for results stored in bf16, with the approximate exponential
/// and reciprocal as geluTanhSigmoid (sigmoid's IEEE division and expf
/// made llama-1.5b's swiglu kernels run at half their memory traffic's
/// speed: bench/NOTES.md, session 25).
__device__ inline float approxSigmoid(float x) {
  return approxReciprocal(1.0f + approxExp2(float(-kLog2E) * x));
}

struct SwigluToBf16 { // gate, up -> y
  __device__ void operator()(int64_t, const float *x, float *y) const {
    float g = x[0];
    y[0] = g * approxSigmoid(g) * x[1];
  }
};

/// The blocks of swigluToFp8 (castToFp8's cap, Precision.cu).
constexpr int64_t kFp8CastBlocks = 2048;

/// Swiglu{} of each element, rounded to bf16 when asked, then cast as
/// castToFp8Vector casts (Precision.cu): the same conversion of y * scale,
/// the same amax of |y| (as bits), one atomicMax a block.
__global__ void swigluToFp8Kernel(int64_t n, int64_t octs, InElements gate,
                                  InElements up, bool roundToBf16,
                                  uint8_t *codes, fp8::Format format,
                                  const float *scale, float *amax) {
  __shared__ unsigned warps[kThreads / 32];
  const float factor = *scale;
  const __nv_fp8_interpretation_t kind =
      format == fp8::Format::E4M3 ? __NV_E4M3 : __NV_E5M2;
  unsigned largest = 0;
  auto code = [&](float g, float u) -> unsigned {
    float y[1], x[2] = {g, u};
    if (roundToBf16) // as swigluForward into bf16
      SwigluToBf16{}(0, x, y);
    else
      Swiglu{}(0, x, y);
    float value =
        roundToBf16 ? __bfloat162float(__float2bfloat16_rn(y[0])) : y[0];
    largest = max(largest, __float_as_uint(fabsf(value)));
    return __nv_cvt_float_to_fp8(value * factor, __NV_SATFINITE, kind);
  };
  MTRT_GRID_STRIDE(o, octs) {
    float g[8], u[8];
    load8(gate, o, g);
    load8(up, o, u);
    unsigned packed[2] = {0, 0};
#pragma unroll
    for (int e = 0; e < 8; ++e)
      packed[e / 4] |= code(g[e], u[e]) << (8 * (e % 4));
    reinterpret_cast<uint2 *>(codes)[o] = make_uint2(packed[0], packed[1]);
  }
  MTRT_GRID_STRIDE(t, n - 8 * octs) {
    int64_t i = 8 * octs + t;
    codes[i] =
        static_cast<uint8_t>(code(detail::load(gate, i), detail::load(up, i)));
  }
  largest = detail::blockMax(largest, warps);
  if (threadIdx.x == 0)
    atomicMax(reinterpret_cast<unsigned *>(amax), largest);
}

/// SwigluBackward's formula, with approxSigmoid for results stored in
/// bf16 (kToBf16) or the host's sigmoid.
template <bool kToBf16> struct SwigluBackwardWith {
  __device__ void operator()(int64_t, const float *x, float *y) const {
    float g = x[0], u = x[1], d = x[2];
    float s = kToBf16 ? approxSigmoid(g) : sigmoid(g);
    y[0] = d * u * (s * (1.0f + g * (1.0f - s)));
    y[1] = d * (g * s);
  }
};
// gate, up, dy -> dgate, dup; for both results stored in bf16.
using SwigluBackward = SwigluBackwardWith<false>;
using SwigluBackwardToBf16 = SwigluBackwardWith<true>;

/// Elements first to first + 15 of x (16-byte accesses: first is a
/// multiple of 16, the pointer 16-byte aligned).
__device__ inline void load16(InElements x, int64_t first, float (&out)[16]) {
  float half[8];
  load8(x, first / 8, half);
#pragma unroll
  for (int e = 0; e < 8; ++e)
    out[e] = half[e];
  load8(x, first / 8 + 1, half);
#pragma unroll
  for (int e = 0; e < 8; ++e)
    out[8 + e] = half[e];
}

/// The tile of swigluBackwardToFp8Kernel (castToFp8Transposed's,
/// Fp8Scaling.cu): 64 x 64 elements, 16 a thread, rows of the shared tiles
/// 68 bytes apart.
constexpr int kFp8Tile = 64, kFp8TileStride = kFp8Tile + 4;

/// SwigluBackward{} of 16 elements of a row, each gradient rounded to bf16
/// when asked and cast as castToFp8Transposed casts (castTransposedKernel,
/// Fp8Scaling.cu): y * scale converted with saturation, |y| into the
/// largest as bits; the codes stored to the row and to the shared tiles.
/// Over 64 x 64 tiles (a grid-stride loop), then each tile's columns
/// written to the transposed codes (where asked) as castTransposedKernel
/// writes them.
__global__ void
swigluBackwardToFp8Kernel(int64_t rows, int64_t cols, InElements gate,
                          InElements up, InElements dy,
                          __grid_constant__ const SwigluGradFp8 dgate,
                          __grid_constant__ const SwigluGradFp8 dup) {
  __shared__ __align__(16) uint8_t tiles[2][kFp8Tile * kFp8TileStride];
  __shared__ unsigned warps[2][kThreads / 32];
  const SwigluGradFp8 *sinks[2] = {&dgate, &dup};
  const float factor[2] = {*dgate.scale, *dup.scale};
  const __nv_fp8_interpretation_t kind[2] = {
      dgate.format == fp8::Format::E4M3 ? __NV_E4M3 : __NV_E5M2,
      dup.format == fp8::Format::E4M3 ? __NV_E4M3 : __NV_E5M2};
  unsigned largest[2] = {0, 0};
  const bool bothBf16 = dgate.roundToBf16 && dup.roundToBf16;
  int64_t tilesAcross = (cols + kFp8Tile - 1) / kFp8Tile;
  int64_t count = tilesAcross * ((rows + kFp8Tile - 1) / kFp8Tile);
  int t = threadIdx.x;
  for (int64_t at = blockIdx.x; at < count; at += gridDim.x) {
    int64_t r0 = at / tilesAcross * kFp8Tile, c0 = at % tilesAcross * kFp8Tile;
    {
      int r = t / 4, chunk = t % 4;
      int64_t row = r0 + r, col = c0 + 16 * chunk;
      if (row < rows && col < cols) {
        int64_t first = row * cols + col;
        float g[16], u[16], d[16];
        load16(gate, first, g);
        load16(up, first, u);
        load16(dy, first, d);
        unsigned words[2][4] = {{0, 0, 0, 0}, {0, 0, 0, 0}};
#pragma unroll
        for (int e = 0; e < 16; ++e) {
          float x[3] = {g[e], u[e], d[e]}, y[2];
          if (bothBf16) // as swigluBackward into bf16
            SwigluBackwardToBf16{}(0, x, y);
          else
            SwigluBackward{}(0, x, y);
#pragma unroll
          for (int k = 0; k < 2; ++k) {
            float value = sinks[k]->roundToBf16
                              ? __bfloat162float(__float2bfloat16_rn(y[k]))
                              : y[k];
            largest[k] = max(largest[k], __float_as_uint(fabsf(value)));
            unsigned code = __nv_cvt_float_to_fp8(value * factor[k],
                                                  __NV_SATFINITE, kind[k]);
            words[k][e / 4] |= code << (8 * (e % 4));
          }
        }
#pragma unroll
        for (int k = 0; k < 2; ++k) {
          *reinterpret_cast<uint4 *>(sinks[k]->codes + first) =
              make_uint4(words[k][0], words[k][1], words[k][2], words[k][3]);
          auto *into = reinterpret_cast<unsigned *>(
              tiles[k] + r * kFp8TileStride + 16 * chunk);
          for (int w = 0; w < 4; ++w)
            into[w] = words[k][w];
        }
      }
    }
    __syncthreads();
    {
      int c = t / 4, chunk = t % 4;
      int64_t col = c0 + c, row = r0 + 16 * chunk;
      if (col < cols && row < rows) {
#pragma unroll
        for (int k = 0; k < 2; ++k) {
          if (!sinks[k]->transposed)
            continue;
          unsigned words[4];
          for (int w = 0; w < 4; ++w) {
            unsigned word = 0;
            for (int b = 0; b < 4; ++b)
              word |=
                  unsigned(
                      tiles[k][(16 * chunk + 4 * w + b) * kFp8TileStride + c])
                  << (8 * b);
            words[w] = word;
          }
          *reinterpret_cast<uint4 *>(sinks[k]->transposed + col * rows + row) =
              make_uint4(words[0], words[1], words[2], words[3]);
        }
      }
    }
    __syncthreads();
  }
#pragma unroll
  for (int k = 0; k < 2; ++k) {
    unsigned block = detail::blockMax(largest[k], warps[k]);
    if (threadIdx.x == 0)
      atomicMax(reinterpret_cast<unsigned *>(sinks[k]->amax), block);
  }
}

struct Dropout {
  uint64_t seedKey;
  random::MaskTile tile;
  uint32_t threshold16;
  float scale;
  __device__ void operator()(int64_t i, const float *x, float *y) const {
    bool keep = random::dropoutTileKeep(seedKey, tile, static_cast<uint64_t>(i),
                                        threshold16);
    y[0] = keep ? x[0] * scale : 0.0f;
  }
};

struct Copy {
  __device__ void operator()(int64_t, const float *x, float *y) const {
    y[0] = x[0];
  }
};

struct Add {
  __device__ void operator()(int64_t, const float *x, float *y) const {
    y[0] = x[0] + x[1];
  }
};

struct Mul {
  __device__ void operator()(int64_t, const float *x, float *y) const {
    y[0] = x[0] * x[1];
  }
};

__global__ void addBiasRowsKernel(int64_t rows, int64_t cols,
                                  const float *bias, float *y) {
  MTRT_GRID_STRIDE(i, rows * cols) y[i] += bias[i % cols];
}

// Element i is read before it is written by the same thread: y may be x.
__global__ void biasAddKernel(int64_t rows, int64_t cols, InElements x,
                              const float *bias, OutElements y) {
  MTRT_GRID_STRIDE(i, rows * cols) {
    detail::store(y, i, detail::load(x, i) + bias[i % cols]);
  }
}

constexpr int kSoftmaxThreads = 256;

// One block per line: line l = (o, in) has its elements at
// o * axisSize * inner + a * inner + in for a < axisSize. The exponentials
// are computed twice (the same bits), so that y is written once, rounded
// once when it is bf16.
__global__ void softmaxKernel(int64_t axisSize, int64_t inner, InElements x,
                              OutElements y) {
  __shared__ float sharedMax[kSoftmaxThreads / detail::kWarp];
  __shared__ double sharedSum[kSoftmaxThreads / detail::kWarp];
  int64_t line = blockIdx.x;
  int64_t base = (line / inner) * axisSize * inner + line % inner;
  float maxValue = -INFINITY;
  for (int64_t a = threadIdx.x; a < axisSize; a += blockDim.x)
    maxValue = fmaxf(maxValue, detail::load(x, base + a * inner));
  maxValue = detail::blockMax(maxValue, sharedMax);
  double sum = 0;
  for (int64_t a = threadIdx.x; a < axisSize; a += blockDim.x)
    sum += expf(detail::load(x, base + a * inner) - maxValue);
  sum = detail::blockSum(sum, sharedSum);
  for (int64_t a = threadIdx.x; a < axisSize; a += blockDim.x) {
    float e = expf(detail::load(x, base + a * inner) - maxValue);
    detail::store(y, base + a * inner, static_cast<float>(e / sum));
  }
}

__global__ void softmaxBackwardKernel(int64_t axisSize, int64_t inner,
                                      InElements y, InElements dy,
                                      OutElements dx) {
  __shared__ double shared[kSoftmaxThreads / detail::kWarp];
  int64_t line = blockIdx.x;
  int64_t base = (line / inner) * axisSize * inner + line % inner;
  double dot = 0;
  for (int64_t a = threadIdx.x; a < axisSize; a += blockDim.x) {
    int64_t e = base + a * inner;
    dot += static_cast<double>(detail::load(dy, e)) * detail::load(y, e);
  }
  float dotT = static_cast<float>(detail::blockSum(dot, shared));
  for (int64_t a = threadIdx.x; a < axisSize; a += blockDim.x) {
    int64_t e = base + a * inner;
    detail::store(dx, e, detail::load(y, e) * (detail::load(dy, e) - dotT));
  }
}

} // namespace

void geluForward(cudaStream_t stream, int64_t n, InElements x, OutElements y,
                 GeluApproximation approximation) {
  if (approximation == GeluApproximation::Tanh && y.bf16)
    launchMap(stream, n, Storage<1, 1>{{x}, {y}}, GeluTanhToBf16{});
  else if (approximation == GeluApproximation::Tanh)
    launchMap(stream, n, Storage<1, 1>{{x}, {y}}, GeluTanh{});
  else
    launchMap(stream, n, Storage<1, 1>{{x}, {y}}, GeluErf{});
}

void geluBackward(cudaStream_t stream, int64_t n, InElements x, InElements dy,
                  OutElements dx, GeluApproximation approximation) {
  if (approximation == GeluApproximation::Tanh && dx.bf16)
    launchMap(stream, n, Storage<2, 1>{{x, dy}, {dx}},
              GeluTanhBackwardToBf16{});
  else if (approximation == GeluApproximation::Tanh)
    launchMap(stream, n, Storage<2, 1>{{x, dy}, {dx}}, GeluTanhBackward{});
  else
    launchMap(stream, n, Storage<2, 1>{{x, dy}, {dx}}, GeluErfBackward{});
}

void geluBackwardBiasGrad(cudaStream_t stream, int64_t rows, int64_t cols,
                          InElements x, InElements dy, OutElements dx,
                          GeluApproximation approximation, float *dbias,
                          void *scratch) {
  Storage<2, 1> s{{x, dy}, {dx}};
  if (approximation == GeluApproximation::Tanh && dx.bf16)
    mapColumnSums(stream, rows, cols, s, GeluTanhBackwardToBf16{}, dbias,
                  scratch);
  else if (approximation == GeluApproximation::Tanh)
    mapColumnSums(stream, rows, cols, s, GeluTanhBackward{}, dbias, scratch);
  else
    mapColumnSums(stream, rows, cols, s, GeluErfBackward{}, dbias, scratch);
}

void biasGrad(cudaStream_t stream, int64_t rows, int64_t out, NormRows dy,
              float *dbias, void *scratch) {
  mapColumnSums(stream, rows, out,
                Storage<1, 1>{{InElements(dy.data, dy.bf16)}, {nullptr}},
                Identity{}, dbias, scratch);
}

void columnSumTotals(cudaStream_t stream, int64_t rows, int64_t cols,
                     const float *partial, float *sums) {
  if (cols <= 0)
    return;
  if (rows <= 0) {
    MTRT_CUDA_CHECK(cudaMemsetAsync(sums, 0, sizeof(float) * cols, stream),
                    "column sums of no rows");
    return;
  }
  columnTotals(stream, mtrt::scratch::columnSumChunks(rows), cols, partial,
               sums);
}

size_t columnSumScratchBytes(int64_t rows, int64_t hidden) {
  return mtrt::scratch::columnSumBytes(rows, hidden);
}

void siluForward(cudaStream_t stream, int64_t n, InElements x, OutElements y) {
  launchMap(stream, n, Storage<1, 1>{{x}, {y}}, Silu{});
}

void siluBackward(cudaStream_t stream, int64_t n, InElements x, InElements dy,
                  OutElements dx) {
  launchMap(stream, n, Storage<2, 1>{{x, dy}, {dx}}, SiluBackward{});
}

void swigluForward(cudaStream_t stream, int64_t n, InElements gate,
                   InElements up, OutElements y) {
  if (y.bf16)
    launchMap(stream, n, Storage<2, 1>{{gate, up}, {y}}, SwigluToBf16{});
  else
    launchMap(stream, n, Storage<2, 1>{{gate, up}, {y}}, Swiglu{});
}

void swigluToFp8(cudaStream_t stream, int64_t n, InElements gate, InElements up,
                 bool roundToBf16, uint8_t *codes, fp8::Format format,
                 const float *scale, float *amax) {
  if (n <= 0)
    return;
  bool aligned = n % 8 == 0 && detail::vectorizable(gate.data) &&
                 detail::vectorizable(up.data) &&
                 reinterpret_cast<uintptr_t>(codes) % 8 == 0;
  int64_t octs = aligned ? n / 8 : 0;
  // At most kFp8CastBlocks blocks, as castToFp8: an atomicMax a block.
  auto blocks = static_cast<unsigned>(std::min<int64_t>(
      blocksFor(std::max<int64_t>(octs, n - 8 * octs)), kFp8CastBlocks));
  swigluToFp8Kernel<<<blocks, kThreads, 0, stream>>>(
      n, octs, gate, up, roundToBf16, codes, format, scale, amax);
}

void swigluBackward(cudaStream_t stream, int64_t n, InElements gate,
                    InElements up, InElements dy, OutElements dgate,
                    OutElements dup) {
  if (dgate.bf16 && dup.bf16)
    launchMap(stream, n, Storage<3, 2>{{gate, up, dy}, {dgate, dup}},
              SwigluBackwardToBf16{});
  else
    launchMap(stream, n, Storage<3, 2>{{gate, up, dy}, {dgate, dup}},
              SwigluBackward{});
}

bool swigluBackwardToFp8(cudaStream_t stream, int64_t rows, int64_t cols,
                         InElements gate, InElements up, InElements dy,
                         const SwigluGradFp8 &dgate, const SwigluGradFp8 &dup) {
  auto aligned = [](const void *p) { return detail::vectorizable(p); };
  if (rows <= 0 || cols <= 0 || rows % 16 != 0 || cols % 16 != 0 ||
      !aligned(gate.data) || !aligned(up.data) || !aligned(dy.data))
    return false;
  for (const SwigluGradFp8 *sink : {&dgate, &dup})
    if (!aligned(sink->codes) || !aligned(sink->transposed))
      return false;
  int64_t tiles =
      ((rows + kFp8Tile - 1) / kFp8Tile) * ((cols + kFp8Tile - 1) / kFp8Tile);
  // At most kFp8CastBlocks blocks, as castToFp8: an atomicMax a block.
  auto blocks = static_cast<unsigned>(std::min(tiles, kFp8CastBlocks));
  swigluBackwardToFp8Kernel<<<blocks, kThreads, 0, stream>>>(
      rows, cols, gate, up, dy, dgate, dup);
  return true;
}

void dropout(cudaStream_t stream, int64_t n, InElements x, OutElements y,
             double p, uint64_t seed, const random::MaskTile &tile) {
  if (p == 0) {
    launchMap(stream, n, Storage<1, 1>{{x}, {y}}, Copy{});
    return;
  }
  launchMap(stream, n, Storage<1, 1>{{x}, {y}},
            Dropout{random::seedKey(seed), tile, random::dropoutThreshold16(p),
                    static_cast<float>(1.0 / (1.0 - p))});
}

void add(cudaStream_t stream, int64_t n, InElements a, InElements b,
         OutElements y) {
  launchMap(stream, n, Storage<2, 1>{{a, b}, {y}}, Add{});
}

void mul(cudaStream_t stream, int64_t n, InElements a, InElements b,
         OutElements y) {
  launchMap(stream, n, Storage<2, 1>{{a, b}, {y}}, Mul{});
}

void scale(cudaStream_t stream, int64_t n, InElements x, const float *factor,
           OutElements y) {
  launchMap(stream, n, Storage<1, 1>{{x}, {y}}, ScaleBy{factor});
}

void accumulateInto(cudaStream_t stream, int64_t n, const float *x,
                    float *y) {
  // y = y + x in place (each element read before it is written).
  launchMap(stream, n, Storage<2, 1>{{y, x}, {y}}, Add{});
}

void addBiasRows(cudaStream_t stream, int64_t rows, int64_t cols,
                 const float *bias, float *y) {
  if (rows * cols > 0)
    addBiasRowsKernel<<<blocksFor(rows * cols), kThreads, 0, stream>>>(
        rows, cols, bias, y);
}

void biasAdd(cudaStream_t stream, int64_t rows, int64_t cols, InElements x,
             const float *bias, OutElements y) {
  if (rows * cols > 0)
    biasAddKernel<<<blocksFor(rows * cols), kThreads, 0, stream>>>(rows, cols,
                                                                   x, bias, y);
}

void softmaxForward(cudaStream_t stream, int64_t outer, int64_t axisSize,
                    int64_t inner, InElements x, OutElements y) {
  int64_t lines = outer * inner;
  if (lines > 0 && axisSize > 0)
    softmaxKernel<<<static_cast<unsigned>(lines), kSoftmaxThreads, 0,
                    stream>>>(axisSize, inner, x, y);
}

void softmaxBackward(cudaStream_t stream, int64_t outer, int64_t axisSize,
                     int64_t inner, InElements y, InElements dy,
                     OutElements dx) {
  int64_t lines = outer * inner;
  if (lines > 0 && axisSize > 0)
    softmaxBackwardKernel<<<static_cast<unsigned>(lines), kSoftmaxThreads, 0,
                            stream>>>(axisSize, inner, y, dy, dx);
}

} // namespace mtrt::cuda
