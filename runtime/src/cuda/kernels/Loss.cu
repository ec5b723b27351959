// Softmax cross-entropy against integer labels, forward and backward, on
// logits and gradients held in float or bf16, and linear_cross_entropy's
// per-chunk statistics and gradients (in place of the chunk's logits, float
// or bf16). Each row is one block: chunks of 8 elements (16-byte loads of
// bf16, two of float) with a running max and sum of exponentials per thread
// in float, the threads' pairs merged in double; the row's logsumexp is
// kept in double as on the host.
#include "core/OpScratch.h"
#include "cuda/kernels/KernelSupport.cuh"

namespace mtrt::cuda {

namespace {

constexpr int kRowThreads = 256;
constexpr int kReduceThreads = 1024;
/// Elements of one vector access: 16 bytes of bf16, 32 of float.
constexpr int kChunk = 8;
constexpr float kLog2e = 1.4426950408889634f;

/// 2^x (the special function unit, relative error about 2^-22; tiny results
/// flush to zero, which a sum of exponentials does not miss).
__device__ inline float exp2Approx(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
  return y;
}

__device__ inline float toFloat(float x) { return x; }
__device__ inline float toFloat(__nv_bfloat16 x) { return __bfloat162float(x); }

__device__ inline void storeElement(float *p, float x) { *p = x; }
__device__ inline void storeElement(__nv_bfloat16 *p, float x) {
  *p = __float2bfloat16_rn(x);
}

/// Eight elements from p (aligned to a chunk: 16 bytes of bf16, 32 of float).
__device__ inline void loadChunk(const float *p, float (&x)[kChunk]) {
  float4 a = reinterpret_cast<const float4 *>(p)[0];
  float4 b = reinterpret_cast<const float4 *>(p)[1];
  x[0] = a.x, x[1] = a.y, x[2] = a.z, x[3] = a.w;
  x[4] = b.x, x[5] = b.y, x[6] = b.z, x[7] = b.w;
}
__device__ inline void loadChunk(const __nv_bfloat16 *p, float (&x)[kChunk]) {
  uint4 u = *reinterpret_cast<const uint4 *>(p);
  unsigned words[4] = {u.x, u.y, u.z, u.w};
#pragma unroll
  for (int i = 0; i < 4; ++i) { // element 2i in the low half
    x[2 * i] = __uint_as_float(words[i] << 16);
    x[2 * i + 1] = __uint_as_float(words[i] & 0xffff0000u);
  }
}

__device__ inline void storeChunk(float *p, const float (&x)[kChunk]) {
  reinterpret_cast<float4 *>(p)[0] = make_float4(x[0], x[1], x[2], x[3]);
  reinterpret_cast<float4 *>(p)[1] = make_float4(x[4], x[5], x[6], x[7]);
}
__device__ inline void storeChunk(__nv_bfloat16 *p, const float (&x)[kChunk]) {
  unsigned words[4];
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    __nv_bfloat162 pair = __floats2bfloat162_rn(x[2 * i], x[2 * i + 1]);
    words[i] = *reinterpret_cast<unsigned *>(&pair);
  }
  *reinterpret_cast<uint4 *>(p) =
      make_uint4(words[0], words[1], words[2], words[3]);
}

/// A row's elements [0, head) and [body, vocab) are visited one by one, the
/// elements between in chunks that start at a multiple of kChunk of the
/// whole array (16-byte aligned when the array is). Without `vectorized`,
/// every element is visited one by one.
struct RowSplit {
  int64_t head;
  int64_t body;
};

__device__ inline RowSplit splitRow(int64_t row, int64_t vocab,
                                    bool vectorized) {
  if (!vectorized)
    return {vocab, vocab};
  int64_t head = detail::imin(vocab, (kChunk - row * vocab % kChunk) % kChunk);
  return {head, head + (vocab - head) / kChunk * kChunk};
}

/// A thread's running maximum of its elements and sum of exp(x - max).
struct RunningSum {
  float max = -INFINITY;
  float sum = 0;

