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
// Expert weights are whole on every rank here; their gradients are summed
// over the ranks' tokens (an all-reduce that mt-plan-gradient-reduction
// defers, as for every weight).
//
//===----------------------------------------------------------------------===//

#include "ShardingModelSupport.h"

#include "mt/IR/MtDialect.h"

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

  static Dim0 dim0Of(Operation *op, OpOperand *operand, OpResult result) {
    Value v = operand ? operand->get() : Value(result);
    if (!isa<RankedTensorType>(v.getType()) || rankOf(v) == 0)
      return Dim0::Whole;
    return operand ? operandDim0(op, operand->getOperandNumber())
                   : resultDim0(op, result.getResultNumber());
  }

  /// Loop 0 is the tokens; every other dimension of every operand and
  /// result has a loop of its own, never split.
  static int64_t loopCount(Operation *op) {
    int64_t loops = 1;
    for (OpOperand &operand : op->getOpOperands())
      loops += rankOf(operand.get()) -
               (dim0Of(op, &operand, {}) == Dim0::Whole ? 0 : 1);
    for (OpResult result : op->getResults())
      loops += rankOf(result) - (dim0Of(op, nullptr, result) == Dim0::Whole
                                     ? 0
                                     : 1);
    return loops;
  }

  SmallVector<IteratorType> getLoopIteratorTypes(Operation *op) const {
    SmallVector<IteratorType> types(loopCount(op), IteratorType::parallel);
    if (tokenLoop() != TokenLoop::Parallel &&
        tokenLoop() != TokenLoop::MeanLossGrad)
      types[0] = IteratorType::reduction;
    return types;
  }

  SmallVector<shard::ReductionKind>
  getReductionLoopIteratorKinds(Operation *op) const {
    if (tokenLoop() == TokenLoop::Parallel ||
        tokenLoop() == TokenLoop::MeanLossGrad)
      return {};
    return {shard::ReductionKind::Sum};
  }

  SmallVector<AffineMap> getIndexingMaps(Operation *op) const {
    MLIRContext *context = op->getContext();
    int64_t loops = loopCount(op), next = 1;
    SmallVector<AffineMap> maps;
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
    bool found = false;
    auto look = [&](Sharding sharding, Dim0 dim0) {
      if (!sharding)
        return;
      if (!grid)
        grid = sharding.getGridAttr();
      if (found || dim0 == Dim0::Whole)
        return;
      tokenAxes = axesOfDim(sharding, 0);
      found = true;
    };
    for (OpOperand &operand : op->getOpOperands())
      look(operandShardings[operand.getOperandNumber()],
           dim0Of(op, &operand, {}));
    for (OpResult result : op->getResults())
      look(resultShardings[result.getResultNumber()],
           dim0Of(op, nullptr, result));
    if (!grid)
      return shard::ShardingOption::makeEmpty();
    shard::ShardingArray array(loopCount(op));
    array[0].assign(tokenAxes.begin(), tokenAxes.end());
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
}
