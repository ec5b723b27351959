// Reads bundle files: the op table and the shape and element-type rules of
// each instruction (docs/BundleFormat.md).
#include "core/BundleReader.h"
#include "core/Random.h"

#include <algorithm>
#include <set>

namespace mtrt::bundle_detail {

namespace {
const std::vector<AttrSpec> kAttentionAttrs = {
    {"causal", AttrKind::Bool, false},
    {"scale", AttrKind::Number, false},
    {"dropout_p", AttrKind::Number, false},
    {"seed", AttrKind::Int, false},
    {"split_axes", AttrKind::AxesList, false}};
const std::vector<AttrSpec> kAttentionBlockAttrs = {
    {"causal", AttrKind::Bool, false},
    {"scale", AttrKind::Number, false},
    {"dropout_p", AttrKind::Number, false},
    {"seed", AttrKind::Int, false},
    {"split_axes", AttrKind::AxesList, false},
    {"context_axis", AttrKind::Int, true},
    {"context_size", AttrKind::Int, true},
    {"key_step", AttrKind::Int, false}};
const std::vector<AttrSpec> kLossAttrs = {
    {"reduction", AttrKind::String, true},
    {"ignore_index", AttrKind::Int, false}};
const std::vector<AttrSpec> kEpsilon = {{"epsilon", AttrKind::Number, true}};
const std::vector<AttrSpec> kAxis = {{"axis", AttrKind::Int, true}};
const std::vector<AttrSpec> kVocabAxes = {
    {"vocab_shard_axes", AttrKind::IntArray, false}};
const std::vector<AttrSpec> kMoeAuxLossAttrs = {
    {"topk", AttrKind::Int, true},
    {"score_function", AttrKind::String, true},
    {"coeff", AttrKind::Number, true},
    {"sequence_length", AttrKind::Int, false}};
const std::vector<AttrSpec> kCoeff = {{"coeff", AttrKind::Number, true}};
const std::vector<AttrSpec> kDispatchAttrs = {
    {"num_experts", AttrKind::Int, true}, {"expert_ranks", AttrKind::Int, true}};
const std::vector<AttrSpec> kVocabLossAttrs = {
    {"reduction", AttrKind::String, true},
    {"ignore_index", AttrKind::Int, false},
    {"vocab_shard_axes", AttrKind::IntArray, false}};

/// The element types one op may mix (the mt dialect's areMixablePrecisions):
/// equal, or f32 with bf16 or f16.
bool mixablePrecisions(DType a, DType b) {
  auto narrow = [](DType t) { return t == DType::BF16 || t == DType::F16; };
  return a == b || (a == DType::F32 && narrow(b)) ||
         (b == DType::F32 && narrow(a));
}

} // namespace

const std::vector<OpInfo> &opTable() {
  static const std::vector<OpInfo> table = {
      {Op::GetParameter,
       "get_parameter",
       0,
       0,
       1,
       1,
       {{"parameter", AttrKind::Int, true}}},
      {Op::AccumulateGradient,
       "accumulate_gradient",
       1,
       1,
       0,
       0,
       {{"parameter", AttrKind::Int, true}}},
      {Op::Fill,
       "fill",
       0,
       0,
       1,
       1,
       {{"value", AttrKind::Number, true},
        {"loss_seed", AttrKind::Bool, false}}},
      {Op::PositionIds,
       "position_ids",
       0,
       0,
       1,
       1,
       {{"split_axes", AttrKind::AxesList, false},
        {"context_axis", AttrKind::Int, false},
        {"context_size", AttrKind::Int, false}}},
      {Op::Embedding, "embedding", 2, 2, 1, 1, kVocabAxes},
      {Op::LayerNorm, "layer_norm", 2, 3, 1, 1, kEpsilon},
      {Op::RmsNorm, "rms_norm", 2, 2, 1, 1, kEpsilon},
      {Op::Linear,
       "linear",
       2,
       3,
       1,
       1,
       {{"transpose_weight", AttrKind::Bool, false},
        {"whole_rows", AttrKind::Int, false}}},
      {Op::Matmul,
       "matmul",
       2,
       2,
       1,
       1,
       {{"transpose_lhs", AttrKind::Bool, false},
        {"transpose_rhs", AttrKind::Bool, false}}},
      {Op::Attention, "attention", 3, 3, 1, 1, kAttentionAttrs},
      {Op::Rope,
       "rope",
       1,
       1,
       1,
       1,
       {{"base", AttrKind::Number, true},
        {"rotary_dim", AttrKind::Int, false},
        {"inverse", AttrKind::Bool, false},
        {"scaling_factor", AttrKind::Number, false},
        {"low_freq_factor", AttrKind::Number, false},
        {"high_freq_factor", AttrKind::Number, false},
        {"original_max_positions", AttrKind::Int, false},
        {"beta_fast", AttrKind::Number, false},
        {"beta_slow", AttrKind::Number, false},
        {"truncate", AttrKind::Bool, false},
        {"split_axes", AttrKind::AxesList, false},
        {"context_axis", AttrKind::Int, false},
        {"context_size", AttrKind::Int, false},
        {"attention_factor", AttrKind::Number, false}}},
      {Op::Gelu, "gelu", 1, 1, 1, 1, {{"approximate", AttrKind::String, true}}},
      {Op::Silu, "silu", 1, 1, 1, 1, {}},
      {Op::Swiglu, "swiglu", 2, 2, 1, 1, {}},
      {Op::Dropout,
       "dropout",
       1,
       1,
       1,
       1,
       {{"p", AttrKind::Number, true},
        {"seed", AttrKind::Int, true},
        {"split_axes", AttrKind::AxesList, false},
        {"context_axis", AttrKind::Int, false},
        {"context_size", AttrKind::Int, false}}},
      {Op::Add, "add", 2, 2, 1, 1, {}},
      {Op::Mul, "mul", 2, 2, 1, 1, {}},
      {Op::Softmax, "softmax", 1, 1, 1, 1, kAxis},
      {Op::CrossEntropy, "cross_entropy", 2, 2, 1, 1, kLossAttrs},
      {Op::Reshape, "reshape", 1, 1, 1, 1, {}},
      {Op::Transpose,
       "transpose",
       1,
       1,
       1,
       1,
       {{"permutation", AttrKind::IntArray, true}}},
      {Op::Split, "split", 1, 1, 1, kMany, kAxis},
      {Op::Concat, "concat", 1, kMany, 1, 1, kAxis},
      {Op::EmbeddingGrad, "embedding_grad", 2, 2, 1, 1, kVocabAxes},
      {Op::LayerNormGrad, "layer_norm_grad", 3, 3, 2, 3, kEpsilon},
      {Op::RmsNormGrad, "rms_norm_grad", 3, 3, 2, 2, kEpsilon},
      {Op::LinearWeightGrad,
       "linear_weight_grad",
       2,
       2,
       1,
       1,
       {{"transpose_weight", AttrKind::Bool, false}}},
      {Op::BiasGrad, "bias_grad", 1, 1, 1, 1, {}},
      {Op::LinearAdd,
       "linear_add",
       3,
       4,
       1,
       1,
       {{"transpose_weight", AttrKind::Bool, false},
        {"whole_rows", AttrKind::Int, false}}},
      {Op::LinearGelu,
       "linear_gelu",
       2,
       3,
       2,
       2,
       {{"approximate", AttrKind::String, true},
        {"transpose_weight", AttrKind::Bool, false},
        {"whole_rows", AttrKind::Int, false}}},
      {Op::LinearGeluGrad,
       "linear_gelu_grad",
       3,
       3,
       1,
       2,
       {{"approximate", AttrKind::String, true},
        {"transpose_weight", AttrKind::Bool, false},
        {"whole_rows", AttrKind::Int, false}}},
      {Op::LinearWeightBiasGrad,
       "linear_weight_bias_grad",
       2,
       2,
       2,
       2,
       {{"transpose_weight", AttrKind::Bool, false}}},
      {Op::AttentionGrad, "attention_grad", 4, 4, 3, 3, kAttentionAttrs},
      {Op::GeluGrad,
       "gelu_grad",
       2,
       2,
       1,
       1,
       {{"approximate", AttrKind::String, true}}},
      {Op::SiluGrad, "silu_grad", 2, 2, 1, 1, {}},
      {Op::SwigluGrad, "swiglu_grad", 3, 3, 2, 2, {}},
      {Op::SoftmaxGrad, "softmax_grad", 2, 2, 1, 1, kAxis},
      {Op::CrossEntropyGrad, "cross_entropy_grad", 3, 3, 1, 1, kLossAttrs},
      {Op::AllReduce,
       "all_reduce",
       1,
       1,
       1,
       1,
       {{"grid_axes", AttrKind::IntArray, true},
        {"reduction", AttrKind::String, true}}},
      {Op::AllGather,
       "all_gather",
       1,
       1,
       1,
       1,
       {{"grid_axes", AttrKind::IntArray, true},
        {"gather_axis", AttrKind::Int, true}}},
      {Op::ReduceScatter,
       "reduce_scatter",
       1,
       1,
       1,
       1,
       {{"grid_axes", AttrKind::IntArray, true},
        {"scatter_axis", AttrKind::Int, true},
        {"reduction", AttrKind::String, true}}},
      {Op::AllSlice,
       "all_slice",
       1,
       1,
       1,
       1,
       {{"grid_axes", AttrKind::IntArray, true},
        {"slice_axis", AttrKind::Int, true}}},
      {Op::BiasAdd, "bias_add", 2, 2, 1, 1, {}},
      {Op::VocabMax, "vocab_max", 1, 1, 1, 1, {}},
      {Op::VocabPartials, "vocab_partials", 3, 3, 1, 1, kVocabAxes},
      {Op::VocabCrossEntropy, "vocab_cross_entropy", 2, 2, 1, 1, kLossAttrs},
      {Op::VocabCrossEntropyGrad, "vocab_cross_entropy_grad", 5, 5, 1, 1,
       kVocabLossAttrs},
      {Op::Fused,
       "fused",
       1,
       kMany,
       1,
       kMany,
       {{"kernel", AttrKind::Int, true}}},
      {Op::Cast, "cast", 1, 1, 1, 1, {}},
      {Op::LinearCrossEntropy,
       "linear_cross_entropy",
       3,
       3,
       3,
       3,
       {{"reduction", AttrKind::String, true},
        {"ignore_index", AttrKind::Int, false},
        {"chunk_rows", AttrKind::Int, true},
        {"transpose_weight", AttrKind::Bool, false}}},
      {Op::Scale, "scale", 2, 2, 1, 1, {}},
      {Op::LinearVocabMax,
       "linear_vocab_max",
       2,
       2,
       1,
       1,
       {{"chunk_rows", AttrKind::Int, true},
        {"transpose_weight", AttrKind::Bool, false}}},
      {Op::LinearVocabPartials,
       "linear_vocab_partials",
       4,
       4,
       1,
       1,
       {{"chunk_rows", AttrKind::Int, true},
        {"transpose_weight", AttrKind::Bool, false},
        {"vocab_shard_axes", AttrKind::IntArray, false}}},
      {Op::LinearVocabCrossEntropyGrad,
       "linear_vocab_cross_entropy_grad",
       6,
       6,
       2,
       2,
       {{"reduction", AttrKind::String, true},
        {"ignore_index", AttrKind::Int, false},
        {"chunk_rows", AttrKind::Int, true},
        {"transpose_weight", AttrKind::Bool, false},
        {"vocab_shard_axes", AttrKind::IntArray, false}}},
      {Op::AttentionBlock, "attention_block", 3, 3, 2, 2, kAttentionBlockAttrs},
      {Op::AttentionMerge, "attention_merge", 4, 4, 2, 2, {}},
      {Op::AttentionDelta, "attention_delta", 2, 2, 1, 1, {}},
      {Op::AttentionBlockGrad, "attention_block_grad", 6, 6, 3, 3,
       kAttentionBlockAttrs},
      {Op::Shift,
       "shift",
       1,
       1,
       1,
       1,
       {{"grid_axes", AttrKind::IntArray, true},
        {"shift_axis", AttrKind::Int, true},
        {"offset", AttrKind::Int, true}}},
      {Op::MoeRoute,
       "moe_route",
       1,
       2,
       2,
       2,
       {{"topk", AttrKind::Int, true},
        {"score_function", AttrKind::String, true},
        {"normalize", AttrKind::Bool, false},
        {"num_groups", AttrKind::Int, false},
        {"group_topk", AttrKind::Int, false},
        {"capacity_factor", AttrKind::Number, false},
        {"drop_policy", AttrKind::String, false}}},
      {Op::MoeAuxLoss, "moe_aux_loss", 1, 1, 1, 1, kMoeAuxLossAttrs},
      {Op::MoeZLoss, "moe_z_loss", 1, 1, 1, 1, kCoeff},
      {Op::MoePermute, "moe_permute", 2, 3, 1, 1, {}},
      {Op::MoeUnpermute, "moe_unpermute", 2, 3, 1, 1, {}},
      {Op::MoeGroupedLinear,
       "moe_grouped_linear",
       3,
       3,
       1,
       1,
       {{"transpose_weight", AttrKind::Bool, false}}},
      {Op::MoeRouteGrad,
       "moe_route_grad",
       3,
       4,
       1,
       1,
       {{"topk", AttrKind::Int, true},
        {"score_function", AttrKind::String, true},
        {"normalize", AttrKind::Bool, false},
        {"num_groups", AttrKind::Int, false},
        {"group_topk", AttrKind::Int, false}}},
      {Op::MoeAuxLossGrad, "moe_aux_loss_grad", 2, 2, 1, 1, kMoeAuxLossAttrs},
      {Op::MoeZLossGrad, "moe_z_loss_grad", 2, 2, 1, 1, kCoeff},
      {Op::MoeProbsGrad, "moe_probs_grad", 3, 3, 1, 1, {}},
      {Op::MoeGroupedLinearWeightGrad,
       "moe_grouped_linear_weight_grad",
       3,
       3,
       1,
       1,
       {{"transpose_weight", AttrKind::Bool, false}}},
      {Op::MoeTokensPerExpert, "moe_tokens_per_expert", 1, 1, 1, 1, {}},
      {Op::MoeDispatchRows, "moe_dispatch_rows", 2, 2, 1, 1, kDispatchAttrs},
      {Op::MoeDispatchExperts, "moe_dispatch_experts", 1, 1, 1, 1,
       kDispatchAttrs},
      {Op::MoeCombineRows, "moe_combine_rows", 2, 2, 1, 1, kDispatchAttrs},
      {Op::AllToAll,
       "all_to_all",
       1,
       1,
       1,
       1,
       {{"grid_axes", AttrKind::IntArray, true},
        {"split_axis", AttrKind::Int, true},
        {"concat_axis", AttrKind::Int, true}}},
      {Op::Fp8Scale, "fp8_scale", 0, 0, 1, 1, {{"meta", AttrKind::Int, true}}},
      {Op::Fp8CurrentScale,
       "fp8_current_scale",
       1,
       1,
       1,
       1,
       {{"format", AttrKind::String, true}, {"margin", AttrKind::Int, false}}},
      {Op::Fp8Quantize, "fp8_quantize", 2, 2, 2, 2, {}},
      {Op::Fp8Linear,
       "fp8_linear",
       4,
       5,
       1,
       1,
       {{"transpose_weight", AttrKind::Bool, false}}},
      {Op::Fp8LinearWeightGrad,
       "fp8_linear_weight_grad",
       4,
       4,
       1,
       1,
       {{"transpose_weight", AttrKind::Bool, false}}},
      {Op::Fp8Update,
       "fp8_update",
       1,
       1,
       0,
       0,
       {{"meta", AttrKind::Int, true}}},
  };
  return table;
}

const OpInfo &opInfo(Op op) {
  for (const OpInfo &info : opTable())
    if (info.op == op)
      return info;
  throw Error(MTRT_STATUS_INTERNAL, "op without a row in the op table");
}

/// q [b, sq, hq, d], k [b, sk, hkv, d], v [b, sk, hkv, dv] -> [b, sq, hq, dv].
std::vector<int64_t> OpChecker::attentionOutput(size_t q, size_t k, size_t v) {
  for (size_t i : {q, k, v}) {
    expectFloat(false, i);
    expectRank(false, i, 4);
  }
  const auto &qs = operand(q).shape, &ks = operand(k).shape,
             &vs = operand(v).shape;
  if (ks[0] != qs[0] || ks[3] != qs[3])
    failShape(false, k,
              "[" + std::to_string(qs[0]) + ", seq, kv_heads, " +
                  std::to_string(qs[3]) +
                  "] (the query's batch and head dimension)");
  if (ks[2] == 0 || qs[2] % ks[2] != 0)
    failShape(false, k,
              "a key/value head count that divides the query's " +
                  std::to_string(qs[2]) + " heads");
  // A context-parallel block masks by global position instead.
  bool block =
      inst_.op == Op::AttentionBlock || inst_.op == Op::AttentionBlockGrad;
  if (inst_.attrs.causal && !block && qs[1] != ks[1])
    failShape(false, k,
              "the query's sequence length " + std::to_string(qs[1]) +
                  " (causal attention)");
  if (vs[0] != ks[0] || vs[1] != ks[1] || vs[2] != ks[2])
    failShape(false, v,
              "[" + std::to_string(ks[0]) + ", " + std::to_string(ks[1]) +
                  ", " + std::to_string(ks[2]) +
                  ", head_dim_v] (the key's batch, sequence and heads)");
  return {qs[0], qs[1], qs[2], vs[3]};
}

/// The chunked output layers' input [rows..., in] and weight [in, vocab]
/// ([vocab, in] with transpose_weight), and with `labels` their labels
/// [rows...], operand 2; chunk_rows at least 1.
void OpChecker::checkChunkedLinear(bool labels) {
  expectFloat(false, 0);
  expectMinRank(false, 0, 2);
  expectFloat(false, 1);
  expectRank(false, 1, 2);
  const auto &x = operand(0).shape;
  const auto &w = operand(1).shape;
  bool transpose = inst_.attrs.transposeWeight;
  int64_t in = x.back();
  if ((transpose ? w[1] : w[0]) != in)
    failShape(false, 1,
              std::string(transpose ? "[vocab, " : "[") + std::to_string(in) +
                  (transpose ? "]" : ", vocab]") +
                  " (the input's last dimension" +
                  (transpose ? ", transpose_weight" : "") + ")");
  if (labels) {
    expectIndex(false, 2);
    expectShape(false, 2, rowsOfInput(),
                "the input's shape without its last dimension");
  }
  if (inst_.attrs.chunkRows < 1)
    fail(path_ + ".attrs.chunk_rows", std::to_string(inst_.attrs.chunkRows),
         "at least 1 (tokens per chunk)");
}

std::vector<int64_t> OpChecker::rowsOfInput() {
  const auto &x = operand(0).shape;
  return std::vector<int64_t>(x.begin(), x.end() - 1);
}

void OpChecker::checkLoss(size_t logits, size_t labels) {
  expectFloat(false, logits);
  expectMinRank(false, logits, 1);
  expectIndex(false, labels);
  std::vector<int64_t> rows(operand(logits).shape.begin(),
                            operand(logits).shape.end() - 1);
  expectShape(false, labels, rows, "the logits' shape without the vocabulary");
}

/// split_axes of an op that reads global positions: one list per dimension
/// of the value `tile` (the tensor whose global positions key the random
/// stream: dropout's x, attention's q; or position_ids' ids, whose sequence
/// tile gives the positions), splitting only batch and heads for attention.
void OpChecker::checkGlobalTile(bool isResult, size_t tile) {
  const auto &split = inst_.attrs.splitAxes;
  if (split.empty())
    return;
  std::string at = path_ + ".attrs.split_axes";
  if (static_cast<int64_t>(split.size()) != type(isResult, tile).rank())
    fail(at, std::to_string(split.size()) + " lists",
         "one list per dimension of " +
             std::string(isResult ? "result " : "operand ") +
             std::to_string(tile) + " " +
             shapeString(type(isResult, tile).shape));
  if (inst_.op == Op::Attention || inst_.op == Op::AttentionGrad)
    for (size_t d : {size_t(1), size_t(3)})
      if (!split[d].empty())
        fail(index(at, d), shapeString(split[d]),
             "[] (attention splits only batch and heads)");
  // A mask tile describes a sample's slice in kMaskTileDims dimensions.
  if (inst_.op == Op::Dropout && split.size() > random::kMaskTileDims + 1)
    fail(at, std::to_string(split.size()) + " lists",
         "a split dropout of at most " +
             std::to_string(random::kMaskTileDims + 1) +
             " dimensions (the samples and " +
             std::to_string(random::kMaskTileDims) +
             " more, core/Random.h's MaskTile); reshape the tensor to fewer "
             "dimensions before the dropout");
}

/// all_reduce, all_gather, reduce_scatter, all_slice: x -> y, the axis
/// attribute (in attrs.axis) multiplied or divided by the group size.
void OpChecker::checkCollective() {
  const Attributes &a = inst_.attrs;
  expectFloat(false, 0);
  int64_t group = gridGroupSize(reader_.grid_, a.gridAxes);
  std::string groupText = "the group size " + std::to_string(group) +
                          " (grid " + shapeString(reader_.grid_) +
                          " along grid_axes " + shapeString(a.gridAxes) + ")";
  std::vector<int64_t> shape = operand(0).shape;
  if (inst_.op == Op::AllReduce) {
    expectShape(true, 0, shape, "the input's shape");
    return;
  }
  const char *attr = inst_.op == Op::AllGather       ? "gather_axis"
                     : inst_.op == Op::ReduceScatter ? "scatter_axis"
                                                     : "slice_axis";
  int64_t rank = operand(0).rank();
  if (a.axis < -rank || a.axis >= rank)
    fail(path_ + ".attrs." + attr, std::to_string(a.axis),
         "an axis in [" + std::to_string(-rank) + ", " + std::to_string(rank) +
             ") for rank " + std::to_string(rank));
  int64_t axis = a.axis < 0 ? a.axis + rank : a.axis;
  if (inst_.op == Op::AllGather) {
    shape[axis] *= group;
    expectShape(true, 0, shape,
                "the input's shape with axis " + std::to_string(axis) +
                    " multiplied by " + groupText);
    return;
  }
  if (shape[axis] % group != 0)
    failShape(false, 0,
              "a size along axis " + std::to_string(axis) + " divisible by " +
                  groupText);
  shape[axis] /= group;
  expectShape(true, 0, shape,
              "the input's shape with axis " + std::to_string(axis) +
                  " divided by " + groupText);
}

/// shift: x -> y of the same shape, along a grid axis of its group.
void OpChecker::checkShift() {
  const Attributes &a = inst_.attrs;
  expectFloat(false, 0);
  if (!std::count(a.gridAxes.begin(), a.gridAxes.end(), a.shiftAxis))
    fail(path_ + ".attrs.shift_axis", std::to_string(a.shiftAxis),
         "one of the instruction's grid_axes " + shapeString(a.gridAxes) +
             " (the ranks that pass the operand around)");
  expectShape(true, 0, operand(0).shape, "the input's shape");
}

/// position_ids and rope under context parallelism: the sequence tile
/// (dimension `sequenceDim` of the operand or result `tile`) is a block of
/// the load-balanced sequence (2 context_size chunks), split over the
/// context axis, whose size the grid gives.
void OpChecker::checkContextLayout(bool isResult, size_t tile,
                                   size_t sequenceDim) {
  const Attributes &a = inst_.attrs;
  const std::vector<int64_t> &grid = reader_.grid_;
  if (a.contextAxis >= static_cast<int64_t>(grid.size()) ||
      grid[a.contextAxis] != a.contextSize)
    fail(path_ + ".attrs.context_axis",
         std::to_string(a.contextAxis) + " with context_size " +
             std::to_string(a.contextSize),
         "a grid axis of context_size ranks (grid " + shapeString(grid) + ")");
  const std::vector<int64_t> none;
  const std::vector<int64_t> &sequenceAxes =
      sequenceDim < a.splitAxes.size() ? a.splitAxes[sequenceDim] : none;
  if (!std::count(sequenceAxes.begin(), sequenceAxes.end(), a.contextAxis))
    fail(path_ + ".attrs.split_axes", shapeString(sequenceAxes),
         "the sequence split over context_axis " +
             std::to_string(a.contextAxis));
  int64_t global = gridGroupSize(grid, sequenceAxes) *
                   type(isResult, tile).shape[sequenceDim];
  if (global % (2 * a.contextSize) != 0)
    fail(path_ + ".attrs.context_size", std::to_string(a.contextSize),
         "a global sequence (" + std::to_string(global) +
             ") that divides into 2 context_size load-balanced chunks");
}

/// The block's place in the context-parallel group: a grid axis of
/// context_size ranks, a ring step in range, and key and query lengths that
/// fit the load-balanced layout (two chunks per rank).
void OpChecker::checkAttentionBlock(size_t q) {
  const Attributes &a = inst_.attrs;
  const std::vector<int64_t> &grid = reader_.grid_;
  std::string at = path_ + ".attrs.context_axis";
  if (a.contextAxis >= static_cast<int64_t>(grid.size()) ||
      grid[a.contextAxis] != a.contextSize)
    fail(at,
         std::to_string(a.contextAxis) + " with context_size " +
             std::to_string(a.contextSize),
         "a grid axis of context_size ranks (grid " + shapeString(grid) + ")");
  if (a.keyStep && *a.keyStep >= a.contextSize)
    fail(path_ + ".attrs.key_step", std::to_string(*a.keyStep),
         "a ring step in [0, " + std::to_string(a.contextSize) + ")");
  expectRank(false, q, 4);
  expectRank(false, q + 1, 4);
  int64_t seq = operand(q).shape[1], keys = operand(q + 1).shape[1];
  if (seq % 2 != 0)
    failShape(false, q, "an even sequence (a rank's two chunks)");
  int64_t expected = a.keyStep ? seq : seq * a.contextSize;
  if (keys != expected)
    failShape(false, q + 1,
              "a sequence of " + std::to_string(expected) +
                  (a.keyStep ? " (one rank's block)"
                             : " (every rank's block, gathered)"));
}

/// moe_dispatch_rows ([T K, H], [T, K] -> [N T K, H]), moe_dispatch_experts
/// ([T, K] -> [N T K, 1] i32), moe_combine_rows ([N T K, H], [T, K] ->
/// [T K, H]): num_experts divides among expert_ranks N.
void OpChecker::checkExpertDispatch() {
  const Attributes &a = inst_.attrs;
  if (a.expertRanks < 1 || a.numExperts < 1 ||
      a.numExperts % a.expertRanks != 0)
    fail(path_ + ".attrs.num_experts", std::to_string(a.numExperts),
         "a positive multiple of expert_ranks " +
             std::to_string(a.expertRanks));
  bool experts = inst_.op == Op::MoeDispatchExperts;
  size_t at = experts ? 0 : 1;
  expectIndex(false, at);
  expectRank(false, at, 2);
  const std::vector<int64_t> &routing = operand(at).shape;
  int64_t slots = routing[0] * routing[1];
  int64_t blocks = a.expertRanks * slots;
  if (experts) {
    expectIndex(true, 0);
    expectShape(true, 0, {blocks, 1},
                "[expert_ranks * tokens * topk, 1] (one expert per row)");
    return;
  }
  bool dispatch = inst_.op == Op::MoeDispatchRows;
  expectFloat(false, 0);
  expectRank(false, 0, 2);
  int64_t width = operand(0).shape[1];
  expectShape(false, 0, {dispatch ? slots : blocks, width},
              dispatch ? "[tokens * topk, hidden] (permuted rows)"
                       : "[expert_ranks * tokens * topk, hidden] (blocks)");
  expectShape(true, 0, {dispatch ? blocks : slots, width},
              dispatch ? "[expert_ranks * tokens * topk, hidden] (blocks)"
                       : "[tokens * topk, hidden] (permuted rows)");
}

void OpChecker::checkMoe() {
  const Attributes &a = inst_.attrs;
  auto expectI32 = [&](bool isResult, size_t i) {
    DType dtype = type(isResult, i).dtype;
    if (dtype != DType::I32)
      fail(where(isResult, i),
           std::string("dtype ") + dtypeName(dtype) + " (value " +
               std::to_string(valueIndex(isResult, i)) + ")",
           std::string("i32 routing indices for ") + opName(inst_.op));
  };
  // Router logits [T, E] at operand `i`, with attrs.topk in [1, E] when
  // `topk`.
  auto logits = [&](size_t i, bool topk) {
    expectFloat(false, i);
    expectRank(false, i, 2);
    int64_t experts = operand(i).shape[1];
    if (topk && (a.topk < 1 || a.topk > experts))
      fail(path_ + ".attrs.topk", std::to_string(a.topk),
           "a top-k in [1, " + std::to_string(experts) +
               "] (the logits' experts)");
  };
  // Group-limited routing over the logits at operand `i`: both attributes
  // or neither; the groups divide the experts, and the kept groups hold
  // the top-k, at least one expert's score from each.
  auto groups = [&](size_t i) {
    if (!a.numGroups && !a.groupTopk)
      return;
    int64_t experts = operand(i).shape[1];
    if (!a.numGroups || !a.groupTopk)
      fail(path_ + ".attrs",
           a.numGroups ? "num_groups alone" : "group_topk alone",
           "num_groups and group_topk together (group-limited routing)");
    if (experts % a.numGroups != 0)
      fail(path_ + ".attrs.num_groups", std::to_string(a.numGroups),
           "a divisor of the logits' " + std::to_string(experts) + " experts");
    int64_t most = std::min(a.numGroups, a.topk);
    if (a.groupTopk > most)
      fail(path_ + ".attrs.group_topk", std::to_string(a.groupTopk),
           "a group count in [1, " + std::to_string(most) +
               "] (at most num_groups and topk)");
    int64_t reachable = a.groupTopk * (experts / a.numGroups);
    if (a.topk > reachable)
      fail(path_ + ".attrs.topk", std::to_string(a.topk),
           "at most the " + std::to_string(reachable) +
               " experts of the kept groups");
  };
  // The expert bias of aux-loss-free balancing at operand `i`, when
  // present: [E] in f32 for the logits at operand `at`, with sigmoid scores.
  auto expertBias = [&](size_t i, size_t at) {
    if (inst_.operands.size() <= i)
      return;
    if (type(false, i).dtype != DType::F32)
      fail(where(false, i),
           std::string("dtype ") + dtypeName(type(false, i).dtype) +
               " (value " + std::to_string(valueIndex(false, i)) + ")",
           "an f32 expert bias");
    expectShape(false, i, {operand(at).shape[1]}, "[experts], the bias");
    if (!a.sigmoid)
      fail(path_ + ".attrs.score_function", "softmax",
           "sigmoid: the expert bias applies to sigmoid scores only");
  };
  // The sequence-level aux loss's sequences over the logits at operand
  // `i`: whole ones.
  auto sequences = [&](size_t i) {
    int64_t tokens = operand(i).shape[0];
    if (a.sequenceLength && tokens % a.sequenceLength != 0)
      fail(path_ + ".attrs.sequence_length", std::to_string(a.sequenceLength),
           "a divisor of the logits' " + std::to_string(tokens) +
               " tokens (whole sequences)");
  };
  // Routing indices [T, K] at operand `i` (T given, or -1 for any).
  auto indices = [&](size_t i, int64_t tokens) {
    expectI32(false, i);
    expectRank(false, i, 2);
    if (tokens >= 0 && operand(i).shape[0] != tokens)
      failShape(false, i,
                "[" + std::to_string(tokens) + ", topk] (one row per token)");
    return operand(i).shape;
  };
  auto rowsOf = [&](const std::vector<int64_t> &routing) {
    return routing[0] * routing[1];
  };
  const std::vector<int64_t> scalar;
  switch (inst_.op) {
  case Op::MoeRoute: {
    logits(0, true);
    groups(0);
    expertBias(1, 0);
    std::vector<int64_t> shape = {operand(0).shape[0], a.topk};
    expectFloat(true, 0);
    expectShape(true, 0, shape, "[tokens, topk]");
    expectI32(true, 1);
    expectShape(true, 1, shape, "[tokens, topk]");
    break;
  }
  case Op::MoeAuxLoss:
  case Op::MoeZLoss:
    logits(0, inst_.op == Op::MoeAuxLoss);
    sequences(0);
    expectFloat(true, 0);
    expectShape(true, 0, scalar, "a scalar loss");
    break;
  case Op::MoeAuxLossGrad:
  case Op::MoeZLossGrad:
    expectFloat(false, 0);
    expectShape(false, 0, scalar, "a scalar loss gradient");
    logits(1, inst_.op == Op::MoeAuxLossGrad);
    sequences(1);
    expectShape(true, 0, operand(1).shape, "the logits' shape");
    break;
  case Op::MoeRouteGrad: {
    logits(1, true);
    groups(1);
    expertBias(3, 1);
    std::vector<int64_t> routing = indices(2, operand(1).shape[0]);
    if (routing[1] != a.topk)
      failShape(false, 2, "[tokens, " + std::to_string(a.topk) + "] (topk)");
    expectFloat(false, 0);
    expectShape(false, 0, routing, "the indices' shape");
    expectShape(true, 0, operand(1).shape, "the logits' shape");
    break;
  }
  case Op::MoePermute:
  case Op::MoeUnpermute: {
    bool permute = inst_.op == Op::MoePermute;
    expectFloat(false, 0);
    expectRank(false, 0, 2);
    std::vector<int64_t> routing =
        indices(1, permute ? operand(0).shape[0] : -1);
    if (!permute && operand(0).shape[0] != rowsOf(routing))
      failShape(false, 0,
                "[" + std::to_string(rowsOf(routing)) +
                    ", hidden] (tokens * topk permuted rows)");
    if (inst_.operands.size() == 3) {
      expectFloat(false, 2);
      expectShape(false, 2, routing, "the indices' shape (routing weights)");
    }
    int64_t hidden = operand(0).shape[1];
    expectShape(true, 0,
                permute ? std::vector<int64_t>{rowsOf(routing), hidden}
                        : std::vector<int64_t>{routing[0], hidden},
                permute ? "[tokens * topk, hidden]" : "[tokens, hidden]");
    break;
  }
  case Op::MoeTokensPerExpert:
    indices(0, -1);
    if (result(0).dtype != DType::F32)
      fail(where(true, 0),
           std::string("dtype ") + dtypeName(result(0).dtype) + " (value " +
               std::to_string(valueIndex(true, 0)) + ")",
           "f32 counts for moe_tokens_per_expert");
    expectRank(true, 0, 1);
    break;
  case Op::MoeProbsGrad: {
    expectFloat(false, 0);
    expectRank(false, 0, 2);
    std::vector<int64_t> routing = indices(2, operand(0).shape[0]);
    expectFloat(false, 1);
    expectShape(false, 1, {rowsOf(routing), operand(0).shape[1]},
                "[tokens * topk, hidden] (permuted rows)");
    expectShape(true, 0, routing, "the indices' shape");
    break;
  }
  case Op::MoeGroupedLinear:
  case Op::MoeGroupedLinearWeightGrad: {
    bool forward = inst_.op == Op::MoeGroupedLinear;
    bool transpose = a.transposeWeight;
    std::vector<int64_t> routing = indices(2, -1);
    expectFloat(false, 0);
    expectShape(false, 0, {rowsOf(routing), operand(0).rank() == 2
                                                ? operand(0).shape[1]
                                                : -1},
                "[tokens * topk, in] (permuted rows)");
    expectFloat(false, 1);
    expectRank(false, 1, forward ? 3 : 2);
    const std::vector<int64_t> &w =
        forward ? operand(1).shape : result(0).shape;
    if (!forward && (result(0).rank() != 3 || w[0] < 1))
      failShape(true, 0, "[experts, ...] with at least one expert");
    int64_t in = transpose ? w[2] : w[1], out = transpose ? w[1] : w[2];
    if (operand(0).shape[1] != in)
      failShape(false, 0,
                "[" + std::to_string(rowsOf(routing)) + ", " +
                    std::to_string(in) + "] (the expert weights' input)");
    std::vector<int64_t> rowsOut = {rowsOf(routing), out};
    if (forward)
      expectShape(true, 0, rowsOut, "[tokens * topk, out]");
    else
      expectShape(false, 1, rowsOut, "[tokens * topk, out] (the output gradient)");
    break;
  }
  default:
    break;
  }
}

void OpChecker::check() {
  const Attributes &a = inst_.attrs;
  const char *name = opName(inst_.op);
  auto sameAs = [&](bool isResult, size_t i, size_t like) {
    expectShape(isResult, i, operand(like).shape,
                std::string("the shape of operands[") + std::to_string(like) +
                    "]");
  };
  switch (inst_.op) {
  case Op::GetParameter:
  case Op::AccumulateGradient: {
    const Parameter &parameter = parameters_[a.parameter];
    bool isResult = inst_.op == Op::GetParameter;
    const TensorType &t = type(isResult, 0);
    const TensorType &local = parameter.localType;
    if (t.shape != local.shape || t.dtype != local.dtype)
      fail(where(isResult, 0),
           t.str() + " (value " + std::to_string(valueIndex(isResult, 0)) + ")",
           local.str() + ", the type of " +
               (parameter.splitAxes.empty() ? "" : "a rank's shard of ") +
               "parameters[" + std::to_string(a.parameter) + "] (" +
               parameter.name + ")");
    break;
  }
  case Op::Fill:
    expectFloat(true, 0);
    break;
  case Op::PositionIds:
    expectIndex(true, 0);
    expectMinRank(true, 0, 1);
    checkGlobalTile(true, 0);
    if (a.contextSize > 1)
      checkContextLayout(true, 0, result(0).shape.size() - 1);
    break;
  case Op::Embedding: {
    expectFloat(false, 0);
    expectRank(false, 0, 2);
    expectIndex(false, 1);
    expectFloat(true, 0);
    std::vector<int64_t> shape = operand(1).shape;
    shape.push_back(operand(0).shape[1]);
    expectShape(true, 0, shape, "the ids' shape and the table's hidden size");
    break;
  }
  case Op::LayerNorm:
  case Op::RmsNorm: {
    expectFloat(false, 0);
    expectMinRank(false, 0, 1);
    std::vector<int64_t> hidden = {operand(0).shape.back()};
    for (size_t i = 1; i < inst_.operands.size(); ++i) {
      expectFloat(false, i);
      expectShape(false, i, hidden, "the input's last dimension");
    }
    sameAs(true, 0, 0);
    break;
  }
  case Op::Linear:
  case Op::LinearGelu:
  case Op::LinearGeluGrad:
  case Op::LinearAdd: {
    // The fused ops' GEMM is checked as mt.linear's (the gradient's operand
    // 2 is the pre-activation, linear_add's the addend, not a bias); each
    // other result, the pre-activation and the addend have the GEMM's
    // result shape.
    bool fusedGrad = inst_.op == Op::LinearGeluGrad;
    size_t biasAt = inst_.op == Op::LinearAdd ? 3 : 2;
    expectFloat(false, 0);
    expectMinRank(false, 0, 1);
    expectFloat(false, 1);
    expectRank(false, 1, 2);
    int64_t in = operand(0).shape.back();
    const auto &w = operand(1).shape;
    int64_t wIn = a.transposeWeight ? w[1] : w[0];
    int64_t out = a.transposeWeight ? w[0] : w[1];
    if (wIn != in)
      failShape(false, 1,
                std::string(a.transposeWeight ? "[out, " : "[") +
                    std::to_string(in) + (a.transposeWeight ? "]" : ", out]") +
                    " (the input's last dimension" +
                    (a.transposeWeight ? ", transpose_weight" : "") + ")");
    if (inst_.operands.size() == biasAt + 1 && !fusedGrad) {
      expectFloat(false, biasAt);
      expectShape(false, biasAt, {out}, "the weight's output size");
    }
    std::vector<int64_t> shape = operand(0).shape;
    shape.back() = out;
    expectFloat(true, 0);
    expectShape(true, 0, shape,
                "the input's leading dimensions and the output size");
    if (inst_.op == Op::LinearGelu) {
      expectFloat(true, 1);
      expectShape(true, 1, shape, "the GEMM's result shape");
    }
    if (inst_.op == Op::LinearAdd) {
      expectShape(false, 2, shape, "the GEMM's result shape");
      sameAs(true, 0, 2);
    }
    if (fusedGrad) {
      expectFloat(false, 2);
      expectShape(false, 2, shape, "the GEMM's result shape");
      if (inst_.results.size() == 2)
        expectShape(true, 1, {out}, "the GEMM's output size");
    }
    // A --tp-comm-overlap chunk names the rows of its whole, a multiple of
    // its own.
    int64_t rows = 1;
    for (size_t d = 0; d + 1 < shape.size(); ++d)
      rows *= shape[d];
    int64_t whole = inst_.attrs.wholeRows;
    if (whole != 0 && (whole < rows || (rows > 0 && whole % rows != 0)))
      fail(path_ + ".attrs.whole_rows", std::to_string(whole),
           "a multiple of the GEMM's " + std::to_string(rows) +
               " rows (the rows of the GEMM it is a chunk of)");
    break;
  }
  case Op::Matmul: {
    expectFloat(false, 0);
    expectFloat(false, 1);
    expectMinRank(false, 0, 2);
    expectRank(false, 1, operand(0).rank());
    const auto &l = operand(0).shape, &r = operand(1).shape;
    size_t rank = l.size();
    if (!std::equal(l.begin(), l.end() - 2, r.begin()))
      failShape(false, 1, "the batch dimensions of operands[0]");
    int64_t m = a.transposeLhs ? l[rank - 1] : l[rank - 2];
    int64_t k = a.transposeLhs ? l[rank - 2] : l[rank - 1];
    int64_t k2 = a.transposeRhs ? r[rank - 1] : r[rank - 2];
    int64_t n = a.transposeRhs ? r[rank - 2] : r[rank - 1];
    if (k != k2)
      failShape(false, 1,
                "a contracted dimension of " + std::to_string(k) +
                    " like operands[0]");
    std::vector<int64_t> shape(l.begin(), l.end() - 2);
    shape.push_back(m);
    shape.push_back(n);
    expectFloat(true, 0);
    expectShape(true, 0, shape, "the batch dimensions, then m x n");
    break;
  }
  case Op::AttentionBlock:
  case Op::AttentionBlockGrad: {
    bool grad = inst_.op == Op::AttentionBlockGrad;
    size_t q = grad ? 1 : 0;
    checkGlobalTile(false, q);
    checkAttentionBlock(q);
    std::vector<int64_t> out = attentionOutput(q, q + 1, q + 2);
    const auto &qs = operand(q).shape;
    std::vector<int64_t> rows = {qs[0], qs[2], qs[1]};
    if (!grad) {
      expectShape(true, 0, out, "[batch, seq_q, heads_q, head_dim_v]");
      expectShape(true, 1, rows, "[batch, heads_q, seq_q] (the logsumexp)");
      break;
    }
    expectShape(false, 0, out, "the block's output shape");
    expectShape(false, 4, rows, "[batch, heads_q, seq_q] (the logsumexp)");
    expectShape(false, 5, rows, "[batch, heads_q, seq_q] (the delta)");
    for (size_t i = 0; i < 3; ++i)
      sameAs(true, i, q + i);
    break;
  }
  case Op::AttentionMerge:
  case Op::AttentionDelta: {
    expectRank(false, 0, 4);
    const auto &o = operand(0).shape;
    std::vector<int64_t> rows = {o[0], o[2], o[1]};
    if (inst_.op == Op::AttentionDelta) {
      sameAs(false, 1, 0);
      expectShape(true, 0, rows, "[batch, heads, seq] (the output's rows)");
      break;
    }
    expectShape(false, 1, rows, "[batch, heads, seq] (the output's rows)");
    sameAs(false, 2, 0);
    sameAs(false, 3, 1);
    sameAs(true, 0, 0);
    sameAs(true, 1, 1);
    break;
  }
  case Op::Attention:
    checkGlobalTile(false, 0);
    expectFloat(true, 0);
    expectShape(true, 0, attentionOutput(0, 1, 2),
                "[batch, seq_q, heads_q, head_dim_v]");
    break;
  case Op::AttentionGrad: {
    checkGlobalTile(false, 1);
    std::vector<int64_t> out = attentionOutput(1, 2, 3);
    expectFloat(false, 0);
    expectShape(false, 0, out, "the attention output's shape");
    for (size_t i = 0; i < 3; ++i) {
      expectFloat(true, i);
      sameAs(true, i, i + 1);
    }
    break;
  }
  case Op::Rope: {
    expectFloat(false, 0);
    expectRank(false, 0, 4);
    int64_t headDim = operand(0).shape[3];
    int64_t rotary = a.rotaryDim.value_or(headDim);
    if (rotary % 2 != 0 || rotary > headDim || rotary < 0)
      fail(path_ + ".attrs.rotary_dim", std::to_string(rotary),
           "an even number of features <= the head dimension " +
               std::to_string(headDim));
    // Under context parallelism the rows are rotated by their positions in
    // the load-balanced sequence (docs/Parallelism.md).
    checkGlobalTile(false, 0);
    if (a.contextSize > 1)
      checkContextLayout(false, 0, 1);
    // yarn takes beta_fast above beta_slow, with original_max_positions
    // and none of llama3's factors.
    bool anyYarn = a.betaFast > 0 || a.betaSlow > 0;
    if (anyYarn) {
      if (!(a.betaFast > 0 && a.betaSlow > 0 && a.originalMaxPositions > 0 &&
            a.lowFreqFactor == 0 && a.highFreqFactor == 0))
        fail(path_ + ".attrs", "some of beta_fast, beta_slow and "
                               "original_max_positions",
             "all three (yarn scaling), without low_freq_factor and "
             "high_freq_factor");
      if (!(a.betaFast > a.betaSlow))
        fail(path_ + ".attrs.beta_fast", std::to_string(a.betaFast),
             "a number of rotations above beta_slow " +
                 std::to_string(a.betaSlow));
      sameAs(true, 0, 0);
      break;
    }
    // llama3 scaling takes its three attributes together, the high
    // frequency factor above the low one, and the scaling factor with them.
    bool anyLlama3 = a.lowFreqFactor > 0 || a.highFreqFactor > 0 ||
                     a.originalMaxPositions > 0;
    bool allLlama3 = a.lowFreqFactor > 0 && a.highFreqFactor > 0 &&
                     a.originalMaxPositions > 0;
    if (anyLlama3 && !allLlama3)
      fail(path_ + ".attrs", "some of low_freq_factor, high_freq_factor and "
                             "original_max_positions",
           "all three (llama3 scaling) or none");
    if (allLlama3 && !(a.highFreqFactor > a.lowFreqFactor))
      fail(path_ + ".attrs.high_freq_factor",
           std::to_string(a.highFreqFactor),
           "a factor above low_freq_factor " +
               std::to_string(a.lowFreqFactor));
    sameAs(true, 0, 0);
    break;
  }
  case Op::Gelu:
  case Op::Silu:
  case Op::Dropout:
  case Op::Softmax:
    if (inst_.op == Op::Dropout) {
      checkGlobalTile(false, 0);
      // Under context parallelism the mask is keyed on the rows' positions
      // in the load-balanced sequence (dimension 1).
      if (a.contextSize > 1) {
        expectMinRank(false, 0, 2);
        checkContextLayout(false, 0, 1);
      }
    }
    expectFloat(false, 0);
    if (inst_.op == Op::Softmax)
      normalizeAxis(a.axis, operand(0).rank());
    sameAs(true, 0, 0);
    break;
  case Op::Cast: // f32 to or from a 16-bit type (checkOneElementType)
    expectFloat(false, 0);
    sameAs(true, 0, 0);
    if (result(0).dtype == operand(0).dtype)
      fail(where(true, 0), std::string("dtype ") + dtypeName(result(0).dtype),
           std::string("another element type than the input's (a cast "
                       "converts)"));
    break;
  case Op::Fused: { // one shape throughout, but for column sums (f32
                    // vectors of the last dimension, each defined by a
                    // bias_grad of the body); the body's ops are checked alone
    expectFloat(false, 0);
    for (size_t i = 1; i < inst_.operands.size(); ++i)
      sameAs(false, i, 0);
    const std::vector<int64_t> &shape = operand(0).shape;
    std::vector<int64_t> sum = {shape.empty() ? 1 : shape.back()};
    for (size_t i = 0; i < inst_.results.size(); ++i)
      if (!(result(i).shape == sum && result(i).dtype == DType::F32 &&
            sum != shape))
        sameAs(true, i, 0);
    break;
  }
  case Op::Swiglu:
  case Op::Add:
  case Op::Mul:
    expectFloat(false, 0);
    sameAs(false, 1, 0);
    sameAs(true, 0, 0);
    break;
  case Op::CrossEntropy: {
    checkLoss(0, 1);
    expectFloat(true, 0);
    std::vector<int64_t> shape;
    if (a.reduction == Reduction::None)
      shape = operand(1).shape;
    expectShape(true, 0, shape,
                a.reduction == Reduction::None ? "the labels' shape"
                                               : "a scalar for mean and sum");
    break;
  }
  case Op::LinearVocabMax:
    checkChunkedLinear(false);
    expectShape(true, 0, rowsOfInput(),
                "the input's shape without its last dimension");
    break;
  case Op::LinearVocabPartials: {
    checkChunkedLinear(true);
    std::vector<int64_t> rows = rowsOfInput();
    expectShape(false, 3, rows, "the labels' shape (one maximum per row)");
    rows.push_back(2);
    expectShape(true, 0, rows, "[rows..., 2] (sum of exponentials, target)");
    break;
  }
  case Op::LinearVocabCrossEntropyGrad: {
    // input, weight, labels, max, partials, loss_grad -> input_grad,
    // weight_grad.
    checkChunkedLinear(true);
    std::vector<int64_t> rows = rowsOfInput();
    expectShape(false, 3, rows, "the labels' shape (one maximum per row)");
    rows.push_back(2);
    expectShape(false, 4, rows, "[rows..., 2] (the partials)");
    if (a.reduction == Reduction::None)
      fail(path_ + ".attrs.reduction", "none", "mean or sum");
    expectFloat(false, 5);
    expectShape(false, 5, {}, "a scalar for mean and sum");
    sameAs(true, 0, 0);
    sameAs(true, 1, 1);
    break;
  }
  case Op::LinearCrossEntropy: {
    // input [rows..., in], weight [in, vocab] ([vocab, in] with
    // transpose_weight), labels [rows...] -> loss, input_grad, weight_grad.
    checkChunkedLinear(true);
    if (a.reduction == Reduction::None)
      fail(path_ + ".attrs.reduction", "none", "mean or sum");
    expectFloat(true, 0);
    expectShape(true, 0, {}, "a scalar for mean and sum");
    sameAs(true, 1, 0);
    sameAs(true, 2, 1);
    break;
  }
  case Op::Scale:
    expectFloat(false, 0);
    expectFloat(false, 1);
    expectShape(false, 1, {}, "a scalar factor");
    sameAs(true, 0, 0);
    break;
  case Op::CrossEntropyGrad: {
    checkLoss(1, 2);
    expectFloat(false, 0);
    std::vector<int64_t> shape;
    if (a.reduction == Reduction::None)
      shape = operand(2).shape;
    expectShape(false, 0, shape,
                a.reduction == Reduction::None ? "the labels' shape"
                                               : "a scalar for mean and sum");
    sameAs(true, 0, 1);
    break;
  }
  case Op::Reshape:
    expectFloat(false, 0);
    if (result(0).numElements != operand(0).numElements)
      failShape(true, 0,
                "a shape of " + std::to_string(operand(0).numElements) +
                    " elements like the input " +
                    shapeString(operand(0).shape));
    break;
  case Op::Transpose: {
    expectFloat(false, 0);
    const auto &in = operand(0).shape;
    const auto &perm = a.permutation;
    std::vector<bool> seen(in.size(), false);
    bool valid = perm.size() == in.size();
    for (int64_t p : perm) {
      if (!valid || p < 0 || p >= static_cast<int64_t>(in.size()) || seen[p]) {
        valid = false;
        break;
      }
      seen[p] = true;
    }
    if (!valid)
      fail(path_ + ".attrs.permutation", shapeString(perm),
           "a permutation of 0.." + std::to_string(in.size()) +
               " (exclusive) for the input's rank " +
               std::to_string(in.size()));
    std::vector<int64_t> shape;
    for (int64_t p : perm)
      shape.push_back(in[p]);
    expectShape(true, 0, shape, "the input's dimensions permuted");
    break;
  }
  case Op::Split:
  case Op::Concat: {
    bool split = inst_.op == Op::Split;
    // `whole` is the unsplit tensor; `pieces` the others.
    bool wholeIsResult = !split;
    const TensorType &whole = type(wholeIsResult, 0);
    size_t count = split ? inst_.results.size() : inst_.operands.size();
    expectFloat(wholeIsResult, 0);
    int64_t axis = normalizeAxis(a.axis, whole.rank());
    int64_t sum = 0;
    for (size_t i = 0; i < count; ++i) {
      const TensorType &piece = type(split, i);
      std::vector<int64_t> expected = whole.shape;
      expected[axis] = piece.rank() == whole.rank() ? piece.shape[axis] : -1;
      if (piece.shape != expected)
        failShape(split, i,
                  "the shape " + shapeString(whole.shape) +
                      " except along axis " + std::to_string(axis));
      sum += piece.shape[axis];
    }
    if (sum != whole.shape[axis])
      failShape(wholeIsResult, 0,
                "a size along axis " + std::to_string(axis) + " of " +
                    std::to_string(sum) + ", the sum of the pieces'");
    break;
  }
  case Op::EmbeddingGrad: {
    expectFloat(false, 0);
    expectIndex(false, 1);
    std::vector<int64_t> ids = operand(1).shape;
    expectMinRank(false, 0, 1);
    int64_t hidden = operand(0).shape.back();
    ids.push_back(hidden);
    expectShape(false, 0, ids, "the ids' shape and the hidden size");
    expectFloat(true, 0);
    expectRank(true, 0, 2);
    if (result(0).shape[1] != hidden)
      failShape(true, 0,
                "[vocab, " + std::to_string(hidden) + "] (the hidden size)");
    break;
  }
  case Op::LayerNormGrad:
  case Op::RmsNormGrad: {
    expectFloat(false, 1);
    expectMinRank(false, 1, 1);
    sameAs(false, 0, 1);
    std::vector<int64_t> hidden = {operand(1).shape.back()};
    expectShape(false, 2, hidden, "the input's last dimension");
    sameAs(true, 0, 1);
    for (size_t i = 1; i < inst_.results.size(); ++i)
      expectShape(true, i, hidden, "the input's last dimension");
    break;
  }
  case Op::LinearWeightGrad:
  case Op::LinearWeightBiasGrad: {
    expectFloat(false, 0);
    expectMinRank(false, 0, 1);
    const auto &x = operand(0).shape;
    std::vector<int64_t> dy = x;
    dy.back() =
        operand(1).rank() == operand(0).rank() ? operand(1).shape.back() : -1;
    if (operand(1).shape != dy)
      failShape(false, 1, "the input's leading dimensions, then out");
    int64_t in = x.back(), out = dy.back();
    expectShape(true, 0,
                a.transposeWeight ? std::vector<int64_t>{out, in}
                                  : std::vector<int64_t>{in, out},
                a.transposeWeight ? "[out, in] with transpose_weight"
                                  : "[in, out]");
    if (inst_.op == Op::LinearWeightBiasGrad)
      expectShape(true, 1, {out}, "the output gradient's last dimension");
    break;
  }
  case Op::BiasGrad:
    expectFloat(false, 0);
    expectMinRank(false, 0, 1);
    expectShape(true, 0, {operand(0).shape.back()},
                "the output gradient's last dimension");
    break;
  case Op::GeluGrad:
  case Op::SiluGrad:
    expectFloat(false, 1);
    sameAs(false, 0, 1);
    sameAs(true, 0, 1);
    break;
  case Op::SwigluGrad:
    expectFloat(false, 1);
    sameAs(false, 0, 1);
    sameAs(false, 2, 1);
    sameAs(true, 0, 1);
    sameAs(true, 1, 1);
    break;
  case Op::SoftmaxGrad:
    expectFloat(false, 1);
    normalizeAxis(a.axis, operand(1).rank());
    sameAs(false, 0, 1);
    sameAs(true, 0, 1);
    break;
  case Op::AllReduce:
  case Op::AllGather:
  case Op::ReduceScatter:
  case Op::AllSlice:
    checkCollective();
    break;
  case Op::Shift:
    checkShift();
    break;
  case Op::MoeRoute:
  case Op::MoeAuxLoss:
  case Op::MoeZLoss:
  case Op::MoePermute:
  case Op::MoeUnpermute:
  case Op::MoeGroupedLinear:
  case Op::MoeRouteGrad:
  case Op::MoeAuxLossGrad:
  case Op::MoeZLossGrad:
  case Op::MoeProbsGrad:
  case Op::MoeGroupedLinearWeightGrad:
  case Op::MoeTokensPerExpert:
    checkMoe();
    break;
  case Op::MoeDispatchRows:
  case Op::MoeDispatchExperts:
  case Op::MoeCombineRows:
    checkExpertDispatch();
    break;
  case Op::AllToAll: {
    // Equal blocks along axis 0 to and from every rank of the group.
    const Attributes &a = inst_.attrs;
    int64_t group = gridGroupSize(reader_.grid_, a.gridAxes);
    if (a.axis != 0 || a.concatAxis != 0)
      fail(path_ + ".attrs.split_axis",
           std::to_string(a.axis) + " and concat_axis " +
               std::to_string(a.concatAxis),
           "0 and 0 (blocks of rows, the expert dispatch's layout)");
    expectMinRank(false, 0, 1);
    if (operand(0).shape[0] % group != 0)
      failShape(false, 0,
                "a first dimension divisible by the group size " +
                    std::to_string(group));
    sameAs(true, 0, 0);
    break;
  }
  case Op::Fp8Scale:
  case Op::Fp8CurrentScale:
  case Op::Fp8Quantize:
  case Op::Fp8Linear:
  case Op::Fp8LinearWeightGrad:
  case Op::Fp8Update:
    checkFp8();
    return; // their operands mix FP8 codes with f32 scales by design
  case Op::BiasAdd:
    expectFloat(false, 0);
    expectMinRank(false, 0, 1);
    expectShape(false, 1, {operand(0).shape.back()},
                "the input's last dimension");
    sameAs(true, 0, 0);
    break;
  case Op::VocabMax: {
    expectFloat(false, 0);
    expectMinRank(false, 0, 1);
    std::vector<int64_t> rows(operand(0).shape.begin(),
                              operand(0).shape.end() - 1);
    expectShape(true, 0, rows, "the logits' shape without the vocabulary");
    break;
  }
  case Op::VocabPartials: {
    checkLoss(0, 1);
    std::vector<int64_t> rows = operand(1).shape;
    expectShape(false, 2, rows, "the labels' shape (one maximum per row)");
    rows.push_back(2);
    expectShape(true, 0, rows, "[rows..., 2] (sum of exponentials, target)");
    break;
  }
  case Op::VocabCrossEntropy: {
    expectIndex(false, 1);
    std::vector<int64_t> rows = operand(1).shape;
    rows.push_back(2);
    expectShape(false, 0, rows, "[labels' shape..., 2] (the partials)");
    std::vector<int64_t> shape;
    if (a.reduction == Reduction::None)
      shape = operand(1).shape;
    expectShape(true, 0, shape,
                a.reduction == Reduction::None ? "the labels' shape"
                                               : "a scalar for mean and sum");
    break;
  }
  case Op::VocabCrossEntropyGrad: {
    checkLoss(1, 2);
    std::vector<int64_t> shape;
    if (a.reduction == Reduction::None)
      shape = operand(2).shape;
    expectShape(false, 0, shape,
                a.reduction == Reduction::None ? "the labels' shape"
                                               : "a scalar for mean and sum");
    std::vector<int64_t> rows = operand(2).shape;
    expectShape(false, 3, rows, "the labels' shape (one maximum per row)");
    rows.push_back(2);
    expectShape(false, 4, rows, "[rows..., 2] (the partials)");
    sameAs(true, 0, 1);
    break;
  }
  }
  (void)name;
  checkOneElementType();
}

/// The FP8 ops (docs/BundleFormat.md, "FP8"): codes in f8e4m3 or f8e5m2,
/// scales and amaxes f32 scalars, GEMM results bf16 or f32.
void OpChecker::checkFp8() {
  const Attributes &a = inst_.attrs;
  auto expectDType = [&](bool isResult, size_t i, bool ok,
                         const std::string &expected) {
    if (!ok)
      fail(where(isResult, i),
           std::string("dtype ") + dtypeName(type(isResult, i).dtype) +
               " (value " + std::to_string(valueIndex(isResult, i)) + ")",
           expected);
  };
  auto expectScalar = [&](bool isResult, size_t i, const std::string &what) {
    expectDType(isResult, i, type(isResult, i).dtype == DType::F32,
                "f32 (" + what + ")");
    expectShape(isResult, i, {}, what + ", a scalar");
  };
  auto expectCodes = [&](bool isResult, size_t i) {
    expectDType(isResult, i, isFp8(type(isResult, i).dtype),
                "f8e4m3 or f8e5m2 (FP8 codes)");
  };
  auto expectSource = [&](bool isResult, size_t i) {
    DType t = type(isResult, i).dtype;
    expectDType(isResult, i, t == DType::F32 || t == DType::BF16,
                "f32 or bf16 (what is cast to FP8)");
  };
  switch (inst_.op) {
  case Op::Fp8Scale:
    expectScalar(true, 0, "the meta's scale");
    break;
  case Op::Fp8Update:
    expectScalar(false, 0, "the amax");
    break;
  case Op::Fp8CurrentScale:
    expectSource(false, 0);
    expectScalar(true, 0, "the scale");
    break;
  case Op::Fp8Quantize:
    expectSource(false, 0);
    expectScalar(false, 1, "the scale");
    expectCodes(true, 0);
    expectShape(true, 0, operand(0).shape, "the input's shape");
    expectScalar(true, 1, "the amax");
    break;
  case Op::Fp8Linear: {
    expectCodes(false, 0);
    expectMinRank(false, 0, 1);
    expectScalar(false, 1, "the input's scale");
    expectCodes(false, 2);
    expectRank(false, 2, 2);
    expectScalar(false, 3, "the weight's scale");
    if (operand(0).dtype == DType::F8E5M2 && operand(2).dtype == DType::F8E5M2)
      fail(where(false, 2), "f8e5m2 (value " + std::to_string(valueIndex(false, 2)) + ")",
           "f8e4m3 when the input is f8e5m2 (the tensor cores take at most "
           "one E5M2 operand)");
    int64_t in = operand(0).shape.back();
    const auto &w = operand(2).shape;
    int64_t wIn = a.transposeWeight ? w[1] : w[0];
    int64_t out = a.transposeWeight ? w[0] : w[1];
    if (wIn != in)
      failShape(false, 2,
                std::string(a.transposeWeight ? "[out, " : "[") +
                    std::to_string(in) + (a.transposeWeight ? "]" : ", out]") +
                    " (the input's last dimension)");
    if (inst_.operands.size() == 5) {
      expectDType(false, 4, operand(4).dtype == DType::F32, "f32 (the bias)");
      expectShape(false, 4, {out}, "the weight's output size");
    }
    DType r = result(0).dtype;
    expectDType(true, 0, r == DType::BF16 || r == DType::F32, "bf16 or f32");
    std::vector<int64_t> shape = operand(0).shape;
    shape.back() = out;
    expectShape(true, 0, shape,
                "the input's leading dimensions and the output size");
    break;
  }
  case Op::Fp8LinearWeightGrad: {
    expectCodes(false, 0);
    expectMinRank(false, 0, 1);
    expectScalar(false, 1, "the input's scale");
    expectCodes(false, 2);
    expectScalar(false, 3, "the output gradient's scale");
    const auto &x = operand(0).shape;
    std::vector<int64_t> dy = x;
    dy.back() =
        operand(2).rank() == operand(0).rank() ? operand(2).shape.back() : -1;
    if (operand(2).shape != dy)
      failShape(false, 2, "the input's leading dimensions, then out");
    int64_t in = x.back(), out = dy.back();
    expectDType(true, 0, result(0).dtype == DType::F32, "f32 (a weight gradient)");
    expectShape(true, 0,
                a.transposeWeight ? std::vector<int64_t>{out, in}
                                  : std::vector<int64_t>{in, out},
                a.transposeWeight ? "[out, in] with transpose_weight"
                                  : "[in, out]");
    break;
  }
  default:
    break;
  }
}

/// Every operand and result of an op that is not ids is floating-point, and
/// all of them have one element type, except the loss of cross_entropy and
/// its incoming gradient (f32 whatever the logits' type), or mix f32 with
/// one 16-bit type (mixed precision, version 8: each kernel reads and
/// writes each value in its own type and computes in f32).
void OpChecker::checkOneElementType() {
  bool haveFirst = false;
  DType first = DType::F32;
  std::string firstWhere;
  auto isIds = [&](bool isResult, size_t i) {
    switch (inst_.op) {
    case Op::PositionIds:
      return isResult;
    case Op::Embedding:
    case Op::EmbeddingGrad:
    case Op::CrossEntropy:
      return !isResult && i == 1;
    case Op::CrossEntropyGrad:
    case Op::VocabCrossEntropyGrad:
    case Op::LinearCrossEntropy:
    case Op::LinearVocabPartials:
    case Op::LinearVocabCrossEntropyGrad:
      return !isResult && i == 2;
    case Op::VocabPartials:
    case Op::VocabCrossEntropy:
      return !isResult && i == 1;
    case Op::MoeRoute:
      return isResult && i == 1;
    case Op::MoePermute:
    case Op::MoeUnpermute:
      return !isResult && i == 1;
    case Op::MoeGroupedLinear:
    case Op::MoeRouteGrad:
    case Op::MoeProbsGrad:
    case Op::MoeGroupedLinearWeightGrad:
      return !isResult && i == 2;
    case Op::MoeTokensPerExpert:
      return !isResult && i == 0;
    case Op::MoeDispatchRows:
    case Op::MoeCombineRows:
      return !isResult && i == 1;
    case Op::MoeDispatchExperts:
      return true;
    case Op::AllToAll: // the routing of the expert dispatch
      return type(isResult, i).dtype == DType::I32;
    default:
      return false;
    }
  };
  // The vocabulary-parallel statistics and losses are f32 whatever the
  // logits' type, as cross_entropy's loss is.
  auto isF32Statistics = [&](bool isResult, size_t i) {
    switch (inst_.op) {
    case Op::VocabMax:
      return isResult;
    case Op::VocabPartials:
      return isResult || i == 2;
    case Op::VocabCrossEntropy:
      return isResult || i == 0;
    case Op::VocabCrossEntropyGrad:
      return !isResult && (i == 0 || i == 3 || i == 4);
    case Op::LinearCrossEntropy: // the loss
      return isResult && i == 0;
    case Op::LinearVocabMax:
      return isResult;
    case Op::LinearVocabPartials:
      return isResult || i == 3;
    case Op::LinearVocabCrossEntropyGrad: // max, partials, loss_grad
      return !isResult && i >= 3;
    case Op::Scale: // the factor (a seed)
      return !isResult && i == 1;
    case Op::AttentionBlock: // the logsumexp
      return isResult && i == 1;
    case Op::AttentionMerge:
      return i == 1 || (!isResult && i == 3);
    case Op::AttentionDelta:
      return isResult;
    case Op::AttentionBlockGrad: // the logsumexp and the delta
      return !isResult && (i == 4 || i == 5);
    case Op::MoeAuxLoss: // the losses, as cross_entropy's
    case Op::MoeZLoss:
      return isResult;
    case Op::MoeAuxLossGrad:
    case Op::MoeZLossGrad:
      return !isResult && i == 0;
    default:
      return false;
    }
  };
  auto visit = [&](bool isResult, size_t i) {
    if (isIds(isResult, i))
      return; // checked by expectIndex
    expectFloat(isResult, i);
    if (inst_.op == Op::CrossEntropy && isResult)
      return;
    if (inst_.op == Op::CrossEntropyGrad && !isResult && i == 0)
      return;
    if (isF32Statistics(isResult, i))
      return;
    DType dtype = type(isResult, i).dtype;
    if (!haveFirst) {
      haveFirst = true;
      first = dtype;
      firstWhere = isResult ? "results[" : "operands[";
      firstWhere += std::to_string(i) + "]";
    } else if (!mixablePrecisions(dtype, first)) {
      fail(where(isResult, i),
           std::string("dtype ") + dtypeName(dtype) + " (value " +
               std::to_string(valueIndex(isResult, i)) + ")",
           std::string(dtypeName(first)) + " like " + firstWhere +
               " (an op has one element type, or mixes f32 with bf16 or "
               "f16)");
    }
  };
  for (size_t i = 0; i < inst_.operands.size(); ++i)
    visit(false, i);
  for (size_t i = 0; i < inst_.results.size(); ++i)
    visit(true, i);
}

} // namespace mtrt::bundle_detail