  /// Adds elements whose largest is `largest`.
  template <int N> __device__ void add(const float (&x)[N], float largest) {
    if (largest > max) {
      sum =
          max == -INFINITY ? 0.0f : sum * exp2Approx((max - largest) * kLog2e);
      max = largest;
    }
    if (max == -INFINITY)
      return; // every element so far is -inf
#pragma unroll
    for (int i = 0; i < N; ++i)
      sum += exp2Approx((x[i] - max) * kLog2e);
  }
};

/// A row's largest element and the log of its sum of exp(x - max).
struct RowStatistics {
  double max;
  double logSum;
  __device__ double logSumExp() const { return max + logSum; }
};

/// The row's statistics over the block, returned to every thread: each
/// thread's running sum over its elements, then the block's maximum and the
/// threads' sums rescaled to it and added in double. Starts and ends with a
/// barrier.
template <typename T>
__device__ RowStatistics rowStatistics(const T *row, int64_t r, int64_t vocab,
                                       bool vectorized) {
  __shared__ float maxes[kRowThreads / detail::kWarp];
  __shared__ double sums[kRowThreads / detail::kWarp];
  RowSplit split = splitRow(r, vocab, vectorized);
  RunningSum running;
  for (int64_t v = threadIdx.x; v < split.head; v += blockDim.x) {
    float x[1] = {toFloat(row[v])};
    running.add(x, x[0]);
  }
  for (int64_t v = split.body + threadIdx.x; v < vocab; v += blockDim.x) {
    float x[1] = {toFloat(row[v])};
    running.add(x, x[0]);
  }
  // Two chunks in flight per thread.
  int64_t stride = static_cast<int64_t>(blockDim.x) * kChunk;
  for (int64_t v = split.head + threadIdx.x * kChunk; v < split.body;
       v += 2 * stride) {
    float a[kChunk], b[kChunk];
    bool second = v + stride < split.body;
    loadChunk(row + v, a);
    if (second)
      loadChunk(row + v + stride, b);
    float largest = a[0];
#pragma unroll
    for (int i = 1; i < kChunk; ++i)
      largest = fmaxf(largest, a[i]);
    running.add(a, largest);
    if (second) {
      largest = b[0];
#pragma unroll
      for (int i = 1; i < kChunk; ++i)
        largest = fmaxf(largest, b[i]);
      running.add(b, largest);
    }
  }
  float rowMax = detail::blockMax(running.max, maxes);
  double part = running.max == -INFINITY
                    ? 0.0
                    : static_cast<double>(running.sum) *
                          exp(static_cast<double>(running.max) -
                              static_cast<double>(rowMax));
  double total = detail::blockSum(part, sums);
  __syncthreads(); // the arrays are reused by the next call
  return {static_cast<double>(rowMax), log(total)};
}

/// rowLoss[r] = logsumexp(row) - row[label] (0 for ignored or bad labels);
/// with `lossPerRow`, also loss[r] = float(rowLoss[r]); with `rowLse`, also
/// the row's logsumexp (for the gradient).
template <typename T, typename Id>
__global__ void __launch_bounds__(kRowThreads)
    crossEntropyRowsKernel(int64_t vocab, const T *logits, const Id *labels,
                           int64_t ignoreIndex, bool vectorized,
                           double *rowLoss, float *lossPerRow, double *rowLse,
                           unsigned *fault, unsigned tag) {
  int64_t r = blockIdx.x;
  int64_t label = static_cast<int64_t>(labels[r]);
  double value = 0;
  if (label != ignoreIndex) { // the same branch for the whole block
    if (label < 0 || label >= vocab) {
      if (threadIdx.x == 0)
        detail::raiseFault(fault, tag);
    } else {
      const T *row = logits + r * vocab;
      RowStatistics s = rowStatistics(row, r, vocab, vectorized);
      // As the host: log(sum) - (target - max), that difference in float.
      value = s.logSum - static_cast<double>(static_cast<float>(
                             static_cast<double>(toFloat(row[label])) - s.max));
      if (rowLse && threadIdx.x == 0)
        rowLse[r] = s.logSumExp();
    }
  }
  if (threadIdx.x == 0) {
    rowLoss[r] = value;
    if (lossPerRow)
      lossPerRow[r] = static_cast<float>(value);
  }
}

/// One block: loss[0] = the sum (or mean over labelled rows) of rowLoss.
template <typename Id>
__global__ void
crossEntropyReduceKernel(int64_t rows, const Id *labels, int64_t ignoreIndex,
                         const double *rowLoss, bool mean, float *loss) {
  __shared__ double shared[kReduceThreads / detail::kWarp];
  double total = 0, count = 0;
  for (int64_t r = threadIdx.x; r < rows; r += blockDim.x) {
    total += rowLoss[r];
    count += static_cast<int64_t>(labels[r]) != ignoreIndex ? 1.0 : 0.0;
  }
  total = detail::blockSum(total, shared);
  count = detail::blockSum(count, shared);
  if (threadIdx.x == 0) {
    if (mean)
      total = count > 0 ? total / count : 0.0;
    loss[0] = static_cast<float>(total);
  }
}

/// One block: *shared = dloss[0] (sum) or dloss[0] / labelled rows (mean).
template <typename Id>
__global__ void crossEntropySharedGradKernel(int64_t rows, const Id *labels,
                                             int64_t ignoreIndex, bool mean,
                                             const float *dloss,
                                             double *sharedGrad) {
  __shared__ double shared[kReduceThreads / detail::kWarp];
  double count = 0;
  for (int64_t r = threadIdx.x; r < rows; r += blockDim.x)
    count += static_cast<int64_t>(labels[r]) != ignoreIndex ? 1.0 : 0.0;
  count = detail::blockSum(count, shared);
  if (threadIdx.x == 0) {
    double g = static_cast<double>(dloss[0]);
    if (mean)
      g = count > 0 ? g / count : 0.0;
    *sharedGrad = g;
  }
}

/// dlogits[v] = g * softmax(row)[v] - (v == label ? g : 0), with g the row's
/// share of dloss; zeros for ignored or bad labels.
template <typename T, typename G, typename Id>
__global__ void __launch_bounds__(kRowThreads)
    crossEntropyBackwardKernel(int64_t vocab, const T *logits, const Id *labels,
                               int64_t ignoreIndex, bool vectorized,
                               const float *dlossPerRow,
                               const double *sharedGrad, const double *rowLse,
                               G *dlogits, unsigned *fault, unsigned tag) {
  int64_t r = blockIdx.x;
  const T *row = logits + r * vocab;
  G *out = dlogits + r * vocab;
  int64_t label = static_cast<int64_t>(labels[r]);
  bool bad = label != ignoreIndex && (label < 0 || label >= vocab);
  if (bad && threadIdx.x == 0)
    detail::raiseFault(fault, tag);
  // The logsumexp as high and low floats: x - high - low keeps double's
  // precision where it matters (x near the logsumexp).
  float g = 0, lseHigh = 0, lseLow = 0;
  if (label != ignoreIndex && !bad) { // the same branch for the whole block
    g = static_cast<float>(dlossPerRow ? static_cast<double>(dlossPerRow[r])
                                       : *sharedGrad);
    double lse = rowLse ? rowLse[r]
                        : rowStatistics(row, r, vocab, vectorized).logSumExp();
    lseHigh = static_cast<float>(lse);
    lseLow = static_cast<float>(lse - static_cast<double>(lseHigh));
  } else {
    label = -1; // no element is the label; g = 0 writes zeros
  }
  auto gradient = [&](float x, int64_t v) {
    float value =
        g == 0 ? 0.0f : g * exp2Approx((x - lseHigh - lseLow) * kLog2e);
    return v == label ? value - g : value;
  };
  RowSplit split = splitRow(r, vocab, vectorized);
  for (int64_t v = threadIdx.x; v < split.head; v += blockDim.x)
    storeElement(out + v, gradient(toFloat(row[v]), v));
  for (int64_t v = split.body + threadIdx.x; v < vocab; v += blockDim.x)
    storeElement(out + v, gradient(toFloat(row[v]), v));
  int64_t stride = static_cast<int64_t>(blockDim.x) * kChunk;
  for (int64_t v = split.head + threadIdx.x * kChunk; v < split.body;
       v += 2 * stride) {
    float a[kChunk], b[kChunk];
    bool second = v + stride < split.body;
    loadChunk(row + v, a);
    if (second)
      loadChunk(row + v + stride, b);
#pragma unroll
    for (int i = 0; i < kChunk; ++i)
      a[i] = gradient(a[i], v + i);
    storeChunk(out + v, a);
    if (second) {
#pragma unroll
      for (int i = 0; i < kChunk; ++i)
        b[i] = gradient(b[i], v + stride + i);
      storeChunk(out + v + stride, b);
    }
  }
}

/// linear_cross_entropy's state after a chunk's row losses: the share of
/// the loss gradient (one) each labelled row gets, the labelled rows' count
/// and the running total of the losses.
struct FusedLossState {
  double share;
  double count;
  double total;
};

/// One block: the state before the first chunk; share is 1 / count for
/// mean (0 without a labelled row), 1 for sum, as the host's.
template <typename Id>
__global__ void linearCrossEntropyStartKernel(int64_t rows, const Id *labels,
                                              int64_t ignoreIndex, bool mean,
                                              FusedLossState *state) {
  __shared__ double shared[kReduceThreads / detail::kWarp];
  double count = 0;
  for (int64_t r = threadIdx.x; r < rows; r += blockDim.x)
    count += static_cast<int64_t>(labels[r]) != ignoreIndex ? 1.0 : 0.0;
  count = detail::blockSum(count, shared);
  if (threadIdx.x == 0) {
    state->share = mean ? (count > 0 ? 1.0 / count : 0.0) : 1.0;
    state->count = count;
    state->total = 0;
  }
}

/// One block a row of the chunk's logits (float or bf16), in place: the
/// row's loss into rowLoss[r] as crossEntropyRowsKernel computes it, then
/// the row's gradient for a loss gradient of one, share * (softmax -
/// onehot) as crossEntropyBackwardKernel computes it, in the logits' type;
/// zeros for ignored or bad labels.
template <typename T, typename Id>
__global__ void __launch_bounds__(kRowThreads)
    linearCrossEntropyRowsKernel(int64_t vocab, T *logits, const Id *labels,
                                 int64_t ignoreIndex, bool vectorized,
                                 const FusedLossState *state, double *rowLoss,
                                 unsigned *fault, unsigned tag) {
  int64_t r = blockIdx.x;
  T *row = logits + r * vocab;
  int64_t label = static_cast<int64_t>(labels[r]);
  bool bad = label != ignoreIndex && (label < 0 || label >= vocab);
  if (bad && threadIdx.x == 0)
    detail::raiseFault(fault, tag);
  double value = 0;
  float g = 0, lseHigh = 0, lseLow = 0;
  if (label != ignoreIndex && !bad) { // the same branch for the whole block
    // Read before rowStatistics' barriers: no thread writes the row until
    // every thread is past them.
    float target = toFloat(row[label]);
    RowStatistics s = rowStatistics(row, r, vocab, vectorized);
    value = s.logSum -
            static_cast<double>(static_cast<float>(
                static_cast<double>(target) - s.max));
    g = static_cast<float>(state->share);
    double lse = s.logSumExp();
    lseHigh = static_cast<float>(lse);
    lseLow = static_cast<float>(lse - static_cast<double>(lseHigh));
  } else {
    label = -1; // no element is the label; g = 0 writes zeros
  }
  if (threadIdx.x == 0)
    rowLoss[r] = value;
  auto gradient = [&](float x, int64_t v) {
    float p = g == 0 ? 0.0f : g * exp2Approx((x - lseHigh - lseLow) * kLog2e);
    return v == label ? p - g : p;
  };
  // Each thread writes the elements it read. The body's chunks go last to
  // first: rowStatistics read them first to last, so the row's end is the
  // part still in L2.
  RowSplit split = splitRow(r, vocab, vectorized);
  for (int64_t v = threadIdx.x; v < split.head; v += blockDim.x)
    storeElement(row + v, gradient(toFloat(row[v]), v));
  for (int64_t v = split.body + threadIdx.x; v < vocab; v += blockDim.x)
    storeElement(row + v, gradient(toFloat(row[v]), v));
  int64_t stride = static_cast<int64_t>(blockDim.x) * kChunk;
  int64_t first = split.head + threadIdx.x * kChunk;
  int64_t last = first < split.body
                     ? first + (split.body - 1 - first) / stride * stride
                     : first - stride;
  for (int64_t v = last; v >= first; v -= stride) {
    float a[kChunk];
    loadChunk(row + v, a);
#pragma unroll
    for (int i = 0; i < kChunk; ++i)
      a[i] = gradient(a[i], v + i);
    storeChunk(row + v, a);
  }
}

/// One block: state->total += the chunk's row losses (in double, in the
/// block's fixed order).
__global__ void linearCrossEntropyAddKernel(int64_t rows,
                                            const double *rowLoss,
                                            FusedLossState *state) {
  __shared__ double shared[kReduceThreads / detail::kWarp];
  double total = 0;
  for (int64_t r = threadIdx.x; r < rows; r += blockDim.x)
    total += rowLoss[r];
  total = detail::blockSum(total, shared);
  if (threadIdx.x == 0)
    state->total += total;
}

/// One thread: loss[0] = the total, over the labelled rows for mean.
__global__ void linearCrossEntropyFinishKernel(const FusedLossState *state,
                                               bool mean, float *loss) {
  double total = state->total;
  if (mean)
    total = state->count > 0 ? total / state->count : 0.0;
  loss[0] = static_cast<float>(total);
}

bool chunkAligned(const void *p) {
  return reinterpret_cast<uintptr_t>(p) % 16 == 0;
}

} // namespace

