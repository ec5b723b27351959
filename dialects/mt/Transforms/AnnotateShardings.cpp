//===- AnnotateShardings.cpp - Megatron-LM's layout as shard annotations --===//

#include "mt/IR/MtOps.h"
#include "mt/Transforms/Passes.h"

#include "mlir/Dialect/Func/IR/FuncOps.h"
#include "mlir/Dialect/Shard/IR/ShardOps.h"
#include "mlir/IR/Builders.h"

namespace mlir::mt {
#define GEN_PASS_DEF_ANNOTATESHARDINGSPASS
#include "mt/Transforms/Passes.h.inc"
} // namespace mlir::mt

using namespace mlir;
using namespace mlir::mt;

namespace {

/// The grid axes of Megatron-LM's layout: data x tensor, under context
/// parallelism data x context x tensor (Megatron-LM's order tp-cp-dp, the
/// tensor axis fastest), and under expert parallelism over part of the
/// data-parallel ranks expert-data x expert x tensor (tp-ep-dp; the grid
/// marks its expert axis, kExpertAxisAttrName). The data axis is always
/// first, the tensor axis last.
constexpr int16_t kDataAxis = 0;

/// A parameter's role in tensor parallelism, from its Hugging Face name.
/// Vocabulary tables (the embedding and the output layer) are split by rows:
/// Megatron-LM's vocabulary-parallel embedding and output layer.
enum class Role { Replicated, Column, Row, Vocabulary };

Role roleOf(StringRef name) {
  if (name == "transformer.wte.weight" || name == "model.embed_tokens.weight" ||
      name == "lm_head.weight")
    return Role::Vocabulary;
  bool weight = name.ends_with(".weight"), bias = name.ends_with(".bias");
  StringRef module = name.drop_back(weight ? 7 : bias ? 5 : 0);
  // MoE: the shared expert is an MLP of its own; the routed experts
  // ([E, ...]) split their in or out dimension alike (Megatron-LM's
  // expert-tensor-parallel group, the tensor-parallel group).
  for (StringRef column :
       {"self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj",
        "mlp.gate_proj", "mlp.up_proj", "mlp.c_fc", "attn.c_attn",
        "shared_expert.gate_proj", "shared_expert.up_proj",
        "shared_expert.c_fc", "experts.gate_proj", "experts.up_proj",
        "experts.c_fc"})
    if (module.ends_with(column))
      return Role::Column;
  for (StringRef row :
       {"self_attn.o_proj", "mlp.down_proj", "attn.c_proj", "mlp.c_proj",
        "shared_expert.down_proj", "shared_expert.c_proj", "experts.down_proj",
        "experts.c_proj"})
    if (module.ends_with(row))
      // A row-parallel layer's bias is added after the reduction, whole.
      return weight ? Role::Row : Role::Replicated;
  return Role::Replicated;
}

struct AnnotateShardingsPass
    : public mt::impl::AnnotateShardingsPassBase<AnnotateShardingsPass> {
  using Base::Base;

  void runOnOperation() override;
  /// The split axes of a tensor of `type` in `role`, or failure with a
  /// diagnostic for a layout this pass cannot split.
  FailureOr<SmallVector<SmallVector<int16_t>>>
  splitAxes(Location loc, StringRef name, RankedTensorType type, Role role);
  Value annotate(OpBuilder &builder, Value value,
                 ArrayRef<SmallVector<int16_t>> axes, bool forUsers);
  /// Records on the parameter's declaration how it is split, for the bundle
  /// (partitioning leaves only local shapes in the functions).
  void recordSplit(FlatSymbolRefAttr parameter,
                   ArrayRef<SmallVector<int16_t>> axes);

  /// Sequence parallelism: the residual stream ([batch, sequence, hidden]
  /// values that norms read, and the operands of the residual adds that make
  /// them, through dropout) split along the sequence over the tensor axis.
  void annotateSequenceShards(OpBuilder &builder, func::FuncOp function);
  /// The split of a [batch, sequence, hidden] residual-stream value under
  /// sequence parallelism: batch over data, sequence over context and
  /// tensor.
  SmallVector<SmallVector<int16_t>> sequenceShardAxes();
  /// Context parallelism: the sequence of a token batch or a stage's
  /// activation split over the context axis, or failure with a diagnostic
  /// for a sequence that does not cut into the load-balanced chunks.
  LogicalResult splitSequence(Location loc, RankedTensorType type,
                              SmallVector<SmallVector<int16_t>> &axes);

  FlatSymbolRefAttr grid;
  int16_t tensorAxis = 1;
  /// -1 without context parallelism.
  int16_t contextAxis = -1;
  /// The axis the routed experts split over: the data axis when every
  /// data-parallel rank is an expert-parallel rank, else the expert axis of
  /// the grid edp x ep x tp (-1 without expert parallelism).
  int16_t expertAxis = -1;

  /// Splits dimension `dim` of `axes` over the data-parallel ranks: the
  /// data axis, and the expert axis too where it divides them.
  void splitOverData(SmallVector<SmallVector<int16_t>> &axes, size_t dim) {
    axes[dim].push_back(kDataAxis);
    if (expertAxis > kDataAxis)
      axes[dim].push_back(expertAxis);
  }
};

} // namespace

