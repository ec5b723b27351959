// transformers' config.json from a bundle (train/HuggingFaceConfig.h).
#include "train/HuggingFaceConfig.h"

#include "core/Error.h"

#include <cmath>
#include <functional>
#include <map>
#include <optional>
#include <string>

namespace mtrt::train {

namespace {

using Json = nlohmann::json;

[[noreturn]] void refuse(const std::string &message) {
  throw Error(MTRT_STATUS_INVALID_ARGUMENT, message);
}

/// The first instruction of `op` in the bundle's functions (fused bodies
/// included), train_step's first so that dropout is seen where it is.
const Instruction *findInstruction(
    const Bundle &bundle, Op op,
    const std::function<bool(const Instruction &)> &accept = nullptr) {
  std::function<const Instruction *(const std::vector<Instruction> &)> scan =
      [&](const std::vector<Instruction> &list) -> const Instruction * {
    for (const Instruction &inst : list) {
      if (inst.op == op && (!accept || accept(inst)))
        return &inst;
      if (const Instruction *inner = scan(inst.body))
        return inner;
    }
    return nullptr;
  };
  for (bool trainFirst : {true, false})
    for (const Function &fn : bundle.functions())
      if ((fn.name.rfind("train_step", 0) == 0) == trainFirst)
        if (const Instruction *found = scan(fn.instructions))
          return found;
  return nullptr;
}

/// rope_scaling in transformers 4's form, which transformers 5 reads too;
/// null without scaling.
Json ropeScaling(const Attributes &a) {
  if (a.betaFast > 0)
    return {{"rope_type", "yarn"},
            {"factor", Json(a.scalingFactor)},
            {"original_max_position_embeddings", a.originalMaxPositions},
            {"beta_fast", Json(a.betaFast)},
            {"beta_slow", Json(a.betaSlow)},
            {"truncate", a.truncate},
            {"attention_factor", Json(a.attentionFactor)}};
  if (a.lowFreqFactor > 0)
    return {{"rope_type", "llama3"},
            {"factor", Json(a.scalingFactor)},
            {"low_freq_factor", Json(a.lowFreqFactor)},
            {"high_freq_factor", Json(a.highFreqFactor)},
            {"original_max_position_embeddings", a.originalMaxPositions}};
  if (a.scalingFactor != 1.0)
    return {{"rope_type", "linear"}, {"factor", Json(a.scalingFactor)}};
  return nullptr;
}

} // namespace

Json huggingFaceConfig(const Bundle &bundle) {
  if (!bundle.hasModel())
    refuse("bundle '" + bundle.name() +
           "' has no model section, so no config.json can describe it");
  const ModelConfig &m = bundle.model();
  std::map<std::string, const Parameter *> parameters;
  for (const Parameter &p : bundle.parameters())
    parameters[p.name] = &p;
  auto has = [&](const std::string &name) {
    return parameters.count(name) > 0;
  };
  auto shape = [&](const std::string &name) -> const std::vector<int64_t> & {
    static const std::vector<int64_t> none;
    auto it = parameters.find(name);
    return it == parameters.end() ? none : it->second->type.shape;
  };
  const int64_t groups =
      m.numQueryGroups ? m.numQueryGroups : m.numAttentionHeads;
  const Instruction *dropout = findInstruction(bundle, Op::Dropout);
  const Instruction *attention = findInstruction(bundle, Op::Attention);
  double hiddenDropout = dropout ? dropout->attrs.p : 0.0;
  double attentionDropout = attention ? attention->attrs.dropoutP : 0.0;

  Json config;
  if (has("transformer.wte.weight")) {
    // GPT2Config describes LayerNorm, GeLU and biases on every layer.
    const Instruction *norm = findInstruction(bundle, Op::LayerNorm);
    if (!norm || !has("transformer.h.0.attn.c_attn.bias") ||
        !has("transformer.h.0.mlp.c_proj.bias"))
      refuse("the model uses GPT-2's names but not GPT-2's layers "
             "(LayerNorm and biases on every linear layer), so no GPT2Config "
             "describes it; export-hf writes config.json for GPT-2, Llama, "
             "Qwen2 and Qwen3 models");
    const std::vector<int64_t> &fc = shape("transformer.h.0.mlp.c_fc.weight");
    const std::vector<int64_t> &proj =
        shape("transformer.h.0.mlp.c_proj.weight");
    if (fc.size() != 2 || proj.size() != 2 || fc[1] != proj[0])
      refuse("the model's MLP is gated (SwiGLU), which GPT2Config cannot "
             "describe; export-hf writes config.json for GPT-2 with GeLU");
    const Instruction *gelu = findInstruction(bundle, Op::Gelu);
    if (!gelu)
      gelu = findInstruction(bundle, Op::LinearGelu);
    bool tanh = !gelu || gelu->attrs.approximate == GeluApproximate::Tanh;
    const Parameter *wte = parameters["transformer.wte.weight"];
    config = {
        {"architectures", {"GPT2LMHeadModel"}},
        {"model_type", "gpt2"},
        {"vocab_size", m.vocabSize},
        {"n_positions", shape("transformer.wpe.weight").at(0)},
        {"n_embd", m.hiddenSize},
        {"n_layer", m.numLayers},
        {"n_head", m.numAttentionHeads},
        {"n_inner", fc[1]},
        {"activation_function", tanh ? "gelu_new" : "gelu"},
        {"resid_pdrop", hiddenDropout},
        {"embd_pdrop", hiddenDropout},
        {"attn_pdrop", attentionDropout},
        {"layer_norm_epsilon", norm->attrs.epsilon},
        {"initializer_range", wte->std > 0 ? wte->std : 0.02},
        {"scale_attn_weights", true},
        {"tie_word_embeddings", !has("lm_head.weight")},
        {"torch_dtype", "float32"},
    };
    if (groups != m.numAttentionHeads)
      refuse("the model groups its keys and values (" + std::to_string(groups) +
             " groups of " + std::to_string(m.numAttentionHeads) +
             " heads), which GPT2Config cannot describe");
    return config;
  }

  const std::string layer0 = "model.layers.0.";
  const bool qNorm = has(layer0 + "self_attn.q_norm.weight");
  const bool qkvBias = has(layer0 + "self_attn.q_proj.bias");
  const bool outBias = has(layer0 + "self_attn.o_proj.bias");
  const bool mlpBias = has(layer0 + "mlp.down_proj.bias");
  const Instruction *norm = findInstruction(bundle, Op::RmsNorm);
  if (!norm || !has(layer0 + "mlp.gate_proj.weight"))
    refuse("the model uses Llama's names but not Llama's layers (RMSNorm and "
           "SwiGLU), so no LlamaConfig describes it");
  const Instruction *rope = findInstruction(
      bundle, Op::Rope, [](const Instruction &i) { return !i.attrs.inverse; });
  if (!rope)
    refuse("the model uses Llama's names without RoPE, which no LlamaConfig "
           "describes");
  const std::vector<int64_t> &q = shape(layer0 + "self_attn.q_proj.weight");
  const std::vector<int64_t> &up = shape(layer0 + "mlp.up_proj.weight");
  const int64_t headDim = q.empty() ? 0 : q[0] / m.numAttentionHeads;
  std::string type = "llama", architecture = "LlamaForCausalLM";
  if (qNorm) {
    if (qkvBias != outBias || mlpBias)
      refuse("the model normalizes queries and keys (Qwen3's q_norm) with "
             "biases other than on all four attention projections, which no "
             "Qwen3Config describes");
    type = "qwen3", architecture = "Qwen3ForCausalLM";
  } else if (qkvBias && !outBias) {
    if (mlpBias)
      refuse("the model has biases on q, k, v and the MLP but not on o_proj, "
             "which no LlamaConfig or Qwen2Config describes");
    type = "qwen2", architecture = "Qwen2ForCausalLM";
  } else if (qkvBias != mlpBias) {
    refuse("the model has biases on the attention's projections but not on "
           "the MLP's, or the other way round: LlamaConfig's attention_bias "
           "and mlp_bias, set alike here");
  }
  const Attributes &r = rope->attrs;
  config = {
      {"architectures", {architecture}},
      {"model_type", type},
      {"vocab_size", m.vocabSize},
      {"hidden_size", m.hiddenSize},
      {"intermediate_size", up.empty() ? m.ffnHiddenSize : up[0]},
      {"num_hidden_layers", m.numLayers},
      {"num_attention_heads", m.numAttentionHeads},
      {"num_key_value_heads", groups},
      {"hidden_act", "silu"},
      {"max_position_embeddings", m.seqLength},
      {"rms_norm_eps", norm->attrs.epsilon},
      {"rope_theta", Json(r.base)},
      {"rope_scaling", ropeScaling(r)},
      {"attention_dropout", attentionDropout},
      {"initializer_range", 0.02},
      {"tie_word_embeddings", !has("lm_head.weight")},
      {"torch_dtype", "float32"},
  };
  if (const Parameter *embed = parameters.count("model.embed_tokens.weight")
                                   ? parameters["model.embed_tokens.weight"]
                                   : nullptr)
    if (embed->std > 0)
      config["initializer_range"] = embed->std;
  if (type != "qwen2")
    config["head_dim"] = headDim;
  else if (headDim * m.numAttentionHeads != m.hiddenSize)
    refuse("the model's head dimension " + std::to_string(headDim) +
           " is not hidden_size / num_attention_heads, which Qwen2Config "
           "cannot describe (it has no head_dim)");
  if (type == "llama") {
    config["attention_bias"] = qkvBias;
    config["mlp_bias"] = mlpBias;
  }
  if (type == "qwen3")
    config["attention_bias"] = qkvBias;
  if (type != "llama") {
    config["use_sliding_window"] = false;
    config["sliding_window"] = nullptr;
  }
  return config;
}

Json huggingFaceGenerationConfig() { return {{"_from_model_config", true}}; }

} // namespace mtrt::train
