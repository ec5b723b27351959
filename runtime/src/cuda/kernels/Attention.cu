// The attention core (causal, grouped-query, dropout on the probabilities),
// forward and backward, as straightforward kernels: one block per query row
// for the forward and for dq, one block per key row for dk and dv. Scores of
// a row live in shared memory; nothing of size seqQ x seqK goes to device
// memory. Not flash attention yet: K and V rows are re-read per query row.
#include "core/OpScratch.h"
#include "core/Random.h"
#include "cuda/kernels/KernelSupport.cuh"

#include <cmath>
#include <string>

namespace mtrt::cuda {

namespace {

using detail::kWarp;
using detail::warpSum;

constexpr int kAttentionThreads = 128;
constexpr int kAttentionWarps = kAttentionThreads / kWarp;
/// Head dimensions up to 32 * kMaxLaneElements (per-lane accumulators of the
/// dk/dv kernel are registers indexed by compile-time constants).
constexpr int kMaxLaneElements = 8;
constexpr int64_t kMaxHeadDim = kWarp * kMaxLaneElements;

/// Index arithmetic and dropout of one call, as host AttentionGeometry.
struct Geometry {
  int64_t batch, seqQ, seqK, headsQ, headsKv, headDim, headDimV, group;
  bool causal;
  float scale;
  bool hasDropout;
  uint64_t seedKey, firstSample;
  uint32_t dropoutThreshold16;
  /// Global position of this call's tensor (tensor-parallel ranks).
  int64_t batchOffset, headOffset, globalHeadsQ;
  /// The forward scales kept probabilities in double, the backward in float
  /// (as the host does).
  double dropoutScale;
  float dropoutScaleF;

