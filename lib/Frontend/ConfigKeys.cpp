//===- ConfigKeys.cpp - The one table of model-file keys and their flags --===//
//
// Every key a model file or a command-line flag can set, with the setter that
// parses and range-checks its value; applyOverride and the suggestions for
// misspelt keys. Keys are Megatron-LM's argument names in snake_case.
//
//===----------------------------------------------------------------------===//

#include "ConfigKeys.h"

#include "llvm/ADT/STLExtras.h"
#include "llvm/ADT/StringExtras.h"

#include <algorithm>
#include <cmath>
#include <limits>

using namespace llvm;
using namespace megatron;
using namespace megatron::config;

using Problem = std::optional<std::string>;

std::string config::expected(StringRef what, StringRef value) {
  if (value.empty())
    return ("expected " + what + ", got nothing").str();
  return ("expected " + what + ", got '" + value + "'").str();
}

//===----------------------------------------------------------------------===//
// Value parsers. Each takes the text as written and leaves `out` untouched on
// error, so a rejected override does not half-apply.
//===----------------------------------------------------------------------===//

static bool isNullText(StringRef v) {
  return v == "null" || v == "Null" || v == "NULL" || v == "~";
}

/// Parses a decimal integer. On failure says why: not an integer at all, or
/// one that does not fit in 64 bits.
static Problem parseInteger(StringRef text, StringRef what, int64_t &out) {
  // getAsInteger takes a leading '-' but not '+'.
  StringRef digits = text.trim();
  if (digits.starts_with("+"))
    digits = digits.drop_front();
  int64_t value;
  if (!digits.starts_with("+") && !digits.getAsInteger(10, value)) {
    out = value;
    return std::nullopt;
  }
  StringRef magnitude = digits.starts_with("-") ? digits.drop_front() : digits;
  if (!magnitude.empty() && all_of(magnitude, isDigit))
    return expected(what, text) + " (it does not fit in a 64-bit integer)";
  return expected(what, text);
}

static Problem setPositive(StringRef v, int64_t &field) {
  int64_t value;
  if (Problem p = parseInteger(v, "a positive integer", value))
    return p;
  if (value <= 0)
    return expected("a positive integer", v);
  field = value;
  return std::nullopt;
}

/// A count of layers, 0 or more, for `key`'s messages.
static Problem setLayerCount(StringRef v, StringRef key, int64_t &field) {
  int64_t value;
  if (Problem p = parseInteger(v, "a number of layers", value))
    return p;
  if (value < 0)
    return key.str() + " " + v.trim().str() +
           " is negative: give 0 or more layers";
  field = value;
  return std::nullopt;
}

/// For sizes where 0 (or null) means "derive it": num_query_groups,
/// ffn_hidden_size, max_position_embeddings, global_batch_size and the like.
static Problem setOptionalPositive(StringRef v, int64_t &field) {
  if (isNullText(v.trim())) {
    field = 0;
    return std::nullopt;
  }
  int64_t value;
  if (Problem p = parseInteger(v, "a positive integer or 0 (unset)", value))
    return p;
  if (value < 0)
    return expected("a positive integer or 0 (unset)", v);
  field = value;
  return std::nullopt;
}

static Problem parseNumber(StringRef v, StringRef what, double &out) {
  double value;
  // getAsDouble also takes "nan" and "inf"; neither is a usable setting.
  if (v.trim().getAsDouble(value) || !std::isfinite(value))
    return expected(what, v);
  out = value;
  return std::nullopt;
}

static Problem setPositiveNumber(StringRef v, double &field) {
  double value;
  if (Problem p = parseNumber(v, "a positive number", value))
    return p;
  if (!(value > 0))
    return expected("a positive number", v);
  field = value;
  return std::nullopt;
}

/// Loss coefficients and capacity factors: 0 turns the feature off.
static Problem setNonNegativeNumber(StringRef v, double &field) {
  double value;
  if (Problem p = parseNumber(v, "a number >= 0", value))
    return p;
  if (!(value >= 0))
    return expected("a number >= 0", v);
  field = value;
  return std::nullopt;
}

/// Dropout probabilities: 1 would drop everything.
static Problem setProbability(StringRef v, double &field) {
  StringRef what = "a probability in [0, 1)";
  double value;
  if (Problem p = parseNumber(v, what, value))
    return p;
  if (!(value >= 0 && value < 1))
    return expected(what, v);
  field = value;
  return std::nullopt;
}

/// YAML's spellings of booleans; "" is a flag given without a value.
static Problem parseBool(StringRef v, bool &out) {
  std::string t = v.trim().lower();
  if (t.empty() || t == "true" || t == "yes" || t == "on" || t == "1") {
    out = true;
    return std::nullopt;
  }
  if (t == "false" || t == "no" || t == "off" || t == "0") {
    out = false;
    return std::nullopt;
  }
  return expected("true or false", v);
}

static Problem setBool(StringRef v, bool &field) { return parseBool(v, field); }

