// Ring attention's blocks, merge and delta on the device
// (AttentionBlocks.h): Attention.cu's straightforward kernels with the
// causal mask and the dropout keyed on the rows' global positions.
#include "cuda/kernels/AttentionBlocks.h"

#include "core/Random.h"
#include "cuda/CudaCheck.h"
#include "cuda/kernels/KernelSupport.cuh"

#include <cmath>

namespace mtrt::cuda {

namespace {

using detail::kWarp;
using detail::load;
using detail::store;
using detail::warpSum;

constexpr int kBlockThreads = 128;
constexpr int kBlockWarps = kBlockThreads / kWarp;
/// Head dimensions up to 32 * kMaxLaneElements (the dk/dv kernel's per-lane
/// sums are registers).
constexpr int kMaxLaneElements = 8;
constexpr int64_t kMaxHeadDim = kWarp * kMaxLaneElements;

/// Index arithmetic, positions, mask and dropout of one block, as host
/// BlockGeometry.
struct Geometry {
  int64_t batch, seqQ, seqK, headsQ, headsKv, headDim, headDimV, group;
  bool causal;
  float scale;
  bool hasDropout;
  uint64_t seedKey, firstSample;
  uint32_t dropoutThreshold16;
  int64_t batchOffset, headOffset;
  /// The forward scales kept probabilities in double, the backward in float
  /// (as the host does).
  double dropoutScale;
  float dropoutScaleF;
  AttentionBlockLayout layout;

