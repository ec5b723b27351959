// Reads and validates safetensors files (mmap + nlohmann/json) and writes them atomically.
#include "core/Safetensors.h"

#include "core/DurableFile.h"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <functional>
#include <set>
#include <tuple>

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#if !defined(__BYTE_ORDER__) || __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "mtrt's safetensors code copies tensors as they are in memory, which " \
       "is the format's little-endian order only on little-endian hosts"
#endif

namespace mtrt {

using Json = nlohmann::json;

//===----------------------------------------------------------------------===//
// Element types
//===----------------------------------------------------------------------===//

namespace {

struct DTypeInfo {
  SafetensorsDType dtype;
  const char *name;
  size_t size;
};
constexpr DTypeInfo kDTypes[] = {
    {SafetensorsDType::Bool, "BOOL", 1},
    {SafetensorsDType::U8, "U8", 1},
    {SafetensorsDType::I8, "I8", 1},
    {SafetensorsDType::F8E5M2, "F8_E5M2", 1},
    {SafetensorsDType::F8E4M3, "F8_E4M3", 1},
    {SafetensorsDType::F8E8M0, "F8_E8M0", 1},
    {SafetensorsDType::I16, "I16", 2},
    {SafetensorsDType::U16, "U16", 2},
    {SafetensorsDType::F16, "F16", 2},
    {SafetensorsDType::BF16, "BF16", 2},
    {SafetensorsDType::I32, "I32", 4},
    {SafetensorsDType::U32, "U32", 4},
    {SafetensorsDType::F32, "F32", 4},
    {SafetensorsDType::C64, "C64", 8},
    {SafetensorsDType::F64, "F64", 8},
    {SafetensorsDType::I64, "I64", 8},
    {SafetensorsDType::U64, "U64", 8},
};
constexpr const char *kSubByteDTypes[] = {"F4", "F6_E2M3", "F6_E3M2"};

const DTypeInfo &info(SafetensorsDType dtype) {
  return kDTypes[static_cast<size_t>(dtype)];
}

std::string knownDTypes() {
  std::string list;
  for (const DTypeInfo &d : kDTypes)
    list += std::string(list.empty() ? "" : ", ") + d.name;
  return list;
}

} // namespace

const char *safetensorsDTypeName(SafetensorsDType dtype) {
  return info(dtype).name;
}

size_t safetensorsDTypeSize(SafetensorsDType dtype) { return info(dtype).size; }

std::optional<SafetensorsDType> parseSafetensorsDType(std::string_view name) {
  for (const DTypeInfo &d : kDTypes)
    if (name == d.name)
      return d.dtype;
  return std::nullopt;
}

bool isSafetensorsFloat(SafetensorsDType dtype) {
  return dtype == SafetensorsDType::F32 || dtype == SafetensorsDType::F64 ||
         dtype == SafetensorsDType::BF16 || dtype == SafetensorsDType::F16;
}

float bf16ToFloat(uint16_t bits) {
  uint32_t word = uint32_t(bits) << 16;
  float value;
  std::memcpy(&value, &word, sizeof(value));
  return value;
}

float f16ToFloat(uint16_t bits) {
  uint32_t sign = uint32_t(bits & 0x8000) << 16;
  uint32_t exponent = (bits >> 10) & 0x1f;
  uint32_t mantissa = bits & 0x3ff;
  uint32_t word;
  if (exponent == 0x1f) {
    word = sign | 0x7f800000u | (mantissa << 13); // inf or NaN, payload kept
  } else if (exponent != 0) {
    word = sign | ((exponent + 127 - 15) << 23) | (mantissa << 13);
  } else {
    // Zero or subnormal: mantissa * 2^-24, exact in float.
    float magnitude = std::ldexp(static_cast<float>(mantissa), -24);
    return sign ? -magnitude : magnitude;
  }
  float value;
  std::memcpy(&value, &word, sizeof(value));
  return value;
}

//===----------------------------------------------------------------------===//
// Validation helpers
//===----------------------------------------------------------------------===//

namespace {

uint64_t readU64(const uint8_t *p) {
  uint64_t value = 0;
  for (int i = 7; i >= 0; --i)
    value = (value << 8) | p[i];
  return value;
}

/// The offset of the first byte of `text` that does not belong to a
/// well-formed UTF-8 sequence (no overlong forms, surrogates or code points
/// past U+10FFFF), or npos.
size_t findInvalidUtf8(std::string_view text) {
  const auto *s = reinterpret_cast<const unsigned char *>(text.data());
  size_t n = text.size();
  size_t i = 0;
  while (i < n) {
    unsigned char c = s[i];
    if (c < 0x80) {
      ++i;
      continue;
    }
    size_t length;
    unsigned char lo = 0x80, hi = 0xbf; // range of the second byte
    if (c >= 0xc2 && c <= 0xdf) {
      length = 2;
    } else if (c >= 0xe0 && c <= 0xef) {
      length = 3;
      if (c == 0xe0)
        lo = 0xa0; // overlong
      if (c == 0xed)
        hi = 0x9f; // surrogates
    } else if (c >= 0xf0 && c <= 0xf4) {
      length = 4;
      if (c == 0xf0)
        lo = 0x90; // overlong
      if (c == 0xf4)
        hi = 0x8f; // past U+10FFFF
    } else {
      return i;
    }
    if (i + 1 >= n || s[i + 1] < lo || s[i + 1] > hi)
      return i;
    for (size_t k = 2; k < length; ++k)
      if (i + k >= n || (s[i + k] & 0xc0) != 0x80)
        return i;
    i += length;
  }
  return std::string_view::npos;
}

/// At most `limit` characters of `json` as JSON text, for messages.
std::string describe(const Json &json, size_t limit = 60) {
  std::string text = json.dump(-1, ' ', false, Json::error_handler_t::replace);
  if (text.size() > limit)
    text = text.substr(0, limit) + "...";
  return text;
}

/// "a JSON array" and so on, for values of the wrong kind.
std::string kindOf(const Json &json) {
  switch (json.type()) {
  case Json::value_t::object:
    return "a JSON object";
  case Json::value_t::array:
    return "a JSON array " + describe(json);
  case Json::value_t::string:
    return "a JSON string " + describe(json);
  case Json::value_t::boolean:
    return "the JSON boolean " + describe(json);
  case Json::value_t::null:
    return "JSON null";
  default:
    return "the JSON number " + describe(json);
  }
}

std::string jsonQuoted(std::string_view text) {
  return Json(std::string(text)).dump(-1, ' ', false,
                                      Json::error_handler_t::replace);
}

std::string shapeText(const std::vector<int64_t> &shape) {
  std::string text = "[";
  for (size_t i = 0; i < shape.size(); ++i)
    text += (i ? ", " : "") + std::to_string(shape[i]);
  return text + "]";
}

std::string range(uint64_t begin, uint64_t end) {
  return "[" + std::to_string(begin) + ", " + std::to_string(end) + "]";
}

/// Validates one file's bytes; fail() throws an Error that names the file.
class HeaderReader {
public:
  explicit HeaderReader(std::string_view name) : name_(name) {}