FailureOr<SmallVector<SmallVector<int16_t>>>
AnnotateShardingsPass::splitAxes(Location loc, StringRef name,
                                 RankedTensorType type, Role role) {
  SmallVector<SmallVector<int16_t>> axes(type.getRank());
  if (role == Role::Replicated || tensorParallelSize == 1)
    return axes;
  // GPT-2 stores Conv1D weights in x out; Llama stores out x in. GPT-2's
  // fused c_attn is stored per query group (q heads, k, v), so its column
  // split gives each rank whole groups.
  bool inByOut = name.starts_with("transformer.");
  if (role == Role::Vocabulary) {
    int64_t rows = type.getRank() ? type.getDimSize(0) : 0;
    if (type.getRank() != 2 || rows % tensorParallelSize != 0) {
      emitError(loc) << "mt-annotate-shardings: the vocabulary of " << name
                     << " (" << rows << " rows) is not divisible by "
                     << "tensor-parallel-size "
                     << static_cast<int64_t>(tensorParallelSize)
                     << ": each rank holds an equal block of the vocabulary; "
                        "pad it as Megatron-LM does (megatron-compile "
                        "--make-vocab-size-divisible-by, which pads to a "
                        "multiple of it times the tensor-parallel size)";
      return failure();
    }
    axes[0].push_back(tensorAxis);
    return axes;
  }
  int64_t dim = 0;
  if (type.getRank() >= 2) {
    bool outputDim = role == Role::Column;
    // The output dimension is 1 in in x out, 0 in out x in; routed experts
    // ([E, out, in] or GPT-2's [E, in, out]) one further.
    dim = (outputDim == inByOut) ? 1 : 0;
    dim += type.getRank() == 3;
  }
  if (type.getDimSize(dim) % tensorParallelSize != 0) {
    emitError(loc) << "mt-annotate-shardings: dimension " << dim << " of "
                   << name << " (" << type.getDimSize(dim)
                   << ") is not divisible by tensor-parallel-size "
                   << static_cast<int64_t>(tensorParallelSize);
    return failure();
  }
  axes[dim].push_back(tensorAxis);
  return axes;
}

/// Expert parallelism: a routed expert tensor [E, ...] is split by experts
/// over the data axis (the expert-parallel ranks are the data-parallel
/// ones, Megatron-LM's layout with an expert-data-parallel group of one).
static bool isRoutedExperts(StringRef name, RankedTensorType type) {
  return name.contains(".mlp.experts.") && type.getRank() == 3;
}

