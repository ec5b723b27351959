//===- ShardingInterfaceImpl.cpp - How mt ops are sharded -----------------===//
//
// Each op describes its iteration space to upstream shard with loop iterator
// types and indexing maps, as linalg's named ops do; sharding-propagation
// derives the shardings from them and shard-partition calls `partition`.
//
//===----------------------------------------------------------------------===//

#include "mt/Transforms/ShardingInterfaceImpl.h"

#include "mt/IR/MtOps.h"
#include "mt/IR/MtShapeRules.h"

#include "mlir/Dialect/Shard/IR/ShardOps.h"
#include "mlir/Dialect/Shard/Interfaces/ShardingInterface.h"
#include "mlir/Dialect/Shard/Interfaces/ShardingInterfaceImpl.h"
#include "mlir/Dialect/Utils/StructuredOpsUtils.h"
#include "mlir/IR/AffineMap.h"
#include "mlir/IR/DialectRegistry.h"
#include "mlir/IR/IRMapping.h"

using namespace mlir;
using namespace mlir::mt;
using shard::GridAxis;
using shard::Sharding;
using utils::IteratorType;

namespace {

int64_t rankOf(Value value) {
  return cast<RankedTensorType>(value.getType()).getRank();
}

/// Ops whose every operand and result has the same shape and whose loops are
/// all parallel.
template <typename Op>
struct ElementwiseModel
    : public shard::ElementwiseShardingInterface<Op> {};

/// linear: loops (rows..., n, k) with k the contraction.
struct LinearModel
    : public shard::ShardingInterface::ExternalModel<LinearModel, LinearOp> {
  SmallVector<IteratorType> getLoopIteratorTypes(Operation *op) const {
    SmallVector<IteratorType> types(rankOf(op->getOperand(0)) + 1,
                                    IteratorType::parallel);
    types.back() = IteratorType::reduction;
    return types;
  }

  SmallVector<shard::ReductionKind>
  getReductionLoopIteratorKinds(Operation *op) const {
    return {shard::ReductionKind::Sum};
  }

  SmallVector<AffineMap> getIndexingMaps(Operation *op) const {
    auto linear = cast<LinearOp>(op);
    MLIRContext *context = op->getContext();
    int64_t rows = rankOf(linear.getInput()) - 1;
    int64_t loops = rows + 2;
    AffineExpr n = getAffineDimExpr(rows, context);
    AffineExpr k = getAffineDimExpr(rows + 1, context);
    SmallVector<AffineExpr> input, output;
    for (int64_t dim = 0; dim < rows; ++dim) {
      input.push_back(getAffineDimExpr(dim, context));
      output.push_back(getAffineDimExpr(dim, context));
    }
    input.push_back(k);
    output.push_back(n);
    SmallVector<AffineMap> maps = {
        AffineMap::get(loops, 0, input, context),
        AffineMap::get(loops, 0,
                       linear.getTransposeWeight() ? ArrayRef{n, k}
                                                   : ArrayRef{k, n},
                       context)};
    if (linear.getBias())
      maps.push_back(AffineMap::get(loops, 0, {n}, context));
    maps.push_back(AffineMap::get(loops, 0, output, context));
    return maps;
  }

  /// A sharded contraction (Megatron-LM's row-parallel layer) multiplies the
  /// local shards, sums them over the contraction's grid axes, and only then
  /// adds the bias, once.
  LogicalResult partition(Operation *op, ArrayRef<Value> partitionedOperands,
                          ArrayRef<Sharding> operandShardings,
                          ArrayRef<Sharding> resultShardings,
                          IRMapping &partitionMap,
                          SymbolTableCollection &symbolTable,
                          OpBuilder &builder) const {
    SmallVector<IteratorType> iterators = getLoopIteratorTypes(op);
    shard::ShardingArray assignment =
        shard::getGridAxisAssignmentForLoopIterators(
            operandShardings, resultShardings, iterators,
            getIndexingMaps(op));
    SmallVector<GridAxis> reductionAxes =
        shard::getReductionGridAxes(iterators, assignment);
    if (reductionAxes.empty()) {
      shard::partitionTriviallyShardableOperation(
          *op, partitionedOperands, operandShardings, resultShardings,
          partitionMap, symbolTable, builder);
      return success();
    }
    auto linear = cast<LinearOp>(op);
    Value input = partitionedOperands[0], weight = partitionedOperands[1];
    FailureOr<RankedTensorType> type = inferLinearType(
        cast<RankedTensorType>(input.getType()),
        cast<RankedTensorType>(weight.getType()), RankedTensorType(),
        linear.getTransposeWeight(), [&] { return op->emitOpError(); });
    if (failed(type))
      return failure();
    Value partial =
        LinearOp::create(builder, op->getLoc(), *type, input, weight, Value(),
                         linear.getTransposeWeightAttr());
    Value result = shard::AllReduceOp::create(
        builder, op->getLoc(), partial, operandShardings[1].getGrid(),
        reductionAxes, shard::ReductionKind::Sum);
    if (linear.getBias())
      result = BiasAddOp::create(builder, op->getLoc(), *type, result,
                                 partitionedOperands[2]);
    partitionMap.map(op->getResult(0), result);
    return success();
  }
};

/// Norms and bias_add: loops over the input's dimensions; the last one is
/// normalized (a reduction for the norms), the weight and bias are indexed by
/// it.
template <typename Op>
struct LastDimModel
    : public shard::ShardingInterface::ExternalModel<LastDimModel<Op>, Op> {
  SmallVector<IteratorType> getLoopIteratorTypes(Operation *op) const {
    SmallVector<IteratorType> types(rankOf(op->getOperand(0)),
                                    IteratorType::parallel);
    if (!isa<BiasAddOp>(op))
      types.back() = IteratorType::reduction;
    return types;
  }

  SmallVector<shard::ReductionKind>
  getReductionLoopIteratorKinds(Operation *op) const {
    if (isa<BiasAddOp>(op))
      return {};
    return {shard::ReductionKind::Generic};
  }

  SmallVector<AffineMap> getIndexingMaps(Operation *op) const {
    int64_t rank = rankOf(op->getOperand(0));
    MLIRContext *context = op->getContext();
    AffineMap identity = AffineMap::getMultiDimIdentityMap(rank, context);
    AffineMap last =
        AffineMap::get(rank, 0, {getAffineDimExpr(rank - 1, context)}, context);
    SmallVector<AffineMap> maps = {identity};
    maps.append(op->getNumOperands() - 1, last);
    maps.push_back(identity);
    return maps;
  }

  LogicalResult partition(Operation *op, ArrayRef<Value> partitionedOperands,
                          ArrayRef<Sharding> operandShardings,
                          ArrayRef<Sharding> resultShardings,
                          IRMapping &partitionMap,
                          SymbolTableCollection &symbolTable,
                          OpBuilder &builder) const {
    // A norm needs its whole last dimension on every rank.
    if (!isa<BiasAddOp>(op) && !operandShardings.empty() &&
        operandShardings.front()) {
      ArrayRef<shard::GridAxesAttr> split =
          operandShardings.front().getSplitAxes();
      int64_t rank = rankOf(op->getOperand(0));
      if (static_cast<int64_t>(split.size()) == rank &&
          !split.back().empty())
        return op->emitOpError()
               << "cannot be partitioned along its normalized (last) "
                  "dimension; shard another dimension, or gather it first";
    }
    shard::partitionTriviallyShardableOperation(
        *op, partitionedOperands, operandShardings, resultShardings,
        partitionMap, symbolTable, builder);
    return success();
  }
};

/// attention: loops (batch, query, head, key, head_dim, value_dim); the
/// key/value head dimension shares the head loop, whose grouped-query
/// shards keep whole groups together when the head counts divide.
struct AttentionModel
    : public shard::ShardingInterface::ExternalModel<AttentionModel,
                                                     AttentionOp> {
  SmallVector<IteratorType> getLoopIteratorTypes(Operation *op) const {
    return {IteratorType::parallel,  IteratorType::parallel,
            IteratorType::parallel,  IteratorType::reduction,
            IteratorType::reduction, IteratorType::parallel};
  }

  SmallVector<shard::ReductionKind>
  getReductionLoopIteratorKinds(Operation *op) const {
    return {shard::ReductionKind::Generic, shard::ReductionKind::Generic};
  }

  SmallVector<AffineMap> getIndexingMaps(Operation *op) const {
    MLIRContext *context = op->getContext();
    auto d = [&](unsigned i) { return getAffineDimExpr(i, context); };
    auto map = [&](ArrayRef<AffineExpr> exprs) {
      return AffineMap::get(6, 0, exprs, context);
    };
    return {map({d(0), d(1), d(2), d(4)}), map({d(0), d(3), d(2), d(4)}),
            map({d(0), d(3), d(2), d(5)}), map({d(0), d(1), d(2), d(5)})};
  }

  LogicalResult partition(Operation *op, ArrayRef<Value> partitionedOperands,
                          ArrayRef<Sharding> operandShardings,
                          ArrayRef<Sharding> resultShardings,
                          IRMapping &partitionMap,
                          SymbolTableCollection &symbolTable,
                          OpBuilder &builder) const {
    // Causal masks and softmax need whole sequences and head dimensions.
    for (Sharding sharding : operandShardings) {
      if (!sharding)
        continue;
      ArrayRef<shard::GridAxesAttr> split = sharding.getSplitAxes();
      for (size_t dim = 1; dim < split.size(); ++dim)
        if (dim != 2 && !split[dim].empty())
          return op->emitOpError()
                 << "can be partitioned along batch and heads only; dimension "
                 << dim << " is sharded";
    }
    shard::partitionTriviallyShardableOperation(
        *op, partitionedOperands, operandShardings, resultShardings,
        partitionMap, symbolTable, builder);
    return success();
  }
};

} // namespace

void mt::registerShardingInterfaceExternalModels(DialectRegistry &registry) {
  registry.addExtension(+[](MLIRContext *context, MtDialect *) {
    AddOp::attachInterface<ElementwiseModel<AddOp>>(*context);
    MulOp::attachInterface<ElementwiseModel<MulOp>>(*context);
    GeluOp::attachInterface<ElementwiseModel<GeluOp>>(*context);
    SiluOp::attachInterface<ElementwiseModel<SiluOp>>(*context);
    SwigluOp::attachInterface<ElementwiseModel<SwigluOp>>(*context);
    DropoutOp::attachInterface<ElementwiseModel<DropoutOp>>(*context);
    LinearOp::attachInterface<LinearModel>(*context);
    LayerNormOp::attachInterface<LastDimModel<LayerNormOp>>(*context);
    RmsNormOp::attachInterface<LastDimModel<RmsNormOp>>(*context);
    BiasAddOp::attachInterface<LastDimModel<BiasAddOp>>(*context);
    AttentionOp::attachInterface<AttentionModel>(*context);
  });
}
