// Softmax cross-entropy against integer labels, forward and backward, with
// each row's logsumexp in double as on the host.
#include "cuda/kernels/KernelSupport.cuh"

namespace mtrt::cuda {

namespace {

constexpr int kRowThreads = 256;
constexpr int kReduceThreads = 1024;

/// Merges a running (max, sum of exp(x - max)) pair with another.
__device__ inline void mergeLogSumExp(double &maxValue, double &sum,
                                      double otherMax, double otherSum) {
  if (otherMax == -INFINITY)
    return;
  if (maxValue == -INFINITY) {
    maxValue = otherMax;
    sum = otherSum;
    return;
  }
  double next = fmax(maxValue, otherMax);
  sum = sum * exp(maxValue - next) + otherSum * exp(otherMax - next);
  maxValue = next;
}

/// log(sum(exp(row))) over the block, in double, returned to every thread:
/// one pass over the row (each thread keeps a running max and its sum of
/// exponentials), then the threads' pairs merged through shared memory.
__device__ double rowLogSumExp(const float *row, int64_t vocab,
                               double *shared) {
  __shared__ double maxes[kRowThreads], sums[kRowThreads];
  double maxValue = -INFINITY, sum = 0;
  for (int64_t v = threadIdx.x; v < vocab; v += blockDim.x) {
    double x = static_cast<double>(row[v]);
    if (x > maxValue) {
      sum = (maxValue == -INFINITY ? 0.0 : sum * exp(maxValue - x)) + 1.0;
      maxValue = x;
    } else {
      sum += exp(x - maxValue);
    }
  }
  (void)shared;
  maxes[threadIdx.x] = maxValue;
  sums[threadIdx.x] = sum;
  __syncthreads();
  for (int width = blockDim.x / 2; width > 0; width /= 2) {
    if (threadIdx.x < width) {
      double m = maxes[threadIdx.x], s = sums[threadIdx.x];
      mergeLogSumExp(m, s, maxes[threadIdx.x + width],
                     sums[threadIdx.x + width]);
      maxes[threadIdx.x] = m;
      sums[threadIdx.x] = s;
    }
    __syncthreads();
  }
  double result = maxes[0] + log(sums[0]);
  __syncthreads(); // the arrays are reused by the next row's call
  return result;
}

/// rowLoss[r] = logsumexp(row) - row[label] (0 for ignored or bad labels);
/// with `lossPerRow`, also loss[r] = float(rowLoss[r]); with `rowLse`, also
/// the row's logsumexp (for the gradient).
template <typename Id>
__global__ void crossEntropyRowsKernel(int64_t vocab, const float *logits,
                                       const Id *labels, int64_t ignoreIndex,
                                       double *rowLoss, float *lossPerRow,
                                       double *rowLse, unsigned *fault,
                                       unsigned tag) {
  __shared__ double shared[kRowThreads / detail::kWarp];
  int64_t r = blockIdx.x;
  int64_t label = static_cast<int64_t>(labels[r]);
  double value = 0;
  if (label != ignoreIndex) {
    if (label < 0 || label >= vocab) {
      if (threadIdx.x == 0)
        detail::raiseFault(fault, tag);
    } else {
      const float *row = logits + r * vocab;
      double lse = rowLogSumExp(row, vocab, shared);
      value = lse - static_cast<double>(row[label]);
      if (rowLse && threadIdx.x == 0)
        rowLse[r] = lse;
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
__global__ void crossEntropyReduceKernel(int64_t rows, const Id *labels,
                                         int64_t ignoreIndex,
                                         const double *rowLoss, bool mean,
                                         float *loss) {
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

template <typename Id>
__global__ void crossEntropyBackwardKernel(int64_t vocab, const float *logits,
                                           const Id *labels,
                                           int64_t ignoreIndex,
                                           const float *dlossPerRow,
                                           const double *sharedGrad,
                                           const double *rowLse,
                                           float *dlogits, unsigned *fault,
                                           unsigned tag) {
  __shared__ double shared[kRowThreads / detail::kWarp];
  int64_t r = blockIdx.x;
  float *out = dlogits + r * vocab;
  int64_t label = static_cast<int64_t>(labels[r]);
  bool bad = label != ignoreIndex && (label < 0 || label >= vocab);
  if (label == ignoreIndex || bad) {
    if (bad && threadIdx.x == 0)
      detail::raiseFault(fault, tag);
    for (int64_t v = threadIdx.x; v < vocab; v += blockDim.x)
      out[v] = 0.0f;
    return;
  }
  double g = dlossPerRow ? static_cast<double>(dlossPerRow[r]) : *sharedGrad;
  const float *row = logits + r * vocab;
  double lse = rowLse ? rowLse[r] : rowLogSumExp(row, vocab, shared);
  for (int64_t v = threadIdx.x; v < vocab; v += blockDim.x) {
    double prob = exp(static_cast<double>(row[v]) - lse);
    out[v] = static_cast<float>(g * (v == label ? prob - 1.0 : prob));
  }
}

} // namespace

size_t crossEntropyScratchBytes(int64_t rows) {
  return sizeof(double) * static_cast<size_t>(rows + 1);
}

size_t crossEntropySavedBytes(int64_t rows) {
  return sizeof(double) * static_cast<size_t>(rows);
}

template <typename Id>
void crossEntropyForward(cudaStream_t stream, int64_t rows, int64_t vocab,
                         const float *logits, const Id *labels,
                         int64_t ignoreIndex, LossReduction reduction,
                         float *loss, void *scratch, double *saved,
                         unsigned *fault, unsigned tag) {
  auto *rowLoss = static_cast<double *>(scratch);
  bool perRow = reduction == LossReduction::None;
  if (rows > 0)
    crossEntropyRowsKernel<Id>
        <<<static_cast<unsigned>(rows), kRowThreads, 0, stream>>>(
            vocab, logits, labels, ignoreIndex, rowLoss,
            perRow ? loss : nullptr, saved, fault, tag);
  if (!perRow)
    crossEntropyReduceKernel<Id><<<1, kReduceThreads, 0, stream>>>(
        rows, labels, ignoreIndex, rowLoss,
        reduction == LossReduction::Mean, loss);
}

template <typename Id>
void crossEntropyBackward(cudaStream_t stream, int64_t rows, int64_t vocab,
                          const float *logits, const Id *labels,
                          int64_t ignoreIndex, LossReduction reduction,
                          const float *dloss, float *dlogits, void *scratch,
                          const double *saved, unsigned *fault,
                          unsigned tag) {
  auto *sharedGrad = static_cast<double *>(scratch);
  bool perRow = reduction == LossReduction::None;
  if (!perRow)
    crossEntropySharedGradKernel<Id><<<1, kReduceThreads, 0, stream>>>(
        rows, labels, ignoreIndex, reduction == LossReduction::Mean, dloss,
        sharedGrad);
  if (rows > 0)
    crossEntropyBackwardKernel<Id>
        <<<static_cast<unsigned>(rows), kRowThreads, 0, stream>>>(
            vocab, logits, labels, ignoreIndex, perRow ? dloss : nullptr,
            sharedGrad, saved, dlogits, fault, tag);
}

#define MTRT_INSTANTIATE(Id)                                                   \
  template void crossEntropyForward<Id>(                                       \
      cudaStream_t, int64_t, int64_t, const float *, const Id *, int64_t,      \
      LossReduction, float *, void *, double *, unsigned *, unsigned);         \
  template void crossEntropyBackward<Id>(                                      \
      cudaStream_t, int64_t, int64_t, const float *, const Id *, int64_t,      \
      LossReduction, const float *, float *, void *, const double *,          \
      unsigned *, unsigned);
MTRT_CUDA_INSTANTIATE_ID_TYPES(MTRT_INSTANTIATE)
#undef MTRT_INSTANTIATE

} // namespace mtrt::cuda
