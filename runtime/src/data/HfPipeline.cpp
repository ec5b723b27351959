// Reading and running a tokenizer.json's normalizer, pre-tokenizer,
// post-processor and decoder.
#include "data/HfPipeline.h"

#include "core/Error.h"
#include "data/Gpt2BpeTokenizer.h"

#include <nlohmann/json.hpp>
#include <unicode/normalizer2.h>
#include <unicode/unistr.h>
#include <unicode/utf8.h>

#include <cctype>
#include <cstdio>

namespace mtrt::data {

namespace {

using json = nlohmann::json;

/// GPT-2's pattern, which ByteLevel splits with when use_regex is true.
constexpr const char *kGpt2Pattern =
    R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)";
constexpr const char *kReplacementCharacter = "\xEF\xBF\xBD";

/// Reading one object of the file, with its path for the messages.
struct Reader {
  const std::string &file;

  [[noreturn]] void malformed(const std::string &where,
                              const std::string &what) const {
    throw Error(MTRT_STATUS_DATA_LOSS, "'" + file + "': " + where + " " + what);
  }
  [[noreturn]] void unimplemented(const std::string &where,
                                  const json &value) const {
    throw Error(MTRT_STATUS_UNIMPLEMENTED,
                "'" + file + "': " + where + " is " + value.dump() +
                    ", which HuggingFaceTokenizer does not implement: it "
                    "would tokenize differently from the tokenizers library "
                    "(docs/Tokenizers.md lists what it reads)");
  }
  const json &field(const json &object, const std::string &where,
                    const char *key) const {
    auto it = object.find(key);
    if (it == object.end())
      malformed(where, std::string("has no \"") + key + "\"");
    return *it;
  }
  std::string string(const json &object, const std::string &where,
                     const char *key) const {
    const json &value = field(object, where, key);
    if (!value.is_string())
      malformed(where + "." + key,
                "is " + value.dump() + ", expected a string");
    return value.get<std::string>();
  }
  bool boolean(const json &object, const std::string &where, const char *key,
               bool absent) const {
    auto it = object.find(key);
    if (it == object.end() || it->is_null())
      return absent;
    if (!it->is_boolean())
      malformed(where + "." + key, "is " + it->dump() + ", expected a boolean");
    return it->get<bool>();
  }
  /// Refuses `key` unless it is absent, null or `expected`.
  void require(const json &object, const std::string &where, const char *key,
               const json &expected) const {
    auto it = object.find(key);
    if (it != object.end() && !it->is_null() && *it != expected)
      unimplemented(where + "." + key, *it);
  }
  std::string type(const json &object, const std::string &where) const {
    if (!object.is_object())
      malformed(where, "is " + object.dump() + ", expected an object");
    return string(object, where, "type");
  }
  /// A {"String": s} pattern; a {"Regex": r} one only where `regex` is given.
  std::string pattern(const json &object, const std::string &where,
                      bool *isRegex) const {
    const json &value = field(object, where, "pattern");
    if (value.is_object() && value.size() == 1 && value.contains("String") &&
        value["String"].is_string())
      return value["String"].get<std::string>();
    if (isRegex && value.is_object() && value.size() == 1 &&
        value.contains("Regex") && value["Regex"].is_string()) {
      *isRegex = true;
      return value["Regex"].get<std::string>();
    }
    unimplemented(where + ".pattern", value);
  }
};

enum class Prepend { Always, First, Never };

Prepend prependScheme(const Reader &r, const json &object,
                      const std::string &where) {
  auto scheme = object.find("prepend_scheme");
  if (scheme != object.end() && !scheme->is_null()) {
    if (*scheme == "always")
      return Prepend::Always;
    if (*scheme == "first")
      return Prepend::First;
    if (*scheme == "never")
      return Prepend::Never;
    r.unimplemented(where + ".prepend_scheme", *scheme);
  }
  // Files before tokenizers 0.14 say add_prefix_space instead.
  return r.boolean(object, where, "add_prefix_space", true) ? Prepend::Always
                                                            : Prepend::Never;
}

std::string replaceAll(const std::string &text, const std::string &from,
                       const std::string &to) {
  if (from.empty())
    return text;
  std::string out;
  size_t at = 0;
  for (size_t hit; (hit = text.find(from, at)) != std::string::npos;
       at = hit + from.size())
    out.append(text, at, hit - at).append(to);
  return out.append(text, at, std::string::npos);
}

/// GPT-2's printable characters back to bytes.
int byteOfCodePoint(UChar32 c) {
  static const std::vector<int16_t> table = [] {
    std::vector<int16_t> t(256 + 68, -1);
    for (int b = 0; b < 256; ++b)
      t[gpt2ByteToCodePoint(static_cast<uint8_t>(b))] = static_cast<int16_t>(b);
    return t;
  }();
  return c >= 0 && c < static_cast<UChar32>(table.size()) ? table[c] : -1;
}

std::string codePointToUtf8(UChar32 c) {
  char buffer[4];
  int32_t length = 0;
  U8_APPEND_UNSAFE(reinterpret_cast<uint8_t *>(buffer), length, c);
  return std::string(buffer, static_cast<size_t>(length));
}

const std::vector<std::string> &byteStrings() {
  static const std::vector<std::string> strings = [] {
    std::vector<std::string> s(256);
    for (int b = 0; b < 256; ++b)
      s[b] = codePointToUtf8(gpt2ByteToCodePoint(static_cast<uint8_t>(b)));
    return s;
  }();
  return strings;
}

} // namespace

