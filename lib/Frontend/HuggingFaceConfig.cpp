//===- HuggingFaceConfig.cpp - Reading a Hugging Face config.json ---------===//
//
// Maps GPT2Config and LlamaConfig onto Megatron-LM's arguments. Values go
// through the same key setters as the YAML format, so a field is checked
// exactly as the key it becomes. Fields this reader does not know are
// ignored (config.json files carry tokenizer ids, generation settings and
// more); settings that would change the model in a way it cannot represent
// are rejected rather than silently dropped.
//
//===----------------------------------------------------------------------===//

#include "ConfigKeys.h"

#include "llvm/Support/FormatVariadic.h"
#include "llvm/Support/JSON.h"
#include "llvm/Support/Path.h"

#include <cmath>

using namespace llvm;
using namespace megatron;
using namespace megatron::config;

namespace {

class HuggingFaceReader {
public:
  HuggingFaceReader(StringRef contents, StringRef fileName,
                    const json::Object &object)
      : contents(contents), fileName(fileName), object(object) {}

  Expected<CompileConfig> read();

private:
  Error readGpt2();
  Error readLlama();

  /// "file:line:column" of the field's name in the text, or the file alone.
  /// llvm::json keeps no positions, so the field is found in the text; the
  /// first `"field":` is the top-level one in every config.json seen.
  std::string location(StringRef field) const;
  Error fieldError(StringRef field, const Twine &message) const {
    return createStringError(inconvertibleErrorCode(),
                             location(field) + ": " + field + ": " + message);
  }
  /// The field, or null when absent or JSON null (HF writes null for unset).
  const json::Value *get(StringRef field) const {
    const json::Value *value = object.get(field);
    return value && value->kind() != json::Value::Null ? value : nullptr;
  }
  /// Sets `key` from `field` through the key's own setter. A missing
  /// optional field leaves the key's default.
  Error map(StringRef field, StringRef key, bool required = false);
  Expected<std::optional<bool>> getBool(StringRef field) const;
  Expected<std::optional<std::string>> getString(StringRef field) const;
  Error mustNotBe(StringRef field, bool unsupported, StringRef why) const;

  StringRef contents;
  StringRef fileName;
  const json::Object &object;
  CompileConfig config;
  /// "GPT2Config" or "LlamaConfig", for messages.
  StringRef configClass;
};

} // namespace

std::string HuggingFaceReader::location(StringRef field) const {
  std::string quoted = ("\"" + field + "\"").str();
  for (size_t at = contents.find(quoted); at != StringRef::npos;
       at = contents.find(quoted, at + 1)) {
    StringRef after = contents.drop_front(at + quoted.size()).ltrim();
    if (!after.starts_with(":"))
      continue;
    StringRef before = contents.take_front(at);
    size_t line = before.count('\n') + 1;
    size_t lineStart = before.rfind('\n');
    size_t column = lineStart == StringRef::npos ? at + 1 : at - lineStart;
    return (fileName + ":" + Twine(line) + ":" + Twine(column)).str();
  }
  return fileName.str();
}

/// The value as a key setter reads it: numbers and booleans in their JSON
/// spelling, strings unquoted.
static std::string asText(const json::Value &value) {
  if (std::optional<StringRef> s = value.getAsString())
    return s->str();
  return formatv("{0}", value).str();
}

