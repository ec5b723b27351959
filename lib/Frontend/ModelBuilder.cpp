//===- ModelBuilder.cpp - A CompileConfig into model-level (mt) IR --------===//

#include "megatron/Frontend/ModelBuilder.h"

#include "mt/IR/MtOps.h"
#include "mt/IR/MtShapeRules.h"
#include "mt/IR/MtDialect.h"

#include "mlir/Dialect/Func/IR/FuncOps.h"
#include "mlir/IR/Builders.h"
#include "llvm/ADT/Twine.h"
#include "llvm/Support/ErrorHandling.h"

#include <cmath>
#include <optional>

using namespace mlir;
using namespace megatron;

namespace {

/// The parameter names of one model family.
struct Naming {
  bool gpt2;
  std::string layer(int64_t index, StringRef leaf) const {
    return (llvm::Twine(gpt2 ? "transformer.h." : "model.layers.") +
            llvm::Twine(index) + "." + leaf)
        .str();
  }
};

/// Emits the parameters and the step functions of one model.
class ModelBuilder {
public:
  ModelBuilder(MLIRContext &context, const CompileConfig &config,
               ArrayRef<StageLayers> stages)
      : config(config), model(config.model), stages(stages), builder(&context),
        loc(builder.getUnknownLoc()),
        naming{model.positionEmbeddingType ==
               PositionEmbedding::LearnedAbsolute} {}

  OwningOpRef<ModuleOp> build();

private:
  /// Declares a parameter at the module level; returns its name.
  void declare(StringRef name, ArrayRef<int64_t> shape, mt::InitMethod init,
               double std = 0.0, double expertBiasUpdateRate = 0.0);
  void declareParameters();
  /// What a step function computes from its token batch.
  enum class StepKind { Train, Eval, Predict };
  /// Builds the whole model as `name`, or, for a pipeline stage, the layers
  /// of `stage` as `name`_stage<index> (docs/Pipeline.md).
  void buildStep(StringRef name, StepKind kind,
                 std::optional<int64_t> stage = std::nullopt);

  Value get(StringRef name);
  Value getIf(bool present, StringRef name) { return present ? get(name) : Value(); }
  Value linear(Value x, StringRef weight, StringRef bias, bool transposeWeight);
  Value norm(Value x, StringRef weight, StringRef bias);
  /// Qwen3's per-head q_norm / k_norm over [batch, seq, heads, head_dim].
  Value headNorm(Value x, int64_t layer, StringRef which);
  Value dropout(Value x, double p);
  Value reshape(Value x, ArrayRef<int64_t> shape);
  Value attention(Value x, int64_t layer);
  Value mlp(Value x, int64_t layer);
  /// The MLP's activation of its input projections, `project(leaf)` each:
  /// SwiGLU of gate_proj and up_proj (GPT-2's names: one c_fc whose last
  /// dimension splits into [gate | up], as Megatron-LM's fused fc1), or
  /// GeLU of up_proj (c_fc).
  Value activatedProjections(llvm::function_ref<Value(StringRef)> project);
  /// The MoE layer in place of layer `layer`'s MLP (docs/MoE.md); a
  /// training step collects its auxiliary losses in auxLosses.
  Value moeMlp(Value x, int64_t layer);
  /// Declares layer `layer`'s router, experts and shared expert.
  void declareMoe(int64_t layer, double std, double outputStd);

  /// Shape rules cannot fail on a validated configuration; if one does, the
  /// builder has a bug.
  RankedTensorType check(FailureOr<RankedTensorType> type) {
    if (failed(type))
      llvm::report_fatal_error("internal error: the model builder produced "
                               "ill-shaped IR (see the diagnostic above)");
    return *type;
  }
  mt::EmitErrorFn emitter() { return emitError; }
  /// `"layers.<i>"` or `"layers.<i>.core_attention"`: debug information for
  /// the reader, which no pass reads (the ops' mt.layer says the layer).
  Location layerLocation(int64_t layer, bool coreAttention) {
    return NameLoc::get(builder.getStringAttr(
        llvm::Twine("layers.") + llvm::Twine(layer) +
        (coreAttention ? ".core_attention" : "")));
  }
  static RankedTensorType typeOf(Value v) {
    return cast<RankedTensorType>(v.getType());
  }

  const CompileConfig &config;
  const ModelConfig &model;
  ArrayRef<StageLayers> stages;
  OpBuilder builder;
  Location loc;
  Naming naming;
  ModuleOp module;
  llvm::StringMap<RankedTensorType> parameterTypes;
  std::function<InFlightDiagnostic()> emitError = [this] {
    return mlir::emitError(loc);
  };
  /// The step being built: training adds dropout; dropout sites get
  /// consecutive seeds so every site draws its own stream.
  bool training = false;
  int64_t nextSeed = 0;
  /// The training step's MoE auxiliary losses (load balancing and z-loss),
  /// added to its loss, and each kind's apart (for the reported losses).
  SmallVector<Value> auxLosses, loadBalancingLosses, zLosses;
  /// Returns `output` (train_step's loss, a pipeline stage's activation or
  /// the last stage's language-model loss), followed in a training step
  /// with MoE auxiliary losses by its reported losses: `aux_loss` (the
  /// auxiliary losses as they join the loss; the runtime adds a stage's to
  /// the loss and seeds its gradient with 1, as Megatron-LM's
  /// MoEAuxLossAutoScaler does on the stage that computed it), then
  /// Megatron-LM's logged `load_balancing_loss` and `z_loss` (each kind
  /// without its coefficient, over the model's MoE layers: a stage's part
  /// of the mean).
  void returnWithReportedLosses(func::FuncOp function, Value output);
};

} // namespace

