// Megatron-LM's optimizer step on the device: gradient scaling, global-norm
// clipping, AdamW, the LR schedule.
#ifndef MTRT_SRC_CUDA_OPTIMIZER_H
#define MTRT_SRC_CUDA_OPTIMIZER_H

#include "cuda/Context.h"
#include "cuda/kernels/Kernels.h"
#include "train/Optimizer.h"

#include <cstdint>
#include <string>
#include <vector>

namespace mtrt::comm {
class RankContext;
} // namespace mtrt::comm

namespace mtrt::cuda {

class ParameterStore;

/// The AdamW kernel's scalars for update `iteration` (counting from 1):
/// host::adamwStep's, computed in double and rounded to float; the
/// gradient scaling by gradScale (when not 1) and the clipping coefficient
/// of `gradNorm` (train::clipCoefficient, when below 1).
AdamWScalars adamwScalars(const train::OptimizerConfig &config,
                          int64_t iteration, double gradScale, double gradNorm);

/// train::Optimizer's step over a cuda::ParameterStore, with the same
/// configuration and results: the gradients are scaled by gradScale, their
/// global norm is computed (in double, over one flat array, or per chunk
/// when the gradients live in the train step's arena: they must be bound
/// before the optimizer is made), the clipping
/// coefficient applied, and AdamW updates values and moments with the same
/// float arithmetic as host::adamwStep. One synchronization per step (the
/// norm comes to the host for the clipping decision and the log); then one
/// launch (adamwStepChunks over a table of every parameter's chunks) scales
/// and clips each gradient as it reads it (the gradients stay as they
/// were), updates values and moments and writes the parameters' bf16
/// copies.
class Optimizer {
public:
  /// With `rank` (one rank of a tensor-parallel grid), the norm is the
  /// host's: per parameter, the squares of the parameters that count on this
  /// rank (train::countsInNorm), all-reduced over the world.
  Optimizer(ParameterStore &parameters, const train::OptimizerConfig &config,
            comm::RankContext *rank = nullptr);

  /// `iteration` counts from 1. Throws Error (ABORTED) if the gradient norm
  /// is not finite, naming the iteration, before anything is updated.
  train::OptimizerStepResult step(int64_t iteration, double gradScale);

  const train::OptimizerConfig &config() const { return config_; }

private:
  /// Whether the one-rank norm sums the chunks (gradients in the arena, or
  /// expert biases to leave out) rather than the flat gradient array.
  bool normByChunks() const;

  ParameterStore &parameters_;
  train::OptimizerConfig config_;
  comm::RankContext *rank_ = nullptr;
  DeviceBuffer scratch_;
  DeviceBuffer norm_;
  /// Where the chunks' gradBegin counts from: the store's flat gradients,
  /// or the lowest gradient slot in the train step's arena.
  float *gradientBase_ = nullptr;
  /// The AdamWChunk table on the device.
  DeviceBuffer chunks_;
  int64_t chunkCount_ = 0;
  /// The expert biases (Parameter::isExpertBias): outside the chunks, so
  /// outside the norm and AdamW.
  std::vector<size_t> expertBiases_;
};

/// Appends to `chunks` the multi-tensor AdamW's chunks of `count` elements
/// of parameter i from element `first` of it: the values at the store's
/// offset(i) + first, the moments at `stateBegin` and the gradient at
/// `gradBegin` (counted from the tables' bases), the bf16 copy if any.
void appendAdamWChunks(std::vector<AdamWChunk> &chunks,
                       const ParameterStore &parameters, size_t i,
                       int64_t first, int64_t count, int64_t stateBegin,
                       int64_t gradBegin);

/// train::updateExpertBias on the device store's parameters `biases` from
/// their gradients (the tokens per expert, whole on this rank): both come
/// to the host, the biases go back (with their bf16 copies), so that the
/// arithmetic is the host backend's.
void updateExpertBiases(ParameterStore &parameters,
                        const std::vector<size_t> &biases,
                        const std::string &what);

} // namespace mtrt::cuda

#endif // MTRT_SRC_CUDA_OPTIMIZER_H
