// The tokenizers of megatron-preprocess and megatron-train, behind one
// interface: Megatron-LM's GPT2BPETokenizer and HuggingFaceTokenizer, and the
// byte-level tokenizer of the tiny models.
#ifndef MTRT_SRC_DATA_TOKENIZER_H
#define MTRT_SRC_DATA_TOKENIZER_H

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

namespace mtrt::data {

/// Text to token ids and back.
///
/// Thread-safety: none (encoders keep caches); clone() gives each thread
/// its own.
class Tokenizer {
public:
  virtual ~Tokenizer() = default;
  /// Throws Error (INVALID_ARGUMENT) for text the tokenizer cannot read
  /// (invalid UTF-8 for GPT-2's).
  virtual std::vector<int32_t> encode(std::string_view text) = 0;
  /// Ids outside the vocabulary become U+FFFD.
  virtual std::string decode(const std::vector<int32_t> &tokens) const = 0;
  /// Tokens, end of document included: ids are in [0, vocabSize()).
  virtual int64_t vocabSize() const = 0;
  /// The end-of-document token --append-eod adds.
  virtual int32_t eod() const = 0;
  /// Megatron-LM's --tokenizer-type name.
  virtual std::string typeName() const = 0;
  virtual std::unique_ptr<Tokenizer> clone() const = 0;
};

/// Throws Error (INVALID_ARGUMENT) when `text` is not valid UTF-8 (naming the
/// byte) or too long for one encode call (2^31 - 1 bytes); `tokenizer` names
/// the reader in the message.
void requireUtf8(std::string_view text, std::string_view tokenizer);

/// What selects and configures a tokenizer: Megatron-LM's flags.
struct TokenizerOptions {
  /// GPT2BPETokenizer, HuggingFaceTokenizer or ByteTokenizer.
  std::string type = "ByteTokenizer";
  /// --vocab-file, --merge-file: GPT-2's encoder.json (or vocab.json) and
  /// vocab.bpe (or merges.txt).
  std::string vocabFile, mergeFile;
  /// --tokenizer-model: the directory of tokenizer.json and
  /// tokenizer_config.json (HuggingFaceTokenizer).
  std::string tokenizerModel;
};

/// Throws Error (INVALID_ARGUMENT) naming the flag for an unknown type or a
/// file the type lacks, (NOT_FOUND, DATA_LOSS) for files it cannot read,
/// (UNIMPLEMENTED) for a tokenizer.json it does not implement.
std::unique_ptr<Tokenizer> makeTokenizer(const TokenizerOptions &options);

} // namespace mtrt::data

#endif // MTRT_SRC_DATA_TOKENIZER_H
