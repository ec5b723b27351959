// Aligned host buffers and the tensors the executor and the trainer pass
// around.
#ifndef MTRT_SRC_HOST_HOSTTENSOR_H
#define MTRT_SRC_HOST_HOSTTENSOR_H

#include "core/Bundle.h"

#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <memory>
#include <new>
#include <vector>

namespace mtrt::host {

/// Uninitialized bytes aligned to 64 (a cache line, the widest vector).
/// Move-only; a default-constructed buffer is empty.
class Buffer {
public:
  Buffer() = default;
  explicit Buffer(size_t bytes) : size_(bytes) {
    // aligned_alloc needs a multiple of the alignment; never 0 bytes, so
    // data() is a valid pointer even for empty tensors.
    size_t rounded = (bytes + 63) / 64 * 64;
    data_.reset(
        static_cast<uint8_t *>(std::aligned_alloc(64, rounded ? rounded : 64)));
    if (!data_)
      throw std::bad_alloc();
  }
  void *data() { return data_.get(); }
  const void *data() const { return data_.get(); }
  size_t size() const { return size_; }
  explicit operator bool() const { return data_ != nullptr; }

private:
  struct Free {
    void operator()(uint8_t *p) const { std::free(p); }
  };
  std::unique_ptr<uint8_t, Free> data_;
  size_t size_ = 0;
};

/// A tensor in host memory that owns its elements. `dtype` is the storage
/// type: F32 or F64 for floating values, I32 or I64 for ids.
struct Tensor {
  DType dtype = DType::F32;
  std::vector<int64_t> shape;
  Buffer buffer;

  Tensor() = default;
  Tensor(DType dtype, std::vector<int64_t> shape)
      : dtype(dtype), shape(std::move(shape)),
        buffer(static_cast<size_t>(numElements()) * dtypeSize(dtype)) {}

  int64_t numElements() const {
    int64_t n = 1;
    for (int64_t d : shape)
      n *= d;
    return n;
  }
  template <typename T> T *data() { return static_cast<T *>(buffer.data()); }
  template <typename T> const T *data() const {
    return static_cast<const T *>(buffer.data());
  }
};

/// A borrowed view of an input: the caller keeps `data` alive during the
/// call that reads it.
struct TensorView {
  DType dtype = DType::I32;
  std::vector<int64_t> shape;
  const void *data = nullptr;
};

} // namespace mtrt::host

#endif // MTRT_SRC_HOST_HOSTTENSOR_H
