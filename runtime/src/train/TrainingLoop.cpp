// Megatron-LM's outer training loop, shared by the host and CUDA trainers.
#include "train/TrainingLoop.h"

#include <chrono>
#include <limits>

namespace mtrt::train {

void addReportedLosses(const Function &trainStep,
                       const std::vector<host::Tensor> &outputs,
                       ReportedLosses &sums) {
  for (size_t i = 1; i < trainStep.outputNames.size(); ++i) {
    const host::Tensor &value = outputs[i];
    double v = value.dtype == DType::F64
                   ? value.data<double>()[0]
                   : static_cast<double>(value.data<float>()[0]);
    if (sums.size() < i)
      sums.emplace_back(trainStep.outputNames[i], 0.0);
    sums[i - 1].second += v;
  }
}

void meanOf(ReportedLosses &sums, int64_t microBatches) {
  for (auto &[name, value] : sums)
    value /= static_cast<double>(microBatches);
}

bool skipOnOverflow(LossScaler &scaler, bool found, int64_t iteration,
                    int64_t &skippedIterations,
                    const host::LrSchedule &schedule, IterationResult &result) {
  scaler.update(found);
  result.lossScale = scaler.scale();
  if (!found)
    return false;
  ++skippedIterations;
  result.skipped = true;
  result.step.gradNorm = std::numeric_limits<double>::quiet_NaN();
  result.step.learningRate =
      host::learningRate(schedule, iteration - skippedIterations);
  return true;
}

void runTrainingLoop(
    const TrainerOptions &options, TrainingLog &log, int64_t globalBatch,
    int64_t tokensPerIteration,
    const std::function<IterationResult(int64_t, int64_t)> &iterate,
    const std::function<double()> &evaluate,
    std::vector<IterationRecord> &history, const LoopStart &start,
    const std::function<void(int64_t, int64_t)> &save) {
  int64_t consumed = start.consumedSamples;
  bool evaluatedLast = false, savedLast = false;
  int64_t iteration = start.iteration + 1;
  for (; iteration <= options.trainIters; ++iteration) {
    auto begin = std::chrono::steady_clock::now();
    IterationResult result = iterate(iteration, consumed);
    consumed += globalBatch;
    double seconds =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - begin)
            .count();

    IterationRecord record;
    record.iteration = iteration;
    record.loss = result.loss;
    record.reportedLosses = result.reportedLosses;
    record.learningRate = result.step.learningRate;
    record.gradNorm = result.step.gradNorm;
    record.lossScale = result.lossScale;
    record.skipped = result.skipped;
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
    savedLast = false;
    if (save && options.saveInterval > 0 &&
        iteration % options.saveInterval == 0) {
      save(iteration, consumed);
      savedLast = true;
    }
  }
  if (iteration == start.iteration + 1)
    return; // a checkpoint at or past --train-iters: nothing to do
  if (evaluate && !evaluatedLast)
    log.evaluation(options.trainIters, evaluate(), true);
  if (save && !savedLast)
    save(options.trainIters, consumed);
}

} // namespace mtrt::train
