// The device arena of an executor: its own, or its share of an arena that
// executors which never run at once have in common (a pipeline rank's stage
// functions).
#ifndef MTRT_SRC_CUDA_SHAREDARENA_H
#define MTRT_SRC_CUDA_SHAREDARENA_H

#include "cuda/Context.h"

#include <cstddef>
#include <string>

namespace mtrt::cuda {

/// One arena for executors that never run at the same time: as large as the
/// largest of theirs, not their sum. A pipeline rank's schedule runs its
/// stage functions one after another on the context's one stream, so one
/// function's writes come after the previous function's reads; each copies
/// its outputs out and reads its inputs where the caller keeps them
/// (cuda/PipelineStages.h). Executors reserve their bytes when they are
/// made; the arena is allocated at the first run, once, so its address
/// (which CUDA graphs capture) never changes.
///
/// Thread-safety: the thread of its executors only.
class SharedArena {
public:
  explicit SharedArena(std::string what) : what_(std::move(what)) {}
  /// Room for `bytes`. Throws Error (FAILED_PRECONDITION) after the arena
  /// was allocated, if it is smaller.
  void reserve(size_t bytes);
  /// The arena (allocated at the first call). Throws Error
  /// (RESOURCE_EXHAUSTED) when the device is out of memory.
  void *data();
  size_t bytes() const { return bytes_; }

private:
  std::string what_;
  DeviceBuffer buffer_;
  size_t bytes_ = 0;
  bool allocated_ = false;
};

/// An executor's arena: a buffer of its own, or a SharedArena's.
class ArenaMemory {
public:
  ArenaMemory() = default;
  /// Its own `bytes` (allocated now), or, with `shared`, a reservation there.
  ArenaMemory(size_t bytes, const std::string &what, SharedArena *shared);
  /// Null until a shared arena is allocated (SharedArena::data).
  void *data() const;
  /// Allocates a shared arena.
  void *allocate();
  bool shared() const { return shared_ != nullptr; }

private:
  DeviceBuffer own_;
  SharedArena *shared_ = nullptr;
  void *sharedData_ = nullptr;
};

} // namespace mtrt::cuda

#endif // MTRT_SRC_CUDA_SHAREDARENA_H