void ModelBuilder::declare(StringRef name, ArrayRef<int64_t> shape,
                           mt::InitMethod init, double std,
                           double expertBiasUpdateRate) {
  auto type = RankedTensorType::get(shape, builder.getF32Type());
  parameterTypes[name] = type;
  FloatAttr stdAttr =
      init == mt::InitMethod::Normal ? builder.getF64FloatAttr(std) : nullptr;
  FloatAttr rateAttr = expertBiasUpdateRate > 0
                           ? builder.getF64FloatAttr(expertBiasUpdateRate)
                           : nullptr;
  mt::ParameterOp::create(
      builder, loc, builder.getStringAttr(name), TypeAttr::get(type),
      mt::InitMethodAttr::get(builder.getContext(), init), stdAttr, rateAttr);
}

void ModelBuilder::declareParameters() {
  const int64_t hidden = model.hiddenSize, vocab = config.paddedVocabSize();
  const int64_t qSize = model.numAttentionHeads * model.headDim();
  const int64_t kvSize = model.queryGroups() * model.headDim();
  const int64_t ffn = model.ffnSize();
  const bool bias = model.addBiasLinear;
  const bool swiglu = model.activation == Activation::Swiglu;
  const double std = model.initMethodStd;
  // Megatron-LM scales the init of the layers that feed the residual stream.
  const double outputStd = std / std::sqrt(2.0 * model.numLayers);
  const bool layerNorm = model.normalization == Normalization::LayerNorm;
  using mt::InitMethod;

  auto declareNorm = [&](const std::string &prefix) {
    declare(prefix + ".weight", {hidden}, InitMethod::Ones);
    if (layerNorm)
      declare(prefix + ".bias", {hidden}, InitMethod::Zeros);
  };
  // Weights are in x out for GPT-2's Conv1D, out x in for Llama's Linear.
  auto declareLinear = [&](const std::string &prefix, int64_t in, int64_t out,
                           double weightStd, bool withBias) {
    if (naming.gpt2)
      declare(prefix + ".weight", {in, out}, InitMethod::Normal, weightStd);
    else
      declare(prefix + ".weight", {out, in}, InitMethod::Normal, weightStd);
    if (withBias)
      declare(prefix + ".bias", {out}, InitMethod::Zeros);
  };
  const bool qkvBias = model.qkvBias();
  // Qwen3's q_norm and k_norm (Megatron-LM's qk_layernorm): one weight of
  // the head dimension, shared by every head.
  auto declareQkNorms = [&](int64_t i, StringRef attention) {
    if (!model.qkLayernorm)
      return;
    for (StringRef which : {"q_norm", "k_norm"}) {
      std::string prefix = naming.layer(i, (attention + "." + which).str());
      declare(prefix + ".weight", {model.headDim()}, InitMethod::Ones);
      if (layerNorm)
        declare(prefix + ".bias", {model.headDim()}, InitMethod::Zeros);
    }
  };

  if (naming.gpt2) {
    declare("transformer.wte.weight", {vocab, hidden}, InitMethod::Normal, std);
    declare("transformer.wpe.weight", {model.maxPositions(), hidden},
            InitMethod::Normal, std);
    for (int64_t i = 0; i < model.numLayers; ++i) {
      declareNorm(naming.layer(i, "ln_1"));
      declareLinear(naming.layer(i, "attn.c_attn"), hidden, qSize + 2 * kvSize,
                    std, qkvBias);
      declareQkNorms(i, "attn");
      declareLinear(naming.layer(i, "attn.c_proj"), qSize, hidden, outputStd,
                    bias);
      declareNorm(naming.layer(i, "ln_2"));
      if (config.moe.isMoeLayer(i)) {
        declareMoe(i, std, outputStd);
        continue;
      }
      declareLinear(naming.layer(i, "mlp.c_fc"), hidden, swiglu ? 2 * ffn : ffn,
                    std, bias);
      declareLinear(naming.layer(i, "mlp.c_proj"), ffn, hidden, outputStd,
                    bias);
    }
    declareNorm("transformer.ln_f");
  } else {
    declare("model.embed_tokens.weight", {vocab, hidden}, InitMethod::Normal,
            std);
    for (int64_t i = 0; i < model.numLayers; ++i) {
      declareNorm(naming.layer(i, "input_layernorm"));
      declareLinear(naming.layer(i, "self_attn.q_proj"), hidden, qSize, std,
                    qkvBias);
      declareLinear(naming.layer(i, "self_attn.k_proj"), hidden, kvSize, std,
                    qkvBias);
      declareLinear(naming.layer(i, "self_attn.v_proj"), hidden, kvSize, std,
                    qkvBias);
      declareQkNorms(i, "self_attn");
      declareLinear(naming.layer(i, "self_attn.o_proj"), qSize, hidden,
                    outputStd, bias);
      declareNorm(naming.layer(i, "post_attention_layernorm"));
      if (config.moe.isMoeLayer(i)) {
        declareMoe(i, std, outputStd);
        continue;
      }
      if (swiglu)
        declareLinear(naming.layer(i, "mlp.gate_proj"), hidden, ffn, std, bias);
      declareLinear(naming.layer(i, "mlp.up_proj"), hidden, ffn, std, bias);
      declareLinear(naming.layer(i, "mlp.down_proj"), ffn, hidden, outputStd,
                    bias);
    }
    declareNorm("model.norm");
  }
  if (model.untieEmbeddingsAndOutputWeights)
    declare("lm_head.weight", {vocab, hidden}, InitMethod::Normal, std);
  // Aux-loss-free balancing's expert biases, zeros as Megatron-LM's buffers
  // (DeepSeek-V3's name): the runtime moves them, the optimizer does not.
  // Last, so that every other parameter keeps its index and so its initial
  // values (drawn by index): the first iteration is the model's without.
  if (config.moe.routerEnableExpertBias)
    for (int64_t i = 0; i < model.numLayers; ++i)
      if (config.moe.isMoeLayer(i))
        declare(naming.layer(i, "mlp.gate.e_score_correction_bias"),
                {config.moe.numExperts}, InitMethod::Zeros, 0.0,
                config.moe.routerBiasUpdateRate);
}

