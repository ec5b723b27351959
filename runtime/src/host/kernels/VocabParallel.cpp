// Megatron-LM's vocabulary-parallel embedding and cross-entropy on one
// rank's block of the vocabulary [start, start + vocab): masked lookups and
// the per-row statistics that the collectives combine.
#include "host/kernels/KernelSupport.h"

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

template <typename T, typename Id>
void vocabCrossEntropyGrad(ThreadPool &pool, int64_t rows, int64_t vocab,
                           int64_t start, const T *logits, const Id *labels,
                           int64_t ignoreIndex, LossReduction reduction,
                           const T *dloss, const T *max, const T *partials,
                           T *dlogits) {
  double shared = 0;
  if (reduction != LossReduction::None) {
    int64_t count = 0;
    for (int64_t r = 0; r < rows; ++r)
      count += static_cast<int64_t>(labels[r]) != ignoreIndex;
    shared = reduction == LossReduction::Sum
                 ? static_cast<double>(dloss[0])
                 : (count > 0 ? static_cast<double>(dloss[0]) / count : 0.0);
  }
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
      LossReduction, const T *, const T *, const T *, T *);
MTRT_INSTANTIATE_FLOAT_AND_ID_TYPES(MTRT_INSTANTIATE)
#undef MTRT_INSTANTIATE

template void vocabMax<float>(ThreadPool &, int64_t, int64_t, const float *,
                              float *);
template void vocabMax<double>(ThreadPool &, int64_t, int64_t, const double *,
                               double *);

} // namespace mtrt::host