Error HuggingFaceReader::map(StringRef field, StringRef key, bool required) {
  const KeyDef *def = findKey(key);
  const json::Value *value = get(field);
  if (!value) {
    if (required)
      return createStringError(
          inconvertibleErrorCode(),
          fileName + ": required field '" + field + "' is missing (it gives " +
              key + "); every " + configClass + " config.json has it");
    return Error::success();
  }
  // A string where a number goes is a type error even if it reads as one.
  bool isNumberKey = def->info.kind == ConfigValueKind::Integer ||
                     def->info.kind == ConfigValueKind::Number;
  bool typeOk = isNumberKey ? value->kind() == json::Value::Number
                            : value->kind() != json::Value::Object &&
                                  value->kind() != json::Value::Array;
  std::string text = formatv("{0}", *value).str();
  if (typeOk) {
    text = asText(*value);
    // JSON's 12.0 is the integer 12; anything else fractional is not.
    if (def->info.kind == ConfigValueKind::Integer) {
      double number = *value->getAsNumber();
      if (std::isfinite(number) && std::trunc(number) == number &&
          std::fabs(number) < 9.2e18)
        text = std::to_string(static_cast<int64_t>(number));
    }
    if (std::optional<std::string> problem = def->set(config, text))
      return fieldError(field, *problem);
  } else {
    StringRef what = def->info.kind == ConfigValueKind::Integer
                         ? "a positive integer"
                         : "a number";
    if (!isNumberKey)
      what = "a single value";
    return fieldError(field, expected(what, text));
  }
  config.keyOrigins[key] = location(field);
  return Error::success();
}

Expected<std::optional<bool>>
HuggingFaceReader::getBool(StringRef field) const {
  const json::Value *value = get(field);
  if (!value)
    return std::nullopt;
  if (std::optional<bool> b = value->getAsBoolean())
    return *b;
  return fieldError(field,
                    expected("true or false", formatv("{0}", *value).str()));
}

Expected<std::optional<std::string>>
HuggingFaceReader::getString(StringRef field) const {
  const json::Value *value = get(field);
  if (!value)
    return std::nullopt;
  if (std::optional<StringRef> s = value->getAsString())
    return s->str();
  return fieldError(field, expected("a string", formatv("{0}", *value).str()));
}

Error HuggingFaceReader::mustNotBe(StringRef field, bool unsupported,
                                   StringRef why) const {
  if (!unsupported)
    return Error::success();
  const json::Value *value = get(field);
  return fieldError(field, "unsupported value " +
                               (value ? formatv("{0}", *value).str()
                                      : std::string("(absent)")) +
                               ": " + why);
}

Error HuggingFaceReader::readGpt2() {
  // GPT-2 as Megatron-LM trains it: pre-LayerNorm, learned positions, biases,
  // tied embeddings, GeLU. Keep HF's vocabulary; Megatron pads it.
  ModelConfig &m = config.model;
  m.normalization = Normalization::LayerNorm;
  m.positionEmbeddingType = PositionEmbedding::LearnedAbsolute;
  m.activation = Activation::Gelu;
  m.addBiasLinear = true;
  m.openaiGelu = true; // GPT2Config's default activation is gelu_new

  for (auto [field, key] :
       {std::pair<StringRef, StringRef>{"n_layer", "num_layers"},
        {"n_embd", "hidden_size"},
        {"n_head", "num_attention_heads"},
        {"vocab_size", "vocab_size"},
        {"n_positions", "max_position_embeddings"}})
    if (Error err = map(field, key, /*required=*/true))
      return err;
  // n_ctx is GPT-2's original context length; newer configs drop it.
  if (Error err = map(get("n_ctx") ? "n_ctx" : "n_positions", "seq_length"))
    return err;
  for (auto [field, key] :
       {std::pair<StringRef, StringRef>{"n_inner", "ffn_hidden_size"},
        {"layer_norm_epsilon", "norm_epsilon"},
        {"initializer_range", "init_method_std"},
        // Megatron-LM's hidden_dropout also covers the embeddings, so
        // embd_pdrop has no key of its own; resid_pdrop is the one kept.
        {"resid_pdrop", "hidden_dropout"},
        {"attn_pdrop", "attention_dropout"}})
    if (Error err = map(field, key))
      return err;

  Expected<std::optional<std::string>> act = getString("activation_function");
  if (!act)
    return act.takeError();
  if (*act) {
    StringRef name = **act;
    if (name == "gelu_new" || name == "gelu_pytorch_tanh" ||
        name == "gelu_fast") {
      m.openaiGelu = true;
    } else if (name == "gelu") {
      m.openaiGelu = false;
    } else {
      return fieldError("activation_function",
                        "unsupported value '" + name +
                            "'; supported: gelu_new, gelu_pytorch_tanh, "
                            "gelu_fast (tanh GeLU, openai_gelu) and gelu "
                            "(exact GeLU)");
    }
    config.keyOrigins["openai_gelu"] = location("activation_function");
  }

  Expected<std::optional<bool>> tie = getBool("tie_word_embeddings");
  if (!tie)
    return tie.takeError();
  m.untieEmbeddingsAndOutputWeights = *tie && !**tie;

  for (StringRef field : {"scale_attn_by_inverse_layer_idx",
                          "add_cross_attention", "scale_attn_weights"}) {
    Expected<std::optional<bool>> flag = getBool(field);
    if (!flag)
      return flag.takeError();
    bool unsupported =
        field == "scale_attn_weights" ? (*flag && !**flag) : (*flag && **flag);
    if (Error err = mustNotBe(field, unsupported,
                              "the GPT-2 model here is Megatron-LM's: "
                              "decoder-only, attention scaled by "
                              "1/sqrt(head dim)"))
      return err;
  }
  return Error::success();
}

