// Megatron-LM's indexed dataset (.bin/.idx, the MMIDIDX layout): a reader
// over memory-mapped files and a writer. docs/IndexedDataset.md describes
// the bytes.
#ifndef MTRT_SRC_DATA_INDEXEDDATASET_H
#define MTRT_SRC_DATA_INDEXEDDATASET_H

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <fstream>
#include <string>
#include <vector>

namespace mtrt::data {

/// The token types of the .bin file, by their code in the .idx header
/// (Megatron-LM's DType enum).
enum class TokenType : uint8_t {
  UInt8 = 1,
  Int8 = 2,
  Int16 = 3,
  Int32 = 4,
  Int64 = 5,
  Float64 = 6,
  Float32 = 7,
  UInt16 = 8,
};

/// "uint16", "int32", ...
const char *tokenTypeName(TokenType type);
size_t tokenTypeSize(TokenType type);
/// Megatron-LM's choice for a vocabulary: uint16 below 65500 tokens, int32
/// otherwise.
TokenType tokenTypeForVocabulary(int64_t vocabSize);

/// A read-only view of `<prefix>.bin` and `<prefix>.idx`: sequences of
/// tokens grouped into documents. Opening validates the whole index (magic,
/// version, type, counts against the file size, every sequence inside the
/// .bin, document boundaries in order) and throws Error (NOT_FOUND,
/// DATA_LOSS, INVALID_ARGUMENT) naming the file, the field and the value.
///
/// Thread-safety: every const member may be called from several threads.
class IndexedDataset {
public:
  explicit IndexedDataset(const std::string &prefix);
  ~IndexedDataset();
  IndexedDataset(const IndexedDataset &) = delete;
  IndexedDataset &operator=(const IndexedDataset &) = delete;

  /// Whether `<prefix>.idx` and `<prefix>.bin` both exist.
  static bool exists(const std::string &prefix);

  const std::string &prefix() const { return prefix_; }
  TokenType tokenType() const { return type_; }
  int64_t sequenceCount() const { return sequenceCount_; }
  /// Documents: document d is sequences [documentBegin(d), documentEnd(d)).
  int64_t documentCount() const { return documentIndexCount_ - 1; }
  int64_t documentBegin(int64_t document) const {
    return load<int64_t>(documentIndices_, document);
  }
  int64_t documentEnd(int64_t document) const {
    return load<int64_t>(documentIndices_, document + 1);
  }
  /// The raw document index: documentCount() + 1 sequence numbers.
  std::vector<int64_t> documentIndices() const;

  int64_t sequenceLength(int64_t sequence) const {
    return load<int32_t>(lengths_, sequence);
  }
  /// Tokens of a document: the sum of its sequences' lengths.
  int64_t documentLength(int64_t document) const;
  /// Writes `count` tokens of `sequence` from `offset` to `out`, as int32.
  /// Throws Error (OUT_OF_RANGE) for a range outside the sequence and
  /// (DATA_LOSS) for a token that does not fit an int32 or is not an
  /// integer.
  void read(int64_t sequence, int64_t offset, int64_t count,
            int32_t *out) const;
  std::vector<int32_t> sequence(int64_t sequence) const;
  /// Reads across the sequences of a document as one token stream.
  void readDocument(int64_t document, int64_t offset, int64_t count,
                    int32_t *out) const;

private:
  /// The index's arrays start at unaligned offsets (the header is 34
  /// bytes): elements are loaded with memcpy.
  template <typename T>
  static T load(const unsigned char *array, int64_t index) {
    T value;
    std::memcpy(&value, array + index * static_cast<int64_t>(sizeof(T)),
                sizeof(T));
    return value;
  }
  int64_t pointer(int64_t sequence) const {
    return load<int64_t>(pointers_, sequence);
  }

  std::string prefix_;
  TokenType type_ = TokenType::UInt16;
  int64_t sequenceCount_ = 0, documentIndexCount_ = 0;
  const unsigned char *lengths_ = nullptr;
  const unsigned char *pointers_ = nullptr;
  const unsigned char *documentIndices_ = nullptr;
  const unsigned char *bin_ = nullptr;
  size_t binSize_ = 0;
  void *idxMap_ = nullptr, *binMap_ = nullptr;
  size_t idxSize_ = 0;
};

/// Writes `<prefix>.bin` and `<prefix>.idx` as Megatron-LM's
/// IndexedDatasetBuilder does. Both go to temporary names
/// (`<prefix>.bin.tmp`, `<prefix>.idx.tmp`) and are renamed by finish(), so
/// an interrupted run leaves no half-written dataset under the final names;
/// a writer destroyed without finish() removes its temporaries.
///
/// Thread-safety: none.
class IndexedDatasetWriter {
public:
  /// Throws Error (INVALID_ARGUMENT) for a type that is not an integer, and
  /// (PERMISSION_DENIED) when a file cannot be created.
  IndexedDatasetWriter(std::string prefix, TokenType type);
  ~IndexedDatasetWriter();
  IndexedDatasetWriter(const IndexedDatasetWriter &) = delete;
  IndexedDatasetWriter &operator=(const IndexedDatasetWriter &) = delete;

  /// Appends one document of one sequence per entry of `sequenceLengths`
  /// (their sum is tokens.size()); an empty `sequenceLengths` makes the
  /// whole of `tokens` one sequence, or none when `tokens` is empty. Throws Error (INVALID_ARGUMENT) for a
  /// token outside the type's range or lengths that do not add up.
  void addDocument(const std::vector<int32_t> &tokens,
                   const std::vector<int64_t> &sequenceLengths = {});
  /// Writes the index, flushes both files and renames them into place.
  void finish();

  int64_t documentCount() const {
    return static_cast<int64_t>(documentIndices_.size()) - 1;
  }
  int64_t tokenCount() const { return tokens_; }

private:
  std::string prefix_;
  TokenType type_;
  std::ofstream bin_;
  std::vector<int32_t> lengths_;
  std::vector<int64_t> documentIndices_{0};
  int64_t tokens_ = 0;
  bool finished_ = false;
  std::vector<unsigned char> buffer_;
};

} // namespace mtrt::data

#endif // MTRT_SRC_DATA_INDEXEDDATASET_H