size_t crossEntropyScratchBytes(int64_t rows) {
  return mtrt::scratch::crossEntropyPartialBytes(rows);
}

size_t crossEntropySavedBytes(int64_t rows) {
  return mtrt::scratch::crossEntropySavedBytes(rows);
}

template <typename T, typename Id>
void crossEntropyForward(cudaStream_t stream, int64_t rows, int64_t vocab,
                         const T *logits, const Id *labels, int64_t ignoreIndex,
                         LossReduction reduction, float *loss, void *scratch,
                         double *saved, unsigned *fault, unsigned tag) {
  auto *rowLoss = static_cast<double *>(scratch);
  bool perRow = reduction == LossReduction::None;
  if (rows > 0)
    crossEntropyRowsKernel<T, Id>
        <<<static_cast<unsigned>(rows), kRowThreads, 0, stream>>>(
            vocab, logits, labels, ignoreIndex, chunkAligned(logits), rowLoss,
            perRow ? loss : nullptr, saved, fault, tag);
  if (!perRow)
    crossEntropyReduceKernel<Id><<<1, kReduceThreads, 0, stream>>>(
        rows, labels, ignoreIndex, rowLoss, reduction == LossReduction::Mean,
        loss);
}

template <typename T, typename G, typename Id>
void crossEntropyBackward(cudaStream_t stream, int64_t rows, int64_t vocab,
                          const T *logits, const Id *labels,
                          int64_t ignoreIndex, LossReduction reduction,
                          const float *dloss, G *dlogits, void *scratch,
                          const double *saved, unsigned *fault, unsigned tag) {
  auto *sharedGrad = static_cast<double *>(scratch);
  bool perRow = reduction == LossReduction::None;
  if (!perRow)
    crossEntropySharedGradKernel<Id><<<1, kReduceThreads, 0, stream>>>(
        rows, labels, ignoreIndex, reduction == LossReduction::Mean, dloss,
        sharedGrad);
  if (rows > 0)
    crossEntropyBackwardKernel<T, G, Id>
        <<<static_cast<unsigned>(rows), kRowThreads, 0, stream>>>(
            vocab, logits, labels, ignoreIndex,
            chunkAligned(logits) && chunkAligned(dlogits),
            perRow ? dloss : nullptr, sharedGrad, saved, dlogits, fault, tag);
}

