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
    double IterationRecord::*field;
  };
  const Curve curves[] = {
      {"loss.png", "TRAINING LOSS", "LM LOSS", &IterationRecord::loss},
      {"learning-rate.png", "LEARNING RATE", "LEARNING RATE",
       &IterationRecord::learningRate},
      {"throughput.png", "THROUGHPUT", "TOKENS/S",
       &IterationRecord::tokensPerSecond},
  };
  std::vector<std::string> written;
  for (const Curve &curve : curves) {
    LineChart chart;
    chart.title = curve.title;
    chart.xLabel = "ITERATION";
    chart.yLabel = curve.yLabel;
    for (const IterationRecord &record : history) {
      chart.x.push_back(static_cast<double>(record.iteration));
      chart.y.push_back(record.*curve.field);
    }
    std::string path = (std::filesystem::path(dir) / curve.file).string();
    writePng(path, kChartWidth, kChartHeight, renderChart(chart));
    written.push_back(path);
  }
  return written;
}

} // namespace mtrt::train
