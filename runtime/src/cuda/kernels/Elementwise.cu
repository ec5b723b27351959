// Elementwise kernels (gelu, silu, swiglu, dropout, add, mul, accumulate) and
// softmax, forward and backward, with host/kernels/Elementwise.cpp's
// formulas. Compiled without FMA contraction (CMakeLists.txt), so each
// product and sum rounds like the host's.
#include "core/Random.h"
#include "cuda/kernels/KernelSupport.cuh"

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

__global__ void geluTanhKernel(int64_t n, const float *x, float *y) {
  MTRT_GRID_STRIDE(i, n) {
    float v = x[i];
    float inner = float(kSqrt2OverPi) * (v + float(kGeluTanhCubic) * v * v * v);
    y[i] = 0.5f * v * (1.0f + tanhf(inner));
  }
}

__global__ void geluErfKernel(int64_t n, const float *x, float *y) {
  MTRT_GRID_STRIDE(i, n) {
    float v = x[i];
    y[i] = 0.5f * v * (1.0f + erff(v * float(kInvSqrt2)));
  }
}

__global__ void geluTanhBackwardKernel(int64_t n, const float *x,
                                       const float *dy, float *dx) {
  MTRT_GRID_STRIDE(i, n) {
    float v = x[i];
    float v2 = v * v;
    float t = tanhf(float(kSqrt2OverPi) * (v + float(kGeluTanhCubic) * v2 * v));
    float dinner = float(kSqrt2OverPi) * (1.0f + float(3 * kGeluTanhCubic) * v2);
    float grad = 0.5f * (1.0f + t) + 0.5f * v * (1.0f - t * t) * dinner;
    dx[i] = dy[i] * grad;
  }
}

__global__ void geluErfBackwardKernel(int64_t n, const float *x,
                                      const float *dy, float *dx) {
  MTRT_GRID_STRIDE(i, n) {
    float v = x[i];
    float cdf = 0.5f * (1.0f + erff(v * float(kInvSqrt2)));
    float pdf = float(kInvSqrt2Pi) * expf(-0.5f * v * v);
    dx[i] = dy[i] * (cdf + v * pdf);
  }
}

__global__ void siluKernel(int64_t n, const float *x, float *y) {
  MTRT_GRID_STRIDE(i, n) y[i] = x[i] * sigmoid(x[i]);
}

__global__ void siluBackwardKernel(int64_t n, const float *x, const float *dy,
                                   float *dx) {
  MTRT_GRID_STRIDE(i, n) {
    float v = x[i];
    float s = sigmoid(v);
    dx[i] = dy[i] * (s * (1.0f + v * (1.0f - s)));
  }
}

__global__ void swigluKernel(int64_t n, const float *gate, const float *up,
                             float *y) {
  MTRT_GRID_STRIDE(i, n) {
    float g = gate[i];
    y[i] = g * sigmoid(g) * up[i];
  }
}

__global__ void swigluBackwardKernel(int64_t n, const float *gate,
                                     const float *up, const float *dy,
                                     float *dgate, float *dup) {
  MTRT_GRID_STRIDE(i, n) {
    float g = gate[i], u = up[i], d = dy[i];
    float s = sigmoid(g);
    float gradGate = d * u * (s * (1.0f + g * (1.0f - s)));
    float gradUp = d * (g * s);
    if (dgate)
      dgate[i] = gradGate;
    if (dup)
      dup[i] = gradUp;
  }
}

__global__ void dropoutKernel(int64_t n, const float *x, float *y,
                              uint64_t key, float threshold, float scale) {
  MTRT_GRID_STRIDE(i, n) {
    bool keep = random::dropoutKeep(key, static_cast<uint64_t>(i), threshold);
    y[i] = keep ? x[i] * scale : 0.0f;
  }
}

__global__ void copyKernel(int64_t n, const float *x, float *y) {
  MTRT_GRID_STRIDE(i, n) y[i] = x[i];
}

__global__ void addKernel(int64_t n, const float *a, const float *b, float *y) {
  MTRT_GRID_STRIDE(i, n) y[i] = a[i] + b[i];
}

__global__ void mulKernel(int64_t n, const float *a, const float *b, float *y) {
  MTRT_GRID_STRIDE(i, n) y[i] = a[i] * b[i];
}

__global__ void accumulateKernel(int64_t n, const float *x, float *y) {
  MTRT_GRID_STRIDE(i, n) y[i] += x[i];
}

__global__ void addBiasRowsKernel(int64_t rows, int64_t cols,
                                  const float *bias, float *y) {
  MTRT_GRID_STRIDE(i, rows * cols) y[i] += bias[i % cols];
}

constexpr int kSoftmaxThreads = 256;

// One block per line: line l = (o, in) has its elements at
// o * axisSize * inner + a * inner + in for a < axisSize.
__global__ void softmaxKernel(int64_t axisSize, int64_t inner, const float *x,
                              float *y) {
  __shared__ float sharedMax[kSoftmaxThreads / detail::kWarp];
  __shared__ double sharedSum[kSoftmaxThreads / detail::kWarp];
  int64_t line = blockIdx.x;
  int64_t base = (line / inner) * axisSize * inner + line % inner;
  const float *xl = x + base;
  float *yl = y + base;
  float maxValue = -INFINITY;
  for (int64_t a = threadIdx.x; a < axisSize; a += blockDim.x)
    maxValue = fmaxf(maxValue, xl[a * inner]);
  maxValue = detail::blockMax(maxValue, sharedMax);
  double sum = 0;
  for (int64_t a = threadIdx.x; a < axisSize; a += blockDim.x) {
    float e = expf(xl[a * inner] - maxValue);
    yl[a * inner] = e;
    sum += e;
  }
  sum = detail::blockSum(sum, sharedSum);
  // Each thread rescales the elements it wrote itself.
  for (int64_t a = threadIdx.x; a < axisSize; a += blockDim.x)
    yl[a * inner] = static_cast<float>(yl[a * inner] / sum);
}

