//===- ValidateCompileConfig.cpp - Megatron-LM's checks on a configuration ===//
//
// The checks Megatron-LM's argument validation and TransformerConfig make,
// run once after the file and the command-line overrides are merged. Each
// error points at where the offending key was set, names the values and the
// limit, and says what would fix it (for sizes that must divide, it lists the
// values that do).
//
//===----------------------------------------------------------------------===//

#include "ConfigKeys.h"

#include "llvm/ADT/STLExtras.h"
#include "llvm/Support/MathExtras.h"

#include <cmath>
#include <cstdio>
#include <numeric>

using namespace llvm;
using namespace megatron;
using namespace megatron::config;

namespace {

/// Divisor lists stay short and cheap even for absurd sizes: nobody runs
/// more than this many tensor-parallel ranks or pipeline stages.
constexpr int64_t kMaxListedDivisor = 4096;

std::string show(int64_t value) { return std::to_string(value); }

std::string show(double value) {
  char buffer[32];
  std::snprintf(buffer, sizeof(buffer), "%g", value);
  return buffer;
}

/// "1, 2, 3 or 6".
std::string orList(ArrayRef<int64_t> values) {
  std::string out;
  for (size_t i = 0; i < values.size(); ++i) {
    if (i)
      out += i + 1 == values.size() ? " or " : ", ";
    out += show(values[i]);
  }
  return out;
}

SmallVector<int64_t> divisorsOf(int64_t n, int64_t from = 1) {
  SmallVector<int64_t> result;
  for (int64_t d = from; d <= n && d <= kMaxListedDivisor; ++d)
    if (n % d == 0)
      result.push_back(d);
  return result;
}

class Validator {
public:
  explicit Validator(const CompileConfig &config)
      : c(config), m(config.model), p(config.parallel) {}

  Error run();

private:
  /// An error located where one of `keys` was set: a command-line override
  /// if any, else the first set in the file; the file itself when none was.
  Error fail(std::initializer_list<StringRef> keys, const Twine &message) const;

  Error checkRanges();
  Error checkOverflow();
  Error checkModelShape();
  Error checkTensorParallel();
  Error checkContextParallel();
  Error checkGradientBuckets();
  Error checkTensorParallelOverlap();
  Error checkParameterGather();
  Error checkPipeline();
  Error checkBatch();
  Error checkRecompute();
  Error checkMoe();
  Error checkMoeGroups();
  Error checkFp8();

  /// a * b, or an error naming `what` and the keys to reduce.
  Error multiply(int64_t a, int64_t b, int64_t &out, StringRef what,
                 std::initializer_list<StringRef> keys) const;
  Error add(int64_t a, int64_t b, int64_t &out, StringRef what,
            std::initializer_list<StringRef> keys) const;

  /// The most layers any pipeline stage holds.
  int64_t maxLayersPerStage() const;

  const CompileConfig &c;
  const ModelConfig &m;
  const ParallelConfig &p;
  /// ffn_hidden_size with its default applied, once known not to overflow.
  int64_t ffn = 0;
};

} // namespace

Error Validator::fail(std::initializer_list<StringRef> keys,
                      const Twine &message) const {
  // An override is the likelier culprit: the file alone was presumably
  // consistent. Otherwise the first key, in the order given, set anywhere.
  std::string where = c.sourcePath;
  bool found = false;
  for (bool commandLineOnly : {true, false}) {
    for (StringRef key : keys) {
      auto it = c.keyOrigins.find(key);
      if (found || it == c.keyOrigins.end() ||
          (commandLineOnly && !StringRef(it->second).starts_with("command")))
        continue;
      where = it->second;
      found = true;
    }
  }
  std::string text = message.str();
  return createStringError(inconvertibleErrorCode(),
                           where.empty() ? text : where + ": " + text);
}

Error Validator::multiply(int64_t a, int64_t b, int64_t &out, StringRef what,
                          std::initializer_list<StringRef> keys) const {
  if (!MulOverflow(a, b, out))
    return Error::success();
  std::string names;
  for (StringRef key : keys)
    names += (names.empty() ? "" : ", ") + key.str();
  return fail(keys, what + ": " + show(a) + " * " + show(b) +
                        " does not fit in a 64-bit integer; the sizes are "
                        "too large to compile: reduce " +
                        names);
}

Error Validator::add(int64_t a, int64_t b, int64_t &out, StringRef what,
                     std::initializer_list<StringRef> keys) const {
  if (!AddOverflow(a, b, out))
    return Error::success();
  std::string names;
  for (StringRef key : keys)
    names += (names.empty() ? "" : ", ") + key.str();
  return fail(keys, what + ": " + show(a) + " + " + show(b) +
                        " does not fit in a 64-bit integer; the sizes are "
                        "too large to compile: reduce " +
                        names);
}

