// The BPE model of a tokenizer.json ("model": {"type": "BPE", ...}), encoding
// one pre-tokenized piece as the `tokenizers` library does.
#ifndef MTRT_SRC_DATA_HFBPEMODEL_H
#define MTRT_SRC_DATA_HFBPEMODEL_H

#include <nlohmann/json_fwd.hpp>

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

namespace mtrt::data {

/// Vocabulary (token string -> id), merges by rank, and the flags of
/// byte-level BPE (Llama 3, Qwen2.5) and of SentencePiece-style BPE (Llama 2,
/// Mistral: unk_token, fuse_unk, byte_fallback to the <0xNN> tokens).
///
/// A piece's code points are its first symbols (a code point missing from
/// the vocabulary: its UTF-8 bytes' <0xNN> tokens with byte_fallback, else
/// unk_token, runs of them fused into one with fuse_unk, else dropped); then
/// the merge of lowest rank, leftmost first, is applied until none applies.
/// With ignore_merges, a piece that is itself in the vocabulary is that
/// token.
///
/// Thread-safety: const methods may run on several threads at once.
class HfBpeModel {
public:
  /// Reads `model`; throws Error (DATA_LOSS) for malformed entries and
  /// (UNIMPLEMENTED) for a model type or flag it does not implement, naming
  /// `file` and the field.
  HfBpeModel(const nlohmann::json &model, const std::string &file);

  void encode(std::string_view piece, std::vector<int32_t> &out) const;

  /// The token string of each id (empty for ids the vocabulary lacks).
  const std::vector<std::string> &tokens() const { return tokens_; }
  std::optional<int32_t> find(const std::string &token) const {
    auto it = vocab_.find(token);
    if (it == vocab_.end())
      return std::nullopt;
    return it->second;
  }

private:
  struct Merge {
    uint32_t rank;
    int32_t merged;
  };

  std::unordered_map<std::string, int32_t> vocab_;
  std::vector<std::string> tokens_;
  std::unordered_map<uint64_t, Merge> merges_;
  std::optional<int32_t> unk_;
  int32_t byteTokens_[256];
  bool fuseUnk_ = false, byteFallback_ = false, ignoreMerges_ = false;
};

} // namespace mtrt::data

#endif // MTRT_SRC_DATA_HFBPEMODEL_H
