// fp16 loss scaling on the device: the unscale and the overflow check before
// the optimizer step.
#ifndef MTRT_SRC_CUDA_GRADIENTUNSCALER_H
#define MTRT_SRC_CUDA_GRADIENTUNSCALER_H

#include "cuda/Context.h"

#include <cstdint>

namespace mtrt::comm {
class RankContext;
} // namespace mtrt::comm

namespace mtrt::cuda {

class ParameterStore;

/// train::Optimizer::unscaleAndCheckFinite over a cuda::ParameterStore: one
/// kernel (kernels/LossScale.cu) multiplies every gradient by the inverse
/// loss scale and raises a device flag on an inf or nan; the flag comes to
/// the host (one synchronization) and, with a rank, is all-reduced with MAX
/// over the world (train::foundOnAnyRank), so every rank skips together.
///
/// Thread-safety: the context's thread only.
class GradientUnscaler {
public:
  /// Everything must outlive the unscaler.
  GradientUnscaler(ParameterStore &parameters,
                   comm::RankContext *rank = nullptr);

  /// Returns whether any gradient element on any rank is inf or nan after
  /// the product. Throws Error naming `iteration` on a CUDA failure.
  bool unscaleAndCheckFinite(double factor, int64_t iteration);
  /// The same over `count` gradients at `gradients` (device memory of the
  /// store's context): the distributed optimizer's shard of the reduced
  /// gradient buffer.
  bool unscaleAndCheckFinite(float *gradients, int64_t count, double factor,
                             int64_t iteration);

private:
  ParameterStore &parameters_;
  comm::RankContext *rank_ = nullptr;
  DeviceBuffer found_;
};

} // namespace mtrt::cuda

#endif // MTRT_SRC_CUDA_GRADIENTUNSCALER_H
