// Megatron-LM's optimizer step on the host: gradient scaling, global-norm
// clipping, AdamW, the LR schedule.
#ifndef MTRT_SRC_TRAIN_OPTIMIZER_H
#define MTRT_SRC_TRAIN_OPTIMIZER_H

#include "core/Bundle.h"
#include "host/kernels/Kernels.h"

#include <cstdint>
#include <vector>

namespace mtrt::host {
class ParameterStore;
class ThreadPool;
} // namespace mtrt::host

namespace mtrt::comm {
class RankContext;
} // namespace mtrt::comm

namespace mtrt::train {

struct OptimizerConfig {
  /// Applied to parameters whose manifest entry has weight_decay true.
  double weightDecay = 0.01;
  double beta1 = 0.9;
  double beta2 = 0.95;
  double eps = 1e-8;
  /// Clip to this global L2 norm; 0 disables clipping.
  double clipGrad = 1.0;
  host::LrSchedule schedule;
};

struct OptimizerStepResult {
  /// The global gradient norm after scaling and before clipping (what
  /// Megatron-LM logs as "grad norm").
  double gradNorm = 0;
  /// The learning rate the update used.
  double learningRate = 0;
};

/// Whether the rank at `coordinates` adds its part of `parameter`'s gradient
/// to the global norm: only the replica at coordinate 0 of every grid axis
/// that neither splits the parameter nor is in `distinctAxes` (axes along
/// which ranks hold distinct parts anyway, as the distributed optimizer's
/// data-parallel shards), so each distinct element counts once.
bool countsInNorm(const Parameter &parameter,
                  const std::vector<int64_t> &coordinates,
                  const std::vector<int64_t> &distinctAxes);

/// Throws Error (ABORTED) naming the iteration if `gradNorm` is not finite.
void checkGradNorm(double gradNorm, int64_t iteration);
/// Megatron-LM's found_inf: `found` (this rank saw an inf or nan gradient
/// element) all-reduced with MAX over `rank`'s world (every data-, tensor-
/// and pipeline-parallel rank), so that every rank skips the step together.
/// Without a rank, `found` itself.
bool foundOnAnyRank(bool found, comm::RankContext *rank, int64_t iteration);
/// The factor Megatron-LM's clip_grad_norm scales the gradients by: clipGrad
/// / (norm + 1e-6) when clipping is on and that is below 1, else 1.
double clipCoefficient(const OptimizerConfig &config, double gradNorm);
/// Aux-loss-free balancing's update of an expert bias (Parameter::
/// isExpertBias, Megatron-LM's get_updated_expert_bias): `bias[e] += rate *
/// sign(mean - counts[e])` for `n` entries, in T (f32 as Megatron-LM's),
/// where `mean` is the mean of all the bias's counts (expertLoadMean when
/// they are whole here).
template <typename T>
void updateExpertBias(T *bias, const T *counts, int64_t n, T mean,
                      double rate) {
  const T step = static_cast<T>(rate);
  for (int64_t e = 0; e < n; ++e) {
    T offset = mean - counts[e];
    bias[e] += offset > 0 ? step : offset < 0 ? -step : T(0);
  }
}
/// The mean of `n` token counts whose sum is `total`, in T (exact sums:
/// the counts are integers).
template <typename T> T expertLoadMean(double total, int64_t n) {
  return static_cast<T>(total) / static_cast<T>(n);
}

/// AdamW's hyperparameters for `iteration` (counting from 1), without the
/// per-parameter weight decay.
host::AdamWParams adamParams(const OptimizerConfig &config, int64_t iteration);

/// One optimizer step over every parameter of a ParameterStore, in
/// Megatron-LM's order: gradients *= gradScale (1/micro-batches); total norm
/// = sqrt(sum of every gradient's squares); if clipGrad > 0 and clipGrad /
/// (norm + 1e-6) < 1, gradients *= that coefficient; then AdamW (decoupled
/// weight decay, torch.optim.AdamW's formulas) with the learning rate of the
/// schedule after iteration - 1 completed iterations, as Megatron-LM's
/// OptimizerParamScheduler.
///
/// With a RankContext (a bundle for several ranks), each rank steps its
/// shards; the norm is that of the global gradient: each parameter's sum of
/// squares is summed over the ranks that hold distinct shards of it (a
/// replicated parameter, whose gradient every replica holds, counts once),
/// all-reduced over the world, so every rank clips by the same coefficient.
class Optimizer {
public:
  /// `rank` (optional) must outlive the optimizer.
  Optimizer(host::ParameterStore &parameters, host::ThreadPool &pool,
            const OptimizerConfig &config, comm::RankContext *rank = nullptr);

  /// `iteration` counts the optimizer's updates from 1: the LR schedule's
  /// position and AdamW's bias correction (the training iteration, less
  /// the iterations fp16 loss scaling skipped). Throws Error (ABORTED) if
  /// the gradient norm is not finite, naming it, before anything is
  /// updated.
  OptimizerStepResult step(int64_t iteration, double gradScale);

  /// fp16 loss scaling, before step(): every gradient *= `factor` (the
  /// inverse loss scale); returns whether any element on any rank is inf or
  /// nan (foundOnAnyRank), in which case the caller skips step().
  bool unscaleAndCheckFinite(double factor, int64_t iteration);

  const OptimizerConfig &config() const { return config_; }

private:
  template <typename T> OptimizerStepResult stepTyped(int64_t, double);

  host::ParameterStore &parameters_;
  host::ThreadPool &pool_;
  OptimizerConfig config_;
  comm::RankContext *rank_ = nullptr;
};

} // namespace mtrt::train

#endif // MTRT_SRC_TRAIN_OPTIMIZER_H
