// The sharded AdamW step of the distributed optimizer.
#include "train/DistributedOptimizer.h"

#include "comm/RankContext.h"
#include "host/ParameterStore.h"
#include "train/DataParallelBuffer.h"
#include "train/ExactSquareSum.h"

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
  for (size_t i = 0; i < parameters.size(); ++i) {
    if (!parameters.holds(i) || buffer.contains(i))
      continue;
    local_.push_back(i);
    for (auto *moments : {&localExpAvg_, &localExpAvgSq_}) {
      const host::Tensor &value = parameters.value(i);
      moments->emplace_back(value.dtype, value.shape);
      std::memset(moments->back().buffer.data(), 0,
                  moments->back().buffer.size());
    }
  }
}

OptimizerStepResult DistributedOptimizer::step(int64_t iteration,
                                               double gradScale,
                                               bool deferGather) {
  if (parameters_.floatType() == DType::F64)
    return stepTyped<double>(iteration, gradScale, deferGather);
  return stepTyped<float>(iteration, gradScale, deferGather);
}

bool DistributedOptimizer::unscaleAndCheckFinite(double factor,
                                                 int64_t iteration) {
  auto check = [&](host::Tensor &g) {
    return g.dtype == DType::F64
               ? host::scaleAndCheckFinite<double>(pool_, g.numElements(),
                                                   g.data<double>(), factor)
               : host::scaleAndCheckFinite<float>(pool_, g.numElements(),
                                                  g.data<float>(), factor);
  };
  bool found = check(buffer_.shard());
  for (size_t i : local_)
    found |= check(parameters_.gradient(i));
  return foundOnAnyRank(found, &rank_, iteration);
}

template <typename T>
void DistributedOptimizer::updateExpertBiases(int64_t iteration) {
  const size_t count = parameters_.size();
  bool any = false;
  for (size_t i = 0; i < count; ++i)
    any |= parameters_.info(i).isExpertBias();
  if (!any)
    return;
  // Each bias's whole count: its shard pieces (and a local copy) summed
  // over the ranks, each distinct element once, as the norm counts them.
  T *g = buffer_.shard().data<T>();
  std::vector<double> totals(count, 0.0);
  for (const DataParallelBuffer::Piece &piece : buffer_.pieces())
    if (parameters_.info(piece.parameter).isExpertBias() &&
        countsInNorm(parameters_.info(piece.parameter), rank_.coordinates(),
                     buffer_.gridAxes()))
      for (int64_t e = 0; e < piece.count; ++e)
        totals[piece.parameter] +=
            static_cast<double>(g[piece.shardOffset + e]);
  for (size_t i : local_)
    if (parameters_.info(i).isExpertBias() &&
        countsInNorm(parameters_.info(i), rank_.coordinates(), {})) {
      const T *counts = parameters_.gradient(i).data<T>();
      for (int64_t e = 0; e < parameters_.gradient(i).numElements(); ++e)
        totals[i] += static_cast<double>(counts[e]);
    }
  rank_.world().allReduce<double>(
      totals.data(), totals.data(), static_cast<int64_t>(count),
      comm::ReduceOp::Sum,
      comm::CallInfo{"expert loads of iteration " + std::to_string(iteration),
                     iteration});
  auto mean = [&](size_t i) {
    return expertLoadMean<T>(totals[i], parameters_.info(i).type.numElements);
  };
  for (const DataParallelBuffer::Piece &piece : buffer_.pieces()) {
    const Parameter &info = parameters_.info(piece.parameter);
    if (info.isExpertBias())
      updateExpertBias<T>(parameters_.value(piece.parameter).data<T>() +
                              piece.parameterOffset,
                          g + piece.shardOffset, piece.count,
                          mean(piece.parameter), info.expertBiasUpdateRate);
  }
  for (size_t i : local_)
    if (parameters_.info(i).isExpertBias())
      updateExpertBias<T>(parameters_.value(i).data<T>(),
                          parameters_.gradient(i).data<T>(),
                          parameters_.gradient(i).numElements(), mean(i),
                          parameters_.info(i).expertBiasUpdateRate);
}

