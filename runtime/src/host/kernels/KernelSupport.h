// Helpers shared by the host kernels' .cpp files: grain sizes and instantiation macros.
#ifndef MTRT_SRC_HOST_KERNELS_KERNELSUPPORT_H
#define MTRT_SRC_HOST_KERNELS_KERNELSUPPORT_H

#include "host/ThreadPool.h"
#include "host/kernels/Kernels.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <vector>

namespace mtrt::host::detail {

/// Fewest elements worth a chunk of an elementwise loop: below this, waking
/// a thread costs more than the work.
constexpr int64_t kElementwiseGrain = 1 << 14;

/// Fewest rows worth a chunk for a row-wise kernel of rows of `width`.
inline int64_t rowGrain(int64_t width) {
  return std::max<int64_t>(1, kElementwiseGrain / std::max<int64_t>(width, 1));
}

/// The canonical order of a sum over a dimension the compiler may shard
/// (docs/Parallelism.md, "Bit for bit"): a range of `length` terms is the
/// sum of its two halves while it is even and longer than kCanonicalLeaf,
/// and a leaf is summed sequentially. A rank that holds the contiguous r-th
/// 1/k of a dimension of N terms (k a power of two dividing N, N / k >
/// kCanonicalLeaf / 2) sums exactly one subtree of the tree over N, and the
/// all-reduce's rank tree (comm/FixedOrderReduce.h) adds the subtrees as the
/// tree's top: the one-rank run's bits, whatever k.
constexpr int64_t kCanonicalLeaf = 32;

/// True when a canonical sum of `length` terms splits into two halves.
inline bool splitsInHalves(int64_t length) {
  return length > kCanonicalLeaf && length % 2 == 0;
}

/// sum over v < length of exp(row[v] - max) in the canonical order: each leaf
/// summed in double and rounded to T, the tree above it added in T. So a
/// vocabulary-parallel rank's partial (a T, all-reduced in T) is a subtree
/// of the one-rank sum, and both cross-entropies give the same bits.
template <typename T>
T canonicalExpSum(const T *row, int64_t length, double max) {
  if (splitsInHalves(length)) {
    int64_t half = length / 2;
    T left = canonicalExpSum(row, half, max);
    return left + canonicalExpSum(row + half, half, max);
  }
  double sum = 0;
  for (int64_t v = 0; v < length; ++v)
    sum += std::exp(static_cast<double>(row[v]) - max);
  return static_cast<T>(sum);
}

/// out[j - begin] = sum over rows of rowTerm(r, j) for the columns j in
/// [begin, end), the rows viewed as [outer, sequence] (r = o * sequence +
/// s): in the canonical order over the sequence positions [first, first +
/// length), whose leaves sum every (o, s) of the leaf in increasing r in Acc
/// and round to T, and whose tree adds in T. Sequence parallelism splits the
/// sequence, so a rank's partial is a subtree of the one-rank sum.
template <typename T, typename Acc, typename RowTerm>
void canonicalColumnSums(int64_t outer, int64_t sequence, int64_t first,
                         int64_t length, int64_t begin, int64_t end, T *out,
                         RowTerm &&rowTerm) {
  if (splitsInHalves(length)) {
    int64_t half = length / 2;
    canonicalColumnSums<T, Acc>(outer, sequence, first, half, begin, end, out,
                                rowTerm);
    std::vector<T> right(static_cast<size_t>(end - begin));
    canonicalColumnSums<T, Acc>(outer, sequence, first + half, half, begin, end,
                                right.data(), rowTerm);
    for (int64_t j = 0; j < end - begin; ++j)
      out[j] = out[j] + right[j];
    return;
  }
  std::vector<Acc> sums(static_cast<size_t>(end - begin), Acc(0));
  for (int64_t o = 0; o < outer; ++o)
    for (int64_t s = first; s < first + length; ++s) {
      int64_t r = o * sequence + s;
      for (int64_t j = begin; j < end; ++j)
        sums[j - begin] += static_cast<Acc>(rowTerm(r, j));
    }
  for (int64_t j = 0; j < end - begin; ++j)
    out[j] = static_cast<T>(sums[j]);
}

/// The sums of canonicalColumnSums over all `rows` (= outer * sequence; a
/// `sequence` of 0 means rows) for the columns [0, columns), written to out
/// or, with `accumulate`, added to it. Each chunk of columns is one
/// thread's, so the sums do not depend on the thread count.
template <typename T, typename Acc, typename RowTerm>
void canonicalRowSums(ThreadPool &pool, int64_t rows, int64_t sequence,
                      int64_t columns, T *out, bool accumulate,
                      RowTerm &&rowTerm) {
  if (sequence <= 0 || rows % sequence != 0)
    sequence = rows;
  int64_t outer = sequence > 0 ? rows / sequence : 0;
  pool.parallelFor(
      0, columns,
      [&](int64_t begin, int64_t end) {
        std::vector<T> sums(static_cast<size_t>(end - begin), T(0));
        if (rows > 0)
          canonicalColumnSums<T, Acc>(outer, sequence, 0, sequence, begin, end,
                                      sums.data(), rowTerm);
        for (int64_t j = begin; j < end; ++j)
          out[j] = accumulate ? out[j] + sums[j - begin] : sums[j - begin];
      },
      rowGrain(rows));
}

/// Runs fn(i) for i in [0, n) over the pool in elementwise-sized chunks.
template <typename Fn>
void forEachElement(ThreadPool &pool, int64_t n, Fn &&fn) {
  pool.parallelFor(
      0, n,
      [&](int64_t begin, int64_t end) {
        for (int64_t i = begin; i < end; ++i)
          fn(i);
      },
      kElementwiseGrain);
}

} // namespace mtrt::host::detail

// Explicit instantiations: the .cpp files define the templates; these make
// the float and double (and int32/int64 id) versions the library provides.
#define MTRT_INSTANTIATE_FLOAT_TYPES(MACRO) MACRO(float) MACRO(double)
#define MTRT_INSTANTIATE_FLOAT_AND_ID_TYPES(MACRO)                             \
  MACRO(float, int32_t)                                                        \
  MACRO(float, int64_t) MACRO(double, int32_t) MACRO(double, int64_t)

#endif // MTRT_SRC_HOST_KERNELS_KERNELSUPPORT_H
