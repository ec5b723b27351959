// Gradient scaling, clipping and AdamW over a ParameterStore.
#include "train/Optimizer.h"

#include "comm/RankContext.h"
#include "core/Bundle.h"
#include "host/ParameterStore.h"
#include "host/ThreadPool.h"

#include <cmath>
#include <sstream>
#include <string>
#include <vector>

namespace mtrt::train {

Optimizer::Optimizer(host::ParameterStore &parameters, host::ThreadPool &pool,
                     const OptimizerConfig &config, comm::RankContext *rank)
    : parameters_(parameters), pool_(pool), config_(config), rank_(rank) {}

OptimizerStepResult Optimizer::step(int64_t iteration, double gradScale) {
  if (parameters_.floatType() == DType::F64)
    return stepTyped<double>(iteration, gradScale);
  return stepTyped<float>(iteration, gradScale);
}

template <typename T>
OptimizerStepResult Optimizer::stepTyped(int64_t iteration, double gradScale) {
  size_t count = parameters_.size();
  if (gradScale != 1.0)
    for (size_t i = 0; i < count; ++i) {
      host::Tensor &g = parameters_.gradient(i);
      host::scaleInPlace<T>(pool_, g.numElements(), g.data<T>(), gradScale);
    }
  std::vector<double> squares(count, 0.0);
  for (size_t i = 0; i < count; ++i) {
    const host::Tensor &g = parameters_.gradient(i);
    squares[i] = host::sumOfSquares<T>(pool_, g.numElements(), g.data<T>());
  }
  if (rank_) {
    // Only the replica at coordinate 0 of every axis that does not split a
    // parameter contributes its shard, so each distinct shard counts once.
    for (size_t i = 0; i < count; ++i) {
      const auto &split = parameters_.info(i).splitAxes;
      for (size_t axis = 0; axis < rank_->coordinates().size(); ++axis) {
        // The pipeline axis (0) splits the parameters among its ranks.
        bool splits = axis == 0 && parameters_.info(i).pipelineRank >= 0;
        for (const auto &axes : split)
          for (int64_t a : axes)
            splits |= a == static_cast<int64_t>(axis);
        if (!splits && rank_->coordinates()[axis] != 0)
          squares[i] = 0;
      }
    }
    std::string label =
        "gradient norm of iteration " + std::to_string(iteration);
    rank_->world().allReduce<double>(
        squares.data(), squares.data(), static_cast<int64_t>(count),
        comm::ReduceOp::Sum, comm::CallInfo{label, iteration});
  }
  double sumOfSquares = 0;
  for (double s : squares)
    sumOfSquares += s;
  OptimizerStepResult result;
  result.gradNorm = std::sqrt(sumOfSquares);
  if (!std::isfinite(result.gradNorm)) {
    std::ostringstream message;
    message << "iteration " << iteration << ": the gradient norm is "
            << result.gradNorm
            << " (training diverged); lower --lr, raise --lr-warmup-iters or "
               "lower --clip-grad";
    throw Error(MTRT_STATUS_ABORTED, message.str());
  }
  if (config_.clipGrad > 0) {
    double coefficient = config_.clipGrad / (result.gradNorm + 1e-6);
    if (coefficient < 1.0)
      for (size_t i = 0; i < count; ++i) {
        host::Tensor &g = parameters_.gradient(i);
        host::scaleInPlace<T>(pool_, g.numElements(), g.data<T>(), coefficient);
      }
  }
  result.learningRate = host::learningRate(config_.schedule, iteration - 1);
  host::AdamWParams adam;
  adam.lr = result.learningRate;
  adam.beta1 = config_.beta1;
  adam.beta2 = config_.beta2;
  adam.eps = config_.eps;
  adam.step = iteration;
  for (size_t i = 0; i < count; ++i) {
    adam.weightDecay =
        parameters_.info(i).weightDecay ? config_.weightDecay : 0;
    host::Tensor &p = parameters_.value(i);
    host::adamwStep<T>(pool_, p.numElements(), p.data<T>(),
                       parameters_.gradient(i).data<T>(),
                       parameters_.expAvg(i).data<T>(),
                       parameters_.expAvgSq(i).data<T>(), adam);
  }
  return result;
}

} // namespace mtrt::train
