// The device's unscale-and-check of fp16 loss scaling.
#include "cuda/GradientUnscaler.h"

#include "cuda/CudaCheck.h"
#include "cuda/ParameterStore.h"
#include "cuda/kernels/LossScale.h"
#include "train/Optimizer.h"

#include <string>

namespace mtrt::cuda {

GradientUnscaler::GradientUnscaler(ParameterStore &parameters,
                                   comm::RankContext *rank)
    : parameters_(parameters), rank_(rank),
      found_(sizeof(int), "the loss scaling's found-inf flag") {}

bool GradientUnscaler::unscaleAndCheckFinite(double factor,
                                             int64_t iteration) {
  return unscaleAndCheckFinite(parameters_.gradients(),
                               parameters_.flatElements(), factor, iteration);
}

bool GradientUnscaler::unscaleAndCheckFinite(float *gradients, int64_t count,
                                             double factor,
                                             int64_t iteration) {
  Context &context = parameters_.context();
  cudaStream_t stream = context.stream();
  std::string what =
      "loss scaling's unscale of iteration " + std::to_string(iteration);
  MTRT_CUDA_CHECK(cudaMemsetAsync(found_.data(), 0, sizeof(int), stream),
                  what);
  MTRT_CUDA_CHECK_LAUNCH(
      cuda::unscaleAndCheckFinite(stream, count, gradients,
                                  static_cast<float>(factor),
                                  found_.as<int>()),
      what);
  int found = 0;
  MTRT_CUDA_CHECK(cudaMemcpyAsync(&found, found_.data(), sizeof(int),
                                  cudaMemcpyDeviceToHost, stream),
                  what);
  context.synchronize(what);
  return train::foundOnAnyRank(found != 0, rank_, iteration);
}

} // namespace mtrt::cuda
