// Megatron-LM's vocabulary-parallel embedding and cross-entropy on one
// rank's block of the vocabulary [start, start + vocab): masked lookups and
// the per-row statistics that the collectives combine.
#include "host/kernels/Bf16Rounding.h"
#include "host/kernels/KernelSupport.h"
#include "host/kernels/Kernels.h"

#include <algorithm>
#include <cmath>
#include <vector>

namespace mtrt::host {

template <typename T, typename Id>
void vocabEmbeddingForward(ThreadPool &pool, int64_t count, int64_t vocab,
                           int64_t hidden, int64_t start, const T *table,
                           const Id *ids, T *out) {
  pool.parallelFor(
      0, count,
      [&](int64_t begin, int64_t end) {
        for (int64_t i = begin; i < end; ++i) {
          int64_t row = static_cast<int64_t>(ids[i]) - start;
          T *to = out + i * hidden;
          if (row < 0 || row >= vocab)
            std::fill(to, to + hidden, T(0));
          else
            std::copy(table + row * hidden, table + (row + 1) * hidden, to);
        }
      },
      detail::rowGrain(hidden));
}

// As embeddingBackward: each thread owns a range of the block's rows and
// scans the ids in order, so every row's sum has a fixed order.
template <typename T, typename Id>
void vocabEmbeddingBackward(ThreadPool &pool, int64_t count, int64_t vocab,
                            int64_t hidden, int64_t start, const Id *ids,
                            const T *dout, T *dtable) {
  pool.parallelFor(0, vocab, [&](int64_t begin, int64_t end) {
    std::fill(dtable + begin * hidden, dtable + end * hidden, T(0));
    for (int64_t i = 0; i < count; ++i) {
      int64_t row = static_cast<int64_t>(ids[i]) - start;
      if (row < begin || row >= end)
        continue;
      T *to = dtable + row * hidden;
      const T *from = dout + i * hidden;
      for (int64_t j = 0; j < hidden; ++j)
        to[j] += from[j];
    }
  });
}

template <typename T>
void vocabMax(ThreadPool &pool, int64_t rows, int64_t vocab, const T *logits,
              T *max) {
  pool.parallelFor(
      0, rows,
      [&](int64_t begin, int64_t end) {
        for (int64_t r = begin; r < end; ++r) {
          const T *row = logits + r * vocab;
          max[r] = *std::max_element(row, row + vocab);
        }
      },
      detail::rowGrain(vocab));
}

template <typename T, typename Id>
void vocabPartials(ThreadPool &pool, int64_t rows, int64_t vocab,
                   int64_t start, const T *logits, const Id *labels,
                   const T *max, T *partials) {
  pool.parallelFor(
      0, rows,
      [&](int64_t begin, int64_t end) {
        for (int64_t r = begin; r < end; ++r) {
          const T *row = logits + r * vocab;
          double m = static_cast<double>(max[r]);
          int64_t target = static_cast<int64_t>(labels[r]) - start;
          partials[2 * r] = detail::canonicalExpSum(row, vocab, m);
          partials[2 * r + 1] =
              target >= 0 && target < vocab
                  ? static_cast<T>(static_cast<double>(row[target]) - m)
                  : T(0);
        }
      },
      detail::rowGrain(vocab));
}

template <typename T, typename Id>
void vocabCrossEntropy(int64_t rows, const T *partials, const Id *labels,
                       int64_t ignoreIndex, LossReduction reduction, T *loss) {
  double total = 0;
  int64_t count = 0;
  for (int64_t r = 0; r < rows; ++r) {
    bool ignored = static_cast<int64_t>(labels[r]) == ignoreIndex;
    double value = ignored ? 0.0
                           : std::log(static_cast<double>(partials[2 * r])) -
                                 static_cast<double>(partials[2 * r + 1]);
    if (reduction == LossReduction::None)
      loss[r] = static_cast<T>(value);
    total += value;
    count += !ignored;
  }
  if (reduction == LossReduction::Sum)
    loss[0] = static_cast<T>(total);
  else if (reduction == LossReduction::Mean)
    loss[0] = static_cast<T>(count > 0 ? total / static_cast<double>(count)
                                       : 0.0);
}

namespace {

/// The loss gradient every row shares under Sum and Mean: dloss[0], over
/// the rows not ignored for Mean (0 for None, whose rows have their own).
template <typename T, typename Id>
double vocabGradShare(int64_t rows, const Id *labels, int64_t ignoreIndex,
                      LossReduction reduction, const T *dloss) {
  if (reduction == LossReduction::None)
    return 0;
  int64_t count = 0;
  for (int64_t r = 0; r < rows; ++r)
    count += static_cast<int64_t>(labels[r]) != ignoreIndex;
  return reduction == LossReduction::Sum
             ? static_cast<double>(dloss[0])
             : (count > 0 ? static_cast<double>(dloss[0]) / count : 0.0);
}

/// vocabCrossEntropyGrad's rows, with the shared factor given: the whole
/// op's, or one chunk's of the chunked op.
template <typename T, typename Id>
void vocabGradRows(ThreadPool &pool, int64_t rows, int64_t vocab, int64_t start,
                   const T *logits, const Id *labels, int64_t ignoreIndex,
                   LossReduction reduction, const T *dloss, double shared,
                   const T *max, const T *partials, T *dlogits) {
  pool.parallelFor(
      0, rows,
      [&](int64_t begin, int64_t end) {
        for (int64_t r = begin; r < end; ++r) {
          T *out = dlogits + r * vocab;
          int64_t label = static_cast<int64_t>(labels[r]);
          if (label == ignoreIndex) {
            std::fill(out, out + vocab, T(0));
            continue;
          }
          double g = reduction == LossReduction::None
                         ? static_cast<double>(dloss[r])
                         : shared;
          const T *row = logits + r * vocab;
          double m = static_cast<double>(max[r]);
          double sum = static_cast<double>(partials[2 * r]);
          for (int64_t v = 0; v < vocab; ++v) {
            double prob = std::exp(static_cast<double>(row[v]) - m) / sum;
            out[v] = static_cast<T>(
                g * (v + start == label ? prob - 1.0 : prob));
          }
        }
      },
      detail::rowGrain(vocab));
}

} // namespace

template <typename T, typename Id>
void vocabCrossEntropyGrad(ThreadPool &pool, int64_t rows, int64_t vocab,
                           int64_t start, const T *logits, const Id *labels,
                           int64_t ignoreIndex, LossReduction reduction,
                           const T *dloss, const T *max, const T *partials,
                           T *dlogits) {
  vocabGradRows<T, Id>(
      pool, rows, vocab, start, logits, labels, ignoreIndex, reduction, dloss,
      vocabGradShare<T, Id>(rows, labels, ignoreIndex, reduction, dloss), max,
      partials, dlogits);
}

namespace {

/// logits [n, vocab] = x_c @ op(W) for the chunk's rows, rounded to bf16
/// where the CUDA kernel's GEMM stores them in bf16.
template <typename T>
void chunkLogits(ThreadPool &pool, int64_t n, int64_t in, int64_t vocab,
                 const T *xc, const T *weight, bool transposeWeight,
                 bool bf16Logits, T *logits) {
  linearForward<T>(pool, n, in, vocab, xc, weight, transposeWeight, nullptr,
                   logits);
  if (bf16Logits)
    pool.parallelFor(
        0, n,
        [&](int64_t begin, int64_t end) {
          roundAllToBf16(logits + begin * vocab, (end - begin) * vocab);
        },
        detail::rowGrain(vocab));
}

} // namespace

template <typename T>
void linearVocabMax(ThreadPool &pool, int64_t rows, int64_t in, int64_t vocab,
                    int64_t chunkRows, const T *x, const T *weight,
                    bool transposeWeight, bool bf16Logits, T *scratch, T *max) {
  for (int64_t first = 0; first < rows; first += chunkRows) {
    int64_t n = std::min(chunkRows, rows - first);
    chunkLogits<T>(pool, n, in, vocab, x + first * in, weight, transposeWeight,
                   bf16Logits, scratch);
    vocabMax<T>(pool, n, vocab, scratch, max + first);
  }
}

template <typename T, typename Id>
void linearVocabPartials(ThreadPool &pool, int64_t rows, int64_t in,
                         int64_t vocab, int64_t chunkRows, int64_t start,
                         const T *x, const T *weight, bool transposeWeight,
                         const Id *labels, const T *max, bool bf16Logits,
                         T *scratch, T *partials) {
  for (int64_t first = 0; first < rows; first += chunkRows) {
    int64_t n = std::min(chunkRows, rows - first);
    chunkLogits<T>(pool, n, in, vocab, x + first * in, weight, transposeWeight,
                   bf16Logits, scratch);
    vocabPartials<T, Id>(pool, n, vocab, start, scratch, labels + first,
                         max + first, partials + 2 * first);
  }
}

template <typename T, typename Id>
void linearVocabCrossEntropyGrad(ThreadPool &pool, int64_t rows, int64_t in,
                                 int64_t vocab, int64_t chunkRows,
                                 int64_t start, const T *x, const T *weight,
                                 bool transposeWeight, const Id *labels,
                                 int64_t ignoreIndex, LossReduction reduction,
                                 const T *dloss, const T *max,
                                 const T *partials, bool bf16Logits, T *scratch,
                                 T *dx, T *dweight) {
  // The factor over all the rows, as the unfused op's; the chunks' rows.
  double shared =
      vocabGradShare<T, Id>(rows, labels, ignoreIndex, reduction, dloss);
  if (rows == 0)
    std::fill(dweight, dweight + in * vocab, T(0));
  for (int64_t first = 0; first < rows; first += chunkRows) {
    int64_t n = std::min(chunkRows, rows - first);
    const T *xc = x + first * in;
    chunkLogits<T>(pool, n, in, vocab, xc, weight, transposeWeight, bf16Logits,
                   scratch);
    // In place: each row reads its logits before writing their gradient.
    vocabGradRows<T, Id>(pool, n, vocab, start, scratch, labels + first,
                         ignoreIndex, reduction, dloss + first, shared,
                         max + first, partials + 2 * first, scratch);
    if (bf16Logits) // the gradient GEMMs' bf16 operand
      pool.parallelFor(
          0, n,
          [&](int64_t begin, int64_t end) {
            roundAllToBf16(scratch + begin * vocab, (end - begin) * vocab);
          },
          detail::rowGrain(vocab));
    linearBackward<T>(pool, n, in, vocab, xc, weight, transposeWeight, scratch,
                      dx + first * in, dweight, nullptr,
                      /*accumulate=*/first > 0);
  }
}

#define MTRT_INSTANTIATE(T, Id)                                                \
  template void vocabEmbeddingForward<T, Id>(ThreadPool &, int64_t, int64_t,   \
                                             int64_t, int64_t, const T *,      \
                                             const Id *, T *);                 \
  template void vocabEmbeddingBackward<T, Id>(ThreadPool &, int64_t, int64_t,  \
                                              int64_t, int64_t, const Id *,    \
                                              const T *, T *);                 \
  template void vocabPartials<T, Id>(ThreadPool &, int64_t, int64_t, int64_t,  \
                                     const T *, const Id *, const T *, T *);   \
  template void vocabCrossEntropy<T, Id>(int64_t, const T *, const Id *,       \
                                         int64_t, LossReduction, T *);         \
  template void vocabCrossEntropyGrad<T, Id>(                                  \
      ThreadPool &, int64_t, int64_t, int64_t, const T *, const Id *, int64_t, \
      LossReduction, const T *, const T *, const T *, T *);                    \
  template void linearVocabPartials<T, Id>(                                    \
      ThreadPool &, int64_t, int64_t, int64_t, int64_t, int64_t, const T *,    \
      const T *, bool, const Id *, const T *, bool, T *, T *);                 \
  template void linearVocabCrossEntropyGrad<T, Id>(                            \
      ThreadPool &, int64_t, int64_t, int64_t, int64_t, int64_t, const T *,    \
      const T *, bool, const Id *, int64_t, LossReduction, const T *,          \
      const T *, const T *, bool, T *, T *, T *);
MTRT_INSTANTIATE_FLOAT_AND_ID_TYPES(MTRT_INSTANTIATE)
#undef MTRT_INSTANTIATE

template void vocabMax<float>(ThreadPool &, int64_t, int64_t, const float *,
                              float *);
template void vocabMax<double>(ThreadPool &, int64_t, int64_t, const double *,
                               double *);
template void linearVocabMax<float>(ThreadPool &, int64_t, int64_t, int64_t,
                                    int64_t, const float *, const float *, bool,
                                    bool, float *, float *);
template void linearVocabMax<double>(ThreadPool &, int64_t, int64_t, int64_t,
                                     int64_t, const double *, const double *,
                                     bool, bool, double *, double *);

} // namespace mtrt::host
