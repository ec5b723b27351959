// Megatron-LM-style training logs: interval lines, validation lines, a JSONL
// metrics file, a progress bar.
#ifndef MTRT_SRC_TRAIN_TRAININGLOG_H
#define MTRT_SRC_TRAIN_TRAININGLOG_H

#include <chrono>
#include <cstdint>
#include <fstream>
#include <iosfwd>
#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace mtrt::train {

struct IterationRecord;

/// train_step's reported losses by name (Function::outputNames after
/// "loss": the MoE auxiliary losses), in its output order.
using ReportedLosses = std::vector<std::pair<std::string, double>>;

/// The language-model loss of a step's `loss` (Megatron-LM's "lm loss"):
/// less its "aux_loss" where it reports one.
double languageModelLoss(double loss, const ReportedLosses &reported);

/// What Megatron-LM's log line adds under --fp16: the loss scale and, over
/// the logging interval, the iterations that skipped their optimizer step and
/// those of them whose loss was inf or nan.
struct LossScaleLine {
  double scale = 0;
  int64_t skippedIterations = 0;
  int64_t nanIterations = 0;
};

/// Writes what the trainer reports:
/// - every `logInterval` iterations, a line on `out` in Megatron-LM's format
///   with the interval's averages of time, loss and throughput;
/// - after every iteration and evaluation, a JSON object on one line of the
///   JSONL file (if a path was given);
/// - a one-line progress bar on stderr, only when stderr is a terminal and
///   the bar is enabled; it is cleared before each line on `out` and redrawn
///   after.
class TrainingLog {
public:
  /// Throws Error (INVALID_ARGUMENT) if the JSONL file cannot be opened.
  TrainingLog(std::ostream &out, const std::string &jsonlPath, bool progressBar,
              int64_t trainIters, int64_t logInterval);
  ~TrainingLog();

  void iteration(const IterationRecord &record, int64_t consumedSamples,
                 int64_t globalBatchSize, int64_t tokensPerIteration);
  void evaluation(int64_t iteration, double loss, bool atEnd);
  /// A free-form line on `out`.
  void line(const std::string &text);

  /// Megatron-LM's line for one logging interval (exposed for tests), with
  /// `lmLoss` as its "lm loss" and each of `moeLosses` after it (its
  /// load-balancing loss and z_loss). A NaN `gradNorm` (a skipped step) is
  /// left out, as Megatron-LM leaves out a missing one.
  static std::string
  formatIteration(int64_t iteration, int64_t trainIters,
                  int64_t consumedSamples, double millisecondsPerIteration,
                  double learningRate, int64_t globalBatchSize, double lmLoss,
                  double gradNorm, double tokensPerSecond,
                  const std::optional<LossScaleLine> &fp16 = std::nullopt,
                  const ReportedLosses &moeLosses = {});

private:
  void clearBar();
  void drawBar(bool force);

  std::ostream &out_;
  std::ofstream jsonl_;
  bool bar_;
  bool barVisible_ = false;
  int64_t trainIters_, logInterval_;
  std::chrono::steady_clock::time_point start_, lastDraw_;
  int64_t lastIteration_ = 0;
  double lastLoss_ = 0;

  // Sums over the current logging interval; the loss over the iterations
  // that updated the parameters (Megatron-LM's advanced iterations).
  int64_t intervalCount_ = 0, intervalAdvanced_ = 0, intervalSkipped_ = 0,
          intervalNan_ = 0;
  double intervalLoss_ = 0, intervalSeconds_ = 0, intervalTokens_ = 0;
  /// The reported losses but aux_loss, summed as the loss.
  ReportedLosses intervalMoeLosses_;
};

} // namespace mtrt::train

#endif // MTRT_SRC_TRAIN_TRAININGLOG_H
