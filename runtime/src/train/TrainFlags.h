// megatron-train's command line: Megatron-LM's flag names, parsed into
// TrainerOptions.
#ifndef MTRT_SRC_TRAIN_TRAINFLAGS_H
#define MTRT_SRC_TRAIN_TRAINFLAGS_H

// For the flag mechanism's editDistance, which callers of this header use.
#include "core/CommandLine.h"
#include "train/Trainer.h"
#include "train/Weights.h"

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace mtrt::train {

struct TrainCommand {
  std::string bundlePath;
  /// --data-path's values: a text file (tokenized when training starts), a
  /// .bin/.idx prefix, or weights and prefixes of a blend.
  std::vector<std::string> dataPath;
  /// --bf16, --fp16: checked against the backend and the bundle's
  /// precision; --fp16 sets options.lossScaling.
  bool bf16 = false, fp16 = false;
  /// --loss-scale: a static scale.
  std::optional<double> lossScale;
  /// --initial-loss-scale, --min-loss-scale, --loss-scale-window,
  /// --hysteresis.
  LossScalerOptions lossScaler;
  /// The flags given, by name.
  std::vector<std::string> given;
  /// --plot-dir: where the PNG curves go after training; empty: none.
  std::string plotDir;
  TrainerOptions options;
  int64_t sampleTokens = 0;
  /// --temperature, --top-k (the seed is --seed).
  SamplingOptions sampling;
  /// Default: the first bytes of the corpus.
  std::optional<std::string> samplePrompt;
  /// --init-from: Hugging Face-named safetensors weights loaded after the
  /// seeded initialization; empty when not given.
  std::string initFrom;
  /// --save-weights: where the weights are written after training; empty
  /// when not given.
  std::string saveWeights;
  /// --save-weights-experts: the names of a mixture-of-experts model's
  /// routed experts in the --save-weights file (Weights.h, ExpertNames).
  ExpertNames saveWeightsExperts = ExpertNames::Bundle;
  /// --backend: "host" (CPU) or "cuda" (GPU), where the step runs.
  std::string backend = "host";
  /// --in-process-ranks: run each rank of a bundle for several ranks as a
  /// thread of this process.
  bool inProcessRanks = false;
  /// --collective-timeout: seconds a collective of a multi-process run may
  /// take before the run is aborted (NCCL's watchdog).
  double collectiveTimeout = 300;
  bool help = false;
};

/// Parses the arguments after the program name. Accepts `--flag value` and
/// `--flag=value`; --data-path takes one or more values (up to the next
/// flag), as in Megatron-LM. Throws Error (INVALID_ARGUMENT) with a message naming the
/// flag, the value and what was expected; an unknown flag's message suggests
/// the nearest known one, and model or layout flags say they belong to
/// megatron-compile.
TrainCommand parseTrainCommand(const std::vector<std::string> &args);

/// Whether --data-path names indexed datasets (a blend, or a prefix with a
/// .bin and .idx) rather than a text file. Throws Error (NOT_FOUND) when it
/// names neither, with a hint for a path given with its .bin/.idx suffix.
bool dataPathIsIndexed(const std::vector<std::string> &dataPath);

/// The refusals megatron-train makes before loading anything: --bf16 with
/// --fp16, the loss-scaling flags without --fp16.
void checkPrecisionFlags(const TrainCommand &command);

/// --bf16 needs a bundle compiled for bf16 (its model.precision); --fp16
/// one compiled for fp16, and a bundle compiled for fp16 needs --fp16.
void checkPrecisionMatchesBundle(const TrainCommand &command,
                                 const std::string &bundleName,
                                 const std::string &precision);

/// The --help text.
std::string trainUsage();

} // namespace mtrt::train

#endif // MTRT_SRC_TRAIN_TRAINFLAGS_H
