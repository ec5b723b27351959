//===- MoeShardingModels.cpp - How the MoE ops are sharded ----------------===//
//
// The MoE ops (docs/MoE.md) over tokens split between data-parallel ranks:
// each rank routes, permutes and runs the experts on its own tokens, as
// Megatron-LM's MoE layer does on a data-parallel rank. The permuted rows
// `[T * K, h]` of a rank are its tokens' rows in expert order, so a split of
// the tokens over N ranks is a split of the rows into blocks of `T K / N`,
// and every op between permute and unpermute runs locally. The router's
// losses are Megatron-LM's per rank: each rank's loss over its tokens, the
// mean over the ranks (as the cross-entropy's mean of means), so that N
// data-parallel ranks train as one rank accumulating N micro-batches.
// Expert weights whole on every rank have their gradients summed over the
// ranks' tokens, and an expert bias its tokens per expert (an all-reduce
// that mt-plan-gradient-reduction defers, as for every weight). Under expert
// parallelism (mt-annotate-shardings {expert-parallel-size=N}) they are split
// by experts over the data axis, or over N < dp ranks over the grid's expert
// axis: the grouped linear layers then send each row to its expert's rank in
// its expert-parallel group and back with shard.all_to_all
// (partitionExpertParallel), and an expert's gradient sums its group's rows,
// all-reduced over the expert-data-parallel axis where the tokens split over it
// too. Under tensor parallelism the experts' in and out dimensions split as a
// dense MLP's (mt-annotate-shardings: gate and up by columns, down by rows,
// Megatron-LM's expert-tensor-parallel group = the tensor-parallel group): the
// grouped linear layers run on the rank's columns, the down projection's
// partial sums are all-reduced over the tensor axis. Tokens never split over
// the tensor axis: sequence parallelism's shards are gathered ahead of the
// router, which routes the whole sequence on every tensor-parallel rank.
//
//===----------------------------------------------------------------------===//

#include "ShardingModelSupport.h"

#include "mt/IR/MtDialect.h"

#include <type_traits>

using namespace mlir;
using namespace mlir::mt;
using namespace mlir::mt::sharding;