template <typename Id>
void linearCrossEntropyStart(cudaStream_t stream, int64_t rows,
                             const Id *labels, int64_t ignoreIndex,
                             LossReduction reduction, double *state) {
  linearCrossEntropyStartKernel<Id><<<1, kReduceThreads, 0, stream>>>(
      rows, labels, ignoreIndex, reduction == LossReduction::Mean,
      reinterpret_cast<FusedLossState *>(state));
}

template <typename T, typename Id>
void linearCrossEntropyChunk(cudaStream_t stream, int64_t rows, int64_t vocab,
                             T *logits, const Id *labels, int64_t ignoreIndex,
                             double *rowLoss, double *state, unsigned *fault,
                             unsigned tag) {
  if (rows <= 0)
    return;
  auto *s = reinterpret_cast<FusedLossState *>(state);
  linearCrossEntropyRowsKernel<T, Id>
      <<<static_cast<unsigned>(rows), kRowThreads, 0, stream>>>(
          vocab, logits, labels, ignoreIndex, chunkAligned(logits), s, rowLoss,
          fault, tag);
  linearCrossEntropyAddKernel<<<1, kReduceThreads, 0, stream>>>(rows, rowLoss,
                                                                 s);
}

void linearCrossEntropyFinish(cudaStream_t stream, const double *state,
                              LossReduction reduction, float *loss) {
  linearCrossEntropyFinishKernel<<<1, 1, 0, stream>>>(
      reinterpret_cast<const FusedLossState *>(state),
      reduction == LossReduction::Mean, loss);
}