void ModelBuilder::declareMoe(int64_t i, double std, double outputStd) {
  const MoeConfig &moe = config.moe;
  const int64_t hidden = model.hiddenSize, experts = moe.numExperts;
  const int64_t ffn = moe.ffnHiddenSize ? moe.ffnHiddenSize : model.ffnSize();
  const bool swiglu = model.activation == Activation::Swiglu;
  using mt::InitMethod;
  // The router: Megatron-LM's init_method, no bias; in x out under GPT-2's
  // names, out x in under Llama's, like every linear layer.
  std::string gate = naming.layer(i, "mlp.gate.weight");
  if (naming.gpt2)
    declare(gate, {hidden, experts}, InitMethod::Normal, std);
  else
    declare(gate, {experts, hidden}, InitMethod::Normal, std);
  // The experts as one tensor per projection, [E, out, in] (torch.nn.Linear
  // stacked, as transformers' fused expert tensors) under Llama's names,
  // [E, in, out] under GPT-2's; no biases (Megatron-LM's GroupedMLP).
  auto declareExperts = [&](StringRef leaf, int64_t in, int64_t out,
                            double weightStd) {
    std::string name = naming.layer(i, ("mlp.experts." + leaf + ".weight").str());
    if (naming.gpt2)
      declare(name, {experts, in, out}, InitMethod::Normal, weightStd);
    else
      declare(name, {experts, out, in}, InitMethod::Normal, weightStd);
  };
  if (naming.gpt2) {
    declareExperts("c_fc", hidden, swiglu ? 2 * ffn : ffn, std);
    declareExperts("c_proj", ffn, hidden, outputStd);
  } else {
    if (swiglu)
      declareExperts("gate_proj", hidden, ffn, std);
    declareExperts("up_proj", hidden, ffn, std);
    declareExperts("down_proj", ffn, hidden, outputStd);
  }
  const int64_t shared = moe.sharedExpertIntermediateSize;
  if (!shared)
    return;
  // The shared expert: an ordinary MLP of its own width beside the experts,
  // with the model's biases (Megatron-LM's SharedExpertMLP).
  const bool bias = model.addBiasLinear;
  auto declareLinear = [&](StringRef leaf, int64_t in, int64_t out,
                           double weightStd) {
    std::string prefix = naming.layer(i, ("mlp.shared_expert." + leaf).str());
    if (naming.gpt2)
      declare(prefix + ".weight", {in, out}, InitMethod::Normal, weightStd);
    else
      declare(prefix + ".weight", {out, in}, InitMethod::Normal, weightStd);
    if (bias)
      declare(prefix + ".bias", {out}, InitMethod::Zeros);
  };
  if (naming.gpt2) {
    declareLinear("c_fc", hidden, swiglu ? 2 * shared : shared, std);
    declareLinear("c_proj", shared, hidden, outputStd);
  } else {
    if (swiglu)
      declareLinear("gate_proj", hidden, shared, std);
    declareLinear("up_proj", hidden, shared, std);
    declareLinear("down_proj", shared, hidden, outputStd);
  }
}

Value ModelBuilder::get(StringRef name) {
  auto it = parameterTypes.find(name);
  if (it == parameterTypes.end())
    llvm::report_fatal_error("internal error: no parameter named " +
                             llvm::Twine(name));
  return mt::GetParameterOp::create(builder, loc, it->second, name);
}

Value ModelBuilder::linear(Value x, StringRef weight, StringRef bias,
                           bool transposeWeight) {
  Value w = get(weight);
  // Biases are where declareParameters put them: add_bias_linear's on every
  // linear layer, add_qkv_bias's on q, k and v.
  Value b = parameterTypes.count(bias) ? get(bias) : Value();
  RankedTensorType type = check(mt::inferLinearType(
      typeOf(x), typeOf(w), b ? typeOf(b) : RankedTensorType(),
      transposeWeight, emitter()));
  return mt::LinearOp::create(builder, loc, type, x, w, b, transposeWeight);
}

