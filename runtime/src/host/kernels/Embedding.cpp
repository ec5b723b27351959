// Embedding lookup and its scatter-add backward, with ids checked against the table.
#include "host/kernels/KernelSupport.h"

#include <algorithm>
#include <cinttypes>
#include <cstdio>

namespace mtrt::host {

namespace {
template <typename Id>
KernelStatus checkIds(const char *kernel, int64_t count, const Id *ids,
                      int64_t vocab) {
  for (int64_t i = 0; i < count; ++i) {
    int64_t id = static_cast<int64_t>(ids[i]);
    if (id >= 0 && id < vocab)
      continue;
    char message[256];
    std::snprintf(message, sizeof(message),
                  "%s: id %" PRId64 " at position %" PRId64
                  " is outside the embedding table's %" PRId64
                  " rows (valid ids are 0 to %" PRId64 ")",
                  kernel, id, i, vocab, vocab - 1);
    return KernelStatus::error(message);
  }
  return KernelStatus::success();
}
} // namespace

template <typename T, typename Id>
KernelStatus embeddingForward(ThreadPool &pool, int64_t count, int64_t vocab,
                              int64_t hidden, const T *table, const Id *ids,
                              T *out) {
  KernelStatus status = checkIds("embedding", count, ids, vocab);
  if (!status.ok())
    return status;
  pool.parallelFor(
      0, count,
      [&](int64_t begin, int64_t end) {
        for (int64_t i = begin; i < end; ++i) {
          const T *row = table + static_cast<int64_t>(ids[i]) * hidden;
          std::copy(row, row + hidden, out + i * hidden);
        }
      },
      detail::rowGrain(hidden));
  return KernelStatus::success();
}

// Ownership by table row: each thread owns a contiguous range of table rows
// and scans all ids in increasing order, adding the ones in its range, so
// every row's sum has a fixed order without sorting or atomics.
template <typename T, typename Id>
KernelStatus embeddingBackward(ThreadPool &pool, int64_t count, int64_t vocab,
                               int64_t hidden, const Id *ids, const T *dout,
                               T *dtable, bool accumulate) {
  KernelStatus status = checkIds("embedding backward", count, ids, vocab);
  if (!status.ok())
    return status;
  pool.parallelFor(0, vocab, [&](int64_t begin, int64_t end) {
    if (!accumulate)
      std::fill(dtable + begin * hidden, dtable + end * hidden, T(0));
    for (int64_t i = 0; i < count; ++i) {
      int64_t id = static_cast<int64_t>(ids[i]);
      if (id < begin || id >= end)
        continue;
      T *row = dtable + id * hidden;
      const T *src = dout + i * hidden;
      for (int64_t j = 0; j < hidden; ++j)
        row[j] += src[j];
    }
  });
  return KernelStatus::success();
}

#define MTRT_INSTANTIATE(T, Id)                                                \
  template KernelStatus embeddingForward<T, Id>(ThreadPool &, int64_t,         \
                                                int64_t, int64_t, const T *,   \
                                                const Id *, T *);              \
  template KernelStatus embeddingBackward<T, Id>(ThreadPool &, int64_t,        \
                                                 int64_t, int64_t, const Id *, \
                                                 const T *, T *, bool);
MTRT_INSTANTIATE_FLOAT_AND_ID_TYPES(MTRT_INSTANTIATE)
#undef MTRT_INSTANTIATE

} // namespace mtrt::host
