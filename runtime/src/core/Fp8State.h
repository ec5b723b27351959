// The delayed-scaling state of a bundle's FP8 metas (docs/BundleFormat.md,
// "FP8"): per meta its scale and amax history, which fp8_scale reads and
// fp8_update advances, as Transformer Engine's recipe does (core/Fp8.h).
// Backend-independent: the host keeps it beside the parameters (the CUDA
// store keeps a device copy, moved with upload and download), and
// checkpoints hold it (train/TrainerCheckpoint.cpp, docs/Checkpoints.md).
#ifndef MTRT_SRC_CORE_FP8STATE_H
#define MTRT_SRC_CORE_FP8STATE_H

#include "core/Bundle.h"
#include "core/Fp8.h"

#include <vector>

namespace mtrt {

/// fp8::Format of an FP8 dtype (F8E4M3 or F8E5M2).
inline fp8::Format fp8FormatOf(DType dtype) {
  return dtype == DType::F8E5M2 ? fp8::Format::E5M2 : fp8::Format::E4M3;
}

class Fp8State {
public:
  /// Every scale 1 and every history zeros, as a fresh run starts.
  explicit Fp8State(const Fp8Settings &settings)
      : settings_(settings), scales_(settings.metas.size(), 1.0f),
        histories_(settings.metas.size() *
                       static_cast<size_t>(settings.amaxHistoryLen),
                   0.0f) {}

  size_t size() const { return scales_.size(); }
  const Fp8Settings &settings() const { return settings_; }
  int64_t historyLength() const { return settings_.amaxHistoryLen; }
  float scale(size_t meta) const { return scales_[meta]; }
  /// Meta `meta`'s history, newest first.
  const float *history(size_t meta) const {
    return histories_.data() + meta * historyLength();
  }

  /// fp8_update: `amax` becomes the newest of the history, and the scale
  /// is computed from the newest or the largest amax (amax_compute_algo),
  /// kept when that amax is 0 or not finite.
  void update(size_t meta, float amax) {
    float *history = histories_.data() + meta * historyLength();
    int length = static_cast<int>(historyLength());
    fp8::pushAmax(history, length, amax);
    fp8::AmaxAlgorithm algorithm = settings_.amaxComputeAlgo == "max"
                                       ? fp8::AmaxAlgorithm::Max
                                       : fp8::AmaxAlgorithm::MostRecent;
    scales_[meta] = fp8::scaleFromAmax(
        fp8::historyAmax(history, length, algorithm), scales_[meta],
        fp8FormatOf(settings_.metas[meta].format),
        static_cast<int>(settings_.margin));
  }

  /// Every scale, and every history (meta-major), as a checkpoint would
  /// hold them.
  const std::vector<float> &scales() const { return scales_; }
  const std::vector<float> &histories() const { return histories_; }
  std::vector<float> &mutableScales() { return scales_; }
  std::vector<float> &mutableHistories() { return histories_; }

private:
  Fp8Settings settings_;
  std::vector<float> scales_;
  std::vector<float> histories_;
};

} // namespace mtrt

#endif // MTRT_SRC_CORE_FP8STATE_H