__global__ void softmaxBackwardKernel(int64_t axisSize, int64_t inner,
                                      const float *y, const float *dy,
                                      float *dx) {
  __shared__ double shared[kSoftmaxThreads / detail::kWarp];
  int64_t line = blockIdx.x;
  int64_t base = (line / inner) * axisSize * inner + line % inner;
  double dot = 0;
  for (int64_t a = threadIdx.x; a < axisSize; a += blockDim.x)
    dot += static_cast<double>(dy[base + a * inner]) * y[base + a * inner];
  float dotT = static_cast<float>(detail::blockSum(dot, shared));
  for (int64_t a = threadIdx.x; a < axisSize; a += blockDim.x) {
    int64_t e = base + a * inner;
    dx[e] = y[e] * (dy[e] - dotT);
  }
}

} // namespace

void geluForward(cudaStream_t stream, int64_t n, const float *x, float *y,
                 GeluApproximation approximation) {
  if (n <= 0)
    return;
  if (approximation == GeluApproximation::Tanh)
    geluTanhKernel<<<blocksFor(n), kThreads, 0, stream>>>(n, x, y);
  else
    geluErfKernel<<<blocksFor(n), kThreads, 0, stream>>>(n, x, y);
}

void geluBackward(cudaStream_t stream, int64_t n, const float *x,
                  const float *dy, float *dx,
                  GeluApproximation approximation) {
  if (n <= 0)
    return;
  if (approximation == GeluApproximation::Tanh)
    geluTanhBackwardKernel<<<blocksFor(n), kThreads, 0, stream>>>(n, x, dy,
                                                                  dx);
  else
    geluErfBackwardKernel<<<blocksFor(n), kThreads, 0, stream>>>(n, x, dy, dx);
}

void siluForward(cudaStream_t stream, int64_t n, const float *x, float *y) {
  if (n > 0)
    siluKernel<<<blocksFor(n), kThreads, 0, stream>>>(n, x, y);
}

void siluBackward(cudaStream_t stream, int64_t n, const float *x,
                  const float *dy, float *dx) {
  if (n > 0)
    siluBackwardKernel<<<blocksFor(n), kThreads, 0, stream>>>(n, x, dy, dx);
}

void swigluForward(cudaStream_t stream, int64_t n, const float *gate,
                   const float *up, float *y) {
  if (n > 0)
    swigluKernel<<<blocksFor(n), kThreads, 0, stream>>>(n, gate, up, y);
}

void swigluBackward(cudaStream_t stream, int64_t n, const float *gate,
                    const float *up, const float *dy, float *dgate,
                    float *dup) {
  if (n > 0)
    swigluBackwardKernel<<<blocksFor(n), kThreads, 0, stream>>>(
        n, gate, up, dy, dgate, dup);
}

void dropout(cudaStream_t stream, int64_t n, const float *x, float *y,
             double p, uint64_t seed, uint64_t step) {
  if (n <= 0)
    return;
  if (p == 0) {
    copyKernel<<<blocksFor(n), kThreads, 0, stream>>>(n, x, y);
    return;
  }
  dropoutKernel<<<blocksFor(n), kThreads, 0, stream>>>(
      n, x, y, random::streamKey(seed, step), static_cast<float>(p),
      static_cast<float>(1.0 / (1.0 - p)));
}

void add(cudaStream_t stream, int64_t n, const float *a, const float *b,
         float *y) {
  if (n > 0)
    addKernel<<<blocksFor(n), kThreads, 0, stream>>>(n, a, b, y);
}

void mul(cudaStream_t stream, int64_t n, const float *a, const float *b,
         float *y) {
  if (n > 0)
    mulKernel<<<blocksFor(n), kThreads, 0, stream>>>(n, a, b, y);
}

void accumulateInto(cudaStream_t stream, int64_t n, const float *x,
                    float *y) {
  if (n > 0)
    accumulateKernel<<<blocksFor(n), kThreads, 0, stream>>>(n, x, y);
}

void addBiasRows(cudaStream_t stream, int64_t rows, int64_t cols,
                 const float *bias, float *y) {
  if (rows * cols > 0)
    addBiasRowsKernel<<<blocksFor(rows * cols), kThreads, 0, stream>>>(
        rows, cols, bias, y);
}

void softmaxForward(cudaStream_t stream, int64_t outer, int64_t axisSize,
                    int64_t inner, const float *x, float *y) {
  int64_t lines = outer * inner;
  if (lines > 0 && axisSize > 0)
    softmaxKernel<<<static_cast<unsigned>(lines), kSoftmaxThreads, 0,
                    stream>>>(axisSize, inner, x, y);
}

void softmaxBackward(cudaStream_t stream, int64_t outer, int64_t axisSize,
                     int64_t inner, const float *y, const float *dy,
                     float *dx) {
  int64_t lines = outer * inner;
  if (lines > 0 && axisSize > 0)
    softmaxBackwardKernel<<<static_cast<unsigned>(lines), kSoftmaxThreads, 0,
                            stream>>>(axisSize, inner, y, dy, dx);
}

} // namespace mtrt::cuda
