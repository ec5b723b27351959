// GPT-2's byte-level BPE tokenizer (Megatron-LM's GPT2BPETokenizer).
#ifndef MTRT_SRC_DATA_GPT2BPETOKENIZER_H
#define MTRT_SRC_DATA_GPT2BPETOKENIZER_H

#include "data/Tokenizer.h"

#include <memory>
#include <string>
#include <unordered_map>
#include <vector>

namespace mtrt::data {

/// The vocabulary and merges of a byte-level BPE, shared by the copies of a
/// tokenizer.
struct BpeModel {
  /// Each token's bytes, by id.
  std::vector<std::string> tokenBytes;
  /// Merges by the pair of ids they join: (rank << 32) | merged id.
  std::unordered_map<uint64_t, uint64_t> merges;
  int32_t byteToken[256];
  int32_t eod = -1;
};

/// Encodes as GPT-2 does: splitGpt2Chunks, each chunk's UTF-8 bytes as
/// single-byte tokens, then the merge of lowest rank among adjacent pairs
/// applied everywhere, repeatedly, until no pair has a merge. Chunks and
/// their ids are cached.
///
/// The files: the vocabulary (encoder.json / vocab.json) maps token strings
/// to ids; the merges (vocab.bpe / merges.txt) list one pair "A B" per line
/// by rank, after an optional "#version" line. Token strings write each
/// byte as a printable character: bytes 33-126, 161-172 and 174-255 as
/// themselves, the other 68 as U+0100 onwards in byte order.
///
/// Thread-safety: none (the cache); clone() shares the model.
class Gpt2BpeTokenizer : public Tokenizer {
public:
  /// Throws Error (NOT_FOUND) for a missing file, (DATA_LOSS) naming the
  /// file and the line or key of a malformed entry.
  Gpt2BpeTokenizer(const std::string &vocabFile, const std::string &mergeFile);

  std::vector<int32_t> encode(std::string_view text) override;
  std::string decode(const std::vector<int32_t> &tokens) const override;
  int64_t vocabSize() const override {
    return static_cast<int64_t>(model_->tokenBytes.size());
  }
  int32_t eod() const override { return model_->eod; }
  std::string typeName() const override { return "GPT2BPETokenizer"; }
  std::unique_ptr<Tokenizer> clone() const override;

private:
  explicit Gpt2BpeTokenizer(std::shared_ptr<const BpeModel> model)
      : model_(std::move(model)) {}
  void encodeChunk(std::string_view chunk, std::vector<int32_t> &out);

  std::shared_ptr<const BpeModel> model_;
  std::unordered_map<std::string, std::vector<int32_t>> cache_;
};

/// GPT-2's printable character of each byte (as a code point).
int32_t gpt2ByteToCodePoint(uint8_t byte);

} // namespace mtrt::data

#endif // MTRT_SRC_DATA_GPT2BPETOKENIZER_H
