//===- CompileConfig.h - What a model file describes: model, layout, batch -*- C++ -*-===//
//
// The in-memory form of a model file (YAML with Megatron-LM's argument names
// in snake_case) or of a Hugging Face config.json, after command-line
// overrides. Every later stage reads the model only through this struct.
//
//===----------------------------------------------------------------------===//

#ifndef MEGATRON_FRONTEND_COMPILECONFIG_H
#define MEGATRON_FRONTEND_COMPILECONFIG_H

#include "llvm/ADT/ArrayRef.h"
#include "llvm/ADT/StringMap.h"
#include "llvm/ADT/StringRef.h"
#include "llvm/Support/Error.h"

#include <algorithm>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace megatron {

enum class Normalization { LayerNorm, RMSNorm };
enum class PositionEmbedding { LearnedAbsolute, Rope };
/// gelu is the exact (erf) form, as Megatron-LM's default; openai_gelu
/// selects the tanh approximation (GPT-2's gelu_new).
enum class Activation { Gelu, Swiglu };
enum class Precision { FP32, BF16, FP16 };
enum class RecomputeGranularity { None, Selective, Full };
/// How RoPE's inverse frequencies are rescaled for a longer context, as
/// Hugging Face's rope_type: none ("default"), all divided by a factor
/// ("linear"), Llama 3.1's blend by wavelength ("llama3"), or YaRN's ramp
/// by dimension with an attention factor ("yarn").
enum class RopeScaling { None, Linear, Llama3, Yarn };
/// How attention exchanges keys and values over the context-parallel group,
/// Megatron-LM's --cp-comm-type: a ring of point-to-point block exchanges
/// (p2p) or one all-gather of the keys and values (all_gather).
enum class CpCommType { P2P, AllGather };
/// Megatron-LM's --fp8-format: off, e4m3 for every GEMM operand, or hybrid
/// (e4m3 forward, e5m2 for the gradients the backward GEMMs read).
enum class Fp8Format { None, E4M3, Hybrid };
/// Megatron-LM's --fp8-recipe: delayed scaling (each tensor's scale from an
/// amax history of earlier steps) or tensorwise (current scaling: the scale
/// from the tensor's own amax, just before the cast).
enum class Fp8Recipe { Delayed, Tensorwise };

/// The transformer itself, with Megatron-LM's argument names.
struct ModelConfig {
  std::string name;
  int64_t numLayers = 0;
  int64_t hiddenSize = 0;
  int64_t numAttentionHeads = 0;
  /// Key/value heads for grouped-query attention; 0 means numAttentionHeads.
  int64_t numQueryGroups = 0;
  /// 0 means 4 * hiddenSize.
  int64_t ffnHiddenSize = 0;
  int64_t seqLength = 0;
  /// 0 means seqLength.
  int64_t maxPositionEmbeddings = 0;
  int64_t vocabSize = 0;
  int64_t makeVocabSizeDivisibleBy = 128;
  Normalization normalization = Normalization::LayerNorm;
  double normEpsilon = 1e-5;
  PositionEmbedding positionEmbeddingType = PositionEmbedding::LearnedAbsolute;
  double rotaryBase = 10000.0;
  RopeScaling ropeScaling = RopeScaling::None;
  /// Linear and llama3: the inverse frequencies (llama3: the long-wavelength
  /// ones) are divided by this factor.
  double ropeScalingFactor = 1.0;
  /// Llama3: wavelengths above original / low_freq_factor are divided by the
  /// factor, those below original / high_freq_factor kept, those between
  /// blended; original is the context length the model was trained at.
  double ropeLowFreqFactor = 1.0;
  double ropeHighFreqFactor = 4.0;
  int64_t ropeOriginalMaxPositions = 8192;
  /// Yarn: the rotations that bound the ramp between kept (below
  /// beta_fast's dimension) and divided (above beta_slow's) frequencies;
  /// truncate floors and ceils those dimensions; the attention factor (the
  /// mscale transformers computes) multiplies cos and sin. Yarn uses
  /// ropeOriginalMaxPositions too.
  double ropeBetaFast = 32.0;
  double ropeBetaSlow = 1.0;
  bool ropeTruncate = true;
  double ropeAttentionFactor = 1.0;
  /// Megatron-LM's --kv-channels (Hugging Face's head_dim): the width of
  /// each head; 0 means hidden_size / num_attention_heads.
  int64_t kvChannels = 0;
  /// Megatron-LM's --add-qkv-bias: biases on the query, key and value
  /// projections even when add_bias_linear is false (Qwen2's).
  bool addQkvBias = false;
  /// Megatron-LM's --qk-layernorm: each head's queries and keys normalized
  /// (with the model's normalization, weights of head_dim) before RoPE, as
  /// Qwen3's q_norm and k_norm.
  bool qkLayernorm = false;
  /// Sliding-window attention's window (Mistral's, Qwen's sliding_window);
  /// 0 means none. Only a window that covers seq_length is accepted, where
  /// it is the same as full causal attention.
  int64_t slidingWindow = 0;
  /// Hugging Face's vocab_size and parameter count are unpadded; set when
  /// the model was read from a config.json, for --report params.
  bool fromHuggingFace = false;
  Activation activation = Activation::Gelu;
  bool openaiGelu = false;
  bool addBiasLinear = true;
  bool untieEmbeddingsAndOutputWeights = false;
  double hiddenDropout = 0.1;
  double attentionDropout = 0.1;
  double initMethodStd = 0.02;