Error Validator::checkRanges() {
  struct Size {
    StringRef key;
    int64_t value;
    bool required; // else 0 means "derive it"
  };
  const Size sizes[] = {
      {"num_layers", m.numLayers, true},
      {"hidden_size", m.hiddenSize, true},
      {"num_attention_heads", m.numAttentionHeads, true},
      {"seq_length", m.seqLength, true},
      {"vocab_size", m.vocabSize, true},
      {"make_vocab_size_divisible_by", m.makeVocabSizeDivisibleBy, true},
      {"num_query_groups", m.numQueryGroups, false},
      {"ffn_hidden_size", m.ffnHiddenSize, false},
      {"max_position_embeddings", m.maxPositionEmbeddings, false},
      {"tensor_model_parallel_size", p.tensorModelParallelSize, true},
      {"pipeline_model_parallel_size", p.pipelineModelParallelSize, true},
      {"virtual_pipeline_model_parallel_size",
       p.virtualPipelineModelParallelSize, false},
      {"decoder_first_pipeline_num_layers", p.decoderFirstPipelineNumLayers,
       false},
      {"num_layers_per_virtual_pipeline_stage",
       p.numLayersPerVirtualPipelineStage, false},
      {"decoder_last_pipeline_num_layers", p.decoderLastPipelineNumLayers,
       false},
      {"context_parallel_size", p.contextParallelSize, true},
      {"data_parallel_size", p.dataParallelSize, true},
      {"micro_batch_size", c.batch.microBatchSize, true},
      {"global_batch_size", c.batch.globalBatchSize, false},
  };
  for (const Size &size : sizes) {
    if (size.required && size.value == 0)
      return fail({size.key}, size.key + " is not set; add '" + size.key +
                                  ": N' to the model file or pass " +
                                  flagName(size.key) + " N");
    if (size.value < 0 || (size.required && size.value == 0))
      return fail({size.key}, size.key + " must be a positive integer, got " +
                                  show(size.value));
  }

  // The IR holds every layer, so a typo such as 30000000000 layers would
  // build for hours; no real model is near this bound.
  constexpr int64_t kMaxLayers = 10000;
  if (m.numLayers > kMaxLayers)
    return fail({"num_layers"}, "num_layers " + show(m.numLayers) +
                                    " is above the limit of " +
                                    show(kMaxLayers) +
                                    " layers; check the value");

  struct Real {
    StringRef key;
    double value;
    bool probability; // in [0, 1); else positive
  };
  const Real reals[] = {
      {"norm_epsilon", m.normEpsilon, false},
      {"init_method_std", m.initMethodStd, false},
      {"rotary_base", m.rotaryBase, false},
      {"hidden_dropout", m.hiddenDropout, true},
      {"attention_dropout", m.attentionDropout, true},
  };
  for (const Real &real : reals) {
    bool ok =
        std::isfinite(real.value) &&
        (real.probability ? real.value >= 0 && real.value < 1 : real.value > 0);
    if (!ok)
      return fail({real.key}, real.key + " must be " +
                                  (real.probability ? "a probability in [0, 1)"
                                                    : "a positive number") +
                                  ", got " + show(real.value));
  }

  if (c.recompute.method != "uniform" && c.recompute.method != "block")
    return fail({"recompute_method"}, "recompute_method must be uniform or "
                                      "block, got '" +
                                          c.recompute.method + "'");
  if (c.recompute.granularity == RecomputeGranularity::Full &&
      c.recompute.numLayers <= 0)
    return fail({"recompute_num_layers"},
                "recompute_num_layers must be a positive integer, got " +
                    show(c.recompute.numLayers));
  return Error::success();
}

Error Validator::checkOverflow() {
  // Later stages multiply these sizes freely; find the products that cannot
  // be represented here, once, with the keys to blame.
  ffn = m.ffnHiddenSize;
  if (!ffn)
    if (Error err = multiply(4, m.hiddenSize, ffn,
                             "the default ffn_hidden_size 4 * hidden_size",
                             {"hidden_size"}))
      return err;

  int64_t multiple, padded, world, ranks, tokens, activations, scores;
  if (Error err = multiply(
          m.makeVocabSizeDivisibleBy, p.tensorModelParallelSize, multiple,
          "the vocabulary padding multiple",
          {"make_vocab_size_divisible_by", "tensor_model_parallel_size"}))
    return err;
  if (Error err =
          add(m.vocabSize, multiple - 1, padded, "the padded vocabulary",
              {"vocab_size", "make_vocab_size_divisible_by"}))
    return err;
  padded = padded / multiple * multiple;
  if (Error err = multiply(
          p.tensorModelParallelSize, p.pipelineModelParallelSize, ranks,
          "the world size",
          {"tensor_model_parallel_size", "pipeline_model_parallel_size"}))
    return err;
  if (Error err = multiply(ranks, p.contextParallelSize, ranks,
                           "the world size", {"context_parallel_size"}))
    return err;
  if (Error err = multiply(ranks, p.dataParallelSize, world, "the world size",
                           {"data_parallel_size"}))
    return err;
  if (Error err = multiply(c.batch.microBatchSize, p.dataParallelSize, ranks,
                           "micro_batch_size * data_parallel_size",
                           {"micro_batch_size", "data_parallel_size"}))
    return err;
  if (Error err = multiply(c.batch.microBatchSize, m.seqLength, tokens,
                           "the tokens of one micro-batch",
                           {"micro_batch_size", "seq_length"}))
    return err;
  if (Error err = multiply(tokens, m.hiddenSize, activations,
                           "the activations of one micro-batch",
                           {"micro_batch_size", "seq_length", "hidden_size"}))
    return err;
  if (Error err =
          multiply(tokens, m.numAttentionHeads, scores,
                   "the attention scores of one micro-batch",
                   {"micro_batch_size", "seq_length", "num_attention_heads"}))
    return err;
  if (Error err = multiply(scores, m.seqLength, scores,
                           "the attention scores of one micro-batch",
                           {"seq_length", "micro_batch_size"}))
    return err;

  // The parameter count, roughly as the IR will hold it.
  std::initializer_list<StringRef> sizeKeys = {"hidden_size", "num_layers",
                                               "ffn_hidden_size", "vocab_size"};
  StringRef what = "the parameter count";
  int64_t kvWidth, attnWidth, queryWidth, attention, mlp, layer, total,
      embedding, positions;
  if (Error err = multiply(m.queryGroups(), m.headDim(), kvWidth, what,
                           {"num_query_groups", "hidden_size", "kv_channels"}))
    return err;
  if (Error err = multiply(2, kvWidth, attnWidth, what, sizeKeys))
    return err;
  if (Error err = multiply(2 * m.numAttentionHeads, m.headDim(), queryWidth,
                           what, {"num_attention_heads", "kv_channels"}))
    return err;
  if (Error err = add(attnWidth, queryWidth, attnWidth, what, sizeKeys))
    return err;
  if (Error err = multiply(attnWidth, m.hiddenSize, attention, what, sizeKeys))
    return err;
  if (Error err = multiply(ffn, m.activation == Activation::Swiglu ? 3 : 2, mlp,
                           what, sizeKeys))
    return err;
  if (Error err = multiply(mlp, m.hiddenSize, mlp, what, sizeKeys))
    return err;
  if (Error err = add(attention, mlp, layer, what, sizeKeys))
    return err;
  if (Error err = multiply(layer, m.numLayers, total, what, sizeKeys))
    return err;
  if (Error err = multiply(padded, m.hiddenSize, embedding, what, sizeKeys))
    return err;
  if (m.untieEmbeddingsAndOutputWeights)
    if (Error err = multiply(embedding, 2, embedding, what, sizeKeys))
      return err;
  if (Error err = multiply(m.maxPositions(), m.hiddenSize, positions, what,
                           {"max_position_embeddings", "hidden_size"}))
    return err;
  if (Error err = add(total, embedding, total, what, sizeKeys))
    return err;
  if (Error err = add(total, positions, total, what, sizeKeys))
    return err;
  return Error::success();
}

