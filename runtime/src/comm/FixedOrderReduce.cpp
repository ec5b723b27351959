// The rank tree of sums and the rank-ordered max over float and double buffers.
#include "comm/FixedOrderReduce.h"

#include <cmath>
#include <cstring>
#include <vector>

namespace mtrt::comm {

namespace {

/// out = the tree sum of ranks [lo, hi). Whole buffers at a time, so each
/// element still sees the tree and the inner loop vectorizes.
template <typename T>
void sumTree(const void *const *in, int lo, int hi, int64_t offset,
             int64_t count, T *out) {
  if (hi - lo == 1) {
    std::memcpy(out, static_cast<const T *>(in[lo]) + offset,
                count * sizeof(T));
    return;
  }
  int mid = lo + (hi - lo + 1) / 2;
  sumTree(in, lo, mid, offset, count, out);
  if (hi - mid == 1) {
    const T *x = static_cast<const T *>(in[mid]) + offset;
    for (int64_t i = 0; i < count; ++i)
      out[i] = out[i] + x[i];
    return;
  }
  std::vector<T> right(static_cast<size_t>(count));
  sumTree(in, mid, hi, offset, count, right.data());
  for (int64_t i = 0; i < count; ++i)
    out[i] = out[i] + right[i];
}

template <typename T>
void maxInRankOrder(const void *const *in, int n, int64_t offset, int64_t count,
                    T *out) {
  std::memcpy(out, static_cast<const T *>(in[0]) + offset, count * sizeof(T));
  for (int r = 1; r < n; ++r) {
    const T *x = static_cast<const T *>(in[r]) + offset;
    for (int64_t i = 0; i < count; ++i)
      if (x[i] > out[i] || (std::isnan(x[i]) && !std::isnan(out[i])))
        out[i] = x[i];
  }
}

template <typename T>
void reduce(ReduceOp op, const void *const *in, int n, int64_t offset,
            int64_t count, T *out) {
  if (op == ReduceOp::Sum)
    sumTree(in, 0, n, offset, count, out);
  else
    maxInRankOrder(in, n, offset, count, out);
}

} // namespace

void reduceInFixedOrder(DType dtype, ReduceOp op, const void *const *in, int n,
                        int64_t offset, int64_t count, void *out) {
  if (count == 0)
    return;
  if (dtype == DType::F64)
    reduce(op, in, n, offset, count, static_cast<double *>(out));
  else
    reduce(op, in, n, offset, count, static_cast<float *>(out));
}

} // namespace mtrt::comm