namespace {

/// What dimension 0 of an operand or result is.
enum class Dim0 {
  Tokens, // T: the tokens (routing, logits, tokens)
  Rows,   // T * K: the permuted rows, split with the tokens
  Whole,  // never split: expert weights, a scalar loss or its gradient
};

/// How the token loop ends: in the result (local op), summed into a
/// weight gradient (all-reduced), averaged into a loss (mean of the ranks'
/// losses), or the gradient of such a loss (scaled alike).
enum class TokenLoop { Parallel, Summed, MeanLoss, MeanLossGrad };

template <typename Op>
struct MoeTokenModel
    : public shard::ShardingInterface::ExternalModel<MoeTokenModel<Op>, Op> {
  static Dim0 operandDim0(Operation *op, unsigned i);
  static Dim0 resultDim0(Operation *op, unsigned i);
  static TokenLoop tokenLoop();
  /// The operand (or, as -1 - i, result i) whose dimension 0 is the
  /// experts of a grouped linear layer, which expert parallelism splits;
  /// 0 for ops without one (operand 0 is never the experts).
  static int expertValue() {
    if constexpr (std::is_same_v<Op, MoeGroupedLinearOp>)
      return 1;
    if constexpr (std::is_same_v<Op, MoeGroupedLinearWeightGradOp>)
      return -1;
    return 0;
  }
  static bool isExpertDim(OpOperand *operand, OpResult result) {
    int v = expertValue();
    return v != 0 && (operand ? int(operand->getOperandNumber()) == v
                              : -1 - int(result.getResultNumber()) == v);
  }

  static Dim0 dim0Of(Operation *op, OpOperand *operand, OpResult result) {
    Value v = operand ? operand->get() : Value(result);
    if (!isa<RankedTensorType>(v.getType()) || rankOf(v) == 0)
      return Dim0::Whole;
    return operand ? operandDim0(op, operand->getOperandNumber())
                   : resultDim0(op, result.getResultNumber());
  }

  /// Loop 0 is the tokens; every other dimension of every operand and
  /// result has a loop of its own, never split. A grouped linear layer (and
  /// its weight gradient) has five: tokens, experts, in, out and the
  /// routing's slots, so that its weight's in and out dimensions split as
  /// a tensor-parallel layer's (Megatron-LM's expert-tensor-parallel group).
  enum GroupedLoop : int64_t { kTokens, kExperts, kIn, kOut, kSlots };
  static bool transposed(Operation *op) {
    if (auto linear = dyn_cast<MoeGroupedLinearOp>(op))
      return linear.getTransposeWeight();
    if (auto grad = dyn_cast<MoeGroupedLinearWeightGradOp>(op))
      return grad.getTransposeWeight();
    return false;
  }
  /// The loops of a grouped op's operands and results, in order.
  static SmallVector<SmallVector<int64_t>> groupedLoops(Operation *op) {
    SmallVector<int64_t> weight =
        transposed(op) ? SmallVector<int64_t>{kExperts, kOut, kIn}
                       : SmallVector<int64_t>{kExperts, kIn, kOut};
    SmallVector<int64_t> indices = {kTokens, kSlots};
    if (isa<MoeGroupedLinearOp>(op))
      return {{kTokens, kIn}, weight, indices, {kTokens, kOut}};
    return {{kTokens, kIn}, {kTokens, kOut}, indices, weight};
  }
  /// The loop a grouped op sums over: in (the product), or the tokens (a
  /// weight gradient).
  static int64_t summedGroupedLoop() {
    return expertValue() > 0 ? kIn : kTokens;
  }
  static int64_t loopCount(Operation *op) {
    if (expertValue())
      return kSlots + 1;
    int64_t loops = 1;
    auto others = [&](Value v, Dim0 dim0) {
      int64_t rank = rankOf(v);
      return rank == 0 ? 0 : rank - (dim0 != Dim0::Whole ? 1 : 0);
    };
    for (OpOperand &operand : op->getOpOperands())
      loops += others(operand.get(), dim0Of(op, &operand, {}));
    for (OpResult result : op->getResults())
      loops += others(result, dim0Of(op, nullptr, result));
    return loops;
  }

  SmallVector<IteratorType> getLoopIteratorTypes(Operation *op) const {
    SmallVector<IteratorType> types(loopCount(op), IteratorType::parallel);
    if (expertValue()) {
      types[summedGroupedLoop()] = IteratorType::reduction;
      return types;
    }
    if (tokenLoop() != TokenLoop::Parallel &&
        tokenLoop() != TokenLoop::MeanLossGrad)
      types[0] = IteratorType::reduction;
    return types;
  }

  SmallVector<shard::ReductionKind>
  getReductionLoopIteratorKinds(Operation *op) const {
    if (expertValue())
      return {shard::ReductionKind::Sum};
    if (tokenLoop() == TokenLoop::Parallel ||
        tokenLoop() == TokenLoop::MeanLossGrad)
      return {};
    return {shard::ReductionKind::Sum};
  }

  SmallVector<AffineMap> getIndexingMaps(Operation *op) const {
    MLIRContext *context = op->getContext();
    int64_t loops = loopCount(op), next = 1;
    SmallVector<AffineMap> maps;
    if (expertValue()) {
      for (ArrayRef<int64_t> dims : groupedLoops(op)) {
        SmallVector<AffineExpr> exprs;
        for (int64_t loop : dims)
          exprs.push_back(getAffineDimExpr(loop, context));
        maps.push_back(AffineMap::get(loops, 0, exprs, context));
      }
      return maps;
    }
    auto mapOf = [&](Value v, Dim0 dim0) {
      SmallVector<AffineExpr> exprs;
      for (int64_t d = 0; d < rankOf(v); ++d)
        exprs.push_back(getAffineDimExpr(
            d == 0 && dim0 != Dim0::Whole ? 0 : next++, context));
      maps.push_back(AffineMap::get(loops, 0, exprs, context));
    };
    for (OpOperand &operand : op->getOpOperands())
      mapOf(operand.get(), dim0Of(op, &operand, {}));
    for (OpResult result : op->getResults())
      mapOf(result, dim0Of(op, nullptr, result));
    return maps;
  }

  /// The tokens split as the first token or row operand (or result) that is
  /// annotated splits its dimension 0; nothing else is split.
  FailureOr<shard::ShardingOption>
  getShardingOption(Operation *op, ArrayRef<Sharding> operandShardings,
                    ArrayRef<Sharding> resultShardings) const {
    FlatSymbolRefAttr grid;
    SmallVector<GridAxis> tokenAxes;
    // A grouped op's weight, per dimension: experts, and in and out.
    SmallVector<SmallVector<GridAxis>, 3> weightAxes(3);
    bool found = false;
    auto readWeight = [&](Sharding sharding) {
      for (int64_t d = 0; d < 3; ++d)
        weightAxes[d] = axesOfDim(sharding, d);
    };
    auto look = [&](Sharding sharding, Dim0 dim0, bool experts) {
      if (!sharding)
        return;
      if (!grid)
        grid = sharding.getGridAttr();
      if (experts)
        readWeight(sharding);
      if (found || dim0 == Dim0::Whole)
        return;
      tokenAxes = axesOfDim(sharding, 0);
      found = true;
    };
    for (OpOperand &operand : op->getOpOperands())
      look(operandShardings[operand.getOperandNumber()],
           dim0Of(op, &operand, {}), isExpertDim(&operand, {}));
    for (OpResult result : op->getResults())
      look(resultShardings[result.getResultNumber()],
           dim0Of(op, nullptr, result), isExpertDim(nullptr, result));
    // Propagation runs forward: a weight gradient's own split (the
    // gradient result's annotation, experts over the data axis under
    // expert parallelism) is read from the IR, so that the gradient is made
    // on the experts' ranks rather than summed whole and sliced.
    if (expertValue() < 0 && !resultShardings[0]) {
      FailureOr<std::pair<bool, Sharding>> annotated =
          shard::getSharding(op->getResult(0));
      if (succeeded(annotated) && annotated->second)
        readWeight(annotated->second);
    }
    if (!grid)
      return shard::ShardingOption::makeEmpty();
    // Tokens split over the data axis only: a sequence split over the
    // tensor axis (sequence parallelism) is gathered ahead of the router,
    // so that every tensor-parallel rank routes, and drops by capacity,
    // the whole sequence's tokens as one rank does, and the experts'
    // tensor-parallel shards see every token (Megatron-LM gathers the
    // tokens over the expert-tensor-parallel group too, after routing).
    // The tensor axis is the grid's last (mt-annotate-shardings); the
    // others split the data-parallel ranks (under expert parallelism over
    // part of them, the expert-data-parallel and expert-parallel axes).
    auto gridOp = SymbolTable::lookupNearestSymbolFrom<shard::GridOp>(op, grid);
    const GridAxis tensorAxis =
        gridOp ? static_cast<GridAxis>(gridOp.getRank() - 1) : GridAxis(-1);
    llvm::erase_if(tokenAxes, [&](GridAxis axis) {
      return axis == tensorAxis && axis != kDataGridAxis;
    });
    shard::ShardingArray array(loopCount(op));
    array[0].assign(tokenAxes.begin(), tokenAxes.end());
    if (expertValue()) {
      SmallVector<int64_t> weightLoops =
          groupedLoops(op)[expertValue() > 0 ? 1 : 3];
      for (auto [loop, axes] : llvm::zip_equal(weightLoops, weightAxes))
        array[loop].assign(axes.begin(), axes.end());
    }
    return shard::ShardingOption(array, grid);
  }

  LogicalResult partition(Operation *op, ArrayRef<Value> partitionedOperands,
                          ArrayRef<Sharding> operandShardings,
                          ArrayRef<Sharding> resultShardings,
                          IRMapping &partitionMap,
                          SymbolTableCollection &symbolTable,
                          OpBuilder &builder) const {
    LayerScope layer(builder, getLayer(op));
    // The token split, read from the first operand with tokens or rows.
    SmallVector<GridAxis> axes;
    Sharding tokenSharding;
    for (OpOperand &operand : op->getOpOperands())
      if (dim0Of(op, &operand, {}) != Dim0::Whole &&
          operandShardings[operand.getOperandNumber()]) {
        tokenSharding = operandShardings[operand.getOperandNumber()];
        axes = axesOfDim(tokenSharding, 0);
        break;
      }
    if (expertValue()) {
      Sharding weight = expertValue() > 0 ? operandShardings[expertValue()]
                                          : resultShardings[0];
      SmallVector<GridAxis> expertAxes =
          weight ? axesOfDim(weight, 0) : SmallVector<GridAxis>();
      if (!expertAxes.empty())
        return partitionExpertParallel(
            op, partitionedOperands, tokenSharding, axes, expertAxes,
            weight ? axesOfDim(weight, transposed(op) ? 2 : 1)
                   : SmallVector<GridAxis>(),
            partitionMap, symbolTable, builder);
      // The local product, its sum over split in dimensions (the
      // row-parallel down projection) or a weight gradient's over split
      // tokens.
      return partitionSummingReductions(op, partitionedOperands,
                                        operandShardings, resultShardings,
                                        partitionMap, symbolTable, builder);
    }
    if (tokenLoop() == TokenLoop::Summed)
      return partitionSummingReductions(op, partitionedOperands,
                                        operandShardings, resultShardings,
                                        partitionMap, symbolTable, builder);
    if (tokenLoop() == TokenLoop::Parallel || axes.empty()) {
      shard::partitionTriviallyShardableOperation(
          *op, partitionedOperands, operandShardings, resultShardings,
          partitionMap, symbolTable, builder);
      return success();
    }
    FailureOr<int64_t> ranks =
        ranksAlong(op, tokenSharding, axes, symbolTable);
    if (failed(ranks))
      return failure();
    Location loc = op->getLoc();
    if (tokenLoop() == TokenLoop::MeanLoss) {
      // Each rank's loss over its tokens; the mean over the ranks.
      shard::partitionTriviallyShardableOperation(
          *op, partitionedOperands, operandShardings, resultShardings,
          partitionMap, symbolTable, builder);
      Value local = partitionMap.lookup(op->getResult(0));
      Value sum = shard::AllReduceOp::create(builder, loc, local,
                                             tokenSharding.getGrid(), axes,
                                             shard::ReductionKind::Sum);
      Value scale = FillOp::create(builder, loc, local.getType(),
                                   builder.getF64FloatAttr(1.0 / *ranks));
      partitionMap.map(op->getResult(0),
                       MulOp::create(builder, loc, local.getType(), sum, scale));
      return success();
    }
    // The gradient of a mean over the ranks: each rank's loss weighs 1/N.
    Type type = partitionedOperands[0].getType();
    Value scale = FillOp::create(builder, loc, type,
                                 builder.getF64FloatAttr(1.0 / *ranks));
    Value lossGrad =
        MulOp::create(builder, loc, type, partitionedOperands[0], scale);
    shard::partitionTriviallyShardableOperation(
        *op, partitionedOperands, operandShardings, resultShardings,
        partitionMap, symbolTable, builder);
    partitionMap.lookup(op->getResult(0)).getDefiningOp()->setOperand(0,
                                                                       lossGrad);
    return success();
  }

  /// A grouped linear layer (or its weight gradient) whose experts are split
  /// over some of the axes that split the tokens: Megatron-LM's all-to-all
  /// token dispatcher within each expert-parallel group. Each rank's
  /// permuted rows go to their experts' ranks in one block per rank (their
  /// experts sent ahead), are sorted by expert there, meet the rank's
  /// experts, and the results return the same way. The weight gradient of
  /// a rank's experts sums its group's rows, so it needs no reduction over
  /// the expert axes; over the token axes that do not split the experts
  /// (the expert-data-parallel group) it is summed as a replicated weight's.
  static LogicalResult partitionExpertParallel(
      Operation *op, ArrayRef<Value> partitionedOperands, Sharding tokens,
      ArrayRef<GridAxis> tokenAxes, ArrayRef<GridAxis> expertAxes,
      ArrayRef<GridAxis> inAxes, IRMapping &partitionMap,
      SymbolTableCollection &symbolTable, OpBuilder &builder) {
    Location loc = op->getLoc();
    if (!tokens || !llvm::all_of(expertAxes, [&](GridAxis axis) {
          return llvm::is_contained(tokenAxes, axis);
        }))
      return op->emitOpError()
             << "splits the experts over grid axes [" << expertAxes
             << "] but the tokens over [" << tokenAxes
             << "]; expert parallelism dispatches each rank's tokens over "
                "the axes that split the experts, which must split the "
                "tokens too";
    SmallVector<GridAxis> replicaAxes =
        llvm::filter_to_vector(tokenAxes, [&](GridAxis axis) {
          return !llvm::is_contained(expertAxes, axis);
        });
    FailureOr<int64_t> ranks =
        ranksAlong(op, tokens, expertAxes, symbolTable);
    if (failed(ranks))
      return failure();
    auto global = cast<RankedTensorType>(
        expertValue() > 0 ? op->getOperand(expertValue()).getType()
                          : op->getResult(0).getType());
    int64_t experts = global.getDimSize(0);
    FlatSymbolRefAttr grid = tokens.getGridAttr();
    auto axesAttr = builder.getDenseI16ArrayAttr(expertAxes);
    IntegerAttr zero = builder.getIndexAttr(0);
    auto allToAll = [&](Value v) -> Value {
      return shard::AllToAllOp::create(builder, loc, v.getType(), grid,
                                       axesAttr, v, zero, zero);
    };
    Value indices = partitionedOperands[2];
    auto indicesType = cast<RankedTensorType>(indices.getType());
    int64_t slots = indicesType.getDimSize(0) * indicesType.getDimSize(1);
    int64_t received = *ranks * slots;
    auto expertsAttr = builder.getI64IntegerAttr(experts);
    auto ranksAttr = builder.getI64IntegerAttr(*ranks);
    // The destinations' experts first: the receivers' routing.
    Value sentExperts = MoeDispatchExpertsOp::create(
        builder, loc,
        RankedTensorType::get({received, 1}, indicesType.getElementType()),
        indices, expertsAttr, ranksAttr);
    Value routing = allToAll(sentExperts);
    auto dispatch = [&](Value rows) -> Value {
      auto type = cast<RankedTensorType>(rows.getType());
      auto blocks = RankedTensorType::get({received, type.getDimSize(1)},
                                          type.getElementType());
      Value sent = MoeDispatchRowsOp::create(builder, loc, blocks, rows,
                                             indices, expertsAttr, ranksAttr);
      // Sorted by the rank's experts, in (source rank, row) order.
      return MoePermuteOp::create(builder, loc, blocks, allToAll(sent),
                                  routing, Value());
    };
    auto widthOf = [&](Value v) {
      return cast<RankedTensorType>(v.getType()).getDimSize(1);
    };
    if (auto linear = dyn_cast<MoeGroupedLinearOp>(op)) {
      Value input = dispatch(partitionedOperands[0]);
      // The rank's shard of the out dimension (the expert-tensor-parallel
      // column split).
      auto weightType =
          cast<RankedTensorType>(partitionedOperands[1].getType());
      auto outType = RankedTensorType::get(
          {slots, weightType.getDimSize(linear.getTransposeWeight() ? 1 : 2)},
          weightType.getElementType());
      auto sortedOut = RankedTensorType::get(
          {received, outType.getDimSize(1)}, outType.getElementType());
      Value out = MoeGroupedLinearOp::create(
          builder, loc, sortedOut, input, partitionedOperands[1], routing,
          linear.getTransposeWeightAttr());
      Value back = MoeUnpermuteOp::create(builder, loc, sortedOut, out,
                                          routing, Value());
      Value rows =
          MoeCombineRowsOp::create(builder, loc, outType, allToAll(back),
                                   indices, expertsAttr, ranksAttr);
      // A split in dimension (the row-parallel down projection) leaves
      // partial sums, reduced over its axes.
      if (!inAxes.empty())
        rows = shard::AllReduceOp::create(builder, loc, rows, grid.getValue(),
                                          inAxes, shard::ReductionKind::Sum);
      partitionMap.map(op->getResult(0), rows);
      return success();
    }
    auto grad = cast<MoeGroupedLinearWeightGradOp>(op);
    int64_t in = widthOf(partitionedOperands[0]),
            out = widthOf(partitionedOperands[1]);
    SmallVector<int64_t> shape = {experts / *ranks, in, out};
    if (grad.getTransposeWeight())
      std::swap(shape[1], shape[2]);
    auto local = RankedTensorType::get(shape, global.getElementType());
    Value weightGrad = MoeGroupedLinearWeightGradOp::create(
        builder, loc, local, dispatch(partitionedOperands[0]),
        dispatch(partitionedOperands[1]), routing,
        grad.getTransposeWeightAttr());
    if (!replicaAxes.empty())
      weightGrad =
          shard::AllReduceOp::create(builder, loc, weightGrad, grid.getValue(),
                                     replicaAxes, shard::ReductionKind::Sum);
    partitionMap.map(op->getResult(0), weightGrad);
    return success();
  }
};

// Which operands hold tokens, rows or neither; results likewise.
#define MOE_MODEL(OP, LOOP, OPERANDS, RESULTS)                                 \
  template <>                                                                  \
  Dim0 MoeTokenModel<OP>::operandDim0(Operation *, unsigned i) {               \
    static constexpr Dim0 dims[] = OPERANDS;                                   \
    return i < std::size(dims) ? dims[i] : Dim0::Whole;                        \
  }                                                                            \
  template <>                                                                  \
  Dim0 MoeTokenModel<OP>::resultDim0(Operation *, unsigned i) {                \
    static constexpr Dim0 dims[] = RESULTS;                                    \
    return i < std::size(dims) ? dims[i] : Dim0::Whole;                        \
  }                                                                            \
  template <> TokenLoop MoeTokenModel<OP>::tokenLoop() { return LOOP; }

#define LIST(...) {__VA_ARGS__}
constexpr Dim0 T = Dim0::Tokens, R = Dim0::Rows, W = Dim0::Whole;

MOE_MODEL(MoeRouteOp, TokenLoop::Parallel, LIST(T), LIST(T, T))
MOE_MODEL(MoeAuxLossOp, TokenLoop::MeanLoss, LIST(T), LIST(W))
MOE_MODEL(MoeZLossOp, TokenLoop::MeanLoss, LIST(T), LIST(W))
MOE_MODEL(MoePermuteOp, TokenLoop::Parallel, LIST(T, T, T), LIST(R))
MOE_MODEL(MoeUnpermuteOp, TokenLoop::Parallel, LIST(R, T, T), LIST(T))
MOE_MODEL(MoeGroupedLinearOp, TokenLoop::Parallel, LIST(R, W, T), LIST(R))
MOE_MODEL(MoeRouteGradOp, TokenLoop::Parallel, LIST(T, T, T), LIST(T))
MOE_MODEL(MoeAuxLossGradOp, TokenLoop::MeanLossGrad, LIST(W, T), LIST(T))
MOE_MODEL(MoeZLossGradOp, TokenLoop::MeanLossGrad, LIST(W, T), LIST(T))
MOE_MODEL(MoeProbsGradOp, TokenLoop::Parallel, LIST(T, R, T), LIST(T))
MOE_MODEL(MoeGroupedLinearWeightGradOp, TokenLoop::Summed, LIST(R, R, T),
          LIST(W))
MOE_MODEL(MoeTokensPerExpertOp, TokenLoop::Summed, LIST(T), LIST(W))

#undef LIST
#undef MOE_MODEL

} // namespace

