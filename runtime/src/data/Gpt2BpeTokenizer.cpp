// Loading GPT-2's vocabulary and merges, and byte-level BPE encoding.
#include "data/Gpt2BpeTokenizer.h"

#include "core/Error.h"
#include "data/Gpt2PreTokenizer.h"

#include <nlohmann/json.hpp>
#include <unicode/utf8.h>

#include <cerrno>
#include <cstring>
#include <fstream>
#include <limits>
#include <sstream>

namespace mtrt::data {

namespace {

/// Cached chunks at most; the cache starts over when full.
constexpr size_t kCacheLimit = 1 << 18;
constexpr const char *kEndOfText = "<|endoftext|>";

bool printableByte(int b) {
  return (b >= 33 && b <= 126) || (b >= 161 && b <= 172) ||
         (b >= 174 && b <= 255);
}

/// Code point -> byte of GPT-2's mapping (-1: not a byte's character).
struct ByteDecoder {
  int16_t byteOf[256 + 68];
  ByteDecoder() {
    std::fill(std::begin(byteOf), std::end(byteOf), int16_t(-1));
    for (int b = 0; b < 256; ++b)
      byteOf[gpt2ByteToCodePoint(static_cast<uint8_t>(b))] =
          static_cast<int16_t>(b);
  }
};

/// A token string of the files back to its bytes; false if a character is
/// not one of GPT-2's byte characters.
bool tokenStringToBytes(const std::string &text, std::string &bytes) {
  static const ByteDecoder decoder;
  bytes.clear();
  const auto *data = reinterpret_cast<const uint8_t *>(text.data());
  auto length = static_cast<int32_t>(text.size());
  int32_t at = 0;
  while (at < length) {
    UChar32 c;
    U8_NEXT(data, at, length, c);
    if (c < 0 || c >= static_cast<UChar32>(std::size(decoder.byteOf)) ||
        decoder.byteOf[c] < 0)
      return false;
    bytes.push_back(static_cast<char>(decoder.byteOf[c]));
  }
  return true;
}

std::ifstream openFile(const std::string &path, const char *flag) {
  std::ifstream in(path, std::ios::binary);
  if (!in)
    throw Error(MTRT_STATUS_NOT_FOUND,
                std::string(flag) + ": cannot open '" + path + "' (" +
                    std::strerror(errno) +
                    "); tools/setup.sh fetches GPT-2's files into "
                    "build/gpt2 (encoder.json, vocab.bpe)");
  return in;
}

[[noreturn]] void malformed(const std::string &path, const std::string &what) {
  throw Error(MTRT_STATUS_DATA_LOSS, "'" + path + "': " + what);
}

std::shared_ptr<BpeModel> loadModel(const std::string &vocabFile,
                                    const std::string &mergeFile) {
  auto model = std::make_shared<BpeModel>();
  nlohmann::json vocab;
  {
    std::ifstream in = openFile(vocabFile, "--vocab-file");
    try {
      vocab = nlohmann::json::parse(in);
    } catch (const nlohmann::json::exception &e) {
      malformed(vocabFile, std::string("not JSON (") + e.what() +
                               "); expected GPT-2's encoder.json, an object "
                               "of token strings to ids");
    }
  }
  if (!vocab.is_object() || vocab.empty())
    malformed(vocabFile, "expected a JSON object of token strings to ids");
  size_t size = vocab.size();
  model->tokenBytes.assign(size, std::string());
  std::vector<bool> seen(size, false);
  std::unordered_map<std::string, int32_t> idOf;
  idOf.reserve(size);
  std::string bytes;
  for (auto &[key, value] : vocab.items()) {
    if (!value.is_number_integer() || value.get<int64_t>() < 0 ||
        value.get<int64_t>() >= static_cast<int64_t>(size))
      malformed(vocabFile, "token \"" + key + "\" has id " + value.dump() +
                               ", expected an integer in [0, " +
                               std::to_string(size) + ")");
    auto id = value.get<int32_t>();
    if (seen[id])
      malformed(vocabFile, "id " + std::to_string(id) +
                               " is given to two tokens, the second \"" +
                               key + "\"");
    seen[id] = true;
    if (!tokenStringToBytes(key, bytes))
      malformed(vocabFile, "token \"" + key +
                               "\" has a character that is not one of GPT-2's "
                               "byte characters");
    model->tokenBytes[id] = bytes;
    idOf.emplace(bytes, id);
  }
  for (int b = 0; b < 256; ++b) {
    auto it = idOf.find(std::string(1, static_cast<char>(b)));
    if (it == idOf.end())
      malformed(vocabFile, "byte " + std::to_string(b) +
                               " has no token; a byte-level vocabulary has "
                               "all 256");
    model->byteToken[b] = it->second;
  }
  auto eod = idOf.find(kEndOfText);
  if (eod == idOf.end())
    malformed(vocabFile, std::string("no ") + kEndOfText +
                             " token (GPT-2's end of document)");
  model->eod = eod->second;

  std::ifstream in = openFile(mergeFile, "--merge-file");
  std::string line;
  uint64_t rank = 0;
  size_t lineNumber = 0;
  std::string left, right;
  while (std::getline(in, line)) {
    ++lineNumber;
    if (!line.empty() && line.back() == '\r')
      line.pop_back();
    if (line.empty() || (lineNumber == 1 && line.rfind("#version", 0) == 0))
      continue;
    size_t space = line.find(' ');
    if (space == std::string::npos || space == 0 ||
        line.find(' ', space + 1) != std::string::npos ||
        space + 1 == line.size())
      malformed(mergeFile, "line " + std::to_string(lineNumber) +
                               ": expected two tokens separated by one "
                               "space, found \"" +
                               line + "\"");
    bool known = tokenStringToBytes(line.substr(0, space), left) &&
                 tokenStringToBytes(line.substr(space + 1), right);
    auto a = idOf.find(left), b = idOf.find(right),
         merged = idOf.find(left + right);
    if (!known || a == idOf.end() || b == idOf.end() || merged == idOf.end())
      malformed(mergeFile, "line " + std::to_string(lineNumber) + ": \"" +
                               line + "\" joins tokens that '" + vocabFile +
                               "' lacks (are the two files a pair?)");
    uint64_t key = (static_cast<uint64_t>(a->second) << 32) |
                   static_cast<uint32_t>(b->second);
    model->merges.emplace(key,
                          (rank << 32) | static_cast<uint32_t>(merged->second));
    ++rank;
  }
  if (in.bad())
    malformed(mergeFile, "reading failed");
  return model;
}

} // namespace

int32_t gpt2ByteToCodePoint(uint8_t byte) {
  if (printableByte(byte))
    return byte;
  // The unprintable bytes, in order, take U+0100 onwards.
  int32_t index = 0;
  for (int b = 0; b < byte; ++b)
    index += printableByte(b) ? 0 : 1;
  return 256 + index;
}

Gpt2BpeTokenizer::Gpt2BpeTokenizer(const std::string &vocabFile,
                                   const std::string &mergeFile)
    : model_(loadModel(vocabFile, mergeFile)) {}

std::unique_ptr<Tokenizer> Gpt2BpeTokenizer::clone() const {
  return std::unique_ptr<Tokenizer>(new Gpt2BpeTokenizer(model_));
}

void Gpt2BpeTokenizer::encodeChunk(std::string_view chunk,
                                   std::vector<int32_t> &out) {
  std::string key(chunk);
  auto cached = cache_.find(key);
  if (cached != cache_.end()) {
    out.insert(out.end(), cached->second.begin(), cached->second.end());
    return;
  }
  std::vector<int32_t> word;
  word.reserve(chunk.size());
  for (char c : chunk)
    word.push_back(model_->byteToken[static_cast<uint8_t>(c)]);
  auto pairKey = [](int32_t a, int32_t b) {
    return (static_cast<uint64_t>(a) << 32) | static_cast<uint32_t>(b);
  };
  while (word.size() > 1) {
    uint64_t best = std::numeric_limits<uint64_t>::max();
    for (size_t i = 0; i + 1 < word.size(); ++i) {
      auto merge = model_->merges.find(pairKey(word[i], word[i + 1]));
      if (merge != model_->merges.end())
        best = std::min(best, merge->second);
    }
    if (best == std::numeric_limits<uint64_t>::max())
      break;
    // Every occurrence of the best pair, left to right, without overlap.
    uint64_t bestRank = best >> 32;
    auto merged = static_cast<int32_t>(best & 0xffffffffu);
    std::vector<int32_t> next;
    next.reserve(word.size());
    for (size_t i = 0; i < word.size(); ++i) {
      if (i + 1 < word.size()) {
        auto merge = model_->merges.find(pairKey(word[i], word[i + 1]));
        if (merge != model_->merges.end() && (merge->second >> 32) == bestRank) {
          next.push_back(merged);
          ++i;
          continue;
        }
      }
      next.push_back(word[i]);
    }
    word.swap(next);
  }
  out.insert(out.end(), word.begin(), word.end());
  if (cache_.size() >= kCacheLimit)
    cache_.clear();
  cache_.emplace(std::move(key), std::move(word));
}

std::vector<int32_t> Gpt2BpeTokenizer::encode(std::string_view text) {
  std::vector<int32_t> tokens;
  for (std::string_view chunk : splitGpt2Chunks(text))
    encodeChunk(chunk, tokens);
  return tokens;
}

std::string Gpt2BpeTokenizer::decode(const std::vector<int32_t> &tokens) const {
  std::string text;
  for (int32_t token : tokens) {
    if (token >= 0 && token < vocabSize())
      text += model_->tokenBytes[token];
    else
      text += "\xEF\xBF\xBD";
  }
  return text;
}

} // namespace mtrt::data
