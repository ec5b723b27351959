// AdamW with the gradient scaling and clipping before it, and the sum of
// squares behind the global gradient norm. Compiled without FMA contraction
// (CMakeLists.txt): with the same inputs, an AdamW step gives the host's
// bits.
#include "cuda/kernels/KernelSupport.cuh"

namespace mtrt::cuda {

namespace {

constexpr int kReduceThreads = 256;
constexpr int64_t kMaxPartials = 1024;
constexpr int64_t kElementsPerThread = 16;

__global__ void adamwKernel(int64_t n, float *param, float *grad,
                            float *expAvg, float *expAvgSq, AdamWScalars s) {
  MTRT_GRID_STRIDE(i, n) {
    float g = grad[i];
    if (s.applyScale)
      g = g * s.gradScale;
    if (s.applyClip)
      g = g * s.clipCoefficient;
    if (s.applyScale || s.applyClip)
      grad[i] = g;
    float p = param[i] * s.decay;
    float m = s.beta1 * expAvg[i] + s.oneMinusBeta1 * g;
    float v = s.beta2 * expAvgSq[i] + s.oneMinusBeta2 * g * g;
    expAvg[i] = m;
    expAvgSq[i] = v;
    param[i] = p - s.stepSize * (m / (sqrtf(v) / s.bias2Sqrt + s.eps));
  }
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
  MTRT_GRID_STRIDE(i, n) {
    float value = x[i] * scale;
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

void adamwStep(cudaStream_t stream, int64_t n, float *param, float *grad,
               float *expAvg, float *expAvgSq, const AdamWScalars &scalars) {
  if (n > 0)
    adamwKernel<<<detail::blocksFor(n), detail::kThreads, 0, stream>>>(
        n, param, grad, expAvg, expAvgSq, scalars);
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

} // namespace mtrt::cuda
