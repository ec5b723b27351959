// A Unicode regular expression (PCRE2, UTF and UCP) for the pre-tokenizer
// patterns of tokenizer.json files, which the `tokenizers` library runs with
// Oniguruma.
#ifndef MTRT_SRC_DATA_UNICODEREGEX_H
#define MTRT_SRC_DATA_UNICODEREGEX_H

#include <cstddef>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace mtrt::data {

/// A compiled pattern, matched over UTF-8 text with Unicode character
/// properties: \p{L}, \p{N}, case-insensitive groups with Unicode case
/// folding, look-ahead. \s and \S are read as Oniguruma reads them, the
/// Unicode White_Space property (PCRE2's own \s also takes U+180E).
///
/// Thread-safety: findAll may run on several threads at once.
class UnicodeRegex {
public:
  /// Throws Error (INVALID_ARGUMENT) naming `what`, the pattern and PCRE2's
  /// message for a pattern PCRE2 cannot compile.
  UnicodeRegex(const std::string &pattern, const std::string &what);
  ~UnicodeRegex();
  UnicodeRegex(const UnicodeRegex &) = delete;
  UnicodeRegex &operator=(const UnicodeRegex &) = delete;

  /// The byte ranges [first, second) of the successive leftmost matches in
  /// `text` (valid UTF-8), each search starting where the last match ended;
  /// empty matches are skipped.
  std::vector<std::pair<size_t, size_t>> findAll(std::string_view text) const;

private:
  struct Compiled;
  std::unique_ptr<Compiled> compiled_;
};

/// `pattern` with \s and \S spelled as the White_Space property.
std::string withWhiteSpaceProperty(const std::string &pattern);

} // namespace mtrt::data

#endif // MTRT_SRC_DATA_UNICODEREGEX_H