  [[noreturn]] void
  fail(const std::string &where, const std::string &found,
       const std::string &expected,
       mtrt_status_code_t code = MTRT_STATUS_INVALID_ARGUMENT) const {
    throw Error(code, "safetensors '" + name_ + "': " + where + ": found " +
                          found + ", expected " + expected);
  }

  Json parseJson(std::string_view text);
  void readMetadata(const Json &json, std::map<std::string, std::string> &out);
  SafetensorsTensor readTensor(const std::string &name, const Json &entry,
                               uint64_t dataSize);

private:
  uint64_t readUnsigned(const Json &json, const std::string &where);
  std::string name_;
};

Json HeaderReader::parseJson(std::string_view text) {
  // nlohmann keeps one of two equal keys without a word, so duplicates are
  // caught here, while parsing: one set of keys per open object. The same
  // callback bounds the nesting of hostile headers.
  struct Open {
    bool isObject;
    std::string key; // the key whose value is being parsed
    std::set<std::string> keys;
  };
  std::vector<Open> open;
  auto where = [&]() {
    if (open.size() <= 1)
      return std::string("header");
    if (open.size() == 2)
      return open[0].key == "__metadata__" ? std::string("__metadata__")
                                           : "tensor " + jsonQuoted(open[0].key);
    std::string path = "header";
    for (size_t i = 0; i + 1 < open.size(); ++i)
      path += open[i].isObject ? "[" + jsonQuoted(open[i].key) + "]" : "[...]";
    return path;
  };
  auto callback = [&](int, Json::parse_event_t event, Json &parsed) {
    switch (event) {
    case Json::parse_event_t::object_start:
    case Json::parse_event_t::array_start:
      open.push_back({event == Json::parse_event_t::object_start, {}, {}});
      if (open.size() > SafetensorsFile::kMaxJsonDepth)
        fail(where(), "JSON nested " + std::to_string(open.size()) + " deep",
             "at most " + std::to_string(SafetensorsFile::kMaxJsonDepth) +
                 " (a valid header nests 3 deep)");
      break;
    case Json::parse_event_t::object_end:
    case Json::parse_event_t::array_end:
      open.pop_back();
      break;
    case Json::parse_event_t::key: {
      std::string key = parsed.get<std::string>();
      if (!open.back().keys.insert(key).second)
        fail(where(), "the key " + jsonQuoted(key) + " twice",
             open.size() == 1 ? "each tensor name once"
                              : "each key once in an object");
      open.back().key = std::move(key);
      break;
    }
    case Json::parse_event_t::value:
      break;
    }
    return true;
  };
  try {
    return Json::parse(text.begin(), text.end(), callback);
  } catch (const Json::exception &e) {
    fail("header", std::string("invalid JSON (") + e.what() + ")",
         "a JSON object");
  }
}

uint64_t HeaderReader::readUnsigned(const Json &json, const std::string &where) {
  if (json.is_number_unsigned())
    return json.get<uint64_t>();
  if (json.is_number_integer() && json.get<int64_t>() >= 0)
    return static_cast<uint64_t>(json.get<int64_t>());
  fail(where, describe(json), "a non-negative integer");
}

void HeaderReader::readMetadata(const Json &json,
                                std::map<std::string, std::string> &out) {
  if (!json.is_object())
    fail("__metadata__", kindOf(json), "an object of strings to strings");
  for (const auto &[key, value] : json.items()) {
    if (!value.is_string())
      fail("__metadata__[" + jsonQuoted(key) + "]", kindOf(value), "a string");
    out.emplace(key, value.get<std::string>());
  }
}

SafetensorsTensor HeaderReader::readTensor(const std::string &name,
                                           const Json &entry,
                                           uint64_t dataSize) {
  std::string at = "tensor " + jsonQuoted(name);
  if (!entry.is_object())
    fail(at, kindOf(entry),
         "an object with \"dtype\", \"shape\" and \"data_offsets\"");
  for (const char *key : {"dtype", "shape", "data_offsets"})
    if (!entry.contains(key))
      fail(at, std::string("no \"") + key + "\"",
           "an object with \"dtype\", \"shape\" and \"data_offsets\"");

  SafetensorsTensor tensor;
  tensor.name = name;
  const Json &dtype = entry["dtype"];
  if (!dtype.is_string())
    fail(at + ".dtype", kindOf(dtype), "a string such as \"F32\"");
  std::string dtypeName = dtype.get<std::string>();
  std::optional<SafetensorsDType> parsed = parseSafetensorsDType(dtypeName);
  if (!parsed) {
    for (const char *subByte : kSubByteDTypes)
      if (dtypeName == subByte)
        fail(at + ".dtype", jsonQuoted(dtypeName),
             "a dtype of whole bytes (" + knownDTypes() +
                 "); this runtime does not read the sub-byte types",
             MTRT_STATUS_UNIMPLEMENTED);
    fail(at + ".dtype", jsonQuoted(dtypeName), "one of " + knownDTypes());
  }
  tensor.dtype = *parsed;

  const Json &shape = entry["shape"];
  if (!shape.is_array())
    fail(at + ".shape", kindOf(shape), "an array of non-negative integers");
  uint64_t numElements = 1;
  bool overflow = false;
  for (size_t i = 0; i < shape.size(); ++i) {
    std::string dimAt = at + ".shape[" + std::to_string(i) + "]";
    uint64_t dim = readUnsigned(shape[i], dimAt);
    if (dim > static_cast<uint64_t>(INT64_MAX))
      fail(dimAt, std::to_string(dim),
           "a dimension of at most " + std::to_string(INT64_MAX));
    tensor.shape.push_back(static_cast<int64_t>(dim));
    overflow |= __builtin_mul_overflow(numElements, dim, &numElements);
  }
  uint64_t elementSize = safetensorsDTypeSize(tensor.dtype);
  uint64_t numBytes = 0;
  overflow |= __builtin_mul_overflow(numElements, elementSize, &numBytes);
  if (overflow)
    fail(at + ".shape", shapeText(tensor.shape) + " of " + dtypeName +
                            ", whose size in bytes overflows 64 bits",
         "at most " + std::to_string(UINT64_MAX) + " bytes");
  tensor.numElements = numElements;

  const Json &offsets = entry["data_offsets"];
  if (!offsets.is_array() || offsets.size() != 2)
    fail(at + ".data_offsets", kindOf(offsets),
         "[begin, end], two non-negative integers");
  tensor.begin = readUnsigned(offsets[0], at + ".data_offsets[0]");
  tensor.end = readUnsigned(offsets[1], at + ".data_offsets[1]");
  std::string offsetsAt = at + ".data_offsets " + range(tensor.begin, tensor.end);
  if (tensor.begin > tensor.end)
    fail(offsetsAt, "begin " + std::to_string(tensor.begin) + " after end " +
                        std::to_string(tensor.end),
         "begin <= end");
  if (tensor.end > dataSize)
    fail(offsetsAt, "end " + std::to_string(tensor.end),
         "at most the " + std::to_string(dataSize) +
             " bytes of the data buffer (the file is truncated or the "
             "header corrupted)",
         MTRT_STATUS_DATA_LOSS);
  if (tensor.end - tensor.begin != numBytes)
    fail(offsetsAt, std::to_string(tensor.end - tensor.begin) + " bytes",
         std::to_string(numBytes) + " = " + std::to_string(numElements) +
             " elements of shape " + shapeText(tensor.shape) + " x " +
             std::to_string(elementSize) + " bytes (" + dtypeName + ")");
  return tensor;
}

} // namespace

//===----------------------------------------------------------------------===//
// SafetensorsFile
//===----------------------------------------------------------------------===//

SafetensorsFile SafetensorsFile::parseBytes(std::string name,
                                            std::shared_ptr<const uint8_t> storage,
                                            uint64_t size) {
  HeaderReader reader(name);
  const uint8_t *bytes = storage.get();
  if (size < 8)
    reader.fail("file", std::to_string(size) + " bytes",
                "at least 8 (the header length; the file is truncated or "
                "empty)",
                MTRT_STATUS_DATA_LOSS);
  uint64_t headerSize = readU64(bytes);
  if (headerSize > kMaxHeaderSize)
    reader.fail("header length (bytes 0-7)", std::to_string(headerSize),
                "at most " + std::to_string(kMaxHeaderSize) +
                    " (the reference implementation's limit; the file is "
                    "corrupted or not a safetensors file)");
  if (headerSize > size - 8)
    reader.fail("header length (bytes 0-7)", std::to_string(headerSize),
                "at most the " + std::to_string(size - 8) +
                    " bytes after it (the file is truncated)",
                MTRT_STATUS_DATA_LOSS);
  std::string_view text(reinterpret_cast<const char *>(bytes + 8),
                        static_cast<size_t>(headerSize));
  size_t bad = findInvalidUtf8(text);
  if (bad != std::string_view::npos) {
    char hex[8];
    std::snprintf(hex, sizeof(hex), "0x%02x",
                  static_cast<unsigned char>(text[bad]));
    reader.fail("header", std::string("the byte ") + hex +
                              " at file offset " + std::to_string(8 + bad) +
                              ", which is not UTF-8",
                "UTF-8 JSON text");
  }
  // nlohmann's parser takes a NUL byte for the end of its input, which would
  // let anything after one pass unread; JSON text has none.
  size_t nul = text.find('\0');
  if (nul != std::string_view::npos)
    reader.fail("header",
                "a NUL byte at file offset " + std::to_string(8 + nul),
                "UTF-8 JSON text (the header is padded with spaces, not "
                "NULs)");
  Json root = reader.parseJson(text);
  if (!root.is_object())
    reader.fail("header", kindOf(root),
                "a JSON object of tensor names (and \"__metadata__\")");

  SafetensorsFile file;
  file.name_ = std::move(name);
  file.headerSize_ = headerSize;
  file.dataSize_ = size - 8 - headerSize;
  file.data_ = bytes + 8 + headerSize;
  for (const auto &[key, value] : root.items()) {
    if (key == "__metadata__")
      reader.readMetadata(value, file.metadata_);
    else
      file.tensors_.push_back(reader.readTensor(key, value, file.dataSize_));
  }

  // The format asks the tensors to tile the data buffer: in offset order,
  // each starts where the previous ended, from 0 to the end of the file.
  std::sort(file.tensors_.begin(), file.tensors_.end(),
            [](const SafetensorsTensor &a, const SafetensorsTensor &b) {
              return std::tie(a.begin, a.end, a.name) <
                     std::tie(b.begin, b.end, b.name);
            });
  uint64_t covered = 0;
  const SafetensorsTensor *last = nullptr; // the tensor that ends at covered
  for (const SafetensorsTensor &t : file.tensors_) {
    if (t.begin < covered)
      reader.fail("tensor " + jsonQuoted(t.name) + ".data_offsets " +
                      range(t.begin, t.end),
                  "an overlap with tensor " + jsonQuoted(last->name) + " at " +
                      range(last->begin, last->end),
                  "tensors whose bytes do not overlap");
    if (t.begin > covered)
      reader.fail("data buffer",
                  "bytes " + range(covered, t.begin) +
                      " that no tensor covers (before tensor " +
                      jsonQuoted(t.name) + ")",
                  "tensors that cover the data buffer exactly");
    if (t.end > covered || !last) {
      covered = t.end;
      last = &t;
    }
  }
  if (covered != file.dataSize_)
    reader.fail("data buffer",
                "bytes " + range(covered, file.dataSize_) +
                    " that no tensor covers (at the end of the file)",
                "tensors that cover the data buffer exactly");

  for (size_t i = 0; i < file.tensors_.size(); ++i)
    file.index_.emplace(file.tensors_[i].name, i);
  file.storage_ = std::move(storage);
  return file;
}

SafetensorsFile SafetensorsFile::parse(std::string name,
                                       std::vector<uint8_t> bytes) {
  auto owner = std::make_shared<std::vector<uint8_t>>(std::move(bytes));
  uint64_t size = owner->size();
  std::shared_ptr<const uint8_t> storage(owner, owner->data());
  return parseBytes(std::move(name), std::move(storage), size);
}

SafetensorsFile SafetensorsFile::open(const std::string &path) {
  auto systemError = [&](mtrt_status_code_t code, const std::string &what) {
    return Error(code, "safetensors '" + path + "': " + what + " (" +
                           std::strerror(errno) + ")");
  };
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0)
    throw systemError(MTRT_STATUS_NOT_FOUND,
                      "cannot open it; check the path");
  struct stat st;
  if (::fstat(fd, &st) != 0) {
    Error error = systemError(MTRT_STATUS_INTERNAL, "cannot stat it");
    ::close(fd);
    throw error;
  }
  if (!S_ISREG(st.st_mode)) {
    ::close(fd);
    throw Error(MTRT_STATUS_INVALID_ARGUMENT,
                "safetensors '" + path +
                    "': file: found a directory or special file, expected "
                    "a regular file");
  }
  uint64_t size = static_cast<uint64_t>(st.st_size);
  if (size < 8) {
    // Too short to map usefully (and mmap refuses 0 bytes): let the checks
    // report it.
    ::close(fd);
    return parseBytes(path, std::shared_ptr<const uint8_t>(), size);
  }
  void *mapped = ::mmap(nullptr, size, PROT_READ, MAP_PRIVATE, fd, 0);
  if (mapped == MAP_FAILED) {
    Error error = systemError(MTRT_STATUS_RESOURCE_EXHAUSTED,
                              "cannot map its " + std::to_string(size) +
                                  " bytes");
    ::close(fd);
    throw error;
  }
  ::close(fd); // the mapping keeps the file
  std::shared_ptr<const uint8_t> storage(
      static_cast<const uint8_t *>(mapped),
      [size](const uint8_t *p) { ::munmap(const_cast<uint8_t *>(p), size); });
  return parseBytes(path, std::move(storage), size);
}

