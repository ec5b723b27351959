// GPT-2's pre-tokenizer pattern as a hand-written scanner over code points,
// with ICU's Unicode character properties.
#include "data/Gpt2PreTokenizer.h"

#include "core/Error.h"

#include <unicode/uchar.h>
#include <unicode/utf8.h>

#include <string>

namespace mtrt::data {

namespace {

enum class CharClass : uint8_t { Letter, Number, Space, Other };

CharClass classify(UChar32 c) {
  if (u_isUWhiteSpace(c))
    return CharClass::Space;
  switch (u_charType(c)) {
  case U_UPPERCASE_LETTER:
  case U_LOWERCASE_LETTER:
  case U_TITLECASE_LETTER:
  case U_MODIFIER_LETTER:
  case U_OTHER_LETTER:
    return CharClass::Letter;
  case U_DECIMAL_DIGIT_NUMBER:
  case U_LETTER_NUMBER:
  case U_OTHER_NUMBER:
    return CharClass::Number;
  default:
    return CharClass::Other;
  }
}

/// The text as code points: each one's class and its byte offset.
struct CodePoints {
  std::vector<CharClass> classes;
  std::vector<size_t> offsets; // one more than classes: the end
  std::vector<UChar32> values;
};

CodePoints decode(std::string_view text) {
  CodePoints points;
  auto length = static_cast<int32_t>(text.size());
  if (text.size() > static_cast<size_t>(INT32_MAX))
    throw Error(MTRT_STATUS_INVALID_ARGUMENT,
                "a text of " + std::to_string(text.size()) +
                    " bytes is too long to tokenize at once (at most 2^31 - 1 "
                    "bytes); split it into documents");
  const auto *bytes = reinterpret_cast<const uint8_t *>(text.data());
  int32_t at = 0;
  while (at < length) {
    int32_t start = at;
    UChar32 c;
    U8_NEXT(bytes, at, length, c);
    if (c < 0)
      throw Error(MTRT_STATUS_INVALID_ARGUMENT,
                  "invalid UTF-8 at byte " + std::to_string(start) +
                      " of the text; GPT-2's tokenizer reads UTF-8 text "
                      "(convert the file, e.g. with iconv)");
    points.offsets.push_back(static_cast<size_t>(start));
    points.classes.push_back(classify(c));
    points.values.push_back(c);
  }
  points.offsets.push_back(text.size());
  return points;
}

const char *const kContractions[] = {"s", "t", "re", "ve", "m", "ll", "d"};

/// The length in code points of the chunk starting at `i`.
size_t chunkLength(const CodePoints &p, size_t i) {
  size_t n = p.classes.size();
  auto is = [&](size_t j, CharClass c) {
    return j < n && p.classes[j] == c;
  };
  auto runOf = [&](size_t j, CharClass c) {
    size_t k = j;
    while (is(k, c))
      ++k;
    return k - j;
  };
  if (p.values[i] == '\'') {
    for (const char *suffix : kContractions) {
      size_t k = 0;
      while (suffix[k] && i + 1 + k < n &&
             p.values[i + 1 + k] == static_cast<UChar32>(suffix[k]))
        ++k;
      if (!suffix[k])
        return 1 + k;
    }
  }
  for (CharClass c : {CharClass::Letter, CharClass::Number, CharClass::Other}) {
    if (p.values[i] == ' ' && is(i + 1, c))
      return 1 + runOf(i + 1, c);
    if (is(i, c))
      return runOf(i, c);
  }
  // White space: the whole run at the end or before more white space,
  // otherwise all but its last character, but at least one.
  size_t run = runOf(i, CharClass::Space);
  if (i + run == n || run == 1)
    return run;
  return run - 1;
}

} // namespace

std::vector<std::string_view> splitGpt2Chunks(std::string_view text) {
  CodePoints points = decode(text);
  std::vector<std::string_view> chunks;
  size_t i = 0, n = points.classes.size();
  while (i < n) {
    size_t length = chunkLength(points, i);
    size_t begin = points.offsets[i], end = points.offsets[i + length];
    chunks.push_back(text.substr(begin, end - begin));
    i += length;
  }
  return chunks;
}

} // namespace mtrt::data
