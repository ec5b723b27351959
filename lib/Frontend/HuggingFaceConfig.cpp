//===- HuggingFaceConfig.cpp - Reading a Hugging Face config.json ---------===//
//
// Maps GPT2Config, LlamaConfig, MistralConfig, Qwen2Config, Qwen3Config,
// MixtralConfig and Qwen3MoeConfig (as transformers 4 and 5 write them) onto Megatron-LM's arguments. Values
// go through the same key setters as the YAML format, so a field is checked
// exactly as the key it becomes. Every field is used, listed as irrelevant to
// training (token ids, generation settings, the storage dtype), or refused:
// training silently a model other than the one the file describes is the
// failure to avoid.
// models/hf/README.md lists each family's fields and what is done with them.
//
//===----------------------------------------------------------------------===//

#include "ConfigKeys.h"

#include "llvm/ADT/STLExtras.h"
#include "llvm/ADT/StringSet.h"
#include "llvm/Support/Format.h"
#include "llvm/Support/FormatVariadic.h"
#include "llvm/Support/JSON.h"
#include "llvm/Support/Path.h"

#include <cmath>

using namespace llvm;
using namespace megatron;
using namespace megatron::config;

namespace {

/// The decoder-only families read here. Each has its own set of fields; a
/// field of another family is as unknown as a misspelt one.
enum class Family { Gpt2, Llama, Mistral, Qwen2, Qwen3, Mixtral, Qwen3Moe };

/// Fields of every PretrainedConfig (transformers 4 and 5) that do not change
/// the model a causal language model trains: bookkeeping, token ids (the
/// tokenizer's business), inference switches, generation settings that
/// transformers 4 wrote into config.json, and the checkpoint's storage dtype
/// (training precision is --bf16 / --fp16).
const StringLiteral kIrrelevantCommon[] = {
    "_name_or_path", "_commit_hash", "_attn_implementation",
    "_attn_implementation_autoset", "architectures", "transformers_version",
    "torch_dtype", "dtype", "use_bfloat16", "finetuning_task", "id2label",
    "label2id", "num_labels", "problem_type", "tokenizer_class", "prefix",
    "task_specific_params", "bos_token_id", "eos_token_id", "pad_token_id",
    "sep_token_id", "decoder_start_token_id", "use_cache", "return_dict",
    "output_hidden_states", "output_attentions", "torchscript",
    "tf_legacy_loss", "output_scores", "return_dict_in_generate", "is_decoder",
    "tie_encoder_decoder", "cross_attention_hidden_size",
    "chunk_size_feed_forward", "max_length", "min_length", "do_sample",
    "early_stopping", "num_beams", "num_beam_groups", "diversity_penalty",
    "temperature", "top_k", "top_p", "typical_p", "repetition_penalty",
    "length_penalty", "no_repeat_ngram_size", "encoder_no_repeat_ngram_size",
    "bad_words_ids", "num_return_sequences", "forced_bos_token_id",
    "forced_eos_token_id", "remove_invalid_values",
    "exponential_decay_length_penalty", "suppress_tokens",
    "begin_suppress_tokens"};

/// Per family, fields of its config class that do not change the model.
/// GPT-2's summary_* configure GPT2DoubleHeadsModel's classification head;
/// reorder_and_upcast_attn only computes attention in fp32. Llama's
/// pretraining_tp splits its matmuls into slices of the same product.
const StringLiteral kIrrelevantGpt2[] = {
    "summary_type", "summary_use_proj", "summary_activation",
    "summary_proj_to_labels", "summary_first_dropout",
    "reorder_and_upcast_attn"};
const StringLiteral kIrrelevantLlama[] = {"pretraining_tp"};

class HuggingFaceReader {
public:
  HuggingFaceReader(StringRef contents, StringRef fileName,
                    const json::Object &object)
      : contents(contents), fileName(fileName), object(object) {}

