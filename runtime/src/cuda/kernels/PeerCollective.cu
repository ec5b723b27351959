// Collectives of in-process ranks sharing one GPU: a flag barrier between
// the ranks' streams, and reductions and copies reading the peers' buffers
// in a fixed rank order.
#include "cuda/kernels/KernelSupport.cuh"
#include "cuda/kernels/PeerKernels.h"

#include <cstdio>

namespace mtrt::cuda {

namespace {

using detail::blocksFor;
using detail::kThreads;

__device__ inline unsigned long long
loadAcquire(const unsigned long long *address) {
  unsigned long long value;
  asm volatile("ld.acquire.gpu.global.u64 %0, [%1];"
               : "=l"(value)
               : "l"(address)
               : "memory");
  return value;
}

__device__ inline void storeRelease(unsigned long long *address,
                                    unsigned long long value) {
  asm volatile("st.release.gpu.global.u64 [%0], %1;" ::"l"(address), "l"(value)
               : "memory");
}

__device__ inline unsigned long long nowNanoseconds() {
  unsigned long long now;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(now));
  return now;
}

__global__ void barrierKernel(PeerSlots *slots, int rank, int size,
                              unsigned long long signature,
                              unsigned long long group,
                              unsigned timeoutSeconds) {
  if (threadIdx.x != 0 || blockIdx.x != 0)
    return;
  if (signature)
    slots->signature[rank] = signature;
  unsigned long long arrival = loadAcquire(&slots->phase[rank]) + 1;
  storeRelease(&slots->phase[rank], arrival);
  unsigned long long started = nowNanoseconds();
  unsigned long long limit =
      static_cast<unsigned long long>(timeoutSeconds) * 1000000000ull;
  for (int peer = 0; peer < size; ++peer)
    while (loadAcquire(&slots->phase[peer]) < arrival) {
      if (nowNanoseconds() - started > limit) {
        printf("mtrt peer collective: in-process group %llu: rank %d waited "
               "%u s at barrier %llu for rank %d, which is at barrier %llu; "
               "trapping\n",
               group, rank, timeoutSeconds, arrival, peer,
               loadAcquire(&slots->phase[peer]));
        __trap();
      }
      __nanosleep(256);
    }
  if (!signature)
    return;
  for (int peer = 0; peer < size; ++peer) {
    unsigned long long theirs = __ldcg(&slots->signature[peer]);
    if (theirs != signature) {
      printf("mtrt peer collective: in-process group %llu: rank %d's call "
             "(signature %llx) differs from rank %d's (%llx) at barrier "
             "%llu; trapping\n",
             group, rank, signature, peer, theirs, arrival);
      __trap();
    }
  }
}

/// Element i of a peer buffer, as fp32.
template <PeerElement E>
__device__ inline float loadPeer(const void *buffer, int64_t i) {
  if constexpr (E == PeerElement::F32)
    return __ldcg(static_cast<const float *>(buffer) + i);
  else {
    unsigned short bits =
        __ldcg(static_cast<const unsigned short *>(buffer) + i);
    return __uint_as_float(static_cast<unsigned>(bits) << 16);
  }
}

template <PeerElement E>
__device__ inline void store(void *out, int64_t i, float x) {
  if constexpr (E == PeerElement::F32)
    static_cast<float *>(out)[i] = x;
  else
    static_cast<__nv_bfloat16 *>(out)[i] = __float2bfloat16_rn(x);
}

/// The balanced rank tree of comm/FixedOrderReduce.h: [lo, hi) is [lo, mid)
/// plus [mid, hi), mid = lo + ceil((hi - lo) / 2).
__device__ float treeSum(const float *values, int lo, int hi) {
  if (hi - lo == 1)
    return values[lo];
  int mid = lo + (hi - lo + 1) / 2;
  float left = treeSum(values, lo, mid);
  float right = treeSum(values, mid, hi);
  return left + right;
}

template <PeerElement E>
__global__ void reduceKernel(PeerPointers ranks, int size, bool max,
                             int64_t offset, int64_t count, void *out) {
  MTRT_GRID_STRIDE(i, count) {
    float values[kMaxPeerRanks];
    for (int r = 0; r < size; ++r)
      values[r] = loadPeer<E>(ranks.send[r], offset + i);
    float result;
    if (max) {
      result = values[0];
      for (int r = 1; r < size; ++r)
        if (values[r] > result || (isnan(values[r]) && !isnan(result)))
          result = values[r];
    } else {
      result = treeSum(values, 0, size);
    }
    store<E>(out, i, result);
  }
}

/// Copies count elements of `E` from `from` (a peer's buffer) to `to`.
template <typename Word>
__device__ inline void copyWords(const Word *from, Word *to, int64_t i) {
  to[i] = __ldcg(from + i);
}

__global__ void gatherChunksKernel(PeerPointers ranks, int rank, int size,
                                   size_t elementBytes, int64_t chunk,
                                   int64_t count, void *out) {
  // Element-wise over all ranks' chunks; the own chunk is skipped.
  MTRT_GRID_STRIDE(i, count) {
    int64_t owner = i / chunk;
    if (owner == rank)
      continue;
    const void *from = ranks.recv[owner];
    if (elementBytes == 4)
      copyWords(static_cast<const unsigned *>(from),
                static_cast<unsigned *>(out), i);
    else
      copyWords(static_cast<const unsigned short *>(from),
                static_cast<unsigned short *>(out), i);
  }
}

__global__ void gatherSendsKernel(PeerPointers ranks, int size,
                                  size_t elementBytes, int64_t count,
                                  void *out) {
  int64_t total = count * size;
  MTRT_GRID_STRIDE(i, total) {
    int64_t owner = i / count, j = i % count;
    const char *from = static_cast<const char *>(ranks.send[owner]);
    char *to = static_cast<char *>(out) + owner * count * elementBytes;
    if (from == to) // in place: the rank's own block
      continue;
    if (elementBytes == 4)
      copyWords(reinterpret_cast<const unsigned *>(from),
                reinterpret_cast<unsigned *>(to), j);
    else
      copyWords(reinterpret_cast<const unsigned short *>(from),
                reinterpret_cast<unsigned short *>(to), j);
  }
}

__global__ void copyFromKernel(PeerPointers ranks, int root,
                               size_t elementBytes, int64_t count, void *out) {
  const void *from = ranks.recv[root];
  if (from == out)
    return;
  MTRT_GRID_STRIDE(i, count) {
    if (elementBytes == 4)
      copyWords(static_cast<const unsigned *>(from),
                static_cast<unsigned *>(out), i);
    else
      copyWords(static_cast<const unsigned short *>(from),
                static_cast<unsigned short *>(out), i);
  }
}

size_t bytesOf(PeerElement element) {
  return element == PeerElement::F32 ? 4 : 2;
}

} // namespace