LogicalResult
AnnotateShardingsPass::splitSequence(Location loc, RankedTensorType type,
                                     SmallVector<SmallVector<int16_t>> &axes) {
  if (contextAxis < 0 || type.getRank() < 2)
    return success();
  // Causal load balancing cuts the sequence into 2 cp chunks (the runtime
  // gives context rank i chunks i and 2 cp - 1 - i); under sequence
  // parallelism each rank's two chunks split again over the tensor ranks.
  int64_t sequence = type.getDimSize(1);
  int64_t chunks = 2 * contextParallelSize;
  int64_t multiple =
      chunks * (sequenceParallel && tensorParallelSize > 1 ? tensorParallelSize
                                                           : 1);
  if (sequence % multiple != 0) {
    emitError(loc) << "mt-annotate-shardings: the sequence length " << sequence
                   << " is not divisible by " << multiple << " ("
                   << chunks << " load-balanced chunks of context-parallel-size "
                   << static_cast<int64_t>(contextParallelSize)
                   << (multiple != chunks ? ", each split over the tensor "
                                            "ranks under sequence parallelism"
                                          : "")
                   << "); use a sequence length that is a multiple of "
                   << multiple;
    return failure();
  }
  axes[1].push_back(contextAxis);
  return success();
}

void AnnotateShardingsPass::recordSplit(FlatSymbolRefAttr parameter,
                                        ArrayRef<SmallVector<int16_t>> axes) {
  auto declaration = getOperation().lookupSymbol<ParameterOp>(parameter);
  if (!declaration)
    return;
  SmallVector<Attribute> dims;
  for (ArrayRef<int16_t> dimAxes : axes)
    dims.push_back(DenseI16ArrayAttr::get(&getContext(), dimAxes));
  declaration->setAttr("mt.split_axes", ArrayAttr::get(&getContext(), dims));
}

Value AnnotateShardingsPass::annotate(OpBuilder &builder, Value value,
                                      ArrayRef<SmallVector<int16_t>> axes,
                                      bool forUsers) {
  SmallVector<shard::GridAxesAttr> split;
  for (ArrayRef<int16_t> dimAxes : axes)
    split.push_back(shard::GridAxesAttr::get(&getContext(), dimAxes));
  if (split.empty())
    split.push_back(shard::GridAxesAttr::get(&getContext(), {}));
  Value sharding = shard::ShardingOp::create(
      builder, value.getLoc(), shard::Sharding::get(grid, split));
  return shard::ShardOp::create(builder, value.getLoc(), value, sharding,
                                forUsers);
}

