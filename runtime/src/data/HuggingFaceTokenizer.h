// Megatron-LM's HuggingFaceTokenizer: the tokenizer a Hugging Face model
// directory describes in its tokenizer.json, as the `tokenizers` library
// runs it.
#ifndef MTRT_SRC_DATA_HUGGINGFACETOKENIZER_H
#define MTRT_SRC_DATA_HUGGINGFACETOKENIZER_H

#include "data/Tokenizer.h"

#include <memory>
#include <string>

namespace mtrt::data {

/// Reads DIR/tokenizer.json (BPE models: the byte-level ones of Llama 3 and
/// Qwen2.5, the SentencePiece-style ones of Llama 2 and Mistral; HfPipeline
/// lists the steps around them) and DIR/tokenizer_config.json (its
/// eos_token is the end of document, as transformers' eos_token_id is
/// Megatron-LM's eod).
///
/// encode: the added tokens whose "normalized" is false are split out of the
/// text first (leftmost, then longest); each stretch between them is
/// normalized, split at the remaining (normalized) added tokens,
/// pre-tokenized and encoded piece by piece by the BPE model; the
/// post-processor's tokens (Llama's BOS) go around the whole. decode: each
/// id's token string (added tokens included) through the decoder.
///
/// Thread-safety: encode and decode may run on several threads at once;
/// clone() shares the loaded files.
class HuggingFaceTokenizer : public Tokenizer {
public:
  /// Throws Error (NOT_FOUND) naming a missing file, (DATA_LOSS) for a
  /// malformed one, (UNIMPLEMENTED) naming the field of tokenizer.json that
  /// is not implemented.
  explicit HuggingFaceTokenizer(const std::string &directory);

  std::vector<int32_t> encode(std::string_view text) override;
  std::string decode(const std::vector<int32_t> &tokens) const override;
  int64_t vocabSize() const override;
  int32_t eod() const override;
  std::string typeName() const override { return "HuggingFaceTokenizer"; }
  std::unique_ptr<Tokenizer> clone() const override;

  struct Files;

private:
  explicit HuggingFaceTokenizer(std::shared_ptr<const Files> files)
      : files_(std::move(files)) {}

  std::shared_ptr<const Files> files_;
};

} // namespace mtrt::data

#endif // MTRT_SRC_DATA_HUGGINGFACETOKENIZER_H