Value ModelBuilder::norm(Value x, StringRef weight, StringRef bias) {
  FloatAttr epsilon = builder.getF64FloatAttr(model.normEpsilon);
  Value w = get(weight);
  if (model.normalization == Normalization::RMSNorm)
    return mt::RmsNormOp::create(builder, loc, typeOf(x), x, w, epsilon);
  Value b = get(bias);
  return mt::LayerNormOp::create(builder, loc, typeOf(x), x, w, b, epsilon);
}

Value ModelBuilder::headNorm(Value x, int64_t layer, StringRef which) {
  if (!model.qkLayernorm)
    return x;
  std::string prefix =
      naming.layer(layer, ((naming.gpt2 ? "attn." : "self_attn.") + which).str());
  return norm(x, prefix + ".weight", prefix + ".bias");
}

Value ModelBuilder::dropout(Value x, double p) {
  if (!training || p == 0.0)
    return x;
  return mt::DropoutOp::create(builder, loc, typeOf(x), x,
                               builder.getF64FloatAttr(p),
                               builder.getI64IntegerAttr(nextSeed++));
}

Value ModelBuilder::reshape(Value x, ArrayRef<int64_t> shape) {
  if (typeOf(x).getShape() == shape)
    return x;
  auto type = RankedTensorType::get(shape, typeOf(x).getElementType());
  return mt::ReshapeOp::create(builder, loc, type, x);
}

Value ModelBuilder::attention(Value x, int64_t layer) {
  ArrayRef<int64_t> bsh = typeOf(x).getShape();
  const int64_t batch = bsh[0], seq = bsh[1], headDim = model.headDim();
  const int64_t heads = model.numAttentionHeads, groups = model.queryGroups();
  const bool transposeWeight = !naming.gpt2;
  Value q, k, v;
  if (naming.gpt2) {
    // The fused c_attn is stored in Megatron-LM's per-group layout: for each
    // query group, its heads' queries, then its key, then its value
    // ([G, (H/G + 2) * D] columns), so a column split gives every
    // tensor-parallel rank whole groups. Hugging Face's [q | k | v] is
    // converted on import and export (runtime/src/train/Weights.cpp).
    Value qkv = linear(x, naming.layer(layer, "attn.c_attn.weight"),
                       naming.layer(layer, "attn.c_attn.bias"), false);
    const int64_t perGroup = heads / groups;
    qkv = reshape(qkv, {batch, seq, groups, (perGroup + 2) * headDim});
    Type f32 = builder.getF32Type();
    SmallVector<Type> pieces = {
        RankedTensorType::get({batch, seq, groups, perGroup * headDim}, f32),
        RankedTensorType::get({batch, seq, groups, headDim}, f32),
        RankedTensorType::get({batch, seq, groups, headDim}, f32)};
    auto split = mt::SplitOp::create(builder, loc, pieces, qkv,
                                     builder.getI64IntegerAttr(3));
    q = split.getResult(0), k = split.getResult(1), v = split.getResult(2);
    if (perGroup > 1)
      q = reshape(q, {batch, seq, groups, perGroup, headDim});
  } else {
    auto project = [&](StringRef leaf) {
      return linear(x, naming.layer(layer, ("self_attn." + leaf + ".weight").str()),
                    naming.layer(layer, ("self_attn." + leaf + ".bias").str()),
                    transposeWeight);
    };
    q = project("q_proj"), k = project("k_proj"), v = project("v_proj");
  }
  q = reshape(q, {batch, seq, heads, headDim});
  k = reshape(k, {batch, seq, groups, headDim});
  v = reshape(v, {batch, seq, groups, headDim});
  q = headNorm(q, layer, "q_norm");
  k = headNorm(k, layer, "k_norm");
  if (model.positionEmbeddingType == PositionEmbedding::Rope) {
    FloatAttr base = builder.getF64FloatAttr(model.rotaryBase);
    FloatAttr factor, low, high, betaFast, betaSlow, attentionFactor;
    IntegerAttr original;
    BoolAttr truncate;
    if (model.ropeScaling != RopeScaling::None)
      factor = builder.getF64FloatAttr(model.ropeScalingFactor);
    if (model.ropeScaling == RopeScaling::Llama3) {
      low = builder.getF64FloatAttr(model.ropeLowFreqFactor);
      high = builder.getF64FloatAttr(model.ropeHighFreqFactor);
      original = builder.getI64IntegerAttr(model.ropeOriginalMaxPositions);
    }
    if (model.ropeScaling == RopeScaling::Yarn) {
      original = builder.getI64IntegerAttr(model.ropeOriginalMaxPositions);
      betaFast = builder.getF64FloatAttr(model.ropeBetaFast);
      betaSlow = builder.getF64FloatAttr(model.ropeBetaSlow);
      if (!model.ropeTruncate)
        truncate = builder.getBoolAttr(false);
    }
    if (model.ropeAttentionFactor != 1.0)
      attentionFactor = builder.getF64FloatAttr(model.ropeAttentionFactor);
    auto rope = [&](Value x) -> Value {
      return mt::RopeOp::create(builder, loc, typeOf(x), x, base,
                                IntegerAttr(), UnitAttr(), factor, low, high,
                                original, betaFast, betaSlow, truncate,
                                attentionFactor);
    };
    q = rope(q);
    k = rope(k);
  }
  double attentionDropout = training ? model.attentionDropout : 0.0;
  // Megatron-LM's core_attention module: what selective recomputation
  // recomputes (#mt.layer<i, core_attention>). The name location is debug
  // information for the reader only.
  Location layerLoc = loc;
  loc = layerLocation(layer, /*coreAttention=*/true);
  Value context;
  {
    mt::LayerScope coreAttention(
        builder, mt::LayerAttr::get(builder.getContext(), layer,
                                    /*coreAttention=*/true));
    RankedTensorType type = check(mt::inferAttentionType(
        typeOf(q), typeOf(k), typeOf(v), /*causal=*/true, emitter()));
    context = mt::AttentionOp::create(
        builder, loc, type, q, k, v, /*causal=*/builder.getUnitAttr(),
        /*scale=*/FloatAttr(), builder.getF64FloatAttr(attentionDropout),
        builder.getI64IntegerAttr(attentionDropout > 0.0 ? nextSeed++ : 0));
    context = reshape(context, {batch, seq, heads * headDim});
  }
  loc = layerLoc;
  StringRef out = naming.gpt2 ? "attn.c_proj" : "self_attn.o_proj";
  return linear(context, naming.layer(layer, (out + ".weight").str()),
                naming.layer(layer, (out + ".bias").str()), transposeWeight);
}