  int64_t queryGroups() const {
    return numQueryGroups ? numQueryGroups : numAttentionHeads;
  }
  int64_t ffnSize() const { return ffnHiddenSize ? ffnHiddenSize : 4 * hiddenSize; }
  int64_t maxPositions() const {
    return maxPositionEmbeddings ? maxPositionEmbeddings : seqLength;
  }
  int64_t headDim() const {
    return kvChannels ? kvChannels : hiddenSize / numAttentionHeads;
  }
  /// Biases on q, k and v: add_bias_linear's or add_qkv_bias's.
  bool qkvBias() const { return addBiasLinear || addQkvBias; }
};

/// How a mixture-of-experts router scores its experts, Megatron-LM's
/// --moe-router-score-function.
enum class MoeScoreFunction { Softmax, Sigmoid };
/// Which tokens an expert over its capacity keeps, Megatron-LM's
/// --moe-token-drop-policy: the highest routing weights, or the first tokens.
enum class MoeDropPolicy { Probs, Position };
/// Megatron-LM's --moe-router-load-balancing-type: the switch auxiliary loss
/// or none (sinkhorn, seq_aux_loss and global_aux_loss are refused by name).
/// --moe-router-load-balancing-type: the switch loss over the micro-batch
/// (aux_loss), its mean over the micro-batch's sequences (seq_aux_loss), or
/// none.
enum class MoeLoadBalancing { AuxLoss, SeqAuxLoss, None };

/// The mixture-of-experts layers (docs/MoE.md), with Megatron-LM's names.
/// numExperts 0 is a dense model, and every other field must then be unset.
struct MoeConfig {
  int64_t numExperts = 0;
  int64_t routerTopk = 2;
  MoeScoreFunction scoreFunction = MoeScoreFunction::Softmax;
  /// --moe-router-pre-softmax: the top-k of the softmax over all experts,
  /// not renormalized (softmax only).
  bool routerPreSoftmax = false;
  MoeLoadBalancing loadBalancing = MoeLoadBalancing::AuxLoss;
  /// --moe-router-dtype fp32: under bf16 the router's GEMMs (the logits,
  /// their input and weight gradients) read and write f32, as Megatron-LM
  /// computes them in fp32. Unset, they read bf16 like every GEMM and the
  /// logits and the routing are f32 (docs/MixedPrecision.md).
  bool routerFp32 = false;
  /// --moe-router-topk-scaling-factor: the top-k weights are multiplied by
  /// it after their normalization (DeepSeek-V3's routed_scaling_factor); 0
  /// (unset) for none.
  double topkScalingFactor = 0.0;
  /// --moe-router-num-groups and --moe-router-group-topk: group-limited
  /// routing (DeepSeek's): the experts form routerNumGroups groups and each
  /// token's top-k is taken within its routerGroupTopk best groups; 0
  /// (unset) for none.
  int64_t routerNumGroups = 0;
  int64_t routerGroupTopk = 0;
  /// --moe-router-enable-expert-bias: aux-loss-free balancing (DeepSeek-V3):
  /// a per-layer bias on the sigmoid scores for the top-k, updated after
  /// each iteration by routerBiasUpdateRate times the sign of each
  /// expert's load below the mean (--moe-router-bias-update-rate).
  bool routerEnableExpertBias = false;
  double routerBiasUpdateRate = 1e-3;
  double auxLossCoeff = 0.0;
  double zLossCoeff = 0.0;
  /// 0: dropless; else each expert keeps ceil(T * topk / E * factor) tokens.
  double expertCapacityFactor = 0.0;
  MoeDropPolicy dropPolicy = MoeDropPolicy::Probs;
  /// --moe-token-dropping as given (unset: implied by the capacity factor).
  std::optional<bool> tokenDropping;
  bool padExpertInputToCapacity = false;
  /// 0: no shared expert.
  int64_t sharedExpertIntermediateSize = 0;
  /// --moe-layer-freq: layer i is an MoE layer when i % layerFreq == 0, or,
  /// when layerPattern is not empty, when layerPattern[i] is 1.
  int64_t layerFreq = 1;
  std::vector<int64_t> layerPattern;
  /// 0 means ffn_hidden_size.
  int64_t ffnHiddenSize = 0;
  bool groupedGemm = false;
  int64_t expertModelParallelSize = 1;

