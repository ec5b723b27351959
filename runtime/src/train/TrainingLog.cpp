// Formatting and writing the trainer's logs.
#include "train/TrainingLog.h"

#include "core/Bundle.h"
#include "train/Trainer.h"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdarg>
#include <cstdio>
#include <cstring>
#include <iostream>
#include <unistd.h>

namespace mtrt::train {

namespace {

std::string format(const char *pattern, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 1, 2)))
#endif
    ;

std::string format(const char *pattern, ...) {
  va_list args;
  va_start(args, pattern);
  char buffer[512];
  std::vsnprintf(buffer, sizeof(buffer), pattern, args);
  va_end(args);
  return buffer;
}

std::string duration(double seconds) {
  auto total = static_cast<int64_t>(std::max(0.0, seconds) + 0.5);
  if (total >= 3600)
    return format("%lld:%02lld:%02lld", static_cast<long long>(total / 3600),
                  static_cast<long long>(total / 60 % 60),
                  static_cast<long long>(total % 60));
  return format("%02lld:%02lld", static_cast<long long>(total / 60),
                static_cast<long long>(total % 60));
}

} // namespace

TrainingLog::TrainingLog(std::ostream &out, const std::string &jsonlPath,
                         bool progressBar, int64_t trainIters,
                         int64_t logInterval)
    : out_(out), bar_(progressBar && isatty(STDERR_FILENO)),
      trainIters_(trainIters), logInterval_(logInterval),
      start_(std::chrono::steady_clock::now()), lastDraw_(start_) {
  if (!jsonlPath.empty()) {
    jsonl_.open(jsonlPath, std::ios::out | std::ios::trunc);
    if (!jsonl_)
      throw Error(MTRT_STATUS_INVALID_ARGUMENT,
                  "--log-jsonl: cannot open '" + jsonlPath + "' for writing (" +
                      std::strerror(errno) +
                      "); check that its directory exists and is writable");
  }
}

TrainingLog::~TrainingLog() { clearBar(); }

double languageModelLoss(double loss, const ReportedLosses &reported) {
  for (const auto &[name, value] : reported)
    if (name == kAuxLossName)
      return loss - value;
  return loss;
}

std::string TrainingLog::formatIteration(
    int64_t iteration, int64_t trainIters, int64_t consumedSamples,
    double millisecondsPerIteration, double learningRate,
    int64_t globalBatchSize, double lmLoss, double gradNorm,
    double tokensPerSecond, const std::optional<LossScaleLine> &fp16,
    const ReportedLosses &moeLosses) {
  std::string text = format(
      " iteration %8lld/%8lld | consumed samples: %lld | elapsed "
      "time per iteration (ms): %.1f | learning rate: %.3E | global "
      "batch size: %lld | lm loss: %.6E |",
      static_cast<long long>(iteration), static_cast<long long>(trainIters),
      static_cast<long long>(consumedSamples), millisecondsPerIteration,
      learningRate, static_cast<long long>(globalBatchSize), lmLoss);
  for (const auto &[name, value] : moeLosses)
    text += format(" %s: %.6E |", name.c_str(), value);
  if (fp16)
    text += format(" loss scale: %.1f |", fp16->scale);
  if (!std::isnan(gradNorm))
    text += format(" grad norm: %.3f |", gradNorm);
  if (fp16)
    text += format(" number of skipped iterations: %3lld | number of nan "
                   "iterations: %3lld |",
                   static_cast<long long>(fp16->skippedIterations),
                   static_cast<long long>(fp16->nanIterations));
  return text + format(" tokens per second: %.0f |", tokensPerSecond);
}