Value ModelBuilder::activatedProjections(
    llvm::function_ref<Value(StringRef)> project) {
  if (model.activation != Activation::Swiglu) {
    Value up = project(naming.gpt2 ? "c_fc" : "up_proj");
    auto approximate = model.openaiGelu ? mt::GeluApproximation::Tanh
                                        : mt::GeluApproximation::Erf;
    return mt::GeluOp::create(
        builder, loc, typeOf(up), up,
        mt::GeluApproximationAttr::get(builder.getContext(), approximate));
  }
  Value gate, up;
  if (naming.gpt2) {
    // A fused c_fc yields [gate | up], as Megatron-LM's fused fc1.
    Value fused = project("c_fc");
    SmallVector<int64_t> shape(typeOf(fused).getShape());
    int64_t last = static_cast<int64_t>(shape.size()) - 1;
    shape[last] /= 2;
    auto half = RankedTensorType::get(shape, builder.getF32Type());
    auto split = mt::SplitOp::create(builder, loc, TypeRange{half, half},
                                     fused, builder.getI64IntegerAttr(last));
    gate = split.getResult(0), up = split.getResult(1);
  } else {
    gate = project("gate_proj"), up = project("up_proj");
  }
  return mt::SwigluOp::create(builder, loc, typeOf(gate), gate, up);
}

Value ModelBuilder::mlp(Value x, int64_t layer) {
  const bool transposeWeight = !naming.gpt2;
  auto project = [&](StringRef leaf, Value input) {
    return linear(input, naming.layer(layer, ("mlp." + leaf + ".weight").str()),
                  naming.layer(layer, ("mlp." + leaf + ".bias").str()),
                  transposeWeight);
  };
  Value hidden =
      activatedProjections([&](StringRef leaf) { return project(leaf, x); });
  return project(naming.gpt2 ? "c_proj" : "down_proj", hidden);
}

