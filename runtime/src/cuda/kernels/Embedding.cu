// Embedding lookup and its deterministic scatter-add backward.
#include "cuda/kernels/KernelSupport.cuh"

namespace mtrt::cuda {

namespace {

template <typename Id>
__global__ void embeddingForwardKernel(int64_t count, int64_t vocab,
                                       int64_t hidden, const float *table,
                                       const Id *ids, float *out,
                                       unsigned *fault, unsigned tag) {
  MTRT_GRID_STRIDE(e, count * hidden) {
    int64_t i = e / hidden, j = e % hidden;
    int64_t id = static_cast<int64_t>(ids[i]);
    if (id < 0 || id >= vocab) {
      detail::raiseFault(fault, tag);
      out[e] = 0.0f;
    } else {
      out[e] = table[id * hidden + j];
    }
  }
}

constexpr int kRowsPerBlock = 64;
constexpr int kIdTile = 1024;

// Each block owns table rows [first, first + kRowsPerBlock): it zeroes them,
// then walks every id in increasing order and adds the rows of dout whose id
// it owns. Threads own columns, so no two threads touch one element and each
// element's sum runs in increasing i, like the host's.
template <typename Id>
__global__ void embeddingBackwardKernel(int64_t count, int64_t vocab,
                                        int64_t hidden, const Id *ids,
                                        const float *dout, float *dtable,
                                        unsigned *fault, unsigned tag) {
  __shared__ int64_t tile[kIdTile];
  int64_t first = static_cast<int64_t>(blockIdx.x) * kRowsPerBlock;
  int64_t last = detail::imin(vocab, first + kRowsPerBlock);
  for (int64_t e = first * hidden + threadIdx.x; e < last * hidden;
       e += blockDim.x)
    dtable[e] = 0.0f;
  for (int64_t base = 0; base < count; base += kIdTile) {
    int64_t here = detail::imin(kIdTile, count - base);
    __syncthreads();
    for (int64_t t = threadIdx.x; t < here; t += blockDim.x)
      tile[t] = static_cast<int64_t>(ids[base + t]);
    __syncthreads();
    for (int64_t t = 0; t < here; ++t) {
      int64_t id = tile[t];
      if (id < 0 || id >= vocab) {
        if (blockIdx.x == 0 && threadIdx.x == 0)
          detail::raiseFault(fault, tag);
        continue;
      }
      if (id < first || id >= last)
        continue;
      float *row = dtable + id * hidden;
      const float *src = dout + (base + t) * hidden;
      for (int64_t j = threadIdx.x; j < hidden; j += blockDim.x)
        row[j] += src[j];
    }
  }
}

} // namespace

template <typename Id>
void embeddingForward(cudaStream_t stream, int64_t count, int64_t vocab,
                      int64_t hidden, const float *table, const Id *ids,
                      float *out, unsigned *fault, unsigned tag) {
  if (count * hidden > 0)
    embeddingForwardKernel<Id>
        <<<detail::blocksFor(count * hidden), detail::kThreads, 0, stream>>>(
            count, vocab, hidden, table, ids, out, fault, tag);
}

template <typename Id>
void embeddingBackward(cudaStream_t stream, int64_t count, int64_t vocab,
                       int64_t hidden, const Id *ids, const float *dout,
                       float *dtable, unsigned *fault, unsigned tag) {
  if (vocab * hidden <= 0)
    return;
  unsigned blocks =
      static_cast<unsigned>((vocab + kRowsPerBlock - 1) / kRowsPerBlock);
  embeddingBackwardKernel<Id><<<blocks, detail::kThreads, 0, stream>>>(
      count, vocab, hidden, ids, dout, dtable, fault, tag);
}

#define MTRT_INSTANTIATE(Id)                                                   \
  template void embeddingForward<Id>(cudaStream_t, int64_t, int64_t, int64_t, \
                                     const float *, const Id *, float *,      \
                                     unsigned *, unsigned);                    \
  template void embeddingBackward<Id>(cudaStream_t, int64_t, int64_t,         \
                                      int64_t, const Id *, const float *,     \
                                      float *, unsigned *, unsigned);
MTRT_CUDA_INSTANTIATE_ID_TYPES(MTRT_INSTANTIATE)
#undef MTRT_INSTANTIATE

} // namespace mtrt::cuda