std::string lossyUtf8(const std::string &bytes) {
  std::string out;
  out.reserve(bytes.size());
  const auto *data = reinterpret_cast<const uint8_t *>(bytes.data());
  auto length = static_cast<int32_t>(bytes.size());
  for (int32_t at = 0; at < length;) {
    int32_t start = at;
    UChar32 c;
    U8_NEXT(data, at, length, c);
    if (c < 0)
      out += kReplacementCharacter;
    else
      out.append(bytes, static_cast<size_t>(start),
                 static_cast<size_t>(at - start));
  }
  return out;
}

struct HfPipeline::Step {
  enum class Kind {
    // Normalizers.
    Normalize,
    Prepend,
    Replace,
    // Pre-tokenizers.
    Split,
    ByteLevel,
    Metaspace,
    // Decoders (with Replace and ByteLevel, Metaspace above).
    ByteFallback,
    Fuse,
    Strip,
  } kind = Kind::Fuse;
  const icu::Normalizer2 *normalizer = nullptr;
  std::string text, replacement;
  std::shared_ptr<UnicodeRegex> regex;
  bool addPrefixSpace = false, split = false;
  Prepend prepend = Prepend::Always;
  int64_t start = 0, stop = 0;
};

namespace {

using Step = HfPipeline::Step;
using Kind = Step::Kind;

void readNormalizer(const Reader &r, const json &object,
                    const std::string &where, std::vector<Step> &out) {
  std::string type = r.type(object, where);
  Step step;
  step.kind = Kind::Normalize;
  UErrorCode status = U_ZERO_ERROR;
  if (type == "Sequence") {
    const json &list = r.field(object, where, "normalizers");
    for (size_t i = 0; i < list.size(); ++i)
      readNormalizer(r, list[i],
                     where + ".normalizers[" + std::to_string(i) + "]", out);
    return;
  }
  if (type == "NFC")
    step.normalizer = icu::Normalizer2::getNFCInstance(status);
  else if (type == "NFD")
    step.normalizer = icu::Normalizer2::getNFDInstance(status);
  else if (type == "NFKC")
    step.normalizer = icu::Normalizer2::getNFKCInstance(status);
  else if (type == "NFKD")
    step.normalizer = icu::Normalizer2::getNFKDInstance(status);
  else if (type == "Prepend") {
    step.kind = Kind::Prepend;
    step.text = r.string(object, where, "prepend");
  } else if (type == "Replace") {
    step.kind = Kind::Replace;
    step.text = r.pattern(object, where, nullptr);
    step.replacement = r.string(object, where, "content");
  } else {
    r.unimplemented(where + ".type", type);
  }
  if (U_FAILURE(status))
    throw Error(MTRT_STATUS_INTERNAL,
                std::string("ICU has no ") + type +
                    " normalizer: " + u_errorName(status));
  out.push_back(std::move(step));
}

void readPreTokenizer(const Reader &r, const json &object,
                      const std::string &where, std::vector<Step> &out) {
  std::string type = r.type(object, where);
  if (type == "Sequence") {
    const json &list = r.field(object, where, "pretokenizers");
    for (size_t i = 0; i < list.size(); ++i)
      readPreTokenizer(
          r, list[i], where + ".pretokenizers[" + std::to_string(i) + "]", out);
    return;
  }
  if (type == "Split") {
    Step step;
    step.kind = Kind::Split;
    bool isRegex = false;
    step.text = r.pattern(object, where, &isRegex);
    if (isRegex)
      step.regex = std::make_shared<UnicodeRegex>(
          step.text, "'" + r.file + "': " + where + ".pattern");
    if (r.string(object, where, "behavior") != "Isolated")
      r.unimplemented(where + ".behavior", object["behavior"]);
    r.require(object, where, "invert", false);
    out.push_back(std::move(step));
    return;
  }
  if (type == "ByteLevel") {
    Step step;
    step.kind = Kind::ByteLevel;
    step.addPrefixSpace = r.boolean(object, where, "add_prefix_space", false);
    if (r.boolean(object, where, "use_regex", true))
      step.regex =
          std::make_shared<UnicodeRegex>(kGpt2Pattern, "ByteLevel's pattern");
    out.push_back(std::move(step));
    return;
  }
  if (type == "Metaspace") {
    Step step;
    step.kind = Kind::Metaspace;
    step.replacement = r.string(object, where, "replacement");
    step.prepend = prependScheme(r, object, where);
    step.split = r.boolean(object, where, "split", true);
    out.push_back(std::move(step));
    return;
  }
  r.unimplemented(where + ".type", type);
}

void readDecoder(const Reader &r, const json &object, const std::string &where,
                 std::vector<Step> &out) {
  std::string type = r.type(object, where);
  if (type == "Sequence") {
    const json &list = r.field(object, where, "decoders");
    for (size_t i = 0; i < list.size(); ++i)
      readDecoder(r, list[i], where + ".decoders[" + std::to_string(i) + "]",
                  out);
    return;
  }
  Step step;
  step.kind = Kind::Fuse;
  if (type == "ByteLevel") {
    step.kind = Kind::ByteLevel;
  } else if (type == "Metaspace") {
    step.kind = Kind::Metaspace;
    step.replacement = r.string(object, where, "replacement");
    step.prepend = prependScheme(r, object, where);
  } else if (type == "Replace") {
    step.kind = Kind::Replace;
    step.text = r.pattern(object, where, nullptr);
    step.replacement = r.string(object, where, "content");
  } else if (type == "ByteFallback") {
    step.kind = Kind::ByteFallback;
  } else if (type == "Fuse") {
    step.kind = Kind::Fuse;
  } else if (type == "Strip") {
    step.kind = Kind::Strip;
    step.text = r.string(object, where, "content");
    const json &start = r.field(object, where, "start");
    const json &stop = r.field(object, where, "stop");
    if (!start.is_number_unsigned() || !stop.is_number_unsigned())
      r.malformed(where, "start and stop must be non-negative integers");
    step.start = start.get<int64_t>();
    step.stop = stop.get<int64_t>();
  } else {
    r.unimplemented(where + ".type", type);
  }
  out.push_back(std::move(step));
}

/// The ids of the special token `name` of a TemplateProcessing.
std::vector<int32_t> templateIds(const Reader &r, const json &object,
                                 const std::string &where,
                                 const std::string &name) {
  const json &specials = r.field(object, where, "special_tokens");
  auto it = specials.find(name);
  if (it == specials.end() || !it->is_object() || !it->contains("ids") ||
      !(*it)["ids"].is_array())
    r.malformed(where + ".special_tokens",
                "has no ids for \"" + name + "\", which .single names");
  std::vector<int32_t> ids;
  for (const json &id : (*it)["ids"]) {
    if (!id.is_number_unsigned())
      r.malformed(where + ".special_tokens[\"" + name + "\"].ids",
                  "holds " + id.dump() + ", expected token ids");
    ids.push_back(id.get<int32_t>());
  }
  return ids;
}

void readPostProcessor(const Reader &r, const json &object,
                       const std::string &where, std::vector<int32_t> &prefix,
                       std::vector<int32_t> &suffix) {
  std::string type = r.type(object, where);
  if (type == "Sequence") {
    const json &list = r.field(object, where, "processors");
    for (size_t i = 0; i < list.size(); ++i)
      readPostProcessor(r, list[i],
                        where + ".processors[" + std::to_string(i) + "]",
                        prefix, suffix);
    return;
  }
  // ByteLevel as a post-processor trims offsets; the ids stay.
  if (type == "ByteLevel")
    return;
  if (type != "TemplateProcessing")
    r.unimplemented(where + ".type", type);
  if (!prefix.empty() || !suffix.empty())
    r.unimplemented(where, object);
  const json &single = r.field(object, where, "single");
  bool seenA = false;
  for (size_t i = 0; i < single.size(); ++i) {
    const json &item = single[i];
    std::string at = where + ".single[" + std::to_string(i) + "]";
    if (item.contains("Sequence")) {
      if (seenA || r.string(item["Sequence"], at + ".Sequence", "id") != "A")
        r.unimplemented(at, item);
      seenA = true;
    } else if (item.contains("SpecialToken")) {
      std::vector<int32_t> ids = templateIds(
          r, object, where,
          r.string(item["SpecialToken"], at + ".SpecialToken", "id"));
      (seenA ? suffix : prefix)
          .insert((seenA ? suffix : prefix).end(), ids.begin(), ids.end());
    } else {
      r.unimplemented(at, item);
    }
  }
  if (!seenA)
    r.malformed(where + ".single", "has no {\"Sequence\": {\"id\": \"A\"}}");
}

/// Splits `piece` at the byte offsets `cuts` (ascending, inside it),
/// dropping empty parts; only the first part keeps atOrigin.
void cut(HfPiece piece, const std::vector<size_t> &cuts,
         std::vector<HfPiece> &out) {
  size_t from = 0;
  bool origin = piece.atOrigin;
  for (size_t i = 0; i <= cuts.size(); ++i) {
    size_t to = i < cuts.size() ? cuts[i] : piece.text.size();
    if (to > from) {
      out.push_back(HfPiece{piece.text.substr(from, to - from), origin});
      origin = false;
    }
    from = to;
  }
}

/// Isolated splitting: each match and each gap between matches is a piece.
void splitIsolated(const Step &step, HfPiece piece, std::vector<HfPiece> &out) {
  std::vector<size_t> cuts;
  if (step.regex) {
    for (auto [begin, end] : step.regex->findAll(piece.text)) {
      cuts.push_back(begin);
      cuts.push_back(end);
    }
  } else if (!step.text.empty()) {
    for (size_t hit = piece.text.find(step.text); hit != std::string::npos;
         hit = piece.text.find(step.text, hit + step.text.size())) {
      cuts.push_back(hit);
      cuts.push_back(hit + step.text.size());
    }
  }
  cut(std::move(piece), cuts, out);
}

void applyPreTokenizer(const Step &step, HfPiece piece,
                       std::vector<HfPiece> &out) {
  switch (step.kind) {
  case Kind::Split:
    splitIsolated(step, std::move(piece), out);
    return;
  case Kind::ByteLevel: {
    if (step.addPrefixSpace && piece.text.rfind(' ', 0) != 0)
      piece.text.insert(0, " ");
    std::vector<HfPiece> parts;
    if (step.regex)
      splitIsolated(step, std::move(piece), parts);
    else
      parts.push_back(std::move(piece));
    const std::vector<std::string> &strings = byteStrings();
    for (HfPiece &part : parts) {
      std::string mapped;
      mapped.reserve(part.text.size() * 2);
      for (char c : part.text)
        mapped += strings[static_cast<uint8_t>(c)];
      out.push_back(HfPiece{std::move(mapped), part.atOrigin});
    }
    return;
  }
  case Kind::Metaspace: {
    piece.text = replaceAll(piece.text, " ", step.replacement);
    bool prepend = step.prepend == Prepend::Always ||
                   (step.prepend == Prepend::First && piece.atOrigin);
    if (prepend && piece.text.rfind(step.replacement, 0) != 0)
      piece.text.insert(0, step.replacement);
    std::vector<size_t> cuts;
    if (step.split && !step.replacement.empty())
      for (size_t hit = piece.text.find(step.replacement, 1);
           hit != std::string::npos;
           hit = piece.text.find(step.replacement, hit + 1))
        cuts.push_back(hit);
    cut(std::move(piece), cuts, out);
    return;
  }
  default:
    return;
  }
}

} // namespace