  Expected<CompileConfig> read();

private:
  Error readGpt2();
  Error readLlamaFamily();
  Error readRope();
  Error readRopeDict(StringRef field, const json::Object &dict,
                     bool transformers5);
  /// rope_type yarn's fields, as transformers' _compute_yarn_parameters
  /// reads them; marks each in `read`.
  Error readYarn(StringRef field, const json::Object &dict, StringRef typeKey,
                 StringSet<> &read);
  /// `field.sub` of `dict` (a rope dict) as a positive finite number, or
  /// nullopt when absent or null; marks `sub` in `read`.
  Expected<std::optional<double>> positiveNumber(StringRef field,
                                                 const json::Object &dict,
                                                 StringRef sub,
                                                 StringSet<> &read) const;
  Error readSlidingWindow();
  /// Mixtral's and Qwen3-MoE's experts and router (docs/MoE.md).
  Error readExperts();
  Error readCommonChecks();
  /// Refuses every field no reader consumed and no table lists as
  /// irrelevant: an unknown field may change the model.
  Error refuseUnknownFields() const;

  /// The offset of `"field":` in the text at or after `from`, or npos.
  /// llvm::json keeps no positions, so the field is found in the text; the
  /// first `"field":` is the top-level one in every config.json seen, and a
  /// nested one is looked for after its parent.
  size_t offsetOf(StringRef field, size_t from = 0) const;
  /// "file:line:column" of the field's name in the text, or the file alone.
  std::string location(StringRef field, size_t from = 0) const;
  Error fieldError(StringRef field, const Twine &message) const {
    return createStringError(inconvertibleErrorCode(),
                             location(field) + ": " + field + ": " + message);
  }
  /// An error at `parent.sub` (a field of a nested object such as
  /// rope_parameters), located at the parent when `sub` is missing.
  Error subFieldError(StringRef parent, StringRef sub,
                      const Twine &message) const {
    size_t from = offsetOf(parent);
    std::string where = offsetOf(sub, from) == StringRef::npos
                            ? location(parent)
                            : location(sub, from);
    return createStringError(inconvertibleErrorCode(), where + ": " + parent +
                                                           "." + sub + ": " +
                                                           message);
  }
  /// The field, or null when absent or JSON null (HF writes null for unset).
  /// Marks it read: a field asked for is used or checked.
  const json::Value *get(StringRef field) const {
    consumed.insert(field);
    const json::Value *value = object.get(field);
    return value && value->kind() != json::Value::Null ? value : nullptr;
  }
  /// Sets `key` from `field` through the key's own setter. A missing
  /// optional field leaves the key's default.
  Error map(StringRef field, StringRef key, bool required = false);
  Expected<std::optional<bool>> getBool(StringRef field) const;
  Expected<std::optional<std::string>> getString(StringRef field) const;
  Error mustNotBe(StringRef field, bool unsupported, StringRef why) const;
  /// A boolean field that changes the model when `bad`; absent is fine.
  Error mustNotBeBool(StringRef field, bool bad, StringRef why) const;

  StringRef contents;
  StringRef fileName;
  const json::Object &object;
  CompileConfig config;
  Family family = Family::Gpt2;
  /// "GPT2Config", "LlamaConfig", ..., for messages.
  StringRef configClass;
  mutable StringSet<> consumed;
};

} // namespace

/// A number as people write it: 0.1, 500000, 1e-05.
static std::string show(double value) {
  return formatv("{0}", format("%g", value)).str();
}

static std::string show(const json::Value &value) {
  std::string text = formatv("{0}", value).str();
  if (text.size() > 80)
    text = text.substr(0, 77) + "...";
  return text;
}

size_t HuggingFaceReader::offsetOf(StringRef field, size_t from) const {
  if (from == StringRef::npos)
    from = 0;
  std::string quoted = ("\"" + field + "\"").str();
  for (size_t at = contents.find(quoted, from); at != StringRef::npos;
       at = contents.find(quoted, at + 1)) {
    StringRef after = contents.drop_front(at + quoted.size()).ltrim();
    if (after.starts_with(":"))
      return at;
  }
  return StringRef::npos;
}

