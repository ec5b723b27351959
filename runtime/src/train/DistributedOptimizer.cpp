// The sharded AdamW step of the distributed optimizer.
#include "train/DistributedOptimizer.h"

#include "comm/RankContext.h"
#include "host/ParameterStore.h"
#include "train/DataParallelBuffer.h"

#include <cmath>
#include <cstring>
#include <string>
#include <utility>

namespace mtrt::train {

DistributedOptimizer::DistributedOptimizer(host::ParameterStore &parameters,
                                           DataParallelBuffer &buffer,
                                           host::ThreadPool &pool,
                                           const OptimizerConfig &config,
                                           comm::RankContext &rank)
    : parameters_(parameters), buffer_(buffer), pool_(pool), config_(config),
      rank_(rank) {
  if (!buffer.distributed())
    throw Error(MTRT_STATUS_INTERNAL,
                "DistributedOptimizer: the bundle's gradient buffer is "
                "all-reduced, not sharded");
  for (host::Tensor *t : {&expAvg_, &expAvgSq_}) {
    *t = host::Tensor(parameters.floatType(), {buffer.shardSize()});
    std::memset(t->buffer.data(), 0, t->buffer.size());
  }
}

OptimizerStepResult DistributedOptimizer::step(int64_t iteration,
                                               double gradScale) {
  if (parameters_.floatType() == DType::F64)
    return stepTyped<double>(iteration, gradScale);
  return stepTyped<float>(iteration, gradScale);
}

bool DistributedOptimizer::unscaleAndCheckFinite(double factor,
                                                 int64_t iteration) {
  host::Tensor &shard = buffer_.shard();
  bool found =
      shard.dtype == DType::F64
          ? host::scaleAndCheckFinite<double>(pool_, shard.numElements(),
                                              shard.data<double>(), factor)
          : host::scaleAndCheckFinite<float>(pool_, shard.numElements(),
                                             shard.data<float>(), factor);
  return foundOnAnyRank(found, &rank_, iteration);
}

template <typename T>
OptimizerStepResult DistributedOptimizer::stepTyped(int64_t iteration,
                                                    double gradScale) {
  host::Tensor &shard = buffer_.shard();
  T *g = shard.data<T>();
  int64_t n = shard.numElements();
  if (gradScale != 1.0)
    host::scaleInPlace<T>(pool_, n, g, gradScale);

  // The data-parallel ranks hold distinct ranges of the buffer; along the
  // other axes, replicas of a parameter that is not split count once.
  double squares = 0;
  for (const DataParallelBuffer::Piece &piece : buffer_.pieces())
    if (countsInNorm(parameters_.info(piece.parameter), rank_.coordinates(),
                     buffer_.gridAxes()))
      squares +=
          host::sumOfSquares<T>(pool_, piece.count, g + piece.shardOffset);
  std::string label = "gradient norm of iteration " + std::to_string(iteration);
  rank_.world().allReduce<double>(&squares, &squares, 1, comm::ReduceOp::Sum,
                                  comm::CallInfo{label, iteration});
  OptimizerStepResult result;
  result.gradNorm = std::sqrt(squares);
  checkGradNorm(result.gradNorm, iteration);
  double coefficient = clipCoefficient(config_, result.gradNorm);
  if (coefficient < 1.0)
    host::scaleInPlace<T>(pool_, n, g, coefficient);

  host::AdamWParams adam = adamParams(config_, iteration);
  result.learningRate = adam.lr;
  for (const DataParallelBuffer::Piece &piece : buffer_.pieces()) {
    adam.weightDecay =
        parameters_.info(piece.parameter).weightDecay ? config_.weightDecay : 0;
    T *value = parameters_.value(piece.parameter).data<T>();
    host::adamwStep<T>(pool_, piece.count, value + piece.parameterOffset,
                       g + piece.shardOffset,
                       expAvg_.data<T>() + piece.shardOffset,
                       expAvgSq_.data<T>() + piece.shardOffset, adam);
  }
  buffer_.gatherParameters();
  return result;
}

} // namespace mtrt::train
