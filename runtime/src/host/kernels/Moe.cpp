// The mixture-of-experts layer's reference kernels: routing, its auxiliary
// losses, token permutation and the experts' grouped GEMMs (docs/MoE.md).
#include "host/ThreadPool.h"
#include "host/kernels/KernelSupport.h"
#include "host/kernels/Kernels.h"

#include <algorithm>
#include <cinttypes>
#include <cmath>
#include <cstdio>
#include <numeric>

namespace mtrt::host {

namespace {

/// Sigmoid weights are divided by their sum plus this, as Megatron-LM's.
constexpr double kSigmoidEpsilon = 1e-20;

double sigmoid(double x) { return 1.0 / (1.0 + std::exp(-x)); }

/// The top-k of `chosen`'s experts: the highest logits first, ties to the
/// lower expert (what torch.topk returns for distinct values, made total).
template <typename T>
void keepTopExperts(const T *row, int64_t topk, std::vector<int32_t> &chosen) {
  std::partial_sort(chosen.begin(), chosen.begin() + topk, chosen.end(),
                    [&](int32_t a, int32_t b) {
                      return row[a] > row[b] || (row[a] == row[b] && a < b);
                    });
  chosen.resize(static_cast<size_t>(topk));
}

/// A token's top-k experts among all `experts`.
template <typename T>
void topExperts(const T *row, int64_t experts, int64_t topk,
                std::vector<int32_t> &chosen) {
  chosen.resize(static_cast<size_t>(experts));
  std::iota(chosen.begin(), chosen.end(), 0);
  keepTopExperts(row, topk, chosen);
}

/// The softmax of a row of logits, in double.
template <typename T>
void softmaxRow(const T *row, int64_t n, std::vector<double> &out) {
  double max = static_cast<double>(*std::max_element(row, row + n));
  double sum = 0;
  out.resize(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i)
    sum += out[i] = std::exp(static_cast<double>(row[i]) - max);
  for (double &v : out)
    v /= sum;
}

/// A token's routed experts: its top-k by logit, or with group-limited
/// routing (Megatron-LM's group_limited_topk) the top-k among the experts
/// of its groupTopk best groups (ties: the lower group), a group scored by
/// the sum of its topk / groupTopk highest scores: the logits where the
/// weights are the softmax over the chosen, else the softmax over all
/// experts or the sigmoids. With an expert bias, both take each sigmoid
/// plus its expert's bias instead (Megatron-LM's scores_for_routing).
template <typename T>
void routedExperts(const MoeRouter &r, const T *row,
                   std::vector<int32_t> &chosen, std::vector<double> &scores) {
  if (r.expertBias) {
    scores.resize(static_cast<size_t>(r.experts));
    for (int64_t j = 0; j < r.experts; ++j)
      scores[j] = sigmoid(static_cast<double>(row[j])) + r.expertBias[j];
    MoeRouter unbiased = r;
    unbiased.expertBias = nullptr;
    unbiased.sigmoid = false;
    unbiased.normalize = true; // group scores from `scores` as they are
    std::vector<double> selection = scores;
    routedExperts(unbiased, selection.data(), chosen, scores);
    return;
  }
  if (r.groupTopk == 0) {
    topExperts(row, r.experts, r.topk, chosen);
    return;
  }
  const int64_t size = r.experts / r.numGroups, best = r.topk / r.groupTopk;
  if (r.sigmoid || r.normalize) {
    scores.resize(static_cast<size_t>(r.experts));
    for (int64_t j = 0; j < r.experts; ++j)
      scores[j] = r.sigmoid ? sigmoid(static_cast<double>(row[j]))
                            : static_cast<double>(row[j]);
  } else {
    softmaxRow(row, r.experts, scores);
  }
  std::vector<double> groupScores(static_cast<size_t>(r.numGroups));
  for (int64_t g = 0; g < r.numGroups; ++g) {
    auto first = scores.begin() + g * size;
    std::vector<double> group(first, first + size);
    std::partial_sort(group.begin(), group.begin() + best, group.end(),
                      std::greater<double>());
    groupScores[g] = std::accumulate(group.begin(), group.begin() + best, 0.0);
  }
  std::vector<int32_t> keptGroups;
  topExperts(groupScores.data(), r.numGroups, r.groupTopk, keptGroups);
  // The kept groups' experts by logit, as the top-k over the scores with
  // the other groups masked to -inf.
  chosen.clear();
  for (int32_t g : keptGroups)
    for (int64_t j = g * size; j < (g + 1) * size; ++j)
      chosen.push_back(static_cast<int32_t>(j));
  keepTopExperts(row, r.topk, chosen);
}

/// A token's routing weights for its chosen experts, before dropping.
template <typename T>
void routeWeights(const MoeRouter &r, const T *row,
                  const std::vector<int32_t> &chosen,
                  std::vector<double> &weights, std::vector<double> &scratch) {
  size_t k = chosen.size();
  weights.resize(k);
  if (r.sigmoid) {
    double sum = 0;
    for (size_t i = 0; i < k; ++i)
      sum += weights[i] = sigmoid(static_cast<double>(row[chosen[i]]));
    if (r.normalize)
      for (double &w : weights)
        w /= sum + kSigmoidEpsilon;
    return;
  }
  if (r.normalize) { // the softmax over the chosen logits
    double max = static_cast<double>(row[chosen[0]]), sum = 0;
    for (size_t i = 0; i < k; ++i)
      sum += weights[i] = std::exp(static_cast<double>(row[chosen[i]]) - max);
    for (double &w : weights)
      w /= sum;
    return;
  }
  softmaxRow(row, r.experts, scratch);
  for (size_t i = 0; i < k; ++i)
    weights[i] = scratch[chosen[i]];
}

} // namespace

template <typename T>
void moeRouteForward(ThreadPool &pool, const MoeRouter &r, const T *logits,
                     T *probs, int32_t *indices) {
  const int64_t k = r.topk;
  pool.parallelFor(
      0, r.tokens,
      [&](int64_t begin, int64_t end) {
        std::vector<int32_t> chosen;
        std::vector<double> weights, scratch;
        for (int64_t t = begin; t < end; ++t) {
          const T *row = logits + t * r.experts;
          routedExperts(r, row, chosen, scratch);
          routeWeights(r, row, chosen, weights, scratch);
          for (int64_t i = 0; i < k; ++i) {
            indices[t * k + i] = chosen[i];
            probs[t * k + i] = static_cast<T>(weights[i]);
          }
        }
      },
      detail::rowGrain(r.experts));
  if (!(r.capacityFactor > 0))
    return;
  // Megatron-LM's get_capacity over the tokens * topk assignments.
  const int64_t capacity = static_cast<int64_t>(
      std::ceil(static_cast<double>(r.tokens * k) /
                static_cast<double>(r.experts) * r.capacityFactor));
  std::vector<std::vector<int64_t>> slots(static_cast<size_t>(r.experts));
  for (int64_t s = 0; s < r.tokens * k; ++s)
    slots[indices[s]].push_back(s); // in token order
  for (std::vector<int64_t> &expert : slots) {
    if (static_cast<int64_t>(expert.size()) <= capacity)
      continue;
    if (!r.dropByPosition)
      std::stable_sort(expert.begin(), expert.end(), [&](int64_t a, int64_t b) {
        return probs[a] > probs[b];
      });
    for (size_t i = static_cast<size_t>(capacity); i < expert.size(); ++i) {
      indices[expert[i]] = -1;
      probs[expert[i]] = T(0);
    }
  }
}

template <typename T>
void moeRouteBackward(ThreadPool &pool, const MoeRouter &r, const T *logits,
                      const int32_t *indices, const T *dprobs, T *dlogits) {
  const int64_t k = r.topk, e = r.experts;
  pool.parallelFor(
      0, r.tokens,
      [&](int64_t begin, int64_t end) {
        std::vector<int32_t> chosen;
        std::vector<double> weights, scratch, g(static_cast<size_t>(k));
        for (int64_t t = begin; t < end; ++t) {
          const T *row = logits + t * e;
          T *drow = dlogits + t * e;
          routedExperts(r, row, chosen, scratch);
          routeWeights(r, row, chosen, weights, scratch);
          for (int64_t i = 0; i < k; ++i)
            g[i] = indices[t * k + i] >= 0
                       ? static_cast<double>(dprobs[t * k + i])
                       : 0.0;
          std::vector<double> d(static_cast<size_t>(e), 0.0);
          if (r.sigmoid) {
            std::vector<double> sig(static_cast<size_t>(k));
            double sum = 0, weighted = 0;
            for (int64_t i = 0; i < k; ++i) {
              sig[i] = sigmoid(static_cast<double>(row[chosen[i]]));
              sum += sig[i];
              weighted += g[i] * sig[i];
            }
            double denom = sum + kSigmoidEpsilon;
            for (int64_t i = 0; i < k; ++i) {
              double dsig = r.normalize
                                ? g[i] / denom - weighted / (denom * denom)
                                : g[i];
              d[chosen[i]] = dsig * sig[i] * (1.0 - sig[i]);
            }
          } else if (r.normalize) {
            double dot = 0;
            for (int64_t i = 0; i < k; ++i)
              dot += g[i] * weights[i];
            for (int64_t i = 0; i < k; ++i)
              d[chosen[i]] = weights[i] * (g[i] - dot);
          } else {
            // The chosen entries of the softmax over all experts.
            double dot = 0;
            std::vector<double> upstream(static_cast<size_t>(e), 0.0);
            for (int64_t i = 0; i < k; ++i) {
              upstream[chosen[i]] = g[i];
              dot += g[i] * scratch[chosen[i]];
            }
            for (int64_t j = 0; j < e; ++j)
              d[j] = scratch[j] * (upstream[j] - dot);
          }
          for (int64_t j = 0; j < e; ++j)
            drow[j] = static_cast<T>(d[j]);
        }
      },
      detail::rowGrain(e));
}

namespace {

/// The aux loss's per-token scores (softmax, or sigmoids over their sum)
/// and the tokens per expert of the top-k before dropping.
template <typename T>
void auxScores(const MoeRouter &r, const T *row, std::vector<double> &scores) {
  if (!r.sigmoid) {
    softmaxRow(row, r.experts, scores);
    return;
  }
  scores.resize(static_cast<size_t>(r.experts));
  double sum = 0;
  for (int64_t j = 0; j < r.experts; ++j)
    sum += scores[j] = sigmoid(static_cast<double>(row[j]));
  for (double &s : scores)
    s /= sum + kSigmoidEpsilon;
}

/// The aux loss's sequences: the sequence-level loss's, or all the tokens
/// as one.
int64_t sequenceTokens(const MoeRouter &r) {
  return r.sequenceLength > 0 ? r.sequenceLength : r.tokens;
}

/// Per sequence, the tokens per expert of the top-k before dropping:
/// [sequences, experts].
template <typename T>
std::vector<double> tokensPerExpert(const MoeRouter &r, const T *logits) {
  const int64_t s = sequenceTokens(r);
  std::vector<double> counts(static_cast<size_t>(r.tokens / s * r.experts),
                             0.0);
  std::vector<int32_t> chosen;
  for (int64_t t = 0; t < r.tokens; ++t) {
    topExperts(logits + t * r.experts, r.experts, r.topk, chosen);
    for (int32_t e : chosen)
      counts[t / s * r.experts + e] += 1.0;
  }
  return counts;
}

/// coeff * E / (topk * S * S) / (T / S), the aux loss's scale: a
/// sequence's switch loss over its S tokens, averaged over the sequences.
double auxScale(const MoeRouter &r, double coeff) {
  const int64_t s = sequenceTokens(r);
  const double length = static_cast<double>(s);
  return coeff * static_cast<double>(r.experts) /
         (static_cast<double>(r.topk) * length * length) /
         static_cast<double>(r.tokens / s);
}

} // namespace

template <typename T>
void moeAuxLossForward(ThreadPool &, const MoeRouter &r, double coeff,
                       const T *logits, T *loss) {
  std::vector<double> counts = tokensPerExpert(r, logits);
  std::vector<double> perExpert(counts.size(), 0.0), scores;
  const int64_t s = sequenceTokens(r);
  for (int64_t t = 0; t < r.tokens; ++t) {
    auxScores(r, logits + t * r.experts, scores);
    for (int64_t j = 0; j < r.experts; ++j)
      perExpert[t / s * r.experts + j] += scores[j];
  }
  double sum = 0;
  for (size_t j = 0; j < counts.size(); ++j)
    sum += perExpert[j] * counts[j];
  loss[0] = static_cast<T>(sum * auxScale(r, coeff));
}

template <typename T>
void moeAuxLossBackward(ThreadPool &pool, const MoeRouter &r, double coeff,
                        const T *logits, const T *dloss, T *dlogits) {
  std::vector<double> allCounts = tokensPerExpert(r, logits);
  const double c = static_cast<double>(dloss[0]) * auxScale(r, coeff);
  const int64_t e = r.experts, s = sequenceTokens(r);
  pool.parallelFor(
      0, r.tokens,
      [&](int64_t begin, int64_t end) {
        std::vector<double> scores;
        for (int64_t t = begin; t < end; ++t) {
          const T *row = logits + t * e;
          T *drow = dlogits + t * e;
          // The token's sequence's counts.
          const double *counts = allCounts.data() + t / s * e;
          auxScores(r, row, scores);
          // d loss / d score[j] = c * counts[j].
          if (!r.sigmoid) {
            double dot = 0;
            for (int64_t j = 0; j < e; ++j)
              dot += scores[j] * c * counts[j];
            for (int64_t j = 0; j < e; ++j)
              drow[j] = static_cast<T>(scores[j] * (c * counts[j] - dot));
            continue;
          }
          double sum = 0, weighted = 0;
          std::vector<double> sig(static_cast<size_t>(e));
          for (int64_t j = 0; j < e; ++j) {
            sig[j] = sigmoid(static_cast<double>(row[j]));
            sum += sig[j];
            weighted += c * counts[j] * sig[j];
          }
          double denom = sum + kSigmoidEpsilon;
          for (int64_t j = 0; j < e; ++j) {
            double dsig = c * counts[j] / denom - weighted / (denom * denom);
            drow[j] = static_cast<T>(dsig * sig[j] * (1.0 - sig[j]));
          }
        }
      },
      detail::rowGrain(e));
}

namespace {

template <typename T> double logSumExp(const T *row, int64_t n) {
  double max = static_cast<double>(*std::max_element(row, row + n)), sum = 0;
  for (int64_t i = 0; i < n; ++i)
    sum += std::exp(static_cast<double>(row[i]) - max);
  return max + std::log(sum);
}

} // namespace

template <typename T>
void moeZLossForward(ThreadPool &, int64_t tokens, int64_t experts,
                     double coeff, const T *logits, T *loss) {
  double sum = 0;
  for (int64_t t = 0; t < tokens; ++t) {
    double lse = logSumExp(logits + t * experts, experts);
    sum += lse * lse;
  }
  loss[0] = static_cast<T>(coeff * sum / static_cast<double>(tokens));
}

template <typename T>
void moeZLossBackward(ThreadPool &pool, int64_t tokens, int64_t experts,
                      double coeff, const T *logits, const T *dloss,
                      T *dlogits) {
  const double c =
      static_cast<double>(dloss[0]) * coeff * 2.0 / static_cast<double>(tokens);
  pool.parallelFor(
      0, tokens,
      [&](int64_t begin, int64_t end) {
        std::vector<double> p;
        for (int64_t t = begin; t < end; ++t) {
          const T *row = logits + t * experts;
          double lse = logSumExp(row, experts);
          softmaxRow(row, experts, p);
          for (int64_t j = 0; j < experts; ++j)
            dlogits[t * experts + j] = static_cast<T>(c * lse * p[j]);
        }
      },
      detail::rowGrain(experts));
}

KernelStatus moeLayout(int64_t tokens, int64_t topk, int64_t experts,
                       const int32_t *indices, MoeLayout &layout) {
  const int64_t slots = tokens * topk;
  int64_t limit = experts;
  if (limit < 0) {
    limit = 0;
    for (int64_t s = 0; s < slots; ++s)
      limit = std::max<int64_t>(limit, int64_t(indices[s]) + 1);
  }
  for (int64_t s = 0; s < slots; ++s) {
    int64_t e = indices[s];
    if (e >= -1 && e < limit)
      continue;
    char message[256];
    std::snprintf(message, sizeof(message),
                  "routing index %" PRId64 " of token %" PRId64
                  ", slot %" PRId64 " is outside the %" PRId64
                  " experts (valid indices are 0 to %" PRId64
                  ", or -1 for a dropped slot)",
                  e, s / topk, s % topk, limit, limit - 1);
    return KernelStatus::error(message);
  }
  layout.offsets.assign(static_cast<size_t>(limit + 1), 0);
  for (int64_t s = 0; s < slots; ++s)
    if (indices[s] >= 0)
      ++layout.offsets[indices[s] + 1];
  for (int64_t e = 0; e < limit; ++e)
    layout.offsets[e + 1] += layout.offsets[e];
  std::vector<int64_t> next(layout.offsets.begin(), layout.offsets.end() - 1);
  layout.position.assign(static_cast<size_t>(slots), -1);
  for (int64_t s = 0; s < slots; ++s) // token order within each expert
    if (indices[s] >= 0)
      layout.position[s] = next[indices[s]]++;
  return KernelStatus::success();
}

template <typename T>
void moePermute(ThreadPool &pool, int64_t tokens, int64_t topk, int64_t hidden,
                const MoeLayout &layout, const T *x, const T *probs, T *rows) {
  const int64_t kept = layout.offsets.back();
  std::fill(rows + kept * hidden, rows + tokens * topk * hidden, T(0));
  pool.parallelFor(
      0, tokens,
      [&](int64_t begin, int64_t end) {
        for (int64_t t = begin; t < end; ++t)
          for (int64_t k = 0; k < topk; ++k) {
            int64_t p = layout.position[t * topk + k];
            if (p < 0)
              continue;
            T w = probs ? probs[t * topk + k] : T(1);
            const T *src = x + t * hidden;
            T *dst = rows + p * hidden;
            for (int64_t h = 0; h < hidden; ++h)
              dst[h] = probs ? w * src[h] : src[h];
          }
      },
      detail::rowGrain(hidden * topk));
}

template <typename T>
void moeUnpermute(ThreadPool &pool, int64_t tokens, int64_t topk,
                  int64_t hidden, const MoeLayout &layout, const T *rows,
                  const T *probs, T *y) {
  pool.parallelFor(
      0, tokens,
      [&](int64_t begin, int64_t end) {
        for (int64_t t = begin; t < end; ++t) {
          T *dst = y + t * hidden;
          std::fill(dst, dst + hidden, T(0));
          for (int64_t k = 0; k < topk; ++k) {
            int64_t p = layout.position[t * topk + k];
            if (p < 0)
              continue;
            const T *src = rows + p * hidden;
            if (probs) {
              T w = probs[t * topk + k];
              for (int64_t h = 0; h < hidden; ++h)
                dst[h] += w * src[h];
            } else {
              for (int64_t h = 0; h < hidden; ++h)
                dst[h] += src[h];
            }
          }
        }
      },
      detail::rowGrain(hidden * topk));
}

template <typename T>
void moeProbsGrad(ThreadPool &pool, int64_t tokens, int64_t topk,
                  int64_t hidden, const MoeLayout &layout, const T *x,
                  const T *rows, T *dprobs) {
  pool.parallelFor(
      0, tokens,
      [&](int64_t begin, int64_t end) {
        for (int64_t t = begin; t < end; ++t)
          for (int64_t k = 0; k < topk; ++k) {
            int64_t p = layout.position[t * topk + k];
            T dot = T(0);
            if (p >= 0)
              for (int64_t h = 0; h < hidden; ++h)
                dot += x[t * hidden + h] * rows[p * hidden + h];
            dprobs[t * topk + k] = dot;
          }
      },
      detail::rowGrain(hidden * topk));
}

template <typename T>
void moeGroupedLinear(ThreadPool &pool, int64_t rows, int64_t in, int64_t out,
                      const MoeLayout &layout, const T *x, const T *weight,
                      bool transposeWeight, T *y) {
  const int64_t experts = static_cast<int64_t>(layout.offsets.size()) - 1;
  for (int64_t e = 0; e < experts; ++e) {
    int64_t first = layout.offsets[e], count = layout.offsets[e + 1] - first;
    if (count > 0)
      gemm<T>(pool, 1, count, out, in, x + first * in, false,
              weight + e * in * out, transposeWeight, y + first * out, false);
  }
  std::fill(y + layout.offsets.back() * out, y + rows * out, T(0));
}

template <typename T>
void moeGroupedLinearWeightGrad(ThreadPool &pool, int64_t in, int64_t out,
                                const MoeLayout &layout, const T *x,
                                const T *dy, bool transposeWeight, T *dweight) {
  const int64_t experts = static_cast<int64_t>(layout.offsets.size()) - 1;
  for (int64_t e = 0; e < experts; ++e) {
    int64_t first = layout.offsets[e], count = layout.offsets[e + 1] - first;
    T *dw = dweight + e * in * out;
    if (count == 0) {
      std::fill(dw, dw + in * out, T(0));
      continue;
    }
    const T *xe = x + first * in, *dye = dy + first * out;
    if (transposeWeight) // [out, in] = dy_e^T x_e
      gemm<T>(pool, 1, out, in, count, dye, true, xe, false, dw, false);
    else // [in, out] = x_e^T dy_e
      gemm<T>(pool, 1, in, out, count, xe, true, dye, false, dw, false);
  }
}

template <typename T>
void moeDispatchBlocks(int64_t slots, int64_t hidden, int64_t ranks,
                       const MoeLayout &layout, bool combine, const T *from,
                       T *to) {
  const int64_t experts = static_cast<int64_t>(layout.offsets.size()) - 1;
  const int64_t perRank = experts / ranks;
  const int64_t kept = layout.offsets.back();
  if (combine)
    std::fill(to + kept * hidden, to + slots * hidden, T(0));
  for (int64_t d = 0; d < ranks; ++d) {
    int64_t first = layout.offsets[d * perRank];
    int64_t count = layout.offsets[(d + 1) * perRank] - first;
    const int64_t block = d * slots;
    if (combine) {
      std::copy(from + block * hidden, from + (block + count) * hidden,
                to + first * hidden);
    } else {
      std::copy(from + first * hidden, from + (first + count) * hidden,
                to + block * hidden);
      std::fill(to + (block + count) * hidden, to + (block + slots) * hidden,
                T(0));
    }
  }
}

void moeDispatchExperts(int64_t slots, int64_t ranks, const MoeLayout &layout,
                        int32_t *experts) {
  const int64_t all = static_cast<int64_t>(layout.offsets.size()) - 1;
  const int64_t perRank = all / ranks;
  std::fill(experts, experts + ranks * slots, int32_t(-1));
  for (int64_t d = 0; d < ranks; ++d)
    for (int64_t j = 0; j < perRank; ++j) {
      int64_t e = d * perRank + j;
      int64_t rows = layout.offsets[e + 1] - layout.offsets[e];
      int64_t at = d * slots + layout.offsets[e] - layout.offsets[d * perRank];
      std::fill(experts + at, experts + at + rows, static_cast<int32_t>(j));
    }
}

#define MTRT_INSTANTIATE(T)                                                    \
  template void moeDispatchBlocks<T>(int64_t, int64_t, int64_t,                \
                                     const MoeLayout &, bool, const T *, T *); \
  template void moeRouteForward<T>(ThreadPool &, const MoeRouter &, const T *, \
                                   T *, int32_t *);                            \
  template void moeRouteBackward<T>(ThreadPool &, const MoeRouter &,           \
                                    const T *, const int32_t *, const T *,     \
                                    T *);                                      \
  template void moeAuxLossForward<T>(ThreadPool &, const MoeRouter &, double,  \
                                     const T *, T *);                          \
  template void moeAuxLossBackward<T>(ThreadPool &, const MoeRouter &, double, \
                                      const T *, const T *, T *);              \
  template void moeZLossForward<T>(ThreadPool &, int64_t, int64_t, double,     \
                                   const T *, T *);                            \
  template void moeZLossBackward<T>(ThreadPool &, int64_t, int64_t, double,    \
                                    const T *, const T *, T *);                \
  template void moePermute<T>(ThreadPool &, int64_t, int64_t, int64_t,         \
                              const MoeLayout &, const T *, const T *, T *);   \
  template void moeUnpermute<T>(ThreadPool &, int64_t, int64_t, int64_t,       \
                                const MoeLayout &, const T *, const T *, T *); \
  template void moeProbsGrad<T>(ThreadPool &, int64_t, int64_t, int64_t,       \
                                const MoeLayout &, const T *, const T *, T *); \
  template void moeGroupedLinear<T>(ThreadPool &, int64_t, int64_t, int64_t,   \
                                    const MoeLayout &, const T *, const T *,   \
                                    bool, T *);                                \
  template void moeGroupedLinearWeightGrad<T>(ThreadPool &, int64_t, int64_t,  \
                                              const MoeLayout &, const T *,    \
                                              const T *, bool, T *);
MTRT_INSTANTIATE_FLOAT_TYPES(MTRT_INSTANTIATE)
#undef MTRT_INSTANTIATE

} // namespace mtrt::host