Error HuggingFaceReader::readLlama() {
  // Llama as Megatron-LM trains it: RMSNorm, RoPE, SwiGLU, no biases,
  // untied output layer, no dropout.
  ModelConfig &m = config.model;
  m.normalization = Normalization::RMSNorm;
  m.positionEmbeddingType = PositionEmbedding::Rope;
  m.activation = Activation::Swiglu;
  m.addBiasLinear = false;
  m.hiddenDropout = 0;
  m.attentionDropout = 0;
  m.normEpsilon = 1e-6; // LlamaConfig's rms_norm_eps default

  for (auto [field, key] :
       {std::pair<StringRef, StringRef>{"num_hidden_layers", "num_layers"},
        {"hidden_size", "hidden_size"},
        {"num_attention_heads", "num_attention_heads"},
        {"intermediate_size", "ffn_hidden_size"},
        {"vocab_size", "vocab_size"},
        {"max_position_embeddings", "max_position_embeddings"},
        {"max_position_embeddings", "seq_length"}})
    if (Error err = map(field, key, /*required=*/true))
      return err;
  for (auto [field, key] : {std::pair<StringRef, StringRef>{
                                "num_key_value_heads", "num_query_groups"},
                            {"rms_norm_eps", "norm_epsilon"},
                            {"rope_theta", "rotary_base"},
                            {"initializer_range", "init_method_std"},
                            {"attention_dropout", "attention_dropout"}})
    if (Error err = map(field, key))
      return err;

  Expected<std::optional<bool>> tie = getBool("tie_word_embeddings");
  if (!tie)
    return tie.takeError();
  m.untieEmbeddingsAndOutputWeights = !(*tie && **tie);

  Expected<std::optional<std::string>> act = getString("hidden_act");
  if (!act)
    return act.takeError();
  if (Error err = mustNotBe("hidden_act", *act && **act != "silu",
                            "LlamaConfig is read as SwiGLU, which needs "
                            "hidden_act \"silu\""))
    return err;

  Expected<std::optional<bool>> attentionBias = getBool("attention_bias");
  if (!attentionBias)
    return attentionBias.takeError();
  Expected<std::optional<bool>> mlpBias = getBool("mlp_bias");
  if (!mlpBias)
    return mlpBias.takeError();
  bool attnOn = *attentionBias && **attentionBias;
  bool mlpOn = *mlpBias && **mlpBias;
  if (attnOn != mlpOn)
    return fieldError(attnOn ? "attention_bias" : "mlp_bias",
                      "true while " +
                          Twine(attnOn ? "mlp_bias" : "attention_bias") +
                          " is false: add_bias_linear puts biases on every "
                          "linear layer or on none; set both alike");
  m.addBiasLinear = attnOn;

  if (Error err = mustNotBe("rope_scaling", get("rope_scaling") != nullptr,
                            "RoPE scaling is not supported; remove it to "
                            "train with plain RoPE at rope_theta"))
    return err;
  if (const json::Value *headDim = get("head_dim")) {
    std::optional<double> dim = headDim->getAsNumber();
    int64_t implied = m.hiddenSize / m.numAttentionHeads;
    if (Error err = mustNotBe("head_dim", !dim || *dim != double(implied),
                              ("the head dimension here is hidden_size / "
                               "num_attention_heads = " +
                               Twine(implied))
                                  .str()))
      return err;
  }
  return Error::success();
}