Error Validator::checkModelShape() {
  int64_t hidden = m.hiddenSize, heads = m.numAttentionHeads;
  if (m.kvChannels == 0 && hidden % heads != 0) {
    int64_t below = hidden / heads * heads;
    return fail({"hidden_size", "num_attention_heads"},
                "hidden_size " + show(hidden) +
                    " is not divisible by num_attention_heads " + show(heads) +
                    ": every head gets hidden_size / num_attention_heads "
                    "channels; use a hidden_size that is a multiple of " +
                    show(heads) + " (such as " +
                    (below > 0 ? show(below) + " or " : std::string()) +
                    show(below + heads) +
                    ") or a num_attention_heads that divides it (" +
                    orList(divisorsOf(hidden)) + ")");
  }
  int64_t groups = m.queryGroups();
  if (heads % groups != 0)
    return fail({"num_query_groups", "num_attention_heads"},
                "num_attention_heads " + show(heads) +
                    " is not divisible by num_query_groups " + show(groups) +
                    ": every key/value head is shared by the same number of "
                    "query heads; use a num_query_groups that divides " +
                    show(heads) + " (" + orList(divisorsOf(heads)) + ")");
  if (m.positionEmbeddingType == PositionEmbedding::Rope &&
      m.headDim() % 2 != 0) {
    if (m.kvChannels)
      return fail({"position_embedding_type", "kv_channels"},
                  "position_embedding_type rope rotates pairs of channels, "
                  "but kv_channels " +
                      show(m.kvChannels) +
                      " is odd; use an even kv_channels, or use "
                      "learned_absolute positions");
    return fail(
        {"position_embedding_type", "hidden_size", "num_attention_heads"},
        "position_embedding_type rope rotates pairs of channels, but "
        "the head dimension hidden_size / num_attention_heads = " +
            show(hidden) + " / " + show(heads) + " = " + show(m.headDim()) +
            " is odd; choose hidden_size and num_attention_heads so "
            "that it is even, or use learned_absolute positions");
  }
  if (m.positionEmbeddingType == PositionEmbedding::LearnedAbsolute &&
      m.seqLength > m.maxPositions())
    return fail({"seq_length", "max_position_embeddings"},
                "seq_length " + show(m.seqLength) +
                    " exceeds max_position_embeddings " +
                    show(m.maxPositions()) +
                    ": learned absolute position embeddings have one row per "
                    "position; raise max_position_embeddings to at least " +
                    show(m.seqLength) + " or lower seq_length");
  // A window that covers the whole sequence attends exactly as full causal
  // attention does; a shorter one would need sliding-window attention.
  if (m.slidingWindow > 0 && m.seqLength > m.slidingWindow)
    return fail({"seq_length", "sliding_window"},
                "seq_length " + show(m.seqLength) +
                    " exceeds sliding_window " + show(m.slidingWindow) +
                    ": sliding-window attention is not implemented, and only "
                    "a window that covers the whole sequence is the same "
                    "model with full causal attention; train with "
                    "--seq-length " +
                    show(m.slidingWindow) + " or less");
  if (m.activation == Activation::Swiglu && m.openaiGelu)
    return fail({"openai_gelu", "activation", "swiglu"},
                "openai_gelu selects the tanh form of GeLU, but activation is "
                "swiglu, which uses SiLU; remove openai_gelu or use "
                "activation gelu");
  return Error::success();
}

Error Validator::checkTensorParallel() {
  int64_t tp = p.tensorModelParallelSize;
  int64_t heads = m.numAttentionHeads, groups = m.queryGroups();
  if (p.sequenceParallel && tp == 1)
    return fail({"sequence_parallel", "tensor_model_parallel_size"},
                "sequence_parallel needs tensor_model_parallel_size > 1: it "
                "splits the sequence across the tensor-parallel ranks, and "
                "there is only 1 (Megatron-LM silently turns it off here; "
                "this compiler does not guess); remove sequence_parallel or "
                "set tensor_model_parallel_size to 2 or more");

  // The sizes a tensor-parallel rank must hold whole pieces of: heads, key/
  // value heads, MLP columns and, under sequence parallelism, tokens.
  int64_t common = std::gcd(std::gcd(heads, groups), ffn);
  if (p.sequenceParallel)
    common = std::gcd(common, m.seqLength);
  std::string fitting =
      orList(divisorsOf(common, /*from=*/p.sequenceParallel ? 2 : 1));
  // Said after "; " (fix) or appended to another remedy (orFix).
  std::string fix, orFix;
  if (fitting.empty()) {
    fix = "no tensor_model_parallel_size above 1 divides this model's heads, "
          "query groups, MLP width and sequence length";
  } else {
    fix = "tensor_model_parallel_size values that fit this model: " + fitting;
    orFix = ", or one of the " + fix;
  }
  StringRef tpKey = "tensor_model_parallel_size";

  if (heads % tp != 0)
    return fail({tpKey, "num_attention_heads"},
                "num_attention_heads " + show(heads) +
                    " is not divisible by tensor_model_parallel_size " +
                    show(tp) +
                    ": every tensor-parallel rank computes whole attention "
                    "heads; " +
                    fix);
  if (groups % tp != 0)
    return fail({tpKey, "num_query_groups"},
                "num_query_groups " + show(groups) +
                    " is not divisible by tensor_model_parallel_size " +
                    show(tp) +
                    ": every tensor-parallel rank holds whole key/value "
                    "heads; " +
                    fix);
  if (ffn % tp != 0)
    return fail({tpKey, "ffn_hidden_size", "hidden_size"},
                "ffn_hidden_size " + show(ffn) +
                    " is not divisible by tensor_model_parallel_size " +
                    show(tp) +
                    ": the MLP's column-parallel weight is split by columns "
                    "across the ranks; use an ffn_hidden_size that is a "
                    "multiple of " +
                    show(tp) + orFix);
  if (p.sequenceParallel && m.seqLength % tp != 0)
    return fail({tpKey, "seq_length", "sequence_parallel"},
                "seq_length " + show(m.seqLength) +
                    " is not divisible by tensor_model_parallel_size " +
                    show(tp) +
                    ": sequence_parallel splits every sequence across the "
                    "tensor-parallel ranks; use a seq_length that is a "
                    "multiple of " +
                    show(tp) + orFix);
  return Error::success();
}

