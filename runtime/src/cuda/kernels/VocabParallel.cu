// Megatron-LM's vocabulary-parallel cross-entropy on one rank's block of the
// vocabulary: the per-row statistics that the bundle's all-reduces combine,
// the loss from them and the block's gradient. One block of threads per row.
// The logits and their gradient are fp32 or bf16 (InElements, OutElements:
// a bf16 logit widens exactly), the arithmetic fp32 and the statistics fp32
// (as Megatron-LM's, whose max and sums are fp32).
#include "cuda/kernels/KernelSupport.cuh"

#include <cmath>

namespace mtrt::cuda {

namespace {

constexpr int kRowThreads = 256;
constexpr int kLossThreads = 1024;

__global__ void vocabMaxKernel(int64_t vocab, InElements logits, float *max) {
  __shared__ float shared[kRowThreads / detail::kWarp];
  int64_t base = static_cast<int64_t>(blockIdx.x) * vocab;
  float value = -INFINITY;
  for (int64_t v = threadIdx.x; v < vocab; v += blockDim.x)
    value = fmaxf(value, detail::load(logits, base + v));
  value = detail::blockMax(value, shared);
  if (threadIdx.x == 0)
    max[blockIdx.x] = value;
}

template <typename Id>
__global__ void vocabPartialsKernel(int64_t vocab, int64_t start,
                                    InElements logits, const Id *labels,
                                    const float *max, float *partials) {
  __shared__ double shared[kRowThreads / detail::kWarp];
  int64_t r = blockIdx.x;
  int64_t base = r * vocab;
  float m = max[r];
  float sum = 0.0f;
  for (int64_t v = threadIdx.x; v < vocab; v += blockDim.x)
    sum += expf(detail::load(logits, base + v) - m);
  double total = detail::blockSum(static_cast<double>(sum), shared);
  if (threadIdx.x == 0) {
    int64_t target = static_cast<int64_t>(labels[r]) - start;
    partials[2 * r] = static_cast<float>(total);
    partials[2 * r + 1] =
        target >= 0 && target < vocab
            ? static_cast<float>(
                  static_cast<double>(detail::load(logits, base + target)) - m)
            : 0.0f;
  }
}

template <typename Id>
__global__ void vocabCrossEntropyKernel(int64_t rows, const float *partials,
                                        const Id *labels, int64_t ignoreIndex,
                                        LossReduction reduction, float *loss) {
  __shared__ double shared[kLossThreads / detail::kWarp];
  double total = 0, count = 0;
  for (int64_t r = threadIdx.x; r < rows; r += blockDim.x) {
    bool ignored = static_cast<int64_t>(labels[r]) == ignoreIndex;
    double value = ignored ? 0.0
                           : log(static_cast<double>(partials[2 * r])) -
                                 static_cast<double>(partials[2 * r + 1]);
    if (reduction == LossReduction::None)
      loss[r] = static_cast<float>(value);
    total += value;
    count += ignored ? 0.0 : 1.0;
  }
  if (reduction == LossReduction::None)
    return;
  total = detail::blockSum(total, shared);
  count = detail::blockSum(count, shared);
  if (threadIdx.x == 0)
    loss[0] = static_cast<float>(reduction == LossReduction::Sum ? total
                                 : count > 0                     ? total / count
                                                                 : 0.0);
}

// The factor every row shares under Sum and Mean.
template <typename Id>
__global__ void vocabGradFactorKernel(int64_t rows, const Id *labels,
                                      int64_t ignoreIndex,
                                      LossReduction reduction,
                                      const float *dloss, double *factor) {
  __shared__ double shared[kLossThreads / detail::kWarp];
  double count = 0;
  for (int64_t r = threadIdx.x; r < rows; r += blockDim.x)
    count += static_cast<int64_t>(labels[r]) == ignoreIndex ? 0.0 : 1.0;
  count = detail::blockSum(count, shared);
  if (threadIdx.x == 0)
    *factor = reduction == LossReduction::Sum
                  ? static_cast<double>(dloss[0])
                  : (count > 0 ? static_cast<double>(dloss[0]) / count : 0.0);
}

template <typename Id>
__global__ void
vocabCrossEntropyGradKernel(int64_t vocab, int64_t start, InElements logits,
                            const Id *labels, int64_t ignoreIndex,
                            LossReduction reduction, const float *dloss,
                            const float *max, const float *partials,
                            const double *factor, OutElements dlogits) {
  int64_t r = blockIdx.x;
  int64_t base = r * vocab;
  int64_t label = static_cast<int64_t>(labels[r]);
  if (label == ignoreIndex) {
    for (int64_t v = threadIdx.x; v < vocab; v += blockDim.x)
      detail::store(dlogits, base + v, 0.0f);
    return;
  }
  float g =
      reduction == LossReduction::None ? dloss[r] : static_cast<float>(*factor);
  float m = max[r];
  float inverse =
      static_cast<float>(1.0 / static_cast<double>(partials[2 * r]));
  int64_t target = label - start;
  for (int64_t v = threadIdx.x; v < vocab; v += blockDim.x) {
    float prob = expf(detail::load(logits, base + v) - m) * inverse;
    detail::store(dlogits, base + v, g * (v == target ? prob - 1.0f : prob));
  }
}

} // namespace

void vocabMax(cudaStream_t stream, int64_t rows, int64_t vocab,
              InElements logits, float *max) {
  if (rows > 0 && vocab > 0)
    vocabMaxKernel<<<static_cast<unsigned>(rows), kRowThreads, 0, stream>>>(
        vocab, logits, max);
}

template <typename Id>
void vocabPartials(cudaStream_t stream, int64_t rows, int64_t vocab,
                   int64_t start, InElements logits, const Id *labels,
                   const float *max, float *partials) {
  if (rows > 0)
    vocabPartialsKernel<Id>
        <<<static_cast<unsigned>(rows), kRowThreads, 0, stream>>>(
            vocab, start, logits, labels, max, partials);
}

template <typename Id>
void vocabCrossEntropy(cudaStream_t stream, int64_t rows, const float *partials,
                       const Id *labels, int64_t ignoreIndex,
                       LossReduction reduction, float *loss) {
  vocabCrossEntropyKernel<Id><<<1, kLossThreads, 0, stream>>>(
      rows, partials, labels, ignoreIndex, reduction, loss);
}

template <typename Id>
void vocabCrossEntropyGradFactor(cudaStream_t stream, int64_t rows,
                                 const Id *labels, int64_t ignoreIndex,
                                 LossReduction reduction, const float *dloss,
                                 double *factor) {
  if (rows > 0 && reduction != LossReduction::None)
    vocabGradFactorKernel<Id><<<1, kLossThreads, 0, stream>>>(
        rows, labels, ignoreIndex, reduction, dloss, factor);
}

template <typename Id>
void vocabCrossEntropyGradRows(cudaStream_t stream, int64_t rows, int64_t vocab,
                               int64_t start, InElements logits,
                               const Id *labels, int64_t ignoreIndex,
                               LossReduction reduction, const float *dloss,
                               const float *max, const float *partials,
                               const double *factor, OutElements dlogits) {
  if (rows > 0 && vocab > 0)
    vocabCrossEntropyGradKernel<Id>
        <<<static_cast<unsigned>(rows), kRowThreads, 0, stream>>>(
            vocab, start, logits, labels, ignoreIndex, reduction, dloss, max,
            partials, factor, dlogits);
}

template <typename Id>
void vocabCrossEntropyGrad(cudaStream_t stream, int64_t rows, int64_t vocab,
                           int64_t start, InElements logits, const Id *labels,
                           int64_t ignoreIndex, LossReduction reduction,
                           const float *dloss, const float *max,
                           const float *partials, OutElements dlogits,
                           void *scratch) {
  if (rows <= 0 || vocab <= 0)
    return;
  auto *factor = static_cast<double *>(scratch);
  vocabCrossEntropyGradFactor(stream, rows, labels, ignoreIndex, reduction,
                              dloss, factor);
  vocabCrossEntropyGradRows(stream, rows, vocab, start, logits, labels,
                            ignoreIndex, reduction, dloss, max, partials,
                            factor, dlogits);
}

#define MTRT_INSTANTIATE(Id)                                                   \
  template void vocabPartials<Id>(cudaStream_t, int64_t, int64_t, int64_t,     \
                                  InElements, const Id *, const float *,       \
                                  float *);                                    \
  template void vocabCrossEntropy<Id>(cudaStream_t, int64_t, const float *,    \
                                      const Id *, int64_t, LossReduction,      \
                                      float *);                                \
  template void vocabCrossEntropyGrad<Id>(                                     \
      cudaStream_t, int64_t, int64_t, int64_t, InElements, const Id *,         \
      int64_t, LossReduction, const float *, const float *, const float *,     \
      OutElements, void *);                                                    \
  template void vocabCrossEntropyGradFactor<Id>(                               \
      cudaStream_t, int64_t, const Id *, int64_t, LossReduction,               \
      const float *, double *);                                                \
  template void vocabCrossEntropyGradRows<Id>(                                 \
      cudaStream_t, int64_t, int64_t, int64_t, InElements, const Id *,         \
      int64_t, LossReduction, const float *, const float *, const float *,     \
      const double *, OutElements);
MTRT_CUDA_INSTANTIATE_ID_TYPES(MTRT_INSTANTIATE)
#undef MTRT_INSTANTIATE

} // namespace mtrt::cuda