HfPipeline::HfPipeline(const json &root, const std::string &file) {
  Reader r{file};
  auto present = [&](const char *key) {
    auto it = root.find(key);
    return it != root.end() && !it->is_null() ? &*it : nullptr;
  };
  // Truncation and padding change what encode returns.
  for (const char *key : {"truncation", "padding"})
    if (const json *value = present(key))
      r.unimplemented(key, *value);
  if (const json *normalizer = present("normalizer"))
    readNormalizer(r, *normalizer, "normalizer", normalizers_);
  if (const json *preTokenizer = present("pre_tokenizer"))
    readPreTokenizer(r, *preTokenizer, "pre_tokenizer", preTokenizers_);
  if (const json *postProcessor = present("post_processor"))
    readPostProcessor(r, *postProcessor, "post_processor", prefix_, suffix_);
  if (const json *decoder = present("decoder")) {
    readDecoder(r, *decoder, "decoder", decoders_);
    hasDecoder_ = true;
  }
}

HfPipeline::~HfPipeline() = default;

void HfPipeline::normalize(std::string &text) const {
  for (const Step &step : normalizers_) {
    if (text.empty())
      return;
    switch (step.kind) {
    case Kind::Normalize: {
      UErrorCode status = U_ZERO_ERROR;
      icu::UnicodeString normalized = step.normalizer->normalize(
          icu::UnicodeString::fromUTF8(text), status);
      if (U_FAILURE(status))
        throw Error(MTRT_STATUS_INTERNAL,
                    std::string("Unicode normalization failed: ") +
                        u_errorName(status));
      text.clear();
      normalized.toUTF8String(text);
      break;
    }
    case Kind::Prepend:
      text.insert(0, step.text);
      break;
    case Kind::Replace:
      text = replaceAll(text, step.text, step.replacement);
      break;
    default:
      break;
    }
  }
}