std::vector<std::string> SafetensorsFile::names() const {
  std::vector<std::string> names;
  names.reserve(index_.size());
  for (const auto &entry : index_)
    names.push_back(entry.first);
  return names;
}

const SafetensorsTensor *SafetensorsFile::find(std::string_view name) const {
  auto it = index_.find(name);
  return it == index_.end() ? nullptr : &tensors_[it->second];
}

const SafetensorsTensor &SafetensorsFile::tensor(std::string_view name) const {
  if (const SafetensorsTensor *t = find(name))
    return *t;
  throw Error(MTRT_STATUS_NOT_FOUND,
              "safetensors '" + name_ + "': no tensor named " + jsonQuoted(name) +
                  " among its " + std::to_string(tensors_.size()) +
                  " tensors");
}

const uint8_t *SafetensorsFile::bytes(const SafetensorsTensor &tensor) const {
  return data_ + tensor.begin;
}

namespace {

[[noreturn]] void notFloat(const std::string &file,
                           const SafetensorsTensor &tensor) {
  throw Error(MTRT_STATUS_INVALID_ARGUMENT,
              "safetensors '" + file + "': tensor " + jsonQuoted(tensor.name) +
                  ": found dtype " + safetensorsDTypeName(tensor.dtype) +
                  ", expected F32, F64, BF16 or F16 to convert it to "
                  "floating point");
}

template <typename T>
void convertTo(const std::string &file, const SafetensorsTensor &tensor,
               const uint8_t *p, T *out) {
  uint64_t n = tensor.numElements;
  switch (tensor.dtype) {
  case SafetensorsDType::F32:
    for (uint64_t i = 0; i < n; ++i) {
      float v;
      std::memcpy(&v, p + 4 * i, 4);
      out[i] = static_cast<T>(v);
    }
    return;
  case SafetensorsDType::F64:
    for (uint64_t i = 0; i < n; ++i) {
      double v;
      std::memcpy(&v, p + 8 * i, 8);
      out[i] = static_cast<T>(v);
    }
    return;
  case SafetensorsDType::BF16:
  case SafetensorsDType::F16: {
    bool bf16 = tensor.dtype == SafetensorsDType::BF16;
    for (uint64_t i = 0; i < n; ++i) {
      uint16_t bits = static_cast<uint16_t>(p[2 * i] | (p[2 * i + 1] << 8));
      out[i] = static_cast<T>(bf16 ? bf16ToFloat(bits) : f16ToFloat(bits));
    }
    return;
  }
  default:
    notFloat(file, tensor);
  }
}

} // namespace