std::string HuggingFaceReader::location(StringRef field, size_t from) const {
  size_t at = offsetOf(field, from);
  if (at == StringRef::npos)
    return fileName.str();
  StringRef before = contents.take_front(at);
  size_t line = before.count('\n') + 1;
  size_t lineStart = before.rfind('\n');
  size_t column = lineStart == StringRef::npos ? at + 1 : at - lineStart;
  return (fileName + ":" + Twine(line) + ":" + Twine(column)).str();
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
                               (value ? show(*value)
                                      : std::string("(absent)")) +
                               ": " + why);
}

Error HuggingFaceReader::mustNotBeBool(StringRef field, bool bad,
                                       StringRef why) const {
  Expected<std::optional<bool>> flag = getBool(field);
  if (!flag)
    return flag.takeError();
  return mustNotBe(field, *flag && **flag == bad, why);
}

Error HuggingFaceReader::readCommonChecks() {
  // PretrainedConfig fields that would make a different model than a
  // decoder-only causal LM with every head.
  if (Error err = mustNotBeBool("is_encoder_decoder", true,
                                "the models here are decoder-only; use a "
                                "decoder-only config.json"))
    return err;
  if (Error err = mustNotBeBool("add_cross_attention", true,
                                "the models here are decoder-only, without "
                                "cross-attention; set it to false"))
    return err;
  if (const json::Value *pruned = get("pruned_heads")) {
    const json::Object *heads = pruned->getAsObject();
    if (Error err = mustNotBe("pruned_heads", !heads || !heads->empty(),
                              "every layer here has all num_attention_heads "
                              "heads; use the unpruned model's config.json"))
      return err;
  }
  if (Error err = mustNotBe("quantization_config",
                            get("quantization_config") != nullptr,
                            "training here is in fp32, bf16 or fp16 on "
                            "unquantized weights; use the unquantized "
                            "model's config.json"))
    return err;
  return Error::success();
}

Error HuggingFaceReader::refuseUnknownFields() const {
  StringSet<> irrelevant;
  for (StringRef field : kIrrelevantCommon)
    irrelevant.insert(field);
  if (family == Family::Gpt2)
    for (StringRef field : kIrrelevantGpt2)
      irrelevant.insert(field);
  if (family == Family::Llama)
    for (StringRef field : kIrrelevantLlama)
      irrelevant.insert(field);
  // In the order of the text, so the first unknown field is the one named.
  std::vector<std::pair<size_t, StringRef>> unknown;
  for (const auto &entry : object) {
    StringRef field = entry.first;
    if (!consumed.contains(field) && !irrelevant.contains(field))
      unknown.push_back({offsetOf(field), field});
  }
  if (unknown.empty())
    return Error::success();
  llvm::sort(unknown);
  StringRef field = unknown.front().second;
  return fieldError(field, "unknown " + configClass + " field (value " +
                               show(*object.get(field)) +
                               "): it may change the model, so it is refused "
                               "rather than ignored; remove it if it does not "
                               "(models/hf/README.md lists every field read)");
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
        {"resid_pdrop", "hidden_dropout"},
        {"attn_pdrop", "attention_dropout"}})
    if (Error err = map(field, key))
      return err;
  // Megatron-LM's hidden_dropout also covers the embeddings: embd_pdrop has
  // no key of its own and must agree with resid_pdrop.
  if (const json::Value *embd = get("embd_pdrop")) {
    std::optional<double> p = embd->getAsNumber();
    if (!p)
      return fieldError("embd_pdrop", expected("a number", show(*embd)));
    if (*p != m.hiddenDropout)
      return fieldError(
          "embd_pdrop",
          "unsupported value " + show(*embd) + ": the dropout after the "
              "embeddings is hidden_dropout, which resid_pdrop sets to " +
              show(m.hiddenDropout) +
              "; set embd_pdrop and resid_pdrop alike");
  }

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

  StringRef why = "the GPT-2 model here is Megatron-LM's: attention scaled "
                  "by 1/sqrt(head dim) in every layer";
  if (Error err = mustNotBeBool("scale_attn_by_inverse_layer_idx", true, why))
    return err;
  return mustNotBeBool("scale_attn_weights", false, why);
}

