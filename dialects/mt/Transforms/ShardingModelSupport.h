//===- ShardingModelSupport.h - What the mt sharding models share -*- C++ -*-===//
//
// Private to dialects/mt/Transforms: the helpers of the ShardingInterface
// models of the forward ops (ForwardShardingModels.cpp) and the backward ops
// (BackwardShardingModels.cpp).
//
//===----------------------------------------------------------------------===//

#ifndef MT_TRANSFORMS_SHARDINGMODELSUPPORT_H
#define MT_TRANSFORMS_SHARDINGMODELSUPPORT_H

#include "mt/IR/MtOps.h"
#include "mt/IR/MtShapeRules.h"

#include "mlir/Dialect/Shard/IR/ShardOps.h"
#include "mlir/Dialect/Shard/Interfaces/ShardingInterface.h"
#include "mlir/Dialect/Shard/Interfaces/ShardingInterfaceImpl.h"
#include "mlir/Dialect/Utils/StructuredOpsUtils.h"
#include "mlir/IR/AffineMap.h"
#include "mlir/IR/IRMapping.h"

namespace mlir::mt::sharding {

using shard::GridAxis;
using shard::Sharding;
using utils::IteratorType;

/// The data-parallel axis of mt-annotate-shardings' grids ([dp, tp],
/// [dp, cp, tp]).
inline constexpr GridAxis kDataGridAxis = 0;

int64_t rankOf(Value value);

/// The grid axes that shard loops of `op` whose index does not reach a
/// result: summing over them needs an all-reduce.
SmallVector<GridAxis> reductionAxes(shard::ShardingInterface op,
                                    ArrayRef<Sharding> operandShardings,
                                    ArrayRef<Sharding> resultShardings);

/// Partitions `op` into the local op and, where a summed loop is sharded, an
/// all-reduce of each result.
void partitionSummingShards(Operation *op, ArrayRef<Value> partitionedOperands,
                            ArrayRef<Sharding> operandShardings,
                            ArrayRef<Sharding> resultShardings,
                            IRMapping &partitionMap,
                            SymbolTableCollection &symbolTable,
                            OpBuilder &builder, ArrayRef<GridAxis> axes,
                            StringRef grid);

/// partitionSummingShards over the op's sharded reduction loops: the
/// partition of ops whose reductions are sums (weight and bias gradients).
LogicalResult partitionSummingReductions(Operation *op,
                                         ArrayRef<Value> partitionedOperands,
                                         ArrayRef<Sharding> operandShardings,
                                         ArrayRef<Sharding> resultShardings,
                                         IRMapping &partitionMap,
                                         SymbolTableCollection &symbolTable,
                                         OpBuilder &builder);

/// The default sharding option, with the row loops (the first `rows`) also
/// split as `rowSource`'s leading dimensions are (see the definition). A
/// null `rowSource` is read from the IR: operand `rowOperand`'s annotation,
/// or (-1) the first annotated operand's.
FailureOr<shard::ShardingOption>
splitSummedRows(Operation *op, ArrayRef<Sharding> operandShardings,
                ArrayRef<Sharding> resultShardings, int64_t rows,
                Sharding rowSource, int64_t rowOperand = -1);

/// Random streams are keyed on positions in the global tensor: when
/// `sharding` (of the op's operand `keyed`) splits it, the partitioned op
/// (the definition of the first result's image in `partitionMap`) records
/// the split as `mt.split_axes` (one list of grid axes per dimension of
/// `keyed`, the format of a parameter's), which the bundle carries so that
/// each rank draws its tile's part of the global mask.
void recordGlobalTile(Operation *op, Value keyed, Sharding sharding,
                      IRMapping &partitionMap);

/// Fails naming `what` if `sharding` splits dimension `dim`.
LogicalResult rejectSplit(Operation *op, Sharding sharding, int64_t dim,
                          StringRef what);

/// The grid axes that split any of the first `count` dimensions.
SmallVector<GridAxis> axesOfLeadingDims(Sharding sharding, int64_t count);

/// The grid axes that split dimension `dim`.
SmallVector<GridAxis> axesOfDim(Sharding sharding, int64_t dim);

/// `axes` as the vocab_shard_axes attribute of the vocabulary-parallel ops.
DenseI64ArrayAttr vocabShardAxes(MLIRContext *context, ArrayRef<GridAxis> axes);

/// Megatron-LM's statistics of vocabulary-split logits: each row's maximum
/// (all-reduced with max) and its sum of exponentials and target logit
/// (all-reduced with sum), over the vocabulary's grid axes `axes`.
struct VocabStatistics {
  Value max, partials;
};
VocabStatistics buildVocabStatistics(OpBuilder &builder, Location loc,
                                     Value logits, Value labels,
                                     StringRef grid, ArrayRef<GridAxis> axes);

/// Sums `partial` over the grid axes `axes` (of the grid `sharding` names):
/// a reduce-scatter along the dimension that `result` splits over some of
/// them (Megatron-LM's sequence parallelism), an all-reduce over the rest.
FailureOr<Value> sumPartials(OpBuilder &builder, Operation *op, Value partial,
                             Sharding sharding, ArrayRef<GridAxis> axes,
                             Sharding result,
                             SymbolTableCollection &symbolTable);

/// The number of ranks along `axes` of the grid named by `sharding`.
FailureOr<int64_t> ranksAlong(Operation *op, Sharding sharding,
                              ArrayRef<GridAxis> axes,
                              SymbolTableCollection &symbolTable);

/// attention's loops (batch, query, heads, key, head_dim, value_dim), its
/// indexing maps (q, k, v, out) and its partition check, shared with
/// attention_grad.
SmallVector<IteratorType> attentionLoopIteratorTypes();
SmallVector<AffineMap> attentionIndexingMaps(MLIRContext *context);
/// Context parallelism's layout on a partitioned op that must know its
/// rows' global positions (rope, dropout): when `op` is marked with
/// mt.context_axis and dimension `sequenceDim` of `sharding` is split first
/// over that axis, the local op gets mt.context_axis and mt.context_size
/// (the bundle maps its tile through the load-balanced chunks); otherwise
/// the mark is dropped. Returns whether the layout was recorded.
bool recordContextLayout(Operation *op, Sharding sharding, int64_t sequenceDim,
                         IRMapping &partitionMap,
                         SymbolTableCollection &symbolTable,
                         OpBuilder &builder);

/// The sharding option of attention and its gradient. Under context
/// parallelism (the op marked with mt.context_axis) the keys' and values'
/// sequence (and their gradients') keeps its split over the context axis
/// alongside the queries': upstream's default gives both to the one grid
/// axis, a conflict it settles by replicating the key loop's operands,
/// which would gather the keys and values before the attention whatever the
/// exchange; the partition exchanges them itself (the ring or its gather).
FailureOr<shard::ShardingOption>
getAttentionShardingOption(Operation *op, ArrayRef<Sharding> operandShardings,
                           ArrayRef<Sharding> resultShardings);
FailureOr<std::vector<Sharding>>
getAttentionShardingAnnotations(Operation *op,
                                const shard::ShardingOption &option);
LogicalResult addAttentionShardingAnnotations(
    Operation *op, OpBuilder &builder, const shard::ShardingOption &option);
/// The partition of attention and its gradient: local, after checking that
/// only batch and heads are sharded.
LogicalResult partitionAttention(Operation *op,
                                 ArrayRef<Value> partitionedOperands,
                                 ArrayRef<Sharding> operandShardings,
                                 ArrayRef<Sharding> resultShardings,
                                 IRMapping &partitionMap,
                                 SymbolTableCollection &symbolTable,
                                 OpBuilder &builder);

void attachForwardShardingModels(MLIRContext *context);
void attachBackwardShardingModels(MLIRContext *context);
void attachMoeShardingModels(MLIRContext *context);

} // namespace mlir::mt::sharding

#endif // MT_TRANSFORMS_SHARDINGMODELSUPPORT_H
