// Loading a Hugging Face tokenizer directory; the added tokens and the order
// of the steps around the BPE model.
#include "data/HuggingFaceTokenizer.h"

#include "core/Error.h"
#include "data/HfBpeModel.h"
#include "data/HfPipeline.h"

#include <nlohmann/json.hpp>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>

namespace mtrt::data {

namespace {

using json = nlohmann::json;

struct AddedToken {
  std::string content;
  int32_t id;
};

json readJson(const std::string &path, const std::string &what) {
  std::ifstream in(path, std::ios::binary);
  if (!in)
    throw Error(MTRT_STATUS_NOT_FOUND, "--tokenizer-model: cannot open '" +
                                           path + "' (" + std::strerror(errno) +
                                           "); " + what);
  try {
    return json::parse(in);
  } catch (const json::exception &e) {
    throw Error(MTRT_STATUS_DATA_LOSS,
                "'" + path + "': not JSON (" + std::string(e.what()) + ")");
  }
}

/// Splits `piece` at the leftmost-longest occurrences of `tokens`: the
/// stretches between them go to `text` (with their atOrigin), the matches to
/// `ids` in order, as -1 / id entries of `order`.
struct Segment {
  HfPiece piece;
  int32_t id = -1; // an added token's id, or -1 for text
};

void splitAdded(HfPiece piece, const std::vector<AddedToken> &tokens,
                std::vector<Segment> &out) {
  const std::string &text = piece.text;
  size_t from = 0;
  bool origin = piece.atOrigin;
  auto emitText = [&](size_t to) {
    if (to > from)
      out.push_back(Segment{HfPiece{text.substr(from, to - from), origin}, -1});
    origin = false;
  };
  for (size_t at = 0; at < text.size();) {
    const AddedToken *best = nullptr;
    for (const AddedToken &token : tokens)
      if ((!best || token.content.size() > best->content.size()) &&
          text.compare(at, token.content.size(), token.content) == 0)
        best = &token;
    if (!best) {
      ++at;
      continue;
    }
    emitText(at);
    out.push_back(Segment{HfPiece{best->content, false}, best->id});
    at += best->content.size();
    from = at;
  }
  emitText(text.size());
}

} // namespace

struct HuggingFaceTokenizer::Files {
  std::string file;
  std::unique_ptr<HfBpeModel> model;
  std::unique_ptr<HfPipeline> pipeline;
  /// Added tokens matched in the raw text, and in the normalized text.
  std::vector<AddedToken> raw, normalized;
  std::vector<std::string> tokenOf; // every id's token string
  int32_t eod = -1;
};

HuggingFaceTokenizer::HuggingFaceTokenizer(const std::string &directory) {
  namespace fs = std::filesystem;
  auto files = std::make_shared<Files>();
  fs::path dir(directory);
  if (fs::is_regular_file(dir) && dir.filename() == "tokenizer.json")
    dir = dir.parent_path();
  files->file = (dir / "tokenizer.json").string();
  json root =
      readJson(files->file, "--tokenizer-model names a Hugging Face model "
                            "directory with tokenizer.json and "
                            "tokenizer_config.json");
  if (!root.is_object())
    throw Error(MTRT_STATUS_DATA_LOSS,
                "'" + files->file + "': expected a JSON object");
  const std::string &file = files->file;
  auto model = root.find("model");
  if (model == root.end())
    throw Error(MTRT_STATUS_DATA_LOSS, "'" + file + "': no \"model\"");
  files->model = std::make_unique<HfBpeModel>(*model, file);
  files->pipeline = std::make_unique<HfPipeline>(root, file);
  files->tokenOf = files->model->tokens();

  auto added = root.find("added_tokens");
  if (added != root.end() && !added->is_null()) {
    if (!added->is_array())
      throw Error(MTRT_STATUS_DATA_LOSS,
                  "'" + file + "': added_tokens is not an array");
    for (size_t i = 0; i < added->size(); ++i) {
      const json &token = (*added)[i];
      std::string where = "added_tokens[" + std::to_string(i) + "]";
      if (!token.is_object() || !token.contains("content") ||
          !token["content"].is_string() || !token.contains("id") ||
          !token["id"].is_number_unsigned() ||
          token["content"].get_ref<const std::string &>().empty())
        throw Error(MTRT_STATUS_DATA_LOSS,
                    "'" + file + "': " + where + " is " + token.dump() +
                        ", expected {\"id\": N, \"content\": \"...\", ...}");
      for (const char *flag : {"single_word", "lstrip", "rstrip"})
        if (token.value(flag, false))
          throw Error(MTRT_STATUS_UNIMPLEMENTED,
                      "'" + file + "': " + where + "." + flag +
                          " is true, which HuggingFaceTokenizer does not "
                          "implement: it would tokenize differently from "
                          "the tokenizers library (docs/Tokenizers.md)");
      AddedToken entry{token["content"].get<std::string>(),
                       token["id"].get<int32_t>()};
      if (static_cast<size_t>(entry.id) >= files->tokenOf.size())
        files->tokenOf.resize(static_cast<size_t>(entry.id) + 1);
      files->tokenOf[entry.id] = entry.content;
      (token.value("normalized", !token.value("special", false))
           ? files->normalized
           : files->raw)
          .push_back(std::move(entry));
    }
  }

  std::string configFile = (dir / "tokenizer_config.json").string();
  json config = readJson(configFile,
                         "its eos_token is the end of document (Megatron-LM's "
                         "eod, --append-eod); copy the model's "
                         "tokenizer_config.json next to tokenizer.json");
  json eos = config.is_object() ? config.value("eos_token", json()) : json();
  if (eos.is_object())
    eos = eos.value("content", json());
  if (!eos.is_string())
    throw Error(MTRT_STATUS_DATA_LOSS,
                "'" + configFile + "': eos_token is " + eos.dump() +
                    ", expected the end-of-document token's string");
  std::string eosText = eos.get<std::string>();
  for (size_t id = 0; id < files->tokenOf.size(); ++id)
    if (files->tokenOf[id] == eosText) {
      files->eod = static_cast<int32_t>(id);
      break;
    }
  if (files->eod < 0)
    throw Error(MTRT_STATUS_DATA_LOSS, "'" + configFile + "': eos_token \"" +
                                           eosText + "\" is not a token of '" +
                                           file + "'");
  files_ = std::move(files);
}

std::unique_ptr<Tokenizer> HuggingFaceTokenizer::clone() const {
  return std::unique_ptr<Tokenizer>(new HuggingFaceTokenizer(files_));
}

int64_t HuggingFaceTokenizer::vocabSize() const {
  return static_cast<int64_t>(files_->tokenOf.size());
}

int32_t HuggingFaceTokenizer::eod() const { return files_->eod; }

std::vector<int32_t> HuggingFaceTokenizer::encode(std::string_view text) {
  requireUtf8(text, "HuggingFaceTokenizer");
  const Files &f = *files_;
  std::vector<int32_t> ids(f.pipeline->prefix());
  std::vector<Segment> raw, normalized;
  splitAdded(HfPiece{std::string(text), true}, f.raw, raw);
  std::vector<HfPiece> pieces;
  for (Segment &segment : raw) {
    if (segment.id >= 0) {
      ids.push_back(segment.id);
      continue;
    }
    f.pipeline->normalize(segment.piece.text);
    normalized.clear();
    splitAdded(std::move(segment.piece), f.normalized, normalized);
    for (Segment &part : normalized) {
      if (part.id >= 0) {
        ids.push_back(part.id);
        continue;
      }
      pieces.clear();
      f.pipeline->preTokenize(std::move(part.piece), pieces);
      for (const HfPiece &piece : pieces)
        f.model->encode(piece.text, ids);
    }
  }
  ids.insert(ids.end(), f.pipeline->suffix().begin(),
             f.pipeline->suffix().end());
  return ids;
}

std::string
HuggingFaceTokenizer::decode(const std::vector<int32_t> &tokens) const {
  std::vector<std::string> strings;
  strings.reserve(tokens.size());
  for (int32_t id : tokens) {
    if (id >= 0 && id < vocabSize() && !files_->tokenOf[id].empty())
      strings.push_back(files_->tokenOf[id]);
    else
      strings.push_back("\xEF\xBF\xBD");
  }
  return files_->pipeline->decode(std::move(strings));
}

} // namespace mtrt::data
