// Reductions in rank order: every rank gets the bits of a serial loop.
#ifndef MTRT_SRC_COMM_FIXEDORDERREDUCE_H
#define MTRT_SRC_COMM_FIXEDORDERREDUCE_H

#include "comm/CollectiveCall.h"

#include <cstdint>

namespace mtrt::comm {

/// out[i] = in[0][offset + i] op in[1][offset + i] op ... op
/// in[n-1][offset + i], evaluated left to right, for i in [0, count). The
/// first contribution is the starting value (no 0 is added first, so -0.0
/// stays -0.0). `out` must not overlap any input. `dtype` is F32 or F64.
void reduceInRankOrder(DType dtype, ReduceOp op, const void *const *in, int n,
                       int64_t offset, int64_t count, void *out);

} // namespace mtrt::comm

#endif // MTRT_SRC_COMM_FIXEDORDERREDUCE_H
