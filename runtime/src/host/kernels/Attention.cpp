// The attention core (causal, grouped-query, dropout) and rotary position embedding, forward and backward.
#include "core/Random.h"
#include "host/kernels/KernelSupport.h"

#include <cmath>
#include <limits>
#include <vector>

namespace mtrt::host {

namespace {

/// Index arithmetic and the dropout of one mt.attention call.
struct AttentionGeometry {
  const AttentionParams &p;
  int64_t group;   // query heads per key/value head
  double scale;
  uint64_t seedKey;
  uint32_t dropoutThreshold16;
  double dropoutScale;

  explicit AttentionGeometry(const AttentionParams &params)
      : p(params), group(params.headsQ / params.headsKv),
        scale(params.scale > 0
                  ? params.scale
                  : 1.0 / std::sqrt(static_cast<double>(params.headDim))),
        seedKey(random::seedKey(params.seed)),
        dropoutThreshold16(random::dropoutThreshold16(params.dropoutP)),
        dropoutScale(params.dropoutP > 0 ? 1.0 / (1.0 - params.dropoutP)
                                         : 1.0) {}

  bool hasDropout() const { return p.dropoutP > 0; }
  /// Keys that query i attends to: [0, keysFor(i)).
  int64_t keysFor(int64_t i) const { return p.causal ? i + 1 : p.seqK; }
  int64_t qOffset(int64_t b, int64_t i, int64_t h) const {
    return ((b * p.seqQ + i) * p.headsQ + h) * p.headDim;
  }
  int64_t kOffset(int64_t b, int64_t j, int64_t g) const {
    return ((b * p.seqK + j) * p.headsKv + g) * p.headDim;
  }
  int64_t vOffset(int64_t b, int64_t j, int64_t g) const {
    return ((b * p.seqK + j) * p.headsKv + g) * p.headDimV;
  }
  int64_t oOffset(int64_t b, int64_t i, int64_t h) const {
    return ((b * p.seqQ + i) * p.headsQ + h) * p.headDimV;
  }
  /// Where P[b, h, i, 0] keys its mask: its global sample's key and its
  /// position in the sample, ((global head) * seqQ + i) * seqK.
  struct MaskRow {
    uint64_t key, position;
  };
  MaskRow probabilityRow(int64_t b, int64_t h, int64_t i) const {
    uint64_t sample = p.firstSample + static_cast<uint64_t>(b + p.batchOffset);
    return {random::sampleKey(seedKey, sample),
            static_cast<uint64_t>(((h + p.headOffset) * p.seqQ + i) * p.seqK)};
  }
  bool keep(const MaskRow &row, int64_t j) const {
    return random::dropoutKeep(
        row.key, row.position + static_cast<uint64_t>(j), dropoutThreshold16);
  }
};

template <typename T> T dot(const T *a, const T *b, int64_t n) {
  T sum = T(0);
  for (int64_t d = 0; d < n; ++d)
    sum += a[d] * b[d];
  return sum;
}

/// scores[j] = scale * (q . k_j) for the keys query i sees.
template <typename T>
void scoreRow(const AttentionGeometry &geo, const T *q, const T *k, int64_t b,
              int64_t i, int64_t h, T *scores) {
  int64_t g = h / geo.group;
  const T *qi = q + geo.qOffset(b, i, h);
  T scale = static_cast<T>(geo.scale);
  for (int64_t j = 0, n = geo.keysFor(i); j < n; ++j)
    scores[j] = scale * dot(qi, k + geo.kOffset(b, j, g), geo.p.headDim);
}

} // namespace

template <typename T>
void attentionForward(ThreadPool &pool, const AttentionParams &params,
                      const T *q, const T *k, const T *v, T *out,
                      T *logsumexp) {
  AttentionGeometry geo(params);
  const int64_t dv = params.headDimV;
  int64_t work = params.seqK * (params.headDim + dv);
  pool.parallelFor(
      0, params.batch * params.headsQ * params.seqQ,
      [&](int64_t begin, int64_t end) {
        std::vector<T> probs(static_cast<size_t>(params.seqK));
        for (int64_t row = begin; row < end; ++row) {
          int64_t i = row % params.seqQ;
          int64_t h = (row / params.seqQ) % params.headsQ;
          int64_t b = row / (params.seqQ * params.headsQ);
          int64_t g = h / geo.group;
          int64_t n = geo.keysFor(i);
          scoreRow(geo, q, k, b, i, h, probs.data());
          T maxScore = -std::numeric_limits<T>::infinity();
          for (int64_t j = 0; j < n; ++j)
            maxScore = std::max(maxScore, probs[j]);
          double sum = 0;
          for (int64_t j = 0; j < n; ++j) {
            probs[j] = std::exp(probs[j] - maxScore);
            sum += probs[j];
          }
          logsumexp[row] = static_cast<T>(maxScore + std::log(sum));
          AttentionGeometry::MaskRow probabilityRow =
              geo.probabilityRow(b, h, i);
          for (int64_t j = 0; j < n; ++j) {
            double prob = probs[j] / sum;
            if (geo.hasDropout())
              prob = geo.keep(probabilityRow, j) ? prob * geo.dropoutScale : 0;
            probs[j] = static_cast<T>(prob);
          }
          T *oi = out + geo.oOffset(b, i, h);
          for (int64_t d = 0; d < dv; ++d)
            oi[d] = T(0);
          for (int64_t j = 0; j < n; ++j) {
            const T *vj = v + geo.vOffset(b, j, g);
            T prob = probs[j];
            for (int64_t d = 0; d < dv; ++d)
              oi[d] += prob * vj[d];
          }
        }
      },
      detail::rowGrain(work));
}

// Each (batch, key/value head) belongs to one thread: it owns dk and dv of
// that head and dq of the query heads of its group, and walks (query head,
// query) in increasing order.
template <typename T>
void attentionBackward(ThreadPool &pool, const AttentionParams &params,
                       const T *q, const T *k, const T *v,
                       const T *logsumexp, const T *dout, T *dq, T *dk,
                       T *dv) {
  AttentionGeometry geo(params);
  const int64_t d = params.headDim, dV = params.headDimV;
  const T scale = static_cast<T>(geo.scale);
  const T dropoutScale = static_cast<T>(geo.dropoutScale);
  pool.parallelFor(
      0, params.batch * params.headsKv,
      [&](int64_t begin, int64_t end) {
        std::vector<T> probs(static_cast<size_t>(params.seqK));
        std::vector<T> dprobs(static_cast<size_t>(params.seqK));
        std::vector<T> dqRow(static_cast<size_t>(d));
        for (int64_t unit = begin; unit < end; ++unit) {
          int64_t b = unit / params.headsKv;
          int64_t g = unit % params.headsKv;
          for (int64_t j = 0; j < params.seqK; ++j) {
            if (dk)
              std::fill_n(dk + geo.kOffset(b, j, g), d, T(0));
            if (dv)
              std::fill_n(dv + geo.vOffset(b, j, g), dV, T(0));
          }
          for (int64_t h = g * geo.group; h < (g + 1) * geo.group; ++h) {
            for (int64_t i = 0; i < params.seqQ; ++i) {
              int64_t n = geo.keysFor(i);
              int64_t row = (b * params.headsQ + h) * params.seqQ + i;
              AttentionGeometry::MaskRow probabilityRow =
                  geo.probabilityRow(b, h, i);
              const T *qi = q + geo.qOffset(b, i, h);
              const T *doi = dout + geo.oOffset(b, i, h);
              scoreRow(geo, q, k, b, i, h, probs.data());
              double rowDot = 0;
              for (int64_t j = 0; j < n; ++j) {
                T prob = std::exp(probs[j] - logsumexp[row]);
                // Gradient through out = dropout(P) V, then through dropout.
                T dprob = dot(doi, v + geo.vOffset(b, j, g), dV);
                T dropped = prob;
                if (geo.hasDropout()) {
                  bool kept = geo.keep(probabilityRow, j);
                  dropped = kept ? prob * dropoutScale : T(0);
                  dprob = kept ? dprob * dropoutScale : T(0);
                }
                if (dv) {
                  T *dvj = dv + geo.vOffset(b, j, g);
                  for (int64_t e = 0; e < dV; ++e)
                    dvj[e] += dropped * doi[e];
                }
                probs[j] = prob;
                dprobs[j] = dprob;
                rowDot += static_cast<double>(prob) * dprob;
              }
              // Through the softmax: dS = P (dP - sum(P dP)).
              T rowDotT = static_cast<T>(rowDot);
              std::fill(dqRow.begin(), dqRow.end(), T(0));
              for (int64_t j = 0; j < n; ++j) {
                T dscore = probs[j] * (dprobs[j] - rowDotT);
                const T *kj = k + geo.kOffset(b, j, g);
                for (int64_t e = 0; e < d; ++e)
                  dqRow[e] += dscore * kj[e];
                if (dk) {
                  T *dkj = dk + geo.kOffset(b, j, g);
                  T scaled = scale * dscore;
                  for (int64_t e = 0; e < d; ++e)
                    dkj[e] += scaled * qi[e];
                }
              }
              if (dq) {
                T *dqi = dq + geo.qOffset(b, i, h);
                for (int64_t e = 0; e < d; ++e)
                  dqi[e] = scale * dqRow[e];
              }
            }
          }
        }
      },
      1);
}

namespace {

/// cos and sin of p_s * f_i for s < seq, i < rotaryDim / 2 (f_i the inverse
/// frequency, p_s = positions[s], or s without positions), times the
/// attention factor, computed in double and rounded to T, as
/// [seq][rotaryDim / 2].
template <typename T>
void ropeTables(int64_t seq, int64_t rotaryDim,
                const RopeFrequencies &frequencies, const int64_t *positions,
                std::vector<T> &cosines, std::vector<T> &sines) {
  int64_t half = rotaryDim / 2;
  cosines.resize(static_cast<size_t>(seq * half));
  sines.resize(static_cast<size_t>(seq * half));
  for (int64_t i = 0; i < half; ++i) {
    double inverseFrequency = ropeInverseFrequency(frequencies, i, rotaryDim);
    for (int64_t s = 0; s < seq; ++s) {
      double angle =
          static_cast<double>(positions ? positions[s] : s) * inverseFrequency;
      cosines[s * half + i] =
          static_cast<T>(frequencies.attentionFactor * std::cos(angle));
      sines[s * half + i] =
          static_cast<T>(frequencies.attentionFactor * std::sin(angle));
    }
  }
}

/// Rotates every head by +angle (direction = 1) or -angle (direction = -1).
template <typename T>
void rotate(ThreadPool &pool, int64_t batch, int64_t seq, int64_t heads,
            int64_t headDim, int64_t rotaryDim,
            const RopeFrequencies &frequencies, const T *x, T *y,
            T direction, const int64_t *positions) {
  std::vector<T> cosines, sines;
  ropeTables(seq, rotaryDim, frequencies, positions, cosines, sines);
  int64_t half = rotaryDim / 2;
  pool.parallelFor(
      0, batch * seq * heads,
      [&](int64_t begin, int64_t end) {
        for (int64_t row = begin; row < end; ++row) {
          int64_t s = (row / heads) % seq;
          const T *xr = x + row * headDim;
          T *yr = y + row * headDim;
          const T *c = cosines.data() + s * half;
          const T *sn = sines.data() + s * half;
          for (int64_t i = 0; i < half; ++i) {
            T x1 = xr[i], x2 = xr[i + half];
            T sine = direction * sn[i];
            yr[i] = x1 * c[i] - x2 * sine;
            yr[i + half] = x2 * c[i] + x1 * sine;
          }
          for (int64_t i = rotaryDim; i < headDim; ++i)
            yr[i] = xr[i];
        }
      },
      detail::rowGrain(headDim));
}

} // namespace

template <typename T>
void ropeForward(ThreadPool &pool, int64_t batch, int64_t seq, int64_t heads,
                 int64_t headDim, int64_t rotaryDim,
                 const RopeFrequencies &frequencies, const T *x, T *y,
                 const int64_t *positions) {
  rotate(pool, batch, seq, heads, headDim, rotaryDim, frequencies, x, y,
         T(1), positions);
}

template <typename T>
void ropeBackward(ThreadPool &pool, int64_t batch, int64_t seq, int64_t heads,
                  int64_t headDim, int64_t rotaryDim,
                  const RopeFrequencies &frequencies, const T *dy, T *dx,
                  const int64_t *positions) {
  rotate(pool, batch, seq, heads, headDim, rotaryDim, frequencies, dy, dx,
         T(-1), positions);
}

#define MTRT_INSTANTIATE(T)                                                    \
  template void attentionForward<T>(ThreadPool &, const AttentionParams &,     \
                                    const T *, const T *, const T *, T *,      \
                                    T *);                                      \
  template void attentionBackward<T>(ThreadPool &, const AttentionParams &,    \
                                     const T *, const T *, const T *,          \
                                     const T *, const T *, T *, T *, T *);     \
  template void ropeForward<T>(ThreadPool &, int64_t, int64_t, int64_t,        \
                               int64_t, int64_t, const RopeFrequencies &,     \
                               const T *, T *, const int64_t *);               \
  template void ropeBackward<T>(ThreadPool &, int64_t, int64_t, int64_t,       \
                                int64_t, int64_t, const RopeFrequencies &,     \
                                const T *, T *, const int64_t *);
MTRT_INSTANTIATE_FLOAT_TYPES(MTRT_INSTANTIATE)
#undef MTRT_INSTANTIATE

} // namespace mtrt::host