void sharding::attachMoeShardingModels(MLIRContext *context) {
  MoeRouteOp::attachInterface<MoeTokenModel<MoeRouteOp>>(*context);
  MoeAuxLossOp::attachInterface<MoeTokenModel<MoeAuxLossOp>>(*context);
  MoeZLossOp::attachInterface<MoeTokenModel<MoeZLossOp>>(*context);
  MoePermuteOp::attachInterface<MoeTokenModel<MoePermuteOp>>(*context);
  MoeUnpermuteOp::attachInterface<MoeTokenModel<MoeUnpermuteOp>>(*context);
  MoeGroupedLinearOp::attachInterface<MoeTokenModel<MoeGroupedLinearOp>>(
      *context);
  MoeRouteGradOp::attachInterface<MoeTokenModel<MoeRouteGradOp>>(*context);
  MoeAuxLossGradOp::attachInterface<MoeTokenModel<MoeAuxLossGradOp>>(*context);
  MoeZLossGradOp::attachInterface<MoeTokenModel<MoeZLossGradOp>>(*context);
  MoeProbsGradOp::attachInterface<MoeTokenModel<MoeProbsGradOp>>(*context);
  MoeGroupedLinearWeightGradOp::attachInterface<
      MoeTokenModel<MoeGroupedLinearWeightGradOp>>(*context);
  MoeTokensPerExpertOp::attachInterface<MoeTokenModel<MoeTokensPerExpertOp>>(
      *context);
}
