// Fills, seeded normal initialization keyed on the global element index, and
// position ids.
#include "core/Random.h"
#include "cuda/kernels/KernelSupport.cuh"

namespace mtrt::cuda {

namespace {

__global__ void fillKernel(int64_t n, OutElements out, float value) {
  MTRT_GRID_STRIDE(i, n) detail::store(out, i, value);
}

__global__ void initNormalKernel(int64_t n, float *out, double std,
                                 uint64_t key) {
  MTRT_GRID_STRIDE(i, n) {
    out[i] = static_cast<float>(
        std * random::normalFromKey(key, static_cast<uint64_t>(i)));
  }
}

template <typename Id>
__global__ void positionIdsKernel(int64_t n, int64_t seq, ContextTile tile,
                                  Id *ids) {
  MTRT_GRID_STRIDE(i, n)
  ids[i] = static_cast<Id>(contextGlobalPosition(tile, i % seq));
}

} // namespace

void fill(cudaStream_t stream, int64_t n, OutElements out, float value) {
  if (n > 0)
    fillKernel<<<detail::blocksFor(n), detail::kThreads, 0, stream>>>(n, out,
                                                                      value);
}

void initNormal(cudaStream_t stream, int64_t n, float *out, double std,
                uint64_t seed, uint64_t parameterId) {
  if (n > 0)
    initNormalKernel<<<detail::blocksFor(n), detail::kThreads, 0, stream>>>(
        n, out, std, random::streamKey(seed, parameterId));
}

template <typename Id>
void positionIds(cudaStream_t stream, int64_t n, int64_t seq, Id *ids,
                 const ContextTile &tile) {
  if (n > 0 && seq > 0)
    positionIdsKernel<Id><<<detail::blocksFor(n), detail::kThreads, 0, stream>>>(
        n, seq, tile, ids);
}

template <typename Id>
void positionIds(cudaStream_t stream, int64_t n, int64_t seq, Id *ids,
                 int64_t first) {
  positionIds(stream, n, seq, ids, ContextTile{first, 0, 1});
}

#define MTRT_INSTANTIATE(Id)                                                   \
  template void positionIds<Id>(cudaStream_t, int64_t, int64_t, Id *,          \
                                int64_t);                                      \
  template void positionIds<Id>(cudaStream_t, int64_t, int64_t, Id *,          \
                                const ContextTile &);
MTRT_CUDA_INSTANTIATE_ID_TYPES(MTRT_INSTANTIATE)
#undef MTRT_INSTANTIATE

} // namespace mtrt::cuda