Error HuggingFaceReader::readLlamaFamily() {
  // Llama as Megatron-LM trains it: RMSNorm, RoPE, SwiGLU, no biases,
  // untied output layer, no dropout. Mistral, Qwen2 and Qwen3 share it and
  // differ in the fields below.
  ModelConfig &m = config.model;
  m.normalization = Normalization::RMSNorm;
  m.positionEmbeddingType = PositionEmbedding::Rope;
  m.activation = Activation::Swiglu;
  m.addBiasLinear = false;
  m.hiddenDropout = 0;
  m.attentionDropout = 0;
  m.normEpsilon = 1e-6; // rms_norm_eps's default in each of these classes

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
                            {"initializer_range", "init_method_std"},
                            {"attention_dropout", "attention_dropout"}})
    if (Error err = map(field, key))
      return err;
  if (Error err = readRope())
    return err;

  Expected<std::optional<bool>> tie = getBool("tie_word_embeddings");
  if (!tie)
    return tie.takeError();
  m.untieEmbeddingsAndOutputWeights = !(*tie && **tie);

  Expected<std::optional<std::string>> act = getString("hidden_act");
  if (!act)
    return act.takeError();
  if (Error err = mustNotBe("hidden_act", *act && **act != "silu",
                            (configClass + " is read as SwiGLU, which needs "
                                           "hidden_act \"silu\"")
                                .str()))
    return err;

  // LlamaConfig has attention_bias and mlp_bias; Qwen3Config attention_bias
  // only; MistralConfig and Qwen2Config neither.
  bool hasAttentionBias = family == Family::Llama ||
                          family == Family::Qwen3 ||
                          family == Family::Qwen3Moe;
  bool hasMlpBias = family == Family::Llama;
  bool attnOn = false, mlpOn = false;
  if (hasAttentionBias) {
    Expected<std::optional<bool>> attentionBias = getBool("attention_bias");
    if (!attentionBias)
      return attentionBias.takeError();
    attnOn = *attentionBias && **attentionBias;
  }
  if (hasMlpBias) {
    Expected<std::optional<bool>> mlpBias = getBool("mlp_bias");
    if (!mlpBias)
      return mlpBias.takeError();
    mlpOn = *mlpBias && **mlpBias;
  }
  if (attnOn != mlpOn && !hasMlpBias)
    return fieldError("attention_bias",
                      "true: " + configClass +
                          " has no mlp_bias, so this puts biases on the "
                          "attention's projections only, and add_bias_linear "
                          "puts them on every linear layer or on none; set it "
                          "to false");
  if (attnOn != mlpOn) {
    return fieldError(attnOn ? "attention_bias" : "mlp_bias",
                      "true while " +
                          Twine(attnOn ? "mlp_bias" : "attention_bias") +
                          " is false: add_bias_linear puts biases on every "
                          "linear layer or on none; set both alike");
  }
  m.addBiasLinear = attnOn;
  // Qwen2Attention puts biases on q_proj, k_proj and v_proj always, and on
  // o_proj never: Megatron-LM's --add-qkv-bias.
  if (family == Family::Qwen2) {
    m.addQkvBias = true;
    config.keyOrigins["add_qkv_bias"] = location("model_type");
  }
  // Qwen3Attention normalizes each head's queries and keys (q_norm, k_norm,
  // RMSNorm over head_dim with rms_norm_eps): Megatron-LM's --qk-layernorm.
  if (family == Family::Qwen3 || family == Family::Qwen3Moe) {
    m.qkLayernorm = true;
    config.keyOrigins["qk_layernorm"] = location("model_type");
  }

  // Qwen2Config has no head_dim; the others give it explicitly (Megatron-LM's
  // --kv-channels), and transformers derives it as hidden_size /
  // num_attention_heads when it is null.
  if (family != Family::Qwen2)
    if (Error err = map("head_dim", "kv_channels"))
      return err;
  if (family != Family::Llama)
    if (Error err = readSlidingWindow())
      return err;
  if (family == Family::Mixtral || family == Family::Qwen3Moe)
    return readExperts();
  return Error::success();
}

