// Gradient scaling, clipping and AdamW over a cuda::ParameterStore.
#include "cuda/Optimizer.h"

#include "comm/RankContext.h"
#include "cuda/CudaCheck.h"
#include "cuda/ParameterStore.h"
#include "cuda/kernels/Kernels.h"

#include <algorithm>
#include <cmath>
#include <sstream>
#include <vector>

namespace mtrt::cuda {

Optimizer::Optimizer(ParameterStore &parameters,
                     const train::OptimizerConfig &config,
                     comm::RankContext *rank)
    : parameters_(parameters), config_(config), rank_(rank),
      scratch_(sumOfSquaresScratchBytes(parameters.flatElements()),
               "the gradient norm's partial sums"),
      norm_(sizeof(double) * (rank ? std::max<size_t>(parameters.size(), 1) : 1),
            "the gradient norm") {}

train::OptimizerStepResult Optimizer::step(int64_t iteration,
                                           double gradScale) {
  Context &context = parameters_.context();
  cudaStream_t stream = context.stream();
  std::string what = "optimizer step of iteration " + std::to_string(iteration);

  // The host scales the gradients in place, then sums their squares; here
  // the scaled value is formed on the fly (same float product) and stored by
  // the AdamW kernel.
  bool applyScale = gradScale != 1.0;
  float scale = applyScale ? static_cast<float>(gradScale) : 1.0f;
  double sumOfSquaresValue = 0;
  if (!rank_) {
    MTRT_CUDA_CHECK_LAUNCH(sumOfSquares(stream, parameters_.flatElements(),
                                        parameters_.gradients(), scale,
                                        norm_.as<double>(), scratch_.data()),
                           what);
    MTRT_CUDA_CHECK(cudaMemcpyAsync(&sumOfSquaresValue, norm_.data(),
                                    sizeof(double), cudaMemcpyDeviceToHost,
                                    stream),
                    what);
    context.synchronize(what);
  } else {
    // train::Optimizer's: per parameter, zero for those another rank
    // counts, summed over the world.
    size_t count = parameters_.size();
    for (size_t i = 0; i < count; ++i)
      MTRT_CUDA_CHECK_LAUNCH(sumOfSquares(stream, parameters_.count(i),
                                          parameters_.gradient(i), scale,
                                          norm_.as<double>() + i,
                                          scratch_.data()),
                             what);
    std::vector<double> squares(count, 0.0);
    if (count)
      MTRT_CUDA_CHECK(cudaMemcpyAsync(squares.data(), norm_.data(),
                                      sizeof(double) * count,
                                      cudaMemcpyDeviceToHost, stream),
                      what);
    context.synchronize(what);
    for (size_t i = 0; i < count; ++i)
      if (!train::countsInNorm(parameters_.info(i), rank_->coordinates(), {}))
        squares[i] = 0;
    std::string label =
        "gradient norm of iteration " + std::to_string(iteration);
    rank_->world().allReduce<double>(
        squares.data(), squares.data(), static_cast<int64_t>(count),
        comm::ReduceOp::Sum, comm::CallInfo{label, iteration});
    for (double square : squares)
      sumOfSquaresValue += square;
  }

  train::OptimizerStepResult result;
  result.gradNorm = std::sqrt(sumOfSquaresValue);
  if (!std::isfinite(result.gradNorm)) {
    std::ostringstream message;
    message << "iteration " << iteration << ": the gradient norm is "
            << result.gradNorm
            << " (training diverged); lower --lr, raise --lr-warmup-iters or "
               "lower --clip-grad";
    throw Error(MTRT_STATUS_ABORTED, message.str());
  }
  AdamWScalars s;
  s.applyScale = applyScale;
  s.gradScale = scale;
  if (config_.clipGrad > 0) {
    double coefficient = config_.clipGrad / (result.gradNorm + 1e-6);
    if (coefficient < 1.0) {
      s.applyClip = true;
      s.clipCoefficient = static_cast<float>(coefficient);
    }
  }
  result.learningRate = host::learningRate(config_.schedule, iteration - 1);

  // host::adamwStep's scalars, computed in double and rounded to float.
  double lr = result.learningRate;
  double stepNumber = static_cast<double>(iteration);
  double biasCorrection1 = 1.0 - std::pow(config_.beta1, stepNumber);
  double biasCorrection2 = 1.0 - std::pow(config_.beta2, stepNumber);
  s.beta1 = static_cast<float>(config_.beta1);
  s.beta2 = static_cast<float>(config_.beta2);
  s.oneMinusBeta1 = static_cast<float>(1.0 - config_.beta1);
  s.oneMinusBeta2 = static_cast<float>(1.0 - config_.beta2);
  s.stepSize = static_cast<float>(lr / biasCorrection1);
  s.bias2Sqrt = static_cast<float>(std::sqrt(biasCorrection2));
  s.eps = static_cast<float>(config_.eps);
  for (size_t i = 0; i < parameters_.size(); ++i) {
    double weightDecay =
        parameters_.info(i).weightDecay ? config_.weightDecay : 0;
    s.decay = static_cast<float>(1.0 - lr * weightDecay);
    MTRT_CUDA_CHECK_LAUNCH(adamwStep(stream, parameters_.count(i),
                                     parameters_.value(i),
                                     parameters_.gradient(i),
                                     parameters_.expAvg(i),
                                     parameters_.expAvgSq(i), s),
                           what + " (parameter " + parameters_.info(i).name +
                               ")");
  }
  return result;
}

} // namespace mtrt::cuda