void AnnotateShardingsPass::annotateSequenceShards(OpBuilder &builder,
                                                   func::FuncOp function) {
  SmallVector<Value> residual;
  function.walk([&](Operation *op) {
    if (isa<LayerNormOp, RmsNormOp>(op))
      residual.push_back(op->getOperand(0));
  });
  // The embeddings start the residual stream: the vocabulary-parallel
  // lookup's partial rows are reduce-scattered along the sequence, and a
  // learned position embedding looks up the positions of the rank's
  // sequence tile (position_ids, split below), so the sum of the two and
  // the embedding dropout run on sequence shards.
  function.walk([&](EmbeddingOp embedding) {
    residual.push_back(embedding.getResult());
  });
  // The residual adds' block outputs (a row-parallel layer, whose sum is
  // then reduce-scattered), also through dropout. Other operands (the
  // embeddings) are sliced where the add reads them.
  for (size_t i = 0, e = residual.size(); i < e; ++i)
    if (auto add = residual[i].getDefiningOp<AddOp>())
      for (Value operand : add->getOperands()) {
        if (auto dropout = operand.getDefiningOp<DropoutOp>()) {
          if (dropout.getInput().getDefiningOp<LinearOp>()) {
            residual.push_back(operand);
            residual.push_back(dropout.getInput());
          }
        } else if (operand.getDefiningOp<LinearOp>()) {
          residual.push_back(operand);
        }
      }
  llvm::DenseSet<Value> done;
  for (Value value : residual) {
    auto type = dyn_cast<RankedTensorType>(value.getType());
    if (!type || type.getRank() != 3 || !done.insert(value).second ||
        isa<BlockArgument>(value))
      continue;
    builder.setInsertionPointAfterValue(value);
    Value annotated =
        annotate(builder, value, sequenceShardAxes(), /*forUsers=*/false);
    value.replaceAllUsesExcept(annotated, annotated.getDefiningOp());
  }
  // The norms' backward reads the residual stream's gradient on the same
  // sequence shards. Forward propagation finds them alone without context
  // parallelism; with it, the gradient (the row-parallel layers' data
  // gradients, partial sums over the tensor axis) would stay split over
  // the context axis only: all-reduced rather than reduce-scattered, the
  // norm's backward run on the whole tensor-parallel sequence, and its
  // forward input all-gathered for it. (Annotating without context
  // parallelism too would reduce-scatter each partial sum before their
  // add, one reduce-scatter more per block.)
  if (contextAxis < 0)
    return;
  function.walk([&](Operation *op) {
    if (!isa<LayerNormGradOp, RmsNormGradOp>(op))
      return;
    Value gradient = op->getOperand(0);
    auto type = dyn_cast<RankedTensorType>(gradient.getType());
    if (!type || type.getRank() != 3)
      return;
    builder.setInsertionPoint(op);
    op->setOperand(0, annotate(builder, gradient, sequenceShardAxes(),
                               /*forUsers=*/true));
  });
}

SmallVector<SmallVector<int16_t>>
AnnotateShardingsPass::sequenceShardAxes() {
  SmallVector<SmallVector<int16_t>> axes(3);
  if (dataParallelSize > 1)
    splitOverData(axes, 0);
  if (contextAxis >= 0)
    axes[1].push_back(contextAxis);
  axes[1].push_back(tensorAxis);
  return axes;
}