Error HuggingFaceReader::readExperts() {
  // MixtralSparseMoeBlock and Qwen3MoeSparseMoeBlock: a bias-free router,
  // the softmax over every expert, the top k, their weights renormalized
  // (Mixtral always; Qwen3-MoE under norm_topk_prob), SwiGLU experts, no
  // shared expert. Megatron-LM's softmax router takes the softmax over the
  // chosen logits, which is the renormalized top k; pre-softmax without
  // renormalization is Qwen3-MoE's norm_topk_prob false.
  bool mixtral = family == Family::Mixtral;
  // Qwen3MoeConfig names it num_experts in transformers 4 and
  // num_local_experts (as Mixtral) in transformers 5.
  StringRef expertsField =
      mixtral || object.get("num_local_experts") ? "num_local_experts"
                                                 : "num_experts";
  if (Error err = map(expertsField, "num_experts", /*required=*/true))
    return err;
  if (Error err = map("num_experts_per_tok", "moe_router_topk",
                      /*required=*/true))
    return err;
  if (mixtral) {
    // Every Mixtral layer is an MoE layer of intermediate_size experts.
    if (Error err = map("intermediate_size", "moe_ffn_hidden_size"))
      return err;
  } else {
    if (Error err = map("moe_intermediate_size", "moe_ffn_hidden_size",
                        /*required=*/true))
      return err;
    Expected<std::optional<bool>> norm = getBool("norm_topk_prob");
    if (!norm)
      return norm.takeError();
    // Qwen3MoeConfig's default is false.
    if (!(*norm && **norm)) {
      config.moe.routerPreSoftmax = true;
      config.keyOrigins["moe_router_pre_softmax"] = location("norm_topk_prob");
    }
    // Qwen3MoeDecoderLayer: layer i has experts unless it is listed in
    // mlp_only_layers, and when (i + 1) % decoder_sparse_step == 0.
    int64_t step = 1;
    if (const json::Value *v = get("decoder_sparse_step")) {
      std::optional<int64_t> n = v->getAsInteger();
      if (!n || *n <= 0)
        return fieldError("decoder_sparse_step",
                          expected("a positive integer", show(*v)));
      step = *n;
    }
    std::vector<int64_t> pattern(config.model.numLayers, 0);
    for (int64_t i = 0; i < config.model.numLayers; ++i)
      pattern[i] = (i + 1) % step == 0;
    if (const json::Value *v = get("mlp_only_layers")) {
      const json::Array *list = v->getAsArray();
      if (!list)
        return fieldError("mlp_only_layers", expected("a list", show(*v)));
      for (const json::Value &item : *list) {
        std::optional<int64_t> i = item.getAsInteger();
        if (!i || *i < 0 || *i >= config.model.numLayers)
          return fieldError("mlp_only_layers",
                            "layer " + show(item) +
                                " is not one of the model's num_hidden_layers "
                                "layers (0 to " +
                                show(config.model.numLayers - 1) + ")");
        pattern[*i] = 0;
      }
    }
    if (!llvm::all_of(pattern, [](int64_t bit) { return bit == 1; })) {
      config.moe.layerPattern = pattern;
      config.keyOrigins["moe_layer_freq"] = location("decoder_sparse_step");
    }
  }
  // The auxiliary loss: transformers adds router_aux_loss_coef times its
  // load_balancing_loss_func only with output_router_logits, and that loss
  // is not Megatron-LM's (docs/MoE.md, "The losses"). Training with it off
  // is the model the file describes; --moe-aux-loss-coeff adds Megatron-LM's.
  get("router_aux_loss_coef");
  if (Error err = mustNotBeBool(
          "output_router_logits", true,
          "transformers' load-balancing loss (over every layer's tokens at "
          "once) is not Megatron-LM's per-layer loss; set it to false and "
          "pass --moe-aux-loss-coeff for Megatron-LM's (docs/MoE.md)"))
    return err;
  if (const json::Value *jitter = get("router_jitter_noise")) {
    std::optional<double> eps = jitter->getAsNumber();
    if (!eps || *eps != 0)
      return fieldError("router_jitter_noise",
                        "unsupported value " + show(*jitter) +
                            ": the router here takes no multiplicative "
                            "jitter; set it to 0");
  }
  return Error::success();
}

