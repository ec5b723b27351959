//===- BackwardShardingModels.cpp - How the backward mt ops are sharded ---===//
//
// The backward ops sum over the loops their forward op runs in parallel
// (rows of a weight gradient, positions of an embedding gradient): a split
// of those loops leaves partial sums, which these models all-reduce. This is
// where data parallelism's gradient reduction comes from.
//
//===----------------------------------------------------------------------===//

#include "ShardingModelSupport.h"

#include "mt/IR/MtDialect.h"
#include "mt/Transforms/Passes.h"

#include "mlir/Dialect/Tensor/IR/Tensor.h"

using namespace mlir;
using namespace mlir::mt;
using namespace mlir::mt::sharding;

namespace {

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

  /// Propagation also asks without an operand's annotation. An operand
  /// whose feature dimension (in or out) is split keeps its split: the
  /// gradient is then the rank's block of the weight, and the other
  /// operand's conflicting sequence split is gathered (Megatron-LM's
  /// sequence parallelism). Dropping it instead would make every rank
  /// compute the whole weight's gradient from sequence shards and
  /// redistribute the split operand (an all-to-all), then all-reduce the
  /// whole gradient (the tied output layer of GPT-2).
  FailureOr<shard::ShardingOption>
  getShardingOption(Operation *op, ArrayRef<Sharding> operandShardings,
                    ArrayRef<Sharding> resultShardings) const {
    int64_t rows = rankOf(op->getOperand(0)) - 1;
    for (int64_t i = 0; i < 2; ++i) {
      if (operandShardings[i])
        continue;
      FailureOr<std::pair<bool, Sharding>> annotated =
          shard::getSharding(op->getOpOperand(i));
      if (succeeded(annotated) && !axesOfDim(annotated->second, rows).empty())
        return failure();
    }
    return splitSummedRows(op, operandShardings, resultShardings, rows,
                           operandShardings[0] ? operandShardings[0]
                                               : operandShardings[1]);
  }

  LogicalResult partition(Operation *op, ArrayRef<Value> partitionedOperands,
                          ArrayRef<Sharding> operandShardings,
                          ArrayRef<Sharding> resultShardings,
                          IRMapping &partitionMap,
                          SymbolTableCollection &symbolTable,
                          OpBuilder &builder) const {
    // What a layer's op becomes is in its layer.
    LayerScope layer(builder, getLayer(op));
    return partitionSummingReductions(op, partitionedOperands,
                                      operandShardings, resultShardings,
                                      partitionMap, symbolTable, builder);
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
    // What a layer's op becomes is in its layer.
    LayerScope layer(builder, getLayer(op));
    return partitionSummingReductions(op, partitionedOperands,
                                      operandShardings, resultShardings,
                                      partitionMap, symbolTable, builder);
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
    // What a layer's op becomes is in its layer.
    LayerScope layer(builder, getLayer(op));
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
    return attentionLoopIteratorTypes();
  }

  SmallVector<shard::ReductionKind>
  getReductionLoopIteratorKinds(Operation *op) const {
    return {shard::ReductionKind::Generic, shard::ReductionKind::Generic};
  }

