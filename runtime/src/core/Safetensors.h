// Safetensors files (Hugging Face's weight format): a validating reader and an atomic writer.
#ifndef MTRT_SRC_CORE_SAFETENSORS_H
#define MTRT_SRC_CORE_SAFETENSORS_H

#include "core/Error.h"

#include <cstddef>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace mtrt {

/// The element types of the format with whole-byte elements, in the
/// reference implementation's order. The sub-byte types (F4, F6_E2M3,
/// F6_E3M2) are recognized by the reader and refused as UNIMPLEMENTED.
enum class SafetensorsDType : uint8_t {
  Bool,
  U8,
  I8,
  F8E5M2,
  F8E4M3,
  F8E8M0,
  I16,
  U16,
  F16,
  BF16,
  I32,
  U32,
  F32,
  C64,
  F64,
  I64,
  U64,
};

/// The format's spelling: "F32", "BF16", "F8_E4M3", "BOOL", ...
const char *safetensorsDTypeName(SafetensorsDType dtype);
/// Bytes per element.
size_t safetensorsDTypeSize(SafetensorsDType dtype);
/// The dtype spelled `name`, or nullopt (also for the sub-byte types).
std::optional<SafetensorsDType> parseSafetensorsDType(std::string_view name);
/// F32, F64, BF16 and F16: the types SafetensorsFile converts to float.
bool isSafetensorsFloat(SafetensorsDType dtype);

/// One tensor of a validated file. Offsets are relative to the start of the
/// data buffer, as in the header's data_offsets.
struct SafetensorsTensor {
  std::string name;
  SafetensorsDType dtype = SafetensorsDType::F32;
  /// Row-major dimensions, each in [0, INT64_MAX]; empty for a scalar.
  std::vector<int64_t> shape;
  uint64_t numElements = 1;
  uint64_t begin = 0;
  uint64_t end = 0;

  uint64_t numBytes() const { return end - begin; }
};

/// A safetensors file that passed every check of the format: the header
/// length (at most kMaxHeaderSize and within the file), a header of UTF-8
/// JSON that is an object without duplicate keys, a `__metadata__` map of
/// strings to strings, and for every tensor a known dtype, non-negative
/// integer dims whose byte size fits in 64 bits, and data_offsets that match
/// that size, lie in the data buffer, do not overlap, and together cover the
/// data buffer exactly. Keys of a tensor entry other than dtype, shape and
/// data_offsets are ignored, as the reference implementation does.
///
/// open() maps the file read-only. A file replaced by rename (as
/// writeSafetensors does) keeps the mapped bytes valid; one truncated in
/// place by another process while mapped makes later reads fault (SIGBUS),
/// as with any mmap-based reader.
///
/// Thread-safety: immutable after construction; share it freely. Copies
/// share the bytes.
class SafetensorsFile {
public:
  /// The reference implementation's cap on the header length (100,000,000
  /// bytes): larger values are refused before anything is allocated.
  static constexpr uint64_t kMaxHeaderSize = 100000000;
  /// Containers nested deeper than this are refused while parsing; a valid
  /// header nests three deep (the header, a tensor entry, its shape).
  static constexpr size_t kMaxJsonDepth = 16;

  /// Maps and validates the file at `path`. Throws Error: NOT_FOUND when it
  /// cannot be opened, INVALID_ARGUMENT when it is not a regular file or
  /// breaks the format, DATA_LOSS when it is truncated, UNIMPLEMENTED for a
  /// sub-byte dtype. Messages name `path` and, where one is at fault, the
  /// tensor, the value found and what was expected.
  static SafetensorsFile open(const std::string &path);

  /// Validates the bytes of a whole file; `name` is what messages call it.
  /// Throws Error as open() does.
  static SafetensorsFile parse(std::string name, std::vector<uint8_t> bytes);

  const std::string &name() const { return name_; }
  /// The header's `__metadata__`; empty when absent.
  const std::map<std::string, std::string> &metadata() const {
    return metadata_;
  }
  /// Every tensor, in the order of its data in the file.
  const std::vector<SafetensorsTensor> &tensors() const { return tensors_; }
  /// The tensors' names, sorted.
  std::vector<std::string> names() const;
  /// The length of the JSON header (with its padding) and of the data buffer.
  uint64_t headerSize() const { return headerSize_; }
  uint64_t dataSize() const { return dataSize_; }