Error HuggingFaceReader::readSlidingWindow() {
  ModelConfig &m = config.model;
  // Mistral applies sliding_window to every layer when set. Qwen2 and Qwen3
  // only with use_sliding_window (to the layers from max_window_layers on),
  // or to the layers layer_types marks "sliding_attention".
  // Mixtral's decoder layer is Mistral's.
  bool applies = family == Family::Mistral || family == Family::Mixtral;
  if (!applies) {
    Expected<std::optional<bool>> use = getBool("use_sliding_window");
    if (!use)
      return use.takeError();
    applies = *use && **use;
    get("max_window_layers");
    if (const json::Value *types = get("layer_types")) {
      const json::Array *list = types->getAsArray();
      if (!list)
        return fieldError("layer_types", expected("a list", show(*types)));
      for (const json::Value &type : *list) {
        std::optional<StringRef> name = type.getAsString();
        if (name == "sliding_attention")
          applies = true;
        else if (name != "full_attention")
          return fieldError("layer_types",
                            "unsupported layer type " + show(type) +
                                "; supported: full_attention and "
                                "sliding_attention");
      }
    }
    if (Error err = mustNotBeBool("use_mrope", true,
                                  "multimodal RoPE is Qwen2-VL's; the text "
                                  "model here uses plain RoPE"))
      return err;
  }
  const json::Value *window = get("sliding_window");
  if (!window || !applies)
    return Error::success();
  std::optional<int64_t> size = window->getAsInteger();
  if (!size || *size <= 0)
    return fieldError("sliding_window",
                      expected("a positive integer or null", show(*window)));
  m.slidingWindow = *size;
  config.keyOrigins["sliding_window"] = location("sliding_window");
  return Error::success();
}

Error HuggingFaceReader::readRope() {
  ModelConfig &m = config.model;
  // transformers 4: rope_theta at the top, rope_scaling a dict or null.
  // transformers 5: one rope_parameters dict with rope_theta and rope_type.
  const json::Value *parameters = get("rope_parameters");
  const json::Value *scaling = get("rope_scaling");
  if (Error err = map("rope_theta", "rotary_base"))
    return err;
  double topTheta = m.rotaryBase;
  bool hasTopTheta = get("rope_theta") != nullptr;

  if (parameters) {
    const json::Object *dict = parameters->getAsObject();
    if (!dict)
      return fieldError("rope_parameters",
                        expected("an object", show(*parameters)));
    if (scaling)
      return fieldError("rope_scaling",
                        "given with rope_parameters, which holds the scaling "
                        "in transformers 5; keep rope_parameters alone");
    if (Error err = readRopeDict("rope_parameters", *dict, true))
      return err;
    if (hasTopTheta && topTheta != m.rotaryBase)
      return fieldError("rope_theta",
                        show(topTheta) +
                            " disagrees with rope_parameters.rope_theta " +
                            show(m.rotaryBase) + "; keep one of them");
    return Error::success();
  }
  if (!scaling)
    return Error::success();
  const json::Object *dict = scaling->getAsObject();
  if (!dict)
    return fieldError("rope_scaling", expected("an object or null",
                                               show(*scaling)));
  return readRopeDict("rope_scaling", *dict, false);
}

Expected<std::optional<double>>
HuggingFaceReader::positiveNumber(StringRef field, const json::Object &dict,
                                  StringRef sub, StringSet<> &read) const {
  read.insert(sub);
  const json::Value *value = dict.get(sub);
  if (!value || value->kind() == json::Value::Null)
    return std::nullopt;
  std::optional<double> n = value->getAsNumber();
  if (!n || !std::isfinite(*n) || *n <= 0)
    return subFieldError(field, sub,
                         expected("a positive number", show(*value)));
  return *n;
}

