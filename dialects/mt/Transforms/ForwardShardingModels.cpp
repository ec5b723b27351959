//===- ForwardShardingModels.cpp - How the forward mt ops are sharded -----===//
//
// Each op describes its iteration space to upstream shard with loop iterator
// types and indexing maps, as linalg's named ops do; sharding-propagation
// derives the shardings from them and shard-partition calls `partition`.
//
//===----------------------------------------------------------------------===//

#include "ShardingModelSupport.h"

#include "mt/IR/MtDialect.h"
#include "mt/Transforms/Passes.h"

using namespace mlir;
using namespace mlir::mt;
using namespace mlir::mt::sharding;

namespace {

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

  /// The input's row splits survive a conflict with the weight's: under
  /// sequence and data parallelism a column-parallel layer gathers the
  /// sequence (the axis its output uses) and keeps its data rank's batch.
  FailureOr<shard::ShardingOption>
  getShardingOption(Operation *op, ArrayRef<Sharding> operandShardings,
                    ArrayRef<Sharding> resultShardings) const {
    return splitSummedRows(op, operandShardings, resultShardings,
                           rankOf(op->getOperand(0)) - 1, operandShardings[0],
                           /*rowOperand=*/0);
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
    // What a layer's op becomes is in its layer.
    LayerScope layer(builder, getLayer(op));
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
    FailureOr<Value> summed = sumPartials(
        builder, op, partial, operandShardings[1], reductionAxes,
        resultShardings.empty() ? Sharding() : resultShardings[0],
        symbolTable);
    if (failed(summed))
      return failure();
    Value result = *summed;
    auto resultType = cast<RankedTensorType>(result.getType());
    if (linear.getBias())
      result = BiasAddOp::create(builder, op->getLoc(), resultType, result,
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
    // What a layer's op becomes is in its layer.
    LayerScope layer(builder, getLayer(op));
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

/// dropout: elementwise (upstream's model), and the partitioned op records
/// where its tile lies so that the mask is the global tensor's.
struct DropoutModel
    : public shard::ShardingInterface::ExternalModel<DropoutModel, DropoutOp> {
  SmallVector<IteratorType> getLoopIteratorTypes(Operation *op) const {
    return SmallVector<IteratorType>(rankOf(op->getOperand(0)),
                                     IteratorType::parallel);
  }

  SmallVector<AffineMap> getIndexingMaps(Operation *op) const {
    AffineMap identity = AffineMap::getMultiDimIdentityMap(
        rankOf(op->getOperand(0)), op->getContext());
    return {identity, identity};
  }

  LogicalResult partition(Operation *op, ArrayRef<Value> partitionedOperands,
                          ArrayRef<Sharding> operandShardings,
                          ArrayRef<Sharding> resultShardings,
                          IRMapping &partitionMap,
                          SymbolTableCollection &symbolTable,
                          OpBuilder &builder) const {
    // What a layer's op becomes is in its layer.
    LayerScope layer(builder, getLayer(op));
    shard::partitionTriviallyShardableOperation(
        *op, partitionedOperands, operandShardings, resultShardings,
        partitionMap, symbolTable, builder);
    recordGlobalTile(op, op->getOperand(0), operandShardings[0], partitionMap);
    // Context parallelism: the rows are a block of the load-balanced
    // sequence, whose mask positions the bundle maps through the layout.
    if (rankOf(op->getOperand(0)) >= 2)
      recordContextLayout(op, operandShardings[0], 1, partitionMap,
                          symbolTable, builder);
    else
      partitionMap.lookup(op->getResult(0))
          .getDefiningOp()
          ->removeAttr(kContextAxisAttrName);
    return success();
  }
};

/// position_ids: one parallel loop per dimension (batch, sequence). A
/// position depends only on its sequence index, so a batch shard is the
/// local op with the shard's shape; mt-annotate-shardings splits the batch
/// over the data-parallel ranks as it splits the tokens. A sequence shard
/// (sequence parallelism) records its tile (`mt.split_axes`), and each rank
/// makes the global positions of its part of the sequence.
struct PositionIdsModel
    : public shard::ShardingInterface::ExternalModel<PositionIdsModel,
                                                     PositionIdsOp> {
  SmallVector<IteratorType> getLoopIteratorTypes(Operation *op) const {
    return SmallVector<IteratorType>(rankOf(op->getResult(0)),
                                     IteratorType::parallel);
  }

  SmallVector<AffineMap> getIndexingMaps(Operation *op) const {
    return {AffineMap::getMultiDimIdentityMap(rankOf(op->getResult(0)),
                                              op->getContext())};
  }

  LogicalResult partition(Operation *op, ArrayRef<Value> partitionedOperands,
                          ArrayRef<Sharding> operandShardings,
                          ArrayRef<Sharding> resultShardings,
                          IRMapping &partitionMap,
                          SymbolTableCollection &symbolTable,
                          OpBuilder &builder) const {
    // What a layer's op becomes is in its layer.
    LayerScope layer(builder, getLayer(op));
    // Unannotated (no data parallelism): whole on every rank.
    if (resultShardings.empty() || !resultShardings[0]) {
      partitionMap.map(op->getResult(0), builder.clone(*op)->getResult(0));
      return success();
    }
    shard::partitionTriviallyShardableOperation(
        *op, partitionedOperands, operandShardings, resultShardings,
        partitionMap, symbolTable, builder);
    if (!axesOfDim(resultShardings[0], 1).empty())
      recordGlobalTile(op, op->getResult(0), resultShardings[0], partitionMap);
    // Context parallelism: the tile is a block of the load-balanced
    // sequence, whose positions the bundle's position_ids maps through the
    // layout (context_axis, context_size).
    auto context = op->getAttrOfType<IntegerAttr>(kContextAxisAttrName);
    Operation *local = partitionMap.lookup(op->getResult(0)).getDefiningOp();
    local->removeAttr(kContextAxisAttrName);
    if (context && llvm::is_contained(axesOfDim(resultShardings[0], 1),
                                      context.getInt())) {
      shard::GridOp grid = shard::getGrid(
          op, FlatSymbolRefAttr::get(op->getContext(),
                                     resultShardings[0].getGrid()),
          symbolTable);
      local->setAttr(kContextAxisAttrName, context);
      local->setAttr(kContextSizeAttrName,
                     builder.getI64IntegerAttr(
                         grid.getShape()[context.getInt()]));
    }
    return success();
  }
};

/// attention: see attentionIndexingMaps.
struct AttentionModel
    : public shard::ShardingInterface::ExternalModel<AttentionModel,
                                                     AttentionOp> {
  SmallVector<IteratorType> getLoopIteratorTypes(Operation *op) const {
    return attentionLoopIteratorTypes();
  }

  SmallVector<shard::ReductionKind>
  getReductionLoopIteratorKinds(Operation *op) const {
    return {shard::ReductionKind::Generic, shard::ReductionKind::Generic};
  }

  SmallVector<AffineMap> getIndexingMaps(Operation *op) const {
    return attentionIndexingMaps(op->getContext());
  }

  FailureOr<shard::ShardingOption>
  getShardingOption(Operation *op, ArrayRef<Sharding> operandShardings,
                    ArrayRef<Sharding> resultShardings) const {
    return getAttentionShardingOption(op, operandShardings, resultShardings);
  }

  FailureOr<std::vector<Sharding>>
  getShardingAnnotations(Operation *op,
                         const shard::ShardingOption &option) const {
    return getAttentionShardingAnnotations(op, option);
  }

  LogicalResult addShardingAnnotations(Operation *op, OpBuilder &builder,
                                       const shard::ShardingOption &option) const {
    return addAttentionShardingAnnotations(op, builder, option);
  }

  LogicalResult partition(Operation *op, ArrayRef<Value> partitionedOperands,
                          ArrayRef<Sharding> operandShardings,
                          ArrayRef<Sharding> resultShardings,
                          IRMapping &partitionMap,
                          SymbolTableCollection &symbolTable,
                          OpBuilder &builder) const {
    // What a layer's op becomes is in its layer.
    LayerScope layer(builder, getLayer(op));
    return partitionAttention(op, partitionedOperands, operandShardings,
                              resultShardings, partitionMap, symbolTable,
                              builder);
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
    // What a layer's op becomes is in its layer.
    LayerScope layer(builder, getLayer(op));
    // Context parallelism: a sequence split over the marked axis (first) is
    // a block of the load-balanced sequence, rotated by its global
    // positions, which the bundle's rope maps through the layout
    // (split_axes, context_axis, context_size) as position_ids does.
    auto context = op->getAttrOfType<IntegerAttr>(kContextAxisAttrName);
    Sharding sharding = operandShardings.front();
    SmallVector<GridAxis> sequence = axesOfDim(sharding, 1);
    bool contextSplit = context && !sequence.empty() &&
                        sequence.front() == context.getInt();
    if (sharding) {
      ArrayRef<shard::GridAxesAttr> split = sharding.getSplitAxes();
      for (size_t dim : {1, 3})
        if (dim < split.size() && !split[dim].empty() &&
            !(dim == 1 && contextSplit))
          return op->emitOpError()
                 << "can be partitioned along batch and heads only; dimension "
                 << dim
                 << " is sharded (a sequence split first over the context "
                    "axis that mt-annotate-shardings{context-parallel-size} "
                    "marks, "
                 << kContextAxisAttrName << ", is context parallelism)";
    }
    shard::partitionTriviallyShardableOperation(
        *op, partitionedOperands, operandShardings, resultShardings,
        partitionMap, symbolTable, builder);
    if (recordContextLayout(op, sharding, 1, partitionMap, symbolTable,
                            builder))
      recordGlobalTile(op, op->getOperand(0), sharding, partitionMap);
    return success();
  }
};

/// split and concat: one parallel loop per dimension, every operand and
/// result indexed alike. Any dimension but `axis` may be sharded; a sharded
/// `axis` would cut the pieces at other places than the global op does.
template <typename Op>
struct AxisPiecesModel
    : public shard::ShardingInterface::ExternalModel<AxisPiecesModel<Op>, Op> {
  static int64_t rank(Operation *op) {
    return isa<SplitOp>(op) ? rankOf(op->getOperand(0))
                            : rankOf(op->getResult(0));
  }

  SmallVector<IteratorType> getLoopIteratorTypes(Operation *op) const {
    return SmallVector<IteratorType>(rank(op), IteratorType::parallel);
  }

  SmallVector<AffineMap> getIndexingMaps(Operation *op) const {
    AffineMap identity =
        AffineMap::getMultiDimIdentityMap(rank(op), op->getContext());
    return SmallVector<AffineMap>(op->getNumOperands() + op->getNumResults(),
                                  identity);
  }

  LogicalResult partition(Operation *op, ArrayRef<Value> partitionedOperands,
                          ArrayRef<Sharding> operandShardings,
                          ArrayRef<Sharding> resultShardings,
                          IRMapping &partitionMap,
                          SymbolTableCollection &symbolTable,
                          OpBuilder &builder) const {
    // What a layer's op becomes is in its layer.
    LayerScope layer(builder, getLayer(op));
    int64_t axis = cast<Op>(op).getAxis();
    for (ArrayRef<Sharding> shardings : {operandShardings, resultShardings})
      for (Sharding sharding : shardings)
        if (failed(rejectSplit(op, sharding, axis, "the split axis")))
          return failure();
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
      // The other side merges the group's dimensions into one.
      bool mergedThere = fine && group.loops() > 1;
      for (int64_t dim = begin; dim < end; ++dim) {
        if (dim >= static_cast<int64_t>(split.size()) || split[dim].empty())
          continue;
        // A merged dimension's split lands on the group's leading loop.
        if (!fine && dim != begin)
          return failure();
        // Only the leading dimension of dimensions merged on the other side
        // keeps its split; the others are gathered first ([b, s, h] split
        // along the sequence, read as [b s, h] tokens: the MoE layer's).
        if (mergedThere && dim != begin)
          continue;
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
    // What a layer's op becomes is in its layer.
    LayerScope layer(builder, getLayer(op));
    shard::partitionTriviallyShardableOperation(
        *op, partitionedOperands, operandShardings, resultShardings,
        partitionMap, symbolTable, builder);
    return success();
  }
};

/// embedding: loops (ids..., hidden, vocabulary). Ids may be split (data and
/// sequence parallelism). A vocabulary-split table is Megatron-LM's
/// vocabulary-parallel embedding: each rank looks up the ids of its block
/// (zero rows for the others) and an all-reduce sums the ranks' rows.
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
    return {shard::ReductionKind::Sum};
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
    // What a layer's op becomes is in its layer.
    LayerScope layer(builder, getLayer(op));
    SmallVector<GridAxis> vocabulary = axesOfDim(operandShardings[0], 0);
    if (vocabulary.empty()) {
      shard::partitionTriviallyShardableOperation(
          *op, partitionedOperands, operandShardings, resultShardings,
          partitionMap, symbolTable, builder);
      return success();
    }
    // The rank's rows for every id it holds, summed over the vocabulary's
    // ranks (reduce-scattered under sequence parallelism).
    Value table = partitionedOperands[0], ids = partitionedOperands[1];
    auto idsType = cast<RankedTensorType>(ids.getType());
    SmallVector<int64_t> shape(idsType.getShape());
    shape.push_back(cast<RankedTensorType>(table.getType()).getDimSize(1));
    Value local = EmbeddingOp::create(
        builder, op->getLoc(),
        RankedTensorType::get(shape, cast<RankedTensorType>(table.getType())
                                         .getElementType()),
        table, ids, vocabShardAxes(op->getContext(), vocabulary));
    FailureOr<Value> summed = sumPartials(
        builder, op, local, operandShardings[0], vocabulary,
        resultShardings.empty() ? Sharding() : resultShardings[0],
        symbolTable);
    if (failed(summed))
      return failure();
    partitionMap.map(op->getResult(0), *summed);
    return success();
  }
};

/// cross_entropy: loops (rows..., vocabulary). Split logits' vocabulary (the
/// tied or untied output layer is column-parallel) gives Megatron-LM's
/// vocabulary-parallel cross-entropy (buildVocabStatistics). Rows may be
/// split (data parallelism): the loss of `sum` is all-reduced; that of `mean` is the
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
    // What a layer's op becomes is in its layer.
    LayerScope layer(builder, getLayer(op));
    auto loss = cast<CrossEntropyOp>(op);
    int64_t rows = rankOf(op->getOperand(1));
    Value result = op->getResult(0);
    SmallVector<GridAxis> vocabulary = axesOfDim(operandShardings[0], rows);
    if (vocabulary.empty()) {
      shard::partitionTriviallyShardableOperation(
          *op, partitionedOperands, operandShardings, resultShardings,
          partitionMap, symbolTable, builder);
    } else {
      // Megatron-LM's vocabulary-parallel cross-entropy.
      Value labels = partitionedOperands[1];
      VocabStatistics statistics = buildVocabStatistics(
          builder, op->getLoc(), partitionedOperands[0], labels,
          operandShardings[0].getGrid(), vocabulary);
      FailureOr<RankedTensorType> type = inferCrossEntropyType(
          cast<RankedTensorType>(statistics.partials.getType()),
          cast<RankedTensorType>(labels.getType()), loss.getReduction(),
          [&] { return op->emitOpError(); });
      if (failed(type))
        return failure();
      partitionMap.map(result, VocabCrossEntropyOp::create(
                                   builder, op->getLoc(), *type,
                                   statistics.partials, labels,
                                   loss.getReductionAttr(),
                                   loss.getIgnoreIndexAttr()));
    }
    SmallVector<GridAxis> axes = axesOfLeadingDims(operandShardings[0], rows);
    if (perToken(op) || axes.empty())
      return success();
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

/// mt.scale: elementwise over its input, the scalar factor on every rank.
struct ScaleModel
    : public shard::ShardingInterface::ExternalModel<ScaleModel, ScaleOp> {
  SmallVector<IteratorType> getLoopIteratorTypes(Operation *op) const {
    return SmallVector<IteratorType>(rankOf(op->getOperand(0)),
                                     IteratorType::parallel);
  }
  SmallVector<AffineMap> getIndexingMaps(Operation *op) const {
    int64_t rank = rankOf(op->getOperand(0));
    MLIRContext *context = op->getContext();
    AffineMap each = AffineMap::getMultiDimIdentityMap(rank, context);
    return {each, AffineMap::get(rank, 0, {}, context), each};
  }
  LogicalResult partition(Operation *op, ArrayRef<Value> partitionedOperands,
                          ArrayRef<Sharding> operandShardings,
                          ArrayRef<Sharding> resultShardings,
                          IRMapping &partitionMap,
                          SymbolTableCollection &symbolTable,
                          OpBuilder &builder) const {
    LayerScope layer(builder, getLayer(op));
    shard::partitionTriviallyShardableOperation(
        *op, partitionedOperands, operandShardings, resultShardings,
        partitionMap, symbolTable, builder);
    return success();
  }
};

/// Ops whose operands and results every rank holds whole: fills and
/// softmax. Upstream partitions them as
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

SmallVector<IteratorType> sharding::attentionLoopIteratorTypes() {
  return {IteratorType::parallel,  IteratorType::parallel,
          IteratorType::parallel,  IteratorType::reduction,
          IteratorType::reduction, IteratorType::parallel};
}

/// attention: loops (batch, query, head, key, head_dim, value_dim); the
/// key/value head dimension shares the head loop, whose grouped-query
/// shards keep whole groups together when the head counts divide.
SmallVector<AffineMap> sharding::attentionIndexingMaps(MLIRContext *context) {
  auto d = [&](unsigned i) { return getAffineDimExpr(i, context); };
  auto map = [&](ArrayRef<AffineExpr> exprs) {
    return AffineMap::get(6, 0, exprs, context);
  };
  return {map({d(0), d(1), d(2), d(4)}), map({d(0), d(3), d(2), d(4)}),
          map({d(0), d(3), d(2), d(5)}), map({d(0), d(1), d(2), d(5)})};
}

/// The grid axes splitting dimension `dim` of a tensor of `sharding`.
static ArrayRef<int16_t> splitOf(Sharding sharding, size_t dim) {
  if (!sharding || dim >= sharding.getSplitAxes().size())
    return {};
  return sharding.getSplitAxes()[dim].asArrayRef();
}

/// Context parallelism (docs/Parallelism.md, "Context parallelism"): the
/// rank's queries (its two load-balanced chunks) against every rank's keys
/// and values, positions and the causal mask from the layout.
///
/// all_gather (Megatron-LM's --cp-comm-type all_gather): every rank's keys
/// and values gathered in rank order, one block; the backward recomputes
/// its logsumexp, and the keys' and values' gradients, summed over the
/// ranks whose queries saw them, are reduce-scattered to their owners.
///
/// p2p (the ring): step s holds rank (r - s)'s keys and values, passed on
/// by a shard.shift of one place per step, and merges its block into the
/// running output and logsumexp. The backward recomputes the merged
/// logsumexp the same way, then runs the steps again: dq sums on the rank,
/// and the keys' and values' gradients travel with their block, each rank
/// adding its term, and a last shift returns them to their owners.
///
/// When propagation already gathered the keys and values (upstream
/// replicates the key loop's operands against a split query loop, in rank
/// order, which is the gathered block's order), the block takes them as
/// they are, whatever the exchange, and the backward sums their gradients
/// over the context axis as the results' shardings ask (all_reduce for a
/// whole result, reduce_scatter for a split one).
static LogicalResult partitionContextParallelAttention(
    Operation *op, int16_t contextAxis, bool ring, bool keysGathered,
    ArrayRef<Value> partitionedOperands, ArrayRef<Sharding> operandShardings,
    ArrayRef<Sharding> resultShardings, IRMapping &partitionMap,
    SymbolTableCollection &symbolTable, OpBuilder &builder) {
  ring = ring && !keysGathered;
  const bool grad = isa<AttentionGradOp>(op);
  const unsigned q = grad ? 1 : 0;
  Location loc = op->getLoc();
  StringRef gridName = operandShardings[q].getGrid();
  shard::GridOp grid = shard::getGrid(
      op, FlatSymbolRefAttr::get(op->getContext(), gridName), symbolTable);
  int64_t cp = grid.getShape()[contextAxis];
  ArrayRef<shard::GridAxis> axes(contextAxis);
  auto gather = [&](Value local) -> Value {
    auto type = cast<RankedTensorType>(local.getType());
    SmallVector<int64_t> shape(type.getShape());
    shape[1] *= cp;
    return shard::AllGatherOp::create(
        builder, loc, RankedTensorType::get(shape, type.getElementType()),
        gridName, axes, local, APInt(64, 1));
  };
  auto shift = [&](Value local) -> Value {
    return shard::ShiftOp::create(builder, loc, local.getType(), gridName,
                                  axes, local, APInt(64, contextAxis),
                                  /*offset=*/1, /*rotate=*/true);
  };
  Value query = partitionedOperands[q];
  auto queryType = cast<RankedTensorType>(query.getType());
  auto valueType =
      cast<RankedTensorType>(partitionedOperands[q + 2].getType());
  // [b, s, hq, dv] and the f32 logsumexp [b, hq, s].
  auto outType = RankedTensorType::get(
      {queryType.getDimSize(0), queryType.getDimSize(1),
       queryType.getDimSize(2), valueType.getDimSize(3)},
      queryType.getElementType());
  auto statsType = RankedTensorType::get({queryType.getDimSize(0),
                                          queryType.getDimSize(2),
                                          queryType.getDimSize(1)},
                                         builder.getF32Type());
  auto causal = op->getAttrOfType<UnitAttr>("causal");
  auto scale = op->getAttrOfType<FloatAttr>("scale");
  auto dropout = op->getAttrOfType<FloatAttr>("dropout_p");
  auto seed = op->getAttrOfType<IntegerAttr>("seed");
  if (!dropout)
    dropout = builder.getF64FloatAttr(0.0);
  if (!seed)
    seed = builder.getI64IntegerAttr(0);
  IntegerAttr axisAttr = builder.getI64IntegerAttr(contextAxis);
  IntegerAttr sizeAttr = builder.getI64IntegerAttr(cp);
  // The dropout's batch and head offsets, as on the whole op.
  auto tile = [&](Operation *local) {
    if (dropout.getValueAsDouble() <= 0)
      return;
    SmallVector<Attribute> dims;
    for (size_t d = 0; d < 4; ++d)
      dims.push_back(DenseI16ArrayAttr::get(op->getContext(),
                                            splitOf(operandShardings[q], d)));
    local->setAttr("mt.split_axes", ArrayAttr::get(op->getContext(), dims));
  };

  // The key and value blocks: one gathered, or one per ring step.
  SmallVector<Value> keys, values;
  SmallVector<IntegerAttr> steps;
  if (ring) {
    keys.push_back(partitionedOperands[q + 1]);
    values.push_back(partitionedOperands[q + 2]);
    for (int64_t step = 1; step < cp; ++step) {
      keys.push_back(shift(keys.back()));
      values.push_back(shift(values.back()));
    }
    for (int64_t step = 0; step < cp; ++step)
      steps.push_back(builder.getI64IntegerAttr(step));
  } else if (keysGathered) {
    keys.push_back(partitionedOperands[q + 1]);
    values.push_back(partitionedOperands[q + 2]);
    steps.push_back(IntegerAttr());
  } else {
    keys.push_back(gather(partitionedOperands[q + 1]));
    values.push_back(gather(partitionedOperands[q + 2]));
    steps.push_back(IntegerAttr());
  }
  // The forward, merged over the blocks (recomputed in the backward).
  Value out, stats;
  for (auto [key, value, step] : llvm::zip_equal(keys, values, steps)) {
    auto block = AttentionBlockOp::create(builder, loc, outType, statsType,
                                          query, key, value, causal, scale,
                                          dropout, seed, axisAttr, sizeAttr,
                                          step);
    tile(block);
    if (!out) {
      out = block.getResult();
      stats = block.getLogsumexp();
      continue;
    }
    auto merge = AttentionMergeOp::create(builder, loc, outType, statsType,
                                          out, stats, block.getResult(),
                                          block.getLogsumexp());
    out = merge.getResult();
    stats = merge.getResultLogsumexp();
  }
  if (!grad) {
    partitionMap.map(op->getResult(0), out);
    return success();
  }
  Value outputGrad = partitionedOperands[0];
  Value delta =
      AttentionDeltaOp::create(builder, loc, statsType, out, outputGrad);
  Value queryGrad, keyGrad, valueGrad;
  for (auto [key, value, step] : llvm::zip_equal(keys, values, steps)) {
    auto blockGrad = AttentionBlockGradOp::create(
        builder, loc, queryType, key.getType(), value.getType(), outputGrad,
        query, key, value, stats, delta, causal, scale, dropout, seed,
        axisAttr, sizeAttr, step);
    tile(blockGrad);
    if (!queryGrad) {
      queryGrad = blockGrad.getQueryGrad();
      keyGrad = blockGrad.getKeyGrad();
      valueGrad = blockGrad.getValueGrad();
      continue;
    }
    // The running block gradients move on with their block.
    queryGrad = AddOp::create(builder, loc, queryGrad.getType(), queryGrad,
                              blockGrad.getQueryGrad());
    keyGrad = AddOp::create(builder, loc, keyGrad.getType(), shift(keyGrad),
                            blockGrad.getKeyGrad());
    valueGrad = AddOp::create(builder, loc, valueGrad.getType(),
                              shift(valueGrad), blockGrad.getValueGrad());
  }
  if (ring) {
    // Step cp - 1 holds rank (r + 1)'s block: one more place home.
    keyGrad = shift(keyGrad);
    valueGrad = shift(valueGrad);
  } else {
    auto scatter = [&](Value gathered, Value like) -> Value {
      auto type = cast<RankedTensorType>(gathered.getType());
      SmallVector<int64_t> shape(type.getShape());
      shape[1] /= cp;
      Type local = like ? like.getType()
                        : RankedTensorType::get(shape, type.getElementType());
      return shard::ReduceScatterOp::create(builder, loc, local, gridName,
                                            axes, gathered,
                                            shard::ReductionKind::Sum,
                                            APInt(64, 1));
    };
    auto sum = [&](Value gathered, unsigned result) -> Value {
      // A rank's queries saw every key: its term of the gradient is partial.
      if (!keysGathered || !splitOf(resultShardings[result], 1).empty())
        return scatter(gathered, keysGathered ? Value() : partitionedOperands[result + 1]);
      return shard::AllReduceOp::create(builder, loc, gathered.getType(),
                                        gridName, axes, gathered,
                                        shard::ReductionKind::Sum);
    };
    keyGrad = sum(keyGrad, 1);
    valueGrad = sum(valueGrad, 2);
  }
  partitionMap.map(op->getResult(0), queryGrad);
  partitionMap.map(op->getResult(1), keyGrad);
  partitionMap.map(op->getResult(2), valueGrad);
  return success();
}

/// Causal masks and softmax need whole sequences and head dimensions, or
/// under context parallelism the sequence split alike over one grid axis
/// for every operand (the queries, keys and values of a rank's chunks).
LogicalResult sharding::partitionAttention(
    Operation *op, ArrayRef<Value> partitionedOperands,
    ArrayRef<Sharding> operandShardings, ArrayRef<Sharding> resultShardings,
    IRMapping &partitionMap, SymbolTableCollection &symbolTable,
    OpBuilder &builder) {
  // The queries (and the output's gradient, and dq, and the output) split
  // over the context axis; the keys and values alike, or already gathered
  // by propagation (and their gradients whole or split).
  const bool grad = isa<AttentionGradOp>(op);
  const unsigned q = grad ? 1 : 0;
  ArrayRef<int16_t> sequence = splitOf(operandShardings[q], 1);
  ArrayRef<int16_t> keySequence = splitOf(operandShardings[q + 1], 1);
  bool keysGathered = keySequence.empty();
  bool sameSequence =
      (keysGathered || keySequence == sequence) &&
      splitOf(operandShardings[q + 2], 1) == keySequence &&
      (!grad || splitOf(operandShardings[0], 1) == sequence);
  bool resultsAlike =
      !resultShardings.empty() && splitOf(resultShardings[0], 1) == sequence;
  if (grad)
    for (unsigned r : {1u, 2u})
      resultsAlike &= r < resultShardings.size() &&
                      (splitOf(resultShardings[r], 1) == sequence ||
                       (keysGathered && splitOf(resultShardings[r], 1).empty()));
  // Only the axis mt-annotate-shardings made the context axis holds the
  // load-balanced chunks whose positions attention_block assumes; another
  // sequence split (a plain block of it) is refused below.
  auto contextAxis = op->getAttrOfType<IntegerAttr>(kContextAxisAttrName);
  // Megatron-LM's default exchange is the ring.
  auto exchange = op->getAttrOfType<StringAttr>(kContextExchangeAttrName);
  bool ring = !exchange || exchange.getValue() != "all_gather";
  if (contextAxis && sequence.size() == 1 &&
      sequence.front() == contextAxis.getInt() && sameSequence &&
      resultsAlike &&
      llvm::all_of(operandShardings, [](Sharding sharding) {
        return splitOf(sharding, 3).empty();
      }))
    return partitionContextParallelAttention(
        op, sequence.front(), ring, keysGathered, partitionedOperands,
        operandShardings, resultShardings, partitionMap, symbolTable, builder);
  for (Sharding sharding : operandShardings) {
    if (!sharding)
      continue;
    ArrayRef<shard::GridAxesAttr> split = sharding.getSplitAxes();
    for (size_t dim = 1; dim < split.size(); ++dim)
      if (dim != 2 && !split[dim].empty())
        return op->emitOpError()
               << "can be partitioned along batch and heads only; dimension "
               << dim
               << " is sharded (a sequence split alike for the queries, keys "
                  "and values over the context axis that "
                  "mt-annotate-shardings{context-parallel-size} marks, "
               << kContextAxisAttrName << ", is context parallelism)";
  }
  shard::partitionTriviallyShardableOperation(
      *op, partitionedOperands, operandShardings, resultShardings,
      partitionMap, symbolTable, builder);
  // The dropout mask over the probabilities is keyed on q's global batch
  // rows and heads (attention_grad's q is its operand 1).
  auto dropout = op->getAttrOfType<FloatAttr>("dropout_p");
  if (dropout && dropout.getValueAsDouble() > 0) {
    unsigned q = isa<AttentionGradOp>(op) ? 1 : 0;
    recordGlobalTile(op, op->getOperand(q), operandShardings[q], partitionMap);
  }
  return success();
}

void sharding::attachForwardShardingModels(MLIRContext *context) {
  AddOp::attachInterface<shard::ElementwiseShardingInterface<AddOp>>(*context);
  MulOp::attachInterface<shard::ElementwiseShardingInterface<MulOp>>(*context);
  GeluOp::attachInterface<shard::ElementwiseShardingInterface<GeluOp>>(
      *context);
  SiluOp::attachInterface<shard::ElementwiseShardingInterface<SiluOp>>(
      *context);
  SwigluOp::attachInterface<shard::ElementwiseShardingInterface<SwigluOp>>(
      *context);
  DropoutOp::attachInterface<DropoutModel>(*context);
  LinearOp::attachInterface<LinearModel>(*context);
  LayerNormOp::attachInterface<LastDimModel<LayerNormOp>>(*context);
  RmsNormOp::attachInterface<LastDimModel<RmsNormOp>>(*context);
  BiasAddOp::attachInterface<LastDimModel<BiasAddOp>>(*context);
  AttentionOp::attachInterface<AttentionModel>(*context);
  RopeOp::attachInterface<RopeModel>(*context);
  ReshapeOp::attachInterface<ReshapeModel>(*context);
  SplitOp::attachInterface<AxisPiecesModel<SplitOp>>(*context);
  ConcatOp::attachInterface<AxisPiecesModel<ConcatOp>>(*context);
  EmbeddingOp::attachInterface<EmbeddingModel>(*context);
  CrossEntropyOp::attachInterface<CrossEntropyModel>(*context);
  // Softmax and its gradient stay whole on every rank; no model uses them.
  SoftmaxOp::attachInterface<ReplicatedModel<SoftmaxOp>>(*context);
  SoftmaxGradOp::attachInterface<ReplicatedModel<SoftmaxGradOp>>(*context);
  FillOp::attachInterface<ReplicatedModel<FillOp>>(*context);
  ScaleOp::attachInterface<ScaleModel>(*context);
  PositionIdsOp::attachInterface<PositionIdsModel>(*context);
}
