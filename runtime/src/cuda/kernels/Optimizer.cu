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

// One block per chunk; its threads stride through the chunk (coalesced).
__global__ void adamwChunksKernel(const AdamWChunk *chunks, float *param,
                                  float *grad, float *expAvg, float *expAvgSq,
                                  __nv_bfloat16 *bf16, AdamWScalars s) {
  AdamWChunk chunk = chunks[blockIdx.x];
  float decay = chunk.weightDecay ? s.decay : 1.0f;
  for (int32_t j = threadIdx.x; j < chunk.count; j += blockDim.x) {
    int64_t i = chunk.begin + j, k = chunk.stateBegin + j;
    float g = grad[k];
    if (s.applyScale)
      g = g * s.gradScale;
    if (s.applyClip)
      g = g * s.clipCoefficient;
    if (s.applyScale || s.applyClip)
      grad[k] = g;
    float p = param[i] * decay;
    float m = s.beta1 * expAvg[k] + s.oneMinusBeta1 * g;
    float v = s.beta2 * expAvgSq[k] + s.oneMinusBeta2 * g * g;
    expAvg[k] = m;
    expAvgSq[k] = v;
    p = p - s.stepSize * (m / (sqrtf(v) / s.bias2Sqrt + s.eps));
    param[i] = p;
    if (chunk.bf16Begin >= 0)
      bf16[chunk.bf16Begin + j] = __float2bfloat16_rn(p);
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

void adamwStepChunks(cudaStream_t stream, int64_t chunkCount,
                     const AdamWChunk *chunks, float *param, float *grad,
                     float *expAvg, float *expAvgSq, __nv_bfloat16 *bf16,
                     const AdamWScalars &scalars) {
  // Blocks of a grid's x dimension: up to 2^31 - 1 chunks.
  if (chunkCount > 0)
    adamwChunksKernel<<<static_cast<unsigned>(chunkCount), kAdamWThreads, 0,
                        stream>>>(chunks, param, grad, expAvg, expAvgSq, bf16,
                                  scalars);
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