  __device__ int64_t queryPosition(int64_t i) const {
    return contextGlobalPosition(layout.queries, i);
  }
  __device__ int64_t keyPosition(int64_t j) const {
    return contextGlobalPosition(layout.keys, j);
  }
  __device__ bool visible(int64_t queryPos, int64_t j) const {
    return !causal || keyPosition(j) <= queryPos;
  }
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
  __device__ int64_t row(int64_t b, int64_t h, int64_t i) const {
    return (b * headsQ + h) * seqQ + i;
  }
  /// The key of P[b, h, i, *]'s sample and the place of its element 0 in
  /// the sample's global probabilities [heads, S, S].
  struct MaskRow {
    uint64_t key, position;
  };
  __device__ MaskRow probabilityRow(int64_t b, int64_t h,
                                    int64_t queryPos) const {
    uint64_t sample = firstSample + static_cast<uint64_t>(b + batchOffset);
    int64_t global = layout.queries.global;
    return {random::sampleKey(seedKey, sample),
            static_cast<uint64_t>(((h + headOffset) * global + queryPos) *
                                  global)};
  }
  __device__ bool keep(const MaskRow &row, int64_t j) const {
    return random::dropoutKeep(
        row.key, row.position + static_cast<uint64_t>(keyPosition(j)),
        dropoutThreshold16);
  }
};

Geometry makeGeometry(const AttentionParams &p,
                      const AttentionBlockLayout &layout) {
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
  g.dropoutScale = p.dropoutP > 0 ? 1.0 / (1.0 - p.dropoutP) : 1.0;
  g.dropoutScaleF = static_cast<float>(g.dropoutScale);
  g.layout = layout;
  return g;
}

/// a . b[bOffset..] over n elements by one warp; every lane gets the sum.
__device__ inline float warpDot(const float *a, InElements b, int64_t bOffset,
                                int64_t n, int lane) {
  float sum = 0.0f;
  for (int64_t d = lane; d < n; d += kWarp)
    sum += a[d] * load(b, bOffset + d);
  return warpSum(sum);
}

/// Row j of a head's keys or values: at base + j * stride.
struct RowOffsets {
  int64_t base, stride;
  __device__ int64_t operator()(int64_t j) const { return base + j * stride; }
};

/// out[outOffset + d] = scale * sum over j < n of weights[j] *
/// rows[rowOffset(j) + d] for d < width, by the whole block; `reduce` holds
/// blockDim.x floats. Starts with a barrier.
__device__ inline void weightedRowSum(const float *weights, int64_t n,
                                      int64_t width, InElements rows,
                                      RowOffsets rowOffset, float scale,
                                      float *reduce, OutElements out,
                                      int64_t outOffset) {
  __syncthreads();
  int t = threadIdx.x;
  if (width <= blockDim.x) {
    int parts = blockDim.x / static_cast<int>(width);
    int d = t % static_cast<int>(width), part = t / static_cast<int>(width);
    float acc = 0.0f;
    if (part < parts)
      for (int64_t j = part; j < n; j += parts)
        if (weights[j] != 0.0f)
          acc += weights[j] * load(rows, rowOffset(j) + d);
    reduce[t] = acc;
    __syncthreads();
    if (t < width) {
      float sum = 0.0f;
      for (int p = 0; p < parts; ++p)
        sum += reduce[p * width + t];
      store(out, outOffset + t, scale == 1.0f ? sum : scale * sum);
    }
    return;
  }
  for (int64_t d = t; d < width; d += blockDim.x) {
    float acc = 0.0f;
    for (int64_t j = 0; j < n; ++j)
      if (weights[j] != 0.0f)
        acc += weights[j] * load(rows, rowOffset(j) + d);
    store(out, outOffset + d, scale == 1.0f ? acc : scale * acc);
  }
}

// Grid (seqQ, headsQ, batch). Shared: scores[seqK], q row[headDim].
__global__ void __launch_bounds__(kBlockThreads)
    blockForwardKernel(Geometry geo, InElements q, InElements k, InElements v,
                       OutElements out, float *logsumexp) {
  extern __shared__ float shared[];
  __shared__ float reduceMax[kBlockWarps];
  __shared__ double reduceSum[kBlockWarps];
  __shared__ float reduce[kBlockThreads];
  float *probs = shared;
  float *qRow = shared + geo.seqK;
  int64_t i = blockIdx.x, h = blockIdx.y, b = blockIdx.z;
  int64_t g = h / geo.group;
  int lane = threadIdx.x % kWarp, warp = threadIdx.x / kWarp;
  int64_t row = geo.row(b, h, i);
  int64_t queryPos = geo.queryPosition(i);

  int64_t qi = geo.qOffset(b, i, h);
  for (int64_t d = threadIdx.x; d < geo.headDim; d += blockDim.x)
    qRow[d] = load(q, qi + d);
  __syncthreads();
  for (int64_t j = warp; j < geo.seqK; j += kBlockWarps) {
    bool visible = geo.visible(queryPos, j); // uniform over the warp
    float dot = visible ? warpDot(qRow, k, geo.kOffset(b, j, g), geo.headDim,
                                  lane)
                        : 0.0f;
    if (lane == 0)
      probs[j] = visible ? geo.scale * dot : -INFINITY;
  }
  __syncthreads();
  float maxScore = -INFINITY;
  for (int64_t j = threadIdx.x; j < geo.seqK; j += blockDim.x)
    maxScore = fmaxf(maxScore, probs[j]);
  maxScore = detail::blockMax(maxScore, reduceMax);
  int64_t o = geo.oOffset(b, i, h);
  if (maxScore == -INFINITY) { // no key of this block is visible
    for (int64_t d = threadIdx.x; d < geo.headDimV; d += blockDim.x)
      store(out, o + d, 0.0f);
    if (threadIdx.x == 0)
      logsumexp[row] = -INFINITY;
    return;
  }
  double sum = 0;
  for (int64_t j = threadIdx.x; j < geo.seqK; j += blockDim.x) {
    float e = probs[j] == -INFINITY ? 0.0f : expf(probs[j] - maxScore);
    probs[j] = e;
    sum += e;
  }
  sum = detail::blockSum(sum, reduceSum);
  if (threadIdx.x == 0)
    logsumexp[row] = static_cast<float>(maxScore + log(sum));
  Geometry::MaskRow maskRow = geo.probabilityRow(b, h, queryPos);
  for (int64_t j = threadIdx.x; j < geo.seqK; j += blockDim.x) {
    double prob = probs[j] / sum;
    if (geo.hasDropout && prob != 0.0)
      prob = geo.keep(maskRow, j) ? prob * geo.dropoutScale : 0.0;
    probs[j] = static_cast<float>(prob);
  }
  weightedRowSum(probs, geo.seqK, geo.headDimV, v,
                 RowOffsets{geo.vOffset(b, 0, g), geo.headsKv * geo.headDimV},
                 1.0f, reduce, out, o);
}

// Backward, the queries. Grid (seqQ, headsQ, batch). Per query row: P from
// the whole row's logsumexp, dP = dout . v through the dropout, dS = P (dP -
// delta) with the whole row's delta, dq = scale * dS k. Shared: probs[seqK],
// dprobs[seqK], q row, dout row.
__global__ void __launch_bounds__(kBlockThreads)
    blockBackwardQueryKernel(Geometry geo, InElements q, InElements k,
                             InElements v, const float *logsumexp,
                             const float *delta, InElements dout,
                             OutElements dq) {
  extern __shared__ float shared[];
  __shared__ float reduce[kBlockThreads];
  float *probs = shared;
  float *dprobs = probs + geo.seqK;
  float *qRow = dprobs + geo.seqK;
  float *doRow = qRow + geo.headDim;
  int64_t i = blockIdx.x, h = blockIdx.y, b = blockIdx.z;
  int64_t g = h / geo.group;
  int lane = threadIdx.x % kWarp, warp = threadIdx.x / kWarp;
  int64_t row = geo.row(b, h, i);
  int64_t queryPos = geo.queryPosition(i);
  float lse = logsumexp[row];
  int64_t qi = geo.qOffset(b, i, h);
  if (lse == -INFINITY) { // a row that sees no key anywhere
    for (int64_t d = threadIdx.x; d < geo.headDim; d += blockDim.x)
      store(dq, qi + d, 0.0f);
    return;
  }
  float rowDelta = delta[row];
  Geometry::MaskRow maskRow = geo.probabilityRow(b, h, queryPos);
  int64_t doi = geo.oOffset(b, i, h);
  for (int64_t d = threadIdx.x; d < geo.headDim; d += blockDim.x)
    qRow[d] = load(q, qi + d);
  for (int64_t d = threadIdx.x; d < geo.headDimV; d += blockDim.x)
    doRow[d] = load(dout, doi + d);
  __syncthreads();
  for (int64_t j = warp; j < geo.seqK; j += kBlockWarps) {
    if (!geo.visible(queryPos, j)) {
      if (lane == 0)
        probs[j] = dprobs[j] = 0.0f;
      continue;
    }
    float score =
        geo.scale * warpDot(qRow, k, geo.kOffset(b, j, g), geo.headDim, lane);
    float dprob =
        warpDot(doRow, v, geo.vOffset(b, j, g), geo.headDimV, lane);
    if (geo.hasDropout)
      dprob = geo.keep(maskRow, j) ? dprob * geo.dropoutScaleF : 0.0f;
    if (lane == 0) {
      float prob = expf(score - lse);
      probs[j] = prob;
      dprobs[j] = prob * (dprob - rowDelta);
    }
  }
  weightedRowSum(dprobs, geo.seqK, geo.headDim, k,
                 RowOffsets{geo.kOffset(b, 0, g), geo.headsKv * geo.headDim},
                 geo.scale, reduce, dq, qi);
}

// Backward, the keys. Grid (seqK, headsKv, batch). Per key row j of head
// group g: dv_j = sum over the group's query heads and the queries that see
// j of dropout(P)_ij dout_i, dk_j = scale * sum dS_ij q_i. Each warp takes
// every kBlockWarps-th query and keeps its sums in registers (lane l holds
// elements l, l + 32, ...); the warps' sums are added at the end.
__global__ void __launch_bounds__(kBlockThreads)
    blockBackwardKeyKernel(Geometry geo, InElements q, InElements k,
                           InElements v, const float *logsumexp,
                           const float *delta, InElements dout, OutElements dk,
                           OutElements dv) {
  extern __shared__ float shared[];
  __shared__ float reduceK[kBlockWarps][kMaxHeadDim];
  __shared__ float reduceV[kBlockWarps][kMaxHeadDim];
  float *kRow = shared;
  float *vRow = shared + geo.headDim;
  int64_t j = blockIdx.x, g = blockIdx.y, b = blockIdx.z;
  int lane = threadIdx.x % kWarp, warp = threadIdx.x / kWarp;
  int64_t kj = geo.kOffset(b, j, g), vj = geo.vOffset(b, j, g);
  for (int64_t d = threadIdx.x; d < geo.headDim; d += blockDim.x)
    kRow[d] = load(k, kj + d);
  for (int64_t d = threadIdx.x; d < geo.headDimV; d += blockDim.x)
    vRow[d] = load(v, vj + d);
  __syncthreads();
  int64_t keyPos = geo.keyPosition(j);

  float dkAcc[kMaxLaneElements], dvAcc[kMaxLaneElements];
#pragma unroll
  for (int c = 0; c < kMaxLaneElements; ++c) {
    dkAcc[c] = 0.0f;
    dvAcc[c] = 0.0f;
  }
  for (int64_t h = g * geo.group; h < (g + 1) * geo.group; ++h) {
    for (int64_t i = warp; i < geo.seqQ; i += kBlockWarps) {
      int64_t queryPos = geo.queryPosition(i);
      int64_t row = geo.row(b, h, i);
      float lse = logsumexp[row];
      // Uniform over the warp: one query row.
      if ((geo.causal && keyPos > queryPos) || lse == -INFINITY)
        continue;
      int64_t qi = geo.qOffset(b, i, h), doi = geo.oOffset(b, i, h);
      float score = 0.0f, dprob = 0.0f;
      for (int64_t d = lane; d < geo.headDim; d += kWarp)
        score += kRow[d] * load(q, qi + d);
      for (int64_t d = lane; d < geo.headDimV; d += kWarp)
        dprob += vRow[d] * load(dout, doi + d);
      score = geo.scale * warpSum(score);
      dprob = warpSum(dprob);
      float prob = expf(score - lse);
      float dropped = prob;
      if (geo.hasDropout) {
        bool kept = geo.keep(geo.probabilityRow(b, h, queryPos), j);
        dropped = kept ? prob * geo.dropoutScaleF : 0.0f;
        dprob = kept ? dprob * geo.dropoutScaleF : 0.0f;
      }
      float scaled = geo.scale * (prob * (dprob - delta[row]));
#pragma unroll
      for (int c = 0; c < kMaxLaneElements; ++c) {
        int64_t e = lane + c * kWarp;
        if (e < geo.headDimV)
          dvAcc[c] += dropped * load(dout, doi + e);
        if (e < geo.headDim)
          dkAcc[c] += scaled * load(q, qi + e);
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
    for (int w = 0; w < kBlockWarps; ++w)
      sum += reduceK[w][e];
    store(dk, kj + e, sum);
  }
  for (int64_t e = threadIdx.x; e < geo.headDimV; e += blockDim.x) {
    float sum = 0.0f;
    for (int w = 0; w < kBlockWarps; ++w)
      sum += reduceV[w][e];
    store(dv, vj + e, sum);
  }
}

/// The row (b, h, i) of [batch, heads, seq] statistics and the offset of
/// its output row in [batch, seq, heads, headDimV].
struct RowPlace {
  int64_t seq, heads, headDimV;
  __device__ int64_t outputOffset(int64_t row) const {
    int64_t i = row % seq, h = (row / seq) % heads, b = row / (seq * heads);
    return ((b * seq + i) * heads + h) * headDimV;
  }
};

// One warp per row: every lane reads the row's statistics before lane 0
// writes the merged one, so the results may alias the operands.
__global__ void __launch_bounds__(kBlockThreads)
    mergeKernel(int64_t rows, RowPlace place, InElements out,
                const float *logsumexp, InElements blockOut,
                const float *blockLogsumexp, OutElements merged,
                float *mergedLogsumexp) {
  int lane = threadIdx.x % kWarp;
  int64_t row = static_cast<int64_t>(blockIdx.x) * kBlockWarps +
                threadIdx.x / kWarp;
  if (row >= rows)
    return;
  int64_t offset = place.outputOffset(row);
  double lse = logsumexp[row], blockLse = blockLogsumexp[row];
  double keepOld = 1.0, takeNew = 0.0, mergedLse = lse;
  if (blockLse != -INFINITY) {
    double top = fmax(lse, blockLse);
    mergedLse = top + log(exp(lse - top) + exp(blockLse - top));
    keepOld = exp(lse - mergedLse);
    takeNew = exp(blockLse - mergedLse);
  }
  for (int64_t d = lane; d < place.headDimV; d += kWarp) {
    double value = keepOld * load(out, offset + d);
    if (takeNew != 0.0)
      value += takeNew * load(blockOut, offset + d);
    store(merged, offset + d, static_cast<float>(value));
  }
  __syncwarp();
  if (lane == 0)
    mergedLogsumexp[row] = static_cast<float>(mergedLse);
}

__global__ void __launch_bounds__(kBlockThreads)
    deltaKernel(int64_t rows, RowPlace place, InElements out, InElements dout,
                float *delta) {
  int lane = threadIdx.x % kWarp;
  int64_t row = static_cast<int64_t>(blockIdx.x) * kBlockWarps +
                threadIdx.x / kWarp;
  if (row >= rows)
    return;
  int64_t offset = place.outputOffset(row);
  double sum = 0;
  for (int64_t d = lane; d < place.headDimV; d += kWarp)
    sum += static_cast<double>(load(out, offset + d)) * load(dout, offset + d);
  sum = warpSum(sum);
  if (lane == 0)
    delta[row] = static_cast<float>(sum);
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

/// Lets `kernel` take more than the default 48 KiB of dynamic shared memory
/// when it needs it.
template <typename Kernel>
void allowSharedBytes(Kernel kernel, size_t bytes) {
  if (bytes > 48 * 1024)
    MTRT_CUDA_CHECK(
        cudaFuncSetAttribute(kernel,
                             cudaFuncAttributeMaxDynamicSharedMemorySize,
                             static_cast<int>(bytes)),
        "allowing an attention block kernel " + std::to_string(bytes) +
            " bytes of shared memory");
}

bool empty(const AttentionParams &p) {
  return p.batch <= 0 || p.seqQ <= 0 || p.headsQ <= 0;
}

dim3 queryGrid(const AttentionParams &p) {
  return dim3(static_cast<unsigned>(p.seqQ), static_cast<unsigned>(p.headsQ),
              static_cast<unsigned>(p.batch));
}

unsigned rowBlocks(int64_t rows) {
  return static_cast<unsigned>((rows + kBlockWarps - 1) / kBlockWarps);
}

} // namespace

std::string attentionBlockUnsupportedReason(const AttentionParams &p,
                                            int device) {
  if (p.headDim > kMaxHeadDim || p.headDimV > kMaxHeadDim)
    return "head dimensions " + std::to_string(p.headDim) + " and " +
           std::to_string(p.headDimV) +
           " exceed the attention block kernels' " +
           std::to_string(kMaxHeadDim);
  if (p.seqQ > 2147483647 || p.seqK > 2147483647 || p.headsQ > 65535 ||
      p.headsKv > 65535 || p.batch > 65535 ||
      p.batch * p.headsQ * p.seqQ / kBlockWarps > 2147483647)
    return "the grid would exceed CUDA's limits (sequence, heads or batch "
           "too large)";
  int limit = 0;
  if (cudaDeviceGetAttribute(&limit, cudaDevAttrMaxSharedMemoryPerBlockOptin,
                             device) != cudaSuccess) {
    (void)cudaGetLastError();
    limit = 48 * 1024;
  }
  size_t staticBytes = 2 * sizeof(float) * kBlockWarps * kMaxHeadDim;
  size_t need = std::max({forwardSharedBytes(p), queryBackwardSharedBytes(p),
                          keyBackwardSharedBytes(p) + staticBytes});
  if (need > static_cast<size_t>(limit))
    return "a block of " + std::to_string(p.seqK) + " keys needs " +
           std::to_string(need) + " bytes of shared memory per thread block, "
           "over the device's " + std::to_string(limit) +
           " (the attention block kernels hold a row's scores; use more "
           "context-parallel ranks or the p2p exchange for shorter blocks)";
  return std::string();
}

void attentionBlockForward(cudaStream_t stream, const AttentionParams &params,
                           const AttentionBlockLayout &layout, InElements q,
                           InElements k, InElements v, OutElements out,
                           float *logsumexp) {
  if (empty(params))
    return;
  Geometry geo = makeGeometry(params, layout);
  size_t bytes = forwardSharedBytes(params);
  allowSharedBytes(blockForwardKernel, bytes);
  blockForwardKernel<<<queryGrid(params), kBlockThreads, bytes, stream>>>(
      geo, q, k, v, out, logsumexp);
}

void attentionMerge(cudaStream_t stream, int64_t batch, int64_t seq,
                    int64_t heads, int64_t headDimV, InElements out,
                    const float *logsumexp, InElements blockOut,
                    const float *blockLogsumexp, OutElements merged,
                    float *mergedLogsumexp) {
  int64_t rows = batch * heads * seq;
  if (rows <= 0)
    return;
  mergeKernel<<<rowBlocks(rows), kBlockThreads, 0, stream>>>(
      rows, RowPlace{seq, heads, headDimV}, out, logsumexp, blockOut,
      blockLogsumexp, merged, mergedLogsumexp);
}

void attentionDelta(cudaStream_t stream, int64_t batch, int64_t seq,
                    int64_t heads, int64_t headDimV, InElements out,
                    InElements dout, float *delta) {
  int64_t rows = batch * heads * seq;
  if (rows <= 0)
    return;
  deltaKernel<<<rowBlocks(rows), kBlockThreads, 0, stream>>>(
      rows, RowPlace{seq, heads, headDimV}, out, dout, delta);
}

void attentionBlockBackward(cudaStream_t stream, const AttentionParams &params,
                            const AttentionBlockLayout &layout, InElements q,
                            InElements k, InElements v,
                            const float *logsumexp, const float *delta,
                            InElements dout, OutElements dq, OutElements dk,
                            OutElements dv) {
  if (empty(params))
    return;
  Geometry geo = makeGeometry(params, layout);
  size_t bytes = queryBackwardSharedBytes(params);
  allowSharedBytes(blockBackwardQueryKernel, bytes);
  blockBackwardQueryKernel<<<queryGrid(params), kBlockThreads, bytes,
                             stream>>>(geo, q, k, v, logsumexp, delta, dout,
                                       dq);
  if (params.seqK <= 0)
    return;
  bytes = keyBackwardSharedBytes(params);
  allowSharedBytes(blockBackwardKeyKernel, bytes);
  dim3 keyGrid(static_cast<unsigned>(params.seqK),
               static_cast<unsigned>(params.headsKv),
               static_cast<unsigned>(params.batch));
  blockBackwardKeyKernel<<<keyGrid, kBlockThreads, bytes, stream>>>(
      geo, q, k, v, logsumexp, delta, dout, dk, dv);
}

} // namespace mtrt::cuda
