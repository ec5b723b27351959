// Reading a tokenizer.json's BPE model, and BPE with a priority queue of
// merges (the `tokenizers` library's Word::merge_all), so that a long piece
// (SentencePiece-style files encode a whole document as one) costs
// O(n log n).
#include "data/HfBpeModel.h"

#include "core/Error.h"

#include <nlohmann/json.hpp>

#include <cstdio>
#include <queue>

namespace mtrt::data {

namespace {

[[noreturn]] void malformed(const std::string &file, const std::string &what) {
  throw Error(MTRT_STATUS_DATA_LOSS, "'" + file + "': " + what);
}

[[noreturn]] void unimplemented(const std::string &file,
                                const std::string &what) {
  throw Error(MTRT_STATUS_UNIMPLEMENTED,
              "'" + file + "': " + what +
                  "; HuggingFaceTokenizer reads the BPE models of Llama 3, "
                  "Qwen2.5, Llama 2 and Mistral (docs/Tokenizers.md), and "
                  "would tokenize this file differently from the tokenizers "
                  "library");
}

uint64_t pairKey(int32_t a, int32_t b) {
  return (static_cast<uint64_t>(static_cast<uint32_t>(a)) << 32) |
         static_cast<uint32_t>(b);
}

/// A string field that must be null or "" (a prefix or suffix the model does
/// not add).
void requireNoAffix(const nlohmann::json &model, const char *key,
                    const std::string &file) {
  auto it = model.find(key);
  if (it == model.end() || it->is_null() ||
      (it->is_string() && it->get<std::string>().empty()))
    return;
  unimplemented(file, std::string("model.") + key + " is " + it->dump() +
                          " (not implemented: only null or \"\")");
}

bool flag(const nlohmann::json &model, const char *key,
          const std::string &file) {
  auto it = model.find(key);
  if (it == model.end() || it->is_null())
    return false;
  if (!it->is_boolean())
    malformed(file, std::string("model.") + key + " is " + it->dump() +
                        ", expected true or false");
  return it->get<bool>();
}

/// The length of the UTF-8 sequence that starts with `lead` (1 for a stray
/// byte: the text was validated before).
size_t sequenceLength(uint8_t lead) {
  if (lead < 0xC0)
    return 1;
  if (lead < 0xE0)
    return 2;
  if (lead < 0xF0)
    return 3;
  return 4;
}

} // namespace

HfBpeModel::HfBpeModel(const nlohmann::json &model, const std::string &file) {
  if (!model.is_object())
    malformed(file, "\"model\" is " + model.dump().substr(0, 40) +
                        ", expected an object");
  auto type = model.find("type");
  if (type != model.end() && *type != "BPE")
    unimplemented(file, "model.type is " + type->dump() +
                            " (not implemented: only \"BPE\")");
  auto dropout = model.find("dropout");
  if (dropout != model.end() && !dropout->is_null() &&
      !(dropout->is_number() && dropout->get<double>() == 0.0))
    unimplemented(file, "model.dropout is " + dropout->dump() +
                            " (not implemented: BPE dropout samples "
                            "different merges at random; only null)");
  requireNoAffix(model, "continuing_subword_prefix", file);
  requireNoAffix(model, "end_of_word_suffix", file);
  fuseUnk_ = flag(model, "fuse_unk", file);
  byteFallback_ = flag(model, "byte_fallback", file);
  ignoreMerges_ = flag(model, "ignore_merges", file);

  auto vocab = model.find("vocab");
  if (vocab == model.end() || !vocab->is_object())
    malformed(file, "model.vocab is missing or not an object of token "
                    "strings to ids");
  for (auto &[token, id] : vocab->items()) {
    if (!id.is_number_integer() || id.get<int64_t>() < 0 ||
        id.get<int64_t>() >= (int64_t(1) << 31) - 1)
      malformed(file, "model.vocab[\"" + token + "\"] is " + id.dump() +
                          ", expected a non-negative integer id");
    auto value = id.get<int32_t>();
    vocab_[token] = value;
    if (static_cast<size_t>(value) >= tokens_.size())
      tokens_.resize(static_cast<size_t>(value) + 1);
    tokens_[value] = token;
  }
  for (int b = 0; b < 256; ++b) {
    char name[8];
    std::snprintf(name, sizeof(name), "<0x%02X>", b);
    auto it = vocab_.find(name);
    byteTokens_[b] = it == vocab_.end() ? -1 : it->second;
  }
  auto unk = model.find("unk_token");
  if (unk != model.end() && !unk->is_null()) {
    if (!unk->is_string() || !vocab_.count(unk->get<std::string>()))
      malformed(file, "model.unk_token is " + unk->dump() +
                          ", which is not a token of model.vocab");
    unk_ = vocab_.at(unk->get<std::string>());
  }

  auto merges = model.find("merges");
  if (merges == model.end() || !merges->is_array())
    malformed(file, "model.merges is missing or not an array");
  uint32_t rank = 0;
  for (const nlohmann::json &merge : *merges) {
    std::string left, right;
    // "a b" before tokenizers 0.20; ["a", "b"] since.
    if (merge.is_string()) {
      const std::string &text = merge.get_ref<const std::string &>();
      size_t space = text.find(' ');
      if (space == std::string::npos ||
          text.find(' ', space + 1) != std::string::npos)
        malformed(file, "model.merges[" + std::to_string(rank) + "] is " +
                            merge.dump() +
                            ", expected two tokens separated by one space");
      left = text.substr(0, space);
      right = text.substr(space + 1);
    } else if (merge.is_array() && merge.size() == 2 && merge[0].is_string() &&
               merge[1].is_string()) {
      left = merge[0].get<std::string>();
      right = merge[1].get<std::string>();
    } else {
      malformed(file, "model.merges[" + std::to_string(rank) + "] is " +
                          merge.dump() +
                          ", expected \"a b\" or [\"a\", \"b\"]");
    }
    auto a = vocab_.find(left), b = vocab_.find(right),
         merged = vocab_.find(left + right);
    if (a == vocab_.end() || b == vocab_.end() || merged == vocab_.end())
      malformed(file, "model.merges[" + std::to_string(rank) + "] " +
                          merge.dump() +
                          " joins tokens that model.vocab lacks");
    // As in the tokenizers library, a pair listed twice keeps its last rank.
    merges_[pairKey(a->second, b->second)] = Merge{rank, merged->second};
    ++rank;
  }
}

void HfBpeModel::encode(std::string_view piece,
                        std::vector<int32_t> &out) const {
  if (piece.empty())
    return;
  if (ignoreMerges_) {
    auto whole = vocab_.find(std::string(piece));
    if (whole != vocab_.end()) {
      out.push_back(whole->second);
      return;
    }
  }
  // The symbols: a doubly linked list over a vector, removed ones marked.
  struct Symbol {
    int32_t id;
    int32_t prev, next;
    bool removed;
  };
  std::vector<Symbol> symbols;
  symbols.reserve(piece.size());
  auto add = [&](int32_t id) {
    auto index = static_cast<int32_t>(symbols.size());
    symbols.push_back(Symbol{id, index - 1, index + 1, false});
  };
  int32_t pendingUnk = -1; // an unknown token not yet added
  std::string codePoint;
  for (size_t at = 0; at < piece.size();) {
    size_t length = std::min(sequenceLength(static_cast<uint8_t>(piece[at])),
                             piece.size() - at);
    codePoint.assign(piece.substr(at, length));
    at += length;
    auto known = vocab_.find(codePoint);
    if (known != vocab_.end()) {
      if (pendingUnk >= 0) {
        add(pendingUnk);
        pendingUnk = -1;
      }
      add(known->second);
      continue;
    }
    if (byteFallback_) {
      bool all = true;
      for (char c : codePoint)
        all &= byteTokens_[static_cast<uint8_t>(c)] >= 0;
      // As in the tokenizers library, a pending unknown token waits until
      // the next known code point.
      if (all) {
        for (char c : codePoint)
          add(byteTokens_[static_cast<uint8_t>(c)]);
        continue;
      }
    }
    if (!unk_)
      continue;
    if (pendingUnk >= 0 && !fuseUnk_)
      add(pendingUnk);
    pendingUnk = *unk_;
  }
  if (pendingUnk >= 0)
    add(pendingUnk);
  if (symbols.empty())
    return;
  symbols.back().next = -1;

  // Lowest rank first, then leftmost.
  struct Candidate {
    uint32_t rank;
    int32_t pos;
    int32_t merged;
    bool operator<(const Candidate &other) const {
      if (rank != other.rank)
        return rank > other.rank;
      return pos > other.pos;
    }
  };
  std::priority_queue<Candidate> queue;
  auto consider = [&](int32_t pos) {
    int32_t next = symbols[pos].next;
    if (next < 0)
      return;
    auto merge = merges_.find(pairKey(symbols[pos].id, symbols[next].id));
    if (merge != merges_.end())
      queue.push(Candidate{merge->second.rank, pos, merge->second.merged});
  };
  for (int32_t i = 0; i + 1 < static_cast<int32_t>(symbols.size()); ++i)
    consider(i);
  while (!queue.empty()) {
    Candidate top = queue.top();
    queue.pop();
    Symbol &left = symbols[top.pos];
    if (left.removed || left.next < 0)
      continue;
    Symbol &right = symbols[left.next];
    // A stale entry: its pair changed since it was queued.
    auto merge = merges_.find(pairKey(left.id, right.id));
    if (merge == merges_.end() || merge->second.merged != top.merged)
      continue;
    left.id = top.merged;
    right.removed = true;
    left.next = right.next;
    if (right.next >= 0)
      symbols[right.next].prev = top.pos;
    if (left.prev >= 0)
      consider(left.prev);
    consider(top.pos);
  }
  for (const Symbol &symbol : symbols)
    if (!symbol.removed)
      out.push_back(symbol.id);
}

} // namespace mtrt::data