/// Megatron-LM's checks on --context-parallel-size, and the combinations this
/// compiler refuses.
Error Validator::checkContextParallel() {
  int64_t cp = p.contextParallelSize, tp = p.tensorModelParallelSize;
  StringRef cpKey = "context_parallel_size";
  if (cp == 1) {
    if (c.keyOrigins.count("cp_comm_type"))
      return fail({"cp_comm_type", cpKey},
                  "cp_comm_type chooses how attention exchanges keys and "
                  "values over the context-parallel ranks, and "
                  "context_parallel_size is 1 (nothing is exchanged); remove "
                  "cp_comm_type or set context_parallel_size to 2 or more");
    return Error::success();
  }
  // Causal load balancing cuts every sequence into 2 * cp chunks (rank i
  // holds chunks i and 2cp-1-i), and sequence parallelism then splits each
  // chunk over the tensor-parallel ranks.
  int64_t multiple;
  if (Error err =
          multiply(2, cp, multiple, "the context-parallel chunks", {cpKey}))
    return err;
  bool withTensor = p.sequenceParallel && tp > 1;
  if (withTensor)
    if (Error err = multiply(multiple, tp, multiple,
                             "the context- and sequence-parallel tiles",
                             {cpKey, "tensor_model_parallel_size"}))
      return err;
  if (m.seqLength % multiple != 0) {
    int64_t below = m.seqLength / multiple * multiple, above;
    std::string examples = below > 0 ? show(below) : std::string();
    if (!AddOverflow(below, multiple, above))
      examples += (examples.empty() ? "" : " or ") + show(above);
    std::string divisor = withTensor ? "2 * context_parallel_size " + show(cp) +
                                           " * tensor_model_parallel_size " +
                                           show(tp) + " = " + show(multiple)
                                     : "2 * context_parallel_size " + show(cp) +
                                           " = " + show(multiple);
    std::string why =
        withTensor
            ? "causal load balancing cuts every sequence into 2 * "
              "context_parallel_size chunks (rank i holds chunks i and "
              "2 * context_parallel_size - 1 - i), and sequence_parallel "
              "splits each chunk over the tensor-parallel ranks"
            : "causal load balancing cuts every sequence into 2 * "
              "context_parallel_size chunks (rank i holds chunks i and "
              "2 * context_parallel_size - 1 - i)";
    if (withTensor)
      return fail({cpKey, "seq_length", "tensor_model_parallel_size",
                   "sequence_parallel"},
                  "seq_length " + show(m.seqLength) + " is not divisible by " +
                      divisor + ": " + why +
                      "; use a seq_length that is a multiple of " +
                      show(multiple) + " (such as " + examples + ")");
    return fail({cpKey, "seq_length"},
                "seq_length " + show(m.seqLength) + " is not divisible by " +
                    divisor + ": " + why +
                    "; use a seq_length that is a multiple of " +
                    show(multiple) + " (such as " + examples +
                    ") or a context_parallel_size whose double divides it");
  }
  return Error::success();
}

int64_t Validator::maxLayersPerStage() const {
  int64_t most = 0;
  for (int64_t stage = 0; stage < p.pipelineModelParallelSize; ++stage) {
    most = std::max(most, c.pipelineStageNumLayers(stage));
    // Middle stages are alike; the first two and the last tell everything.
    if (stage == 1 && p.pipelineModelParallelSize > 3)
      stage = p.pipelineModelParallelSize - 2;
  }
  return most;
}

