// Embedding lookup and its deterministic scatter-add backward: the rows
// written and the gradient read in fp32 or bf16, the table and its gradient
// in fp32.
#include "core/Error.h"
#include "core/OpScratch.h"
#include "cuda/kernels/KernelSupport.cuh"

#include <cub/device/device_radix_sort.cuh>

namespace mtrt::cuda {

namespace {

// The table holds rows [start, start + vocab) of a vocabulary of `total`
// ids (start 0 and total vocab unless the vocabulary is split over ranks):
// ids of other ranks' rows give zeros, ids outside the vocabulary a fault.
template <typename Id>
__global__ void embeddingForwardKernel(int64_t count, int64_t vocab,
                                       int64_t start, int64_t total,
                                       int64_t hidden, const float *table,
                                       const Id *ids, OutElements out,
                                       unsigned *fault, unsigned tag) {
  MTRT_GRID_STRIDE(e, count * hidden) {
    int64_t i = e / hidden, j = e % hidden;
    int64_t id = static_cast<int64_t>(ids[i]);
    if (id < 0 || id >= total) {
      detail::raiseFault(fault, tag);
      detail::store(out, e, 0.0f);
    } else if (id < start || id >= start + vocab) {
      detail::store(out, e, 0.0f);
    } else {
      detail::store(out, e, table[(id - start) * hidden + j]);
    }
  }
}

// Positions 0..count-1, the values the sort carries along with the ids.
__global__ void iotaKernel(int64_t count, int64_t *positions) {
  MTRT_GRID_STRIDE(i, count) { positions[i] = i; }
}

/// Rows summed per batch of loads: the loads of a batch are in flight
/// together, the adds stay in increasing position.
constexpr int kRunBatch = 8;

// One block per sorted position; the block whose position starts a run of
// equal ids adds the run's dout rows into the id's table row (the table
// holds rows [tableStart, tableStart + vocab) of `total`; other rows are
// skipped, ids outside the vocabulary raise the fault), in increasing
// position (the stable sort keeps that order), as the host does. Threads own
// columns, so no two threads touch one element. Runs of frequent ids are
// long (thousands of positions): the block finds the run's end together, and
// each thread issues its loads in batches, so the block waits on memory once
// per batch rather than once per row.
template <typename Id>
__global__ void __launch_bounds__(1024) embeddingRunSumKernel(int64_t count, int64_t vocab,
                                      int64_t tableStart, int64_t total,
                                      int64_t hidden, const Id *sortedIds,
                                      const int64_t *positions,
                                      InElements dout, float *dtable,
                                      unsigned *fault, unsigned tag) {
  __shared__ unsigned long long runEnd;
  int64_t start = blockIdx.x;
  Id id = sortedIds[start];
  if (start > 0 && sortedIds[start - 1] == id)
    return;
  if (id < 0 || static_cast<int64_t>(id) >= total) {
    if (threadIdx.x == 0)
      detail::raiseFault(fault, tag);
    return;
  }
  if (static_cast<int64_t>(id) < tableStart ||
      static_cast<int64_t>(id) >= tableStart + vocab)
    return; // another rank's row
  // The run ends at the first position holding another id (ids are sorted).
  if (threadIdx.x == 0)
    runEnd = static_cast<unsigned long long>(count);
  __syncthreads();
  for (int64_t base = start + 1; base < count; base += blockDim.x) {
    int64_t k = base + threadIdx.x;
    if (k < count && sortedIds[k] != id)
      atomicMin(&runEnd, static_cast<unsigned long long>(k));
    __syncthreads();
    bool found = runEnd < static_cast<unsigned long long>(count);
    __syncthreads();
    if (found)
      break;
  }
  int64_t end = static_cast<int64_t>(runEnd);
  float *row = dtable + (static_cast<int64_t>(id) - tableStart) * hidden;
  for (int64_t j = threadIdx.x; j < hidden; j += blockDim.x) {
    float sum = 0.0f;
    int64_t i = start;
    for (; i + kRunBatch <= end; i += kRunBatch) {
      float rows[kRunBatch];
#pragma unroll
      for (int b = 0; b < kRunBatch; ++b)
        rows[b] = detail::load(dout, positions[i + b] * hidden + j);
#pragma unroll
      for (int b = 0; b < kRunBatch; ++b)
        sum += rows[b];
    }
    for (; i < end; ++i)
      sum += detail::load(dout, positions[i] * hidden + j);
    row[j] = sum;
  }
}

/// The pieces of the backward's scratch: sorted ids, positions before and
/// after the sort, CUB's temporary storage.
template <typename Id> struct SortScratch {
  Id *sortedIds;
  int64_t *positions, *sortedPositions;
  void *temp;
  size_t tempBytes;
};

size_t roundUp256(size_t bytes) { return (bytes + 255) / 256 * 256; }

template <typename Id> size_t sortTempBytes(int64_t count) {
  size_t bytes = 0;
  cub::DeviceRadixSort::SortPairs(nullptr, bytes, static_cast<Id *>(nullptr),
                                  static_cast<Id *>(nullptr),
                                  static_cast<int64_t *>(nullptr),
                                  static_cast<int64_t *>(nullptr),
                                  static_cast<int>(count));
  return bytes;
}

template <typename Id>
SortScratch<Id> carveSortScratch(void *scratch, int64_t count) {
  auto *base = static_cast<char *>(scratch);
  SortScratch<Id> s{};
  s.sortedIds = reinterpret_cast<Id *>(base);
  base += roundUp256(sizeof(Id) * static_cast<size_t>(count));
  s.positions = reinterpret_cast<int64_t *>(base);
  base += roundUp256(sizeof(int64_t) * static_cast<size_t>(count));
  s.sortedPositions = reinterpret_cast<int64_t *>(base);
  base += roundUp256(sizeof(int64_t) * static_cast<size_t>(count));
  s.temp = base;
  s.tempBytes = sortTempBytes<Id>(count);
  // The plan bounds CUB's storage (core/OpScratch.h); a CUB that asks for
  // more would write past the block.
  uint64_t bound = mtrt::scratch::embeddingSortBoundBytes(
      count, sizeof(Id) == sizeof(int64_t));
  if (s.tempBytes > bound)
    throw Error(MTRT_STATUS_INTERNAL,
                "embedding_grad: CUB's radix sort of " +
                    std::to_string(count) + " ids needs " +
                    std::to_string(s.tempBytes) +
                    " bytes of temporary storage, over the " +
                    std::to_string(bound) +
                    " the memory plan gives it (core/OpScratch.h, "
                    "embeddingSortBoundBytes); raise the bound there and "
                    "recompile the bundle");
  return s;
}

} // namespace

template <typename Id>
void vocabEmbeddingForward(cudaStream_t stream, int64_t count, int64_t vocab,
                           int64_t hidden, int64_t start, int64_t total,
                           const float *table, const Id *ids, OutElements out,
                           unsigned *fault, unsigned tag) {
  if (count * hidden > 0)
    embeddingForwardKernel<Id>
        <<<detail::blocksFor(count * hidden), detail::kThreads, 0, stream>>>(
            count, vocab, start, total, hidden, table, ids, out, fault, tag);
}

template <typename Id>
void embeddingForward(cudaStream_t stream, int64_t count, int64_t vocab,
                      int64_t hidden, const float *table, const Id *ids,
                      OutElements out, unsigned *fault, unsigned tag) {
  vocabEmbeddingForward<Id>(stream, count, vocab, hidden, 0, vocab, table, ids,
                            out, fault, tag);
}

size_t embeddingBackwardScratchBytes(int64_t count, bool wideIds) {
  return mtrt::scratch::embeddingGradOpBytes(count, wideIds);
}

template <typename Id>
void vocabEmbeddingBackward(cudaStream_t stream, int64_t count, int64_t vocab,
                            int64_t hidden, int64_t start, int64_t total,
                            const Id *ids, InElements dout, float *dtable,
                            void *scratch, unsigned *fault, unsigned tag) {
  if (vocab * hidden <= 0)
    return;
  if (cudaMemsetAsync(dtable, 0,
                      sizeof(float) * static_cast<size_t>(vocab * hidden),
                      stream) != cudaSuccess || count <= 0)
    return; // the caller's cudaGetLastError() reports a failed memset
  SortScratch<Id> s = carveSortScratch<Id>(scratch, count);
  iotaKernel<<<detail::blocksFor(count), detail::kThreads, 0, stream>>>(
      count, s.positions);
  size_t tempBytes = s.tempBytes;
  if (cub::DeviceRadixSort::SortPairs(s.temp, tempBytes, ids, s.sortedIds,
                                      s.positions, s.sortedPositions,
                                      static_cast<int>(count), 0,
                                      static_cast<int>(8 * sizeof(Id)),
                                      stream) != cudaSuccess)
    return;
  // A thread per column (up to 1024), so that a long run's rows are read
  // in one pass.
  int threads = static_cast<int>(std::clamp<int64_t>(
      (hidden + detail::kWarp - 1) / detail::kWarp * detail::kWarp,
      detail::kWarp, 1024));
  embeddingRunSumKernel<Id>
      <<<static_cast<unsigned>(count), threads, 0, stream>>>(
          count, vocab, start, total, hidden, s.sortedIds, s.sortedPositions,
          dout, dtable, fault, tag);
}

template <typename Id>
void embeddingBackward(cudaStream_t stream, int64_t count, int64_t vocab,
                       int64_t hidden, const Id *ids, InElements dout,
                       float *dtable, void *scratch, unsigned *fault,
                       unsigned tag) {
  vocabEmbeddingBackward<Id>(stream, count, vocab, hidden, 0, vocab, ids, dout,
                             dtable, scratch, fault, tag);
}

#define MTRT_INSTANTIATE(Id)                                                   \
  template void embeddingForward<Id>(cudaStream_t, int64_t, int64_t, int64_t, \
                                     const float *, const Id *, OutElements,  \
                                     unsigned *, unsigned);                    \
  template void embeddingBackward<Id>(cudaStream_t, int64_t, int64_t,         \
                                      int64_t, const Id *, InElements,        \
                                      float *, void *, unsigned *, unsigned);  \
  template void vocabEmbeddingForward<Id>(                                     \
      cudaStream_t, int64_t, int64_t, int64_t, int64_t, int64_t,               \
      const float *, const Id *, OutElements, unsigned *, unsigned);           \
  template void vocabEmbeddingBackward<Id>(                                    \
      cudaStream_t, int64_t, int64_t, int64_t, int64_t, int64_t, const Id *,   \
      InElements, float *, void *, unsigned *, unsigned);
MTRT_CUDA_INSTANTIATE_ID_TYPES(MTRT_INSTANTIATE)
#undef MTRT_INSTANTIATE

} // namespace mtrt::cuda
