// The PNG curves megatron-train --plot-dir draws after training.
#ifndef MTRT_SRC_TRAIN_TRAININGPLOTS_H
#define MTRT_SRC_TRAIN_TRAININGPLOTS_H

#include "train/Trainer.h"

#include <string>
#include <vector>

namespace mtrt::train {

/// Writes loss.png (training loss), learning-rate.png and throughput.png
/// (tokens per second) against the iteration into `dir`, each
/// kChartWidth x kChartHeight; returns their paths. Throws Error naming a
/// file that cannot be written.
std::vector<std::string>
writeTrainingPlots(const std::vector<IterationRecord> &history,
                   const std::string &dir);

} // namespace mtrt::train

#endif // MTRT_SRC_TRAIN_TRAININGPLOTS_H
