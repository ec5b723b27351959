// Compiling and matching tokenizer.json's patterns with PCRE2.
#include "data/UnicodeRegex.h"

#include "core/Error.h"

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>

namespace mtrt::data {

struct UnicodeRegex::Compiled {
  pcre2_code *code = nullptr;
  ~Compiled() { pcre2_code_free(code); }
};

std::string withWhiteSpaceProperty(const std::string &pattern) {
  std::string out;
  out.reserve(pattern.size() + 32);
  for (size_t i = 0; i < pattern.size(); ++i) {
    if (pattern[i] != '\\' || i + 1 == pattern.size()) {
      out += pattern[i];
      continue;
    }
    char next = pattern[++i];
    if (next == 's')
      out += "\\p{White_Space}";
    else if (next == 'S')
      out += "\\P{White_Space}";
    else {
      out += '\\';
      out += next;
    }
  }
  return out;
}

UnicodeRegex::UnicodeRegex(const std::string &pattern, const std::string &what)
    : compiled_(std::make_unique<Compiled>()) {
  std::string translated = withWhiteSpaceProperty(pattern);
  int error = 0;
  PCRE2_SIZE offset = 0;
  compiled_->code = pcre2_compile(
      reinterpret_cast<PCRE2_SPTR>(translated.data()), translated.size(),
      PCRE2_UTF | PCRE2_UCP, &error, &offset, nullptr);
  if (!compiled_->code) {
    PCRE2_UCHAR message[256];
    pcre2_get_error_message(error, message, sizeof(message));
    throw Error(MTRT_STATUS_INVALID_ARGUMENT,
                what + ": the pattern \"" + pattern +
                    "\" does not compile as a Unicode regular expression (" +
                    reinterpret_cast<const char *>(message) + ")");
  }
  // The JIT is an optimization only: without it PCRE2 interprets.
  pcre2_jit_compile(compiled_->code, PCRE2_JIT_COMPLETE);
}

UnicodeRegex::~UnicodeRegex() = default;

std::vector<std::pair<size_t, size_t>>
UnicodeRegex::findAll(std::string_view text) const {
  std::vector<std::pair<size_t, size_t>> matches;
  pcre2_match_data *data =
      pcre2_match_data_create_from_pattern(compiled_->code, nullptr);
  if (!data)
    throw Error(MTRT_STATUS_RESOURCE_EXHAUSTED,
                "out of memory for a regular expression's match");
  auto subject = reinterpret_cast<PCRE2_SPTR>(text.data());
  size_t at = 0;
  while (at < text.size()) {
    // The callers validate the UTF-8 once, before splitting.
    int rc = pcre2_match(compiled_->code, subject, text.size(), at,
                         PCRE2_NO_UTF_CHECK, data, nullptr);
    if (rc == PCRE2_ERROR_NOMATCH)
      break;
    if (rc < 0) {
      pcre2_match_data_free(data);
      PCRE2_UCHAR message[256];
      pcre2_get_error_message(rc, message, sizeof(message));
      throw Error(MTRT_STATUS_INTERNAL,
                  std::string("regular expression match failed: ") +
                      reinterpret_cast<const char *>(message));
    }
    PCRE2_SIZE *ovector = pcre2_get_ovector_pointer(data);
    size_t begin = ovector[0], end = ovector[1];
    if (end > begin) {
      matches.emplace_back(begin, end);
      at = end;
      continue;
    }
    // An empty match: go on from the next code point.
    at = begin + 1;
    while (at < text.size() && (static_cast<uint8_t>(text[at]) & 0xC0) == 0x80)
      ++at;
  }
  pcre2_match_data_free(data);
  return matches;
}

} // namespace mtrt::data
