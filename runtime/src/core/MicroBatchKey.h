// Which micro-batch a function run computes: what keys its dropout masks and
// names its collectives in diagnostics.
#ifndef MTRT_SRC_CORE_MICROBATCHKEY_H
#define MTRT_SRC_CORE_MICROBATCHKEY_H

#include <cstdint>

namespace mtrt {

/// A run's micro-batch. The masks depend on firstSample alone (core/Random.h),
/// so any split of the same samples into micro-batches or data ranks draws
/// the same masks; `step` only names the run's collectives.
struct MicroBatchKey {
  /// Micro-batches since the start of training (or the session).
  uint64_t step = 0;
  /// The consumed-sample index of row 0 of the global micro-batch (data rank
  /// 0's first sample): global row b is sample firstSample + b.
  uint64_t firstSample = 0;

  bool operator==(const MicroBatchKey &other) const {
    return step == other.step && firstSample == other.firstSample;
  }
  bool operator!=(const MicroBatchKey &other) const {
    return !(*this == other);
  }
};

} // namespace mtrt

#endif // MTRT_SRC_CORE_MICROBATCHKEY_H
