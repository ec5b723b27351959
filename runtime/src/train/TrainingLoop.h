// Megatron-LM's outer training loop, shared by the host and CUDA trainers.
#ifndef MTRT_SRC_TRAIN_TRAININGLOOP_H
#define MTRT_SRC_TRAIN_TRAININGLOOP_H

#include "train/Optimizer.h"
#include "train/Trainer.h"
#include "train/TrainingLog.h"

#include <cstdint>
#include <functional>
#include <vector>

namespace mtrt::train {

/// What one iteration did on a backend: the mean of its micro-batches'
/// losses and the optimizer step's result.
struct IterationResult {
  double loss = 0;
  /// train_step's reported losses: summed by addReportedLosses over the
  /// micro-batches, then divided by meanOf.
  ReportedLosses reportedLosses;
  OptimizerStepResult step;
  /// fp16: the loss scale after the iteration, and whether it skipped its
  /// optimizer step (IterationRecord's fields).
  double lossScale = 0;
  bool skipped = false;
};

/// fp16, after the unscale and the overflow check: records `found` (an inf
/// or nan gradient element on some rank) in `scaler` and the scale after it
/// in `result`. On an overflow, counts the iteration in `skippedIterations`,
/// fills the skipped step's record (a NaN grad norm, the learning rate of
/// the update still to come) and returns true: the caller skips the
/// optimizer step. Megatron-LM's order, shared by the host and CUDA
/// trainers.
/// Adds a micro-batch's reported losses (`trainStep`'s outputs after the
/// loss, named by its outputNames) to `sums`.
void addReportedLosses(const Function &trainStep,
                       const std::vector<host::Tensor> &outputs,
                       ReportedLosses &sums);
/// Divides each of `sums` by `microBatches`.
void meanOf(ReportedLosses &sums, int64_t microBatches);

bool skipOnOverflow(LossScaler &scaler, bool found, int64_t iteration,
                    int64_t &skippedIterations,
                    const host::LrSchedule &schedule, IterationResult &result);

/// Where a loop starts: after `iteration` completed iterations (those of a
/// loaded checkpoint) that consumed `consumedSamples` samples.
struct LoopStart {
  int64_t iteration = 0;
  int64_t consumedSamples = 0;
};

/// Runs iterations start.iteration + 1 to `options.trainIters`: times each,
/// records it in `history`, logs it, evaluates every `evalInterval`
/// iterations and once at the end if the last iteration was not an
/// evaluation point, and, when `save` is given, calls it after every
/// `saveInterval`-th iteration and after the last (as Megatron-LM saves at
/// the end of training). `iterate` runs one iteration given its number and
/// the samples consumed before it; `evaluate` is empty when the bundle has
/// no eval_step; `save` gets the iteration and the samples consumed by it.
void runTrainingLoop(
    const TrainerOptions &options, TrainingLog &log, int64_t globalBatch,
    int64_t tokensPerIteration,
    const std::function<IterationResult(int64_t, int64_t)> &iterate,
    const std::function<double()> &evaluate,
    std::vector<IterationRecord> &history, const LoopStart &start = {},
    const std::function<void(int64_t, int64_t)> &save = {});

} // namespace mtrt::train

#endif // MTRT_SRC_TRAIN_TRAININGLOOP_H
