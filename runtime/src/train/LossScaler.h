// fp16 training's loss scale: Megatron-LM's ConstantGradScaler and
// DynamicGradScaler (megatron/core/optimizer/grad_scaler.py) semantics.
#ifndef MTRT_SRC_TRAIN_LOSSSCALER_H
#define MTRT_SRC_TRAIN_LOSSSCALER_H

#include <nlohmann/json.hpp>

#include <cstdint>
#include <optional>
#include <string>

namespace mtrt::train {

/// megatron-train's loss-scaling flags, with Megatron-LM's defaults.
struct LossScalerOptions {
  /// --loss-scale: a static scale; unset: dynamic scaling.
  std::optional<double> staticScale;
  /// --initial-loss-scale.
  double initialScale = 4294967296.0; // 2^32
  /// --min-loss-scale.
  double minScale = 1.0;
  /// --loss-scale-window: clean iterations before the scale doubles.
  int64_t window = 1000;
  /// --hysteresis: overflowing iterations (without a growth in between)
  /// before the scale halves.
  int64_t hysteresis = 2;
};

/// The scale the loss's gradient seed is multiplied by, and its update after
/// each iteration from whether any gradient element on any rank was inf or
/// nan (the caller skips that iteration's optimizer step).
///
/// Dynamic (Megatron-LM's DynamicGradScaler, growth factor 2, backoff factor
/// 0.5): on an overflow the growth count restarts and the hysteresis count
/// drops by one; once it is at or below 0, each overflow halves the scale,
/// never below the minimum. After `window` clean iterations in a row the
/// scale doubles and the hysteresis count is reset to `hysteresis`. Clean
/// iterations do not reset the hysteresis count otherwise, as in
/// Megatron-LM. Static: the scale never changes (overflowing iterations are
/// still skipped).
///
/// The scale stays a power of two when it starts as one, so multiplying the
/// seed by it and the gradients by its inverse is exact in binary floating
/// point (barring overflow and underflow).
///
/// Thread-safety: none.
class LossScaler {
public:
  /// Throws Error (INVALID_ARGUMENT) naming the flag for a scale that is not
  /// finite and > 0, a minimum above the initial scale, a window < 1 or a
  /// hysteresis < 1.
  explicit LossScaler(const LossScalerOptions &options);

  double scale() const { return scale_; }
  bool isDynamic() const { return !options_.staticScale; }
  /// Records one iteration's outcome (found: some gradient element on some
  /// rank was inf or nan).
  void update(bool foundInfOrNan);

  int64_t growthTracker() const { return growthTracker_; }
  int64_t hysteresisTracker() const { return hysteresisTracker_; }

  /// The checkpoint's "loss_scale" object (docs/Checkpoints.md):
  /// {"kind": "dynamic", "scale", "growth_tracker", "hysteresis_tracker",
  /// "min_scale", "window", "hysteresis"} or {"kind": "static", "scale"}.
  nlohmann::json state() const;
  /// Restores the dynamic state of a checkpoint's "loss_scale" object. A
  /// checkpoint without one (kind "none": trained in fp32 or bf16) and a
  /// static scaler leave the state as it is (the flags' start), and so
  /// does a static one in the checkpoint; the return value says what was
  /// done, for the log. Throws Error (DATA_LOSS) naming the field for a
  /// malformed object.
  std::string restore(const nlohmann::json &saved);

  /// The log's description: "dynamic loss scaling from 4294967296 (min 1,
  /// window 1000, hysteresis 2)" or "static loss scale 1024".
  std::string describe() const;

private:
  LossScalerOptions options_;
  double scale_;
  int64_t growthTracker_ = 0;
  int64_t hysteresisTracker_;
};

} // namespace mtrt::train

#endif // MTRT_SRC_TRAIN_LOSSSCALER_H