Error Validator::checkPipeline() {
  int64_t layers = m.numLayers, pp = p.pipelineModelParallelSize;
  int64_t vpp = p.virtualPipelineModelParallelSize;
  int64_t first = p.decoderFirstPipelineNumLayers;
  int64_t last = p.decoderLastPipelineNumLayers;
  StringRef vppKey = "virtual_pipeline_model_parallel_size";
  StringRef ppKey = "pipeline_model_parallel_size";
  StringRef firstKey = "decoder_first_pipeline_num_layers";
  StringRef lastKey = "decoder_last_pipeline_num_layers";
  StringRef perVirtualKey = "num_layers_per_virtual_pipeline_stage";

  if (int64_t perVirtual = p.numLayersPerVirtualPipelineStage) {
    if (vpp)
      return fail({perVirtualKey, vppKey},
                  "num_layers_per_virtual_pipeline_stage and "
                  "virtual_pipeline_model_parallel_size both set the virtual "
                  "stages; give one of them");
    int64_t stageLayers = 0;
    if (pp == 1 || layers % pp != 0 ||
        (stageLayers = layers / pp) % perVirtual != 0)
      return fail({perVirtualKey, "num_layers", ppKey},
                  "num_layers_per_virtual_pipeline_stage " + show(perVirtual) +
                      " does not divide the layers of each of the " +
                      show(pp) + " pipeline stages (num_layers " +
                      show(layers) +
                      "): interleaving needs pipeline_model_parallel_size "
                      "> 1 and every stage's layers a multiple of it; " +
                      (pp > 1 && layers % pp == 0
                           ? "use one of " + orList(divisorsOf(stageLayers))
                           : std::string("set pipeline_model_parallel_size "
                                         "to a divisor of num_layers above "
                                         "1")));
    vpp = stageLayers / perVirtual;
  }

  if (vpp > 1 && pp == 1)
    return fail({vppKey, ppKey},
                "virtual_pipeline_model_parallel_size " + show(vpp) +
                    " needs pipeline_model_parallel_size > 1: interleaving "
                    "splits each pipeline rank's layers into virtual stages; "
                    "set pipeline_model_parallel_size to 2 or more, or "
                    "remove virtual_pipeline_model_parallel_size");

  if (first || last) {
    StringRef setKey = first ? firstKey : lastKey;
    if (pp == 1)
      return fail({setKey, ppKey},
                  setKey + " sets the layers of one pipeline stage, but "
                           "pipeline_model_parallel_size is 1; remove it or "
                           "set pipeline_model_parallel_size to 2 or more");
    if (vpp > 1)
      return fail({setKey, vppKey},
                  setKey +
                      " cannot be combined with "
                      "virtual_pipeline_model_parallel_size " +
                      show(vpp) +
                      ": the interleaved schedule gives every virtual stage "
                      "the same number of layers; remove one of them");
    int64_t ends = 0;
    int64_t others = pp - (first ? 1 : 0) - (last ? 1 : 0);
    std::string split;
    if (first)
      split = firstKey.str() + " " + show(first);
    if (first && last)
      split += " and ";
    if (last)
      split += lastKey.str() + " " + show(last);
    if (AddOverflow(first, last, ends) || ends > layers ||
        (others == 0 && ends != layers))
      return fail({setKey, "num_layers"},
                  split + " must add up to " + (others == 0 ? "" : "at most ") +
                      "num_layers " + show(layers) +
                      " with pipeline_model_parallel_size " + show(pp));
    int64_t rest = layers - ends;
    if (others > 0 && (rest < others || rest % others != 0))
      return fail({setKey, "num_layers", ppKey},
                  "after " + split + ", " + show(rest) + " of num_layers " +
                      show(layers) + " remain for the other " + show(others) +
                      " pipeline stages, which need the same positive number "
                      "of layers each; choose the split so that num_layers "
                      "minus the explicit layers is a positive multiple of " +
                      show(others));
    return Error::success();
  }

  // Without interleaving the cost model balances the stages
  // (lib/Pipelines/PipelineLayout.cpp); each needs a layer.
  if (layers < pp)
    return fail({ppKey, "num_layers"},
                "num_layers " + show(layers) +
                    " is less than pipeline_model_parallel_size " + show(pp) +
                    ": every pipeline stage needs at least one layer; use a "
                    "pipeline_model_parallel_size of at most " + show(layers));
  if (vpp > 1 && layers % pp != 0)
    return fail({ppKey, "num_layers", vppKey},
                "num_layers " + show(layers) +
                    " is not divisible by pipeline_model_parallel_size " +
                    show(pp) +
                    ": with virtual_pipeline_model_parallel_size every "
                    "pipeline stage gets the same number of layers; use a "
                    "pipeline_model_parallel_size that divides " +
                    show(layers) + " (" + orList(divisorsOf(layers)) + ")");
  int64_t perStage = layers / pp;
  if (vpp > 1 && perStage % vpp != 0)
    return fail({vppKey, ppKey, "num_layers"},
                "num_layers " + show(layers) +
                    " is not divisible by pipeline_model_parallel_size " +
                    show(pp) + " times virtual_pipeline_model_parallel_size " +
                    show(vpp) +
                    ": every virtual stage gets the same number of layers; "
                    "use a virtual_pipeline_model_parallel_size that divides "
                    "the " +
                    show(perStage) + " layers per pipeline stage (" +
                    orList(divisorsOf(perStage)) + ")");
  return Error::success();
}

Error Validator::checkBatch() {
  int64_t micro = c.batch.microBatchSize, dp = p.dataParallelSize;
  int64_t step = micro * dp; // checkOverflow proved this fits
  int64_t global = c.globalBatchSize();
  if (global % step == 0)
    return Error::success();
  int64_t below = global / step * step;
  int64_t above;
  std::string examples = below > 0 ? show(below) : std::string();
  if (!AddOverflow(below, step, above))
    examples += (examples.empty() ? "" : " or ") + show(above);
  return fail({"global_batch_size", "micro_batch_size", "data_parallel_size"},
              "global_batch_size " + show(global) +
                  " is not divisible by micro_batch_size " + show(micro) +
                  " times data_parallel_size " + show(dp) +
                  " (= " + show(step) +
                  "): every data-parallel rank runs whole micro-batches; use "
                  "a global_batch_size that is a multiple of " +
                  show(step) + " (such as " + examples + ")");
}

Error Validator::checkRecompute() {
  const RecomputeConfig &r = c.recompute;
  if (r.granularity == RecomputeGranularity::Selective) {
    // Megatron-LM rejects these too: selective recomputation always covers
    // the attention core of every layer.
    for (StringRef key : {"recompute_method", "recompute_num_layers"})
      if (c.keyOrigins.count(key))
        return fail({key}, key +
                               " applies to recompute_granularity full, "
                               "not selective (selective recomputation "
                               "covers every layer's attention core); "
                               "remove " +
                               key + " or use recompute_granularity full");
    return Error::success();
  }
  if (r.granularity != RecomputeGranularity::Full)
    return Error::success();
  int64_t perStage = maxLayersPerStage();
  if (r.numLayers < 1 || r.numLayers > perStage)
    return fail({"recompute_num_layers", "pipeline_model_parallel_size"},
                "recompute_num_layers " + show(r.numLayers) +
                    " must be between 1 and the " + show(perStage) +
                    " layers per pipeline stage (num_layers " +
                    show(m.numLayers) + ", pipeline_model_parallel_size " +
                    show(p.pipelineModelParallelSize) +
                    ") under recompute_granularity full");
  return Error::success();
}