/// Matches `v` case-insensitively against `choices`. Later spellings of a
/// value already listed are aliases and are not shown in errors.
template <typename Enum>
static Problem
setChoice(StringRef v, Enum &field,
          std::initializer_list<std::pair<StringRef, Enum>> choices) {
  StringRef t = v.trim();
  for (const auto &[spelling, value] : choices) {
    if (t.equals_insensitive(spelling)) {
      field = value;
      return std::nullopt;
    }
  }
  SmallVector<StringRef> shown;
  for (const auto &[spelling, value] : choices) {
    bool seen = false;
    for (const auto &[other, otherValue] : choices) {
      if (other == spelling)
        break;
      seen |= otherValue == value;
    }
    if (!seen)
      shown.push_back(spelling);
  }
  std::string allowed;
  for (size_t i = 0; i < shown.size(); ++i) {
    if (i)
      allowed += i + 1 == shown.size() ? " or " : ", ";
    allowed += shown[i].str();
  }
  return expected(allowed, v);
}

//===----------------------------------------------------------------------===//
// The table.
//===----------------------------------------------------------------------===//

using K = ConfigValueKind;

static const KeyDef kKeys[] = {
    // model
    {{"name", "model", "The model's name, used in symbol names and reports.",
      K::String, "the file's name without extension"},
     [](CompileConfig &c, StringRef v) -> Problem {
       if (v.trim().empty())
         return expected("a non-empty name", v);
       c.model.name = v.trim().str();
       return std::nullopt;
     }},
    {{"num_layers", "model", "Transformer layers.", K::Integer, "required"},
     [](CompileConfig &c, StringRef v) {
       return setPositive(v, c.model.numLayers);
     }},
    {{"hidden_size", "model", "Width of the residual stream.", K::Integer,
      "required"},
     [](CompileConfig &c, StringRef v) {
       return setPositive(v, c.model.hiddenSize);
     }},
    {{"num_attention_heads", "model", "Query heads per attention layer.",
      K::Integer, "required"},
     [](CompileConfig &c, StringRef v) {
       return setPositive(v, c.model.numAttentionHeads);
     }},
    {{"num_query_groups", "model",
      "Key/value heads for grouped-query attention (Megatron-LM's "
      "--num-query-groups); 0 means one per query head.",
      K::Integer, "num_attention_heads"},
     [](CompileConfig &c, StringRef v) {
       return setOptionalPositive(v, c.model.numQueryGroups);
     }},
    {{"group_query_attention", "model",
      "Accepted for Megatron-LM command lines; num_query_groups alone turns "
      "grouped-query attention on. false resets num_query_groups.",
      K::Boolean, "false"},
     [](CompileConfig &c, StringRef v) -> Problem {
       bool on;
       if (Problem p = parseBool(v, on))
         return p;
       if (!on)
         c.model.numQueryGroups = 0;
       return std::nullopt;
     },
     "num_query_groups"},
    {{"kv_channels", "model",
      "Channels of each attention head (Hugging Face's head_dim); 0 means "
      "hidden_size / num_attention_heads.",
      K::Integer, "0"},
     [](CompileConfig &c, StringRef v) {
       return setOptionalPositive(v, c.model.kvChannels);
     }},
    {{"ffn_hidden_size", "model", "Width of the MLP's hidden layer.",
      K::Integer, "4 * hidden_size"},
     [](CompileConfig &c, StringRef v) {
       return setOptionalPositive(v, c.model.ffnHiddenSize);
     }},
    {{"seq_length", "model", "Tokens per training sequence.", K::Integer,
      "required"},
     [](CompileConfig &c, StringRef v) {
       return setPositive(v, c.model.seqLength);
     }},
    {{"max_position_embeddings", "model", "Rows of the learned position table.",
      K::Integer, "seq_length"},
     [](CompileConfig &c, StringRef v) {
       return setOptionalPositive(v, c.model.maxPositionEmbeddings);
     }},
    {{"vocab_size", "model", "Tokenizer vocabulary, before padding.",
      K::Integer, "required"},
     [](CompileConfig &c, StringRef v) {
       return setPositive(v, c.model.vocabSize);
     }},
    {{"make_vocab_size_divisible_by", "model",
      "Pad the vocabulary to a multiple of this times "
      "tensor_model_parallel_size.",
      K::Integer, "128"},
     [](CompileConfig &c, StringRef v) {
       return setPositive(v, c.model.makeVocabSizeDivisibleBy);
     }},
    {{"normalization", "model", "LayerNorm or RMSNorm.", K::Choice,
      "LayerNorm"},
     [](CompileConfig &c, StringRef v) {
       return setChoice(v, c.model.normalization,
                        {{"LayerNorm", Normalization::LayerNorm},
                         {"RMSNorm", Normalization::RMSNorm}});
     }},
    {{"norm_epsilon", "model", "Epsilon of LayerNorm/RMSNorm.", K::Number,
      "1e-5"},
     [](CompileConfig &c, StringRef v) {
       return setPositiveNumber(v, c.model.normEpsilon);
     }},
    {{"position_embedding_type", "model", "learned_absolute or rope.",
      K::Choice, "learned_absolute"},
     [](CompileConfig &c, StringRef v) {
       return setChoice(
           v, c.model.positionEmbeddingType,
           {{"learned_absolute", PositionEmbedding::LearnedAbsolute},
            {"rope", PositionEmbedding::Rope}});
     }},
    {{"rotary_base", "model", "RoPE's base (Hugging Face's rope_theta).",
      K::Number, "10000"},
     [](CompileConfig &c, StringRef v) {
       return setPositiveNumber(v, c.model.rotaryBase);
     }},
    {{"activation", "model", "The MLP's activation: gelu or swiglu.", K::Choice,
      "gelu"},
     [](CompileConfig &c, StringRef v) {
       return setChoice(
           v, c.model.activation,
           {{"gelu", Activation::Gelu}, {"swiglu", Activation::Swiglu}});
     }},
    {{"swiglu", "model",
      "Megatron-LM's --swiglu: true sets activation to swiglu.", K::Boolean,
      "false"},
     [](CompileConfig &c, StringRef v) -> Problem {
       bool on;
       if (Problem p = parseBool(v, on))
         return p;
       if (on)
         c.model.activation = Activation::Swiglu;
       else if (c.model.activation == Activation::Swiglu)
         c.model.activation = Activation::Gelu;
       return std::nullopt;
     },
     "activation"},
    {{"openai_gelu", "model",
      "GeLU's tanh approximation (GPT-2's gelu_new) instead of the exact "
      "erf form.",
      K::Boolean, "false"},
     [](CompileConfig &c, StringRef v) {
       return setBool(v, c.model.openaiGelu);
     }},
    {{"add_bias_linear", "model", "Biases on the linear layers.", K::Boolean,
      "true"},
     [](CompileConfig &c, StringRef v) {
       return setBool(v, c.model.addBiasLinear);
     }},
    {{"disable_bias_linear", "model",
      "Megatron-LM's --disable-bias-linear: add_bias_linear false.", K::Boolean,
      "false"},
     [](CompileConfig &c, StringRef v) -> Problem {
       bool off;
       if (Problem p = parseBool(v, off))
         return p;
       c.model.addBiasLinear = !off;
       return std::nullopt;
     },
     "add_bias_linear"},
    {{"add_qkv_bias", "model",
      "Biases on the query, key and value projections alone (Qwen2's); "
      "add_bias_linear puts them on every linear layer.",
      K::Boolean, "false"},
     [](CompileConfig &c, StringRef v) {
       return setBool(v, c.model.addQkvBias);
     }},
    {{"qk_layernorm", "model",
      "Each head's queries and keys normalized before RoPE, with the "
      "model's normalization and weights of the head dimension (Qwen3's "
      "q_norm and k_norm).",
      K::Boolean, "false"},
     [](CompileConfig &c, StringRef v) {
       return setBool(v, c.model.qkLayernorm);
     }},
    {{"untie_embeddings_and_output_weights", "model",
      "A separate output layer instead of reusing the word embeddings.",
      K::Boolean, "false"},
     [](CompileConfig &c, StringRef v) {
       return setBool(v, c.model.untieEmbeddingsAndOutputWeights);
     }},
    {{"hidden_dropout", "model",
      "Dropout after attention, after the MLP and on the embeddings.",
      K::Number, "0.1"},
     [](CompileConfig &c, StringRef v) {
       return setProbability(v, c.model.hiddenDropout);
     }},
    {{"attention_dropout", "model", "Dropout on the attention probabilities.",
      K::Number, "0.1"},
     [](CompileConfig &c, StringRef v) {
       return setProbability(v, c.model.attentionDropout);
     }},
    {{"init_method_std", "model",
      "Standard deviation of the normal weight initialization.", K::Number,
      "0.02"},
     [](CompileConfig &c, StringRef v) {
       return setPositiveNumber(v, c.model.initMethodStd);
     }},

    // model: mixture of experts (docs/MoE.md)
    {{"num_experts", "model",
      "Experts per MoE layer; 0 (unset) is a dense model.", K::Integer, "0"},
     [](CompileConfig &c, StringRef v) {
       return setOptionalPositive(v, c.moe.numExperts);
     }},
    {{"moe_router_topk", "model", "Experts each token is routed to.",
      K::Integer, "2"},
     [](CompileConfig &c, StringRef v) {
       return setPositive(v, c.moe.routerTopk);
     }},
    {{"moe_router_score_function", "model",
      "The router's scores: softmax or sigmoid (sigmoid renormalizes the "
      "top-k weights when topk > 1).",
      K::Choice, "softmax"},
     [](CompileConfig &c, StringRef v) {
       return setChoice(v, c.moe.scoreFunction,
                        {{"softmax", MoeScoreFunction::Softmax},
                         {"sigmoid", MoeScoreFunction::Sigmoid}});
     }},
    {{"moe_router_pre_softmax", "model",
      "Softmax over all experts before the top-k, the top-k weights not "
      "renormalized; false takes the softmax over the top-k logits "
      "(normalized top-k).",
      K::Boolean, "false"},
     [](CompileConfig &c, StringRef v) {
       return setBool(v, c.moe.routerPreSoftmax);
     }},
    {{"moe_router_load_balancing_type", "model",
      "The load-balancing loss, weighted by moe_aux_loss_coeff: aux_loss "
      "(the switch loss over the micro-batch), seq_aux_loss (its mean over "
      "the micro-batch's sequences, each over its own tokens) or none; "
      "sinkhorn and global_aux_loss are not implemented.",
      K::Choice, "aux_loss"},
     [](CompileConfig &c, StringRef v) -> Problem {
       StringRef t = v.trim();
       for (StringRef missing : {"sinkhorn", "global_aux_loss"})
         if (t.equals_insensitive(missing))
           return ("'" + t +
                   "' is not implemented yet (issue 25); use "
                   "aux_loss, seq_aux_loss or none")
               .str();
       return setChoice(v, c.moe.loadBalancing,
                        {{"aux_loss", MoeLoadBalancing::AuxLoss},
                         {"seq_aux_loss", MoeLoadBalancing::SeqAuxLoss},
                         {"none", MoeLoadBalancing::None}});
     }},
    {{"moe_router_dtype", "model",
      "fp32: under bf16 the router's GEMMs read and write fp32 (Megatron-LM's "
      "--moe-router-dtype); unset, their operands are bf16 and the logits "
      "and routing fp32. fp64 is not implemented.",
      K::Choice, "none"},
     [](CompileConfig &c, StringRef v) -> Problem {
       StringRef t = v.trim();
       if (t.equals_insensitive("fp64"))
         return std::string("'fp64' is not implemented: the router's GEMMs "
                            "run in fp32 at most; use fp32");
       if (isNullText(t)) {
         c.moe.routerFp32 = false;
         return std::nullopt;
       }
       return setChoice(v, c.moe.routerFp32, {{"fp32", true}, {"none", false}});
     }},
    {{"moe_router_topk_scaling_factor", "model",
      "The top-k routing weights are multiplied by it after their "
      "normalization (Megatron-LM's --moe-router-topk-scaling-factor); unset "
      "for none.",
      K::Number, "none"},
     [](CompileConfig &c, StringRef v) -> Problem {
       if (isNullText(v.trim()) || v.trim().equals_insensitive("none")) {
         c.moe.topkScalingFactor = 0;
         return std::nullopt;
       }
       return setPositiveNumber(v, c.moe.topkScalingFactor);
     }},
    {{"moe_router_num_groups", "model",
      "Group-limited routing: the experts form this many groups of "
      "consecutive experts (Megatron-LM's --moe-router-num-groups; "
      "DeepSeek's n_group); unset for none.",
      K::Integer, "0"},
     [](CompileConfig &c, StringRef v) {
       return setOptionalPositive(v, c.moe.routerNumGroups);
     }},
    {{"moe_router_group_topk", "model",
      "Group-limited routing: each token's top-k is taken within its this "
      "many best groups, a group scored by the sum of its topk / "
      "group_topk highest scores (Megatron-LM's --moe-router-group-topk; "
      "DeepSeek's topk_group); unset for none.",
      K::Integer, "0"},
     [](CompileConfig &c, StringRef v) {
       return setOptionalPositive(v, c.moe.routerGroupTopk);
     }},
    {{"moe_router_enable_expert_bias", "model",
      "Aux-loss-free balancing (DeepSeek-V3): each MoE layer's top-k is "
      "taken over its sigmoid scores plus a per-expert bias that the step "
      "does not train but raises for the experts below the mean load and "
      "lowers for those above (sigmoid scores only).",
      K::Boolean, "false"},
     [](CompileConfig &c, StringRef v) {
       return setBool(v, c.moe.routerEnableExpertBias);
     }},
    {{"moe_router_bias_update_rate", "model",
      "How much the expert bias moves after each iteration (Megatron-LM's "
      "--moe-router-bias-update-rate); needs "
      "moe_router_enable_expert_bias.",
      K::Number, "0.001"},
     [](CompileConfig &c, StringRef v) {
       return setPositiveNumber(v, c.moe.routerBiasUpdateRate);
     }},
    {{"moe_aux_loss_coeff", "model",
      "Weight of the load-balancing loss of each MoE layer; 0 for none.",
      K::Number, "0"},
     [](CompileConfig &c, StringRef v) {
       return setNonNegativeNumber(v, c.moe.auxLossCoeff);
     }},
    {{"moe_z_loss_coeff", "model",
      "Weight of the router z-loss of each MoE layer; 0 for none.", K::Number,
      "0"},
     [](CompileConfig &c, StringRef v) {
       return setNonNegativeNumber(v, c.moe.zLossCoeff);
     }},
    {{"moe_expert_capacity_factor", "model",
      "Each expert keeps at most ceil(tokens * topk / experts * factor) "
      "tokens and drops the rest; 0 (unset) is dropless.",
      K::Number, "0"},
     [](CompileConfig &c, StringRef v) -> Problem {
       if (isNullText(v.trim())) {
         c.moe.expertCapacityFactor = 0;
         return std::nullopt;
       }
       return setNonNegativeNumber(v, c.moe.expertCapacityFactor);
     }},
    {{"moe_token_dropping", "model",
      "Megatron-LM's --moe-token-dropping: true needs "
      "moe_expert_capacity_factor, which alone turns dropping on.",
      K::Boolean, "false"},
     [](CompileConfig &c, StringRef v) -> Problem {
       bool on;
       if (Problem p = parseBool(v, on))
         return p;
       c.moe.tokenDropping = on;
       return std::nullopt;
     }},
    {{"moe_token_drop_policy", "model",
      "Which tokens an expert over its capacity keeps: probs (the highest "
      "routing weights) or position (the first tokens).",
      K::Choice, "probs"},
     [](CompileConfig &c, StringRef v) {
       return setChoice(v, c.moe.dropPolicy,
                        {{"probs", MoeDropPolicy::Probs},
                         {"position", MoeDropPolicy::Position}});
     }},
    {{"moe_pad_expert_input_to_capacity", "model",
      "Pads each expert's tokens to its capacity with rows that weigh 0, "
      "as Megatron-LM does for static shapes; the routed rows are static "
      "here already, so the results are the same. Needs "
      "moe_expert_capacity_factor.",
      K::Boolean, "false"},
     [](CompileConfig &c, StringRef v) {
       return setBool(v, c.moe.padExpertInputToCapacity);
     }},
    {{"moe_shared_expert_intermediate_size", "model",
      "Width of the shared expert's MLP, run on every token beside the "
      "routed experts; 0 (unset) for none.",
      K::Integer, "0"},
     [](CompileConfig &c, StringRef v) {
       return setOptionalPositive(v, c.moe.sharedExpertIntermediateSize);
     }},
    {{"moe_layer_freq", "model",
      "Which layers are MoE layers: every N-th from layer 0 (an integer), or "
      "a list of 0 and 1 per layer ([1, 0, 1, 0]).",
      K::String, "1"},
     [](CompileConfig &c, StringRef v) -> Problem {
       StringRef t = v.trim();
       StringRef what = "a positive integer or a list of 0 and 1 per layer, "
                        "written out ([1, 0, 1, 0])";
       if (!t.starts_with("[")) {
         int64_t freq = 0;
         if (setPositive(t, freq))
           return expected(what, v);
         c.moe.layerPattern.clear();
         c.moe.layerFreq = freq;
         return std::nullopt;
       }
       if (!t.ends_with("]"))
         return expected(what, v);
       SmallVector<StringRef> items;
       t.drop_front().drop_back().split(items, ',', -1, false);
       std::vector<int64_t> pattern;
       for (StringRef item : items) {
         StringRef bit = item.trim();
         if (bit != "0" && bit != "1")
           return expected(what, v);
         pattern.push_back(bit == "1");
       }
       if (pattern.empty())
         return expected("a list with one 0 or 1 per layer", v);
       c.moe.layerPattern = std::move(pattern);
       return std::nullopt;
     }},
    {{"moe_ffn_hidden_size", "model",
      "Width of each expert's MLP; 0 (unset) means ffn_hidden_size.",
      K::Integer, "ffn_hidden_size"},
     [](CompileConfig &c, StringRef v) {
       return setOptionalPositive(v, c.moe.ffnHiddenSize);
     }},
    {{"moe_grouped_gemm", "model",
      "Megatron-LM's --moe-grouped-gemm. The experts here are always one "
      "grouped GEMM op (mt.moe_grouped_linear), which computes what "
      "sequential experts would; either value compiles the same program.",
      K::Boolean, "false"},
     [](CompileConfig &c, StringRef v) {
       return setBool(v, c.moe.groupedGemm);
     }},

    // parallel
    {{"tensor_model_parallel_size", "parallel", "Tensor-parallel ranks.",
      K::Integer, "1"},
     [](CompileConfig &c, StringRef v) {
       return setPositive(v, c.parallel.tensorModelParallelSize);
     }},
    {{"pipeline_model_parallel_size", "parallel", "Pipeline stages.",
      K::Integer, "1"},
     [](CompileConfig &c, StringRef v) {
       return setPositive(v, c.parallel.pipelineModelParallelSize);
     }},
    {{"virtual_pipeline_model_parallel_size", "parallel",
      "Virtual stages per pipeline rank (interleaved 1F1B); 0 for none.",
      K::Integer, "0"},
     [](CompileConfig &c, StringRef v) {
       return setOptionalPositive(v,
                                  c.parallel.virtualPipelineModelParallelSize);
     }},
    {{"num_virtual_stages_per_pipeline_rank", "parallel",
      "Megatron-LM's current name for virtual_pipeline_model_parallel_size.",
      K::Integer, "0"},
     [](CompileConfig &c, StringRef v) {
       return setOptionalPositive(v,
                                  c.parallel.virtualPipelineModelParallelSize);
     },
     "virtual_pipeline_model_parallel_size"},
    {{"num_layers_per_virtual_pipeline_stage", "parallel",
      "Layers per virtual stage (interleaved 1F1B), instead of "
      "virtual_pipeline_model_parallel_size; 0 for none.",
      K::Integer, "0"},
     [](CompileConfig &c, StringRef v) {
       return setOptionalPositive(
           v, c.parallel.numLayersPerVirtualPipelineStage);
     }},
    {{"decoder_first_pipeline_num_layers", "parallel",
      "Layers on the first pipeline stage, for an uneven split; 0 for even.",
      K::Integer, "0"},
     [](CompileConfig &c, StringRef v) {
       return setOptionalPositive(v, c.parallel.decoderFirstPipelineNumLayers);
     }},
    {{"decoder_last_pipeline_num_layers", "parallel",
      "Layers on the last pipeline stage, for an uneven split; 0 for even.",
      K::Integer, "0"},
     [](CompileConfig &c, StringRef v) {
       return setOptionalPositive(v, c.parallel.decoderLastPipelineNumLayers);
     }},
    {{"expert_model_parallel_size", "parallel",
      "Expert-parallel ranks (MoE): the routed experts split over the "
      "data-parallel ranks (docs/MoE.md).",
      K::Integer, "1"},
     [](CompileConfig &c, StringRef v) {
       return setPositive(v, c.moe.expertModelParallelSize);
     }},
    {{"sequence_parallel", "parallel",
      "Shard activations outside attention and MLP along the sequence over "
      "the tensor-parallel ranks.",
      K::Boolean, "false"},
     [](CompileConfig &c, StringRef v) {
       return setBool(v, c.parallel.sequenceParallel);
     }},
    {{"context_parallel_size", "parallel",
      "Context-parallel ranks: every sequence is split over them, attention "
      "included (ring attention, causal load balancing).",
      K::Integer, "1"},
     [](CompileConfig &c, StringRef v) {
       return setPositive(v, c.parallel.contextParallelSize);
     }},
    {{"cp_comm_type", "parallel",
      "How attention exchanges keys and values over the context-parallel "
      "ranks: p2p (a ring) or all_gather.",
      K::Choice, "p2p"},
     [](CompileConfig &c, StringRef v) -> Problem {
       StringRef t = v.trim();
       // Megatron-LM's other two choices, named so that the error says
       // what is missing rather than that the value is unknown.
       if (t.equals_insensitive("a2a") || t.equals_insensitive("a2a+p2p"))
         return t.str() + " (Megatron-LM's all-to-all exchange) is not "
                          "implemented; use p2p or all_gather";
       return setChoice(v, c.parallel.cpCommType,
                        {{"p2p", CpCommType::P2P},
                         {"all_gather", CpCommType::AllGather},
                         {"all-gather", CpCommType::AllGather}});
     }},
    {{"data_parallel_size", "parallel", "Data-parallel replicas.", K::Integer,
      "1"},
     [](CompileConfig &c, StringRef v) {
       return setPositive(v, c.parallel.dataParallelSize);
     }},
    {{"use_distributed_optimizer", "parallel",
      "Shard optimizer state over the data-parallel ranks (ZeRO-1).",
      K::Boolean, "false"},
     [](CompileConfig &c, StringRef v) {
       return setBool(v, c.parallel.useDistributedOptimizer);
     }},
    {{"tp_comm_overlap", "parallel",
      "Cut the all-gather before each column-parallel GEMM and the "
      "reduce-scatter after each row-parallel GEMM into chunks pipelined "
      "against chunks of the GEMM (needs sequence_parallel).",
      K::Boolean, "false"},
     [](CompileConfig &c, StringRef v) {
       return setBool(v, c.parallel.tpCommOverlap);
     }},
    {{"overlap_param_gather", "parallel",
      "Megatron-LM's all-gather of updated parameters per bucket during the "
      "next forward pass, each bucket before the step first reads it (needs "
      "use_distributed_optimizer and overlap_grad_reduce).",
      K::Boolean, "false"},
     [](CompileConfig &c, StringRef v) {
       return setBool(v, c.parallel.overlapParamGather);
     }},
    {{"overlap_grad_reduce", "parallel",
      "Reduce the gradients in buckets during the last micro-batch's "
      "backward pass, each as soon as its gradients are complete.",
      K::Boolean, "false"},
     [](CompileConfig &c, StringRef v) {
       return setBool(v, c.parallel.overlapGradReduce);
     }},
    {{"ddp_bucket_size", "parallel",
      "Least gradient elements per bucket under overlap_grad_reduce (all "
      "buckets but the last).",
      K::Integer, "max(40000000, 1000000 * data_parallel_size)"},
     [](CompileConfig &c, StringRef v) -> Problem {
       int64_t value;
       if (Problem p = parseInteger(v, "a positive number of elements", value))
         return p;
       if (value <= 0)
         return "ddp_bucket_size " + v.trim().str() +
                " is not a positive number of elements: a bucket holds at "
                "least one gradient; give one such as 40000000, or leave it "
                "out for Megatron-LM's default";
       c.parallel.ddpBucketSize = value;
       return std::nullopt;
     }},

    // batch
    {{"micro_batch_size", "batch", "Sequences per micro-batch per rank.",
      K::Integer, "1"},
     [](CompileConfig &c, StringRef v) {
       return setPositive(v, c.batch.microBatchSize);
     }},
    {{"global_batch_size", "batch",
      "Sequences per optimizer step over all data-parallel ranks.", K::Integer,
      "micro_batch_size * data_parallel_size"},
     [](CompileConfig &c, StringRef v) {
       return setOptionalPositive(v, c.batch.globalBatchSize);
     }},

    // precision
    {{"precision", "precision", "fp32, bf16 or fp16.", K::Choice, "fp32"},
     [](CompileConfig &c, StringRef v) {
       return setChoice(v, c.precision,
                        {{"fp32", Precision::FP32},
                         {"bf16", Precision::BF16},
                         {"fp16", Precision::FP16},
                         {"float32", Precision::FP32},
                         {"bfloat16", Precision::BF16},
                         {"float16", Precision::FP16}});
     }},
    {{"bf16", "precision", "Megatron-LM's --bf16: precision bf16.", K::Boolean,
      "false"},
     [](CompileConfig &c, StringRef v) -> Problem {
       bool on;
       if (Problem p = parseBool(v, on))
         return p;
       if (on)
         c.precision = Precision::BF16;
       else if (c.precision == Precision::BF16)
         c.precision = Precision::FP32;
       return std::nullopt;
     },
     "precision"},
    {{"fp16", "precision", "Megatron-LM's --fp16: precision fp16.", K::Boolean,
      "false"},
     [](CompileConfig &c, StringRef v) -> Problem {
       bool on;
       if (Problem p = parseBool(v, on))
         return p;
       if (on)
         c.precision = Precision::FP16;
       else if (c.precision == Precision::FP16)
         c.precision = Precision::FP32;
       return std::nullopt;
     },
     "precision"},

    // fp8
    {{"fp8_format", "fp8",
      "FP8 GEMMs in the transformer layers: e4m3 for every operand, or "
      "hybrid (e4m3 forward, e5m2 for the gradients); needs precision bf16.",
      K::Choice, "none"},
     [](CompileConfig &c, StringRef v) -> Problem {
       if (isNullText(v.trim())) {
         c.fp8.format = Fp8Format::None;
         return std::nullopt;
       }
       return setChoice(v, c.fp8.format,
                        {{"e4m3", Fp8Format::E4M3},
                         {"hybrid", Fp8Format::Hybrid},
                         {"none", Fp8Format::None}});
     }},
    {{"fp8_recipe", "fp8",
      "How FP8 scales are chosen: delayed (from an amax history of earlier "
      "steps) or tensorwise (from each tensor's own amax).",
      K::Choice, "delayed"},
     [](CompileConfig &c, StringRef v) {
       return setChoice(v, c.fp8.recipe,
                        {{"delayed", Fp8Recipe::Delayed},
                         {"tensorwise", Fp8Recipe::Tensorwise}});
     }},
    {{"fp8_amax_history_len", "fp8", "Delayed scaling: amaxes kept per tensor.",
      K::Integer, "1"},
     [](CompileConfig &c, StringRef v) {
       return setPositive(v, c.fp8.amaxHistoryLen);
     }},
    {{"fp8_amax_compute_algo", "fp8",
      "Delayed scaling: the amax a scale is computed from, most_recent or "
      "max (of the history).",
      K::Choice, "most_recent"},
     [](CompileConfig &c, StringRef v) -> Problem {
       std::string t = v.trim().lower();
       if (t != "most_recent" && t != "max")
         return expected("most_recent or max", v);
       c.fp8.amaxComputeAlgo = t;
       return std::nullopt;
     }},
    {{"fp8_margin", "fp8", "Scales are divided by 2^fp8_margin.", K::Integer,
      "0"},
     [](CompileConfig &c, StringRef v) -> Problem {
       int64_t value;
       if (Problem p = parseInteger(v, "a margin of 0 or more", value))
         return p;
       if (value < 0 || value > 64)
         return "fp8_margin " + v.trim().str() +
                " is outside 0 to 64: a scale is divided by 2^fp8_margin; "
                "give 0 (Megatron-LM's default) or a small power";
       c.fp8.margin = value;
       return std::nullopt;
     }},
    {{"first_last_layers_bf16", "fp8",
      "Keep bf16 GEMMs in the first num_layers_at_start_in_bf16 and the last "
      "num_layers_at_end_in_bf16 transformer layers.",
      K::Boolean, "false"},
     [](CompileConfig &c, StringRef v) {
       return setBool(v, c.fp8.firstLastLayersBf16);
     }},
    {{"num_layers_at_start_in_bf16", "fp8",
      "Under first_last_layers_bf16: leading layers kept in bf16.", K::Integer,
      "1"},
     [](CompileConfig &c, StringRef v) {
       return setLayerCount(v, "num_layers_at_start_in_bf16",
                            c.fp8.numLayersAtStartInBf16);
     }},
    {{"num_layers_at_end_in_bf16", "fp8",
      "Under first_last_layers_bf16: trailing layers kept in bf16.", K::Integer,
      "1"},
     [](CompileConfig &c, StringRef v) {
       return setLayerCount(v, "num_layers_at_end_in_bf16",
                            c.fp8.numLayersAtEndInBf16);
     }},

    // recompute
    {{"recompute_granularity", "recompute",
      "Activation recomputation: none, selective (attention core) or full "
      "(whole layers).",
      K::Choice, "none"},
     [](CompileConfig &c, StringRef v) -> Problem {
       if (isNullText(v.trim())) {
         c.recompute.granularity = RecomputeGranularity::None;
         return std::nullopt;
       }
       return setChoice(v, c.recompute.granularity,
                        {{"none", RecomputeGranularity::None},
                         {"selective", RecomputeGranularity::Selective},
                         {"full", RecomputeGranularity::Full}});
     }},
    {{"recompute_method", "recompute",
      "For full recomputation: uniform (checkpoint every recompute_num_layers "
      "layers) or block (the first recompute_num_layers layers per stage).",
      K::Choice, "uniform"},
     [](CompileConfig &c, StringRef v) -> Problem {
       std::string t = v.trim().lower();
       if (t != "uniform" && t != "block")
         return expected("uniform or block", v);
       c.recompute.method = t;
       return std::nullopt;
     }},
    {{"recompute_num_layers", "recompute",
      "For full recomputation: layers per checkpointed chunk (uniform) or "
      "recomputed layers per stage (block).",
      K::Integer, "1"},
     [](CompileConfig &c, StringRef v) {
       return setPositive(v, c.recompute.numLayers);
     }},
    {{"recompute_activations", "recompute",
      "Megatron-LM's --recompute-activations: recompute_granularity "
      "selective.",
      K::Boolean, "false"},
     [](CompileConfig &c, StringRef v) -> Problem {
       bool on;
       if (Problem p = parseBool(v, on))
         return p;
       if (on)
         c.recompute.granularity = RecomputeGranularity::Selective;
       else if (c.recompute.granularity == RecomputeGranularity::Selective)
         c.recompute.granularity = RecomputeGranularity::None;
       return std::nullopt;
     },
     "recompute_granularity"},
};

