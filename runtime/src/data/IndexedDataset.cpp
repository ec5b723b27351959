// Reading and writing Megatron-LM's .bin/.idx datasets.
#include "data/IndexedDataset.h"

#include "core/Error.h"

#include <cerrno>
#include <cstdio>
#include <fcntl.h>
#include <limits>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

namespace mtrt::data {

namespace {

constexpr char kMagic[9] = {'M', 'M', 'I', 'D', 'I', 'D', 'X', '\0', '\0'};
constexpr uint64_t kVersion = 1;
/// magic, version (u64), token type (u8), sequence count (u64), document
/// index count (u64).
constexpr size_t kHeaderSize = 9 + 8 + 1 + 8 + 8;

[[noreturn]] void corrupt(const std::string &file, const std::string &what) {
  throw Error(MTRT_STATUS_DATA_LOSS,
              "'" + file + "': " + what +
                  "; the dataset is damaged or not Megatron-LM's indexed "
                  "format: write it again with megatron-preprocess");
}

bool knownType(uint8_t code) { return code >= 1 && code <= 8; }

bool isIntegerType(TokenType type) {
  return type != TokenType::Float32 && type != TokenType::Float64;
}

/// Maps a whole file read-only; an empty file maps to nullptr.
void *mapFile(const std::string &path, size_t &size) {
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0)
    throw Error(MTRT_STATUS_NOT_FOUND,
                "cannot open '" + path + "' (" + std::strerror(errno) +
                    "); --data-path takes the prefix of a .bin/.idx pair "
                    "written by megatron-preprocess");
  struct stat info;
  if (::fstat(fd, &info) != 0) {
    int error = errno;
    ::close(fd);
    throw Error(MTRT_STATUS_DATA_LOSS,
                "cannot stat '" + path + "' (" + std::strerror(error) + ")");
  }
  size = static_cast<size_t>(info.st_size);
  void *map = nullptr;
  if (size > 0) {
    map = ::mmap(nullptr, size, PROT_READ, MAP_PRIVATE, fd, 0);
    if (map == MAP_FAILED) {
      int error = errno;
      ::close(fd);
      throw Error(MTRT_STATUS_DATA_LOSS, "cannot map '" + path + "' (" +
                                             std::strerror(error) + ")");
    }
  }
  ::close(fd);
  return map;
}

template <typename T> T loadAt(const unsigned char *bytes) {
  T value;
  std::memcpy(&value, bytes, sizeof(T));
  return value;
}

template <typename T>
void convert(const unsigned char *bytes, int64_t count, int32_t *out,
             const std::string &file, int64_t sequence) {
  for (int64_t i = 0; i < count; ++i) {
    T value = loadAt<T>(bytes + i * static_cast<int64_t>(sizeof(T)));
    if constexpr (sizeof(T) >= 4) {
      if (value > static_cast<T>(std::numeric_limits<int32_t>::max()) ||
          (std::numeric_limits<T>::is_signed && value < 0))
        corrupt(file, "sequence " + std::to_string(sequence) +
                          " holds token id " + std::to_string(value) +
                          ", outside [0, 2^31)");
    }
    out[i] = static_cast<int32_t>(value);
  }
}

} // namespace

const char *tokenTypeName(TokenType type) {
  switch (type) {
  case TokenType::UInt8:
    return "uint8";
  case TokenType::Int8:
    return "int8";
  case TokenType::Int16:
    return "int16";
  case TokenType::Int32:
    return "int32";
  case TokenType::Int64:
    return "int64";
  case TokenType::Float64:
    return "float64";
  case TokenType::Float32:
    return "float32";
  case TokenType::UInt16:
    return "uint16";
  }
  return "unknown";
}

size_t tokenTypeSize(TokenType type) {
  switch (type) {
  case TokenType::UInt8:
  case TokenType::Int8:
    return 1;
  case TokenType::Int16:
  case TokenType::UInt16:
    return 2;
  case TokenType::Int32:
  case TokenType::Float32:
    return 4;
  case TokenType::Int64:
  case TokenType::Float64:
    return 8;
  }
  return 0;
}

TokenType tokenTypeForVocabulary(int64_t vocabSize) {
  return vocabSize < 65500 ? TokenType::UInt16 : TokenType::Int32;
}

bool IndexedDataset::exists(const std::string &prefix) {
  struct stat info;
  return ::stat((prefix + ".idx").c_str(), &info) == 0 &&
         ::stat((prefix + ".bin").c_str(), &info) == 0;
}

