// The mixture-of-experts kernels (MoeKernels.h): the device twins of
// host/kernels/Moe.cpp. One thread per token where a token's work is its
// row of logits (routing, the losses' gradients), one warp or element per
// row of hidden values elsewhere.
#include "cuda/kernels/KernelSupport.cuh"
#include "cuda/kernels/MoeKernels.h"

#include <cmath>

namespace mtrt::cuda {

namespace {

using detail::blocksFor;
using detail::kThreads;
using detail::kWarp;

/// Sigmoid weights are divided by their sum plus this (host Moe.cpp).
constexpr double kSigmoidEpsilon = 1e-20;
constexpr int kLayoutThreads = 1024;

__device__ double sigmoid(double x) { return 1.0 / (1.0 + exp(-x)); }

size_t pieceBytes(size_t bytes) { return (bytes + 255) / 256 * 256; }

/// A token's top-k experts, highest key(j) first, ties to the lower
/// expert; with a group size, only the experts of the groups set in `kept`.
template <typename Key>
__device__ void topExpertsBy(Key key, int64_t experts, int64_t topk,
                             int32_t *chosen, int64_t groupSize = 0,
                             uint64_t kept = 0) {
  for (int64_t i = 0; i < topk; ++i) {
    int32_t best = -1;
    double bestKey = 0;
    for (int64_t j = 0; j < experts; ++j) {
      bool taken = groupSize > 0 && !((kept >> (j / groupSize)) & 1u);
      for (int64_t c = 0; c < i; ++c)
        taken = taken || chosen[c] == j;
      double v = key(j);
      if (!taken && (best < 0 || v > bestKey)) {
        best = static_cast<int32_t>(j);
        bestKey = v;
      }
    }
    chosen[i] = best;
  }
}

/// A token's top-k experts by logit.
__device__ void topExperts(const float *row, int64_t experts, int64_t topk,
                           int32_t *chosen) {
  topExpertsBy([&](int64_t j) { return static_cast<double>(row[j]); }, experts,
               topk, chosen);
}

/// max and the sum of exp(x - max) over a row, in double, in order.
__device__ void softmaxStats(const float *row, int64_t n, double &max,
                             double &sum) {
  max = row[0];
  for (int64_t j = 1; j < n; ++j)
    max = fmax(max, static_cast<double>(row[j]));
  sum = 0;
  for (int64_t j = 0; j < n; ++j)
    sum += exp(static_cast<double>(row[j]) - max);
}

/// A token's routed experts (host routedExperts): the top-k, or with
/// group-limited routing the top-k within its groupTopk best groups (as
/// bits; ties: the lower group), a group scored by the sum of its
/// topk / groupTopk highest scores, highest first. With an expert bias
/// (`bias`, [experts], or null) both take each sigmoid plus its expert's
/// bias.
__device__ void routedExperts(const MoeRouter &r, const float *row,
                              const float *bias, int32_t *chosen) {
  auto key = [&](int64_t j) {
    double x = row[j];
    return bias ? sigmoid(x) + static_cast<double>(bias[j]) : x;
  };
  if (r.groupTopk == 0) {
    topExpertsBy(key, r.experts, r.topk, chosen);
    return;
  }
  const int64_t size = r.experts / r.numGroups, best = r.topk / r.groupTopk;
  double max = 0, sum = 1;
  if (!r.sigmoid && !r.normalize)
    softmaxStats(row, r.experts, max, sum);
  auto score = [&](int64_t j) {
    double x = row[j];
    return bias          ? key(j)
           : r.sigmoid   ? sigmoid(x)
           : r.normalize ? x
                         : exp(x - max) / sum;
  };
  double groupScores[kMoeMaxGroups];
  for (int64_t g = 0; g < r.numGroups; ++g) {
    // The group's `best` highest scores, found as the top-k is (`chosen`
    // holds their experts meanwhile).
    double total = 0;
    for (int64_t i = 0; i < best; ++i) {
      int32_t top = -1;
      double topScore = 0;
      for (int64_t j = g * size; j < (g + 1) * size; ++j) {
        bool taken = false;
        for (int64_t c = 0; c < i; ++c)
          taken = taken || chosen[c] == j;
        double v = score(j);
        if (!taken && (top < 0 || v > topScore)) {
          top = static_cast<int32_t>(j);
          topScore = v;
        }
      }
      chosen[i] = top;
      total += topScore;
    }
    groupScores[g] = total;
  }
  uint64_t kept = 0;
  for (int64_t i = 0; i < r.groupTopk; ++i) {
    int64_t top = -1;
    for (int64_t g = 0; g < r.numGroups; ++g)
      if (!((kept >> g) & 1u) && (top < 0 || groupScores[g] > groupScores[top]))
        top = g;
    kept |= uint64_t(1) << top;
  }
  topExpertsBy(key, r.experts, r.topk, chosen, size, kept);
}

/// The chosen experts' weights before dropping (host routeWeights).
__device__ void routeWeights(const MoeRouter &r, const float *row,
                             const int32_t *chosen, double *weights) {
  const int64_t k = r.topk;
  if (r.sigmoid) {
    double sum = 0;
    for (int64_t i = 0; i < k; ++i)
      sum += weights[i] = sigmoid(static_cast<double>(row[chosen[i]]));
    if (r.normalize)
      for (int64_t i = 0; i < k; ++i)
        weights[i] /= sum + kSigmoidEpsilon;
    return;
  }
  if (r.normalize) {
    double max = row[chosen[0]], sum = 0;
    for (int64_t i = 0; i < k; ++i)
      sum += weights[i] = exp(static_cast<double>(row[chosen[i]]) - max);
    for (int64_t i = 0; i < k; ++i)
      weights[i] /= sum;
    return;
  }
  double max, sum;
  softmaxStats(row, r.experts, max, sum);
  for (int64_t i = 0; i < k; ++i)
    weights[i] = exp(static_cast<double>(row[chosen[i]]) - max) / sum;
}

__global__ void layoutKernel(int64_t slots, int experts, const int32_t *indices,
                             int32_t *offsets, int32_t *position,
                             int32_t *slotAt, unsigned *fault, unsigned tag) {
  __shared__ int warpRows[kLayoutThreads / kWarp][kMoeMaxExperts];
  __shared__ int next[kMoeMaxExperts + 1];
  const int tid = threadIdx.x, lane = tid % kWarp, warp = tid / kWarp;
  for (int e = tid; e <= experts; e += blockDim.x)
    next[e] = 0;
  __syncthreads();
  for (int64_t s = tid; s < slots; s += blockDim.x) {
    int e = indices[s];
    if (e >= 0 && e < experts)
      atomicAdd(&next[e + 1], 1);
    else if (e != -1)
      detail::raiseFault(fault, tag);
  }
  __syncthreads();
  if (tid == 0)
    for (int e = 0; e < experts; ++e)
      next[e + 1] += next[e];
  __syncthreads();
  for (int e = tid; e <= experts; e += blockDim.x)
    offsets[e] = next[e];
  __syncthreads();
  // Tiles of the slots in order: within a tile, warps in order, lanes in
  // order; each expert's rows continue from its running next row.
  for (int64_t start = 0; start < slots; start += blockDim.x) {
    int64_t s = start + tid;
    int e = s < slots ? indices[s] : -1;
    if (e < 0 || e >= experts)
      e = -1;
    for (int j = lane; j < experts; j += kWarp)
      warpRows[warp][j] = 0;
    __syncwarp();
    unsigned peers = __match_any_sync(0xffffffffu, e);
    int rank = __popc(peers & ((1u << lane) - 1u));
    if (e >= 0 && rank == 0)
      warpRows[warp][e] = __popc(peers);
    __syncthreads();
    for (int j = tid; j < experts; j += blockDim.x) {
      int run = next[j];
      for (int w = 0; w < kLayoutThreads / kWarp; ++w) {
        int count = warpRows[w][j];
        warpRows[w][j] = run;
        run += count;
      }
      next[j] = run;
    }
    __syncthreads();
    if (s < slots) {
      int p = e >= 0 ? warpRows[warp][e] + rank : -1;
      position[s] = p;
      if (p >= 0 && slotAt)
        slotAt[p] = static_cast<int32_t>(s);
    }
    __syncthreads();
  }
}

__global__ void routeForwardKernel(MoeRouter r, const float *logits,
                                   const float *bias, float *probs,
                                   int32_t *indices) {
  int32_t chosen[kMoeMaxTopk];
  double weights[kMoeMaxTopk];
  MTRT_GRID_STRIDE(t, r.tokens) {
    const float *row = logits + t * r.experts;
    routedExperts(r, row, bias, chosen);
    routeWeights(r, row, chosen, weights);
    for (int64_t i = 0; i < r.topk; ++i) {
      indices[t * r.topk + i] = chosen[i];
      probs[t * r.topk + i] = static_cast<float>(weights[i]);
    }
  }
}

/// Capacity routing: marks each slot past its expert's capacity, ranked by
/// weight (ties in token order, the host's stable sort) or by position.
__global__ void markDroppedKernel(int64_t slots, int64_t capacity,
                                  bool byPosition, const int32_t *indices,
                                  const float *probs, const int32_t *offsets,
                                  const int32_t *position,
                                  const int32_t *slotAt, int32_t *dropped) {
  MTRT_GRID_STRIDE(s, slots) {
    int32_t e = indices[s];
    int64_t first = offsets[e], rank = position[s] - first;
    if (!byPosition) {
      rank = 0;
      float mine = probs[s];
      for (int64_t p = first; p < offsets[e + 1]; ++p) {
        int32_t other = slotAt[p];
        float theirs = probs[other];
        rank += theirs > mine || (theirs == mine && other < s);
      }
    }
    dropped[s] = rank >= capacity;
  }
}

__global__ void applyDropsKernel(int64_t slots, const int32_t *dropped,
                                 float *probs, int32_t *indices) {
  MTRT_GRID_STRIDE(s, slots) {
    if (dropped[s]) {
      indices[s] = -1;
      probs[s] = 0.0f;
    }
  }
}

__global__ void routeBackwardKernel(MoeRouter r, const float *logits,
                                    const float *bias, const int32_t *indices,
                                    const float *dprobs, float *dlogits) {
  int32_t chosen[kMoeMaxTopk];
  double weights[kMoeMaxTopk], g[kMoeMaxTopk];
  const int64_t k = r.topk, e = r.experts;
  MTRT_GRID_STRIDE(t, r.tokens) {
    const float *row = logits + t * e;
    float *drow = dlogits + t * e;
    routedExperts(r, row, bias, chosen);
    routeWeights(r, row, chosen, weights);
    for (int64_t i = 0; i < k; ++i)
      g[i] = indices[t * k + i] >= 0 ? static_cast<double>(dprobs[t * k + i])
                                     : 0.0;
    if (r.sigmoid) {
      double sum = 0, weighted = 0;
      for (int64_t i = 0; i < k; ++i) {
        double sig = sigmoid(static_cast<double>(row[chosen[i]]));
        sum += sig;
        weighted += g[i] * sig;
      }
      double denom = sum + kSigmoidEpsilon;
      for (int64_t j = 0; j < e; ++j)
        drow[j] = 0.0f;
      for (int64_t i = 0; i < k; ++i) {
        double sig = sigmoid(static_cast<double>(row[chosen[i]]));
        double dsig =
            r.normalize ? g[i] / denom - weighted / (denom * denom) : g[i];
        drow[chosen[i]] = static_cast<float>(dsig * sig * (1.0 - sig));
      }
    } else if (r.normalize) {
      double dot = 0;
      for (int64_t i = 0; i < k; ++i)
        dot += g[i] * weights[i];
      for (int64_t j = 0; j < e; ++j)
        drow[j] = 0.0f;
      for (int64_t i = 0; i < k; ++i)
        drow[chosen[i]] = static_cast<float>(weights[i] * (g[i] - dot));
    } else {
      // The chosen entries of the softmax over all experts.
      double max, sum, dot = 0;
      softmaxStats(row, e, max, sum);
      for (int64_t i = 0; i < k; ++i)
        dot += g[i] * weights[i];
      for (int64_t j = 0; j < e; ++j) {
        double up = 0;
        for (int64_t i = 0; i < k; ++i)
          up = chosen[i] == j ? g[i] : up;
        double score = exp(static_cast<double>(row[j]) - max) / sum;
        drow[j] = static_cast<float>(score * (up - dot));
      }
    }
  }
}

__global__ void zeroFloatsKernel(int64_t n, float *x) {
  MTRT_GRID_STRIDE(i, n) { x[i] = 0.0f; }
}

__global__ void tokensPerExpertKernel(int64_t slots, int64_t experts,
                                      const int32_t *indices, float *counts) {
  MTRT_GRID_STRIDE(s, slots) {
    int32_t e = indices[s];
    if (e >= 0 && e < experts)
      atomicAdd(counts + e, 1.0f);
  }
}

__global__ void zeroCountsKernel(int64_t n, int32_t *counts) {
  for (int64_t e = threadIdx.x; e < n; e += blockDim.x)
    counts[e] = 0;
}

/// The aux loss's sequences (host sequenceTokens): the sequence-level
/// loss's, or all the tokens as one.
__host__ __device__ int64_t sequenceTokens(const MoeRouter &r) {
  return r.sequenceLength > 0 ? r.sequenceLength : r.tokens;
}

/// The aux loss's tokens per expert (the top-k before dropping) per
/// sequence, [sequences, experts], and each row's score statistics:
/// softmax max and sum, or the sigmoids' sum.
__global__ void auxCountsKernel(MoeRouter r, const float *logits,
                                int32_t *counts, double *rowMax,
                                double *rowSum) {
  int32_t chosen[kMoeMaxTopk];
  MTRT_GRID_STRIDE(t, r.tokens) {
    const float *row = logits + t * r.experts;
    topExperts(row, r.experts, r.topk, chosen);
    for (int64_t i = 0; i < r.topk; ++i)
      atomicAdd(&counts[t / sequenceTokens(r) * r.experts + chosen[i]], 1);
    if (r.sigmoid) {
      double sum = 0;
      for (int64_t j = 0; j < r.experts; ++j)
        sum += sigmoid(static_cast<double>(row[j]));
      rowSum[t] = sum;
    } else {
      softmaxStats(row, r.experts, rowMax[t], rowSum[t]);
    }
  }
}

__device__ double auxScore(const MoeRouter &r, float logit, double max,
                           double sum) {
  if (r.sigmoid)
    return sigmoid(static_cast<double>(logit)) / (sum + kSigmoidEpsilon);
  return exp(static_cast<double>(logit) - max) / sum;
}

/// perExpert[q, e] = the sum over sequence q's tokens of e's score: one
/// block per expert and sequence.
__global__ void auxPerExpertKernel(MoeRouter r, const float *logits,
                                   const double *rowMax, const double *rowSum,
                                   double *perExpert) {
  __shared__ double partial[kThreads / kWarp];
  const int64_t e = blockIdx.x, q = blockIdx.y, s = sequenceTokens(r);
  double sum = 0;
  for (int64_t t = q * s + threadIdx.x; t < (q + 1) * s; t += blockDim.x)
    sum += auxScore(r, logits[t * r.experts + e], r.sigmoid ? 0.0 : rowMax[t],
                    rowSum[t]);
  sum = detail::blockSum(sum, partial);
  if (threadIdx.x == 0)
    perExpert[q * r.experts + e] = sum;
}

__global__ void auxLossKernel(int64_t n, double scale, const double *perExpert,
                              const int32_t *counts, float *loss) {
  double sum = 0;
  for (int64_t e = 0; e < n; ++e)
    sum += perExpert[e] * static_cast<double>(counts[e]);
  loss[0] = static_cast<float>(sum * scale);
}

__global__ void auxBackwardKernel(MoeRouter r, double scale,
                                  const float *logits, const float *dloss,
                                  const int32_t *allCounts,
                                  const double *rowMax, const double *rowSum,
                                  float *dlogits) {
  const double c = static_cast<double>(dloss[0]) * scale;
  const int64_t e = r.experts;
  MTRT_GRID_STRIDE(t, r.tokens) {
    const float *row = logits + t * e;
    float *drow = dlogits + t * e;
    const int32_t *counts = allCounts + t / sequenceTokens(r) * e;
    if (!r.sigmoid) {
      double dot = 0;
      for (int64_t j = 0; j < e; ++j)
        dot += auxScore(r, row[j], rowMax[t], rowSum[t]) * c * counts[j];
      for (int64_t j = 0; j < e; ++j) {
        double score = auxScore(r, row[j], rowMax[t], rowSum[t]);
        drow[j] = static_cast<float>(score * (c * counts[j] - dot));
      }
      continue;
    }
    double weighted = 0;
    for (int64_t j = 0; j < e; ++j)
      weighted += c * counts[j] * sigmoid(static_cast<double>(row[j]));
    double denom = rowSum[t] + kSigmoidEpsilon;
    for (int64_t j = 0; j < e; ++j) {
      double sig = sigmoid(static_cast<double>(row[j]));
      double dsig = c * counts[j] / denom - weighted / (denom * denom);
      drow[j] = static_cast<float>(dsig * sig * (1.0 - sig));
    }
  }
}

__device__ double logSumExp(const float *row, int64_t n) {
  double max, sum;
  softmaxStats(row, n, max, sum);
  return max + log(sum);
}

/// One block: the sum over tokens of logsumexp^2.
__global__ void zLossKernel(int64_t tokens, int64_t experts, double coeff,
                            const float *logits, float *loss) {
  __shared__ double partial[kLayoutThreads / kWarp];
  double sum = 0;
  for (int64_t t = threadIdx.x; t < tokens; t += blockDim.x) {
    double lse = logSumExp(logits + t * experts, experts);
    sum += lse * lse;
  }
  sum = detail::blockSum(sum, partial);
  if (threadIdx.x == 0)
    loss[0] = static_cast<float>(coeff * sum / static_cast<double>(tokens));
}

__global__ void zLossBackwardKernel(int64_t tokens, int64_t experts,
                                    double coeff, const float *logits,
                                    const float *dloss, float *dlogits) {
  const double c =
      static_cast<double>(dloss[0]) * coeff * 2.0 / static_cast<double>(tokens);
  MTRT_GRID_STRIDE(t, tokens) {
    const float *row = logits + t * experts;
    double max, sum;
    softmaxStats(row, experts, max, sum);
    double lse = max + log(sum);
    for (int64_t j = 0; j < experts; ++j)
      dlogits[t * experts + j] = static_cast<float>(
          c * lse * exp(static_cast<double>(row[j]) - max) / sum);
  }
}

/// W consecutive elements of a row (W = 4: one 16-byte fp32 or 8-byte bf16
/// access, load4/store4), computed in float.
template <int W> struct Lanes { float v[W]; };

template <int W> __device__ Lanes<W> loadLanes(InElements x, int64_t q) {
  Lanes<W> r;
  if constexpr (W == 4) {
    float4 f = detail::load4(x, q);
    r.v[0] = f.x, r.v[1] = f.y, r.v[2] = f.z, r.v[3] = f.w;
  } else {
    r.v[0] = detail::load(x, q);
  }
  return r;
}

template <int W>
__device__ void storeLanes(OutElements y, int64_t q, const Lanes<W> &r) {
  if constexpr (W == 4)
    detail::store4(y, q, make_float4(r.v[0], r.v[1], r.v[2], r.v[3]));
  else
    detail::store(y, q, r.v[0]);
}

/// Over groups of W elements: `width` groups per row.
template <int W>
__global__ void permuteKernel(int64_t slots, int64_t topk, int64_t width,
                              int64_t experts, const int32_t *offsets,
                              const int32_t *position, InElements x,
                              const float *probs, OutElements rows) {
  const int64_t kept = offsets[experts];
  MTRT_GRID_STRIDE(i, slots * width) {
    int64_t s = i / width, q = i % width;
    int64_t p = position[s];
    if (p >= 0) {
      Lanes<W> v = loadLanes<W>(x, (s / topk) * width + q);
      if (probs)
        for (int j = 0; j < W; ++j)
          v.v[j] = probs[s] * v.v[j];
      storeLanes<W>(rows, p * width + q, v);
    }
    if (s >= kept) // row s of the result is a zero row
      storeLanes<W>(rows, s * width + q, Lanes<W>{});
  }
}

template <int W>
__global__ void unpermuteKernel(int64_t tokens, int64_t topk, int64_t width,
                                const int32_t *position, InElements rows,
                                const float *probs, OutElements y) {
  MTRT_GRID_STRIDE(i, tokens * width) {
    int64_t t = i / width, q = i % width;
    Lanes<W> sum{};
    for (int64_t k = 0; k < topk; ++k) {
      int64_t p = position[t * topk + k];
      if (p < 0)
        continue;
      Lanes<W> v = loadLanes<W>(rows, p * width + q);
      for (int j = 0; j < W; ++j)
        sum.v[j] += probs ? probs[t * topk + k] * v.v[j] : v.v[j];
    }
    storeLanes<W>(y, i, sum);
  }
}

/// Expert parallelism's blocks, over groups of W elements: `width` groups
/// a row, `perRank` experts a rank. Each row of `to` finds its source row
/// in `from` from the offsets of the ranks' first experts.
template <int W>
__global__ void dispatchRowsKernel(int64_t slots, int64_t width, int64_t ranks,
                                   int64_t perRank, const int32_t *offsets,
                                   InElements from, OutElements to) {
  MTRT_GRID_STRIDE(i, ranks * slots * width) {
    int64_t row = i / width, q = i % width;
    int64_t d = row / slots, j = row % slots;
    int64_t first = offsets[d * perRank];
    int64_t count = offsets[(d + 1) * perRank] - first;
    Lanes<W> v{};
    if (j < count)
      v = loadLanes<W>(from, (first + j) * width + q);
    storeLanes<W>(to, i, v);
  }
}

template <int W>
__global__ void combineRowsKernel(int64_t slots, int64_t width, int64_t ranks,
                                  int64_t perRank, const int32_t *offsets,
                                  InElements from, OutElements to) {
  MTRT_GRID_STRIDE(i, slots * width) {
    int64_t p = i / width, q = i % width;
    Lanes<W> v{};
    if (p < offsets[ranks * perRank]) {
      int64_t d = 0;
      while (offsets[(d + 1) * perRank] <= p)
        ++d;
      int64_t block = d * slots + p - offsets[d * perRank];
      v = loadLanes<W>(from, block * width + q);
    }
    storeLanes<W>(to, i, v);
  }
}

__global__ void dispatchExpertsKernel(int64_t slots, int64_t ranks,
                                      int64_t perRank, const int32_t *offsets,
                                      int32_t *destinationExperts) {
  MTRT_GRID_STRIDE(i, ranks * slots) {
    int64_t d = i / slots, j = i % slots;
    int64_t e = d * perRank, row = offsets[e] + j;
    int32_t local = -1;
    if (row < offsets[e + perRank]) {
      while (offsets[e + 1] <= row)
        ++e;
      local = static_cast<int32_t>(e - d * perRank);
    }
    destinationExperts[i] = local;
  }
}

/// Whether rows of `hidden` elements of these tensors take 4-element
/// accesses.
bool fourLanes(int64_t hidden, const void *a, const void *b) {
  return hidden % 4 == 0 && detail::vectorizable(a) && detail::vectorizable(b);
}

__global__ void probsGradKernel(int64_t slots, int64_t topk, int64_t hidden,
                                const int32_t *position, InElements x,
                                InElements rows, float *dprobs) {
  const int lane = threadIdx.x % kWarp;
  const int64_t warps = static_cast<int64_t>(gridDim.x) * blockDim.x / kWarp;
  for (int64_t s =
           (static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x) /
           kWarp;
       s < slots; s += warps) {
    int64_t p = position[s], t = s / topk;
    float dot = 0.0f;
    if (p >= 0)
      for (int64_t h = lane; h < hidden; h += kWarp)
        dot += detail::load(x, t * hidden + h) *
               detail::load(rows, p * hidden + h);
    dot = detail::warpSum(dot);
    if (lane == 0)
      dprobs[s] = dot;
  }
}

int64_t capacityOf(const MoeRouter &r) {
  return static_cast<int64_t>(std::ceil(static_cast<double>(r.tokens * r.topk) /
                                        static_cast<double>(r.experts) *
                                        r.capacityFactor));
}

double auxScale(const MoeRouter &r, double coeff) {
  double s = static_cast<double>(sequenceTokens(r));
  return coeff * static_cast<double>(r.experts) /
         (static_cast<double>(r.topk) * s * s) /
         static_cast<double>(r.tokens / sequenceTokens(r));
}

/// The aux loss's [sequences, experts] entries.
int64_t auxEntries(const MoeRouter &r) {
  return r.tokens / sequenceTokens(r) * r.experts;
}

/// The aux loss's scratch pieces.
struct AuxScratch {
  int32_t *counts;
  double *rowMax, *rowSum, *perExpert;
  AuxScratch(const MoeRouter &r, void *base) {
    char *p = static_cast<char *>(base);
    counts = reinterpret_cast<int32_t *>(p);
    p += pieceBytes(4 * auxEntries(r));
    rowMax = reinterpret_cast<double *>(p);
    p += pieceBytes(8 * r.tokens);
    rowSum = reinterpret_cast<double *>(p);
    p += pieceBytes(8 * r.tokens);
    perExpert = reinterpret_cast<double *>(p);
  }
};

void auxStatistics(cudaStream_t stream, const MoeRouter &r, const float *logits,
                   const AuxScratch &s) {
  zeroCountsKernel<<<1, kThreads, 0, stream>>>(auxEntries(r), s.counts);
  auxCountsKernel<<<blocksFor(r.tokens, 128), 128, 0, stream>>>(
      r, logits, s.counts, s.rowMax, s.rowSum);
}

} // namespace

void moeLayout(cudaStream_t stream, int64_t slots, int64_t experts,
               const int32_t *indices, int32_t *offsets, int32_t *position,
               int32_t *slotAt, unsigned *fault, unsigned tag) {
  layoutKernel<<<1, kLayoutThreads, 0, stream>>>(
      slots, static_cast<int>(experts), indices, offsets, position, slotAt,
      fault, tag);
}

size_t moeRouteScratchBytes(const MoeRouter &r) {
  if (!(r.capacityFactor > 0))
    return 0;
  int64_t slots = r.tokens * r.topk;
  return pieceBytes(4 * (r.experts + 1)) + 3 * pieceBytes(4 * slots);
}

size_t moeAuxLossScratchBytes(const MoeRouter &r) {
  return pieceBytes(4 * auxEntries(r)) + 2 * pieceBytes(8 * r.tokens) +
         pieceBytes(8 * auxEntries(r));
}

void moeRouteForward(cudaStream_t stream, const MoeRouter &r,
                     const float *logits, const float *expertBias, float *probs,
                     int32_t *indices, void *scratch) {
  routeForwardKernel<<<blocksFor(r.tokens, 128), 128, 0, stream>>>(
      r, logits, expertBias, probs, indices);
  if (!(r.capacityFactor > 0))
    return;
  const int64_t slots = r.tokens * r.topk;
  char *p = static_cast<char *>(scratch);
  auto *offsets = reinterpret_cast<int32_t *>(p);
  p += pieceBytes(4 * (r.experts + 1));
  auto *position = reinterpret_cast<int32_t *>(p);
  p += pieceBytes(4 * slots);
  auto *slotAt = reinterpret_cast<int32_t *>(p);
  p += pieceBytes(4 * slots);
  auto *dropped = reinterpret_cast<int32_t *>(p);
  moeLayout(stream, slots, r.experts, indices, offsets, position, slotAt,
            nullptr, 0);
  markDroppedKernel<<<blocksFor(slots), kThreads, 0, stream>>>(
      slots, capacityOf(r), r.dropByPosition, indices, probs, offsets, position,
      slotAt, dropped);
  applyDropsKernel<<<blocksFor(slots), kThreads, 0, stream>>>(slots, dropped,
                                                              probs, indices);
}

void moeRouteBackward(cudaStream_t stream, const MoeRouter &r,
                      const float *logits, const float *expertBias,
                      const int32_t *indices, const float *dprobs,
                      float *dlogits) {
  routeBackwardKernel<<<blocksFor(r.tokens, 128), 128, 0, stream>>>(
      r, logits, expertBias, indices, dprobs, dlogits);
}

void moeTokensPerExpert(cudaStream_t stream, int64_t slots, int64_t experts,
                        const int32_t *indices, float *counts) {
  zeroFloatsKernel<<<blocksFor(experts, kThreads), kThreads, 0, stream>>>(
      experts, counts);
  if (slots > 0)
    tokensPerExpertKernel<<<blocksFor(slots, kThreads), kThreads, 0, stream>>>(
        slots, experts, indices, counts);
}

void moeAuxLossForward(cudaStream_t stream, const MoeRouter &r, double coeff,
                       const float *logits, float *loss, void *scratch) {
  AuxScratch s(r, scratch);
  auxStatistics(stream, r, logits, s);
  dim3 grid(static_cast<unsigned>(r.experts),
            static_cast<unsigned>(r.tokens / sequenceTokens(r)));
  auxPerExpertKernel<<<grid, kThreads, 0, stream>>>(r, logits, s.rowMax,
                                                    s.rowSum, s.perExpert);
  auxLossKernel<<<1, 1, 0, stream>>>(auxEntries(r), auxScale(r, coeff),
                                     s.perExpert, s.counts, loss);
}

void moeAuxLossBackward(cudaStream_t stream, const MoeRouter &r, double coeff,
                        const float *logits, const float *dloss, float *dlogits,
                        void *scratch) {
  AuxScratch s(r, scratch);
  auxStatistics(stream, r, logits, s);
  auxBackwardKernel<<<blocksFor(r.tokens, 128), 128, 0, stream>>>(
      r, auxScale(r, coeff), logits, dloss, s.counts, s.rowMax, s.rowSum,
      dlogits);
}

void moeZLossForward(cudaStream_t stream, int64_t tokens, int64_t experts,
                     double coeff, const float *logits, float *loss) {
  zLossKernel<<<1, kLayoutThreads, 0, stream>>>(tokens, experts, coeff, logits,
                                                loss);
}

void moeZLossBackward(cudaStream_t stream, int64_t tokens, int64_t experts,
                      double coeff, const float *logits, const float *dloss,
                      float *dlogits) {
  zLossBackwardKernel<<<blocksFor(tokens, 128), 128, 0, stream>>>(
      tokens, experts, coeff, logits, dloss, dlogits);
}

void moePermute(cudaStream_t stream, int64_t tokens, int64_t topk,
                int64_t hidden, int64_t experts, const int32_t *offsets,
                const int32_t *position, InElements x, const float *probs,
                OutElements rows) {
  const int64_t slots = tokens * topk;
  if (fourLanes(hidden, x.data, rows.data))
    permuteKernel<4><<<blocksFor(slots * hidden / 4), kThreads, 0, stream>>>(
        slots, topk, hidden / 4, experts, offsets, position, x, probs, rows);
  else
    permuteKernel<1><<<blocksFor(slots * hidden), kThreads, 0, stream>>>(
        slots, topk, hidden, experts, offsets, position, x, probs, rows);
}

void moeUnpermute(cudaStream_t stream, int64_t tokens, int64_t topk,
                  int64_t hidden, const int32_t *position, InElements rows,
                  const float *probs, OutElements y) {
  if (fourLanes(hidden, rows.data, y.data))
    unpermuteKernel<4><<<blocksFor(tokens * hidden / 4), kThreads, 0, stream>>>(
        tokens, topk, hidden / 4, position, rows, probs, y);
  else
    unpermuteKernel<1><<<blocksFor(tokens * hidden), kThreads, 0, stream>>>(
        tokens, topk, hidden, position, rows, probs, y);
}

void moeDispatchRows(cudaStream_t stream, int64_t slots, int64_t hidden,
                     int64_t ranks, int64_t experts, const int32_t *offsets,
                     bool combine, InElements from, OutElements to) {
  const int64_t perRank = experts / ranks;
  const int64_t rows = combine ? slots : ranks * slots;
  bool four = fourLanes(hidden, from.data, to.data);
  const int64_t width = four ? hidden / 4 : hidden;
  unsigned blocks = blocksFor(rows * width);
  if (combine && four)
    combineRowsKernel<4><<<blocks, kThreads, 0, stream>>>(
        slots, width, ranks, perRank, offsets, from, to);
  else if (combine)
    combineRowsKernel<1><<<blocks, kThreads, 0, stream>>>(
        slots, width, ranks, perRank, offsets, from, to);
  else if (four)
    dispatchRowsKernel<4><<<blocks, kThreads, 0, stream>>>(
        slots, width, ranks, perRank, offsets, from, to);
  else
    dispatchRowsKernel<1><<<blocks, kThreads, 0, stream>>>(
        slots, width, ranks, perRank, offsets, from, to);
}

void moeDispatchExperts(cudaStream_t stream, int64_t slots, int64_t ranks,
                        int64_t experts, const int32_t *offsets,
                        int32_t *destinationExperts) {
  dispatchExpertsKernel<<<blocksFor(ranks * slots), kThreads, 0, stream>>>(
      slots, ranks, experts / ranks, offsets, destinationExperts);
}

void moeProbsGrad(cudaStream_t stream, int64_t tokens, int64_t topk,
                  int64_t hidden, const int32_t *position, InElements x,
                  InElements rows, float *dprobs) {
  int64_t slots = tokens * topk;
  probsGradKernel<<<blocksFor(slots * kWarp), kThreads, 0, stream>>>(
      slots, topk, hidden, position, x, rows, dprobs);
}

} // namespace mtrt::cuda