void HfPipeline::preTokenize(HfPiece piece, std::vector<HfPiece> &out) const {
  std::vector<HfPiece> pieces;
  pieces.push_back(std::move(piece));
  for (const Step &step : preTokenizers_) {
    std::vector<HfPiece> next;
    for (HfPiece &p : pieces)
      applyPreTokenizer(step, std::move(p), next);
    pieces.swap(next);
  }
  for (HfPiece &p : pieces)
    if (!p.text.empty())
      out.push_back(std::move(p));
}

std::string HfPipeline::decode(std::vector<std::string> tokens) const {
  if (!hasDecoder_) {
    std::string text;
    for (size_t i = 0; i < tokens.size(); ++i)
      text += (i ? " " : "") + tokens[i];
    return text;
  }
  for (const Step &step : decoders_) {
    std::vector<std::string> next;
    switch (step.kind) {
    case Kind::ByteLevel: {
      std::string bytes;
      for (const std::string &token : tokens) {
        std::string mapped;
        const auto *data = reinterpret_cast<const uint8_t *>(token.data());
        auto length = static_cast<int32_t>(token.size());
        bool all = true;
        for (int32_t at = 0; at < length && all;) {
          UChar32 c;
          U8_NEXT(data, at, length, c);
          int b = byteOfCodePoint(c);
          all = b >= 0;
          mapped += static_cast<char>(b);
        }
        bytes += all ? mapped : token;
      }
      next.push_back(lossyUtf8(bytes));
      break;
    }
    case Kind::Metaspace:
      for (size_t i = 0; i < tokens.size(); ++i)
        next.push_back(
            replaceAll(tokens[i], step.replacement,
                       i == 0 && step.prepend != Prepend::Never ? "" : " "));
      break;
    case Kind::Replace:
      for (const std::string &token : tokens)
        next.push_back(replaceAll(token, step.text, step.replacement));
      break;
    case Kind::ByteFallback: {
      std::string pending;
      size_t pendingCount = 0;
      auto flush = [&] {
        if (!pendingCount)
          return;
        std::string valid = lossyUtf8(pending);
        if (valid == pending)
          next.push_back(pending);
        else
          for (size_t i = 0; i < pendingCount; ++i)
            next.push_back(kReplacementCharacter);
        pending.clear();
        pendingCount = 0;
      };
      for (const std::string &token : tokens) {
        unsigned value = 0;
        bool isByte = token.size() == 6 && token.rfind("<0x", 0) == 0 &&
                      token[5] == '>' &&
                      std::isxdigit(static_cast<unsigned char>(token[3])) &&
                      std::isxdigit(static_cast<unsigned char>(token[4])) &&
                      std::sscanf(token.c_str() + 3, "%2x", &value) == 1;
        if (isByte) {
          pending += static_cast<char>(value);
          ++pendingCount;
          continue;
        }
        flush();
        next.push_back(token);
      }
      flush();
      break;
    }
    case Kind::Fuse: {
      std::string all;
      for (const std::string &token : tokens)
        all += token;
      next.push_back(std::move(all));
      break;
    }
    case Kind::Strip:
      for (std::string token : tokens) {
        for (int64_t i = 0; i < step.start && !step.text.empty() &&
                            token.rfind(step.text, 0) == 0;
             ++i)
          token.erase(0, step.text.size());
        for (int64_t i = 0; i < step.stop && !step.text.empty() &&
                            token.size() >= step.text.size() &&
                            token.compare(token.size() - step.text.size(),
                                          step.text.size(), step.text) == 0;
             ++i)
          token.erase(token.size() - step.text.size());
        next.push_back(std::move(token));
      }
      break;
    default:
      next = tokens;
      break;
    }
    tokens.swap(next);
  }
  std::string text;
  for (const std::string &token : tokens)
    text += token;
  return text;
}

} // namespace mtrt::data