cudaError_t preloadPeerKernels() {
  cudaFuncAttributes attributes;
  for (const void *kernel :
       {reinterpret_cast<const void *>(&barrierKernel),
        reinterpret_cast<const void *>(&reduceKernel<PeerElement::F32>),
        reinterpret_cast<const void *>(&reduceKernel<PeerElement::BF16>),
        reinterpret_cast<const void *>(&gatherChunksKernel),
        reinterpret_cast<const void *>(&gatherSendsKernel),
        reinterpret_cast<const void *>(&copyFromKernel)})
    if (cudaError_t error = cudaFuncGetAttributes(&attributes, kernel))
      return error;
  return cudaSuccess;
}

void peerBarrier(cudaStream_t stream, PeerSlots *slots, int rank, int size,
                 unsigned long long signature, unsigned long long group,
                 unsigned timeoutSeconds) {
  barrierKernel<<<1, 32, 0, stream>>>(slots, rank, size, signature, group,
                                      timeoutSeconds);
}

void peerReduce(cudaStream_t stream, const PeerPointers &ranks, int size,
                PeerElement element, bool max, int64_t offset, int64_t count,
                void *out) {
  if (count <= 0)
    return;
  if (element == PeerElement::F32)
    reduceKernel<PeerElement::F32><<<blocksFor(count), kThreads, 0, stream>>>(
        ranks, size, max, offset, count, out);
  else
    reduceKernel<PeerElement::BF16><<<blocksFor(count), kThreads, 0, stream>>>(
        ranks, size, max, offset, count, out);
}

void peerGatherChunks(cudaStream_t stream, const PeerPointers &ranks, int rank,
                      int size, PeerElement element, int64_t chunk,
                      int64_t count, void *out) {
  if (count <= 0 || size < 2)
    return;
  gatherChunksKernel<<<blocksFor(count), kThreads, 0, stream>>>(
      ranks, rank, size, bytesOf(element), chunk, count, out);
}

void peerGatherSends(cudaStream_t stream, const PeerPointers &ranks, int size,
                     PeerElement element, int64_t count, void *out) {
  if (count <= 0)
    return;
  gatherSendsKernel<<<blocksFor(count * size), kThreads, 0, stream>>>(
      ranks, size, bytesOf(element), count, out);
}

void peerCopyFrom(cudaStream_t stream, const PeerPointers &ranks, int root,
                  PeerElement element, int64_t count, void *out) {
  if (count <= 0)
    return;
  copyFromKernel<<<blocksFor(count), kThreads, 0, stream>>>(
      ranks, root, bytesOf(element), count, out);
}

} // namespace mtrt::cuda
