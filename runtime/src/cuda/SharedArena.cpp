// An arena shared by executors that never run at once.
#include "cuda/SharedArena.h"

#include "core/Error.h"

namespace mtrt::cuda {

void SharedArena::reserve(size_t bytes) {
  if (bytes <= bytes_)
    return;
  if (allocated_)
    throw Error(MTRT_STATUS_FAILED_PRECONDITION,
                what_ + ": an executor needs " + std::to_string(bytes) +
                    " bytes after the arena was allocated with " +
                    std::to_string(bytes_) +
                    "; make every executor before the first run");
  bytes_ = bytes;
}

void *SharedArena::data() {
  if (!allocated_) {
    buffer_ = DeviceBuffer(bytes_, what_);
    allocated_ = true;
  }
  return buffer_.data();
}

ArenaMemory::ArenaMemory(size_t bytes, const std::string &what,
                         SharedArena *shared)
    : shared_(shared) {
  if (shared_)
    shared_->reserve(bytes);
  else
    own_ = DeviceBuffer(bytes, what);
}

void *ArenaMemory::data() const { return shared_ ? sharedData_ : own_.data(); }

void *ArenaMemory::allocate() {
  if (shared_ && !sharedData_)
    sharedData_ = shared_->data();
  return data();
}

} // namespace mtrt::cuda
