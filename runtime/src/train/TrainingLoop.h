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
  OptimizerStepResult step;
};

/// Runs `options.trainIters` iterations: times each, records it in
/// `history`, logs it, evaluates every `evalInterval` iterations and once at
/// the end if the last iteration was not an evaluation point. `iterate`
/// runs one iteration given its number and the samples consumed before it;
/// `evaluate` is empty when the bundle has no eval_step.
void runTrainingLoop(const TrainerOptions &options, TrainingLog &log,
                     int64_t globalBatch, int64_t tokensPerIteration,
                     const std::function<IterationResult(int64_t, int64_t)>
                         &iterate,
                     const std::function<double()> &evaluate,
                     std::vector<IterationRecord> &history);

} // namespace mtrt::train

#endif // MTRT_SRC_TRAIN_TRAININGLOOP_H
