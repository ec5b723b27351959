// The loss scale's state machine and its checkpoint form.
#include "train/LossScaler.h"

#include "core/Error.h"

#include <algorithm>
#include <cmath>
#include <sstream>

namespace mtrt::train {

namespace {

std::string number(double value) {
  std::ostringstream s;
  s.precision(17);
  s << value;
  return s.str();
}

[[noreturn]] void invalid(const std::string &message) {
  throw Error(MTRT_STATUS_INVALID_ARGUMENT, message);
}

void checkScale(const char *flag, double value) {
  if (!(value > 0) || !std::isfinite(value))
    invalid(std::string(flag) + ": found " + number(value) +
            ", expected a finite scale > 0 (a power of two, e.g. " + flag +
            " 65536, keeps scaling exact)");
}

} // namespace

LossScaler::LossScaler(const LossScalerOptions &options)
    : options_(options), scale_(options.staticScale ? *options.staticScale
                                                    : options.initialScale),
      hysteresisTracker_(options.hysteresis) {
  if (options.staticScale) {
    checkScale("--loss-scale", *options.staticScale);
    return;
  }
  checkScale("--initial-loss-scale", options.initialScale);
  checkScale("--min-loss-scale", options.minScale);
  if (options.minScale > options.initialScale)
    invalid("--min-loss-scale: found " + number(options.minScale) +
            ", above --initial-loss-scale " + number(options.initialScale) +
            "; lower it or raise --initial-loss-scale");
  if (options.window < 1)
    invalid("--loss-scale-window: found " + std::to_string(options.window) +
            ", expected clean iterations >= 1 before the scale grows "
            "(default 1000)");
  if (options.hysteresis < 1)
    invalid("--hysteresis: found " + std::to_string(options.hysteresis) +
            ", expected overflowing iterations >= 1 before the scale backs "
            "off (default 2)");
}

void LossScaler::update(bool foundInfOrNan) {
  if (!isDynamic())
    return;
  if (foundInfOrNan) {
    growthTracker_ = 0;
    --hysteresisTracker_;
    if (hysteresisTracker_ <= 0)
      scale_ = std::max(scale_ * 0.5, options_.minScale);
    return;
  }
  if (++growthTracker_ >= options_.window) {
    growthTracker_ = 0;
    hysteresisTracker_ = options_.hysteresis;
    scale_ *= 2.0;
  }
}

nlohmann::json LossScaler::state() const {
  if (!isDynamic())
    return {{"kind", "static"}, {"scale", scale_}};
  return {{"kind", "dynamic"},
          {"scale", scale_},
          {"growth_tracker", growthTracker_},
          {"hysteresis_tracker", hysteresisTracker_},
          {"min_scale", options_.minScale},
          {"window", options_.window},
          {"hysteresis", options_.hysteresis}};
}

std::string LossScaler::restore(const nlohmann::json &saved) {
  auto malformed = [&](const std::string &what) -> Error {
    return Error(MTRT_STATUS_DATA_LOSS,
                 "the checkpoint's loss_scale " + what + " (found " +
                     saved.dump() +
                     "); expected the object docs/Checkpoints.md describes");
  };
  if (!saved.is_object() || !saved.contains("kind") ||
      !saved["kind"].is_string())
    throw malformed("has no string \"kind\"");
  std::string kind = saved["kind"].get<std::string>();
  if (kind != "none" && kind != "static" && kind != "dynamic")
    throw malformed("kind is not none, static or dynamic");
  if (!isDynamic())
    return "the static --loss-scale " + number(scale_) + " (the flag wins)";
  if (kind != "dynamic")
    return "no dynamic loss scale in the checkpoint (kind " + kind +
           "): starting from --initial-loss-scale " + number(scale_);
  auto field = [&](const char *key) {
    if (!saved.contains(key) || !saved[key].is_number())
      throw malformed(std::string("has no number \"") + key + "\"");
    return saved[key];
  };
  double scale = field("scale").get<double>();
  if (!(scale > 0) || !std::isfinite(scale))
    throw malformed("scale is not finite and > 0");
  int64_t growth = field("growth_tracker").get<int64_t>();
  int64_t hysteresis = field("hysteresis_tracker").get<int64_t>();
  if (growth < 0)
    throw malformed("growth_tracker is negative");
  scale_ = std::max(scale, options_.minScale);
  growthTracker_ = growth;
  hysteresisTracker_ = hysteresis;
  return "loss scale " + number(scale_) + " (growth tracker " +
         std::to_string(growthTracker_) + ", hysteresis tracker " +
         std::to_string(hysteresisTracker_) + ")";
}

std::string LossScaler::describe() const {
  if (!isDynamic())
    return "static loss scale " + number(scale_);
  return "dynamic loss scaling from " + number(scale_) + " (min " +
         number(options_.minScale) + ", window " +
         std::to_string(options_.window) + ", hysteresis " +
         std::to_string(options_.hysteresis) + ")";
}

} // namespace mtrt::train