IndexedDataset::IndexedDataset(const std::string &prefix) : prefix_(prefix) {
  std::string idxPath = prefix + ".idx", binPath = prefix + ".bin";
  idxMap_ = mapFile(idxPath, idxSize_);
  try {
    binMap_ = mapFile(binPath, binSize_);
  } catch (...) {
    if (idxMap_)
      ::munmap(idxMap_, idxSize_);
    throw;
  }
  try {
    auto *idx = static_cast<const unsigned char *>(idxMap_);
    bin_ = static_cast<const unsigned char *>(binMap_);
    if (idxSize_ < kHeaderSize)
      corrupt(idxPath, "the index has " + std::to_string(idxSize_) +
                           " bytes, fewer than its " +
                           std::to_string(kHeaderSize) + "-byte header");
    if (std::memcmp(idx, kMagic, sizeof(kMagic)) != 0)
      corrupt(idxPath, "the index does not start with the magic "
                       "\"MMIDIDX\\0\\0\"");
    auto version = loadAt<uint64_t>(idx + 9);
    if (version != kVersion)
      corrupt(idxPath, "index version " + std::to_string(version) +
                           ", expected " + std::to_string(kVersion));
    uint8_t code = idx[17];
    if (!knownType(code))
      corrupt(idxPath, "token type code " + std::to_string(code) +
                           ", expected 1 to 8 (Megatron-LM's DType codes)");
    type_ = static_cast<TokenType>(code);
    if (!isIntegerType(type_))
      throw Error(MTRT_STATUS_INVALID_ARGUMENT,
                  "'" + idxPath + "': tokens of type " +
                      std::string(tokenTypeName(type_)) +
                      " are not token ids; expected an integer type");
    auto sequences = loadAt<uint64_t>(idx + 18);
    auto documents = loadAt<uint64_t>(idx + 26);
    // Each count is at most the file size, so the products below fit.
    uint64_t arrays = idxSize_ - kHeaderSize;
    if (sequences > arrays / 12 || documents > arrays / 8 ||
        sequences * 12 + documents * 8 != arrays)
      corrupt(idxPath,
              "the header counts " + std::to_string(sequences) +
                  " sequences and " + std::to_string(documents) +
                  " document boundaries, which take " +
                  (sequences > arrays / 12 || documents > arrays / 8
                       ? std::string("more than the")
                       : std::to_string(sequences * 12 + documents * 8)) +
                  " bytes after the header, but the file has " +
                  std::to_string(arrays) + " (truncated or extended)");
    sequenceCount_ = static_cast<int64_t>(sequences);
    documentIndexCount_ = static_cast<int64_t>(documents);
    lengths_ = idx + kHeaderSize;
    pointers_ = lengths_ + 4 * sequences;
    documentIndices_ = pointers_ + 8 * sequences;
    if (documentIndexCount_ < 1 || documentBegin(0) != 0)
      corrupt(idxPath, "the document index must start with 0");
    for (int64_t d = 1; d < documentIndexCount_; ++d)
      if (documentBegin(d) < documentBegin(d - 1) ||
          documentBegin(d) > sequenceCount_)
        corrupt(idxPath, "document boundary " + std::to_string(d) + " is " +
                             std::to_string(documentBegin(d)) +
                             ", expected a value in [" +
                             std::to_string(documentBegin(d - 1)) + ", " +
                             std::to_string(sequenceCount_) + "]");
    if (documentBegin(documentIndexCount_ - 1) != sequenceCount_)
      corrupt(idxPath, "the last document boundary is " +
                           std::to_string(
                               documentBegin(documentIndexCount_ - 1)) +
                           ", expected the sequence count " +
                           std::to_string(sequenceCount_));
    auto itemSize = static_cast<int64_t>(tokenTypeSize(type_));
    auto binSize = static_cast<int64_t>(binSize_);
    for (int64_t s = 0; s < sequenceCount_; ++s) {
      int64_t length = sequenceLength(s), start = pointer(s);
      if (length < 0 || start < 0 || start > binSize ||
          length > (binSize - start) / itemSize)
        corrupt(binPath, "sequence " + std::to_string(s) + " of " +
                             std::to_string(length) + " tokens at byte " +
                             std::to_string(start) +
                             " lies outside the .bin file of " +
                             std::to_string(binSize) + " bytes");
    }
  } catch (...) {
    if (idxMap_)
      ::munmap(idxMap_, idxSize_);
    if (binMap_)
      ::munmap(binMap_, binSize_);
    throw;
  }
}

IndexedDataset::~IndexedDataset() {
  if (idxMap_)
    ::munmap(idxMap_, idxSize_);
  if (binMap_)
    ::munmap(binMap_, binSize_);
}

