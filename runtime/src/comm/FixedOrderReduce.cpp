// Rank-ordered sum and max over float and double buffers.
#include "comm/FixedOrderReduce.h"

#include <cmath>
#include <cstring>

namespace mtrt::comm {

namespace {

template <typename T>
void reduce(ReduceOp op, const void *const *in, int n, int64_t offset,
            int64_t count, T *out) {
  std::memcpy(out, static_cast<const T *>(in[0]) + offset, count * sizeof(T));
  // Rank by rank over the whole buffer: each element still sees the ranks in
  // order, and the inner loop vectorizes.
  for (int r = 1; r < n; ++r) {
    const T *x = static_cast<const T *>(in[r]) + offset;
    if (op == ReduceOp::Sum) {
      for (int64_t i = 0; i < count; ++i)
        out[i] = out[i] + x[i];
    } else {
      for (int64_t i = 0; i < count; ++i)
        if (x[i] > out[i] || (std::isnan(x[i]) && !std::isnan(out[i])))
          out[i] = x[i];
    }
  }
}

} // namespace

void reduceInRankOrder(DType dtype, ReduceOp op, const void *const *in, int n,
                       int64_t offset, int64_t count, void *out) {
  if (count == 0)
    return;
  if (dtype == DType::F64)
    reduce(op, in, n, offset, count, static_cast<double *>(out));
  else
    reduce(op, in, n, offset, count, static_cast<float *>(out));
}

} // namespace mtrt::comm