/// Megatron-LM's --overlap-grad-reduce and --ddp-bucket-size need a
/// data-parallel gradient reduction to overlap.
Error Validator::checkGradientBuckets() {
  if (p.overlapGradReduce && p.dataParallelSize == 1)
    return fail({"overlap_grad_reduce", "data_parallel_size"},
                "overlap_grad_reduce needs data_parallel_size > 1: it "
                "overlaps the data-parallel gradient reduction with the "
                "backward pass, and data_parallel_size 1 reduces nothing; "
                "remove overlap_grad_reduce or set data_parallel_size to 2 "
                "or more");
  if (c.keyOrigins.count("ddp_bucket_size") && !p.overlapGradReduce)
    return fail({"ddp_bucket_size", "overlap_grad_reduce"},
                "ddp_bucket_size " + show(p.ddpBucketSize) +
                    " sizes the buckets of overlap_grad_reduce, which is "
                    "off (without it the gradients are reduced in one "
                    "bucket after the backward pass, as in Megatron-LM); "
                    "add overlap_grad_reduce or remove ddp_bucket_size");
  return Error::success();
}

/// Megatron-LM's --tp-comm-overlap overlaps the all-gathers and
/// reduce-scatters of sequence parallelism with the GEMMs beside them (it
/// asserts --sequence-parallel, as here).
Error Validator::checkTensorParallelOverlap() {
  if (!p.tpCommOverlap)
    return Error::success();
  if (p.tensorModelParallelSize == 1)
    return fail({"tp_comm_overlap", "tensor_model_parallel_size"},
                "tp_comm_overlap needs tensor_model_parallel_size > 1: it "
                "overlaps the tensor-parallel all-gathers and "
                "reduce-scatters with the GEMMs, and "
                "tensor_model_parallel_size 1 has none; remove "
                "tp_comm_overlap or set tensor_model_parallel_size to 2 or "
                "more (with sequence_parallel)");
  if (!p.sequenceParallel)
    return fail({"tp_comm_overlap", "sequence_parallel"},
                "tp_comm_overlap needs sequence_parallel (as in "
                "Megatron-LM): it cuts the all-gather before each "
                "column-parallel GEMM and the reduce-scatter after each "
                "row-parallel GEMM, which tensor_model_parallel_size " +
                    show(p.tensorModelParallelSize) +
                    " without sequence_parallel does not have (it "
                    "all-reduces); add sequence_parallel or remove "
                    "tp_comm_overlap");
  return Error::success();
}

/// Megatron-LM's --overlap-param-gather spreads the distributed optimizer's
/// all-gather of updated parameters over the next forward pass, per bucket.
Error Validator::checkParameterGather() {
  if (!p.overlapParamGather)
    return Error::success();
  if (!p.useDistributedOptimizer)
    return fail({"overlap_param_gather", "use_distributed_optimizer"},
                "overlap_param_gather needs use_distributed_optimizer (as in "
                "Megatron-LM): it overlaps the distributed optimizer's "
                "all-gather of updated parameters with the next forward "
                "pass, and without use_distributed_optimizer every rank "
                "updates all of its parameters and gathers none; add "
                "use_distributed_optimizer or remove overlap_param_gather");
  if (!p.overlapGradReduce)
    return fail({"overlap_param_gather", "overlap_grad_reduce"},
                "overlap_param_gather needs overlap_grad_reduce (as in "
                "Megatron-LM): the parameters are gathered per gradient "
                "bucket, and without overlap_grad_reduce the buffer is one "
                "reduction with no buckets; add overlap_grad_reduce or "
                "remove overlap_param_gather");
  return Error::success();
}

Error Validator::run() {
  if (Error err = checkRanges())
    return err;
  if (Error err = checkOverflow())
    return err;
  if (Error err = checkModelShape())
    return err;
  if (Error err = checkTensorParallel())
    return err;
  if (Error err = checkContextParallel())
    return err;
  if (Error err = checkGradientBuckets())
    return err;
  if (Error err = checkTensorParallelOverlap())
    return err;
  if (Error err = checkParameterGather())
    return err;
  if (Error err = checkPipeline())
    return err;
  if (Error err = checkBatch())
    return err;
  if (Error err = checkRecompute())
    return err;
  if (Error err = checkFp8())
    return err;
  return checkMoe();
}

/// Megatron-LM's FP8 arguments (docs/MixedPrecision.md, "FP8"): FP8 GEMMs
/// inside bf16 training; a recipe key given without a format is an error
/// rather than a setting nobody reads.
Error Validator::checkFp8() {
  const Fp8Config &f = c.fp8;
  if (!f.enabled()) {
    for (StringRef key :
         {"fp8_recipe", "fp8_amax_history_len", "fp8_amax_compute_algo",
          "fp8_margin", "first_last_layers_bf16",
          "num_layers_at_start_in_bf16", "num_layers_at_end_in_bf16"})
      if (c.keyOrigins.count(key))
        return fail({key}, key.str() + " is set but fp8_format is none, so "
                                 "nothing reads it; add fp8_format e4m3 or "
                                 "hybrid, or remove " + key.str());
    return Error::success();
  }
  std::string format = f.format == Fp8Format::E4M3 ? "e4m3" : "hybrid";
  if (c.precision != Precision::BF16)
    return fail({"fp8_format", "precision"},
                "fp8_format " + format + " needs precision bf16 (FP8 GEMMs "
                "inside bf16 training, as Megatron-LM's --fp8-format with "
                "--bf16); precision is " +
                    (c.precision == Precision::FP16 ? "fp16" : "fp32") +
                    "; add --bf16");
  if (f.recipe == Fp8Recipe::Tensorwise)
    for (StringRef key :
         {"fp8_amax_history_len", "fp8_amax_compute_algo"})
      if (c.keyOrigins.count(key))
        return fail({key}, key.str() + " is delayed scaling's, but fp8_recipe is "
                                 "tensorwise (each scale from the tensor's "
                                 "own amax); remove " + key.str() +
                                 " or use fp8_recipe delayed");
  if (!f.firstLastLayersBf16) {
    for (StringRef key :
         {"num_layers_at_start_in_bf16", "num_layers_at_end_in_bf16"})
      if (c.keyOrigins.count(key))
        return fail({key}, key.str() + " is set but first_last_layers_bf16 is "
                                 "false; add first_last_layers_bf16 true or "
                                 "remove " + key.str());
  } else if (f.numLayersAtStartInBf16 + f.numLayersAtEndInBf16 >
             m.numLayers) {
    return fail({"num_layers_at_start_in_bf16", "num_layers_at_end_in_bf16",
                 "first_last_layers_bf16"},
                "num_layers_at_start_in_bf16 " +
                    show(f.numLayersAtStartInBf16) +
                    " plus num_layers_at_end_in_bf16 " +
                    show(f.numLayersAtEndInBf16) + " exceed num_layers " +
                    show(m.numLayers) +
                    "; keep at most num_layers layers in bf16");
  }
  return Error::success();
}

