// The steps of a tokenizer.json around its model: normalizer, pre-tokenizer,
// post-processor and decoder, each read from the file and run as the
// `tokenizers` library runs it.
#ifndef MTRT_SRC_DATA_HFPIPELINE_H
#define MTRT_SRC_DATA_HFPIPELINE_H

#include "data/UnicodeRegex.h"

#include <nlohmann/json_fwd.hpp>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace mtrt::data {

/// A piece of text on its way to the model; `atOrigin` marks the piece that
/// starts the whole input (Metaspace's prepend_scheme "first" needs it).
struct HfPiece {
  std::string text;
  bool atOrigin = false;
};

/// Implemented, each with the fields the families' files use:
/// - normalizers: NFC, NFD, NFKC, NFKD, Prepend, Replace (a String
///   pattern), Sequence;
/// - pre-tokenizers: Split (a Regex or String pattern, behavior Isolated),
///   ByteLevel, Metaspace, Sequence;
/// - post-processors: TemplateProcessing (its single-sequence template),
///   ByteLevel (ids unchanged), Sequence;
/// - decoders: ByteLevel, Metaspace, Replace (a String pattern),
///   ByteFallback, Fuse, Strip, Sequence.
/// Anything else, or a field value these do not implement, is refused when
/// the file is read.
///
/// Thread-safety: const methods may run on several threads at once.
class HfPipeline {
public:
  /// Reads the four steps of `root` (a tokenizer.json); `idOf` gives the
  /// id of a token named by the post-processor. Throws Error
  /// (UNIMPLEMENTED) naming `file`, the field and its value for what is not
  /// implemented, (DATA_LOSS) for malformed fields.
  HfPipeline(const nlohmann::json &root, const std::string &file);
  ~HfPipeline();

  void normalize(std::string &text) const;
  /// Appends the pieces of `piece` to `out`.
  void preTokenize(HfPiece piece, std::vector<HfPiece> &out) const;
  /// The ids the post-processor puts before and after a single sequence.
  const std::vector<int32_t> &prefix() const { return prefix_; }
  const std::vector<int32_t> &suffix() const { return suffix_; }
  /// The text of token strings (ids already turned into their tokens).
  std::string decode(std::vector<std::string> tokens) const;

  struct Step;

private:
  std::vector<Step> normalizers_, preTokenizers_, decoders_;
  bool hasDecoder_ = false;
  std::vector<int32_t> prefix_, suffix_;
};

/// `bytes` as UTF-8, each maximal invalid subsequence replaced by U+FFFD.
std::string lossyUtf8(const std::string &bytes);

} // namespace mtrt::data

#endif // MTRT_SRC_DATA_HFPIPELINE_H
