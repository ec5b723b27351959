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
#include "llvm/ADT/DenseSet.h"

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

/// rope: elementwise over (batch, sequence, heads, head_dim), but positions
/// come from the sequence index and pairs from the head dimension, so only
/// batch and heads may be sharded.
struct RopeModel
    : public shard::ShardingInterface::ExternalModel<RopeModel, RopeOp> {
  SmallVector<IteratorType> getLoopIteratorTypes(Operation *op) const {
    return SmallVector<IteratorType>(4, IteratorType::parallel);
  }

  SmallVector<AffineMap> getIndexingMaps(Operation *op) const {
    AffineMap identity = AffineMap::getMultiDimIdentityMap(4, op->getContext());
    return {identity, identity};
  }

  LogicalResult partition(Operation *op, ArrayRef<Value> partitionedOperands,
                          ArrayRef<Sharding> operandShardings,
                          ArrayRef<Sharding> resultShardings,
                          IRMapping &partitionMap,
                          SymbolTableCollection &symbolTable,
                          OpBuilder &builder) const {
    if (Sharding sharding = operandShardings.front()) {
      ArrayRef<shard::GridAxesAttr> split = sharding.getSplitAxes();
      for (size_t dim : {1, 3})
        if (dim < split.size() && !split[dim].empty())
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

/// reshape between shapes that differ by splitting or merging groups of
/// adjacent dimensions, e.g. [B, S, H*D] <-> [B, S, H, D]. The loops are the
/// dimensions of the finer side of each group; a merged dimension may be
/// sharded only as its group's leading dimension is, so a split of H*D
/// across ranks is a split of the heads H.
struct ReshapeModel
    : public shard::ShardingInterface::ExternalModel<ReshapeModel, ReshapeOp> {
  /// One group: input dimensions [inBegin, inEnd) hold the same elements as
  /// output dimensions [outBegin, outEnd); its loops start at `loop`.
  struct Group {
    int64_t inBegin, inEnd, outBegin, outEnd, loop;
    int64_t loops() const {
      return std::max(inEnd - inBegin, outEnd - outBegin);
    }
  };

  static FailureOr<SmallVector<Group>> groups(Operation *op) {
    ArrayRef<int64_t> in =
        cast<RankedTensorType>(op->getOperand(0).getType()).getShape();
    ArrayRef<int64_t> out =
        cast<RankedTensorType>(op->getResult(0).getType()).getShape();
    SmallVector<Group> result;
    int64_t i = 0, j = 0, loop = 0;
    while (i < static_cast<int64_t>(in.size()) ||
           j < static_cast<int64_t>(out.size())) {
      if (i == static_cast<int64_t>(in.size()) ||
          j == static_cast<int64_t>(out.size()))
        return failure();
      Group group{i, i + 1, j, j + 1, loop};
      int64_t inProduct = in[i++], outProduct = out[j++];
      while (inProduct != outProduct) {
        if (inProduct < outProduct && i < static_cast<int64_t>(in.size()))
          inProduct *= in[i++];
        else if (outProduct < inProduct &&
                 j < static_cast<int64_t>(out.size()))
          outProduct *= out[j++];
        else
          return failure();
      }
      group.inEnd = i;
      group.outEnd = j;
      // Only splits and merges: one side of each group is a single dimension.
      if (group.inEnd - group.inBegin > 1 && group.outEnd - group.outBegin > 1)
        return failure();
      loop += group.loops();
      result.push_back(group);
    }
    return result;
  }

  SmallVector<IteratorType> getLoopIteratorTypes(Operation *op) const {
    FailureOr<SmallVector<Group>> all = groups(op);
    int64_t loops = failed(all) || all->empty()
                        ? 0
                        : all->back().loop + all->back().loops();
    return SmallVector<IteratorType>(loops, IteratorType::parallel);
  }

  SmallVector<AffineMap> getIndexingMaps(Operation *op) const { return {}; }

  FailureOr<shard::ShardingOption>
  getShardingOption(Operation *op, ArrayRef<Sharding> operandShardings,
                    ArrayRef<Sharding> resultShardings) const {
    FailureOr<SmallVector<Group>> all = groups(op);
    if (failed(all))
      return failure();
    bool fromInput = !operandShardings.empty() && operandShardings.front();
    Sharding known = fromInput ? operandShardings.front()
                               : (resultShardings.empty() ? Sharding()
                                                          : resultShardings.front());
    if (!known)
      return shard::ShardingOption::makeEmpty();
    ArrayRef<shard::GridAxesAttr> split = known.getSplitAxes();
    shard::ShardingArray loops(getLoopIteratorTypes(op).size());
    for (const Group &group : *all) {
      int64_t begin = fromInput ? group.inBegin : group.outBegin;
      int64_t end = fromInput ? group.inEnd : group.outEnd;
      bool fine = end - begin == group.loops();
      for (int64_t dim = begin; dim < end; ++dim) {
        if (dim >= static_cast<int64_t>(split.size()) || split[dim].empty())
          continue;
        // A merged dimension's split lands on the group's leading loop.
        if (!fine && dim != begin)
          return failure();
        llvm::append_range(loops[group.loop + (dim - begin)],
                           split[dim].asArrayRef());
      }
    }
    return shard::ShardingOption(std::move(loops), known.getGridAttr());
  }

  FailureOr<std::vector<Sharding>>
  getShardingAnnotations(Operation *op,
                         const shard::ShardingOption &option) const {
    FailureOr<SmallVector<Group>> all = groups(op);
    if (failed(all))
      return failure();
    MLIRContext *context = op->getContext();
    auto side = [&](bool input) {
      SmallVector<shard::GridAxesAttr> split;
      for (const Group &group : *all) {
        int64_t begin = input ? group.inBegin : group.outBegin;
        int64_t end = input ? group.inEnd : group.outEnd;
        bool fine = end - begin == group.loops();
        for (int64_t dim = begin; dim < end; ++dim) {
          ArrayRef<GridAxis> axes;
          if (fine || dim == begin)
            axes = option.shardingArray[group.loop + (dim - begin)];
          // A merged dimension carries its group's leading split only; the
          // finer loops must not be split.
          split.push_back(shard::GridAxesAttr::get(context, axes));
        }
      }
      return Sharding::get(option.grid, split);
    };
    for (const Group &group : *all) {
      bool inputMerged = group.inEnd - group.inBegin < group.loops();
      bool outputMerged = group.outEnd - group.outBegin < group.loops();
      if (!inputMerged && !outputMerged)
        continue;
      for (int64_t loop = group.loop + 1; loop < group.loop + group.loops();
           ++loop)
        if (!option.shardingArray[loop].empty())
          return failure();
    }
    return std::vector<Sharding>{side(true), side(false)};
  }

  LogicalResult addShardingAnnotations(Operation *op, OpBuilder &builder,
                                       const shard::ShardingOption &option) const {
    FailureOr<std::vector<Sharding>> shardings =
        getShardingAnnotations(op, option);
    if (failed(shardings))
      return failure();
    shard::maybeInsertTargetShardingAnnotation((*shardings)[1],
                                               op->getResult(0), builder);
    shard::maybeInsertSourceShardingAnnotation((*shardings)[0],
                                               op->getOpOperand(0), builder);
    return success();
  }

  LogicalResult partition(Operation *op, ArrayRef<Value> partitionedOperands,
                          ArrayRef<Sharding> operandShardings,
                          ArrayRef<Sharding> resultShardings,
                          IRMapping &partitionMap,
                          SymbolTableCollection &symbolTable,
                          OpBuilder &builder) const {
    shard::partitionTriviallyShardableOperation(
        *op, partitionedOperands, operandShardings, resultShardings,
        partitionMap, symbolTable, builder);
    return success();
  }
};

/// The grid axes that shard loops of `op` whose index does not reach a
/// result: summing over them needs an all-reduce.
SmallVector<GridAxis> reductionAxes(shard::ShardingInterface op,
                                    ArrayRef<Sharding> operandShardings,
                                    ArrayRef<Sharding> resultShardings) {
  SmallVector<IteratorType> iterators = op.getLoopIteratorTypes();
  shard::ShardingArray assignment = shard::getGridAxisAssignmentForLoopIterators(
      operandShardings, resultShardings, iterators, op.getIndexingMaps());
  return shard::getReductionGridAxes(iterators, assignment);
}

/// Partitions `op` into the local op and, where a summed loop is sharded, an
/// all-reduce of each result.
void partitionSummingShards(Operation *op, ArrayRef<Value> partitionedOperands,
                            ArrayRef<Sharding> operandShardings,
                            ArrayRef<Sharding> resultShardings,
                            IRMapping &partitionMap,
                            SymbolTableCollection &symbolTable,
                            OpBuilder &builder, ArrayRef<GridAxis> axes,
                            StringRef grid) {
  shard::partitionTriviallyShardableOperation(*op, partitionedOperands,
                                              operandShardings, resultShardings,
                                              partitionMap, symbolTable,
                                              builder);
  if (axes.empty())
    return;
  for (Value result : op->getResults()) {
    Value local = partitionMap.lookup(result);
    partitionMap.map(result, shard::AllReduceOp::create(
                                 builder, op->getLoc(), local, grid, axes,
                                 shard::ReductionKind::Sum));
  }
}

int64_t getLoopCount(Operation *op) {
  return cast<shard::ShardingInterface>(op).getLoopIteratorTypes().size();
}

/// The default sharding option, with the summed row loops (the first
/// `rows`) also split as `rowSource`'s leading dimensions are: upstream's
/// default leaves reduction loops unsplit unless an operand is annotated for
/// this op, and would gather batch- or sequence-sharded activations instead
/// of summing partial gradients.
FailureOr<shard::ShardingOption>
splitSummedRows(Operation *op, ArrayRef<Sharding> operandShardings,
                ArrayRef<Sharding> resultShardings, int64_t rows,
                Sharding rowSource) {
  FailureOr<shard::ShardingOption> option =
      shard::detail::defaultGetShardingOption(op, operandShardings,
                                              resultShardings);
  // Propagation also asks with subsets of the annotations; the rows' split
  // is then read from the IR.
  for (OpOperand &operand : op->getOpOperands()) {
    if (rowSource)
      break;
    FailureOr<std::pair<bool, Sharding>> annotated =
        shard::getSharding(operand);
    if (succeeded(annotated))
      rowSource = annotated->second;
  }
  if (failed(option) || !rowSource)
    return option;
  if (option->empty)
    option = shard::ShardingOption(
        shard::ShardingArray(getLoopCount(op)), rowSource.getGridAttr());
  llvm::SmallDenseSet<GridAxis> used;
  for (ArrayRef<GridAxis> axes : option->shardingArray)
    used.insert(axes.begin(), axes.end());
  ArrayRef<shard::GridAxesAttr> split = rowSource.getSplitAxes();
  for (int64_t dim = 0; dim < rows && dim < static_cast<int64_t>(split.size());
       ++dim) {
    if (!option->shardingArray[dim].empty())
      continue;
    for (GridAxis axis : split[dim].asArrayRef())
      if (used.insert(axis).second)
        option->shardingArray[dim].push_back(axis);
  }
  return option;
}

/// linear_weight_grad: loops (rows..., in, out); the rows are summed, so
/// batch- or sequence-sharded inputs (data or sequence parallelism) give
/// partial weight gradients that are all-reduced.
struct LinearWeightGradModel
    : public shard::ShardingInterface::ExternalModel<LinearWeightGradModel,
                                                     LinearWeightGradOp> {
  SmallVector<IteratorType> getLoopIteratorTypes(Operation *op) const {
    SmallVector<IteratorType> types(rankOf(op->getOperand(0)) - 1,
                                    IteratorType::reduction);
    types.append(2, IteratorType::parallel);
    return types;
  }

  SmallVector<shard::ReductionKind>
  getReductionLoopIteratorKinds(Operation *op) const {
    return SmallVector<shard::ReductionKind>(rankOf(op->getOperand(0)) - 1,
                                             shard::ReductionKind::Sum);
  }

  SmallVector<AffineMap> getIndexingMaps(Operation *op) const {
    auto grad = cast<LinearWeightGradOp>(op);
    MLIRContext *context = op->getContext();
    int64_t rows = rankOf(grad.getInput()) - 1, loops = rows + 2;
    AffineExpr in = getAffineDimExpr(rows, context);
    AffineExpr out = getAffineDimExpr(rows + 1, context);
    SmallVector<AffineExpr> input, outputGrad;
    for (int64_t dim = 0; dim < rows; ++dim) {
      input.push_back(getAffineDimExpr(dim, context));
      outputGrad.push_back(getAffineDimExpr(dim, context));
    }
    input.push_back(in);
    outputGrad.push_back(out);
    return {AffineMap::get(loops, 0, input, context),
            AffineMap::get(loops, 0, outputGrad, context),
            AffineMap::get(loops, 0,
                           grad.getTransposeWeight() ? ArrayRef{out, in}
                                                     : ArrayRef{in, out},
                           context)};
  }

  FailureOr<shard::ShardingOption>
  getShardingOption(Operation *op, ArrayRef<Sharding> operandShardings,
                    ArrayRef<Sharding> resultShardings) const {
    return splitSummedRows(op, operandShardings, resultShardings,
                           rankOf(op->getOperand(0)) - 1,
                           operandShardings[0] ? operandShardings[0]
                                               : operandShardings[1]);
  }

  LogicalResult partition(Operation *op, ArrayRef<Value> partitionedOperands,
                          ArrayRef<Sharding> operandShardings,
                          ArrayRef<Sharding> resultShardings,
                          IRMapping &partitionMap,
                          SymbolTableCollection &symbolTable,
                          OpBuilder &builder) const {
    partitionSummingShards(
        op, partitionedOperands, operandShardings, resultShardings,
        partitionMap, symbolTable, builder,
        reductionAxes(cast<shard::ShardingInterface>(op), operandShardings,
                      resultShardings),
        operandShardings[0] ? operandShardings[0].getGrid() : StringRef());
    return success();
  }
};

/// bias_grad: loops (rows..., n); the rows are summed.
struct BiasGradModel
    : public shard::ShardingInterface::ExternalModel<BiasGradModel,
                                                     BiasGradOp> {
  SmallVector<IteratorType> getLoopIteratorTypes(Operation *op) const {
    SmallVector<IteratorType> types(rankOf(op->getOperand(0)),
                                    IteratorType::reduction);
    types.back() = IteratorType::parallel;
    return types;
  }

  SmallVector<shard::ReductionKind>
  getReductionLoopIteratorKinds(Operation *op) const {
    return SmallVector<shard::ReductionKind>(rankOf(op->getOperand(0)) - 1,
                                             shard::ReductionKind::Sum);
  }

  SmallVector<AffineMap> getIndexingMaps(Operation *op) const {
    int64_t rank = rankOf(op->getOperand(0));
    MLIRContext *context = op->getContext();
    return {AffineMap::getMultiDimIdentityMap(rank, context),
            AffineMap::get(rank, 0, {getAffineDimExpr(rank - 1, context)},
                           context)};
  }

  FailureOr<shard::ShardingOption>
  getShardingOption(Operation *op, ArrayRef<Sharding> operandShardings,
                    ArrayRef<Sharding> resultShardings) const {
    return splitSummedRows(op, operandShardings, resultShardings,
                           rankOf(op->getOperand(0)) - 1, operandShardings[0]);
  }

  LogicalResult partition(Operation *op, ArrayRef<Value> partitionedOperands,
                          ArrayRef<Sharding> operandShardings,
                          ArrayRef<Sharding> resultShardings,
                          IRMapping &partitionMap,
                          SymbolTableCollection &symbolTable,
                          OpBuilder &builder) const {
    partitionSummingShards(
        op, partitionedOperands, operandShardings, resultShardings,
        partitionMap, symbolTable, builder,
        reductionAxes(cast<shard::ShardingInterface>(op), operandShardings,
                      resultShardings),
        operandShardings[0] ? operandShardings[0].getGrid() : StringRef());
    return success();
  }
};

/// layer_norm_grad and rms_norm_grad: loops over the input's dimensions; the
/// input gradient is per row, the weight and bias gradients sum the rows, so
/// sharded rows give partial sums that are all-reduced.
template <typename Op>
struct NormGradModel
    : public shard::ShardingInterface::ExternalModel<NormGradModel<Op>, Op> {
  SmallVector<IteratorType> getLoopIteratorTypes(Operation *op) const {
    SmallVector<IteratorType> types(rankOf(op->getOperand(1)),
                                    IteratorType::parallel);
    types.back() = IteratorType::reduction;
    return types;
  }

  SmallVector<shard::ReductionKind>
  getReductionLoopIteratorKinds(Operation *op) const {
    return {shard::ReductionKind::Generic};
  }

  SmallVector<AffineMap> getIndexingMaps(Operation *op) const {
    int64_t rank = rankOf(op->getOperand(1));
    MLIRContext *context = op->getContext();
    AffineMap identity = AffineMap::getMultiDimIdentityMap(rank, context);
    AffineMap last =
        AffineMap::get(rank, 0, {getAffineDimExpr(rank - 1, context)}, context);
    // Operands: output_grad, input, weight; results: input_grad, then the
    // weight (and bias) gradients.
    SmallVector<AffineMap> maps = {identity, identity, last, identity};
    maps.append(op->getNumResults() - 1, last);
    return maps;
  }

  LogicalResult partition(Operation *op, ArrayRef<Value> partitionedOperands,
                          ArrayRef<Sharding> operandShardings,
                          ArrayRef<Sharding> resultShardings,
                          IRMapping &partitionMap,
                          SymbolTableCollection &symbolTable,
                          OpBuilder &builder) const {
    SmallVector<GridAxis> rowAxes;
    if (Sharding input = operandShardings[1]) {
      ArrayRef<shard::GridAxesAttr> split = input.getSplitAxes();
      int64_t rank = rankOf(op->getOperand(1));
      for (int64_t dim = 0; dim < static_cast<int64_t>(split.size()); ++dim) {
        if (dim == rank - 1 && !split[dim].empty())
          return op->emitOpError()
                 << "cannot be partitioned along its normalized (last) "
                    "dimension; shard another dimension, or gather it first";
        llvm::append_range(rowAxes, split[dim].asArrayRef());
      }
    }
    shard::partitionTriviallyShardableOperation(
        *op, partitionedOperands, operandShardings, resultShardings,
        partitionMap, symbolTable, builder);
    if (rowAxes.empty())
      return success();
    for (Value result : op->getResults().drop_front()) {
      Value local = partitionMap.lookup(result);
      partitionMap.map(result, shard::AllReduceOp::create(
                                   builder, op->getLoc(), local,
                                   operandShardings[1].getGrid(), rowAxes,
                                   shard::ReductionKind::Sum));
    }
    return success();
  }
};

/// attention_grad: the loops of attention; every gradient has its operand's
/// indexing.
struct AttentionGradModel
    : public shard::ShardingInterface::ExternalModel<AttentionGradModel,
                                                     AttentionGradOp> {
  SmallVector<IteratorType> getLoopIteratorTypes(Operation *op) const {
    return AttentionModel().getLoopIteratorTypes(op);
  }

  SmallVector<shard::ReductionKind>
  getReductionLoopIteratorKinds(Operation *op) const {
    return AttentionModel().getReductionLoopIteratorKinds(op);
  }

  SmallVector<AffineMap> getIndexingMaps(Operation *op) const {
    // attention's maps are q, k, v, out; the backward reads out's gradient
    // first and yields q's, k's and v's.
    SmallVector<AffineMap> forward = AttentionModel().getIndexingMaps(op);
    return {forward[3], forward[0], forward[1], forward[2],
            forward[0], forward[1], forward[2]};
  }

  LogicalResult partition(Operation *op, ArrayRef<Value> partitionedOperands,
                          ArrayRef<Sharding> operandShardings,
                          ArrayRef<Sharding> resultShardings,
                          IRMapping &partitionMap,
                          SymbolTableCollection &symbolTable,
                          OpBuilder &builder) const {
    return AttentionModel().partition(op, partitionedOperands,
                                      operandShardings, resultShardings,
                                      partitionMap, symbolTable, builder);
  }
};

/// Fails naming `dim` if `sharding` splits it.
LogicalResult rejectSplit(Operation *op, Sharding sharding, int64_t dim,
                          StringRef what) {
  if (!sharding)
    return success();
  ArrayRef<shard::GridAxesAttr> split = sharding.getSplitAxes();
  if (dim < static_cast<int64_t>(split.size()) && !split[dim].empty())
    return op->emitOpError() << "cannot be partitioned along " << what
                             << " yet (docs/Parallelism.md)";
  return success();
}

/// The grid axes that split any of the first `count` dimensions.
SmallVector<GridAxis> axesOfLeadingDims(Sharding sharding, int64_t count) {
  SmallVector<GridAxis> axes;
  if (!sharding)
    return axes;
  ArrayRef<shard::GridAxesAttr> split = sharding.getSplitAxes();
  for (int64_t dim = 0; dim < count && dim < static_cast<int64_t>(split.size());
       ++dim)
    llvm::append_range(axes, split[dim].asArrayRef());
  return axes;
}

/// The number of ranks along `axes` of the grid named by `sharding`.
FailureOr<int64_t> ranksAlong(Operation *op, Sharding sharding,
                              ArrayRef<GridAxis> axes,
                              SymbolTableCollection &symbolTable) {
  shard::GridOp grid = shard::getGrid(op, sharding.getGridAttr(), symbolTable);
  if (!grid)
    return failure();
  int64_t ranks = 1;
  for (GridAxis axis : axes)
    ranks *= grid.getShape()[axis];
  return ranks;
}

/// embedding: loops (ids..., hidden, vocabulary). Ids may be split (data and
/// sequence parallelism); the table is read whole on every rank until the
/// vocabulary-parallel embedding exists.
struct EmbeddingModel
    : public shard::ShardingInterface::ExternalModel<EmbeddingModel,
                                                     EmbeddingOp> {
  SmallVector<IteratorType> getLoopIteratorTypes(Operation *op) const {
    SmallVector<IteratorType> types(rankOf(op->getOperand(1)) + 1,
                                    IteratorType::parallel);
    types.push_back(IteratorType::reduction);
    return types;
  }

  SmallVector<shard::ReductionKind>
  getReductionLoopIteratorKinds(Operation *op) const {
    return {shard::ReductionKind::Generic};
  }

  SmallVector<AffineMap> getIndexingMaps(Operation *op) const {
    int64_t ids = rankOf(op->getOperand(1)), loops = ids + 2;
    MLIRContext *context = op->getContext();
    AffineExpr hidden = getAffineDimExpr(ids, context);
    AffineExpr vocabulary = getAffineDimExpr(ids + 1, context);
    SmallVector<AffineExpr> idDims, out;
    for (int64_t dim = 0; dim < ids; ++dim) {
      idDims.push_back(getAffineDimExpr(dim, context));
      out.push_back(getAffineDimExpr(dim, context));
    }
    out.push_back(hidden);
    return {AffineMap::get(loops, 0, {vocabulary, hidden}, context),
            AffineMap::get(loops, 0, idDims, context),
            AffineMap::get(loops, 0, out, context)};
  }

  LogicalResult partition(Operation *op, ArrayRef<Value> partitionedOperands,
                          ArrayRef<Sharding> operandShardings,
                          ArrayRef<Sharding> resultShardings,
                          IRMapping &partitionMap,
                          SymbolTableCollection &symbolTable,
                          OpBuilder &builder) const {
    if (failed(rejectSplit(op, operandShardings[0], 0, "the vocabulary")))
      return failure();
    shard::partitionTriviallyShardableOperation(
        *op, partitionedOperands, operandShardings, resultShardings,
        partitionMap, symbolTable, builder);
    return success();
  }
};

/// embedding_grad: loops (ids..., hidden, vocabulary); the positions are
/// summed into the table's rows, so split ids give partial tables that are
/// all-reduced.
struct EmbeddingGradModel
    : public shard::ShardingInterface::ExternalModel<EmbeddingGradModel,
                                                     EmbeddingGradOp> {
  SmallVector<IteratorType> getLoopIteratorTypes(Operation *op) const {
    SmallVector<IteratorType> types(rankOf(op->getOperand(1)),
                                    IteratorType::reduction);
    types.append(2, IteratorType::parallel);
    return types;
  }

  SmallVector<shard::ReductionKind>
  getReductionLoopIteratorKinds(Operation *op) const {
    return SmallVector<shard::ReductionKind>(rankOf(op->getOperand(1)),
                                             shard::ReductionKind::Sum);
  }

  SmallVector<AffineMap> getIndexingMaps(Operation *op) const {
    int64_t ids = rankOf(op->getOperand(1)), loops = ids + 2;
    MLIRContext *context = op->getContext();
    AffineExpr hidden = getAffineDimExpr(ids, context);
    AffineExpr vocabulary = getAffineDimExpr(ids + 1, context);
    SmallVector<AffineExpr> idDims, grad;
    for (int64_t dim = 0; dim < ids; ++dim) {
      idDims.push_back(getAffineDimExpr(dim, context));
      grad.push_back(getAffineDimExpr(dim, context));
    }
    grad.push_back(hidden);
    return {AffineMap::get(loops, 0, grad, context),
            AffineMap::get(loops, 0, idDims, context),
            AffineMap::get(loops, 0, {vocabulary, hidden}, context)};
  }

  LogicalResult partition(Operation *op, ArrayRef<Value> partitionedOperands,
                          ArrayRef<Sharding> operandShardings,
                          ArrayRef<Sharding> resultShardings,
                          IRMapping &partitionMap,
                          SymbolTableCollection &symbolTable,
                          OpBuilder &builder) const {
    if (!resultShardings.empty() &&
        failed(rejectSplit(op, resultShardings[0], 0, "the vocabulary")))
      return failure();
    partitionSummingShards(
        op, partitionedOperands, operandShardings, resultShardings,
        partitionMap, symbolTable, builder,
        axesOfLeadingDims(operandShardings[1], rankOf(op->getOperand(1))),
        operandShardings[1] ? operandShardings[1].getGrid() : StringRef());
    return success();
  }
};

/// cross_entropy: loops (rows..., vocabulary). Rows may be split (data
/// parallelism): the loss of `sum` is all-reduced; that of `mean` is the
/// average of the ranks' means, as Megatron-LM averages data-parallel
/// gradients (equal to the global mean when every rank has as many tokens
/// that are not ignored).
struct CrossEntropyModel
    : public shard::ShardingInterface::ExternalModel<CrossEntropyModel,
                                                     CrossEntropyOp> {
  static bool perToken(Operation *op) {
    return cast<CrossEntropyOp>(op).getReduction() == LossReduction::None;
  }

  SmallVector<IteratorType> getLoopIteratorTypes(Operation *op) const {
    SmallVector<IteratorType> types(rankOf(op->getOperand(1)),
                                    perToken(op) ? IteratorType::parallel
                                                 : IteratorType::reduction);
    types.push_back(IteratorType::reduction);
    return types;
  }

  SmallVector<shard::ReductionKind>
  getReductionLoopIteratorKinds(Operation *op) const {
    SmallVector<shard::ReductionKind> kinds;
    if (!perToken(op))
      kinds.append(rankOf(op->getOperand(1)), shard::ReductionKind::Sum);
    kinds.push_back(shard::ReductionKind::Generic);
    return kinds;
  }

  SmallVector<AffineMap> getIndexingMaps(Operation *op) const {
    int64_t rows = rankOf(op->getOperand(1)), loops = rows + 1;
    MLIRContext *context = op->getContext();
    SmallVector<AffineExpr> rowDims;
    for (int64_t dim = 0; dim < rows; ++dim)
      rowDims.push_back(getAffineDimExpr(dim, context));
    SmallVector<AffineExpr> logits(rowDims);
    logits.push_back(getAffineDimExpr(rows, context));
    return {AffineMap::get(loops, 0, logits, context),
            AffineMap::get(loops, 0, rowDims, context),
            AffineMap::get(loops, 0,
                           perToken(op) ? rowDims : SmallVector<AffineExpr>(),
                           context)};
  }

  LogicalResult partition(Operation *op, ArrayRef<Value> partitionedOperands,
                          ArrayRef<Sharding> operandShardings,
                          ArrayRef<Sharding> resultShardings,
                          IRMapping &partitionMap,
                          SymbolTableCollection &symbolTable,
                          OpBuilder &builder) const {
    int64_t rows = rankOf(op->getOperand(1));
    if (failed(rejectSplit(op, operandShardings[0], rows, "the vocabulary")))
      return failure();
    shard::partitionTriviallyShardableOperation(
        *op, partitionedOperands, operandShardings, resultShardings,
        partitionMap, symbolTable, builder);
    SmallVector<GridAxis> axes = axesOfLeadingDims(operandShardings[0], rows);
    if (perToken(op) || axes.empty())
      return success();
    Value result = op->getResult(0);
    Value local = partitionMap.lookup(result);
    Value sum = shard::AllReduceOp::create(builder, op->getLoc(), local,
                                           operandShardings[0].getGrid(), axes,
                                           shard::ReductionKind::Sum);
    if (cast<CrossEntropyOp>(op).getReduction() == LossReduction::Mean) {
      FailureOr<int64_t> ranks =
          ranksAlong(op, operandShardings[0], axes, symbolTable);
      if (failed(ranks))
        return failure();
      Value scale = FillOp::create(builder, op->getLoc(), local.getType(),
                                   builder.getF64FloatAttr(1.0 / *ranks));
      sum = MulOp::create(builder, op->getLoc(), local.getType(), sum, scale);
    }
    partitionMap.map(result, sum);
    return success();
  }
};

/// cross_entropy_grad: loops (rows..., vocabulary), all parallel. Under split
/// rows, the mean's gradient on each rank is its local mean's, scaled by the
/// share of the ranks (see CrossEntropyModel).
struct CrossEntropyGradModel
    : public shard::ShardingInterface::ExternalModel<CrossEntropyGradModel,
                                                     CrossEntropyGradOp> {
  SmallVector<IteratorType> getLoopIteratorTypes(Operation *op) const {
    return SmallVector<IteratorType>(rankOf(op->getOperand(1)),
                                     IteratorType::parallel);
  }

  SmallVector<AffineMap> getIndexingMaps(Operation *op) const {
    auto grad = cast<CrossEntropyGradOp>(op);
    int64_t loops = rankOf(grad.getLogits());
    MLIRContext *context = op->getContext();
    AffineMap identity = AffineMap::getMultiDimIdentityMap(loops, context);
    SmallVector<AffineExpr> rowDims;
    for (int64_t dim = 0; dim + 1 < loops; ++dim)
      rowDims.push_back(getAffineDimExpr(dim, context));
    AffineMap rowsMap = AffineMap::get(loops, 0, rowDims, context);
    AffineMap lossMap = grad.getReduction() == LossReduction::None
                            ? rowsMap
                            : AffineMap::get(loops, 0, {}, context);
    return {lossMap, identity, rowsMap, identity};
  }

  LogicalResult partition(Operation *op, ArrayRef<Value> partitionedOperands,
                          ArrayRef<Sharding> operandShardings,
                          ArrayRef<Sharding> resultShardings,
                          IRMapping &partitionMap,
                          SymbolTableCollection &symbolTable,
                          OpBuilder &builder) const {
    auto grad = cast<CrossEntropyGradOp>(op);
    int64_t rows = rankOf(grad.getLogits()) - 1;
    if (failed(rejectSplit(op, operandShardings[1], rows, "the vocabulary")))
      return failure();
    SmallVector<Value> operands(partitionedOperands);
    SmallVector<GridAxis> axes = axesOfLeadingDims(operandShardings[1], rows);
    if (grad.getReduction() == LossReduction::Mean && !axes.empty()) {
      FailureOr<int64_t> ranks =
          ranksAlong(op, operandShardings[1], axes, symbolTable);
      if (failed(ranks))
        return failure();
      Type type = operands[0].getType();
      Value scale = FillOp::create(builder, op->getLoc(), type,
                                   builder.getF64FloatAttr(1.0 / *ranks));
      operands[0] = MulOp::create(builder, op->getLoc(), type, operands[0],
                                  scale);
    }
    shard::partitionTriviallyShardableOperation(
        *op, operands, operandShardings, resultShardings, partitionMap,
        symbolTable, builder);
    return success();
  }
};

/// Ops whose operands and results every rank holds whole: fills, positions
/// and softmax. Upstream partitions them as
/// fully replicated, gathering sharded operands first.
template <typename Op>
struct ReplicatedModel
    : public shard::ShardingInterface::ExternalModel<ReplicatedModel<Op>, Op> {
  SmallVector<IteratorType> getLoopIteratorTypes(Operation *op) const {
    return {};
  }
  SmallVector<AffineMap> getIndexingMaps(Operation *op) const { return {}; }

  FailureOr<shard::ShardingOption>
  getShardingOption(Operation *op, ArrayRef<Sharding> operandShardings,
                    ArrayRef<Sharding> resultShardings) const {
    for (ArrayRef<Sharding> shardings : {operandShardings, resultShardings})
      for (Sharding sharding : shardings)
        if (sharding)
          return shard::ShardingOption({}, sharding.getGridAttr());
    return shard::ShardingOption::makeEmpty();
  }

  FailureOr<std::vector<Sharding>>
  getShardingAnnotations(Operation *op,
                         const shard::ShardingOption &option) const {
    std::vector<Sharding> shardings;
    auto replicated = [&](Type type) {
      if (!isa<RankedTensorType>(type))
        return Sharding();
      return Sharding::get(
          option.grid, {shard::GridAxesAttr::get(op->getContext(), {})});
    };
    for (Type type : op->getOperandTypes())
      shardings.push_back(replicated(type));
    for (Type type : op->getResultTypes())
      shardings.push_back(replicated(type));
    return shardings;
  }

  LogicalResult addShardingAnnotations(Operation *op, OpBuilder &builder,
                                       const shard::ShardingOption &option) const {
    FailureOr<std::vector<Sharding>> shardings =
        getShardingAnnotations(op, option);
    if (failed(shardings))
      return failure();
    for (OpResult result : op->getResults())
      shard::maybeInsertTargetShardingAnnotation(
          (*shardings)[op->getNumOperands() + result.getResultNumber()],
          result, builder);
    for (OpOperand &operand : op->getOpOperands())
      if (Sharding sharding = (*shardings)[operand.getOperandNumber()])
        shard::maybeInsertSourceShardingAnnotation(sharding, operand, builder);
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
    RopeOp::attachInterface<RopeModel>(*context);
    GeluGradOp::attachInterface<ElementwiseModel<GeluGradOp>>(*context);
    SiluGradOp::attachInterface<ElementwiseModel<SiluGradOp>>(*context);
    SwigluGradOp::attachInterface<ElementwiseModel<SwigluGradOp>>(*context);
    LinearWeightGradOp::attachInterface<LinearWeightGradModel>(*context);
    BiasGradOp::attachInterface<BiasGradModel>(*context);
    LayerNormGradOp::attachInterface<NormGradModel<LayerNormGradOp>>(*context);
    RmsNormGradOp::attachInterface<NormGradModel<RmsNormGradOp>>(*context);
    AttentionGradOp::attachInterface<AttentionGradModel>(*context);
    EmbeddingOp::attachInterface<EmbeddingModel>(*context);
    EmbeddingGradOp::attachInterface<EmbeddingGradModel>(*context);
    CrossEntropyOp::attachInterface<CrossEntropyModel>(*context);
    CrossEntropyGradOp::attachInterface<CrossEntropyGradModel>(*context);
    SoftmaxOp::attachInterface<ReplicatedModel<SoftmaxOp>>(*context);
    SoftmaxGradOp::attachInterface<ReplicatedModel<SoftmaxGradOp>>(*context);
    FillOp::attachInterface<ReplicatedModel<FillOp>>(*context);
    PositionIdsOp::attachInterface<ReplicatedModel<PositionIdsOp>>(*context);
    ReshapeOp::attachInterface<ReshapeModel>(*context);
  });
}
