// Gradient scaling, clipping and AdamW over a ParameterStore.
#include "train/Optimizer.h"

#include "comm/RankContext.h"
#include "core/Bundle.h"
#include "host/ParameterStore.h"
#include "host/ThreadPool.h"

#include <algorithm>
#include <cmath>
#include <sstream>
#include <string>
#include <vector>

namespace mtrt::train {

void checkGradNorm(double gradNorm, int64_t iteration) {
  if (std::isfinite(gradNorm))
    return;
  std::ostringstream message;
  message << "iteration " << iteration << ": the gradient norm is " << gradNorm
          << " (training diverged); lower --lr, raise --lr-warmup-iters or "
             "lower --clip-grad";
  throw Error(MTRT_STATUS_ABORTED, message.str());
}

bool foundOnAnyRank(bool found, comm::RankContext *rank, int64_t iteration) {
  if (!rank)
    return found;
  float flag = found ? 1.0f : 0.0f;
  rank->world().allReduce<float>(
      &flag, &flag, 1, comm::ReduceOp::Max,
      comm::CallInfo{"found inf or nan of iteration " +
                         std::to_string(iteration),
                     iteration});
  return flag != 0.0f;
}

bool countsInNorm(const Parameter &parameter,
                  const std::vector<int64_t> &coordinates,
                  const std::vector<int64_t> &distinctAxes) {
  for (size_t axis = 0; axis < coordinates.size(); ++axis) {
    auto axisIs = [&](int64_t a) { return a == static_cast<int64_t>(axis); };
    bool splits = std::any_of(distinctAxes.begin(), distinctAxes.end(), axisIs);
    // The pipeline axis (0) splits the parameters among its ranks; a table
    // tied across stages counts on its owner only.
    if (axis == 0 && parameter.pipelineRank >= 0) {
      if (coordinates[0] != parameter.pipelineRank)
        return false;
      continue;
    }
    for (const auto &axes : parameter.splitAxes)
      splits |= std::any_of(axes.begin(), axes.end(), axisIs);
    if (!splits && coordinates[axis] != 0)
      return false;
  }
  return true;
}

double clipCoefficient(const OptimizerConfig &config, double gradNorm) {
  if (config.clipGrad <= 0)
    return 1.0;
  return std::min(1.0, config.clipGrad / (gradNorm + 1e-6));
}

host::AdamWParams adamParams(const OptimizerConfig &config,
                             int64_t iteration) {
  host::AdamWParams adam;
  adam.lr = host::learningRate(config.schedule, iteration - 1);
  adam.beta1 = config.beta1;
  adam.beta2 = config.beta2;
  adam.eps = config.eps;
  adam.step = iteration;
  return adam;
}

Optimizer::Optimizer(host::ParameterStore &parameters, host::ThreadPool &pool,
                     const OptimizerConfig &config, comm::RankContext *rank)
    : parameters_(parameters), pool_(pool), config_(config), rank_(rank) {
  if (!parameters.hasOptimizerState())
    throw Error(MTRT_STATUS_INTERNAL,
                "Optimizer: the parameter store holds no optimizer state "
                "(it was made for the distributed optimizer)");
}

OptimizerStepResult Optimizer::step(int64_t iteration, double gradScale) {
  if (parameters_.floatType() == DType::F64)
    return stepTyped<double>(iteration, gradScale);
  return stepTyped<float>(iteration, gradScale);
}

bool Optimizer::unscaleAndCheckFinite(double factor, int64_t iteration) {
  bool found = false;
  for (size_t i = 0; i < parameters_.size(); ++i) {
    host::Tensor &g = parameters_.gradient(i);
    found |= parameters_.floatType() == DType::F64
                 ? host::scaleAndCheckFinite<double>(pool_, g.numElements(),
                                                     g.data<double>(), factor)
                 : host::scaleAndCheckFinite<float>(pool_, g.numElements(),
                                                    g.data<float>(), factor);
  }
  return foundOnAnyRank(found, rank_, iteration);
}

template <typename T>
OptimizerStepResult Optimizer::stepTyped(int64_t iteration, double gradScale) {
  size_t count = parameters_.size();
  // Expert biases move by their whole counts (the gradient reduction has
  // summed them), before anything scales them; the rest skips them.
  auto expertBias = [&](size_t i) {
    return parameters_.info(i).isExpertBias();
  };
  for (size_t i = 0; i < count; ++i) {
    if (!expertBias(i) || !parameters_.holds(i))
      continue;
    host::Tensor &p = parameters_.value(i);
    const T *counts = parameters_.gradient(i).data<T>();
    int64_t n = p.numElements();
    double total = 0;
    for (int64_t e = 0; e < n; ++e)
      total += static_cast<double>(counts[e]);
    updateExpertBias<T>(p.data<T>(), counts, n, expertLoadMean<T>(total, n),
                        parameters_.info(i).expertBiasUpdateRate);
  }
  if (gradScale != 1.0)
    for (size_t i = 0; i < count; ++i) {
      host::Tensor &g = parameters_.gradient(i);
      if (!expertBias(i))
        host::scaleInPlace<T>(pool_, g.numElements(), g.data<T>(), gradScale);
    }
  std::vector<double> squares(count, 0.0);
  for (size_t i = 0; i < count; ++i) {
    const host::Tensor &g = parameters_.gradient(i);
    if (!expertBias(i))
      squares[i] = host::sumOfSquares<T>(pool_, g.numElements(), g.data<T>());
  }
  if (rank_) {
    for (size_t i = 0; i < count; ++i)
      if (!countsInNorm(parameters_.info(i), rank_->coordinates(), {}))
        squares[i] = 0;
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
  checkGradNorm(result.gradNorm, iteration);
  double coefficient = clipCoefficient(config_, result.gradNorm);
  if (coefficient < 1.0)
    for (size_t i = 0; i < count; ++i) {
      host::Tensor &g = parameters_.gradient(i);
      if (!expertBias(i))
        host::scaleInPlace<T>(pool_, g.numElements(), g.data<T>(), coefficient);
    }
  host::AdamWParams adam = adamParams(config_, iteration);
  result.learningRate = adam.lr;
  for (size_t i = 0; i < count; ++i) {
    if (expertBias(i))
      continue;
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