  bool enabled() const { return numExperts > 0; }
  bool isMoeLayer(int64_t layer) const {
    if (!enabled())
      return false;
    if (!layerPattern.empty())
      return layer < static_cast<int64_t>(layerPattern.size()) &&
             layerPattern[layer] != 0;
    return layer % layerFreq == 0;
  }
  /// The top-k weights renormalized: softmax unless pre-softmax; sigmoid
  /// with more than one expert per token (Megatron-LM's rules).
  bool normalizeTopk() const {
    return scoreFunction == MoeScoreFunction::Softmax ? !routerPreSoftmax
                                                      : routerTopk > 1;
  }
};

/// Megatron-LM's parallel layout.
struct ParallelConfig {
  int64_t tensorModelParallelSize = 1;
  int64_t pipelineModelParallelSize = 1;
  /// 0 means no interleaving.
  int64_t virtualPipelineModelParallelSize = 0;
  bool sequenceParallel = false;
  /// Megatron-LM's --context-parallel-size: every activation's sequence is
  /// split over this many ranks, attention included (docs/Parallelism.md,
  /// "Context parallelism").
  int64_t contextParallelSize = 1;
  CpCommType cpCommType = CpCommType::P2P;
  int64_t dataParallelSize = 1;
  bool useDistributedOptimizer = false;
  /// Megatron-LM's --overlap-grad-reduce: the gradient buffer in buckets,
  /// each reduced during the last micro-batch's backward pass as soon as
  /// its gradients are complete (docs/Parallelism.md, "Gradient buckets").
  bool overlapGradReduce = false;
  /// Megatron-LM's --ddp-bucket-size: the least elements of a bucket (all
  /// but the last); 0 means Megatron-LM's default, max(4e7, 1e6 * dp).
  int64_t ddpBucketSize = 0;
  /// Megatron-LM's --tp-comm-overlap (needs sequence parallelism): the
  /// all-gather before a column-parallel GEMM and the reduce-scatter after a
  /// row-parallel one in chunks pipelined against chunks of the GEMM
  /// (docs/Parallelism.md, "Tensor-parallel communication in chunks").
  bool tpCommOverlap = false;
  /// Megatron-LM's --overlap-param-gather (it needs the distributed
  /// optimizer and overlapGradReduce): each bucket's parameters gathered
  /// before the next step first reads them (docs/Parallelism.md, "Gradient
  /// buckets").
  bool overlapParamGather = false;
  /// An explicit uneven pipeline split, as Megatron-LM's
  /// --decoder-first/last-pipeline-num-layers: the layers of the first and of
  /// the last stage; the other stages share the rest evenly. 0 means unset.
  int64_t decoderFirstPipelineNumLayers = 0;
  int64_t decoderLastPipelineNumLayers = 0;
  /// Megatron-LM's --num-layers-per-virtual-pipeline-stage, the other way to
  /// ask for interleaving; 0 means unset.
  int64_t numLayersPerVirtualPipelineStage = 0;

  /// The bucket size the compiler uses under overlapGradReduce.
  int64_t bucketElements() const {
    if (ddpBucketSize > 0)
      return ddpBucketSize;
    return std::max<int64_t>(40000000, 1000000 * dataParallelSize);
  }

  int64_t worldSize() const {
    return tensorModelParallelSize * contextParallelSize *
           pipelineModelParallelSize * dataParallelSize;
  }
};

struct BatchConfig {
  int64_t microBatchSize = 1;
  /// 0 means microBatchSize * dataParallelSize (one micro-batch per step).
  int64_t globalBatchSize = 0;
};

struct RecomputeConfig {
  RecomputeGranularity granularity = RecomputeGranularity::None;
  /// For full recompute: "uniform" or "block", and how many layers.
  std::string method = "uniform";
  int64_t numLayers = 1;
};

