// The byte-level tokenizer: token = byte value, a vocabulary of 256.
#ifndef MTRT_SRC_TRAIN_BYTETOKENIZER_H
#define MTRT_SRC_TRAIN_BYTETOKENIZER_H

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace mtrt::train {

/// Each byte of the text is one token, its value (0..255). Models trained
/// with it need a vocabulary of at least kVocabSize.
struct ByteTokenizer {
  static constexpr int64_t kVocabSize = 256;

  static std::vector<int32_t> encode(std::string_view text);
  /// Tokens back to bytes; ids outside [0, 256) (padding of the model's
  /// vocabulary) become '?'.
  static std::string decode(const std::vector<int32_t> &tokens);
};

/// `bytes` made safe to print on a terminal: printable ASCII, newlines, tabs
/// and well-formed UTF-8 sequences pass through; every other byte is written
/// as \xNN (and a backslash as \\).
std::string escapeForDisplay(std::string_view bytes);

} // namespace mtrt::train

#endif // MTRT_SRC_TRAIN_BYTETOKENIZER_H
