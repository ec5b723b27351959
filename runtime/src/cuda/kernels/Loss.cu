// Softmax cross-entropy against integer labels, forward and backward, with
// each row's logsumexp in double as on the host.
#include "cuda/kernels/KernelSupport.cuh"

namespace mtrt::cuda {

namespace {

constexpr int kRowThreads = 256;
constexpr int kReduceThreads = 1024;

/// log(sum(exp(row))) over the block, in double, returned to every thread.
__device__ double rowLogSumExp(const float *row, int64_t vocab,
                               double *shared) {
  double maxValue = -INFINITY;
  for (int64_t v = threadIdx.x; v < vocab; v += blockDim.x)
    maxValue = fmax(maxValue, static_cast<double>(row[v]));
  maxValue = detail::blockMax(maxValue, shared);
  double sum = 0;
  for (int64_t v = threadIdx.x; v < vocab; v += blockDim.x)
    sum += exp(static_cast<double>(row[v]) - maxValue);
  sum = detail::blockSum(sum, shared);
  return maxValue + log(sum);
}

/// rowLoss[r] = logsumexp(row) - row[label] (0 for ignored or bad labels);
/// with `lossPerRow`, also loss[r] = float(rowLoss[r]).
template <typename Id>
__global__ void crossEntropyRowsKernel(int64_t vocab, const float *logits,
                                       const Id *labels, int64_t ignoreIndex,
                                       double *rowLoss, float *lossPerRow,
                                       unsigned *fault, unsigned tag) {
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
      value = rowLogSumExp(row, vocab, shared) -
              static_cast<double>(row[label]);
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
  double lse = rowLogSumExp(row, vocab, shared);
  for (int64_t v = threadIdx.x; v < vocab; v += blockDim.x) {
    double prob = exp(static_cast<double>(row[v]) - lse);
    out[v] = static_cast<float>(g * (v == label ? prob - 1.0 : prob));
  }
}

} // namespace

size_t crossEntropyScratchBytes(int64_t rows) {
  return sizeof(double) * static_cast<size_t>(rows + 1);
}

template <typename Id>
void crossEntropyForward(cudaStream_t stream, int64_t rows, int64_t vocab,
                         const float *logits, const Id *labels,
                         int64_t ignoreIndex, LossReduction reduction,
                         float *loss, void *scratch, unsigned *fault,
                         unsigned tag) {
  auto *rowLoss = static_cast<double *>(scratch);
  bool perRow = reduction == LossReduction::None;
  if (rows > 0)
    crossEntropyRowsKernel<Id>
        <<<static_cast<unsigned>(rows), kRowThreads, 0, stream>>>(
            vocab, logits, labels, ignoreIndex, rowLoss,
            perRow ? loss : nullptr, fault, tag);
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
                          unsigned *fault, unsigned tag) {
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
            sharedGrad, dlogits, fault, tag);
}

#define MTRT_INSTANTIATE(Id)                                                   \
  template void crossEntropyForward<Id>(                                       \
      cudaStream_t, int64_t, int64_t, const float *, const Id *, int64_t,      \
      LossReduction, float *, void *, unsigned *, unsigned);                   \
  template void crossEntropyBackward<Id>(                                      \
      cudaStream_t, int64_t, int64_t, const float *, const Id *, int64_t,      \
      LossReduction, const float *, float *, void *, unsigned *, unsigned);
MTRT_CUDA_INSTANTIATE_ID_TYPES(MTRT_INSTANTIATE)
#undef MTRT_INSTANTIATE

} // namespace mtrt::cuda
