//===- DecomposeCollectiveMatmuls.cpp - TP collectives in chunks around GEMMs ===//
//
// Megatron-LM's --tp-comm-overlap as IR (docs/Parallelism.md, "Tensor-parallel
// communication in chunks"): the all-gather before a column-parallel GEMM and
// the reduce-scatter after a row-parallel GEMM become chunks, each chunk's
// collective beside one chunk of the GEMM, so that the scheduler can hide
// chunk j's communication behind chunk j-1's (or j+1's) GEMM.
//
//===----------------------------------------------------------------------===//

#include "mt/IR/MtCastOp.h"
#include "mt/IR/MtOps.h"
#include "mt/Transforms/Passes.h"

#include "mlir/Dialect/Func/IR/FuncOps.h"
#include "mlir/Dialect/Shard/IR/ShardOps.h"
#include "mlir/IR/Builders.h"
#include "mlir/IR/IRMapping.h"
#include "llvm/ADT/SetVector.h"

namespace mlir::mt {
#define GEN_PASS_DEF_DECOMPOSECOLLECTIVEMATMULSPASS
#include "mt/Transforms/Passes.h.inc"
} // namespace mlir::mt

using namespace mlir;
using namespace mlir::mt;

/// A GEMM whose rows are `value`'s rows: it reads `value` as its input (the
/// rows times the weight) and nothing else of it, so each chunk of rows
/// gives the same chunk of its results, computed exactly as in the whole.
/// mt.linear_gelu_grad's pre-activation has the rows too: it is cut alike,
/// and its bias gradient, a sum over the rows, is taken from the whole
/// input gradient after (mt.bias_grad, what the fused op computes).
static bool isRowGemmOf(Operation *op, Value value) {
  if (!isa<LinearOp, LinearGeluOp, LinearGeluGradOp>(op) ||
      op->getOperand(0) != value || llvm::count(op->getOperands(), value) != 1)
    return false;
  if (auto grad = dyn_cast<LinearGeluGradOp>(op)) {
    auto rows = cast<RankedTensorType>(value.getType());
    auto pre = cast<RankedTensorType>(grad.getPreActivation().getType());
    return pre.getRank() == rows.getRank() &&
           pre.getShape().drop_back() == rows.getShape().drop_back();
  }
  return true;
}

static RankedTensorType withDim(RankedTensorType type, int64_t axis,
                                int64_t size) {
  SmallVector<int64_t> shape(type.getShape());
  shape[axis] = size;
  return RankedTensorType::get(shape, type.getElementType());
}

static int64_t product(ArrayRef<int64_t> dims) {
  int64_t result = 1;
  for (int64_t d : dims)
    result *= d;
  return result;
}

/// The largest chunk count up to `most` that divides `rows`.
static int64_t chunkCount(int64_t rows, int64_t most) {
  for (int64_t k = std::min(most, rows); k > 1; --k)
    if (rows % k == 0)
      return k;
  return 1;
}

/// The rows whose cuBLASLt algorithm a GEMM takes: those of its result
/// (every dimension but the last), or of the whole it is already a chunk of.
static int64_t wholeRowsOf(Operation *gemm) {
  if (auto rows = gemm->getAttrOfType<IntegerAttr>(kWholeRowsAttrName))
    return rows.getInt();
  auto type = cast<RankedTensorType>(gemm->getResult(0).getType());
  return product(type.getShape().drop_back());
}

/// Marks a GEMM chunk with the rows of the GEMM it is a chunk of.
static void markWholeRows(Operation *chunk, int64_t rows) {
  chunk->setAttr(
      kWholeRowsAttrName,
      IntegerAttr::get(IntegerType::get(chunk->getContext(), 64), rows));
}

static int64_t bytesOf(Value value) {
  auto type = cast<RankedTensorType>(value.getType());
  return type.getNumElements() *
         llvm::divideCeil(type.getElementType().getIntOrFloatBitWidth(), 8);
}

/// Copies the discardable attributes of `from` (mt.layer and the like) to
/// `to`, which it replaces.
static void copyDiscardable(Operation *from, Operation *to) {
  for (NamedAttribute attr : from->getDiscardableAttrs())
    to->setAttr(attr.getName(), attr.getValue());
}

