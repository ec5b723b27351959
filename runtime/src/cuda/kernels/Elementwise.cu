// Elementwise kernels (gelu, silu, swiglu, dropout, add, mul, scale,
// accumulate) and softmax, forward and backward, with
// host/kernels/Elementwise.cpp's formulas. Compiled without FMA contraction
// (CMakeLists.txt), so each product and sum rounds like the host's.
// Operands and results are fp32 or bf16 each (InElements, OutElements); the
// arithmetic is fp32 either way, so fp32 storage gives the bits it always
// did.
#include "core/Random.h"
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
/// sigmoid(2 u), with the fast exponential and reciprocal (within about
/// 2^-20 of the float formula, where bf16 keeps 2^-8), about half the
/// instructions of tanhf (the forward 8% faster at gpt2-350m's MLP;
/// bench/NOTES.md, session 24). fp32 results keep GeluTanh, the host's
/// formula.
__device__ inline float geluTanhSigmoid(float v) {
  float u = float(kSqrt2OverPi) * (v + float(kGeluTanhCubic) * v * v * v);
  return __frcp_rn(1.0f + __expf(-2.0f * u));
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
    float dinner =
        float(kSqrt2OverPi) * (1.0f + float(3 * kGeluTanhCubic) * v * v);
    y[0] = x[1] * (s + 2.0f * v * s * (1.0f - s) * dinner);
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

struct SwigluBackward { // gate, up, dy -> dgate, dup
  __device__ void operator()(int64_t, const float *x, float *y) const {
    float g = x[0], u = x[1], d = x[2];
    float s = sigmoid(g);
    y[0] = d * u * (s * (1.0f + g * (1.0f - s)));
    y[1] = d * (g * s);
  }
};

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

void siluForward(cudaStream_t stream, int64_t n, InElements x, OutElements y) {
  launchMap(stream, n, Storage<1, 1>{{x}, {y}}, Silu{});
}

void siluBackward(cudaStream_t stream, int64_t n, InElements x, InElements dy,
                  OutElements dx) {
  launchMap(stream, n, Storage<2, 1>{{x, dy}, {dx}}, SiluBackward{});
}

void swigluForward(cudaStream_t stream, int64_t n, InElements gate,
                   InElements up, OutElements y) {
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