/// Megatron-LM's MoE arguments (docs/MoE.md): none is accepted without
/// experts, and what this slice does not implement yet (expert
/// parallelism, MoE under other layouts, 16-bit precision) is refused by
/// name rather than compiled differently.
/// Group-limited routing (mt.moe_route's num_groups and group_topk, whose
/// verifier states the same rules).
Error Validator::checkMoeGroups() {
  const MoeConfig &moe = c.moe;
  int64_t groups = moe.routerNumGroups, kept = moe.routerGroupTopk;
  if (!groups && !kept)
    return Error::success();
  if (!groups || !kept) {
    StringRef set = groups ? "moe_router_num_groups" : "moe_router_group_topk";
    StringRef unset =
        groups ? "moe_router_group_topk" : "moe_router_num_groups";
    return fail({set, unset},
                set + " needs " + unset +
                    " (group-limited routing takes both: how many groups "
                    "the experts form, and how many of them a token's "
                    "top-k is taken from); set " +
                    unset + " or remove " + set);
  }
  if (moe.numExperts % groups != 0)
    return fail({"moe_router_num_groups", "num_experts"},
                "moe_router_num_groups " + show(groups) +
                    " does not divide num_experts " + show(moe.numExperts) +
                    ": the groups are equal runs of consecutive experts; use "
                    "a divisor of " +
                    show(moe.numExperts));
  if (kept > groups)
    return fail({"moe_router_group_topk", "moe_router_num_groups"},
                "moe_router_group_topk " + show(kept) +
                    " exceeds moe_router_num_groups " + show(groups) +
                    "; keep at most " + show(groups) + " groups");
  if (kept > moe.routerTopk)
    return fail({"moe_router_group_topk", "moe_router_topk"},
                "moe_router_group_topk " + show(kept) +
                    " exceeds moe_router_topk " + show(moe.routerTopk) +
                    ": a group's score sums its moe_router_topk / "
                    "moe_router_group_topk highest scores, which would be "
                    "none; keep at most " +
                    show(moe.routerTopk) + " groups");
  int64_t size = moe.numExperts / groups;
  if (moe.routerTopk > kept * size)
    return fail({"moe_router_topk", "moe_router_group_topk"},
                "moe_router_topk " + show(moe.routerTopk) +
                    " exceeds moe_router_group_topk " + show(kept) + " x " +
                    show(size) + " experts per group (num_experts " +
                    show(moe.numExperts) + " / moe_router_num_groups " +
                    show(groups) +
                    "): the kept groups hold too few experts; raise "
                    "moe_router_group_topk or lower moe_router_topk");
  return Error::success();
}

