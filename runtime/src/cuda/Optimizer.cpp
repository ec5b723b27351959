// Gradient scaling, clipping and AdamW over a cuda::ParameterStore.
#include "cuda/Optimizer.h"

#include "comm/RankContext.h"
#include "cuda/CudaCheck.h"
#include "cuda/ParameterStore.h"
#include "cuda/kernels/Kernels.h"

#include <algorithm>
#include <cmath>
#include <vector>

namespace mtrt::cuda {

AdamWScalars adamwScalars(const train::OptimizerConfig &config,
                          int64_t iteration, double gradScale,
                          double gradNorm) {
  AdamWScalars s;
  s.applyScale = gradScale != 1.0;
  s.gradScale = s.applyScale ? static_cast<float>(gradScale) : 1.0f;
  double coefficient = train::clipCoefficient(config, gradNorm);
  if (coefficient < 1.0) {
    s.applyClip = true;
    s.clipCoefficient = static_cast<float>(coefficient);
  }
  // host::adamwStep's scalars, computed in double and rounded to float.
  double lr = host::learningRate(config.schedule, iteration - 1);
  double stepNumber = static_cast<double>(iteration);
  double biasCorrection1 = 1.0 - std::pow(config.beta1, stepNumber);
  double biasCorrection2 = 1.0 - std::pow(config.beta2, stepNumber);
  s.beta1 = static_cast<float>(config.beta1);
  s.beta2 = static_cast<float>(config.beta2);
  s.oneMinusBeta1 = static_cast<float>(1.0 - config.beta1);
  s.oneMinusBeta2 = static_cast<float>(1.0 - config.beta2);
  s.stepSize = static_cast<float>(lr / biasCorrection1);
  s.bias2Sqrt = static_cast<float>(std::sqrt(biasCorrection2));
  s.eps = static_cast<float>(config.eps);
  s.decay = static_cast<float>(1.0 - lr * config.weightDecay);
  return s;
}

Optimizer::Optimizer(ParameterStore &parameters,
                     const train::OptimizerConfig &config,
                     comm::RankContext *rank)
    : parameters_(parameters), config_(config), rank_(rank),
      norm_(sizeof(double) *
                (rank ? std::max<size_t>(parameters.size(), 1) : 1),
            "the gradient norm") {
  if (!parameters.hasOptimizerState())
    throw Error(MTRT_STATUS_INTERNAL,
                "cuda::Optimizer: the parameter store holds no AdamW moments "
                "(the distributed optimizer's store)");
  // The gradients: the store's flat array, or slots in the train step's
  // arena, counted from the lowest.
  if (parameters.gradientsInArena()) {
    for (size_t i = 0; i < parameters.size(); ++i) {
      if (!parameters.gradient(i))
        throw Error(MTRT_STATUS_FAILED_PRECONDITION,
                    "cuda::Optimizer: the gradients live in the arena and "
                    "are not bound yet (ParameterStore::bindGradients)");
      gradientBase_ = gradientBase_
                          ? std::min(gradientBase_, parameters.gradient(i))
                          : parameters.gradient(i);
    }
  } else {
    gradientBase_ = parameters.gradients();
  }
  // The multi-tensor AdamW's table: each parameter cut into chunks.
  std::vector<AdamWChunk> chunks;
  for (size_t i = 0; i < parameters.size(); ++i) {
    if (parameters.info(i).isExpertBias()) {
      expertBiases_.push_back(i);
      continue;
    }
    appendAdamWChunks(chunks, parameters, i, 0, parameters.count(i),
                      parameters.offset(i),
                      parameters.gradient(i) - gradientBase_);
  }
  scratch_ = DeviceBuffer(
      normByChunks() ? sumOfSquaresOfChunksScratchBytes(
                           static_cast<int64_t>(chunks.size()))
                     : sumOfSquaresScratchBytes(parameters.flatElements()),
      "the gradient norm's partial sums");
  chunkCount_ = static_cast<int64_t>(chunks.size());
  if (chunks.empty())
    return;
  size_t bytes = sizeof(AdamWChunk) * chunks.size();
  chunks_ = DeviceBuffer(bytes, "the AdamW chunk table");
  Context &context = parameters.context();
  MTRT_CUDA_CHECK(cudaMemcpyAsync(chunks_.data(), chunks.data(), bytes,
                                  cudaMemcpyHostToDevice, context.stream()),
                  "uploading the AdamW chunk table");
  context.synchronize("uploading the AdamW chunk table");
}

void appendAdamWChunks(std::vector<AdamWChunk> &chunks,
                       const ParameterStore &parameters, size_t i,
                       int64_t first, int64_t count, int64_t stateBegin,
                       int64_t gradBegin) {
  int64_t bf16 = parameters.bf16Offset(i);
  for (int64_t at = 0; at < count; at += kAdamWChunkElements) {
    AdamWChunk chunk;
    chunk.begin = parameters.offset(i) + first + at;
    chunk.stateBegin = stateBegin + at;
    chunk.gradBegin = gradBegin + at;
    chunk.bf16Begin = bf16 < 0 ? -1 : bf16 + first + at;
    chunk.count = static_cast<int32_t>(
        std::min<int64_t>(kAdamWChunkElements, count - at));
    chunk.weightDecay = parameters.info(i).weightDecay ? 1 : 0;
    chunks.push_back(chunk);
  }
}

bool Optimizer::normByChunks() const {
  return parameters_.gradientsInArena() || !expertBiases_.empty();
}

void updateExpertBiases(ParameterStore &parameters,
                        const std::vector<size_t> &biases,
                        const std::string &what) {
  Context &context = parameters.context();
  cudaStream_t stream = context.stream();
  std::vector<std::vector<float>> values(biases.size()), counts(biases.size());
  for (size_t k = 0; k < biases.size(); ++k) {
    size_t n = static_cast<size_t>(parameters.count(biases[k]));
    values[k].resize(n);
    counts[k].resize(n);
    MTRT_CUDA_CHECK(
        cudaMemcpyAsync(values[k].data(), parameters.value(biases[k]),
                        n * sizeof(float), cudaMemcpyDeviceToHost, stream),
        what + " (reading an expert bias)");
    MTRT_CUDA_CHECK(
        cudaMemcpyAsync(counts[k].data(), parameters.gradient(biases[k]),
                        n * sizeof(float), cudaMemcpyDeviceToHost, stream),
        what + " (reading an expert bias's tokens per expert)");
  }
  context.synchronize(what + " (the expert biases)");
  for (size_t k = 0; k < biases.size(); ++k) {
    size_t i = biases[k];
    int64_t n = static_cast<int64_t>(values[k].size());
    if (n == 0)
      continue;
    double total = 0;
    for (float c : counts[k])
      total += c;
    train::updateExpertBias<float>(values[k].data(), counts[k].data(), n,
                                   train::expertLoadMean<float>(total, n),
                                   parameters.info(i).expertBiasUpdateRate);
    MTRT_CUDA_CHECK(cudaMemcpyAsync(parameters.value(i), values[k].data(),
                                    n * sizeof(float), cudaMemcpyHostToDevice,
                                    stream),
                    what + " (writing an expert bias)");
    if (parameters.bf16Offset(i) >= 0)
      parameters.refreshBf16Copy(i);
  }
  context.synchronize(what + " (the expert biases)");
}

train::OptimizerStepResult Optimizer::step(int64_t iteration,
                                           double gradScale) {
  Context &context = parameters_.context();
  cudaStream_t stream = context.stream();
  std::string what = "optimizer step of iteration " + std::to_string(iteration);

  // The host scales the gradients in place, then sums their squares; here
  // the scaled value is formed on the fly (same float product) and stored by
  // the AdamW kernel.
  float scale = gradScale != 1.0 ? static_cast<float>(gradScale) : 1.0f;
  if (!expertBiases_.empty())
    updateExpertBiases(parameters_, expertBiases_, what);
  double sumOfSquaresValue = 0;
  if (!rank_) {
    if (normByChunks())
      MTRT_CUDA_CHECK_LAUNCH(
          sumOfSquaresOfChunks(stream, chunkCount_, chunks_.as<AdamWChunk>(),
                               gradientBase_, scale, norm_.as<double>(),
                               scratch_.data()),
          what);
    else
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
      if (parameters_.info(i).isExpertBias() ||
          !train::countsInNorm(parameters_.info(i), rank_->coordinates(), {}))
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
  train::checkGradNorm(result.gradNorm, iteration);
  AdamWScalars s = adamwScalars(config_, iteration, gradScale, result.gradNorm);
  result.learningRate = host::learningRate(config_.schedule, iteration - 1);
  if (chunkCount_ > 0) // the flat arrays start at parameter 0
    MTRT_CUDA_CHECK_LAUNCH(
        adamwStepChunks(stream, chunkCount_, chunks_.as<AdamWChunk>(),
                        parameters_.value(0), gradientBase_,
                        parameters_.expAvg(0), parameters_.expAvgSq(0),
                        parameters_.bf16Values(), s),
        what + " (AdamW over " + std::to_string(parameters_.size()) +
            " parameters)");
  return result;
}

} // namespace mtrt::cuda
