//===- CombineAllReduces.cpp - One all-reduce of a sum of partials --------===//

#include "mt/IR/MtDialect.h"
#include "mt/IR/MtOps.h"
#include "mt/Transforms/Passes.h"

#include "mlir/Dialect/Shard/IR/ShardOps.h"
#include "mlir/IR/PatternMatch.h"
#include "mlir/Transforms/GreedyPatternRewriteDriver.h"

#include <type_traits>

namespace mlir::mt {
#define GEN_PASS_DEF_COMBINEALLREDUCESPASS
#include "mt/Transforms/Passes.h.inc"
} // namespace mlir::mt

using namespace mlir;
using namespace mlir::mt;

namespace {

/// add(all_reduce(a), all_reduce(b)) -> all_reduce(add(a, b)), and the same
/// for two reduce-scatters along one axis.
template <typename Reduction>
struct SumBeforeReduction : public OpRewritePattern<AddOp> {
  SumBeforeReduction(MLIRContext *context, llvm::Statistic &combined)
      : OpRewritePattern<AddOp>(context), combined(combined) {}

  LogicalResult matchAndRewrite(AddOp add,
                                PatternRewriter &rewriter) const override {
    auto lhs = add.getLhs().template getDefiningOp<Reduction>();
    auto rhs = add.getRhs().template getDefiningOp<Reduction>();
    if (!lhs || !rhs || lhs == rhs || !lhs->hasOneUse() || !rhs->hasOneUse())
      return failure();
    if (lhs.getGrid() != rhs.getGrid() ||
        lhs.getGridAxes() != rhs.getGridAxes() ||
        lhs.getReduction() != shard::ReductionKind::Sum ||
        rhs.getReduction() != shard::ReductionKind::Sum ||
        lhs.getInput().getType() != rhs.getInput().getType() ||
        lhs.getType() != add.getType() || rhs.getType() != add.getType())
      return failure();
    if constexpr (std::is_same_v<Reduction, shard::ReduceScatterOp>)
      if (lhs.getScatterAxis() != rhs.getScatterAxis())
        return failure();
    // The new ops stay in the add's layer (a rewriter's listener is the
    // driver's, so the layer is set by hand).
    LayerAttr layer = getLayer(add);
    Value lhsInput = lhs.getInput();
    auto sum = AddOp::create(rewriter, add.getLoc(), lhsInput.getType(),
                             lhsInput, rhs.getInput());
    setLayer(sum, layer);
    Operation *reduced = rewriter.clone(*lhs);
    reduced->setOperand(0, sum);
    setLayer(reduced, layer);
    rewriter.replaceOp(add, reduced->getResults());
    rewriter.eraseOp(lhs);
    rewriter.eraseOp(rhs);
    ++combined;
    return success();
  }

  llvm::Statistic &combined;
};

/// all_slice(all_reduce(x)) over the same axes -> reduce_scatter(x): a sum
/// that each rank keeps a block of (sequence parallelism's reduce-scatter
/// after a row-parallel layer, and in the backward pass after the
/// column-parallel layers' input gradients).
struct ReduceScatterInsteadOfSlice
    : public OpRewritePattern<shard::AllSliceOp> {
  ReduceScatterInsteadOfSlice(MLIRContext *context, llvm::Statistic &combined)
      : OpRewritePattern(context), combined(combined) {}

  LogicalResult matchAndRewrite(shard::AllSliceOp slice,
                                PatternRewriter &rewriter) const override {
    auto reduce = slice.getInput().getDefiningOp<shard::AllReduceOp>();
    if (!reduce || !reduce->hasOneUse() ||
        reduce.getGrid() != slice.getGrid() ||
        reduce.getGridAxes() != slice.getGridAxes() ||
        reduce.getInput().getType() != reduce.getType())
      return failure();
    setLayer(rewriter.replaceOpWithNewOp<shard::ReduceScatterOp>(
                 slice, slice.getType(), slice.getGridAttr(),
                 slice.getGridAxesAttr(), reduce.getInput(),
                 reduce.getReductionAttr(), slice.getSliceAxisAttr()),
             getLayer(slice));
    rewriter.eraseOp(reduce);
    ++combined;
    return success();
  }

  llvm::Statistic &combined;
};

/// all_slice(all_reduce(x, A), B) with disjoint A and B ->
/// all_reduce(all_slice(x, B), A): each rank reduces only the block it
/// keeps (a vocabulary-split table's gradient summed over the data axis),
/// and the all-reduce stays last, where the data-parallel reduction expects
/// it.
struct SliceBeforeAllReduce : public OpRewritePattern<shard::AllSliceOp> {
  using OpRewritePattern::OpRewritePattern;

  LogicalResult matchAndRewrite(shard::AllSliceOp slice,
                                PatternRewriter &rewriter) const override {
    auto reduce = slice.getInput().getDefiningOp<shard::AllReduceOp>();
    if (!reduce || !reduce->hasOneUse() ||
        reduce.getGrid() != slice.getGrid() ||
        reduce.getInput().getType() != reduce.getType() ||
        llvm::any_of(slice.getGridAxes(), [&](int16_t axis) {
          return llvm::is_contained(reduce.getGridAxes(), axis);
        }))
      return failure();
    LayerAttr layer = getLayer(slice);
    auto local = shard::AllSliceOp::create(
        rewriter, slice.getLoc(), slice.getType(), slice.getGridAttr(),
        slice.getGridAxesAttr(), reduce.getInput(), slice.getSliceAxisAttr());
    setLayer(local, layer);
    setLayer(rewriter.replaceOpWithNewOp<shard::AllReduceOp>(
                 slice, slice.getType(), reduce.getGridAttr(),
                 reduce.getGridAxesAttr(), local, reduce.getReductionAttr()),
             layer);
    rewriter.eraseOp(reduce);
    return success();
  }
};

struct CombineAllReducesPass
    : public mt::impl::CombineAllReducesPassBase<CombineAllReducesPass> {
  void runOnOperation() override {
    RewritePatternSet patterns(&getContext());
    patterns.add<SumBeforeReduction<shard::AllReduceOp>,
                 SumBeforeReduction<shard::ReduceScatterOp>,
                 ReduceScatterInsteadOfSlice>(&getContext(), numCombined);
    patterns.add<SliceBeforeAllReduce>(&getContext());
    if (failed(applyPatternsGreedily(getOperation(), std::move(patterns))))
      return signalPassFailure();
  }
};

} // namespace