Error Validator::checkMoe() {
  const MoeConfig &moe = c.moe;
  static constexpr StringRef kMoeKeys[] = {
      "moe_router_topk",
      "moe_router_score_function",
      "moe_router_pre_softmax",
      "moe_router_load_balancing_type",
      "moe_router_dtype",
      "moe_router_topk_scaling_factor",
      "moe_router_num_groups",
      "moe_router_group_topk",
      "moe_router_enable_expert_bias",
      "moe_router_bias_update_rate",
      "moe_aux_loss_coeff",
      "moe_z_loss_coeff",
      "moe_expert_capacity_factor",
      "moe_token_dropping",
      "moe_token_drop_policy",
      "moe_pad_expert_input_to_capacity",
      "moe_shared_expert_intermediate_size",
      "moe_layer_freq",
      "moe_ffn_hidden_size",
      "moe_grouped_gemm",
      "expert_model_parallel_size"};
  if (!moe.enabled()) {
    for (StringRef key : kMoeKeys)
      if (c.keyOrigins.count(key))
        return fail({key}, key + " is set but num_experts is 0 (a dense "
                                 "model); set num_experts to make MoE layers, "
                                 "or remove " +
                               key);
    return Error::success();
  }
  if (moe.routerTopk > moe.numExperts)
    return fail({"moe_router_topk", "num_experts"},
                "moe_router_topk " + show(moe.routerTopk) +
                    " must be at most num_experts " + show(moe.numExperts) +
                    " (each token picks distinct experts); lower "
                    "moe_router_topk or raise num_experts");
  if (moe.routerPreSoftmax && moe.scoreFunction == MoeScoreFunction::Sigmoid)
    return fail({"moe_router_pre_softmax", "moe_router_score_function"},
                "moe_router_pre_softmax applies to the softmax score "
                "function, not sigmoid; remove moe_router_pre_softmax or use "
                "moe_router_score_function softmax");
  if (Error error = checkMoeGroups())
    return error;
  // Megatron-LM's TransformerConfig: the expert bias shifts sigmoid scores.
  if (moe.routerEnableExpertBias &&
      moe.scoreFunction != MoeScoreFunction::Sigmoid)
    return fail({"moe_router_enable_expert_bias", "moe_router_score_function"},
                "moe_router_enable_expert_bias applies to sigmoid scores "
                "(aux-loss-free balancing), not softmax; set "
                "moe_router_score_function sigmoid or remove "
                "moe_router_enable_expert_bias");
  if (c.keyOrigins.count("moe_router_bias_update_rate") &&
      !moe.routerEnableExpertBias)
    return fail({"moe_router_bias_update_rate"},
                "moe_router_bias_update_rate moves the expert bias, which "
                "is off; set moe_router_enable_expert_bias or remove "
                "moe_router_bias_update_rate");
  if (moe.loadBalancing == MoeLoadBalancing::None && moe.auxLossCoeff > 0)
    return fail({"moe_aux_loss_coeff", "moe_router_load_balancing_type"},
                "moe_aux_loss_coeff " + show(moe.auxLossCoeff) +
                    " has no loss to weigh under "
                    "moe_router_load_balancing_type none; set it to 0 or use "
                    "moe_router_load_balancing_type aux_loss");
  bool capacity = moe.expertCapacityFactor > 0;
  if (moe.tokenDropping && *moe.tokenDropping && !capacity)
    return fail({"moe_token_dropping", "moe_expert_capacity_factor"},
                "moe_token_dropping needs moe_expert_capacity_factor (each "
                "expert's capacity, e.g. 1.0); set it, or remove "
                "moe_token_dropping for dropless routing");
  if (moe.tokenDropping && !*moe.tokenDropping && capacity)
    return fail({"moe_token_dropping", "moe_expert_capacity_factor"},
                "moe_token_dropping false contradicts "
                "moe_expert_capacity_factor " +
                    show(moe.expertCapacityFactor) +
                    ", which drops tokens over capacity; remove one of them");
  if (c.keyOrigins.count("moe_token_drop_policy") && !capacity)
    return fail({"moe_token_drop_policy"},
                "moe_token_drop_policy applies to capacity routing; set "
                "moe_expert_capacity_factor or remove moe_token_drop_policy "
                "(dropless routing drops nothing)");
  // Megatron-LM pads each expert's tokens to its capacity so that the
  // dispatch has static shapes; the padding rows weigh 0. The routed rows
  // here are static already ([T * K], zeros after the kept ones), so the
  // flag changes no number; it still needs a capacity, as Megatron-LM's.
  if (moe.padExpertInputToCapacity && !capacity)
    return fail({"moe_pad_expert_input_to_capacity",
                 "moe_expert_capacity_factor"},
                "moe_pad_expert_input_to_capacity needs "
                "moe_expert_capacity_factor (the capacity to pad to, e.g. "
                "1.0); set it, or remove moe_pad_expert_input_to_capacity");
  if (!moe.layerPattern.empty()) {
    if (static_cast<int64_t>(moe.layerPattern.size()) != m.numLayers)
      return fail({"moe_layer_freq", "num_layers"},
                  "moe_layer_freq lists " + show(int64_t(moe.layerPattern.size())) +
                      " layers but the model has num_layers " +
                      show(m.numLayers) + "; give one 0 or 1 per layer");
    if (!llvm::is_contained(moe.layerPattern, 1))
      return fail({"moe_layer_freq"},
                  "moe_layer_freq selects no layer for experts; put a 1 "
                  "where a layer is an MoE layer, or set num_experts 0");
  }
  if (int64_t ep = moe.expertModelParallelSize; ep > 1) {
    // Megatron-LM's expert-parallel ranks hold num_experts / ep experts
    // each and are carved out of the data x context ranks: the dense
    // weights are reduced over all of them, the experts' over the
    // expert-data-parallel group of dp cp / ep ranks.
    if (moe.numExperts % ep != 0)
      return fail({"num_experts", "expert_model_parallel_size"},
                  "num_experts " + show(moe.numExperts) +
                      " is not divisible by expert_model_parallel_size " +
                      show(ep) +
                      ": each expert-parallel rank holds an equal share of "
                      "the experts; use a num_experts that is a multiple of " +
                      show(ep) + " or an expert_model_parallel_size that "
                      "divides " + show(moe.numExperts));
    int64_t ranks = p.dataParallelSize * p.contextParallelSize;
    if (ranks % ep != 0)
      return fail({"expert_model_parallel_size", "data_parallel_size"},
                  "expert_model_parallel_size " + show(ep) +
                      " does not divide data_parallel_size " +
                      show(p.dataParallelSize) + " x context_parallel_size " +
                      show(p.contextParallelSize) + " (= " + show(ranks) +
                      " ranks): as in Megatron-LM, the expert-parallel ranks "
                      "are data-parallel ranks; set data_parallel_size to a "
                      "multiple of " + show(ep));
    // What is there: expert parallelism over the data-parallel ranks or
    // part of them, without context parallelism.
    if (p.contextParallelSize > 1)
      return fail({"expert_model_parallel_size", "context_parallel_size"},
                  "expert_model_parallel_size " + show(ep) +
                      " with context_parallel_size " +
                      show(p.contextParallelSize) +
                      " is not implemented yet (issue 25: the expert-"
                      "parallel ranks are data-parallel ranks here); "
                      "remove one of them");
  }
  struct Layout {
    StringRef key;
    bool used;
    std::string value;
  };
  const Layout layouts[] = {
      {"context_parallel_size", p.contextParallelSize > 1,
       show(p.contextParallelSize)},
      {"precision", c.precision == Precision::FP16, "fp16"}};
  for (const Layout &layout : layouts)
    if (layout.used)
      return fail({layout.key, "num_experts"},
                  "num_experts " + show(moe.numExperts) + " with " +
                      layout.key.str() + " " + layout.value +
                      " is not implemented yet (issue 25: MoE runs without "
                      "context parallelism, in fp32 or bf16); compile "
                      "without " +
                      layout.key.str() + " or with num_experts 0");
  return Error::success();
}

Error megatron::validateCompileConfig(const CompileConfig &config) {
  return Validator(config).run();
}
