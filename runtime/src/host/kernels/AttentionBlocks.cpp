// Ring attention's pieces on the host: block attention at global positions
// (causal and dropout by position), the online-softmax merge, and the block
// backward from the whole row's logsumexp.
#include "core/Random.h"
#include "host/kernels/KernelSupport.h"

#include <cmath>
#include <limits>
#include <vector>

namespace mtrt::host {

namespace {

/// Index arithmetic, mask and dropout of one block.
struct BlockGeometry {
  const AttentionParams &p;
  const AttentionBlock &block;
  int64_t group; // query heads per key/value head
  double scale;
  uint64_t seedKey;
  uint32_t dropoutThreshold16;
  double dropoutScale;

  BlockGeometry(const AttentionParams &params, const AttentionBlock &block)
      : p(params), block(block), group(params.headsQ / params.headsKv),
        scale(params.scale > 0
                  ? params.scale
                  : 1.0 / std::sqrt(static_cast<double>(params.headDim))),
        seedKey(random::seedKey(params.seed)),
        dropoutThreshold16(random::dropoutThreshold16(params.dropoutP)),
        dropoutScale(params.dropoutP > 0 ? 1.0 / (1.0 - params.dropoutP)
                                         : 1.0) {}

  bool hasDropout() const { return p.dropoutP > 0; }
  bool visible(int64_t i, int64_t j) const {
    return !p.causal || block.keyPositions[j] <= block.queryPositions[i];
  }
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
  int64_t rowOffset(int64_t b, int64_t h, int64_t i) const {
    return (b * p.headsQ + h) * p.seqQ + i;
  }
  /// The key of P[b, h, i, *]'s sample and the position of its element 0
  /// in the sample's global probabilities.
  struct MaskRow {
    uint64_t key, position;
  };
  MaskRow probabilityRow(int64_t b, int64_t h, int64_t i) const {
    uint64_t sample = p.firstSample + static_cast<uint64_t>(b + p.batchOffset);
    return {random::sampleKey(seedKey, sample),
            static_cast<uint64_t>(((h + p.headOffset) * block.globalSeq +
                                   block.queryPositions[i]) *
                                  block.globalSeq)};
  }
  bool keep(const MaskRow &row, int64_t j) const {
    return random::dropoutKeep(
        row.key, row.position + static_cast<uint64_t>(block.keyPositions[j]),
        dropoutThreshold16);
  }
};

template <typename T> T dot(const T *a, const T *b, int64_t n) {
  T sum = T(0);
  for (int64_t d = 0; d < n; ++d)
    sum += a[d] * b[d];
  return sum;
}

} // namespace

void contextParallelPositions(int64_t rank, int64_t size, int64_t seq,
                              int64_t *positions) {
  int64_t chunk = seq / (2 * size);
  for (int64_t i = 0; i < chunk; ++i) {
    positions[i] = rank * chunk + i;
    positions[chunk + i] = (2 * size - 1 - rank) * chunk + i;
  }
}

template <typename T>
void attentionBlockForward(ThreadPool &pool, const AttentionParams &params,
                           const AttentionBlock &block, const T *q, const T *k,
                           const T *v, T *out, T *logsumexp) {
  BlockGeometry geo(params, block);
  const int64_t dv = params.headDimV;
  const T scale = static_cast<T>(geo.scale);
  pool.parallelFor(
      0, params.batch * params.headsQ * params.seqQ,
      [&](int64_t begin, int64_t end) {
        std::vector<T> scores(static_cast<size_t>(params.seqK));
        for (int64_t row = begin; row < end; ++row) {
          int64_t i = row % params.seqQ;
          int64_t h = (row / params.seqQ) % params.headsQ;
          int64_t b = row / (params.seqQ * params.headsQ);
          int64_t g = h / geo.group;
          const T *qi = q + geo.qOffset(b, i, h);
          T maxScore = -std::numeric_limits<T>::infinity();
          for (int64_t j = 0; j < params.seqK; ++j) {
            if (!geo.visible(i, j))
              continue;
            scores[j] =
                scale * dot(qi, k + geo.kOffset(b, j, g), params.headDim);
            maxScore = std::max(maxScore, scores[j]);
          }
          T *oi = out + geo.oOffset(b, i, h);
          std::fill_n(oi, dv, T(0));
          if (maxScore == -std::numeric_limits<T>::infinity()) {
            logsumexp[row] = maxScore; // no key of this block is visible
            continue;
          }
          double sum = 0;
          for (int64_t j = 0; j < params.seqK; ++j) {
            if (!geo.visible(i, j))
              continue;
            scores[j] = std::exp(scores[j] - maxScore);
            sum += scores[j];
          }
          logsumexp[row] = static_cast<T>(maxScore + std::log(sum));
          BlockGeometry::MaskRow maskRow = geo.probabilityRow(b, h, i);
          for (int64_t j = 0; j < params.seqK; ++j) {
            if (!geo.visible(i, j))
              continue;
            double prob = scores[j] / sum;
            if (geo.hasDropout())
              prob = geo.keep(maskRow, j) ? prob * geo.dropoutScale : 0;
            T probT = static_cast<T>(prob);
            const T *vj = v + geo.vOffset(b, j, g);
            for (int64_t d = 0; d < dv; ++d)
              oi[d] += probT * vj[d];
          }
        }
      },
      detail::rowGrain(params.seqK * (params.headDim + dv)));
}

template <typename T>
void attentionMergeBlock(ThreadPool &pool, const AttentionParams &params,
                         const T *blockOut, const T *blockLogsumexp, T *out,
                         T *logsumexp) {
  const int64_t dv = params.headDimV;
  pool.parallelFor(
      0, params.batch * params.headsQ * params.seqQ,
      [&](int64_t begin, int64_t end) {
        for (int64_t row = begin; row < end; ++row) {
          double blockLse = blockLogsumexp[row];
          if (std::isinf(blockLse) && blockLse < 0)
            continue; // the block saw nothing of this row
          int64_t i = row % params.seqQ;
          int64_t h = (row / params.seqQ) % params.headsQ;
          int64_t b = row / (params.seqQ * params.headsQ);
          int64_t offset = ((b * params.seqQ + i) * params.headsQ + h) * dv;
          double lse = logsumexp[row];
          double top = std::max(lse, blockLse);
          double merged =
              top + std::log(std::exp(lse - top) + std::exp(blockLse - top));
          double keepOld = std::exp(lse - merged);
          double takeNew = std::exp(blockLse - merged);
          for (int64_t d = 0; d < dv; ++d)
            out[offset + d] = static_cast<T>(keepOld * out[offset + d] +
                                             takeNew * blockOut[offset + d]);
          logsumexp[row] = static_cast<T>(merged);
        }
      },
      detail::rowGrain(dv));
}

template <typename T>
void attentionBackwardDelta(ThreadPool &pool, const AttentionParams &params,
                            const T *out, const T *dout, T *delta) {
  const int64_t dv = params.headDimV;
  pool.parallelFor(
      0, params.batch * params.headsQ * params.seqQ,
      [&](int64_t begin, int64_t end) {
        for (int64_t row = begin; row < end; ++row) {
          int64_t i = row % params.seqQ;
          int64_t h = (row / params.seqQ) % params.headsQ;
          int64_t b = row / (params.seqQ * params.headsQ);
          int64_t offset = ((b * params.seqQ + i) * params.headsQ + h) * dv;
          double sum = 0;
          for (int64_t d = 0; d < dv; ++d)
            sum += static_cast<double>(out[offset + d]) * dout[offset + d];
          delta[row] = static_cast<T>(sum);
        }
      },
      detail::rowGrain(dv));
}

// Each (batch, key/value head) belongs to one thread, as in
// attentionBackward: it owns dk and dv of that head and dq of its group's
// query heads.
template <typename T>
void attentionBlockBackward(ThreadPool &pool, const AttentionParams &params,
                            const AttentionBlock &block, const T *q, const T *k,
                            const T *v, const T *logsumexp, const T *delta,
                            const T *dout, T *dq, T *dk, T *dv) {
  BlockGeometry geo(params, block);
  const int64_t d = params.headDim, dV = params.headDimV;
  const T scale = static_cast<T>(geo.scale);
  const T dropoutScale = static_cast<T>(geo.dropoutScale);
  pool.parallelFor(
      0, params.batch * params.headsKv,
      [&](int64_t begin, int64_t end) {
        std::vector<T> dqRow(static_cast<size_t>(d));
        for (int64_t unit = begin; unit < end; ++unit) {
          int64_t b = unit / params.headsKv;
          int64_t g = unit % params.headsKv;
          for (int64_t h = g * geo.group; h < (g + 1) * geo.group; ++h) {
            for (int64_t i = 0; i < params.seqQ; ++i) {
              int64_t row = geo.rowOffset(b, h, i);
              T lse = logsumexp[row];
              if (std::isinf(lse) && lse < 0)
                continue; // a row that sees no key anywhere
              BlockGeometry::MaskRow maskRow = geo.probabilityRow(b, h, i);
              const T *qi = q + geo.qOffset(b, i, h);
              const T *doi = dout + geo.oOffset(b, i, h);
              std::fill(dqRow.begin(), dqRow.end(), T(0));
              for (int64_t j = 0; j < params.seqK; ++j) {
                if (!geo.visible(i, j))
                  continue;
                const T *kj = k + geo.kOffset(b, j, g);
                T prob = std::exp(scale * dot(qi, kj, d) - lse);
                T dprob = dot(doi, v + geo.vOffset(b, j, g), dV);
                T dropped = prob;
                if (geo.hasDropout()) {
                  bool kept = geo.keep(maskRow, j);
                  dropped = kept ? prob * dropoutScale : T(0);
                  dprob = kept ? dprob * dropoutScale : T(0);
                }
                if (dv) {
                  T *dvj = dv + geo.vOffset(b, j, g);
                  for (int64_t e = 0; e < dV; ++e)
                    dvj[e] += dropped * doi[e];
                }
                T dscore = prob * (dprob - delta[row]);
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
                  dqi[e] += scale * dqRow[e];
              }
            }
          }
        }
      },
      1);
}

#define MTRT_INSTANTIATE(T)                                                    \
  template void attentionBlockForward<T>(                                      \
      ThreadPool &, const AttentionParams &, const AttentionBlock &,           \
      const T *, const T *, const T *, T *, T *);                              \
  template void attentionMergeBlock<T>(ThreadPool &, const AttentionParams &,  \
                                       const T *, const T *, T *, T *);        \
  template void attentionBackwardDelta<T>(                                     \
      ThreadPool &, const AttentionParams &, const T *, const T *, T *);       \
  template void attentionBlockBackward<T>(                                     \
      ThreadPool &, const AttentionParams &, const AttentionBlock &,           \
      const T *, const T *, const T *, const T *, const T *, const T *, T *,   \
      T *, T *);
MTRT_INSTANTIATE_FLOAT_TYPES(MTRT_INSTANTIATE)
#undef MTRT_INSTANTIATE

} // namespace mtrt::host
