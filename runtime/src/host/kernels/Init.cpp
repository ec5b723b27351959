// Parameter initialization: seeded normals keyed on the global element index, and constant fills.
#include "core/Random.h"
#include "host/kernels/KernelSupport.h"

#include <algorithm>

namespace mtrt::host {

template <typename T>
void initNormal(ThreadPool &pool, int64_t n, T *out, double std, uint64_t seed,
                uint64_t parameterId, uint64_t firstIndex) {
  uint64_t key = random::streamKey(seed, parameterId);
  detail::forEachElement(pool, n, [&](int64_t i) {
    uint64_t index = firstIndex + static_cast<uint64_t>(i);
    out[i] = static_cast<T>(std * random::normalFromKey(key, index));
  });
}

template <typename T>
void initNormalShard(ThreadPool &pool, int rank, const int64_t *globalShape,
                     const int64_t *offsets, const int64_t *localShape, T *out,
                     double std, uint64_t seed, uint64_t parameterId) {
  uint64_t key = random::streamKey(seed, parameterId);
  int64_t n = 1;
  for (int d = 0; d < rank; ++d)
    n *= localShape[d];
  detail::forEachElement(pool, n, [&](int64_t i) {
    // The local row-major index to coordinates, last dimension fastest,
    // then to the global row-major index.
    uint64_t index = 0, stride = 1;
    int64_t rest = i;
    for (int d = rank - 1; d >= 0; --d) {
      int64_t local = localShape[d] ? rest % localShape[d] : 0;
      rest = localShape[d] ? rest / localShape[d] : 0;
      index += static_cast<uint64_t>(offsets[d] + local) * stride;
      stride *= static_cast<uint64_t>(globalShape[d]);
    }
    out[i] = static_cast<T>(std * random::normalFromKey(key, index));
  });
}

template <typename T>
void fill(ThreadPool &pool, int64_t n, T *out, T value) {
  pool.parallelFor(
      0, n,
      [&](int64_t begin, int64_t end) {
        std::fill(out + begin, out + end, value);
      },
      detail::kElementwiseGrain);
}

#define MTRT_INSTANTIATE(T)                                                    \
  template void initNormal<T>(ThreadPool &, int64_t, T *, double, uint64_t,    \
                              uint64_t, uint64_t);                             \
  template void initNormalShard<T>(ThreadPool &, int, const int64_t *,         \
                                   const int64_t *, const int64_t *, T *,      \
                                   double, uint64_t, uint64_t);                \
  template void fill<T>(ThreadPool &, int64_t, T *, T);
MTRT_INSTANTIATE_FLOAT_TYPES(MTRT_INSTANTIATE)
#undef MTRT_INSTANTIATE

} // namespace mtrt::host