namespace {
/// How the chunks cut a group of `group` ranks' rows, which lie along the
/// collective's `axis`: the whole (gathered, or before the reduce-scatter)
/// is `group` blocks along it, one a rank.
///
/// - Along a leading axis (`cut` < `axis`: whole samples of the
///   micro-batch): chunk j is the samples `j rows` to `(j + 1) rows` of the
///   rank's rows and of the whole alike, each in the whole's order. Every
///   chunk is a contiguous block of its tensor, so the memory plan makes the
///   slices and joins views (mt-attention-views' contiguous groups), which
///   copy nothing.
/// - Along the collective's axis (`cut` == `axis`, where no leading axis
///   divides): rank g's block is its `chunks` chunks of `rows` rows, and
///   chunk j of the whole is every rank's chunk j, rank-major: `[group *
///   rows]` rows, sliced and joined by copies.
struct ChunkLayout {
  int64_t axis = 0, cut = 0, group = 1, chunks = 1, rows = 0;

  bool leading() const { return cut != axis; }

  /// The chunk-j type of a whole-sized `type`.
  RankedTensorType chunkOfWhole(RankedTensorType type) const {
    return leading() ? withDim(type, cut, rows)
                     : withDim(type, axis, group * rows);
  }

  /// The chunk-j type of a rank's `type` (the rows before the gather, or
  /// after the reduce-scatter).
  RankedTensorType chunkOfLocal(RankedTensorType type) const {
    return withDim(type, cut, rows);
  }

  /// A rank's rows in its chunks (a split along `cut`).
  SmallVector<Value> sliceLocal(OpBuilder &builder, Location loc,
                                Value local) const {
    auto type = cast<RankedTensorType>(local.getType());
    SmallVector<Type> pieceTypes(chunks, chunkOfLocal(type));
    auto split = SplitOp::create(builder, loc, pieceTypes, local,
                                 builder.getI64IntegerAttr(cut));
    split->setAttr(kChunkCopyAttrName, builder.getUnitAttr());
    return SmallVector<Value>(split.getResults());
  }

  /// Chunk j of the whole, for each j: along a leading axis a split; along
  /// the collective's, every rank's rows of `whole` as `[pre, group, chunks
  /// * rows * post]`, split along the last, each reshaped back.
  SmallVector<Value> sliceWhole(OpBuilder &builder, Location loc,
                                Value whole) const {
    if (leading())
      return sliceLocal(builder, loc, whole);
    auto type = cast<RankedTensorType>(whole.getType());
    ArrayRef<int64_t> shape = type.getShape();
    int64_t pre = product(shape.take_front(axis));
    int64_t post = product(shape.drop_front(axis + 1));
    Type element = type.getElementType();
    auto blocks = RankedTensorType::get({pre, group, chunks * rows * post},
                                        element);
    Value grouped =
        ReshapeOp::create(builder, loc, blocks, whole).getResult();
    SmallVector<Type> pieceTypes(
        chunks, RankedTensorType::get({pre, group, rows * post}, element));
    auto split = SplitOp::create(builder, loc, pieceTypes, grouped,
                                 builder.getI64IntegerAttr(2));
    split->setAttr(kChunkCopyAttrName, builder.getUnitAttr());
    SmallVector<Value> pieces;
    for (Value piece : split.getResults())
      pieces.push_back(
          ReshapeOp::create(builder, loc, chunkOfWhole(type), piece)
              .getResult());
    return pieces;
  }

  /// The rank's `type` from its chunks (a concat along `cut`).
  Value joinLocal(OpBuilder &builder, Location loc, RankedTensorType type,
                  ArrayRef<Value> pieces) const {
    auto joined = ConcatOp::create(builder, loc, type, pieces,
                                   builder.getI64IntegerAttr(cut));
    joined->setAttr(kChunkCopyAttrName, builder.getUnitAttr());
    return joined.getResult();
  }

  /// The inverse of sliceWhole: the whole of `type` from its chunks.
  Value joinWhole(OpBuilder &builder, Location loc, RankedTensorType type,
                  ArrayRef<Value> pieces) const {
    if (leading())
      return joinLocal(builder, loc, type, pieces);
    ArrayRef<int64_t> shape = type.getShape();
    int64_t pre = product(shape.take_front(axis));
    int64_t post = product(shape.drop_front(axis + 1));
    Type element = type.getElementType();
    SmallVector<Value> grouped;
    for (Value piece : pieces)
      grouped.push_back(
          ReshapeOp::create(
              builder, loc,
              RankedTensorType::get({pre, group, rows * post}, element), piece)
              .getResult());
    auto joined = ConcatOp::create(
        builder, loc,
        RankedTensorType::get({pre, group, chunks * rows * post}, element),
        grouped, builder.getI64IntegerAttr(2));
    joined->setAttr(kChunkCopyAttrName, builder.getUnitAttr());
    return ReshapeOp::create(builder, loc, type, joined.getResult())
        .getResult();
  }