/// FP8 training (docs/MixedPrecision.md, "FP8"), with Megatron-LM's names
/// and defaults.
struct Fp8Config {
  Fp8Format format = Fp8Format::None;
  Fp8Recipe recipe = Fp8Recipe::Delayed;
  /// Delayed scaling: amaxes kept per tensor, and which one a scale is
  /// computed from ("max" of the history or the "most_recent").
  int64_t amaxHistoryLen = 1;
  std::string amaxComputeAlgo = "most_recent";
  /// Scales are divided by 2^margin.
  int64_t margin = 0;
  /// --first-last-layers-bf16: the first numLayersAtStartInBf16 and the
  /// last numLayersAtEndInBf16 transformer layers keep bf16 GEMMs.
  bool firstLastLayersBf16 = false;
  int64_t numLayersAtStartInBf16 = 1;
  int64_t numLayersAtEndInBf16 = 1;

  bool enabled() const { return format != Fp8Format::None; }
};

struct CompileConfig {
  ModelConfig model;
  MoeConfig moe;
  ParallelConfig parallel;
  BatchConfig batch;
  Precision precision = Precision::FP32;
  Fp8Config fp8;
  RecomputeConfig recompute;

  /// The file this configuration was read from; empty when built in code.
  std::string sourcePath;
  /// Where each explicitly set key (by its snake_case name) came from:
  /// "file:line:column", or "command line (--flag)" after applyOverride.
  /// validateCompileConfig points its errors there.
  llvm::StringMap<std::string> keyOrigins;

  /// The vocabulary padded as Megatron-LM pads it: up to a multiple of
  /// make_vocab_size_divisible_by * tensor_model_parallel_size.
  int64_t paddedVocabSize() const;
  int64_t globalBatchSize() const {
    return batch.globalBatchSize
               ? batch.globalBatchSize
               : batch.microBatchSize * parallel.dataParallelSize;
  }
  /// Transformer layers on (non-virtual) pipeline stage `stage`, honouring an
  /// uneven split. Meaningful once validateCompileConfig has succeeded.
  int64_t pipelineStageNumLayers(int64_t stage) const;
  /// Virtual stages per pipeline rank, from either way of setting them (1
  /// without interleaving). Meaningful once validateCompileConfig has
  /// succeeded.
  int64_t virtualStagesPerRank() const;
};

/// Reads a model file: YAML (.yaml/.yml) in this project's format, or a
/// Hugging Face config.json (GPT2Config or LlamaConfig). Errors name the file,
/// the line where there is one, the key, the value and the fix.
llvm::Expected<CompileConfig> loadCompileConfig(llvm::StringRef path);

/// As loadCompileConfig, from text in memory (for tools, tests and the
/// fuzzer). `bufferName` names the source in errors and picks the format: a
/// name ending in .json, or text starting with '{', is read as a Hugging Face
/// config.json; anything else as YAML.
llvm::Expected<CompileConfig> parseCompileConfig(llvm::StringRef contents,
                                                 llvm::StringRef bufferName);

/// Sets one key (snake_case, as in the model file) from its textual value, as
/// a command-line flag `--tensor-model-parallel-size 2` does for
/// `tensor_model_parallel_size`. The key may also be spelled as the flag
/// ("tensor-model-parallel-size" or "--tensor-model-parallel-size"); errors
/// then use that spelling. A boolean key given "" is set to true, as a flag
/// without a value.
llvm::Error applyOverride(CompileConfig &config, llvm::StringRef key,
                          llvm::StringRef value);

/// What a key's value is, so a command-line parser knows which flags take
/// no value (Boolean) and a help text can show a placeholder.
enum class ConfigValueKind { Integer, Number, Boolean, String, Choice };

/// Every key a model file or a flag may set, for help texts and flags.
struct ConfigKeyInfo {
  llvm::StringRef key;
  llvm::StringRef section; // "model", "parallel", "batch", "precision", "fp8", "recompute"
  llvm::StringRef help;
  ConfigValueKind kind = ConfigValueKind::String;
  /// The default, as text ("1", "4 * hidden_size", "required").
  llvm::StringRef defaultValue;
};
llvm::ArrayRef<ConfigKeyInfo> getConfigKeys();

/// Checks that the configuration is complete and divides: heads by tensor
/// parallelism, layers by pipeline stages, the global batch by micro-batch
/// times data parallelism, and so on. Errors name the values and the fix.
llvm::Error validateCompileConfig(const CompileConfig &config);

} // namespace megatron

#endif // MEGATRON_FRONTEND_COMPILECONFIG_H