void AnnotateShardingsPass::runOnOperation() {
  ModuleOp module = getOperation();
  if (tensorParallelSize < 1 || dataParallelSize < 1 ||
      contextParallelSize < 1) {
    module.emitError() << "mt-annotate-shardings: tensor-parallel-size ("
                       << static_cast<int64_t>(tensorParallelSize)
                       << "), data-parallel-size ("
                       << static_cast<int64_t>(dataParallelSize)
                       << ") and context-parallel-size ("
                       << static_cast<int64_t>(contextParallelSize)
                       << ") must be positive";
    return signalPassFailure();
  }
  if (expertParallelSize > 1 &&
      (dataParallelSize % expertParallelSize != 0 || contextParallelSize > 1)) {
    module.emitError() << "mt-annotate-shardings: expert-parallel-size "
                       << static_cast<int64_t>(expertParallelSize)
                       << " must divide data-parallel-size "
                       << static_cast<int64_t>(dataParallelSize)
                       << ", without context parallelism (issue 25)";
    return signalPassFailure();
  }
  if (cpCommType != "p2p" && cpCommType != "all_gather") {
    module.emitError() << "mt-annotate-shardings: cp-comm-type '"
                       << cpCommType
                       << "' is not an exchange of keys and values here; use "
                          "p2p (the ring) or all_gather";
    return signalPassFailure();
  }
  OpBuilder builder(module.getBodyRegion());
  SmallVector<int64_t> gridShape{dataParallelSize, tensorParallelSize};
  if (contextParallelSize > 1) {
    contextAxis = 1;
    tensorAxis = 2;
    gridShape = {dataParallelSize, contextParallelSize, tensorParallelSize};
  }
  if (expertParallelSize > 1)
    expertAxis = kDataAxis;
  // Expert parallelism over part of the data-parallel ranks: Megatron-LM's
  // expert-data-parallel ranks outside, the expert-parallel ones inside
  // (its rank order tp-ep-dp), the tokens split over both.
  if (expertParallelSize > 1 && expertParallelSize < dataParallelSize) {
    expertAxis = 1;
    tensorAxis = 2;
    gridShape = {dataParallelSize / expertParallelSize, expertParallelSize,
                 tensorParallelSize};
  }
  auto gridOp =
      shard::GridOp::create(builder, module.getLoc(), "grid", gridShape);
  grid = FlatSymbolRefAttr::get(gridOp.getSymNameAttr());
  if (expertAxis > kDataAxis)
    gridOp->setAttr(kExpertAxisAttrName, builder.getI64IntegerAttr(expertAxis));

  const bool sequenceShards = sequenceParallel && tensorParallelSize > 1;
  for (auto function : module.getOps<func::FuncOp>()) {
    if (function.isExternal())
      continue;
    // Under sequence parallelism pipeline stages exchange the residual
    // stream as each rank holds it, [b, s/t, h] (Megatron-LM's send of the
    // sequence-parallel shard): the input activation and the output's
    // gradient, the output activation and the input's gradient, a stage's
    // only rank-3 arguments and results that are not parameters (but for
    // the last stage's logits, named kLogitsResultName).
    const bool stage = function->hasAttr("mt.pipeline_stage");
    auto splitActivation = [&](RankedTensorType type,
                               SmallVector<SmallVector<int16_t>> &axes) {
      if (!sequenceShards || !stage || type.getRank() != 3)
        return false;
      axes[1].push_back(tensorAxis);
      return true;
    };
    Block &body = function.getBody().front();
    builder.setInsertionPointToStart(&body);
    for (BlockArgument argument : body.getArguments()) {
      auto type = dyn_cast<RankedTensorType>(argument.getType());
      if (!type)
        continue;
      SmallVector<SmallVector<int16_t>> axes(type.getRank());
      bool sequenceShard = false;
      if (auto parameter = function.getArgAttrOfType<FlatSymbolRefAttr>(
              argument.getArgNumber(), "mt.parameter")) {
        FailureOr<SmallVector<SmallVector<int16_t>>> parameterAxes =
            splitAxes(argument.getLoc(), parameter.getValue(), type,
                      roleOf(parameter.getValue()));
        if (failed(parameterAxes))
          return signalPassFailure();
        axes = *parameterAxes;
        if (expertParallelSize > 1 &&
            isRoutedExperts(parameter.getValue(), type)) {
          if (type.getDimSize(0) % expertParallelSize != 0) {
            emitError(argument.getLoc())
                << "mt-annotate-shardings: the " << type.getDimSize(0)
                << " experts of " << parameter.getValue()
                << " are not divisible by expert-parallel-size "
                << static_cast<int64_t>(expertParallelSize);
            return signalPassFailure();
          }
          axes[0].push_back(expertAxis);
        }
        recordSplit(parameter, axes);
      } else {
        // Token and label batches: whole sequences on each data-parallel
        // rank, under context parallelism split along the sequence (as is
        // a pipeline stage's activation).
        if (type.getRank() >= 1 && dataParallelSize > 1)
          splitOverData(axes, 0);
        if (failed(splitSequence(argument.getLoc(), type, axes)))
          return signalPassFailure();
        sequenceShard = splitActivation(type, axes);
      }
      Value annotated = annotate(builder, argument, axes, /*forUsers=*/true);
      Operation *annotation = annotated.getDefiningOp();
      // A sequence shard is what the argument holds, not what its users
      // must read: a user that needs the whole sequence (the row-parallel
      // layer's input gradient) gets it gathered.
      if (sequenceShard)
        annotated = annotate(builder, annotated, axes, /*forUsers=*/false);
      argument.replaceAllUsesExcept(annotated, annotation);
    }

    if (sequenceShards)
      annotateSequenceShards(builder, function);
    // The attention's, rope's and dropout's partitions need to know which
    // sequence split is the load-balanced one (docs/Parallelism.md, "Context
    // parallelism").
    if (contextAxis >= 0)
      function.walk([&](Operation *op) {
        if (isa<AttentionOp, AttentionGradOp>(op)) {
          op->setAttr(kContextAxisAttrName,
                      builder.getI64IntegerAttr(contextAxis));
          op->setAttr(kContextExchangeAttrName,
                      builder.getStringAttr(cpCommType));
        }
        if (isa<RopeOp, DropoutOp>(op))
          op->setAttr(kContextAxisAttrName,
                      builder.getI64IntegerAttr(contextAxis));
      });
    // Learned position embeddings read positions made inside the step: they
    // follow the tokens' batch split, and under sequence parallelism the
    // residual stream's sequence split (each rank makes the positions of
    // its tile), so the position table's gradient sums local rows.
    if (dataParallelSize > 1 || sequenceShards || contextAxis >= 0)
      function.walk([&](PositionIdsOp positions) {
        builder.setInsertionPointAfter(positions);
        SmallVector<SmallVector<int16_t>> axes(positions.getType().getRank());
        if (dataParallelSize > 1)
          splitOverData(axes, 0);
        if (contextAxis >= 0 && axes.size() == 2) {
          axes[1].push_back(contextAxis);
          // The rank's positions are those of its load-balanced chunks.
          positions->setAttr(kContextAxisAttrName,
                             builder.getI64IntegerAttr(contextAxis));
        }
        if (sequenceShards && axes.size() == 2)
          axes[1].push_back(tensorAxis);
        Value annotated =
            annotate(builder, positions, axes, /*forUsers=*/false);
        positions.getResult().replaceAllUsesExcept(annotated,
                                                   annotated.getDefiningOp());
      });

    auto ret = cast<func::ReturnOp>(body.getTerminator());
    builder.setInsertionPoint(ret);
    for (OpOperand &operand : ret->getOpOperands()) {
      auto type = dyn_cast<RankedTensorType>(operand.get().getType());
      if (!type)
        continue;
      SmallVector<SmallVector<int16_t>> axes(type.getRank());
      if (auto parameter = function.getResultAttrOfType<FlatSymbolRefAttr>(
              operand.getOperandNumber(), "mt.gradient")) {
        FailureOr<SmallVector<SmallVector<int16_t>>> parameterAxes =
            splitAxes(ret.getLoc(), parameter.getValue(), type,
                      roleOf(parameter.getValue()));
        if (failed(parameterAxes))
          return signalPassFailure();
        axes = *parameterAxes;
        if (expertParallelSize > 1 &&
            isRoutedExperts(parameter.getValue(), type))
          axes[0].push_back(expertAxis);
      } else {
        // Per-token results (predict_step's logits) stay with their data
        // rank's part of the batch, and their context rank's chunks.
        if (type.getRank() >= 1 && dataParallelSize > 1)
          splitOverData(axes, 0);
        if (failed(splitSequence(ret.getLoc(), type, axes)))
          return signalPassFailure();
        auto name = function.getResultAttrOfType<StringAttr>(
            operand.getOperandNumber(), "mt.name");
        if (!name || name.getValue() != kLogitsResultName)
          splitActivation(type, axes);
      }
      // A result that other ops read too (train_step's aux_loss, a layer's
      // only auxiliary loss, which the loss adds) is annotated where it is
      // made: propagation annotates its other users from the annotation,
      // which must dominate them.
      Value value = operand.get();
      OpBuilder::InsertionGuard guard(builder);
      if (llvm::any_of(value.getUsers(),
                       [&](Operation *user) { return user != ret; }))
        builder.setInsertionPointAfterValue(value);
      operand.set(annotate(builder, value, axes, /*forUsers=*/false));
    }
  }
}