Error HuggingFaceReader::readRopeDict(StringRef field, const json::Object &dict,
                                      bool transformers5) {
  ModelConfig &m = config.model;
  StringSet<> read;

  // transformers 4.36 and older spell rope_type "type".
  StringRef typeKey = dict.get("rope_type") ? "rope_type" : "type";
  read.insert(typeKey);
  std::string type = "default";
  if (const json::Value *value = dict.get(typeKey)) {
    std::optional<StringRef> s = value->getAsString();
    if (!s)
      return subFieldError(field, typeKey, expected("a string", show(*value)));
    type = s->str();
  }
  if (transformers5) {
    Expected<std::optional<double>> theta =
        positiveNumber(field, dict, "rope_theta", read);
    if (!theta)
      return theta.takeError();
    if (*theta) {
      m.rotaryBase = **theta;
      config.keyOrigins["rotary_base"] =
          location("rope_theta", offsetOf(field));
    }
  }

  if (type == "linear" || type == "llama3") {
    Expected<std::optional<double>> factor =
        positiveNumber(field, dict, "factor", read);
    if (!factor)
      return factor.takeError();
    if (!*factor)
      return subFieldError(field, typeKey,
                           "rope_type " + type + " needs a factor; add it");
    m.ropeScalingFactor = **factor;
    m.ropeScaling =
        type == "linear" ? RopeScaling::Linear : RopeScaling::Llama3;
  } else if (type == "yarn") {
    if (Error err = readYarn(field, dict, typeKey, read))
      return err;
  } else if (type != "default") {
    return subFieldError(
        field, typeKey,
        "unsupported rope_type '" + type +
            "'; supported: default, linear, llama3 and yarn. Training with "
            "plain RoPE would be a different model than the checkpoint's; "
            "use a config.json without this scaling, or remove " +
            field + " to train plain RoPE at rope_theta");
  }
  if (type == "llama3") {
    double values[3] = {};
    StringRef names[3] = {"low_freq_factor", "high_freq_factor",
                          "original_max_position_embeddings"};
    for (int i = 0; i < 3; ++i) {
      Expected<std::optional<double>> value =
          positiveNumber(field, dict, names[i], read);
      if (!value)
        return value.takeError();
      if (!*value)
        return subFieldError(field, names[i],
                             "missing: rope_type llama3 needs factor, "
                             "low_freq_factor, high_freq_factor and "
                             "original_max_position_embeddings; add it");
      values[i] = **value;
    }
    if (values[1] <= values[0])
      return subFieldError(
          field, "high_freq_factor",
          show(values[1]) + " is not above low_freq_factor " +
              show(values[0]) +
              ": llama3 blends the wavelengths between "
              "original_max_position_embeddings / high_freq_factor and / "
              "low_freq_factor; make high_freq_factor the larger");
    if (std::trunc(values[2]) != values[2] || values[2] > 1e15)
      return subFieldError(field, names[2],
                           expected("a positive integer",
                                    show(*dict.get(names[2]))));
    m.ropeLowFreqFactor = values[0];
    m.ropeHighFreqFactor = values[1];
    m.ropeOriginalMaxPositions = static_cast<int64_t>(values[2]);
  }
  // Anything else in the dict (yarn's beta_fast, a partial_rotary_factor,
  // a llama3 field under linear) changes the rotation or is a mistake.
  for (const auto &entry : dict) {
    StringRef sub = entry.first;
    if (read.contains(sub))
      continue;
    return subFieldError(field, sub,
                         "unknown field (value " + show(entry.second) +
                             ") for rope_type " + type +
                             ": it may change the rotation, so it is "
                             "refused rather than ignored; remove it");
  }
  if (m.ropeScaling != RopeScaling::None)
    config.keyOrigins["rope_scaling"] = location(field);
  return Error::success();
}

/// YaRN's attention factor when attention_factor is not given, as
/// transformers computes it: 0.1 m ln(s) + 1 for a scale s above 1.
static double yarnMscale(double scale, double mscale = 1.0) {
  return scale <= 1.0 ? 1.0 : 0.1 * mscale * std::log(scale) + 1.0;
}