  __device__ int64_t keysFor(int64_t i) const { return causal ? i + 1 : seqK; }
  __device__ int64_t qOffset(int64_t b, int64_t i, int64_t h) const {
    return ((b * seqQ + i) * headsQ + h) * headDim;
  }
  __device__ int64_t kOffset(int64_t b, int64_t j, int64_t g) const {
    return ((b * seqK + j) * headsKv + g) * headDim;
  }
  __device__ int64_t vOffset(int64_t b, int64_t j, int64_t g) const {
    return ((b * seqK + j) * headsKv + g) * headDimV;
  }
  __device__ int64_t oOffset(int64_t b, int64_t i, int64_t h) const {
    return ((b * seqQ + i) * headsQ + h) * headDimV;
  }
  /// Where P[b, h, i, 0] keys its mask (host AttentionGeometry): its
  /// global sample's key and its position in the sample.
  struct MaskRow {
    uint64_t key, position;
  };
  __device__ MaskRow probabilityRow(int64_t b, int64_t h, int64_t i) const {
    uint64_t sample = firstSample + static_cast<uint64_t>(b + batchOffset);
    return {random::sampleKey(seedKey, sample),
            static_cast<uint64_t>(((h + headOffset) * seqQ + i) * seqK)};
  }
  __device__ bool keep(const MaskRow &row, int64_t j) const {
    return random::dropoutKeep(
        row.key, row.position + static_cast<uint64_t>(j), dropoutThreshold16);
  }
};

Geometry makeGeometry(const AttentionParams &p) {
  Geometry g{};
  g.batch = p.batch;
  g.seqQ = p.seqQ;
  g.seqK = p.seqK;
  g.headsQ = p.headsQ;
  g.headsKv = p.headsKv;
  g.headDim = p.headDim;
  g.headDimV = p.headDimV;
  g.group = p.headsQ / p.headsKv;
  g.causal = p.causal;
  double scale =
      p.scale > 0 ? p.scale : 1.0 / std::sqrt(static_cast<double>(p.headDim));
  g.scale = static_cast<float>(scale);
  g.hasDropout = p.dropoutP > 0;
  g.seedKey = random::seedKey(p.seed);
  g.firstSample = p.firstSample;
  g.dropoutThreshold16 = random::dropoutThreshold16(p.dropoutP);
  g.batchOffset = p.batchOffset;
  g.headOffset = p.headOffset;
  g.globalHeadsQ = p.globalHeadsQ ? p.globalHeadsQ : p.headsQ;
  g.dropoutScale = p.dropoutP > 0 ? 1.0 / (1.0 - p.dropoutP) : 1.0;
  g.dropoutScaleF = static_cast<float>(g.dropoutScale);
  return g;
}

/// a . b over n elements by one warp: lane-strided partial sums, then a
/// butterfly, so every lane holds the same result.
__device__ inline float warpDot(const float *a, const float *b, int64_t n,
                                int lane) {
  float sum = 0.0f;
  for (int64_t d = lane; d < n; d += kWarp)
    sum += a[d] * b[d];
  return warpSum(sum);
}

/// out[d] = sum over j < n of weights[j] * rows(j)[d] for d < width, by the
/// whole block; rows(j) is the row of key j. `reduce` holds blockDim.x
/// floats. Starts with a barrier.
template <typename RowOf>
__device__ inline void weightedRowSum(const float *weights, int64_t n,
                                      int64_t width, RowOf rowOf, float scale,
                                      float *reduce, float *out) {
  __syncthreads();
  int t = threadIdx.x;
  if (width <= blockDim.x) {
    int parts = blockDim.x / static_cast<int>(width);
    int d = t % static_cast<int>(width), part = t / static_cast<int>(width);
    float acc = 0.0f;
    if (part < parts)
      for (int64_t j = part; j < n; j += parts)
        acc += weights[j] * rowOf(j)[d];
    reduce[t] = acc;
    __syncthreads();
    if (t < width) {
      float sum = 0.0f;
      for (int p = 0; p < parts; ++p)
        sum += reduce[p * width + t];
      out[t] = scale == 1.0f ? sum : scale * sum;
    }
    return;
  }
  for (int64_t d = t; d < width; d += blockDim.x) {
    float acc = 0.0f;
    for (int64_t j = 0; j < n; ++j)
      acc += weights[j] * rowOf(j)[d];
    out[d] = scale == 1.0f ? acc : scale * acc;
  }
}

/// The rows of one key/value head: row j at base + j * stride.
struct KeyRows {
  const float *base;
  int64_t stride;
  __device__ const float *operator()(int64_t j) const {
    return base + j * stride;
  }
};

// Grid (seqQ, headsQ, batch). Shared: scores[seqK], q row[headDim].
__global__ void __launch_bounds__(kAttentionThreads)
    attentionForwardKernel(Geometry geo, const float *q, const float *k,
                           const float *v, float *out, float *logsumexp) {
  extern __shared__ float shared[];
  __shared__ float reduceMax[kAttentionWarps];
  __shared__ double reduceSum[kAttentionWarps];
  __shared__ float reduce[kAttentionThreads];
  float *probs = shared;
  float *qRow = shared + geo.seqK;
  int64_t i = blockIdx.x, h = blockIdx.y, b = blockIdx.z;
  int64_t g = h / geo.group;
  int64_t n = geo.keysFor(i);
  int lane = threadIdx.x % kWarp, warp = threadIdx.x / kWarp;
  int64_t row = (b * geo.headsQ + h) * geo.seqQ + i;

  const float *qi = q + geo.qOffset(b, i, h);
  for (int64_t d = threadIdx.x; d < geo.headDim; d += blockDim.x)
    qRow[d] = qi[d];
  __syncthreads();
  for (int64_t j = warp; j < n; j += kAttentionWarps) {
    float dot = warpDot(qRow, k + geo.kOffset(b, j, g), geo.headDim, lane);
    if (lane == 0)
      probs[j] = geo.scale * dot;
  }
  __syncthreads();
  float maxScore = -INFINITY;
  for (int64_t j = threadIdx.x; j < n; j += blockDim.x)
    maxScore = fmaxf(maxScore, probs[j]);
  maxScore = detail::blockMax(maxScore, reduceMax);
  double sum = 0;
  for (int64_t j = threadIdx.x; j < n; j += blockDim.x) {
    float e = expf(probs[j] - maxScore);
    probs[j] = e;
    sum += e;
  }
  sum = detail::blockSum(sum, reduceSum);
  if (threadIdx.x == 0)
    logsumexp[row] = static_cast<float>(maxScore + log(sum));
  if (!out) // only the logsumexp was asked for (the backward's recompute)
    return;
  Geometry::MaskRow probabilityRow = geo.probabilityRow(b, h, i);
  for (int64_t j = threadIdx.x; j < n; j += blockDim.x) {
    double prob = probs[j] / sum;
    if (geo.hasDropout)
      prob = geo.keep(probabilityRow, j) ? prob * geo.dropoutScale : 0.0;
    probs[j] = static_cast<float>(prob);
  }
  weightedRowSum(probs, n, geo.headDimV, KeyRows{v + geo.vOffset(b, 0, g), geo.headsKv * geo.headDimV}, 1.0f,
                 reduce, out + geo.oOffset(b, i, h));
}

// Backward, pass 1. Grid (seqQ, headsQ, batch). Per query row: the
// probabilities P (from the saved logsumexp), dP = dout . v through the
// dropout, delta = sum(P dP) (saved for pass 2), dS = P (dP - delta), and
// dq = scale * dS k. Shared: probs[seqK], dprobs[seqK], q row, dout row.
__global__ void __launch_bounds__(kAttentionThreads)
    attentionBackwardQueryKernel(Geometry geo, const float *q, const float *k,
                                 const float *v, const float *logsumexp,
                                 const float *dout, float *dq, float *delta) {
  extern __shared__ float shared[];
  __shared__ double reduceSum[kAttentionWarps];
  __shared__ float reduce[kAttentionThreads];
  float *probs = shared;
  float *dprobs = probs + geo.seqK;
  float *qRow = dprobs + geo.seqK;
  float *doRow = qRow + geo.headDim;
  int64_t i = blockIdx.x, h = blockIdx.y, b = blockIdx.z;
  int64_t g = h / geo.group;
  int64_t n = geo.keysFor(i);
  int lane = threadIdx.x % kWarp, warp = threadIdx.x / kWarp;
  int64_t row = (b * geo.headsQ + h) * geo.seqQ + i;
  float lse = logsumexp[row];
  Geometry::MaskRow probabilityRow = geo.probabilityRow(b, h, i);

  const float *qi = q + geo.qOffset(b, i, h);
  const float *doi = dout + geo.oOffset(b, i, h);
  for (int64_t d = threadIdx.x; d < geo.headDim; d += blockDim.x)
    qRow[d] = qi[d];
  for (int64_t d = threadIdx.x; d < geo.headDimV; d += blockDim.x)
    doRow[d] = doi[d];
  __syncthreads();
  for (int64_t j = warp; j < n; j += kAttentionWarps) {
    float score =
        geo.scale * warpDot(qRow, k + geo.kOffset(b, j, g), geo.headDim, lane);
    float dprob = warpDot(doRow, v + geo.vOffset(b, j, g), geo.headDimV, lane);
    if (geo.hasDropout)
      dprob = geo.keep(probabilityRow, j) ? dprob * geo.dropoutScaleF : 0.0f;
    if (lane == 0) {
      probs[j] = expf(score - lse);
      dprobs[j] = dprob;
    }
  }
  __syncthreads();
  double rowDot = 0;
  for (int64_t j = threadIdx.x; j < n; j += blockDim.x)
    rowDot += static_cast<double>(probs[j]) * dprobs[j];
  float rowDotT = static_cast<float>(detail::blockSum(rowDot, reduceSum));
  if (threadIdx.x == 0)
    delta[row] = rowDotT;
  if (!dq)
    return;
  // dS overwrites dP; each thread rewrites the entries it reads.
  for (int64_t j = threadIdx.x; j < n; j += blockDim.x)
    dprobs[j] = probs[j] * (dprobs[j] - rowDotT);
  weightedRowSum(dprobs, n, geo.headDim, KeyRows{k + geo.kOffset(b, 0, g), geo.headsKv * geo.headDim},
                 geo.scale, reduce, dq + geo.qOffset(b, i, h));
}

// Backward, pass 2. Grid (seqK, headsKv, batch). Per key row j of head
// group g: dv_j = sum over the group's query heads h and the queries i that
// see j of dropout(P)_ij dout_i, and dk_j = scale * sum dS_ij q_i, with P and
// dS recomputed from the logsumexp and pass 1's delta. Each warp takes every
// kAttentionWarps-th query and keeps its sums in registers (lane l holds
// elements l, l + 32, ...); the warps' sums are added at the end.
__global__ void __launch_bounds__(kAttentionThreads)
    attentionBackwardKeyKernel(Geometry geo, const float *q, const float *k,
                               const float *v, const float *logsumexp,
                               const float *dout, const float *delta,
                               float *dk, float *dv) {
  extern __shared__ float shared[];
  __shared__ float reduceK[kAttentionWarps][kMaxHeadDim];
  __shared__ float reduceV[kAttentionWarps][kMaxHeadDim];
  float *kRow = shared;
  float *vRow = shared + geo.headDim;
  int64_t j = blockIdx.x, g = blockIdx.y, b = blockIdx.z;
  int lane = threadIdx.x % kWarp, warp = threadIdx.x / kWarp;
  const float *kj = k + geo.kOffset(b, j, g);
  const float *vj = v + geo.vOffset(b, j, g);
  for (int64_t d = threadIdx.x; d < geo.headDim; d += blockDim.x)
    kRow[d] = kj[d];
  for (int64_t d = threadIdx.x; d < geo.headDimV; d += blockDim.x)
    vRow[d] = vj[d];
  __syncthreads();

  float dkAcc[kMaxLaneElements], dvAcc[kMaxLaneElements];
#pragma unroll
  for (int c = 0; c < kMaxLaneElements; ++c) {
    dkAcc[c] = 0.0f;
    dvAcc[c] = 0.0f;
  }
  int64_t firstQuery = geo.causal ? j : 0;
  for (int64_t h = g * geo.group; h < (g + 1) * geo.group; ++h) {
    for (int64_t i = firstQuery + warp; i < geo.seqQ; i += kAttentionWarps) {
      int64_t row = (b * geo.headsQ + h) * geo.seqQ + i;
      const float *qi = q + geo.qOffset(b, i, h);
      const float *doi = dout + geo.oOffset(b, i, h);
      float score = geo.scale * warpDot(qi, kRow, geo.headDim, lane);
      float prob = expf(score - logsumexp[row]);
      float dprob = warpDot(doi, vRow, geo.headDimV, lane);
      float dropped = prob;
      if (geo.hasDropout) {
        bool kept = geo.keep(geo.probabilityRow(b, h, i), j);
        dropped = kept ? prob * geo.dropoutScaleF : 0.0f;
        dprob = kept ? dprob * geo.dropoutScaleF : 0.0f;
      }
      float dscore = prob * (dprob - delta[row]);
      float scaled = geo.scale * dscore;
#pragma unroll
      for (int c = 0; c < kMaxLaneElements; ++c) {
        int64_t e = lane + c * kWarp;
        if (e < geo.headDimV)
          dvAcc[c] += dropped * doi[e];
        if (e < geo.headDim)
          dkAcc[c] += scaled * qi[e];
      }
    }
  }
#pragma unroll
  for (int c = 0; c < kMaxLaneElements; ++c) {
    int e = lane + c * kWarp;
    reduceK[warp][e] = dkAcc[c];
    reduceV[warp][e] = dvAcc[c];
  }
  __syncthreads();
  for (int64_t e = threadIdx.x; e < geo.headDim; e += blockDim.x) {
    float sum = 0.0f;
    for (int w = 0; w < kAttentionWarps; ++w)
      sum += reduceK[w][e];
    if (dk)
      dk[geo.kOffset(b, j, g) + e] = sum;
  }
  for (int64_t e = threadIdx.x; e < geo.headDimV; e += blockDim.x) {
    float sum = 0.0f;
    for (int w = 0; w < kAttentionWarps; ++w)
      sum += reduceV[w][e];
    if (dv)
      dv[geo.vOffset(b, j, g) + e] = sum;
  }
}

size_t forwardSharedBytes(const AttentionParams &p) {
  return sizeof(float) * static_cast<size_t>(p.seqK + p.headDim);
}
size_t queryBackwardSharedBytes(const AttentionParams &p) {
  return sizeof(float) *
         static_cast<size_t>(2 * p.seqK + p.headDim + p.headDimV);
}
size_t keyBackwardSharedBytes(const AttentionParams &p) {
  return sizeof(float) * static_cast<size_t>(p.headDim + p.headDimV);
}

/// Allows `kernel` more than the default 48 KiB of dynamic shared memory
/// when it needs it.
template <typename Kernel>
void allowSharedBytes(Kernel kernel, size_t bytes) {
  if (bytes > 48 * 1024)
    cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                         static_cast<int>(bytes));
}

bool empty(const AttentionParams &p) {
  return p.batch <= 0 || p.seqQ <= 0 || p.headsQ <= 0;
}

} // namespace

