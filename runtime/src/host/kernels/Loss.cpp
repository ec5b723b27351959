// Softmax cross-entropy against integer labels, forward and backward, per row
// as the vocabulary-parallel kernels compute it.
#include "host/kernels/Bf16Rounding.h"
#include "host/kernels/KernelSupport.h"

#include <algorithm>
#include <cinttypes>
#include <cmath>
#include <cstdio>
#include <vector>

namespace mtrt::host {

namespace {

template <typename Id>
KernelStatus checkLabels(const char *kernel, int64_t rows, int64_t vocab,
                         const Id *labels, int64_t ignoreIndex) {
  for (int64_t r = 0; r < rows; ++r) {
    int64_t label = static_cast<int64_t>(labels[r]);
    if (label == ignoreIndex || (label >= 0 && label < vocab))
      continue;
    char message[256];
    std::snprintf(message, sizeof(message),
                  "%s: label %" PRId64 " of row %" PRId64
                  " is outside the vocabulary of %" PRId64
                  " (valid labels are 0 to %" PRId64
                  ", or the ignore index %" PRId64 ")",
                  kernel, label, r, vocab, vocab - 1, ignoreIndex);
    return KernelStatus::error(message);
  }
  return KernelStatus::success();
}

/// A row's largest logit and its sum of exp(logit - max), computed as the
/// vocabulary-parallel kernels compute them (max exactly, the sum in the
/// canonical order rounded to T), so that a row gives the same bits whether
/// or not its vocabulary is split over ranks.
struct RowStatistics {
  double max;
  double sum;
};

template <typename T> RowStatistics rowStatistics(const T *row, int64_t vocab) {
  double max = static_cast<double>(*std::max_element(row, row + vocab));
  return {max, static_cast<double>(detail::canonicalExpSum(row, vocab, max))};
}

template <typename Id>
int64_t countLabelled(int64_t rows, const Id *labels, int64_t ignoreIndex) {
  int64_t count = 0;
  for (int64_t r = 0; r < rows; ++r)
    count += static_cast<int64_t>(labels[r]) != ignoreIndex;
  return count;
}

} // namespace

template <typename T, typename Id>
KernelStatus crossEntropyForward(ThreadPool &pool, int64_t rows,
                                 int64_t vocab, const T *logits,
                                 const Id *labels, int64_t ignoreIndex,
                                 LossReduction reduction, T *loss) {
  KernelStatus status =
      checkLabels("cross_entropy", rows, vocab, labels, ignoreIndex);
  if (!status.ok())
    return status;
  std::vector<double> rowLoss(static_cast<size_t>(rows), 0.0);
  pool.parallelFor(
      0, rows,
      [&](int64_t begin, int64_t end) {
        for (int64_t r = begin; r < end; ++r) {
          int64_t label = static_cast<int64_t>(labels[r]);
          if (label == ignoreIndex)
            continue;
          const T *row = logits + r * vocab;
          RowStatistics s = rowStatistics(row, vocab);
          // As vocabCrossEntropy: log(sum) - (target - max), the target term
          // rounded to T as the vocabulary-parallel partials are.
          rowLoss[r] =
              std::log(s.sum) - static_cast<double>(static_cast<T>(
                                    static_cast<double>(row[label]) - s.max));
        }
      },
      detail::rowGrain(vocab));
  if (reduction == LossReduction::None) {
    for (int64_t r = 0; r < rows; ++r)
      loss[r] = static_cast<T>(rowLoss[r]);
    return KernelStatus::success();
  }
  double total = 0;
  for (int64_t r = 0; r < rows; ++r)
    total += rowLoss[r];
  if (reduction == LossReduction::Mean) {
    int64_t count = countLabelled(rows, labels, ignoreIndex);
    total = count > 0 ? total / static_cast<double>(count) : 0.0;
  }
  loss[0] = static_cast<T>(total);
  return KernelStatus::success();
}

template <typename T, typename Id>
KernelStatus crossEntropyBackward(ThreadPool &pool, int64_t rows,
                                  int64_t vocab, const T *logits,
                                  const Id *labels, int64_t ignoreIndex,
                                  LossReduction reduction, const T *dloss,
                                  T *dlogits) {
  KernelStatus status =
      checkLabels("cross_entropy backward", rows, vocab, labels, ignoreIndex);
  if (!status.ok())
    return status;
  double shared = 0;
  if (reduction == LossReduction::Sum) {
    shared = dloss[0];
  } else if (reduction == LossReduction::Mean) {
    int64_t count = countLabelled(rows, labels, ignoreIndex);
    shared = count > 0 ? static_cast<double>(dloss[0]) / count : 0.0;
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
          RowStatistics s = rowStatistics(row, vocab);
          for (int64_t v = 0; v < vocab; ++v) {
            double prob = std::exp(static_cast<double>(row[v]) - s.max) / s.sum;
            out[v] = static_cast<T>(g * (v == label ? prob - 1.0 : prob));
          }
        }
      },
      detail::rowGrain(vocab));
  return KernelStatus::success();
}