ArrayRef<ConfigKeyInfo> megatron::getConfigKeys() {
  static const std::vector<ConfigKeyInfo> infos = [] {
    std::vector<ConfigKeyInfo> result;
    for (const KeyDef &def : kKeys)
      result.push_back(def.info);
    return result;
  }();
  return infos;
}

bool config::isMappingSection(StringRef name) {
  return name == "model" || name == "parallel" || name == "batch" ||
         name == "recompute" || name == "fp8";
}

const KeyDef *config::findKey(StringRef key) {
  for (const KeyDef &def : kKeys)
    if (def.info.key == key)
      return &def;
  return nullptr;
}

/// `granularity` for `recompute_granularity` inside `recompute:`.
static StringRef shortName(const KeyDef &def) {
  StringRef key = def.info.key;
  if (key.consume_front(def.info.section) && key.consume_front("_"))
    return key;
  return "";
}

const KeyDef *config::findKeyInSection(StringRef section, StringRef name) {
  for (const KeyDef &def : kKeys) {
    if (def.info.section != section)
      continue;
    if (def.info.key == name ||
        (!shortName(def).empty() && shortName(def) == name))
      return &def;
  }
  return nullptr;
}

/// Names people bring from Hugging Face configs, GPT-2 code and habit, with
/// the key that means the same thing here. Edit distance alone cannot find
/// these (n_head is far from num_attention_heads).
static const std::pair<StringRef, StringRef> kSynonyms[] = {
    {"n_layer", "num_layers"},
    {"n_layers", "num_layers"},
    {"num_hidden_layers", "num_layers"},
    {"n_embd", "hidden_size"},
    {"d_model", "hidden_size"},
    {"n_head", "num_attention_heads"},
    {"n_heads", "num_attention_heads"},
    {"num_heads", "num_attention_heads"},
    {"num_key_value_heads", "num_query_groups"},
    {"n_kv_heads", "num_query_groups"},
    {"head_dim", "kv_channels"},
    {"intermediate_size", "ffn_hidden_size"},
    {"n_inner", "ffn_hidden_size"},
    {"n_positions", "max_position_embeddings"},
    {"n_ctx", "seq_length"},
    {"seq_len", "seq_length"},
    {"max_seq_len", "seq_length"},
    {"sequence_length", "seq_length"},
    {"rope_theta", "rotary_base"},
    {"rms_norm_eps", "norm_epsilon"},
    {"layer_norm_epsilon", "norm_epsilon"},
    {"initializer_range", "init_method_std"},
    {"hidden_act", "activation"},
    {"activation_function", "activation"},
    {"tie_word_embeddings", "untie_embeddings_and_output_weights"},
    {"resid_pdrop", "hidden_dropout"},
    {"attn_pdrop", "attention_dropout"},
    {"tp", "tensor_model_parallel_size"},
    {"pp", "pipeline_model_parallel_size"},
    {"vpp", "virtual_pipeline_model_parallel_size"},
    {"dp", "data_parallel_size"},
    {"cp", "context_parallel_size"},
    {"dtype", "precision"},
    {"torch_dtype", "precision"},
};