std::string attentionUnsupportedReason(const AttentionParams &p, int device) {
  if (p.headDim > kMaxHeadDim || p.headDimV > kMaxHeadDim)
    return "head dimensions " + std::to_string(p.headDim) + " and " +
           std::to_string(p.headDimV) + " exceed the attention kernel's " +
           std::to_string(kMaxHeadDim);
  if (p.seqQ > 2147483647 || p.headsQ > 65535 || p.batch > 65535 ||
      p.seqK > 2147483647 || p.headsKv > 65535)
    return "the grid would exceed CUDA's limits (sequence, heads or batch "
           "too large)";
  int limit = 0;
  if (cudaDeviceGetAttribute(&limit, cudaDevAttrMaxSharedMemoryPerBlockOptin,
                             device) != cudaSuccess) {
    (void)cudaGetLastError();
    limit = 48 * 1024;
  }
  // The static arrays of the kernels come on top of the dynamic bytes.
  size_t staticBytes = 2 * sizeof(float) * kAttentionWarps * kMaxHeadDim;
  size_t need = std::max({forwardSharedBytes(p), queryBackwardSharedBytes(p),
                          keyBackwardSharedBytes(p) + staticBytes});
  if (need > static_cast<size_t>(limit))
    return "a key sequence of " + std::to_string(p.seqK) + " needs " +
           std::to_string(need) + " bytes of shared memory per block, over " +
           "the device's " + std::to_string(limit) +
           " (the flash-attention kernels will lift this)";
  return std::string();
}