  SmallVector<AffineMap> getIndexingMaps(Operation *op) const {
    // attention's maps are q, k, v, out; the backward reads out's gradient
    // first and yields q's, k's and v's.
    SmallVector<AffineMap> forward = attentionIndexingMaps(op->getContext());
    return {forward[3], forward[0], forward[1], forward[2],
            forward[0], forward[1], forward[2]};
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

/// Positions that shard-partition gathered (`shard.all_gather` of a local
/// `mt.position_ids`) made again at the gathered layout: every rank can
/// make any tile's positions, so nothing integer travels (the runtime
/// gathers floating-point tensors only). The tile drops the gathered axes
/// from its split (they are the split's last ones), and keeps its context
/// layout while the sequence's split still starts on the context axis. Any
/// other value is returned as it is.
static Value remakeGatheredPositions(Value ids, OpBuilder &builder) {
  // Upstream's resharding ends in a tensor.cast to the static type.
  Value source = ids;
  while (auto cast = source.getDefiningOp<tensor::CastOp>())
    source = cast.getSource();
  auto gather = source.getDefiningOp<shard::AllGatherOp>();
  auto positions = gather ? gather.getInput().getDefiningOp<PositionIdsOp>()
                          : PositionIdsOp();
  if (!positions)
    return ids;
  int64_t dim = gather.getGatherAxis().getSExtValue();
  auto split = positions->getAttrOfType<ArrayAttr>("mt.split_axes");
  if (!split || dim >= static_cast<int64_t>(split.size()))
    return ids;
  SmallVector<Attribute> dims(split.begin(), split.end());
  auto axes = dyn_cast<DenseI16ArrayAttr>(dims[dim]);
  ArrayRef<GridAxis> gathered = gather.getGridAxes();
  if (!axes || axes.size() < static_cast<int64_t>(gathered.size()) ||
      axes.asArrayRef().take_back(gathered.size()) != gathered)
    return ids;
  ArrayRef<int16_t> kept = axes.asArrayRef().drop_back(gathered.size());
  MLIRContext *context = builder.getContext();
  dims[dim] = DenseI16ArrayAttr::get(context, kept);
  auto remade = PositionIdsOp::create(
      builder, gather.getLoc(), cast<RankedTensorType>(ids.getType()));
  remade->setAttrs(positions->getAttrDictionary());
  if (llvm::any_of(dims, [](Attribute d) {
        return !cast<DenseI16ArrayAttr>(d).empty();
      }))
    remade->setAttr("mt.split_axes", ArrayAttr::get(context, dims));
  else
    remade->removeAttr("mt.split_axes");
  auto contextAxis = positions->getAttrOfType<IntegerAttr>(kContextAxisAttrName);
  auto sequence = cast<DenseI16ArrayAttr>(dims.back());
  if (contextAxis &&
      (sequence.empty() || sequence[0] != contextAxis.getInt())) {
    remade->removeAttr(kContextAxisAttrName);
    remade->removeAttr(kContextSizeAttrName);
  }
  return remade.getResult();
}

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
    // What a layer's op becomes is in its layer.
    LayerScope layer(builder, getLayer(op));
    // Sequence parallelism leaves the output gradient split along the
    // sequence where the ids are whole: gather it first (the backward of
    // the embedding's reduce-scatter, as in Megatron-LM).
    SmallVector<Value> operands(partitionedOperands);
    // Upstream's clone reads the operands from partitionMap, so positions
    // made again are mapped there (the ids' annotation for this user is
    // its own value).
    Value positions = remakeGatheredPositions(operands[1], builder);
    if (positions != operands[1]) {
      operands[1] = positions;
      partitionMap.map(op->getOperand(1), positions);
    }
    int64_t idRank = rankOf(op->getOperand(1));
    // Ids that reach here whole though their sharding splits them (position
    // ids, which every rank makes whole) are sliced to their shard.
    for (int64_t dim = 0; dim < idRank; ++dim) {
      SmallVector<GridAxis> idAxes = axesOfDim(operandShardings[1], dim);
      auto type = cast<RankedTensorType>(operands[1].getType());
      if (idAxes.empty() ||
          type.getDimSize(dim) !=
              cast<RankedTensorType>(op->getOperand(1).getType())
                  .getDimSize(dim))
        continue;
      FailureOr<int64_t> ranks =
          ranksAlong(op, operandShardings[1], idAxes, symbolTable);
      if (failed(ranks))
        return failure();
      SmallVector<int64_t> shape(type.getShape());
      shape[dim] /= *ranks;
      operands[1] = shard::AllSliceOp::create(
          builder, op->getLoc(),
          RankedTensorType::get(shape, type.getElementType()),
          operandShardings[1].getGrid(), idAxes, operands[1], APInt(64, dim));
    }
    for (int64_t dim = 0; dim < idRank; ++dim) {
      SmallVector<GridAxis> gradAxes = axesOfDim(operandShardings[0], dim);
      SmallVector<GridAxis> idAxes = axesOfDim(operandShardings[1], dim);
      SmallVector<GridAxis> extra;
      for (GridAxis axis : gradAxes)
        if (!llvm::is_contained(idAxes, axis))
          extra.push_back(axis);
      if (extra.empty())
        continue;
      FailureOr<int64_t> ranks =
          ranksAlong(op, operandShardings[0], extra, symbolTable);
      if (failed(ranks))
        return failure();
      auto type = cast<RankedTensorType>(operands[0].getType());
      SmallVector<int64_t> shape(type.getShape());
      shape[dim] *= *ranks;
      operands[0] = shard::AllGatherOp::create(
          builder, op->getLoc(),
          RankedTensorType::get(shape, type.getElementType()),
          operandShardings[0].getGrid(), extra, operands[0], APInt(64, dim));
    }
    partitionSummingShards(
        op, operands, operandShardings, resultShardings,
        partitionMap, symbolTable, builder,
        axesOfLeadingDims(operandShardings[1], rankOf(op->getOperand(1))),
        operandShardings[1] ? operandShardings[1].getGrid() : StringRef());
    // A vocabulary-split table's gradient is the rank's block: the local op
    // (under the data-parallel all-reduce, if any) keeps its rows only.
    SmallVector<GridAxis> vocabulary =
        resultShardings.empty() ? SmallVector<GridAxis>()
                                : axesOfDim(resultShardings[0], 0);
    if (vocabulary.empty())
      return success();
    Operation *local = partitionMap.lookup(op->getResult(0)).getDefiningOp();
    if (isa<shard::AllReduceOp>(local))
      local = local->getOperand(0).getDefiningOp();
    local->setAttr("vocab_shard_axes",
                   vocabShardAxes(op->getContext(), vocabulary));
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
    // What a layer's op becomes is in its layer.
    LayerScope layer(builder, getLayer(op));
    auto grad = cast<CrossEntropyGradOp>(op);
    int64_t rows = rankOf(grad.getLogits()) - 1;
    Value lossGrad;
    SmallVector<GridAxis> axes = axesOfLeadingDims(operandShardings[1], rows);
    if (grad.getReduction() == LossReduction::Mean && !axes.empty()) {
      FailureOr<int64_t> ranks =
          ranksAlong(op, operandShardings[1], axes, symbolTable);
      if (failed(ranks))
        return failure();
      Type type = partitionedOperands[0].getType();
      Value scale = FillOp::create(builder, op->getLoc(), type,
                                   builder.getF64FloatAttr(1.0 / *ranks));
      lossGrad = MulOp::create(builder, op->getLoc(), type,
                               partitionedOperands[0], scale);
    }
    SmallVector<GridAxis> vocabulary = axesOfDim(operandShardings[1], rows);
    if (!vocabulary.empty()) {
      // Megatron-LM's vocabulary-parallel cross-entropy backward: the
      // statistics again (as the forward pass), then the block's gradient.
      Value logits = partitionedOperands[1], labels = partitionedOperands[2];
      VocabStatistics statistics =
          buildVocabStatistics(builder, op->getLoc(), logits, labels,
                               operandShardings[1].getGrid(), vocabulary);
      partitionMap.map(
          op->getResult(0),
          VocabCrossEntropyGradOp::create(
              builder, op->getLoc(), logits.getType(),
              lossGrad ? lossGrad : partitionedOperands[0], logits, labels,
              statistics.max, statistics.partials, grad.getReductionAttr(),
              grad.getIgnoreIndexAttr(),
              vocabShardAxes(op->getContext(), vocabulary)));
      return success();
    }
    shard::partitionTriviallyShardableOperation(
        *op, partitionedOperands, operandShardings, resultShardings,
        partitionMap, symbolTable, builder);
    // The clone reads its operands through the partition map; give it the
    // scaled loss gradient.
    if (lossGrad)
      partitionMap.lookup(op->getResult(0)).getDefiningOp()->setOperand(
          0, lossGrad);
    return success();
  }
};

} // namespace

void sharding::attachBackwardShardingModels(MLIRContext *context) {
  GeluGradOp::attachInterface<shard::ElementwiseShardingInterface<GeluGradOp>>(
      *context);
  SiluGradOp::attachInterface<shard::ElementwiseShardingInterface<SiluGradOp>>(
      *context);
  SwigluGradOp::attachInterface<
      shard::ElementwiseShardingInterface<SwigluGradOp>>(*context);
  LinearWeightGradOp::attachInterface<LinearWeightGradModel>(*context);
  BiasGradOp::attachInterface<BiasGradModel>(*context);
  LayerNormGradOp::attachInterface<NormGradModel<LayerNormGradOp>>(*context);
  RmsNormGradOp::attachInterface<NormGradModel<RmsNormGradOp>>(*context);
  AttentionGradOp::attachInterface<AttentionGradModel>(*context);
  EmbeddingGradOp::attachInterface<EmbeddingGradModel>(*context);
  CrossEntropyGradOp::attachInterface<CrossEntropyGradModel>(*context);
}
