//===- FuseColumnSums.cpp - Bias gradients into the kernels of their dy ---===//
//
// Each bias gradient whose operand an mt.fused group or an mt.add writes
// becomes an mt.bias_grad inside that group (Passes.td). A group with
// column sums is rebuilt with one more result each: MLIR ops have a fixed
// result list.
//
//===----------------------------------------------------------------------===//

#include "mt/IR/MtDialect.h"
#include "mt/IR/MtOps.h"
#include "mt/Transforms/Passes.h"

#include "mlir/IR/Builders.h"
#include "mlir/IR/IRMapping.h"

namespace mlir::mt {
#define GEN_PASS_DEF_FUSECOLUMNSUMSPASS
#include "mt/Transforms/Passes.h.inc"
} // namespace mlir::mt

using namespace mlir;
using namespace mlir::mt;

namespace {

/// `op`, an elementwise op a kernel computes, as a group of that one op.
FusedOp groupOfOne(Operation *op) {
  OpBuilder builder(op);
  auto group = FusedOp::create(builder, op->getLoc(), op->getResultTypes(),
                               op->getOperands());
  setLayer(group, getLayer(op));
  Block *body = builder.createBlock(&group.getBody());
  IRMapping mapping;
  for (Value operand : op->getOperands())
    if (!mapping.contains(operand))
      mapping.map(operand, body->addArgument(operand.getType(), op->getLoc()));
  Operation *inner = builder.clone(*op, mapping);
  YieldOp::create(builder, op->getLoc(), inner->getResult(0));
  op->getResult(0).replaceAllUsesWith(group.getResult(0));
  op->erase();
  return group;
}

/// `group` with one more result: the column sum of its result `summed`.
/// Returns the new group (the old one is erased) and the sum.
std::pair<FusedOp, Value> addColumnSum(FusedOp group, unsigned summed,
                                       Type sumType) {
  Block &body = group.getBody().front();
  auto yield = cast<YieldOp>(body.getTerminator());
  OpBuilder inside(yield);
  auto sum = BiasGradOp::create(inside, yield.getLoc(), sumType,
                                yield.getValues()[summed]);
  setLayer(sum, getLayer(group));
  SmallVector<Value> yielded(yield.getValues());
  yielded.push_back(sum.getResult());
  YieldOp::create(inside, yield.getLoc(), yielded);
  yield->erase();
  SmallVector<Type> types(group.getResultTypes());
  types.push_back(sumType);
  OpBuilder builder(group);
  auto grown =
      FusedOp::create(builder, group.getLoc(), types, group.getInputs());
  grown->setDiscardableAttrs(group->getDiscardableAttrDictionary());
  grown.getBody().takeBody(group.getBody());
  for (auto [old, now] : llvm::zip(group.getResults(), grown.getResults()))
    old.replaceAllUsesWith(now);
  group->erase();
  return {grown, grown.getResults().back()};
}

/// The group that writes `dy` (made of its lone op if need be) and the
/// index of `dy` among its results, when `dy` may be summed there: read
/// by something else than `user`, in `user`'s block, with room for one
/// more result.
std::optional<std::pair<FusedOp, unsigned>> writerOf(Value dy,
                                                     Operation *user) {
  Operation *def = dy.getDefiningOp();
  if (!def || def->getBlock() != user->getBlock() ||
      llvm::all_of(dy.getUsers(), [&](Operation *u) { return u == user; }))
    return std::nullopt;
  if (auto group = dyn_cast<FusedOp>(def)) {
    if (group.getNumResults() >= kMaxFusedGroupValues)
      return std::nullopt;
    return std::make_pair(group, cast<OpResult>(dy).getResultNumber());
  }
  // A lone elementwise op (the residual gradient's add at dropout 0, a
  // dropout gradient) becomes a group of its own.
  if (isFusibleElementwiseOp(def) && def->getNumResults() == 1 &&
      llvm::all_of(def->getOperandTypes(),
                   [&](Type type) { return type == dy.getType(); }))
    return std::make_pair(groupOfOne(def), 0u);
  return std::nullopt;
}

struct FuseColumnSumsPass
    : public mt::impl::FuseColumnSumsPassBase<FuseColumnSumsPass> {
  void runOnOperation() override {
    if (!getOperation()->hasAttr(kElementwiseKernelsAttrName))
      return;
    SmallVector<Operation *> candidates;
    getOperation().walk([&](Operation *op) {
      if (isa<LinearWeightBiasGradOp>(op) ||
          (isa<BiasGradOp>(op) && !isa<FusedOp>(op->getParentOp())))
        candidates.push_back(op);
    });
    for (Operation *op : candidates) {
      Value dy = op->getOperand(isa<BiasGradOp>(op) ? 0 : 1);
      std::optional<std::pair<FusedOp, unsigned>> writer = writerOf(dy, op);
      if (!writer)
        continue;
      Value biasGrad = op->getResults().back();
      auto [group, sum] =
          addColumnSum(writer->first, writer->second, biasGrad.getType());
      biasGrad.replaceAllUsesWith(sum);
      if (auto fused = dyn_cast<LinearWeightBiasGradOp>(op)) {
        OpBuilder builder(op);
        auto weightGrad = LinearWeightGradOp::create(
            builder, op->getLoc(), fused.getWeightGrad().getType(),
            fused.getInput(), fused.getOutputGrad(),
            fused.getTransposeWeightAttr());
        weightGrad->setDiscardableAttrs(op->getDiscardableAttrDictionary());
        fused.getWeightGrad().replaceAllUsesWith(weightGrad.getResult());
      }
      op->erase();
      ++numSums;
    }
  }
};

} // namespace