/// The model's name: HF's own record of it, else the directory a
/// config.json sits in (the hub's layout), else the file's name.
static std::string modelName(const json::Object &object, StringRef fileName,
                             StringRef modelType) {
  if (std::optional<StringRef> recorded = object.getString("_name_or_path")) {
    StringRef name = sys::path::filename(recorded->rtrim("/"));
    if (!name.empty())
      return name.str();
  }
  if (sys::path::filename(fileName) == "config.json") {
    StringRef dir = sys::path::filename(sys::path::parent_path(fileName));
    if (!dir.empty() && dir != "." && dir != "..")
      return dir.str();
    return modelType.str();
  }
  StringRef stem = sys::path::stem(fileName);
  for (StringRef suffix : {"-config", "_config", ".config"})
    if (stem.size() > suffix.size() && stem.consume_back(suffix))
      break;
  return stem.empty() ? modelType.str() : stem.str();
}

Expected<CompileConfig> HuggingFaceReader::read() {
  const json::Value *type = get("model_type");
  std::optional<StringRef> modelType =
      type ? type->getAsString() : std::nullopt;
  StringRef supported = "supported: 'gpt2' (GPT2Config) and 'llama' "
                        "(LlamaConfig)";
  if (!modelType)
    return createStringError(
        inconvertibleErrorCode(),
        location("model_type") + ": " +
            (type ? "model_type must be a string; "
                  : "no 'model_type' field, so this is not a Hugging Face "
                    "config.json that can be read; ") +
            supported);

  if (*modelType != "gpt2" && *modelType != "llama")
    return fieldError("model_type", "unsupported model_type '" + *modelType +
                                        "'; " + supported);
  bool isGpt2 = *modelType == "gpt2";
  configClass = isGpt2 ? "GPT2Config" : "LlamaConfig";
  Error err = isGpt2 ? readGpt2() : readLlama();
  if (err)
    return std::move(err);

  config.model.name = modelName(object, fileName, *modelType);
  config.sourcePath = fileName.str();
  return std::move(config);
}

Expected<CompileConfig> config::parseHuggingFaceConfig(StringRef contents,
                                                       StringRef fileName) {
  Expected<json::Value> parsed = json::parse(contents);
  if (!parsed) {
    // ParseError prints "[line:column, byte=N]: message"; restate it in the
    // file:line:column form every other error here uses.
    std::string message = toString(parsed.takeError());
    StringRef text = message;
    std::string where = fileName.str();
    if (text.consume_front("[")) {
      auto [position, rest] = text.split("]: ");
      auto [line, column] = position.split(", ").first.split(':');
      where += ":" + line.str() + ":" + column.str();
      text = rest;
    }
    return createStringError(inconvertibleErrorCode(),
                             where + ": invalid JSON: " + text);
  }
  const json::Object *object = parsed->getAsObject();
  if (!object)
    return createStringError(inconvertibleErrorCode(),
                             fileName +
                                 ": expected a JSON object (a Hugging "
                                 "Face config.json), got " +
                                 formatv("{0}", *parsed).str().substr(0, 40));
  return HuggingFaceReader(contents, fileName, *object).read();
}
