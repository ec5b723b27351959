// Reductions in a fixed order: every rank gets the same bits, and a sum over
// ranks continues the host kernels' canonical tree (docs/Parallelism.md,
// "Bit for bit").
#ifndef MTRT_SRC_COMM_FIXEDORDERREDUCE_H
#define MTRT_SRC_COMM_FIXEDORDERREDUCE_H

#include "comm/CollectiveCall.h"

#include <cstdint>

namespace mtrt::comm {

/// out[i] = the combination of in[0][offset + i] .. in[n-1][offset + i] for
/// i in [0, count). Sum adds ranks [0, n) as a balanced binary tree: the
/// ranks [lo, hi) are the sum of [lo, mid) plus the sum of [mid, hi), mid =
/// lo + ceil((hi - lo) / 2), so two ranks give x0 + x1, four (x0 + x1) + (x2
/// + x3), three (x0 + x1) + x2. A rank holding the contiguous r-th 1/n of a
/// dimension that a host kernel sums in its canonical order holds a whole
/// subtree, so this tree puts the one-rank sum back together bit for bit.
/// Max takes the largest, NaN if any is NaN, of equal values the lowest
/// rank's. A single contribution is copied (no 0 is added, so -0.0 stays
/// -0.0). `out` must not overlap any input. `dtype` is F32 or F64.
void reduceInFixedOrder(DType dtype, ReduceOp op, const void *const *in, int n,
                        int64_t offset, int64_t count, void *out);

} // namespace mtrt::comm

#endif // MTRT_SRC_COMM_FIXEDORDERREDUCE_H
