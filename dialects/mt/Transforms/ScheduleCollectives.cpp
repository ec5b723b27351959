//===- ScheduleCollectives.cpp - Starts up and waits down, by cost ---------===//

#include "mt/IR/MtOps.h"
#include "mt/Transforms/CostModel.h"
#include "mt/Transforms/Passes.h"

#include "mlir/Dialect/Func/IR/FuncOps.h"
#include "mlir/Dialect/Shard/IR/ShardOps.h"
#include "mlir/IR/Builders.h"

namespace mlir::mt {
#define GEN_PASS_DEF_SCHEDULECOLLECTIVESPASS
#include "mt/Transforms/Passes.h.inc"
} // namespace mlir::mt

using namespace mlir;
using namespace mlir::mt;

/// Ops a start never moves above and a wait never moves below: other
/// collectives (so every rank issues them in one order), waits among
/// themselves, and ops with effects the pass cannot see through. A start
/// may pass an earlier collective's wait, and a wait a later start.
static bool isBarrier(Operation *op, bool forWait) {
  if (isa<CollectiveStartOp>(op))
    return !forWait;
  if (isa<CollectiveWaitOp>(op))
    return forWait;
  if (op->getDialect() && op->getDialect()->getNamespace() ==
                              shard::ShardDialect::getDialectNamespace())
    return true;
  return !isMemoryEffectFree(op) && !isa<AccumulateGradientOp>(op);
}

static bool uses(Operation *user, Value value) {
  bool found = false;
  user->walk([&](Operation *nested) {
    if (llvm::is_contained(nested->getOperands(), value))
      found = true;
  });
  return found;
}

namespace {
struct ScheduleCollectivesPass
    : mt::impl::ScheduleCollectivesPassBase<ScheduleCollectivesPass> {
  using Base::Base;

  void runOnOperation() override {
    llvm::Expected<CostModel> model = CostModel::load(costModel);
    if (!model) {
      getOperation().emitError() << llvm::toString(model.takeError());
      return signalPassFailure();
    }
    for (auto function : getOperation().getOps<func::FuncOp>())
      for (Block &block : function.getBody())
        schedule(block, *model);
  }

  void schedule(Block &block, const CostModel &model) {
    SmallVector<CollectiveStartOp> starts(block.getOps<CollectiveStartOp>());
    Builder builder(&getContext());
    DenseMap<Operation *, double> need;
    // Starts, first to last: up past independent ops until they cover the
    // collective's predicted time.
    for (CollectiveStartOp start : starts) {
      double us = model.collective(start.getCollective()).us;
      start->setAttr("mt.predicted_us", builder.getF64FloatAttr(us));
      Operation *source = start.getInput().getDefiningOp();
      double covered = 0;
      Operation *before = start;
      for (Operation *op = start->getPrevNode(); op && covered < us;
           op = op->getPrevNode()) {
        if (op == source || isBarrier(op, /*forWait=*/false))
          break;
        covered += model.opMicroseconds(op);
        before = op;
      }
      if (before != start.getOperation()) {
        start->moveBefore(before);
        ++numScheduled;
      }
      need[start] = us;
    }
    // Waits, last to first: down past ops that do not read the result
    // until the ops since the start cover the collective.
    for (CollectiveStartOp start : llvm::reverse(starts)) {
      CollectiveWaitOp wait = start.getWait();
      double covered = 0;
      for (Operation *op = start->getNextNode(); op != wait;
           op = op->getNextNode())
        covered += model.opMicroseconds(op);
      Operation *after = wait;
      for (Operation *op = wait->getNextNode();
           op && !op->hasTrait<OpTrait::IsTerminator>() &&
           covered < need[start];
           op = op->getNextNode()) {
        if (isBarrier(op, /*forWait=*/true) || uses(op, wait.getResult()))
          break;
        covered += model.opMicroseconds(op);
        after = op;
      }
      if (after != wait.getOperation()) {
        wait->moveAfter(after);
        ++numScheduled;
      }
    }
  }
};
} // namespace