#define MTRT_INSTANTIATE_FUSED(Id)                                             \
  template void linearCrossEntropyStart<Id>(cudaStream_t, int64_t, const Id *, \
                                            int64_t, LossReduction, double *); \
  template void linearCrossEntropyChunk<float, Id>(                            \
      cudaStream_t, int64_t, int64_t, float *, const Id *, int64_t, double *,  \
      double *, unsigned *, unsigned);                                         \
  template void linearCrossEntropyChunk<__nv_bfloat16, Id>(                    \
      cudaStream_t, int64_t, int64_t, __nv_bfloat16 *, const Id *, int64_t,    \
      double *, double *, unsigned *, unsigned);
MTRT_CUDA_INSTANTIATE_ID_TYPES(MTRT_INSTANTIATE_FUSED)
#undef MTRT_INSTANTIATE_FUSED

#define MTRT_INSTANTIATE_BACKWARD(T, G, Id)                                    \
  template void crossEntropyBackward<T, G, Id>(                                \
      cudaStream_t, int64_t, int64_t, const T *, const Id *, int64_t,          \
      LossReduction, const float *, G *, void *, const double *, unsigned *,   \
      unsigned);
#define MTRT_INSTANTIATE_LOGITS(T, Id)                                         \
  template void crossEntropyForward<T, Id>(                                    \
      cudaStream_t, int64_t, int64_t, const T *, const Id *, int64_t,          \
      LossReduction, float *, void *, double *, unsigned *, unsigned);         \
  MTRT_INSTANTIATE_BACKWARD(T, float, Id)                                      \
  MTRT_INSTANTIATE_BACKWARD(T, __nv_bfloat16, Id)
#define MTRT_INSTANTIATE(Id)                                                   \
  MTRT_INSTANTIATE_LOGITS(float, Id)                                           \
  MTRT_INSTANTIATE_LOGITS(__nv_bfloat16, Id)
MTRT_CUDA_INSTANTIATE_ID_TYPES(MTRT_INSTANTIATE)
#undef MTRT_INSTANTIATE
#undef MTRT_INSTANTIATE_LOGITS
#undef MTRT_INSTANTIATE_BACKWARD

} // namespace mtrt::cuda