Value ModelBuilder::moeMlp(Value x, int64_t layer) {
  const MoeConfig &moe = config.moe;
  const bool transposeWeight = !naming.gpt2;
  MLIRContext *context = builder.getContext();
  ArrayRef<int64_t> bsh = typeOf(x).getShape();
  const int64_t tokens = bsh[0] * bsh[1], hidden = bsh[2];
  Value flat = reshape(x, {tokens, hidden});

  // The router: logits, top-k and (training) the auxiliary losses.
  Value logits = linear(flat, naming.layer(layer, "mlp.gate.weight"), "",
                        transposeWeight);
  auto score = mt::MoeScoreFunctionAttr::get(
      context, moe.scoreFunction == MoeScoreFunction::Sigmoid
                   ? mt::MoeScoreFunction::Sigmoid
                   : mt::MoeScoreFunction::Softmax);
  IntegerAttr topk = builder.getI64IntegerAttr(moe.routerTopk);
  RankedTensorType probsType =
      check(mt::inferMoeRouteType(typeOf(logits), moe.routerTopk, emitter()));
  auto indicesType =
      RankedTensorType::get(probsType.getShape(), builder.getI32Type());
  FloatAttr capacity;
  mt::MoeDropPolicyAttr dropPolicy;
  if (moe.expertCapacityFactor > 0) {
    capacity = builder.getF64FloatAttr(moe.expertCapacityFactor);
    dropPolicy = mt::MoeDropPolicyAttr::get(
        context, moe.dropPolicy == MoeDropPolicy::Position
                     ? mt::MoeDropPolicy::Position
                     : mt::MoeDropPolicy::Probs);
  }
  IntegerAttr numGroups, groupTopk;
  if (moe.routerGroupTopk > 0) {
    numGroups = builder.getI64IntegerAttr(moe.routerNumGroups);
    groupTopk = builder.getI64IntegerAttr(moe.routerGroupTopk);
  }
  std::string expertBias =
      naming.layer(layer, "mlp.gate.e_score_correction_bias");
  auto route = mt::MoeRouteOp::create(
      builder, loc, probsType, indicesType, logits,
      moe.routerEnableExpertBias ? get(expertBias) : Value(), topk, score,
      moe.normalizeTopk() ? builder.getUnitAttr() : UnitAttr(), numGroups,
      groupTopk, capacity, dropPolicy);
  Value probs = route.getProbs(), indices = route.getIndices();
  if (training && moe.routerEnableExpertBias) {
    // The tokens each expert kept, accumulated into the bias's gradient:
    // the runtime sums them over the micro-batches and data-parallel ranks
    // and moves the bias after the iteration (mt.parameter's
    // expert_bias_update_rate).
    auto loadType =
        RankedTensorType::get({moe.numExperts}, builder.getF32Type());
    Value load =
        mt::MoeTokensPerExpertOp::create(builder, loc, loadType, indices);
    mt::AccumulateGradientOp::create(
        builder, loc, FlatSymbolRefAttr::get(builder.getContext(), expertBias),
        load);
  }
  if (moe.topkScalingFactor > 0) {
    // --moe-router-topk-scaling-factor: the weights times the factor, after
    // their normalization (Megatron-LM's topk_routing_with_score_function);
    // the auxiliary losses read the logits, not these.
    Value factor = mt::FillOp::create(
        builder, loc, RankedTensorType::get({}, builder.getF32Type()),
        builder.getF64FloatAttr(moe.topkScalingFactor));
    probs = mt::ScaleOp::create(builder, loc, probsType, probs, factor);
  }
  auto lossType = RankedTensorType::get({}, builder.getF32Type());
  if (training && moe.loadBalancing != MoeLoadBalancing::None &&
      moe.auxLossCoeff > 0) {
    // seq_aux_loss: the mean over the micro-batch's sequences, the flat
    // tokens' runs of seq_length.
    IntegerAttr perSequence;
    if (moe.loadBalancing == MoeLoadBalancing::SeqAuxLoss)
      perSequence = builder.getI64IntegerAttr(model.seqLength);
    auxLosses.push_back(mt::MoeAuxLossOp::create(
        builder, loc, lossType, logits, topk, score,
        builder.getF64FloatAttr(moe.auxLossCoeff), perSequence));
    loadBalancingLosses.push_back(auxLosses.back());
  }
  if (training && moe.zLossCoeff > 0) {
    auxLosses.push_back(mt::MoeZLossOp::create(
        builder, loc, lossType, logits,
        builder.getF64FloatAttr(moe.zLossCoeff)));
    zLosses.push_back(auxLosses.back());
  }

  // The experts over the permuted copies of the tokens.
  Value rows = mt::MoePermuteOp::create(
      builder, loc,
      check(mt::inferMoePermuteType(typeOf(flat), indicesType,
                                    RankedTensorType(), emitter())),
      flat, indices, Value());
  auto grouped = [&](Value input, StringRef leaf) -> Value {
    Value w = get(naming.layer(layer, ("mlp.experts." + leaf + ".weight").str()));
    return mt::MoeGroupedLinearOp::create(
        builder, loc,
        check(mt::inferMoeGroupedLinearType(typeOf(input), typeOf(w),
                                            indicesType, transposeWeight,
                                            emitter())),
        input, w, indices, transposeWeight ? builder.getUnitAttr() : UnitAttr());
  };
  Value hiddenRows = activatedProjections(
      [&](StringRef leaf) { return grouped(rows, leaf); });
  Value expertRows = grouped(hiddenRows, naming.gpt2 ? "c_proj" : "down_proj");
  Value y = mt::MoeUnpermuteOp::create(
      builder, loc,
      check(mt::inferMoeUnpermuteType(typeOf(expertRows), indicesType,
                                      probsType, emitter())),
      expertRows, indices, probs);

  if (moe.sharedExpertIntermediateSize) {
    // An ordinary MLP over every token, added to the routed experts'.
    auto project = [&](StringRef leaf, Value input) {
      std::string prefix =
          naming.layer(layer, ("mlp.shared_expert." + leaf).str());
      return linear(input, prefix + ".weight", prefix + ".bias",
                    transposeWeight);
    };
    Value sharedHidden = activatedProjections(
        [&](StringRef leaf) { return project(leaf, flat); });
    Value shared = project(naming.gpt2 ? "c_proj" : "down_proj", sharedHidden);
    y = mt::AddOp::create(builder, loc, typeOf(y), y, shared);
  }
  return reshape(y, bsh);
}

