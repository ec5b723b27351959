// Helpers shared by the host kernels' .cpp files: grain sizes and instantiation macros.
#ifndef MTRT_SRC_HOST_KERNELS_KERNELSUPPORT_H
#define MTRT_SRC_HOST_KERNELS_KERNELSUPPORT_H

#include "host/ThreadPool.h"
#include "host/kernels/Kernels.h"

#include <algorithm>
#include <cstdint>

namespace mtrt::host::detail {

/// Fewest elements worth a chunk of an elementwise loop: below this, waking
/// a thread costs more than the work.
constexpr int64_t kElementwiseGrain = 1 << 14;

/// Fewest rows worth a chunk for a row-wise kernel of rows of `width`.
inline int64_t rowGrain(int64_t width) {
  return std::max<int64_t>(1, kElementwiseGrain / std::max<int64_t>(width, 1));
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
