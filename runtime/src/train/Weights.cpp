// Loading Hugging Face-named safetensors weights into a ParameterStore and
// saving them back.
#include "train/Weights.h"

#include "comm/RankContext.h"
#include "host/ParameterStore.h"

#include <algorithm>
#include <cctype>
#include <cstring>
#include <functional>
#include <map>
#include <optional>
#include <set>
#include <sstream>
#include <type_traits>
#include <vector>

namespace mtrt::train {

namespace {

constexpr std::string_view kEmbeddingNames[] = {"transformer.wte.weight",
                                                "model.embed_tokens.weight"};
constexpr std::string_view kLmHead = "lm_head.weight";

[[noreturn]] void invalid(const std::string &message) {
  throw Error(MTRT_STATUS_INVALID_ARGUMENT, message);
}

/// `prefix` + one or more digits + `suffix`.
bool matchesLayer(std::string_view name, std::string_view prefix,
                  std::string_view suffix) {
  if (name.size() <= prefix.size() + suffix.size() ||
      name.substr(0, prefix.size()) != prefix ||
      name.substr(name.size() - suffix.size()) != suffix)
    return false;
  std::string_view digits =
      name.substr(prefix.size(), name.size() - prefix.size() - suffix.size());
  return std::all_of(digits.begin(), digits.end(), [](char c) {
    return std::isdigit(static_cast<unsigned char>(c));
  });
}

std::string describe(const SafetensorsTensor &t) {
  return shapeString(t.shape) + " " + safetensorsDTypeName(t.dtype);
}

/// Throws unless `store` was made for `bundle` and, where `whole` (one
/// store read or written as the file's whole tensors), the bundle splits no
/// parameter over ranks.
void checkStore(const char *what, const Bundle &bundle,
                const host::ParameterStore &store, bool whole = true) {
  const auto &parameters = bundle.parameters();
  if (store.size() != parameters.size() ||
      (store.size() && &store.info(0) != &parameters[0]))
    invalid(std::string(what) +
            ": the parameter store was made for another bundle than '" +
            bundle.name() + "'");
  // The store holds one rank's shards; files hold whole tensors.
  for (const Parameter &p : parameters)
    if (whole && !p.splitAxes.empty())
      throw Error(MTRT_STATUS_UNIMPLEMENTED,
                  std::string(what) + ": bundle '" + bundle.name() +
                      "' splits parameters over ranks (" + p.name +
                      "), so one store holds a rank's shards, not the "
                      "file's whole tensors: call the " +
                      what + " that takes the ranks' stores");
}

/// What a tensor of the file stands for.
struct Resolved {
  enum Kind { None, Parameter, Buffer, TiedHead } kind = None;
  size_t parameter = 0;
  std::string name; // the name it was read as
};

/// For each column of the bundle's per-group layout, the column of Hugging
/// Face's [q | k | v] it holds; the bundle's heads and groups must divide
/// the parameter's columns.
std::vector<int64_t> qkvColumnsFromHuggingFace(const Bundle &bundle,
                                               const Parameter &p) {
  const ModelConfig &model = bundle.model();
  const int64_t columns = p.type.shape.empty() ? 0 : p.type.shape.back();
  std::optional<std::vector<int64_t>> from = fusedQkvColumnsFromHuggingFace(
      model.numAttentionHeads, model.numQueryGroups, columns);
  if (!from)
    invalid("parameter '" + p.name + "' of bundle '" + bundle.name() +
            "' has " + std::to_string(columns) +
            " columns, which is not (num_attention_heads + 2 * "
            "num_query_groups) * head_dim for the bundle's " +
            std::to_string(model.numAttentionHeads) + " heads and " +
            std::to_string(model.numQueryGroups ? model.numQueryGroups
                                                : model.numAttentionHeads) +
            " query groups; recompile the bundle with megatron-compile");
  return *from;
}

/// Where a Hugging Face MoE tensor goes: the bundle's per-layer expert
/// tensors are `[E, out, in]` (`model.layers.L.mlp.experts.gate_proj.weight`
/// and up_proj, down_proj), the router `model.layers.L.mlp.gate.weight`. The
/// hub stores each expert apart (Mixtral's
/// `block_sparse_moe.experts.N.w1/w3/w2`, Qwen3-MoE's
/// `mlp.experts.N.gate_proj/up_proj/down_proj`), and transformers 5 holds
/// them fused in memory (`mlp.experts.gate_up_proj` `[E, 2 I, H]`, gate rows
/// first, and `mlp.experts.down_proj` `[E, H, I]`).
struct ExpertPiece {
  std::string parameter; // the bundle's name
  int64_t expert = -1;   // one expert's slice, or -1: every expert
  /// For every expert: rows [rowBegin, rowBegin + rows) of the file's
  /// per-expert matrix (fused gate_up_proj holds two parameters' rows).
  int64_t rowBegin = 0;
  bool fusedHalf = false;
};

std::optional<ExpertPiece> expertPiece(std::string_view name) {
  auto consume = [](std::string_view &s, std::string_view prefix) {
    if (s.substr(0, prefix.size()) != prefix)
      return false;
    s.remove_prefix(prefix.size());
    return true;
  };
  auto number = [](std::string_view &s) -> std::optional<int64_t> {
    size_t n = 0;
    while (n < s.size() && std::isdigit(static_cast<unsigned char>(s[n])))
      ++n;
    if (n == 0 || n > 9)
      return std::nullopt;
    int64_t v = std::stoll(std::string(s.substr(0, n)));
    s.remove_prefix(n);
    return v;
  };
  std::string_view rest = name;
  if (!consume(rest, "model.layers."))
    return std::nullopt;
  std::optional<int64_t> layer = number(rest);
  if (!layer)
    return std::nullopt;
  std::string base = "model.layers." + std::to_string(*layer) + ".mlp.";
  bool mixtral = consume(rest, ".block_sparse_moe.");
  if (!mixtral && !consume(rest, ".mlp."))
    return std::nullopt;
  if (mixtral && rest == "gate.weight")
    return ExpertPiece{base + "gate.weight", -1, 0, false};
  if (!consume(rest, "experts."))
    return std::nullopt;
  if (!mixtral && rest == "gate_up_proj")
    return ExpertPiece{base + "experts.gate_proj.weight", -1, 0, true};
  if (!mixtral && rest == "down_proj")
    return ExpertPiece{base + "experts.down_proj.weight", -1, 0, false};
  std::optional<int64_t> expert = number(rest);
  if (!expert || !consume(rest, "."))
    return std::nullopt;
  static constexpr std::pair<std::string_view, std::string_view> kMixtral[] = {
      {"w1.weight", "gate_proj"}, {"w3.weight", "up_proj"},
      {"w2.weight", "down_proj"}};
  static constexpr std::pair<std::string_view, std::string_view> kQwen[] = {
      {"gate_proj.weight", "gate_proj"}, {"up_proj.weight", "up_proj"},
      {"down_proj.weight", "down_proj"}};
  for (const auto &[leaf, projection] : mixtral ? kMixtral : kQwen)
    if (rest == leaf)
      return ExpertPiece{base + "experts." + std::string(projection) +
                             ".weight",
                         *expert, 0, false};
  return std::nullopt;
}

} // namespace

bool isFusedQkv(std::string_view name) {
  return matchesLayer(name, "transformer.h.", ".attn.c_attn.weight") ||
         matchesLayer(name, "transformer.h.", ".attn.c_attn.bias");
}

std::optional<std::vector<int64_t>>
fusedQkvColumnsFromHuggingFace(int64_t heads, int64_t groups,
                               int64_t columns) {
  if (groups == 0)
    groups = heads;
  if (heads <= 0 || groups <= 0 || heads % groups != 0 ||
      columns % (heads + 2 * groups) != 0)
    return std::nullopt;
  const int64_t headDim = columns / (heads + 2 * groups);
  const int64_t perGroup = heads / groups;
  const int64_t groupWidth = (perGroup + 2) * headDim;
  std::vector<int64_t> from(columns);
  for (int64_t c = 0; c < columns; ++c) {
    int64_t g = c / groupWidth, r = c % groupWidth;
    if (r < perGroup * headDim)
      from[c] = g * perGroup * headDim + r;
    else if (r < (perGroup + 1) * headDim)
      from[c] = heads * headDim + g * headDim + (r - perGroup * headDim);
    else
      from[c] = (heads + groups) * headDim + g * headDim +
                (r - (perGroup + 1) * headDim);
  }
  return from;
}

template <typename T>
void permuteColumns(T *values, int64_t count,
                    const std::vector<int64_t> &from, bool gather) {
  const int64_t columns = static_cast<int64_t>(from.size());
  std::vector<T> row(columns);
  for (int64_t base = 0; base + columns <= count; base += columns) {
    std::copy(values + base, values + base + columns, row.begin());
    for (int64_t c = 0; c < columns; ++c) {
      if (gather)
        values[base + c] = row[from[c]];
      else
        values[base + from[c]] = row[c];
    }
  }
}
template void permuteColumns<float>(float *, int64_t,
                                    const std::vector<int64_t> &, bool);
template void permuteColumns<double>(double *, int64_t,
                                     const std::vector<int64_t> &, bool);

bool isVocabularyTable(std::string_view name) {
  return name == kEmbeddingNames[0] || name == kEmbeddingNames[1] ||
         name == kLmHead;
}

bool isKnownBuffer(std::string_view name) {
  return matchesLayer(name, "transformer.h.", ".attn.bias") ||
         matchesLayer(name, "transformer.h.", ".attn.masked_bias") ||
         matchesLayer(name, "model.layers.", ".self_attn.rotary_emb.inv_freq");
}

namespace {

/// Expert tensors stored apart or fused: each copy of rows of a file tensor
/// into a parameter, checked as the whole tensors are.
struct ExpertCopy {
  const SafetensorsTensor *tensor;
  int64_t expert;   // -1: the tensor holds every expert
  int64_t rowBegin; // first row of each expert's matrix in the tensor
};

/// Where each parameter's whole tensor comes from in a file, every check
/// made (planWeights).
struct WeightsPlan {
  std::vector<const SafetensorsTensor *> source;
  std::vector<std::vector<ExpertCopy>> expertCopies;
  WeightsLoadReport report;
};

/// loadWeights' checks: reads nothing but the file's header and, for a tied
/// head, the two tables it compares; throws naming the problem.
WeightsPlan planWeights(const SafetensorsFile &file, const Bundle &bundle) {
  const std::vector<Parameter> &parameters = bundle.parameters();
  const std::string fileName = "'" + file.name() + "'";
  const std::string bundleName = "bundle '" + bundle.name() + "'";
  const int64_t vocabSize = bundle.model().vocabSize;

  std::map<std::string, size_t, std::less<>> byName;
  for (size_t i = 0; i < parameters.size(); ++i)
    byName.emplace(parameters[i].name, i);
  std::optional<size_t> embedding;
  for (std::string_view name : kEmbeddingNames)
    if (auto it = byName.find(name); it != byName.end())
      embedding = it->second;
  const bool tied = embedding && !byName.count(kLmHead);

  auto resolveExact = [&](const std::string &name) {
    Resolved r;
    r.name = name;
    if (auto it = byName.find(name); it != byName.end()) {
      r.kind = Resolved::Parameter;
      r.parameter = it->second;
    } else if (isKnownBuffer(name)) {
      r.kind = Resolved::Buffer;
    } else if (tied && name == kLmHead) {
      r.kind = Resolved::TiedHead;
    }
    return r;
  };
  // GPT2Model and LlamaModel save their weights without the prefix that
  // GPT2LMHeadModel and LlamaForCausalLM add.
  auto resolve = [&](const std::string &name) {
    Resolved r = resolveExact(name);
    if (r.kind == Resolved::None && name.rfind("transformer.", 0) != 0 &&
        name.rfind("model.", 0) != 0)
      for (const char *prefix : {"transformer.", "model."}) {
        Resolved prefixed = resolveExact(prefix + name);
        if (prefixed.kind == Resolved::Parameter ||
            prefixed.kind == Resolved::Buffer)
          return prefixed;
      }
    return r;
  };
  auto label = [&](const SafetensorsTensor &t, const std::string &readAs) {
    std::string s = "tensor '" + t.name + "'";
    if (readAs != t.name)
      s += " (read as '" + readAs + "')";
    return s;
  };
  auto exampleNames = [&]() {
    std::string s;
    for (size_t i = 0; i < parameters.size() && i < 2; ++i)
      s += (i ? "', '" : "'") + parameters[i].name;
    return s.empty() ? std::string("none") : s + "', ...";
  };

  WeightsPlan plan;
  std::vector<const SafetensorsTensor *> &source = plan.source;
  source.assign(parameters.size(), nullptr);
  std::vector<std::vector<ExpertCopy>> &expertCopies = plan.expertCopies;
  expertCopies.resize(parameters.size());
  std::vector<std::vector<const SafetensorsTensor *>> expertSlots(
      parameters.size());
  auto takeExpertPiece = [&](const SafetensorsTensor &t) {
    std::optional<ExpertPiece> piece = expertPiece(t.name);
    if (!piece)
      return false;
    auto it = byName.find(piece->parameter);
    if (it == byName.end())
      return false;
    const Parameter &p = parameters[it->second];
    const std::vector<int64_t> &want = p.type.shape;
    std::string found = fileName + ": tensor '" + t.name + "' is " +
                        shapeString(t.shape) + " but parameter '" + p.name +
                        "' of " + bundleName + " is " + shapeString(want);
    if (!isSafetensorsFloat(t.dtype))
      invalid(fileName + ": tensor '" + t.name + "' is " +
              safetensorsDTypeName(t.dtype) +
              ", expected a floating-point type (F32, F64, BF16 or F16); "
              "convert the weights to float before saving them");
    if (source[it->second])
      invalid(fileName + ": tensors '" + source[it->second]->name +
              "' and '" + t.name + "' both hold parameter '" + p.name +
              "'; keep one of them");
    std::vector<int64_t> targets = {static_cast<int64_t>(it->second)};
    if (piece->expert < 0 && want.size() == 2) {
      // Mixtral's router: the same [E, h] tensor under another name.
      if (t.shape != want)
        invalid(found + "; compile the model with the weights' sizes");
      expertCopies[it->second].push_back({&t, -1, 0});
      return true;
    }
    if (want.size() != 3)
      invalid(found + ": expected a parameter of experts [E, out, in]");
    if (piece->expert >= 0) {
      std::vector<int64_t> slice(want.begin() + 1, want.end());
      if (t.shape != slice || piece->expert >= want[0])
        invalid(found + ": expert " + std::to_string(piece->expert) +
                " must be " + shapeString(slice) + " and below num_experts " +
                std::to_string(want[0]) +
                "; compile the model with the weights' sizes "
                "(--num-experts, --moe-ffn-hidden-size, --hidden-size)");
      auto &slots = expertSlots[it->second];
      slots.resize(want[0], nullptr);
      if (slots[piece->expert])
        invalid(fileName + ": tensors '" + slots[piece->expert]->name +
                "' and '" + t.name + "' both hold expert " +
                std::to_string(piece->expert) + " of parameter '" + p.name +
                "'; keep one of them");
      slots[piece->expert] = &t;
      expertCopies[it->second].push_back({&t, piece->expert, 0});
      return true;
    }
    // Fused over experts: [E, out, in], or gate_up_proj [E, 2 out, in]
    // holding gate_proj's rows and then up_proj's.
    std::vector<int64_t> whole = want;
    if (piece->fusedHalf) {
      whole[1] *= 2;
      std::string up = piece->parameter;
      up.replace(up.rfind("gate_proj"), 9, "up_proj");
      auto upIt = byName.find(up);
      if (upIt == byName.end())
        invalid(fileName + ": tensor '" + t.name + "' holds gate_proj and "
                "up_proj, but " + bundleName + " has no '" + up + "'");
      targets.push_back(static_cast<int64_t>(upIt->second));
    }
    if (t.shape != whole)
      invalid(found + " (expected " + shapeString(whole) +
              "); compile the model with the weights' sizes");
    for (size_t k = 0; k < targets.size(); ++k)
      expertCopies[targets[k]].push_back(
          {&t, -1, static_cast<int64_t>(k) * want[1]});
    return true;
  };
  const SafetensorsTensor *tiedHead = nullptr;
  WeightsLoadReport &report = plan.report;
  for (const SafetensorsTensor &t : file.tensors()) {
    Resolved r = resolve(t.name);
    if (r.kind == Resolved::None && takeExpertPiece(t))
      continue;
    switch (r.kind) {
    case Resolved::None:
      invalid(fileName + ": tensor '" + t.name + "' (" + describe(t) +
              ") is not a parameter of " + bundleName +
              " (its parameters are " + exampleNames() +
              "); the file holds another model: load weights saved from the "
              "model the bundle was compiled from");
    case Resolved::Buffer:
      ++report.ignored;
      continue;
    case Resolved::TiedHead:
      tiedHead = &t;
      ++report.ignored;
      continue;
    case Resolved::Parameter:
      break;
    }
    const Parameter &p = parameters[r.parameter];
    if (source[r.parameter])
      invalid(fileName + ": tensors '" + source[r.parameter]->name + "' and '" +
              t.name + "' both hold parameter '" + p.name +
              "'; keep one of them");
    if (!isSafetensorsFloat(t.dtype))
      invalid(fileName + ": " + label(t, r.name) + " is " +
              safetensorsDTypeName(t.dtype) +
              ", expected a floating-point type (F32, F64, BF16 or F16) for "
              "parameter '" +
              p.name + "'; convert the weights to float before saving them");
    const std::vector<int64_t> &want = p.type.shape;
    bool sameTail =
        t.shape.size() == want.size() &&
        std::equal(t.shape.begin() + (want.empty() ? 0 : 1), t.shape.end(),
                   want.begin() + (want.empty() ? 0 : 1));
    std::string found = fileName + ": " + label(t, r.name) + " is " +
                        shapeString(t.shape) + " but parameter '" + p.name +
                        "' of " + bundleName + " is " + shapeString(want);
    if (sameTail && !want.empty() && isVocabularyTable(p.name) &&
        t.shape[0] != want[0]) {
      if (t.shape[0] > want[0])
        invalid(found + ": the file's vocabulary has " +
                std::to_string(t.shape[0]) +
                " rows, more than the bundle's padded vocabulary of " +
                std::to_string(want[0]) + "; compile the model with " +
                "--vocab-size " + std::to_string(t.shape[0]));
      if (t.shape[0] < vocabSize)
        invalid(found + ": the file's vocabulary has " +
                std::to_string(t.shape[0]) +
                " rows, fewer than the model's vocab_size of " +
                std::to_string(vocabSize) + "; compile the model with " +
                "--vocab-size " + std::to_string(t.shape[0]) +
                ", or load weights of a " + std::to_string(vocabSize) +
                "-token vocabulary");
      ++report.padded;
    } else if (!sameTail || (!want.empty() && t.shape[0] != want[0])) {
      invalid(found +
              "; compile the model with the sizes the weights were trained "
              "with (megatron-compile --hidden-size, --ffn-hidden-size, "
              "--num-attention-heads, --num-query-groups, "
              "--max-position-embeddings, ...)");
    }
    source[r.parameter] = &t;
  }

  std::vector<std::string> missing;
  for (size_t i = 0; i < parameters.size(); ++i) {
    if (source[i] && !expertCopies[i].empty())
      invalid(fileName + ": tensors '" + source[i]->name + "' and '" +
              expertCopies[i][0].tensor->name + "' both hold parameter '" +
              parameters[i].name + "'; keep one of them");
    if (source[i])
      continue;
    const std::vector<ExpertCopy> &copies = expertCopies[i];
    if (copies.empty() && parameters[i].isExpertBias()) {
      ++report.expertBiasesKept;
      continue;
    }
    bool whole = std::any_of(copies.begin(), copies.end(),
                             [](const ExpertCopy &c) { return c.expert < 0; });
    if (copies.empty() ||
        (!whole && static_cast<int64_t>(copies.size()) !=
                       parameters[i].type.shape[0]))
      missing.push_back(parameters[i].name);
  }
  if (!missing.empty()) {
    std::ostringstream s;
    s << fileName << ": no tensor for parameter '" << missing[0] << "' "
      << shapeString(parameters[byName.at(missing[0])].type.shape) << " of "
      << bundleName << " (" << missing.size() << " of " << parameters.size()
      << " parameters missing";
    for (size_t i = 1; i < missing.size() && i < 4; ++i)
      s << (i == 1 ? ": also '" : "', '") << missing[i];
    if (missing.size() > 1)
      s << (missing.size() > 4 ? "', ..." : "'");
    if (missing.size() == 1 && missing[0] == kLmHead)
      s << "); the file's model ties its output layer to the embedding "
           "(Hugging Face then leaves lm_head.weight out): compile the model "
           "without --untie-embeddings-and-output-weights";
    else
      s << "); the file must hold every parameter: save it from a model of "
           "the bundle's architecture (layers, biases, tied or untied output "
           "layer)";
    invalid(s.str());
  }

  if (tiedHead) {
    const SafetensorsTensor &table = *source[*embedding];
    const std::string &tableName = parameters[*embedding].name;
    std::string untied = "the file has untied weights, but " + bundleName +
                         " ties the output layer to the embedding: compile "
                         "the model with "
                         "--untie-embeddings-and-output-weights";
    if (!isSafetensorsFloat(tiedHead->dtype))
      invalid(fileName + ": tensor '" + tiedHead->name + "' is " +
              safetensorsDTypeName(tiedHead->dtype) +
              ", expected a floating-point type (F32, F64, BF16 or F16); "
              "convert the weights to float before saving them");
    if (tiedHead->shape != table.shape)
      invalid(fileName + ": tensor '" + tiedHead->name + "' is " +
              shapeString(tiedHead->shape) + " and tensor '" + table.name +
              "' is " + shapeString(table.shape) + ": " + untied);
    std::vector<double> head(tiedHead->numElements), rows(table.numElements);
    file.convert(*tiedHead, head.data());
    file.convert(table, rows.data());
    for (size_t k = 0; k < head.size(); ++k)
      if (!(head[k] == rows[k])) {
        int64_t columns = table.shape.size() > 1 ? table.shape[1] : 1;
        std::ostringstream s;
        s.precision(9);
        s << fileName << ": tensor '" << tiedHead->name << "' differs from '"
          << table.name << "' (" << tableName << ") at ["
          << static_cast<int64_t>(k) / columns << ", "
          << static_cast<int64_t>(k) % columns << "]: " << head[k] << " vs "
          << rows[k] << "; " << untied;
        invalid(s.str());
      }
  }

  report.parameters = parameters.size() - report.expertBiasesKept;
  return plan;
}

/// Overwrites `whole`, parameter i's whole tensor (row-major, the bundle's
/// global shape), with the file's as `plan` found it. Shorter vocabulary
/// tables fill a prefix of the buffer, which is exactly their rows: the
/// padding rows keep what `whole` held.
template <typename T>
void writeParameter(const WeightsPlan &plan, const SafetensorsFile &file,
                    const Bundle &bundle, size_t i, T *whole) {
  const std::vector<Parameter> &parameters = bundle.parameters();
  const std::vector<const SafetensorsTensor *> &source = plan.source;
  const int64_t count = parameters[i].type.numElements;
  {
    const std::vector<ExpertCopy> &copies = plan.expertCopies[i];
    if (!copies.empty()) {
      // [E, rows, columns]: each copy fills one expert's matrix or every
      // expert's, from rows [rowBegin, rowBegin + rows) of the file's.
      const std::vector<int64_t> &shape = parameters[i].type.shape;
      const int64_t matrix = shape.size() == 3 ? shape[1] * shape[2] : count;
      for (const ExpertCopy &c : copies) {
        std::vector<double> data(c.tensor->numElements);
        file.convert(*c.tensor, data.data());
        const int64_t experts = c.expert < 0 && shape.size() == 3 ? shape[0] : 1;
        const int64_t fileMatrix =
            c.expert < 0 ? c.tensor->numElements / experts : matrix;
        for (int64_t e = 0; e < experts; ++e) {
          const int64_t to = (c.expert < 0 ? e : c.expert) * matrix;
          const int64_t from =
              e * fileMatrix + c.rowBegin * (shape.size() == 3 ? shape[2] : 0);
          for (int64_t k = 0; k < matrix; ++k)
            whole[to + k] = static_cast<T>(data[from + k]);
        }
      }
      return;
    }
  }
  if (!source[i]) // an expert bias the file does not hold keeps its values
    return;
  file.convert(*source[i], whole);
  if (isFusedQkv(parameters[i].name))
    permuteColumns(whole, count,
                   qkvColumnsFromHuggingFace(bundle, parameters[i]),
                   /*gather=*/true);
}

} // namespace

WeightsLoadReport loadWeights(const SafetensorsFile &file, const Bundle &bundle,
                              host::ParameterStore &store) {
  checkStore("loadWeights", bundle, store);
  WeightsPlan plan = planWeights(file, bundle);
  // Everything checked: now overwrite.
  for (size_t i = 0; i < bundle.parameters().size(); ++i) {
    host::Tensor &value = store.value(i);
    if (store.floatType() == DType::F64)
      writeParameter(plan, file, bundle, i, value.data<double>());
    else
      writeParameter(plan, file, bundle, i, value.data<float>());
  }
  return plan.report;
}

WeightsLoadReport
loadWeights(const SafetensorsFile &file, const Bundle &bundle,
            const std::vector<host::ParameterStore *> &ranks) {
  const std::vector<Parameter> &parameters = bundle.parameters();
  for (const host::ParameterStore *store : ranks)
    checkStore("loadWeights", bundle, *store, /*whole=*/false);
  WeightsPlan plan = planWeights(file, bundle);
  // Each parameter's whole tensor: the stores' shards put together (the
  // padding rows of a vocabulary table keep them), the file's written over
  // them, and each store's shard taken back out.
  std::vector<double> whole;
  for (size_t i = 0; i < parameters.size(); ++i) {
    const Parameter &p = parameters[i];
    whole.assign(static_cast<size_t>(p.type.numElements), 0.0);
    auto eachElement = [&](host::ParameterStore &store, auto &&visit) {
      std::vector<int64_t> offsets = store.shardOffsets(i);
      host::Tensor &value = store.value(i);
      for (int64_t e = 0; e < p.localType.numElements; ++e) {
        double &at =
            whole[static_cast<size_t>(shardElementIndex(p, offsets, e))];
        if (store.floatType() == DType::F64)
          visit(at, value.data<double>()[e]);
        else
          visit(at, value.data<float>()[e]);
      }
    };
    for (host::ParameterStore *store : ranks)
      if (store->holds(i)) // a pipeline rank holds only its stages'
        eachElement(*store, [](double &w, auto v) { w = v; });
    writeParameter(plan, file, bundle, i, whole.data());
    for (host::ParameterStore *store : ranks)
      if (store->holds(i))
        eachElement(*store, [](double w, auto &v) {
          v = static_cast<std::remove_reference_t<decltype(v)>>(w);
        });
  }
  return plan.report;
}

std::optional<ExpertNames> parseExpertNames(std::string_view text) {
  if (text == "bundle")
    return ExpertNames::Bundle;
  if (text == "mixtral")
    return ExpertNames::Mixtral;
  if (text == "qwen3-moe")
    return ExpertNames::Qwen3Moe;
  return std::nullopt;
}

void saveWeights(const std::string &path, const Bundle &bundle,
                 const host::ParameterStore &store, ExpertNames experts) {
  checkStore("saveWeights", bundle, store);
  saveWeights(path, bundle, std::vector<const host::ParameterStore *>{&store},
              experts);
}

namespace {

/// `name` ends with `suffix`; `stem` is what comes before it.
bool splitSuffix(std::string_view name, std::string_view suffix,
                 std::string_view &stem) {
  if (name.size() < suffix.size() ||
      name.substr(name.size() - suffix.size()) != suffix)
    return false;
  stem = name.substr(0, name.size() - suffix.size());
  return true;
}

/// The hub's names for the per-expert slices of the bundle's routed expert
/// tensor `name` (`model.layers.L.mlp.experts.P.weight`, `[E, out, in]`):
/// the name of expert N is prefix + N + suffix; nullopt for other tensors.
std::optional<std::pair<std::string, std::string>>
hubExpertNames(std::string_view name, ExpertNames experts) {
  static constexpr std::pair<std::string_view, std::string_view>
      kMixtral[] = {{"gate_proj", "w1"}, {"up_proj", "w3"}, {"down_proj", "w2"}};
  for (auto [projection, mixtral] : kMixtral) {
    std::string_view layer;
    std::string suffix = ".mlp.experts." + std::string(projection) + ".weight";
    if (!splitSuffix(name, suffix, layer))
      continue;
    if (experts == ExpertNames::Mixtral)
      return std::make_pair(std::string(layer) + ".block_sparse_moe.experts.",
                            "." + std::string(mixtral) + ".weight");
    return std::make_pair(std::string(layer) + ".mlp.experts.",
                          "." + std::string(projection) + ".weight");
  }
  return std::nullopt;
}

} // namespace

void checkExpertNames(const Bundle &bundle, ExpertNames experts) {
  if (experts == ExpertNames::Bundle)
    return;
  for (const Parameter &p : bundle.parameters()) {
    bool routed = p.name.find(".mlp.experts.") != std::string::npos &&
                  p.type.shape.size() == 3;
    if (routed && !hubExpertNames(p.name, experts))
      invalid("--save-weights-experts: '" + p.name +
              "' is not a Llama-named routed expert tensor "
              "(model.layers.L.mlp.experts.{gate,up,down}_proj.weight), "
              "which the hub's per-expert names are made from; save with "
              "--save-weights-experts bundle");
    if (experts == ExpertNames::Mixtral &&
        p.name.find(".mlp.shared_expert.") != std::string::npos)
      invalid("--save-weights-experts mixtral: '" + p.name +
              "' is a shared expert, which Mixtral does not have; save "
              "with --save-weights-experts qwen3-moe or bundle");
    if (p.isExpertBias())
      invalid(std::string("--save-weights-experts ") +
              (experts == ExpertNames::Mixtral ? "mixtral" : "qwen3-moe") +
              ": '" + p.name +
              "' is an expert bias (aux-loss-free balancing), which that "
              "model does not have; save with --save-weights-experts bundle "
              "(DeepSeek-V3's names)");
  }
}

namespace {

/// Parameter `i`'s shard of `store` as floats (the store may hold f64).
std::vector<float> shardValues(const host::ParameterStore &store, size_t i) {
  const host::Tensor &value = store.value(i);
  if (store.floatType() == DType::F32)
    return std::vector<float>(value.data<float>(),
                              value.data<float>() + value.numElements());
  return std::vector<float>(value.data<double>(),
                            value.data<double>() + value.numElements());
}

/// A rank whose shard of a parameter goes into the whole tensor, and where
/// the shard sits in it (shardOffsets).
struct ShardOwner {
  int64_t rank = 0;
  std::vector<int64_t> offsets;
};

/// Per parameter, the ranks whose shards make its whole tensor: of the
/// ranks that hold it (a pipeline rank holds only its stages' parameters),
/// the lowest of each shard offset (the replicas of an unsplit parameter,
/// and the copies of a table tied across pipeline stages, are equal).
std::vector<std::vector<ShardOwner>> shardOwners(const Bundle &bundle) {
  const std::vector<Parameter> &parameters = bundle.parameters();
  std::vector<std::vector<ShardOwner>> owners(parameters.size());
  for (size_t i = 0; i < parameters.size(); ++i) {
    const Parameter &p = parameters[i];
    if (!bundle.hasGrid()) {
      owners[i].push_back({0, std::vector<int64_t>(p.type.shape.size())});
      continue;
    }
    std::set<std::vector<int64_t>> seen;
    for (int64_t r = 0; r < bundle.rankCount(); ++r) {
      std::vector<int64_t> at = gridCoordinates(bundle.gridShape(), r);
      if (!p.heldOnPipelineRank(at[0]))
        continue;
      std::vector<int64_t> offsets = shardOffsets(p, bundle.gridShape(), at);
      if (seen.insert(offsets).second)
        owners[i].push_back({r, std::move(offsets)});
    }
  }
  return owners;
}

/// Writes every parameter's whole tensor, put together from the shards
/// that `shard(rank, i)` returns for each of shardOwners' ranks, as
/// saveWeights says.
void writeWholeWeights(
    const std::string &path, const Bundle &bundle, ExpertNames experts,
    const std::function<std::vector<float>(int64_t, size_t)> &shard) {
  const std::vector<Parameter> &parameters = bundle.parameters();
  std::vector<std::vector<ShardOwner>> owners = shardOwners(bundle);
  const int64_t vocabSize = bundle.model().vocabSize;
  std::vector<std::vector<float>> whole(parameters.size());
  std::vector<SafetensorsWriteTensor> tensors;
  checkExpertNames(bundle, experts);
  for (size_t i = 0; i < parameters.size(); ++i) {
    const Parameter &p = parameters[i];
    whole[i].resize(static_cast<size_t>(p.type.numElements));
    for (const ShardOwner &owner : owners[i]) {
      std::vector<float> values = shard(owner.rank, i);
      for (int64_t e = 0; e < p.localType.numElements; ++e)
        whole[i][static_cast<size_t>(shardElementIndex(p, owner.offsets, e))] =
            values[static_cast<size_t>(e)];
    }
    SafetensorsWriteTensor t;
    t.name = p.name;
    t.shape = p.type.shape;
    if (isVocabularyTable(p.name) && vocabSize > 0 && !t.shape.empty() &&
        t.shape[0] > vocabSize)
      t.shape[0] = vocabSize;
    // Stored in Megatron-LM's per-group layout; files hold Hugging Face's.
    if (isFusedQkv(p.name))
      permuteColumns(whole[i].data(), p.type.numElements,
                     qkvColumnsFromHuggingFace(bundle, p), /*gather=*/false);
    t.data = whole[i].data();
    std::optional<std::pair<std::string, std::string>> hub =
        experts == ExpertNames::Bundle ? std::nullopt
                                       : hubExpertNames(p.name, experts);
    if (!hub) {
      std::string_view layer;
      if (experts == ExpertNames::Mixtral &&
          splitSuffix(p.name, ".mlp.gate.weight", layer))
        t.name = std::string(layer) + ".block_sparse_moe.gate.weight";
      tensors.push_back(std::move(t));
      continue;
    }
    // One [out, in] tensor per expert, in expert order.
    const int64_t count = p.type.shape[0];
    const int64_t each = p.type.numElements / count;
    for (int64_t e = 0; e < count; ++e) {
      SafetensorsWriteTensor slice;
      slice.name = hub->first + std::to_string(e) + hub->second;
      slice.shape = {p.type.shape[1], p.type.shape[2]};
      slice.data = whole[i].data() + e * each;
      tensors.push_back(std::move(slice));
    }
  }
  writeSafetensors(path, tensors,
                   {{"format", "pt"}, {"producer", "megatron-train"}});
}

} // namespace

void saveWeights(const std::string &path, const Bundle &bundle,
                 const std::vector<const host::ParameterStore *> &ranks,
                 ExpertNames experts) {
  if (static_cast<int64_t>(ranks.size()) != bundle.rankCount())
    invalid("saveWeights: " + std::to_string(ranks.size()) +
            " parameter stores for bundle '" + bundle.name() + "' of " +
            std::to_string(bundle.rankCount()) + " ranks");
  const std::vector<Parameter> &parameters = bundle.parameters();
  for (const host::ParameterStore *store : ranks)
    if (store->size() != parameters.size() ||
        (store->size() && &store->info(0) != &parameters[0]))
      invalid("saveWeights: a parameter store was made for another bundle "
              "than '" +
              bundle.name() + "'");
  writeWholeWeights(path, bundle, experts, [&](int64_t rank, size_t i) {
    return shardValues(*ranks[static_cast<size_t>(rank)], i);
  });
}

void saveWeights(const std::string &path, const Bundle &bundle,
                 comm::RankContext *rank, const host::ParameterStore &own,
                 ExpertNames experts) {
  if (!rank || bundle.rankCount() == 1) {
    saveWeights(path, bundle, own, experts);
    return;
  }
  checkStore("saveWeights", bundle, own, /*whole=*/false);
  comm::Communicator &world = rank->world();
  std::vector<std::vector<ShardOwner>> owners = shardOwners(bundle);
  const std::vector<Parameter> &parameters = bundle.parameters();
  auto label = [&](size_t i) {
    return "--save-weights: the shards of " + parameters[i].name;
  };
  if (world.rank() != 0) {
    // In the order rank 0 receives them: by parameter, then by rank.
    for (size_t i = 0; i < parameters.size(); ++i)
      if (std::any_of(owners[i].begin(), owners[i].end(),
                      [&](const ShardOwner &owner) {
                        return owner.rank == world.rank();
                      })) {
        std::vector<float> values = shardValues(own, i);
        world.send<float>(values.data(), static_cast<int64_t>(values.size()), 0,
                          {label(i), -1});
      }
    world.barrier({"--save-weights written", -1});
    return;
  }
  try {
    writeWholeWeights(path, bundle, experts, [&](int64_t from, size_t i) {
      if (from == 0)
        return shardValues(own, i);
      std::vector<float> values(
          static_cast<size_t>(parameters[i].localType.numElements));
      world.recv<float>(values.data(), static_cast<int64_t>(values.size()),
                        static_cast<int>(from), {label(i), -1});
      return values;
    });
  } catch (...) {
    world.abort("rank 0 could not write --save-weights");
    throw;
  }
  world.barrier({"--save-weights written", -1});
}

} // namespace mtrt::train