void ModelBuilder::buildStep(StringRef name, StepKind kind,
                             std::optional<int64_t> stage) {
  training = kind == StepKind::Train;
  auxLosses.clear();
  loadBalancingLosses.clear();
  zLosses.clear();
  // Stages continue the dropout seeds of the stages before them, so every
  // site keeps the seed it has in the whole model.
  if (!stage || *stage == 0)
    nextSeed = 0;
  const bool first = !stage || *stage == 0;
  const bool last = !stage || *stage + 1 == static_cast<int64_t>(stages.size());
  const int64_t firstLayer = stage ? stages[*stage].firstLayer : 0;
  const int64_t endLayer =
      stage ? firstLayer + stages[*stage].numLayers : model.numLayers;
  const int64_t batch =
      config.batch.microBatchSize * config.parallel.dataParallelSize;
  const int64_t seq = model.seqLength;
  auto tokensType = RankedTensorType::get({batch, seq}, builder.getI32Type());
  auto lossType = RankedTensorType::get({}, builder.getF32Type());
  auto logitsType = RankedTensorType::get(
      {batch, seq, config.paddedVocabSize()}, builder.getF32Type());
  auto activationType = RankedTensorType::get({batch, seq, model.hiddenSize},
                                              builder.getF32Type());
  bool predict = kind == StepKind::Predict;
  SmallVector<Type> inputs = {first ? tokensType : activationType};
  if (!predict && last)
    inputs.push_back(tokensType);
  Type resultType =
      !last ? activationType : predict ? logitsType : lossType;
  std::string functionName =
      stage ? (name + "_stage" + llvm::Twine(*stage)).str() : name.str();
  auto function = func::FuncOp::create(
      builder, loc, functionName,
      builder.getFunctionType(inputs, {resultType}));
  function.setArgAttr(0, "mt.name",
                      builder.getStringAttr(first ? "tokens" : "activation"));
  if (!predict && last)
    function.setArgAttr(1, "mt.name", builder.getStringAttr("labels"));
  if (stage)
    function->setAttr("mt.pipeline_stage", builder.getI64IntegerAttr(*stage));
  OpBuilder::InsertionGuard guard(builder);
  builder.setInsertionPointToStart(function.addEntryBlock());
  Value tokens = function.getArgument(0);

  StringRef embeddingTable =
      naming.gpt2 ? "transformer.wte.weight" : "model.embed_tokens.weight";
  Value h = function.getArgument(0);
  if (first) {
    Value table = get(embeddingTable);
    h = mt::EmbeddingOp::create(
        builder, loc,
        check(mt::inferEmbeddingType(typeOf(table), tokensType, emitter())),
        table, tokens, /*vocab_shard_axes=*/DenseI64ArrayAttr());
    if (naming.gpt2) {
      Value positions = mt::PositionIdsOp::create(builder, loc, tokensType);
      Value wpe = get("transformer.wpe.weight");
      Value p = mt::EmbeddingOp::create(builder, loc, typeOf(h), wpe, positions,
                                        /*vocab_shard_axes=*/DenseI64ArrayAttr());
      h = mt::AddOp::create(builder, loc, typeOf(h), h, p);
    }
    h = dropout(h, model.hiddenDropout);
  }

  Location stepLoc = loc;
  for (int64_t i = firstLayer; i < endLayer; ++i) {
    // Recomputation and the memory report find a layer's ops by their
    // mt.layer attribute; the location names the layer for the reader.
    loc = layerLocation(i, /*coreAttention=*/false);
    mt::LayerScope layerScope(
        builder, mt::LayerAttr::get(builder.getContext(), i,
                                    /*coreAttention=*/false));
    StringRef norm1 = naming.gpt2 ? "ln_1" : "input_layernorm";
    StringRef norm2 = naming.gpt2 ? "ln_2" : "post_attention_layernorm";
    Value x = norm(h, naming.layer(i, (norm1 + ".weight").str()),
                   naming.layer(i, (norm1 + ".bias").str()));
    h = mt::AddOp::create(builder, loc, typeOf(h), h,
                          dropout(attention(x, i), model.hiddenDropout));
    x = norm(h, naming.layer(i, (norm2 + ".weight").str()),
             naming.layer(i, (norm2 + ".bias").str()));
    Value mlpOut = config.moe.isMoeLayer(i) ? moeMlp(x, i) : mlp(x, i);
    h = mt::AddOp::create(builder, loc, typeOf(h), h,
                          dropout(mlpOut, model.hiddenDropout));
  }
  loc = stepLoc;
  if (!last) {
    returnWithReportedLosses(function, h);
    return;
  }
  StringRef finalNorm = naming.gpt2 ? "transformer.ln_f" : "model.norm";
  h = norm(h, (finalNorm + ".weight").str(), (finalNorm + ".bias").str());

  // The output layer reads the vocabulary x hidden table, transposed.
  StringRef output = model.untieEmbeddingsAndOutputWeights ? "lm_head.weight"
                                                           : embeddingTable;
  Value outputWeight = get(output);
  Value logits = mt::LinearOp::create(
      builder, loc,
      check(mt::inferLinearType(typeOf(h), typeOf(outputWeight),
                                RankedTensorType(), true, emitter())),
      h, outputWeight, Value(), /*transpose_weight=*/true);
  if (predict) {
    // A pipeline's last stage names its logits: mt-annotate-shardings keeps
    // them whole along the sequence, unlike the stages' activations.
    if (stage)
      function.setResultAttr(0, "mt.name", builder.getStringAttr("logits"));
    func::ReturnOp::create(builder, loc, logits);
    return;
  }
  Value loss = mt::CrossEntropyOp::create(
      builder, loc, lossType, logits, function.getArgument(1),
      mt::LossReductionAttr::get(builder.getContext(), mt::LossReduction::Mean),
      builder.getI64IntegerAttr(-100));
  // The MoE layers' auxiliary losses join the loss that is differentiated
  // (Megatron-LM adds their gradients through MoEAuxLossAutoScaler): in
  // train_step here, in a pipeline by the runtime (each stage returns its
  // own); the eval step has none.
  if (!stage)
    for (Value aux : auxLosses)
      loss = mt::AddOp::create(builder, loc, lossType, loss, aux);
  returnWithReportedLosses(function, loss);
}