Error HuggingFaceReader::readYarn(StringRef field, const json::Object &dict,
                                  StringRef typeKey, StringSet<> &read) {
  ModelConfig &m = config.model;
  double values[7] = {};
  bool given[7] = {};
  StringRef names[7] = {"factor",           "original_max_position_embeddings",
                        "beta_fast",        "beta_slow",
                        "attention_factor", "mscale",
                        "mscale_all_dim"};
  for (int i = 0; i < 7; ++i) {
    Expected<std::optional<double>> value =
        positiveNumber(field, dict, names[i], read);
    if (!value)
      return value.takeError();
    given[i] = value->has_value();
    values[i] = value->value_or(0.0);
  }
  if (!given[0])
    return subFieldError(field, typeKey,
                         "rope_type yarn needs a factor; add it");
  m.ropeScaling = RopeScaling::Yarn;
  m.ropeScalingFactor = values[0];
  // transformers takes the context the model was trained at from
  // max_position_embeddings when the dict does not give it.
  double original = given[1] ? values[1] : double(m.maxPositions());
  if (std::trunc(original) != original || original > 1e15)
    return subFieldError(field, names[1],
                         expected("a positive integer",
                                  show(*dict.get(names[1]))));
  m.ropeOriginalMaxPositions = static_cast<int64_t>(original);
  m.ropeBetaFast = given[2] ? values[2] : 32.0;
  m.ropeBetaSlow = given[3] ? values[3] : 1.0;
  if (!(m.ropeBetaFast > m.ropeBetaSlow))
    return subFieldError(
        field, given[2] ? "beta_fast" : "beta_slow",
        show(m.ropeBetaFast) + " (beta_fast) is not above beta_slow " +
            show(m.ropeBetaSlow) +
            ": yarn keeps the frequencies that turn more than beta_fast "
            "times over the original context and divides those that turn "
            "fewer than beta_slow times; make beta_fast the larger");
  read.insert("truncate");
  if (const json::Value *truncate = dict.get("truncate")) {
    std::optional<bool> flag = truncate->getAsBoolean();
    if (!flag)
      return subFieldError(field, "truncate",
                           expected("true or false", show(*truncate)));
    m.ropeTruncate = *flag;
  }
  if (given[4])
    m.ropeAttentionFactor = values[4];
  else if (given[5] && given[6])
    m.ropeAttentionFactor = yarnMscale(values[0], values[5]) /
                            yarnMscale(values[0], values[6]);
  else
    m.ropeAttentionFactor = yarnMscale(values[0]);
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
  StringRef supported = "supported: 'gpt2' (GPT2Config), 'llama' "
                        "(LlamaConfig), 'mistral' (MistralConfig), 'qwen2' "
                        "(Qwen2Config), 'qwen3' (Qwen3Config), 'mixtral' "
                        "(MixtralConfig) and 'qwen3_moe' (Qwen3MoeConfig)";
  if (!modelType)
    return createStringError(
        inconvertibleErrorCode(),
        location("model_type") + ": " +
            (type ? "model_type must be a string; "
                  : "no 'model_type' field, so this is not a Hugging Face "
                    "config.json that can be read; ") +
            supported);

  static const std::tuple<StringRef, Family, StringRef> kFamilies[] = {
      {"gpt2", Family::Gpt2, "GPT2Config"},
      {"llama", Family::Llama, "LlamaConfig"},
      {"mistral", Family::Mistral, "MistralConfig"},
      {"qwen2", Family::Qwen2, "Qwen2Config"},
      {"qwen3", Family::Qwen3, "Qwen3Config"},
      {"mixtral", Family::Mixtral, "MixtralConfig"},
      {"qwen3_moe", Family::Qwen3Moe, "Qwen3MoeConfig"}};
  const auto *known =
      llvm::find_if(kFamilies, [&](const auto &f) {
        return std::get<0>(f) == *modelType;
      });
  if (known == std::end(kFamilies))
    return fieldError("model_type", "unsupported model_type '" + *modelType +
                                        "'; " + supported);
  family = std::get<1>(*known);
  configClass = std::get<2>(*known);
  if (Error err = family == Family::Gpt2 ? readGpt2() : readLlamaFamily())
    return std::move(err);
  if (Error err = readCommonChecks())
    return std::move(err);
  if (Error err = refuseUnknownFields())
    return std::move(err);

  config.model.fromHuggingFace = true;
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