std::string config::suggestKey(StringRef name, StringRef section) {
  for (const auto &[synonym, key] : kSynonyms)
    if (name.equals_insensitive(synonym))
      return key.str();

  StringRef best;
  unsigned bestDistance = std::numeric_limits<unsigned>::max();
  auto consider = [&](StringRef candidate) {
    unsigned d = name.edit_distance_insensitive(candidate);
    if (d < bestDistance) {
      bestDistance = d;
      best = candidate;
    }
  };
  for (const KeyDef &def : kKeys) {
    if (!section.empty() && def.info.section == section &&
        !shortName(def).empty())
      consider(shortName(def));
    consider(def.info.key);
  }
  if (section.empty())
    for (StringRef s : {"model", "parallel", "batch", "fp8", "recompute"})
      consider(s);
  // A third of the name can be wrong: catches dropped or swapped words
  // ("tensor_parallel_size") without proposing unrelated keys.
  unsigned limit = std::max<unsigned>(2, name.size() / 3);
  if (bestDistance > limit)
    return "";
  return best.str();
}

std::string config::flagName(StringRef key) {
  std::string flag = "--" + key.str();
  std::replace(flag.begin(), flag.end(), '_', '-');
  return flag;
}

Error megatron::applyOverride(CompileConfig &config, StringRef key,
                              StringRef value) {
  // Accept the flag's own spelling so a driver can pass what the user typed;
  // echo that spelling back in errors.
  bool asFlag = key.starts_with("-") || key.contains('-');
  std::string canonical = key.ltrim('-').str();
  std::replace(canonical.begin(), canonical.end(), '-', '_');
  auto spell = [&](StringRef k) { return asFlag ? flagName(k) : k.str(); };

  const KeyDef *def = findKey(canonical);
  if (!def) {
    std::string message = asFlag
                              ? "unknown option '" + flagName(canonical) + "'"
                              : "unknown key '" + canonical + "'";
    std::string suggestion = suggestKey(canonical);
    if (!suggestion.empty())
      message += "; did you mean '" + spell(suggestion) + "'?";
    return createStringError(inconvertibleErrorCode(), message);
  }
  if (Problem p = def->set(config, value))
    return createStringError(inconvertibleErrorCode(),
                             spell(def->info.key) + ": " + *p);
  config.keyOrigins[def->originKey()] =
      "command line (" + flagName(def->info.key) + ")";
  return Error::success();
}