std::vector<int64_t> IndexedDataset::documentIndices() const {
  std::vector<int64_t> indices(static_cast<size_t>(documentIndexCount_));
  for (int64_t d = 0; d < documentIndexCount_; ++d)
    indices[d] = documentBegin(d);
  return indices;
}

int64_t IndexedDataset::documentLength(int64_t document) const {
  int64_t total = 0;
  for (int64_t s = documentBegin(document); s < documentEnd(document); ++s)
    total += sequenceLength(s);
  return total;
}

void IndexedDataset::read(int64_t sequence, int64_t offset, int64_t count,
                          int32_t *out) const {
  if (sequence < 0 || sequence >= sequenceCount_ || offset < 0 || count < 0 ||
      offset > sequenceLength(sequence) ||
      count > sequenceLength(sequence) - offset)
    throw Error(MTRT_STATUS_OUT_OF_RANGE,
                "'" + prefix_ + "': tokens [" + std::to_string(offset) +
                    ", " + std::to_string(offset + count) + ") of sequence " +
                    std::to_string(sequence) + " are outside the dataset");
  const unsigned char *bytes =
      bin_ + pointer(sequence) +
      offset * static_cast<int64_t>(tokenTypeSize(type_));
  const std::string file = prefix_ + ".bin";
  switch (type_) {
  case TokenType::UInt8:
    return convert<uint8_t>(bytes, count, out, file, sequence);
  case TokenType::Int8:
    return convert<int8_t>(bytes, count, out, file, sequence);
  case TokenType::Int16:
    return convert<int16_t>(bytes, count, out, file, sequence);
  case TokenType::UInt16:
    return convert<uint16_t>(bytes, count, out, file, sequence);
  case TokenType::Int32:
    return convert<int32_t>(bytes, count, out, file, sequence);
  case TokenType::Int64:
    return convert<int64_t>(bytes, count, out, file, sequence);
  case TokenType::Float32:
  case TokenType::Float64:
    break;
  }
}

std::vector<int32_t> IndexedDataset::sequence(int64_t sequence) const {
  if (sequence < 0 || sequence >= sequenceCount_)
    throw Error(MTRT_STATUS_OUT_OF_RANGE,
                "'" + prefix_ + "': sequence " + std::to_string(sequence) +
                    " does not exist (it has " +
                    std::to_string(sequenceCount_) + ")");
  std::vector<int32_t> tokens(static_cast<size_t>(sequenceLength(sequence)));
  read(sequence, 0, sequenceLength(sequence), tokens.data());
  return tokens;
}

void IndexedDataset::readDocument(int64_t document, int64_t offset,
                                  int64_t count, int32_t *out) const {
  for (int64_t s = documentBegin(document);
       s < documentEnd(document) && count > 0; ++s) {
    int64_t length = sequenceLength(s);
    if (offset >= length) {
      offset -= length;
      continue;
    }
    int64_t take = std::min(count, length - offset);
    read(s, offset, take, out);
    out += take;
    count -= take;
    offset = 0;
  }
  if (count > 0)
    throw Error(MTRT_STATUS_OUT_OF_RANGE,
                "'" + prefix_ + "': document " + std::to_string(document) +
                    " ends before the tokens asked for");
}

IndexedDatasetWriter::IndexedDatasetWriter(std::string prefix, TokenType type)
    : prefix_(std::move(prefix)), type_(type) {
  if (!isIntegerType(type_))
    throw Error(MTRT_STATUS_INVALID_ARGUMENT,
                "an indexed dataset of token ids needs an integer type, not " +
                    std::string(tokenTypeName(type_)));
  std::string path = prefix_ + ".bin.tmp";
  bin_.open(path, std::ios::binary | std::ios::trunc);
  if (!bin_)
    throw Error(MTRT_STATUS_PERMISSION_DENIED,
                "cannot create '" + path + "' (" + std::strerror(errno) +
                    "); give an output prefix in a writable directory");
}

IndexedDatasetWriter::~IndexedDatasetWriter() {
  if (finished_)
    return;
  bin_.close();
  std::remove((prefix_ + ".bin.tmp").c_str());
  std::remove((prefix_ + ".idx.tmp").c_str());
}