void SafetensorsFile::convert(const SafetensorsTensor &tensor,
                              float *out) const {
  convertTo(name_, tensor, bytes(tensor), out);
}

void SafetensorsFile::convert(const SafetensorsTensor &tensor,
                              double *out) const {
  convertTo(name_, tensor, bytes(tensor), out);
}

std::vector<float> SafetensorsFile::toFloat(std::string_view name) const {
  const SafetensorsTensor &t = tensor(name);
  if (!isSafetensorsFloat(t.dtype))
    notFloat(name_, t);
  std::vector<float> values(t.numElements);
  convert(t, values.data());
  return values;
}

std::vector<double> SafetensorsFile::toDouble(std::string_view name) const {
  const SafetensorsTensor &t = tensor(name);
  if (!isSafetensorsFloat(t.dtype))
    notFloat(name_, t);
  std::vector<double> values(t.numElements);
  convert(t, values.data());
  return values;
}

//===----------------------------------------------------------------------===//
// Writing
//===----------------------------------------------------------------------===//

namespace {

/// The header (padded) and the tensors in the order of their data.
struct Layout {
  std::string header;
  std::vector<const SafetensorsWriteTensor *> order;
  std::vector<uint64_t> sizes; // bytes, in `order`
};

Layout layOut(const std::vector<SafetensorsWriteTensor> &tensors,
              const std::map<std::string, std::string> &metadata) {
  auto invalid = [](const std::string &message) {
    return Error(MTRT_STATUS_INVALID_ARGUMENT,
                 "writing safetensors: " + message);
  };
  auto checkUtf8 = [&](const std::string &text, const std::string &what) {
    if (findInvalidUtf8(text) != std::string_view::npos)
      throw invalid(what + " is not UTF-8, which JSON needs");
  };

  Layout layout;
  for (const SafetensorsWriteTensor &t : tensors)
    layout.order.push_back(&t);
  // The reference writer sorts by dtype alignment, then name; all of ours
  // are F32, so by name.
  std::sort(layout.order.begin(), layout.order.end(),
            [](const SafetensorsWriteTensor *a, const SafetensorsWriteTensor *b) {
              return a->name < b->name;
            });

  std::string &h = layout.header;
  h = "{";
  if (!metadata.empty()) {
    h += "\"__metadata__\":{";
    bool first = true;
    for (const auto &[key, value] : metadata) {
      checkUtf8(key, "the metadata key " + jsonQuoted(key));
      checkUtf8(value, "the value of metadata key " + jsonQuoted(key));
      h += (first ? "" : ",") + jsonQuoted(key) + ":" + jsonQuoted(value);
      first = false;
    }
    h += "}";
  }
  uint64_t offset = 0;
  for (size_t i = 0; i < layout.order.size(); ++i) {
    const SafetensorsWriteTensor &t = *layout.order[i];
    std::string at = "tensor " + jsonQuoted(t.name);
    if (t.name.empty())
      throw invalid("a tensor has an empty name");
    if (t.name == "__metadata__")
      throw invalid(
          "a tensor is named \"__metadata__\", which the format reserves");
    if (i > 0 && layout.order[i - 1]->name == t.name)
      throw invalid("two tensors are named " + jsonQuoted(t.name));
    checkUtf8(t.name, "the tensor name " + jsonQuoted(t.name));
    uint64_t n = 1;
    bool overflow = false;
    for (int64_t dim : t.shape) {
      if (dim < 0)
        throw invalid(at + " has the negative dimension " +
                      std::to_string(dim) + " in shape " +
                      shapeText(t.shape));
      overflow |= __builtin_mul_overflow(n, static_cast<uint64_t>(dim), &n);
    }
    uint64_t size = 0;
    overflow |= __builtin_mul_overflow(n, uint64_t(4), &size);
    uint64_t end = 0;
    overflow |= __builtin_add_overflow(offset, size, &end);
    if (overflow)
      throw invalid(at + " of shape " + shapeText(t.shape) +
                    " makes the file larger than 2^64 bytes");
    if (size > 0 && !t.data)
      throw invalid(at + " of shape " + shapeText(t.shape) +
                    " has no data (a null pointer)");
    h += (h.size() > 1 ? "," : "") + jsonQuoted(t.name) +
         ":{\"dtype\":\"F32\",\"shape\":[";
    for (size_t d = 0; d < t.shape.size(); ++d)
      h += (d ? "," : "") + std::to_string(t.shape[d]);
    h += "],\"data_offsets\":[" + std::to_string(offset) + "," +
         std::to_string(end) + "]}";
    layout.sizes.push_back(size);
    offset = end;
  }
  h += "}";
  // Padding to 8 bytes keeps the data 8-byte aligned in the file.
  h.append((8 - h.size() % 8) % 8, ' ');
  return layout;
}

void appendU64(std::vector<uint8_t> &out, uint64_t value) {
  for (int i = 0; i < 8; ++i)
    out.push_back(static_cast<uint8_t>(value >> (8 * i)));
}

} // namespace