template <typename T, typename Id>
void linearCrossEntropy(ThreadPool &pool, int64_t rows, int64_t in,
                        int64_t vocab, int64_t chunkRows, const T *x,
                        const T *weight, bool transposeWeight, const Id *labels,
                        int64_t ignoreIndex, LossReduction reduction,
                        bool bf16Logits, T *scratch, T *loss, T *dx,
                        T *dweight) {
  // The loss gradient is one: g = 1 / count for mean, as
  // crossEntropyBackward's dloss[0] / count with dloss[0] = 1.
  int64_t count = countLabelled(rows, labels, ignoreIndex);
  double g = 1.0;
  if (reduction == LossReduction::Mean)
    g = count > 0 ? 1.0 / static_cast<double>(count) : 0.0;
  std::vector<double> rowLoss(static_cast<size_t>(rows), 0.0);
  for (int64_t first = 0; first < rows; first += chunkRows) {
    int64_t n = std::min(chunkRows, rows - first);
    const T *xc = x + first * in;
    const Id *lc = labels + first;
    linearForward<T>(pool, n, in, vocab, xc, weight, transposeWeight, nullptr,
                     scratch);
    pool.parallelFor(
        0, n,
        [&](int64_t begin, int64_t end) {
          for (int64_t r = begin; r < end; ++r) {
            T *row = scratch + r * vocab;
            int64_t label = static_cast<int64_t>(lc[r]);
            if (label == ignoreIndex) {
              std::fill(row, row + vocab, T(0));
              continue;
            }
            if (bf16Logits) // stored in bf16 by the CUDA kernel's GEMM
              roundAllToBf16(row, vocab);
            RowStatistics s = rowStatistics(row, vocab);
            rowLoss[first + r] =
                std::log(s.sum) - static_cast<double>(static_cast<T>(
                                      static_cast<double>(row[label]) - s.max));
            for (int64_t v = 0; v < vocab; ++v) {
              double prob =
                  std::exp(static_cast<double>(row[v]) - s.max) / s.sum;
              row[v] = static_cast<T>(g * (v == label ? prob - 1.0 : prob));
            }
            if (bf16Logits) // the gradient GEMMs' bf16 operand
              roundAllToBf16(row, vocab);
          }
        },
        detail::rowGrain(vocab));
    linearBackward<T>(pool, n, in, vocab, xc, weight, transposeWeight, scratch,
                      dx + first * in, dweight, nullptr,
                      /*accumulate=*/first > 0);
  }
  double total = 0;
  for (int64_t r = 0; r < rows; ++r)
    total += rowLoss[r];
  if (reduction == LossReduction::Mean)
    total = count > 0 ? total / static_cast<double>(count) : 0.0;
  loss[0] = static_cast<T>(total);
}

#define MTRT_INSTANTIATE(T, Id)                                                \
  template KernelStatus crossEntropyForward<T, Id>(                            \
      ThreadPool &, int64_t, int64_t, const T *, const Id *, int64_t,          \
      LossReduction, T *);                                                     \
  template KernelStatus crossEntropyBackward<T, Id>(                           \
      ThreadPool &, int64_t, int64_t, const T *, const Id *, int64_t,          \
      LossReduction, const T *, T *);                                          \
  template void linearCrossEntropy<T, Id>(                                     \
      ThreadPool &, int64_t, int64_t, int64_t, int64_t, const T *, const T *,  \
      bool, const Id *, int64_t, LossReduction, bool, T *, T *, T *, T *);
MTRT_INSTANTIATE_FLOAT_AND_ID_TYPES(MTRT_INSTANTIATE)
#undef MTRT_INSTANTIATE

} // namespace mtrt::host