void TrainingLog::iteration(const IterationRecord &record,
                            int64_t consumedSamples, int64_t globalBatchSize,
                            int64_t tokensPerIteration) {
  ++intervalCount_;
  if (record.skipped) {
    ++intervalSkipped_;
    intervalNan_ += !std::isfinite(record.loss);
  } else {
    ++intervalAdvanced_;
    intervalLoss_ += languageModelLoss(record.loss, record.reportedLosses);
    for (const std::pair<std::string, double> &loss : record.reportedLosses) {
      if (loss.first == kAuxLossName)
        continue;
      auto sum = std::find_if(
          intervalMoeLosses_.begin(), intervalMoeLosses_.end(),
          [&](const auto &entry) { return entry.first == loss.first; });
      if (sum == intervalMoeLosses_.end())
        intervalMoeLosses_.push_back(loss);
      else
        sum->second += loss.second;
    }
  }
  intervalSeconds_ += record.seconds;
  intervalTokens_ += static_cast<double>(tokensPerIteration);
  lastIteration_ = record.iteration;
  lastLoss_ = record.loss;

  if (jsonl_.is_open()) {
    nlohmann::json entry = {{"iteration", record.iteration},
                            {"loss", record.loss},
                            {"lr", record.learningRate},
                            {"grad_norm", record.gradNorm},
                            {"tokens_per_second", record.tokensPerSecond},
                            {"consumed_samples", consumedSamples},
                            {"elapsed_ms", record.seconds * 1e3}};
    if (!record.reportedLosses.empty())
      entry["lm_loss"] = languageModelLoss(record.loss, record.reportedLosses);
    for (const auto &[name, value] : record.reportedLosses)
      entry[name] = value;
    if (record.lossScale > 0) {
      entry["loss_scale"] = record.lossScale;
      entry["skipped"] = record.skipped;
    }
    jsonl_ << entry.dump() << '\n' << std::flush;
  }
  if (record.iteration % logInterval_ == 0 || record.iteration == trainIters_) {
    double seconds = intervalSeconds_ / intervalCount_;
    std::optional<LossScaleLine> fp16;
    if (record.lossScale > 0)
      fp16 = LossScaleLine{record.lossScale, intervalSkipped_, intervalNan_};
    double advanced =
        static_cast<double>(std::max<int64_t>(1, intervalAdvanced_));
    for (auto &[name, sum] : intervalMoeLosses_)
      sum /= advanced;
    line(formatIteration(
        record.iteration, trainIters_, consumedSamples, seconds * 1e3,
        record.learningRate, globalBatchSize, intervalLoss_ / advanced,
        record.gradNorm,
        intervalSeconds_ > 0 ? intervalTokens_ / intervalSeconds_ : 0.0,
        fp16, intervalMoeLosses_));
    intervalMoeLosses_.clear();
    intervalCount_ = intervalAdvanced_ = intervalSkipped_ = intervalNan_ = 0;
    intervalLoss_ = intervalSeconds_ = intervalTokens_ = 0;
  } else {
    drawBar(false);
  }
}

void TrainingLog::evaluation(int64_t iteration, double loss, bool atEnd) {
  std::string text = format(
      " validation loss %s %lld | lm loss value: %.6E | lm loss PPL: "
      "%.6E | ",
      atEnd ? "at the end of training, iteration" : "at iteration",
      static_cast<long long>(iteration), loss, std::exp(std::min(20.0, loss)));
  std::string rule(text.size() + 1, '-');
  line(rule + "\n" + text + "\n" + rule);
  if (jsonl_.is_open()) {
    nlohmann::json entry = {{"iteration", iteration},
                            {"eval_loss", loss},
                            {"eval_ppl", std::exp(std::min(20.0, loss))}};
    jsonl_ << entry.dump() << '\n' << std::flush;
  }
}

void TrainingLog::line(const std::string &text) {
  clearBar();
  out_ << text << '\n' << std::flush;
  drawBar(true);
}

void TrainingLog::clearBar() {
  if (!barVisible_)
    return;
  std::fputs("\r\033[K", stderr);
  std::fflush(stderr);
  barVisible_ = false;
}

void TrainingLog::drawBar(bool force) {
  if (!bar_ || lastIteration_ == 0 || lastIteration_ >= trainIters_)
    return;
  auto now = std::chrono::steady_clock::now();
  if (!force && now - lastDraw_ < std::chrono::milliseconds(100))
    return;
  lastDraw_ = now;
  double elapsed = std::chrono::duration<double>(now - start_).count();
  double fraction = static_cast<double>(lastIteration_) / trainIters_;
  constexpr int kWidth = 30;
  int filled = static_cast<int>(fraction * kWidth);
  std::string bar(filled, '#');
  bar.resize(kWidth, '.');
  double eta = elapsed / lastIteration_ * (trainIters_ - lastIteration_);
  std::string text =
      format("\r[%s] %lld/%lld %3.0f%% | lm loss %.4f | %s elapsed, %s left",
             bar.c_str(), static_cast<long long>(lastIteration_),
             static_cast<long long>(trainIters_), fraction * 100, lastLoss_,
             duration(elapsed).c_str(), duration(eta).c_str());
  std::fputs(text.c_str(), stderr);
  std::fputs("\033[K", stderr);
  std::fflush(stderr);
  barVisible_ = true;
}

} // namespace mtrt::train
