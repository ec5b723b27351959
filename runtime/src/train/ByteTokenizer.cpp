// Byte-level encoding and decoding, and escaping bytes for display.
#include "train/ByteTokenizer.h"

namespace mtrt::train {

std::vector<int32_t> ByteTokenizer::encode(std::string_view text) {
  std::vector<int32_t> tokens(text.size());
  for (size_t i = 0; i < text.size(); ++i)
    tokens[i] = static_cast<unsigned char>(text[i]);
  return tokens;
}

std::string ByteTokenizer::decode(const std::vector<int32_t> &tokens) {
  std::string text(tokens.size(), '?');
  for (size_t i = 0; i < tokens.size(); ++i)
    if (tokens[i] >= 0 && tokens[i] < kVocabSize)
      text[i] = static_cast<char>(tokens[i]);
  return text;
}

namespace {

/// The length of the well-formed UTF-8 sequence of 2 to 4 bytes at `i`
/// (no overlongs, surrogates or code points above U+10FFFF), or 0.
size_t utf8Length(std::string_view s, size_t i) {
  auto byte = [&](size_t k) { return static_cast<unsigned char>(s[k]); };
  unsigned char b0 = byte(i);
  size_t length = b0 >= 0xC2 && b0 <= 0xDF   ? 2
                  : b0 >= 0xE0 && b0 <= 0xEF ? 3
                  : b0 >= 0xF0 && b0 <= 0xF4 ? 4
                                             : 0;
  if (!length || i + length > s.size())
    return 0;
  for (size_t k = 1; k < length; ++k)
    if ((byte(i + k) & 0xC0) != 0x80)
      return 0;
  unsigned char b1 = byte(i + 1);
  if ((b0 == 0xE0 && b1 < 0xA0) || (b0 == 0xED && b1 > 0x9F) ||
      (b0 == 0xF0 && b1 < 0x90) || (b0 == 0xF4 && b1 > 0x8F))
    return 0;
  return length;
}

} // namespace

std::string escapeForDisplay(std::string_view bytes) {
  static const char digits[] = "0123456789abcdef";
  std::string out;
  out.reserve(bytes.size());
  for (size_t i = 0; i < bytes.size();) {
    unsigned char c = static_cast<unsigned char>(bytes[i]);
    if (c == '\\') {
      out += "\\\\";
    } else if (c == '\n' || c == '\t' || (c >= 0x20 && c < 0x7F)) {
      out.push_back(static_cast<char>(c));
    } else if (size_t length = utf8Length(bytes, i)) {
      out.append(bytes.substr(i, length));
      i += length;
      continue;
    } else {
      out += "\\x";
      out.push_back(digits[c >> 4]);
      out.push_back(digits[c & 15]);
    }
    ++i;
  }
  return out;
}

} // namespace mtrt::train
