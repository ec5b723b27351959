// Loss, learning-rate and throughput curves from the training history.
#include "train/TrainingPlots.h"

#include "train/LineChart.h"

#include <filesystem>

namespace mtrt::train {

std::vector<std::string>
writeTrainingPlots(const std::vector<IterationRecord> &history,
                   const std::string &dir) {
  struct Curve {
    const char *file, *title, *yLabel;
    double (*value)(const IterationRecord &);
  };
  const Curve curves[] = {
      // The log line's "lm loss": without an MoE model's auxiliary losses.
      {"loss.png", "TRAINING LOSS", "LM LOSS",
       [](const IterationRecord &r) {
         return languageModelLoss(r.loss, r.reportedLosses);
       }},
      {"learning-rate.png", "LEARNING RATE", "LEARNING RATE",
       [](const IterationRecord &r) { return r.learningRate; }},
      {"throughput.png", "THROUGHPUT", "TOKENS/S",
       [](const IterationRecord &r) { return r.tokensPerSecond; }},
  };
  std::vector<std::string> written;
  for (const Curve &curve : curves) {
    LineChart chart;
    chart.title = curve.title;
    chart.xLabel = "ITERATION";
    chart.yLabel = curve.yLabel;
    for (const IterationRecord &record : history) {
      chart.x.push_back(static_cast<double>(record.iteration));
      chart.y.push_back(curve.value(record));
    }
    std::string path = (std::filesystem::path(dir) / curve.file).string();
    writePng(path, kChartWidth, kChartHeight, renderChart(chart));
    written.push_back(path);
  }
  return written;
}

} // namespace mtrt::train