void IndexedDatasetWriter::addDocument(
    const std::vector<int32_t> &tokens,
    const std::vector<int64_t> &sequenceLengths) {
  int64_t minimum = 0, maximum = 0;
  switch (type_) {
  case TokenType::UInt8:
    maximum = 255;
    break;
  case TokenType::Int8:
    minimum = -128, maximum = 127;
    break;
  case TokenType::Int16:
    minimum = -32768, maximum = 32767;
    break;
  case TokenType::UInt16:
    maximum = 65535;
    break;
  default:
    minimum = std::numeric_limits<int32_t>::min();
    maximum = std::numeric_limits<int32_t>::max();
  }
  size_t itemSize = tokenTypeSize(type_);
  buffer_.resize(tokens.size() * itemSize);
  for (size_t i = 0; i < tokens.size(); ++i) {
    int64_t token = tokens[i];
    if (token < minimum || token > maximum)
      throw Error(MTRT_STATUS_INVALID_ARGUMENT,
                  "token id " + std::to_string(token) + " does not fit the " +
                      tokenTypeName(type_) + " tokens of '" + prefix_ +
                      ".bin'; the vocabulary is larger than the type allows");
    unsigned char *to = buffer_.data() + i * itemSize;
    switch (type_) {
    case TokenType::UInt8:
    case TokenType::Int8:
      *to = static_cast<unsigned char>(token);
      break;
    case TokenType::Int16:
    case TokenType::UInt16: {
      auto value = static_cast<uint16_t>(token);
      std::memcpy(to, &value, 2);
      break;
    }
    case TokenType::Int32: {
      auto value = static_cast<int32_t>(token);
      std::memcpy(to, &value, 4);
      break;
    }
    default: {
      std::memcpy(to, &token, 8);
      break;
    }
    }
  }
  std::vector<int64_t> lengths = sequenceLengths;
  if (lengths.empty() && !tokens.empty())
    lengths.push_back(static_cast<int64_t>(tokens.size()));
  int64_t sum = 0;
  for (int64_t length : lengths) {
    if (length < 0 || length > std::numeric_limits<int32_t>::max())
      throw Error(MTRT_STATUS_INVALID_ARGUMENT,
                  "sequence length " + std::to_string(length) +
                      " outside [0, 2^31)");
    sum += length;
  }
  if (sum != static_cast<int64_t>(tokens.size()))
    throw Error(MTRT_STATUS_INVALID_ARGUMENT,
                "the sequence lengths of a document add up to " +
                    std::to_string(sum) + ", but it has " +
                    std::to_string(tokens.size()) + " tokens");
  bin_.write(reinterpret_cast<const char *>(buffer_.data()),
             static_cast<std::streamsize>(buffer_.size()));
  if (!bin_)
    throw Error(MTRT_STATUS_DATA_LOSS,
                "writing '" + prefix_ + ".bin.tmp' failed (" +
                    std::strerror(errno) + "); is the disk full?");
  for (int64_t length : lengths)
    lengths_.push_back(static_cast<int32_t>(length));
  documentIndices_.push_back(static_cast<int64_t>(lengths_.size()));
  tokens_ += sum;
}

void IndexedDatasetWriter::finish() {
  bin_.close();
  if (!bin_)
    throw Error(MTRT_STATUS_DATA_LOSS,
                "writing '" + prefix_ + ".bin.tmp' failed; is the disk full?");
  std::string idxPath = prefix_ + ".idx.tmp";
  std::ofstream idx(idxPath, std::ios::binary | std::ios::trunc);
  if (!idx)
    throw Error(MTRT_STATUS_PERMISSION_DENIED,
                "cannot create '" + idxPath + "' (" + std::strerror(errno) +
                    ")");
  auto put = [&](const void *data, size_t size) {
    idx.write(static_cast<const char *>(data),
              static_cast<std::streamsize>(size));
  };
  uint64_t version = kVersion;
  auto code = static_cast<uint8_t>(type_);
  uint64_t sequences = lengths_.size(), documents = documentIndices_.size();
  put(kMagic, sizeof(kMagic));
  put(&version, 8);
  put(&code, 1);
  put(&sequences, 8);
  put(&documents, 8);
  put(lengths_.data(), lengths_.size() * 4);
  int64_t itemSize = static_cast<int64_t>(tokenTypeSize(type_)), at = 0;
  std::vector<int64_t> pointers(lengths_.size());
  for (size_t s = 0; s < lengths_.size(); ++s) {
    pointers[s] = at;
    at += lengths_[s] * itemSize;
  }
  put(pointers.data(), pointers.size() * 8);
  put(documentIndices_.data(), documentIndices_.size() * 8);
  idx.close();
  if (!idx)
    throw Error(MTRT_STATUS_DATA_LOSS,
                "writing '" + idxPath + "' failed; is the disk full?");
  for (const char *suffix : {".bin", ".idx"}) {
    std::string to = prefix_ + suffix, from = to + ".tmp";
    if (std::rename(from.c_str(), to.c_str()) != 0)
      throw Error(MTRT_STATUS_DATA_LOSS, "cannot rename '" + from + "' to '" +
                                             to + "' (" +
                                             std::strerror(errno) + ")");
  }
  finished_ = true;
}

} // namespace mtrt::data