void ModelBuilder::returnWithReportedLosses(func::FuncOp function,
                                            Value output) {
  if (auxLosses.empty()) {
    func::ReturnOp::create(builder, loc, output);
    return;
  }
  auto lossType = RankedTensorType::get({}, builder.getF32Type());
  auto sum = [&](ArrayRef<Value> losses) {
    Value total = losses.front();
    for (Value more : losses.drop_front())
      total = mt::AddOp::create(builder, loc, lossType, total, more);
    return total;
  };
  int64_t moeLayers = 0;
  for (int64_t i = 0; i < model.numLayers; ++i)
    moeLayers += config.moe.isMoeLayer(i);
  SmallVector<Value> results = {output, sum(auxLosses)};
  SmallVector<StringRef> names = {"aux_loss"};
  // Megatron-LM logs each kind divided by its coefficient, averaged over
  // the MoE layers (track_moe_metrics).
  auto report = [&](ArrayRef<Value> losses, double coeff, StringRef name) {
    if (losses.empty())
      return;
    Value total = sum(losses);
    Value scale = mt::FillOp::create(
        builder, loc, lossType,
        builder.getF64FloatAttr(1.0 / (coeff * static_cast<double>(moeLayers))));
    results.push_back(
        mt::MulOp::create(builder, loc, lossType, total, scale));
    names.push_back(name);
  };
  report(loadBalancingLosses, config.moe.auxLossCoeff,
         config.moe.loadBalancing == MoeLoadBalancing::SeqAuxLoss
             ? "seq_load_balancing_loss"
             : "load_balancing_loss");
  report(zLosses, config.moe.zLossCoeff, "z_loss");
  for (auto [i, name] : llvm::enumerate(names)) {
    LogicalResult added = function.insertResult(
        i + 1, lossType,
        builder.getDictionaryAttr(
            builder.getNamedAttr("mt.name", builder.getStringAttr(name))));
    assert(succeeded(added) && "the step has its output to add after");
    (void)added;
  }
  func::ReturnOp::create(builder, loc, results);
}

OwningOpRef<ModuleOp> ModelBuilder::build() {
  OwningOpRef<ModuleOp> owned = ModuleOp::create(loc, model.name);
  module = *owned;
  module->setAttr(mt::kModelAttrName,
                  modelAttr(*builder.getContext(), config));
  if (config.moe.enabled() && config.moe.routerFp32)
    module->setAttr(mt::kMoeRouterF32AttrName, builder.getUnitAttr());
  if (config.fp8.enabled())
    module->setAttr(mt::kFp8AttrName,
                    fp8RecipeAttr(*builder.getContext(), config.fp8));
  builder.setInsertionPointToEnd(module.getBody());
  declareParameters();
  if (stages.size() > 1) {
    for (auto [step, kind] : {std::pair{"train_step", StepKind::Train},
                              {"eval_step", StepKind::Eval},
                              {"predict_step", StepKind::Predict}})
      for (int64_t k = 0, e = stages.size(); k < e; ++k)
        buildStep(step, kind, k);
    return owned;
  }
  buildStep("train_step", StepKind::Train);
  buildStep("eval_step", StepKind::Eval);
  buildStep("predict_step", StepKind::Predict);
  return owned;
}

mt::ModelAttr megatron::modelAttr(MLIRContext &context,
                                  const CompileConfig &config) {
  const ModelConfig &model = config.model;
  StringRef precision = config.precision == Precision::BF16   ? "bf16"
                        : config.precision == Precision::FP16 ? "fp16"
                                                              : "fp32";
  const ParallelConfig &parallel = config.parallel;
  return mt::ModelAttr::get(
      &context, model.name, model.numLayers, model.hiddenSize,
      model.numAttentionHeads, model.queryGroups(), model.ffnSize(),
      model.seqLength, model.vocabSize, config.paddedVocabSize(),
      config.batch.microBatchSize, config.globalBatchSize(),
      parallel.tensorModelParallelSize, parallel.pipelineModelParallelSize,
      parallel.dataParallelSize, precision);
}

mt::Fp8RecipeAttr megatron::fp8RecipeAttr(MLIRContext &context,
                                          const Fp8Config &fp8) {
  bool keepEnds = fp8.firstLastLayersBf16;
  return mt::Fp8RecipeAttr::get(
      &context, fp8.format == Fp8Format::E4M3 ? "e4m3" : "hybrid",
      fp8.recipe == Fp8Recipe::Delayed ? "delayed" : "tensorwise",
      fp8.amaxHistoryLen, fp8.amaxComputeAlgo, fp8.margin,
      keepEnds ? fp8.numLayersAtStartInBf16 : 0,
      keepEnds ? fp8.numLayersAtEndInBf16 : 0);
}

OwningOpRef<ModuleOp>
megatron::buildModelModule(MLIRContext &context, const CompileConfig &config,
                           ArrayRef<StageLayers> stages) {
  context.loadDialect<mt::MtDialect, func::FuncDialect>();
  return ModelBuilder(context, config, stages).build();
}
