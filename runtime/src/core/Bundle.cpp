// Reads bundle files: the container checks and the public Bundle API
// (docs/BundleFormat.md); the manifest is read in BundleManifest.cpp.
#include "core/Bundle.h"
#include "core/BundleReader.h"

#include "core/Sha256.h"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstring>
#include <fstream>
#include <limits>
#include <map>
#include <set>
#include <sstream>

namespace mtrt {

using namespace bundle_detail;

//===----------------------------------------------------------------------===//
// Element types, ops and printing
//===----------------------------------------------------------------------===//

namespace {

uint32_t readU32(const uint8_t *p) {
  uint32_t v = 0;
  for (int i = 3; i >= 0; --i)
    v = (v << 8) | p[i];
  return v;
}

uint64_t readU64(const uint8_t *p) {
  uint64_t v = 0;
  for (int i = 7; i >= 0; --i)
    v = (v << 8) | p[i];
  return v;
}

} // namespace

const char *dtypeName(DType dtype) {
  for (const DTypeName &entry : kDTypes)
    if (entry.dtype == dtype)
      return entry.name;
  return "?";
}

bool isFloatingPoint(DType dtype) {
  return dtype == DType::F32 || dtype == DType::F64 || dtype == DType::BF16 ||
         dtype == DType::F16 || isFp8(dtype);
}

size_t dtypeSize(DType dtype) {
  for (const DTypeName &entry : kDTypes)
    if (entry.dtype == dtype)
      return entry.size;
  return 0;
}

std::string shapeString(const std::vector<int64_t> &shape) {
  std::string text = "[";
  for (size_t i = 0; i < shape.size(); ++i) {
    if (i)
      text += ", ";
    text += std::to_string(shape[i]);
  }
  return text + "]";
}

std::string TensorType::str() const {
  return shapeString(shape) + " " + dtypeName(dtype);
}

const char *opName(Op op) { return opInfo(op).name; }

std::vector<FusedColumnSum> fusedColumnSums(const Instruction &inst) {
  std::vector<FusedColumnSum> sums;
  auto indexOf = [&](int64_t value) {
    return static_cast<size_t>(
        std::find(inst.results.begin(), inst.results.end(), value) -
        inst.results.begin());
  };
  for (const Instruction &op : inst.body)
    if (op.op == Op::BiasGrad)
      sums.push_back({indexOf(op.results[0]), indexOf(op.operands[0])});
  return sums;
}

const Function *Bundle::findFunction(std::string_view name) const {
  for (const Function &function : functions_)
    if (function.name == name)
      return &function;
  return nullptr;
}

const GradientBuffer &
Bundle::gradientBuffer(const std::vector<int64_t> &coordinates) const {
  static const GradientBuffer kNone;
  if (gradientBuffers_.empty())
    return kNone;
  // The reader keeps a pipeline bundle's buffers one per rank, in order.
  if (gradientBuffers_.front().pipelineRank < 0 || coordinates.empty())
    return gradientBuffers_.front();
  return gradientBuffers_.at(static_cast<size_t>(coordinates[0]));
}

int64_t Bundle::rankCount() const {
  return gridGroupSize(gridShape_, [&] {
    std::vector<int64_t> all(gridShape_.size());
    for (size_t i = 0; i < all.size(); ++i)
      all[i] = static_cast<int64_t>(i);
    return all;
  }());
}

std::vector<int64_t> gridCoordinates(const std::vector<int64_t> &shape,
                                     int64_t rank) {
  std::vector<int64_t> coordinates(shape.size());
  for (size_t i = shape.size(); i-- > 0;) {
    coordinates[i] = rank % shape[i];
    rank /= shape[i];
  }
  return coordinates;
}

int64_t gridGroupSize(const std::vector<int64_t> &shape,
                      const std::vector<int64_t> &axes) {
  int64_t size = 1;
  for (int64_t axis : axes)
    size *= shape[static_cast<size_t>(axis)];
  return size;
}

int64_t gridGroupIndex(const std::vector<int64_t> &shape,
                       const std::vector<int64_t> &coordinates,
                       const std::vector<int64_t> &axes) {
  int64_t index = 0;
  for (int64_t axis : axes)
    index = index * shape[static_cast<size_t>(axis)] +
            coordinates[static_cast<size_t>(axis)];
  return index;
}

std::vector<int64_t> gridDataAxes(const std::vector<int64_t> &shape,
                                  bool pipelined, int64_t dataParallelSize) {
  const int64_t data = pipelined ? 1 : 0;
  if (static_cast<int64_t>(shape.size()) < data + 2)
    return {};
  if (shape[data] == dataParallelSize || shape.size() != size_t(data + 3))
    return {data};
  // Three axes after the pipeline's: data x context x tensor under context
  // parallelism (the data axis holds every data-parallel rank), else
  // expert-data-parallel x expert-parallel x tensor.
  if (shape[data] * shape[data + 1] == dataParallelSize)
    return {data, data + 1};
  return {data};
}

std::vector<int64_t> shardOffsets(const Parameter &parameter,
                                  const std::vector<int64_t> &gridShape,
                                  const std::vector<int64_t> &coordinates) {
  std::vector<int64_t> offsets(parameter.type.shape.size(), 0);
  for (size_t d = 0; d < parameter.splitAxes.size(); ++d)
    offsets[d] =
        gridGroupIndex(gridShape, coordinates, parameter.splitAxes[d]) *
        parameter.localType.shape[d];
  return offsets;
}

int64_t shardElementIndex(const Parameter &parameter,
                          const std::vector<int64_t> &offsets, int64_t local) {
  const std::vector<int64_t> &shape = parameter.localType.shape;
  int64_t index = 0, stride = 1;
  for (size_t d = shape.size(); d-- > 0;) {
    index += (offsets[d] + local % shape[d]) * stride;
    local /= shape[d];
    stride *= parameter.type.shape[d];
  }
  return index;
}

//===----------------------------------------------------------------------===//
// The container
//===----------------------------------------------------------------------===//

Bundle Bundle::parseManifest(std::string_view name, std::string_view json) {
  return ManifestReader(name).read(json, std::string_view());
}

Bundle Bundle::parseManifest(std::string_view name, std::string_view json,
                             std::string_view payload) {
  return ManifestReader(name).read(json, payload);
}

Bundle Bundle::parse(std::string_view name, const uint8_t *data, size_t size) {
  ManifestReader reader(name);
  auto dataLoss = [&](const std::string &path, const std::string &found,
                      const std::string &expected) {
    reader.fail(path, found, expected, MTRT_STATUS_DATA_LOSS);
  };
  if (size < kHeaderSize)
    dataLoss("header", std::to_string(size) + " bytes (the file is truncated)",
             "a 64-byte header at least");
  if (std::memcmp(data, "MTBUNDLE", 8) != 0) {
    std::string found;
    for (int i = 0; i < 8; ++i) {
      char c = static_cast<char>(data[i]);
      found += (c >= 32 && c < 127) ? std::string(1, c) : "\\x..";
    }
    reader.fail("header.magic (offset 0)",
                "\"" + found + "\" (this is not a bundle file)",
                "the bytes \"MTBUNDLE\"");
  }
  uint32_t version = readU32(data + 8);
  if (version < kOldestFormatVersion || version > kFormatVersion)
    reader.fail("header.version (offset 8)", std::to_string(version),
                std::to_string(kOldestFormatVersion) + " to " +
                    std::to_string(kFormatVersion) +
                    " (this runtime reads format versions " +
                    std::to_string(kOldestFormatVersion) + " to " +
                    std::to_string(kFormatVersion) +
                    "; rebuild the bundle with a megatron-compile of the "
                    "same release)",
                MTRT_STATUS_UNIMPLEMENTED);
  uint32_t flags = readU32(data + 12);
  if (flags != 0)
    reader.fail("header.flags (offset 12)", std::to_string(flags),
                "0 (no flags are defined in format versions 1 to " +
                    std::to_string(kFormatVersion) + ")");
  uint64_t manifestLength = readU64(data + 16);
  uint64_t payloadLength = readU64(data + 24);
  uint64_t available = size - kHeaderSize;
  if (manifestLength > available)
    dataLoss("header.manifest_length (offset 16)",
             std::to_string(manifestLength) + " bytes",
             "at most the " + std::to_string(available) +
                 " bytes after the header (the file is truncated or the "
                 "length corrupted)");
  if (payloadLength > available - manifestLength)
    dataLoss("header.payload_length (offset 24)",
             std::to_string(payloadLength) + " bytes",
             "at most the " + std::to_string(available - manifestLength) +
                 " bytes after the manifest (the file is truncated or the "
                 "length corrupted)");
  if (manifestLength + payloadLength != available)
    dataLoss("header", std::to_string(size) + " bytes in the file",
             "exactly 64 + " + std::to_string(manifestLength) + " + " +
                 std::to_string(payloadLength) + " = " +
                 std::to_string(kHeaderSize + manifestLength + payloadLength) +
                 " bytes (header + manifest + payload)");
  if (payloadLength != 0 && version < 3)
    reader.fail("header.payload_length (offset 24)",
                std::to_string(payloadLength),
                "0 in format versions 1 and 2");
  Sha256Digest digest = sha256(data + kHeaderSize, available);
  Sha256Digest stored;
  std::memcpy(stored.data(), data + 32, stored.size());
  if (digest != stored)
    dataLoss("header.sha256 (offset 32)",
             "a SHA-256 of the manifest and payload of " + toHex(digest) +
                 " (the file is corrupted)",
             "the stored " + toHex(stored));
  const char *manifest = reinterpret_cast<const char *>(data + kHeaderSize);
  Bundle bundle =
      reader.read(std::string_view(manifest, manifestLength),
                  std::string_view(manifest + manifestLength, payloadLength));
  bundle.sha256_ = toHex(digest);
  return bundle;
}

Bundle Bundle::load(const std::string &path) {
  std::ifstream file(path, std::ios::binary | std::ios::ate);
  if (!file)
    throw Error(MTRT_STATUS_NOT_FOUND,
                "bundle '" + path + "': cannot open it (" +
                    std::strerror(errno) +
                    "); check the path, or write it with megatron-compile "
                    "MODEL -o " +
                    path);
  std::streamoff size = file.tellg();
  if (size < 0)
    throw Error(MTRT_STATUS_INVALID_ARGUMENT,
                "bundle '" + path +
                    "': cannot tell its size (not a regular file?)");
  std::vector<uint8_t> bytes(static_cast<size_t>(size));
  file.seekg(0);
  if (size > 0 && !file.read(reinterpret_cast<char *>(bytes.data()), size))
    throw Error(MTRT_STATUS_DATA_LOSS, "bundle '" + path + "': reading " +
                                           std::to_string(size) +
                                           " bytes failed");
  return parse(path, bytes.data(), bytes.size());
}

} // namespace mtrt
