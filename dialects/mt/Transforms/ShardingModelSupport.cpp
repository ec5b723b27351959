//===- ShardingModelSupport.cpp - What the mt sharding models share -------===//

#include "ShardingModelSupport.h"

#include "mt/Transforms/Passes.h"

#include "llvm/ADT/DenseSet.h"

using namespace mlir;
using namespace mlir::mt;

namespace mlir::mt::sharding {

int64_t rankOf(Value value) {
  return cast<RankedTensorType>(value.getType()).getRank();
}

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

LogicalResult partitionSummingReductions(Operation *op,
                                         ArrayRef<Value> partitionedOperands,
                                         ArrayRef<Sharding> operandShardings,
                                         ArrayRef<Sharding> resultShardings,
                                         IRMapping &partitionMap,
                                         SymbolTableCollection &symbolTable,
                                         OpBuilder &builder) {
  partitionSummingShards(
      op, partitionedOperands, operandShardings, resultShardings, partitionMap,
      symbolTable, builder,
      reductionAxes(cast<shard::ShardingInterface>(op), operandShardings,
                    resultShardings),
      operandShardings[0] ? operandShardings[0].getGrid() : StringRef());
  return success();
}

int64_t getLoopCount(Operation *op) {
  return cast<shard::ShardingInterface>(op).getLoopIteratorTypes().size();
}

/// The default sharding option, with the row loops (the first `rows`) also
/// split as `rowSource`'s leading dimensions are: upstream's default leaves
/// reduction loops unsplit unless an operand is annotated for this op, and
/// would gather batch- or sequence-sharded activations instead of summing
/// partial gradients; and where two operands' annotations conflict (a
/// sequence-split input of a column-parallel layer, whose weight splits its
/// output over the same axis), it drops one operand's annotation whole, the
/// data-parallel batch split with the conflicting sequence split.
FailureOr<shard::ShardingOption>
splitSummedRows(Operation *op, ArrayRef<Sharding> operandShardings,
                ArrayRef<Sharding> resultShardings, int64_t rows,
                Sharding rowSource, int64_t rowOperand) {
  FailureOr<shard::ShardingOption> option =
      shard::detail::defaultGetShardingOption(op, operandShardings,
                                              resultShardings);
  // Propagation also asks with subsets of the annotations; the rows' split
  // is then read from the IR.
  for (OpOperand &operand : op->getOpOperands()) {
    if (rowSource)
      break;
    if (rowOperand >= 0 &&
        operand.getOperandNumber() != static_cast<unsigned>(rowOperand))
      continue;
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

SmallVector<GridAxis> axesOfDim(Sharding sharding, int64_t dim) {
  SmallVector<GridAxis> axes;
  if (sharding && dim < static_cast<int64_t>(sharding.getSplitAxes().size()))
    llvm::append_range(axes, sharding.getSplitAxes()[dim].asArrayRef());
  return axes;
}

DenseI64ArrayAttr vocabShardAxes(MLIRContext *context,
                                 ArrayRef<GridAxis> axes) {
  return DenseI64ArrayAttr::get(
      context, llvm::map_to_vector(axes, [](GridAxis axis) {
        return static_cast<int64_t>(axis);
      }));
}

VocabStatistics buildVocabStatistics(OpBuilder &builder, Location loc,
                                     Value logits, Value labels,
                                     StringRef grid, ArrayRef<GridAxis> axes) {
  auto type = cast<RankedTensorType>(logits.getType());
  SmallVector<int64_t> rows(type.getShape().drop_back());
  Type f32 = builder.getF32Type();
  Value max = VocabMaxOp::create(builder, loc, RankedTensorType::get(rows, f32),
                                 logits);
  max = shard::AllReduceOp::create(builder, loc, max, grid, axes,
                                   shard::ReductionKind::Max);
  rows.push_back(2);
  Value partials = VocabPartialsOp::create(
      builder, loc, RankedTensorType::get(rows, f32), logits, labels, max,
      vocabShardAxes(builder.getContext(), axes));
  partials = shard::AllReduceOp::create(builder, loc, partials, grid, axes,
                                        shard::ReductionKind::Sum);
  return {max, partials};
}

FailureOr<Value> sumPartials(OpBuilder &builder, Operation *op, Value partial,
                             Sharding sharding, ArrayRef<GridAxis> axes,
                             Sharding result,
                             SymbolTableCollection &symbolTable) {
  auto type = cast<RankedTensorType>(partial.getType());
  int64_t scatterDim = -1;
  SmallVector<GridAxis> scatterAxes, reduceAxes(axes);
  if (result) {
    ArrayRef<shard::GridAxesAttr> split = result.getSplitAxes();
    for (int64_t dim = 0; dim < type.getRank() &&
                          dim < static_cast<int64_t>(split.size());
         ++dim) {
      // The dimension's leading axes that the sum does not run over are
      // the partial's own split of it (the sequence over the context axis,
      // then the tensor axis under sequence parallelism): the trailing
      // ones scatter.
      ArrayRef<GridAxis> dimAxes = split[dim].asArrayRef();
      while (!dimAxes.empty() && !llvm::is_contained(axes, dimAxes.front()))
        dimAxes = dimAxes.drop_front();
      if (dimAxes.empty() || !llvm::all_of(dimAxes, [&](GridAxis axis) {
            return llvm::is_contained(axes, axis);
          }))
        continue;
      scatterDim = dim;
      scatterAxes.assign(dimAxes.begin(), dimAxes.end());
      llvm::erase_if(reduceAxes, [&](GridAxis axis) {
        return llvm::is_contained(scatterAxes, axis);
      });
      break;
    }
  }
  StringRef grid = sharding.getGrid();
  Value sum = partial;
  if (!reduceAxes.empty())
    sum = shard::AllReduceOp::create(builder, op->getLoc(), sum, grid,
                                     reduceAxes, shard::ReductionKind::Sum);
  if (scatterDim < 0)
    return sum;
  FailureOr<int64_t> ranks = ranksAlong(op, sharding, scatterAxes, symbolTable);
  if (failed(ranks))
    return failure();
  SmallVector<int64_t> shape(type.getShape());
  shape[scatterDim] /= *ranks;
  return shard::ReduceScatterOp::create(
             builder, op->getLoc(),
             RankedTensorType::get(shape, type.getElementType()), grid,
             scatterAxes, sum, shard::ReductionKind::Sum,
             APInt(64, scatterDim))
      .getResult();
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

void recordGlobalTile(Operation *op, Value keyed, Sharding sharding,
                      IRMapping &partitionMap) {
  if (!sharding)
    return;
  ArrayRef<shard::GridAxesAttr> split = sharding.getSplitAxes();
  if (llvm::all_of(split, [](shard::GridAxesAttr axes) {
        return axes.empty();
      }))
    return;
  MLIRContext *context = op->getContext();
  SmallVector<Attribute> dims;
  for (int64_t d = 0; d < rankOf(keyed); ++d)
    dims.push_back(d < static_cast<int64_t>(split.size())
                       ? split[d]
                       : DenseI16ArrayAttr::get(context, {}));
  Operation *local = partitionMap.lookup(op->getResult(0)).getDefiningOp();
  local->setAttr("mt.split_axes", ArrayAttr::get(context, dims));
}

} // namespace mlir::mt::sharding

namespace mlir::mt::sharding {

/// Which of attention's tensors (operands, then results) run along the key
/// loop in their sequence dimension: k and v, and in the backward their
/// gradients.
static SmallVector<bool> keySide(Operation *op) {
  AffineExpr key = getAffineDimExpr(3, op->getContext());
  SmallVector<bool> side;
  for (AffineMap map : cast<shard::ShardingInterface>(op).getIndexingMaps())
    side.push_back(map.getNumResults() > 1 && map.getResult(1) == key);
  return side;
}

static std::optional<GridAxis> contextAxisOf(Operation *op) {
  auto axis = op->getAttrOfType<IntegerAttr>(kContextAxisAttrName);
  if (!axis)
    return std::nullopt;
  return static_cast<GridAxis>(axis.getInt());
}

static ArrayRef<GridAxis> sequenceSplitOf(Sharding sharding) {
  if (!sharding || sharding.getSplitAxes().size() < 2)
    return {};
  return sharding.getSplitAxes()[1].asArrayRef();
}

static Sharding withSequenceSplit(Sharding sharding, ArrayRef<GridAxis> axes) {
  MLIRContext *context = sharding.getGridAttr().getContext();
  SmallVector<shard::GridAxesAttr> split(sharding.getSplitAxes());
  if (split.size() < 2)
    split.resize(2, shard::GridAxesAttr::get(context, {}));
  split[1] = shard::GridAxesAttr::get(context, axes);
  while (!split.empty() && split.back().asArrayRef().empty())
    split.pop_back();
  return Sharding::get(sharding.getGridAttr(), split);
}

FailureOr<shard::ShardingOption>
getAttentionShardingOption(Operation *op, ArrayRef<Sharding> operandShardings,
                           ArrayRef<Sharding> resultShardings) {
  std::optional<GridAxis> axis = contextAxisOf(op);
  if (!axis)
    return shard::detail::defaultGetShardingOption(op, operandShardings,
                                                   resultShardings);
  // The keys' split along the context axis is not the key loop's: it is
  // the same split of the sequence as the queries', taken out of upstream's
  // reading and put back on the annotations.
  SmallVector<bool> side = keySide(op);
  Sharding keySplit;
  auto strip = [&](Sharding sharding, size_t index) {
    if (!side[index] || sequenceSplitOf(sharding) != ArrayRef<GridAxis>(*axis))
      return sharding;
    keySplit = sharding;
    return withSequenceSplit(sharding, {});
  };
  SmallVector<Sharding, 4> operands, results;
  for (auto [index, sharding] : llvm::enumerate(operandShardings))
    operands.push_back(strip(sharding, index));
  for (auto [index, sharding] : llvm::enumerate(resultShardings))
    results.push_back(strip(sharding, operandShardings.size() + index));
  FailureOr<shard::ShardingOption> option =
      shard::detail::defaultGetShardingOption(op, operands, results);
  if (failed(option) || !keySplit)
    return option;
  // Upstream marks the option empty when the last operand it reads has no
  // split (the stripped values); the keys' split is one.
  option->empty = false;
  if (!option->grid)
    option->grid = keySplit.getGridAttr();
  if (option->shardingArray.size() < 2)
    option->shardingArray.resize(2);
  bool used = llvm::any_of(option->shardingArray, [&](ArrayRef<GridAxis> axes) {
    return llvm::is_contained(axes, *axis);
  });
  // Keys split alone (propagation reaching the op from their side): the
  // queries take the same split of the sequence.
  if (option->shardingArray[1].empty() && !used)
    option->shardingArray[1].push_back(*axis);
  return option;
}

FailureOr<std::vector<Sharding>>
getAttentionShardingAnnotations(Operation *op,
                                const shard::ShardingOption &option) {
  FailureOr<std::vector<Sharding>> shardings =
      shard::detail::defaultGetShardingAnnotations(op, option);
  std::optional<GridAxis> axis = contextAxisOf(op);
  if (failed(shardings) || !axis || option.shardingArray.size() < 2 ||
      option.shardingArray[1] != ArrayRef<GridAxis>(*axis))
    return shardings;
  SmallVector<bool> side = keySide(op);
  size_t operands = op->getNumOperands();
  for (size_t index = 0; index < shardings->size(); ++index) {
    Sharding &sharding = (*shardings)[index];
    if (!side[index] || !sharding || !sequenceSplitOf(sharding).empty())
      continue;
    // Keys and values the IR already holds whole (gathered) stay whole: the
    // partition takes them as they are.
    FailureOr<std::pair<bool, Sharding>> annotated =
        index < operands ? shard::getSharding(op->getOpOperand(index))
                         : shard::getSharding(op->getResult(index - operands));
    if (succeeded(annotated) && annotated->second &&
        sequenceSplitOf(annotated->second).empty())
      continue;
    sharding = withSequenceSplit(sharding, {*axis});
  }
  return shardings;
}

LogicalResult addAttentionShardingAnnotations(
    Operation *op, OpBuilder &builder, const shard::ShardingOption &option) {
  FailureOr<std::vector<Sharding>> shardings =
      getAttentionShardingAnnotations(op, option);
  if (failed(shardings))
    return failure();
  for (OpResult result : op->getResults())
    shard::maybeInsertTargetShardingAnnotation(
        (*shardings)[op->getNumOperands() + result.getResultNumber()], result,
        builder);
  for (OpOperand &operand : op->getOpOperands()) {
    OpBuilder::InsertionGuard guard(builder);
    shard::maybeInsertSourceShardingAnnotation(
        (*shardings)[operand.getOperandNumber()], operand, builder);
  }
  return success();
}

bool recordContextLayout(Operation *op, Sharding sharding, int64_t sequenceDim,
                         IRMapping &partitionMap,
                         SymbolTableCollection &symbolTable,
                         OpBuilder &builder) {
  auto context = op->getAttrOfType<IntegerAttr>(kContextAxisAttrName);
  Operation *local = partitionMap.lookup(op->getResult(0)).getDefiningOp();
  local->removeAttr(kContextAxisAttrName);
  SmallVector<GridAxis> sequence = axesOfDim(sharding, sequenceDim);
  if (!context || sequence.empty() || sequence.front() != context.getInt())
    return false;
  shard::GridOp grid = shard::getGrid(
      op, FlatSymbolRefAttr::get(op->getContext(), sharding.getGrid()),
      symbolTable);
  local->setAttr(kContextAxisAttrName, context);
  local->setAttr(kContextSizeAttrName,
                 builder.getI64IntegerAttr(grid.getShape()[context.getInt()]));
  return true;
}

} // namespace mlir::mt::sharding
