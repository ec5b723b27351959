// Choosing a tokenizer by Megatron-LM's --tokenizer-type; the byte-level
// tokenizer behind the common interface.
#include "data/Tokenizer.h"

#include "core/Error.h"
#include "data/Gpt2BpeTokenizer.h"
#include "data/HuggingFaceTokenizer.h"
#include "train/ByteTokenizer.h"

#include <unicode/utf8.h>

#include <climits>

namespace mtrt::data {

namespace {

/// Each byte is its own token; the end of document is 256, after the bytes
/// (a model trained on documents with it needs a vocabulary of 257).
class ByteLevelTokenizer : public Tokenizer {
public:
  std::vector<int32_t> encode(std::string_view text) override {
    return train::ByteTokenizer::encode(text);
  }
  std::string decode(const std::vector<int32_t> &tokens) const override {
    return train::ByteTokenizer::decode(tokens);
  }
  int64_t vocabSize() const override {
    return train::ByteTokenizer::kVocabSize + 1;
  }
  int32_t eod() const override {
    return static_cast<int32_t>(train::ByteTokenizer::kVocabSize);
  }
  std::string typeName() const override { return "ByteTokenizer"; }
  std::unique_ptr<Tokenizer> clone() const override {
    return std::make_unique<ByteLevelTokenizer>();
  }
};

} // namespace

std::unique_ptr<Tokenizer> makeTokenizer(const TokenizerOptions &options) {
  if (options.type == "HuggingFaceTokenizer") {
    if (options.tokenizerModel.empty())
      throw Error(MTRT_STATUS_INVALID_ARGUMENT,
                  "--tokenizer-type HuggingFaceTokenizer needs "
                  "--tokenizer-model DIR, the model's directory with "
                  "tokenizer.json and tokenizer_config.json");
    if (!options.vocabFile.empty() || !options.mergeFile.empty())
      throw Error(MTRT_STATUS_INVALID_ARGUMENT,
                  "--vocab-file and --merge-file are for --tokenizer-type "
                  "GPT2BPETokenizer; HuggingFaceTokenizer reads "
                  "--tokenizer-model DIR");
    return std::make_unique<HuggingFaceTokenizer>(options.tokenizerModel);
  }
  if (!options.tokenizerModel.empty())
    throw Error(MTRT_STATUS_INVALID_ARGUMENT,
                "--tokenizer-model is for --tokenizer-type "
                "HuggingFaceTokenizer (found --tokenizer-type " +
                    options.type + ")");
  if (options.type == "ByteTokenizer") {
    if (!options.vocabFile.empty() || !options.mergeFile.empty())
      throw Error(MTRT_STATUS_INVALID_ARGUMENT,
                  "--vocab-file and --merge-file are for --tokenizer-type "
                  "GPT2BPETokenizer; the byte tokenizer needs no files");
    return std::make_unique<ByteLevelTokenizer>();
  }
  if (options.type == "GPT2BPETokenizer") {
    if (options.vocabFile.empty() || options.mergeFile.empty())
      throw Error(MTRT_STATUS_INVALID_ARGUMENT,
                  std::string("--tokenizer-type GPT2BPETokenizer needs ") +
                      (options.vocabFile.empty() ? "--vocab-file (GPT-2's "
                                                   "encoder.json)"
                                                 : "--merge-file (GPT-2's "
                                                   "vocab.bpe)"));
    return std::make_unique<Gpt2BpeTokenizer>(options.vocabFile,
                                              options.mergeFile);
  }
  throw Error(MTRT_STATUS_INVALID_ARGUMENT,
              "--tokenizer-type: found '" + options.type +
                  "', expected GPT2BPETokenizer, HuggingFaceTokenizer or "
                  "ByteTokenizer");
}

void requireUtf8(std::string_view text, std::string_view tokenizer) {
  if (text.size() > static_cast<size_t>(INT32_MAX))
    throw Error(MTRT_STATUS_INVALID_ARGUMENT,
                "a text of " + std::to_string(text.size()) +
                    " bytes is too long to tokenize at once (at most 2^31 - 1 "
                    "bytes); split it into documents");
  const auto *data = reinterpret_cast<const uint8_t *>(text.data());
  auto length = static_cast<int32_t>(text.size());
  for (int32_t at = 0; at < length;) {
    int32_t start = at;
    UChar32 c;
    U8_NEXT(data, at, length, c);
    if (c < 0)
      throw Error(MTRT_STATUS_INVALID_ARGUMENT,
                  "invalid UTF-8 at byte " + std::to_string(start) +
                      " of the text; " + std::string(tokenizer) +
                      " reads UTF-8 text (convert the file, e.g. with iconv)");
  }
}

} // namespace mtrt::data