void attentionForward(cudaStream_t stream, const AttentionParams &params,
                      const float *q, const float *k, const float *v,
                      float *out, float *logsumexp) {
  if (empty(params))
    return;
  Geometry geo = makeGeometry(params);
  size_t bytes = forwardSharedBytes(params);
  allowSharedBytes(attentionForwardKernel, bytes);
  dim3 grid(static_cast<unsigned>(params.seqQ),
            static_cast<unsigned>(params.headsQ),
            static_cast<unsigned>(params.batch));
  attentionForwardKernel<<<grid, kAttentionThreads, bytes, stream>>>(
      geo, q, k, v, out, logsumexp);
}

size_t attentionBackwardScratchBytes(const AttentionParams &params) {
  return mtrt::scratch::attentionBackwardScratchBytes(mtrt::scratch::attentionShapeOf(params));
}

void attentionBackward(cudaStream_t stream, const AttentionParams &params,
                       const float *q, const float *k, const float *v,
                       const float *logsumexp, const float *dout, float *dq,
                       float *dk, float *dv, void *scratch) {
  if (empty(params))
    return;
  Geometry geo = makeGeometry(params);
  auto *delta = static_cast<float *>(scratch);
  size_t bytes = queryBackwardSharedBytes(params);
  allowSharedBytes(attentionBackwardQueryKernel, bytes);
  dim3 queryGrid(static_cast<unsigned>(params.seqQ),
                 static_cast<unsigned>(params.headsQ),
                 static_cast<unsigned>(params.batch));
  attentionBackwardQueryKernel<<<queryGrid, kAttentionThreads, bytes,
                                 stream>>>(geo, q, k, v, logsumexp, dout, dq,
                                           delta);
  if (!dk && !dv)
    return;
  bytes = keyBackwardSharedBytes(params);
  allowSharedBytes(attentionBackwardKeyKernel, bytes);
  dim3 keyGrid(static_cast<unsigned>(params.seqK),
               static_cast<unsigned>(params.headsKv),
               static_cast<unsigned>(params.batch));
  attentionBackwardKeyKernel<<<keyGrid, kAttentionThreads, bytes, stream>>>(
      geo, q, k, v, logsumexp, dout, delta, dk, dv);
}

} // namespace mtrt::cuda