  /// The tensor named `name`, or nullptr.
  const SafetensorsTensor *find(std::string_view name) const;
  /// The tensor named `name`; throws Error (NOT_FOUND) naming the file.
  const SafetensorsTensor &tensor(std::string_view name) const;

  /// The tensor's numBytes() bytes, exactly as stored (little-endian). Not
  /// necessarily aligned for the element type: read through memcpy.
  const uint8_t *bytes(const SafetensorsTensor &tensor) const;

  /// The tensor's elements as float or double: exact for F32, BF16 and F16
  /// (and F64 to double); F64 to float rounds to nearest. `out` holds
  /// tensor.numElements values. Throws Error (INVALID_ARGUMENT) naming the
  /// file, the tensor and its dtype for any other dtype.
  void convert(const SafetensorsTensor &tensor, float *out) const;
  void convert(const SafetensorsTensor &tensor, double *out) const;
  /// The same into a new vector, by name (NOT_FOUND if absent).
  std::vector<float> toFloat(std::string_view name) const;
  std::vector<double> toDouble(std::string_view name) const;

private:
  SafetensorsFile() = default;
  static SafetensorsFile parseBytes(std::string name,
                                    std::shared_ptr<const uint8_t> storage,
                                    uint64_t size);

  std::string name_;
  std::shared_ptr<const uint8_t> storage_; // the whole file
  const uint8_t *data_ = nullptr;          // its data buffer
  uint64_t headerSize_ = 0;
  uint64_t dataSize_ = 0;
  std::map<std::string, std::string> metadata_;
  std::vector<SafetensorsTensor> tensors_;
  std::map<std::string, size_t, std::less<>> index_;
};

/// BF16 and F16 bit patterns to float, exactly (subnormals, infinities and
/// NaNs included).
float bf16ToFloat(uint16_t bits);
float f16ToFloat(uint16_t bits);

/// A float32 tensor to write: `data` points at product(shape) floats in
/// row-major order and must stay valid during the call.
struct SafetensorsWriteTensor {
  std::string name;
  std::vector<int64_t> shape;
  const float *data = nullptr;
};

/// The bytes of a safetensors file holding `tensors` as F32 and `metadata`
/// as `__metadata__` (left out when empty), laid out as the reference writer
/// does: tensors sorted by name in the header and their data in that order,
/// the header padded with spaces to a multiple of 8 bytes. Throws Error
/// (INVALID_ARGUMENT) for an empty or duplicate name, the name
/// "__metadata__", a name or metadata string that is not UTF-8, a negative
/// dim, a size that overflows, or null data for a non-empty tensor.
std::vector<uint8_t>
serializeSafetensors(const std::vector<SafetensorsWriteTensor> &tensors,
                     const std::map<std::string, std::string> &metadata = {});

/// Passes the bytes serializeSafetensors returns to `write` in order (the
/// length and header, then each tensor's data), without copying the
/// tensors: for writers that hash or count what they write. Throws Error as
/// serializeSafetensors does, before `write` is first called.
void streamSafetensors(
    const std::vector<SafetensorsWriteTensor> &tensors,
    const std::map<std::string, std::string> &metadata,
    const std::function<void(const void *, uint64_t)> &write);

/// Writes the file serializeSafetensors describes to `path` atomically: to
/// `<path>.tmp.<pid>`, fsync, rename onto `path`, fsync the directory. On
/// any failure before the rename the temporary file is removed and `path`
/// is left as it was (absent or the previous file), never partly written; a
/// failure to sync the directory after it leaves the complete new file.
/// Throws Error naming the path, the failing step and the system's reason:
/// INVALID_ARGUMENT for bad tensors as above, PERMISSION_DENIED (EACCES,
/// EPERM, EROFS), NOT_FOUND (a missing directory), RESOURCE_EXHAUSTED
/// (ENOSPC, EDQUOT, EFBIG), FAILED_PRECONDITION (`path` is a directory),
/// DATA_LOSS for other I/O errors. Not safe to call for the same path from
/// two threads of one process at once (they share the temporary name).
void writeSafetensors(const std::string &path,
                      const std::vector<SafetensorsWriteTensor> &tensors,
                      const std::map<std::string, std::string> &metadata = {});

} // namespace mtrt

#endif // MTRT_SRC_CORE_SAFETENSORS_H