  /// The chunks of a collective along `axis` of a rank's `local` rows
  /// (`whole` rows in all): whole samples where the first axis, before
  /// `axis`, divides into 2 or more (up to `most`), else the rows along
  /// `axis`; none (chunks 1) where neither divides.
  static ChunkLayout choose(RankedTensorType local, int64_t axis, int64_t whole,
                            int64_t most) {
    ChunkLayout layout;
    layout.axis = axis;
    layout.group = whole / local.getDimSize(axis);
    if (axis > 0) {
      layout.chunks = chunkCount(local.getDimSize(0), most);
      if (layout.chunks > 1) {
        layout.cut = 0;
        layout.rows = local.getDimSize(0) / layout.chunks;
        return layout;
      }
    }
    layout.cut = axis;
    layout.chunks = chunkCount(local.getDimSize(axis), most);
    layout.rows = local.getDimSize(axis) / layout.chunks;
    return layout;
  }
};

struct DecomposeCollectiveMatmulsPass
    : mt::impl::DecomposeCollectiveMatmulsPassBase<
          DecomposeCollectiveMatmulsPass> {
  using Base::Base;

  void runOnOperation() override {
    if (chunks < 2) {
      getOperation().emitError()
          << "mt-decompose-collective-matmuls: chunks " << int64_t(chunks)
          << " leaves nothing to pipeline; give 2 or more";
      return signalPassFailure();
    }
    SmallVector<shard::AllGatherOp> gathers;
    SmallVector<shard::ReduceScatterOp> scatters;
    for (auto function : getOperation().getOps<func::FuncOp>())
      for (Block &block : function.getBody())
        for (Operation &op : block) {
          if (auto gather = dyn_cast<shard::AllGatherOp>(op))
            gathers.push_back(gather);
          if (auto scatter = dyn_cast<shard::ReduceScatterOp>(op))
            scatters.push_back(scatter);
        }
    for (shard::AllGatherOp gather : gathers)
      decomposeGather(gather);
    for (shard::ReduceScatterOp scatter : scatters)
      decomposeScatter(scatter);
  }

  /// Whether a decomposition that copies `copied` bytes (slices and
  /// joins, at memory bandwidth) is worth it for a collective of `whole`
  /// bytes: a GEMM whose result is much wider than its gathered input (the
  /// vocabulary-parallel output layer's logits) would copy more than the
  /// chunks can hide, and hold its result twice.
  bool worthCopying(int64_t copied, int64_t whole) const {
    return double(copied) <= maxCopyRatio * double(whole);
  }

  /// Marks chunk `j` of a decomposed collective for --report overlap.
  void markChunk(Operation *collective, int64_t j, int64_t count) {
    collective->setAttr(kCollectiveChunkAttrName,
                        DenseI64ArrayAttr::get(&getContext(), {j, count}));
  }

  /// all_gather(x) read by GEMMs: x's rows in chunks, each gathered alone,
  /// and each GEMM run per gathered chunk; its results, and the gathered
  /// tensor for any other reader, are put together from the chunks.
  void decomposeGather(shard::AllGatherOp gather) {
    Value whole = gather.getResult();
    SmallVector<Operation *> gemms, others;
    for (Operation *user : whole.getUsers())
      (isRowGemmOf(user, whole) && user->getBlock() == gather->getBlock()
           ? gemms
           : others)
          .push_back(user);
    auto inputType = cast<RankedTensorType>(gather.getInput().getType());
    auto wholeType = cast<RankedTensorType>(whole.getType());
    int64_t axis = gather.getGatherAxis().getSExtValue();
    // The GEMMs contract the last dimension; the rows are the others.
    if (gemms.empty() || axis >= inputType.getRank() - 1 ||
        gather->hasAttr(kCollectiveChunkAttrName))
      return;
    ChunkLayout layout = ChunkLayout::choose(
        inputType, axis, wholeType.getDimSize(axis), int64_t(chunks));
    if (layout.chunks < 2)
      return;
    // What the chunks cost: the rank's rows split, the GEMMs' row-wise
    // results (and pre-activations) put together, and the gathered tensor
    // for other readers (views along a leading axis, where the memory plan
    // can make them so; counted alike).
    int64_t copied = bytesOf(gather.getInput());
    for (Operation *gemm : gemms) {
      if (auto grad = dyn_cast<LinearGeluGradOp>(gemm))
        copied += bytesOf(grad.getPreActivation()) +
                  bytesOf(grad.getInputGrad());
      else
        for (Value result : gemm->getResults())
          copied += bytesOf(result);
    }
    if (!others.empty())
      copied += bytesOf(whole);
    if (!worthCopying(copied, bytesOf(whole)))
      return;
    Location loc = gather.getLoc();
    OpBuilder builder(gather);
    // The rank's rows in chunks.
    SmallVector<Value> pieces =
        layout.sliceLocal(builder, loc, gather.getInput());
    copyDiscardable(gather, pieces.front().getDefiningOp());
    SmallVector<Value> gathered;
    for (auto [j, piece] : llvm::enumerate(pieces)) {
      Operation *chunk = builder.clone(*gather.getOperation());
      chunk->setOperand(0, piece);
      chunk->getResult(0).setType(layout.chunkOfWhole(wholeType));
      markChunk(chunk, j, layout.chunks);
      gathered.push_back(chunk->getResult(0));
    }
    for (Operation *gemm : gemms) {
      builder.setInsertionPoint(gemm);
      auto grad = dyn_cast<LinearGeluGradOp>(gemm);
      // Chunk j of the gathered rows is every rank's chunk j: the
      // pre-activation's rows in the same order.
      SmallVector<Value> preActivations;
      if (grad)
        preActivations =
            layout.sliceWhole(builder, loc, grad.getPreActivation());
      // A row-wise result per chunk (the input gradient alone, for a
      // linear_gelu_grad).
      unsigned rowResults = grad ? 1 : gemm->getNumResults();
      SmallVector<SmallVector<Value>> results(rowResults);
      for (auto [j, piece] : llvm::enumerate(gathered)) {
        IRMapping mapping;
        mapping.map(whole, piece);
        if (grad)
          mapping.map(grad.getPreActivation(), preActivations[j]);
        Operation *chunk;
        if (grad) {
          chunk = LinearGeluGradOp::create(
              builder, gemm->getLoc(),
              layout.chunkOfWhole(
                  cast<RankedTensorType>(grad.getInputGrad().getType())),
              /*bias_grad=*/Type(), piece, grad.getWeight(),
              preActivations[j], grad.getApproximateAttr(),
              grad.getTransposeWeightAttr());
          copyDiscardable(gemm, chunk);
        } else {
          chunk = builder.clone(*gemm, mapping);
          for (OpResult result : chunk->getResults())
            result.setType(layout.chunkOfWhole(
                cast<RankedTensorType>(result.getType())));
        }
        markWholeRows(chunk, wholeRowsOf(gemm));
        for (unsigned r = 0; r < rowResults; ++r)
          results[r].push_back(chunk->getResult(r));
      }
      for (unsigned r = 0; r < rowResults; ++r) {
        OpResult result = gemm->getResult(r);
        Value joined = layout.joinWhole(
            builder, gemm->getLoc(), cast<RankedTensorType>(result.getType()),
            results[r]);
        result.replaceAllUsesWith(joined);
        if (grad && grad.getBiasGrad()) {
          auto bias = BiasGradOp::create(builder, gemm->getLoc(),
                                         grad.getBiasGrad().getType(), joined);
          copyDiscardable(gemm, bias);
          grad.getBiasGrad().replaceAllUsesWith(bias.getResult());
        }
      }
      gemm->erase();
      ++numGemmChunks;
    }
    if (!others.empty()) {
      // Before the first other reader (or where the gather was, for one
      // inside another op's region).
      Operation *first = nullptr;
      for (Operation *other : others) {
        Operation *at = gather->getBlock()->findAncestorOpInBlock(*other);
        if (!at) {
          first = gather;
          break;
        }
        if (!first || at->isBeforeInBlock(first))
          first = at;
      }
      builder.setInsertionPoint(first);
      whole.replaceAllUsesWith(
          layout.joinWhole(builder, loc, wholeType, gathered));
    }
    gather->erase();
    ++numGathers;
  }

  /// The ops that make the rows of `value` from GEMMs: row GEMMs
  /// (mt.linear's input, mt.linear_gelu's; mt.linear_add's input, and its
  /// addend, row-wise too) and the row-wise ops above them (mt.add,
  /// mt.cast), each read only on the way to `value`. Their inputs that are
  /// not such ops are the leaves, sliced into chunks.
  static bool collectRows(Value value, bool root,
                          SetVector<Operation *> &chain,
                          SetVector<Value> &leaves) {
    Operation *op = value.getDefiningOp();
    if (!op || (!root && !value.hasOneUse()) ||
        !isa<LinearOp, LinearAddOp, AddOp, CastOp>(op) ||
        op->getNumResults() != 1) {
      leaves.insert(value);
      return false;
    }
    chain.insert(op);
    if (isa<LinearOp>(op)) {
      leaves.insert(op->getOperand(0));
      return true;
    }
    if (auto linearAdd = dyn_cast<LinearAddOp>(op)) {
      leaves.insert(linearAdd.getInput());
      collectRows(linearAdd.getAddend(), /*root=*/false, chain, leaves);
      return true;
    }
    bool gemm = false;
    for (Value operand : op->getOperands())
      gemm |= collectRows(operand, /*root=*/false, chain, leaves);
    return gemm;
  }

  /// reduce_scatter(rows from GEMMs): per chunk, every rank's chunk of the
  /// rows computed and reduce-scattered alone; the rank's chunks joined.
  void decomposeScatter(shard::ReduceScatterOp scatter) {
    Value input = scatter.getInput();
    auto inputType = cast<RankedTensorType>(input.getType());
    auto resultType = cast<RankedTensorType>(scatter.getResult().getType());
    int64_t axis = scatter.getScatterAxis().getSExtValue();
    if (axis >= inputType.getRank() - 1 || !input.hasOneUse() ||
        scatter->hasAttr(kCollectiveChunkAttrName))
      return;
    SetVector<Operation *> chain;
    SetVector<Value> leaves;
    if (!collectRows(input, /*root=*/true, chain, leaves))
      return;
    for (Operation *op : chain)
      if (op->getBlock() != scatter->getBlock())
        return;
    ChunkLayout layout = ChunkLayout::choose(
        resultType, axis, inputType.getDimSize(axis), int64_t(chunks));
    if (layout.chunks < 2)
      return;
    // What the chunks cost: the GEMMs' inputs sliced, the rank's chunks
    // joined.
    int64_t copied = bytesOf(scatter.getResult());
    for (Value leaf : leaves) {
      auto type = cast<RankedTensorType>(leaf.getType());
      if (type.getRank() != inputType.getRank() ||
          type.getShape().drop_back() != inputType.getShape().drop_back())
        return;
      copied += bytesOf(leaf);
    }
    if (!worthCopying(copied, bytesOf(input)))
      return;
    Location loc = scatter.getLoc();
    OpBuilder builder(scatter);
    DenseMap<Value, SmallVector<Value>> pieces;
    for (Value leaf : leaves)
      pieces[leaf] = layout.sliceWhole(builder, loc, leaf);
    SmallVector<Operation *> ordered(chain.begin(), chain.end());
    llvm::sort(ordered, [](Operation *a, Operation *b) {
      return a->isBeforeInBlock(b);
    });
    SmallVector<Value> scattered;
    for (int64_t j = 0; j < layout.chunks; ++j) {
      IRMapping mapping;
      for (Value leaf : leaves)
        mapping.map(leaf, pieces[leaf][j]);
      for (Operation *op : ordered) {
        Operation *chunk = builder.clone(*op, mapping);
        if (isa<LinearOp, LinearAddOp>(op))
          markWholeRows(chunk, wholeRowsOf(op));
        chunk->getResult(0).setType(layout.chunkOfWhole(
            cast<RankedTensorType>(chunk->getResult(0).getType())));
        mapping.map(op->getResult(0), chunk->getResult(0));
      }
      Operation *chunk = builder.clone(*scatter.getOperation(), mapping);
      chunk->getResult(0).setType(layout.chunkOfLocal(resultType));
      markChunk(chunk, j, layout.chunks);
      scattered.push_back(chunk->getResult(0));
    }
    Value joined = layout.joinLocal(builder, loc, resultType, scattered);
    copyDiscardable(scatter, joined.getDefiningOp());
    scatter.getResult().replaceAllUsesWith(joined);
    scatter->erase();
    for (Operation *op : llvm::reverse(ordered))
      op->erase();
    numGemmChunks += llvm::count_if(
        ordered, [](Operation *op) { return isa<LinearOp, LinearAddOp>(op); });
    ++numScatters;
  }
};
} // namespace