template <typename T>
OptimizerStepResult DistributedOptimizer::stepTyped(int64_t iteration,
                                                    double gradScale,
                                                    bool deferGather) {
  host::Tensor &shard = buffer_.shard();
  T *g = shard.data<T>();
  int64_t n = shard.numElements();
  updateExpertBiases<T>(iteration);
  if (gradScale != 1.0) {
    host::scaleInPlace<T>(pool_, n, g, gradScale);
    for (size_t i : local_)
      host::scaleInPlace<T>(pool_, parameters_.gradient(i).numElements(),
                            parameters_.gradient(i).data<T>(), gradScale);
  }

  // The data-parallel ranks hold distinct parts of the buffer; along the
  // other axes, replicas of a parameter that is not split count once. The
  // sum is exact (ExactSquareSum), so the norm does not depend on where the
  // shards cut the buffer (per-bucket shards or one range).
  ExactSquareSum squares(parameters_.floatType() == DType::F64);
  for (const DataParallelBuffer::Piece &piece : buffer_.pieces())
    if (!parameters_.info(piece.parameter).isExpertBias() &&
        countsInNorm(parameters_.info(piece.parameter), rank_.coordinates(),
                     buffer_.gridAxes()))
      squares.addSquares(g + piece.shardOffset, piece.count);
  // A parameter outside the buffer counts on one of its replicas.
  for (size_t i : local_)
    if (!parameters_.info(i).isExpertBias() &&
        countsInNorm(parameters_.info(i), rank_.coordinates(), {}))
      squares.addSquares(parameters_.gradient(i).data<T>(),
                         parameters_.gradient(i).numElements());
  std::string label = "gradient norm of iteration " + std::to_string(iteration);
  allReduceExact(squares, rank_.world(), comm::CallInfo{label, iteration});
  OptimizerStepResult result;
  result.gradNorm = std::sqrt(squares.value());
  checkGradNorm(result.gradNorm, iteration);
  double coefficient = clipCoefficient(config_, result.gradNorm);
  if (coefficient < 1.0) {
    host::scaleInPlace<T>(pool_, n, g, coefficient);
    for (size_t i : local_)
      host::scaleInPlace<T>(pool_, parameters_.gradient(i).numElements(),
                            parameters_.gradient(i).data<T>(), coefficient);
  }

  host::AdamWParams adam = adamParams(config_, iteration);
  result.learningRate = adam.lr;
  for (const DataParallelBuffer::Piece &piece : buffer_.pieces()) {
    if (parameters_.info(piece.parameter).isExpertBias())
      continue;
    adam.weightDecay =
        parameters_.info(piece.parameter).weightDecay ? config_.weightDecay : 0;
    T *value = parameters_.value(piece.parameter).data<T>();
    host::adamwStep<T>(pool_, piece.count, value + piece.parameterOffset,
                       g + piece.shardOffset,
                       expAvg_.data<T>() + piece.shardOffset,
                       expAvgSq_.data<T>() + piece.shardOffset, adam);
  }
  for (size_t k = 0; k < local_.size(); ++k) {
    size_t i = local_[k];
    if (parameters_.info(i).isExpertBias())
      continue;
    adam.weightDecay =
        parameters_.info(i).weightDecay ? config_.weightDecay : 0;
    host::Tensor &value = parameters_.value(i);
    host::adamwStep<T>(pool_, value.numElements(), value.data<T>(),
                       parameters_.gradient(i).data<T>(),
                       localExpAvg_[k].data<T>(), localExpAvgSq_[k].data<T>(),
                       adam);
  }
  buffer_.gatherParameters(deferGather);
  return result;
}

} // namespace mtrt::train
