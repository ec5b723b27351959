// Megatron-LM's outer training loop, shared by the host and CUDA trainers.
#include "train/TrainingLoop.h"

#include <chrono>

namespace mtrt::train {

void runTrainingLoop(const TrainerOptions &options, TrainingLog &log,
                     int64_t globalBatch, int64_t tokensPerIteration,
                     const std::function<IterationResult(int64_t, int64_t)>
                         &iterate,
                     const std::function<double()> &evaluate,
                     std::vector<IterationRecord> &history) {
  int64_t consumed = 0;
  bool evaluatedLast = false;
  for (int64_t iteration = 1; iteration <= options.trainIters; ++iteration) {
    auto start = std::chrono::steady_clock::now();
    IterationResult result = iterate(iteration, consumed);
    consumed += globalBatch;
    double seconds =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start)
            .count();

    IterationRecord record;
    record.iteration = iteration;
    record.loss = result.loss;
    record.learningRate = result.step.learningRate;
    record.gradNorm = result.step.gradNorm;
    record.seconds = seconds;
    record.tokensPerSecond =
        seconds > 0 ? static_cast<double>(tokensPerIteration) / seconds : 0;
    history.push_back(record);
    log.iteration(record, consumed, globalBatch, tokensPerIteration);

    evaluatedLast = false;
    if (evaluate && options.evalInterval > 0 &&
        iteration % options.evalInterval == 0) {
      log.evaluation(iteration, evaluate(), false);
      evaluatedLast = true;
    }
  }
  if (evaluate && !evaluatedLast)
    log.evaluation(options.trainIters, evaluate(), true);
}

} // namespace mtrt::train