std::vector<uint8_t>
serializeSafetensors(const std::vector<SafetensorsWriteTensor> &tensors,
                     const std::map<std::string, std::string> &metadata) {
  Layout layout = layOut(tensors, metadata);
  std::vector<uint8_t> out;
  appendU64(out, layout.header.size());
  out.insert(out.end(), layout.header.begin(), layout.header.end());
  for (size_t i = 0; i < layout.order.size(); ++i) {
    const auto *p = reinterpret_cast<const uint8_t *>(layout.order[i]->data);
    if (layout.sizes[i])
      out.insert(out.end(), p, p + layout.sizes[i]);
  }
  return out;
}

void streamSafetensors(
    const std::vector<SafetensorsWriteTensor> &tensors,
    const std::map<std::string, std::string> &metadata,
    const std::function<void(const void *, uint64_t)> &write) {
  Layout layout = layOut(tensors, metadata);
  std::vector<uint8_t> prefix;
  appendU64(prefix, layout.header.size());
  prefix.insert(prefix.end(), layout.header.begin(), layout.header.end());
  write(prefix.data(), prefix.size());
  for (size_t i = 0; i < layout.order.size(); ++i)
    if (layout.sizes[i])
      write(layout.order[i]->data, layout.sizes[i]);
}

void writeSafetensors(const std::string &path,
                      const std::vector<SafetensorsWriteTensor> &tensors,
                      const std::map<std::string, std::string> &metadata) {
  // Checked before the temporary file exists.
  layOut(tensors, metadata);
  DurableFile file(path, "writing safetensors '" + path + "'");
  streamSafetensors(tensors, metadata, [&](const void *data, uint64_t size) {
    file.write(data, size);
  });
  file.commit();
}

} // namespace mtrt
