//===- SplitCollectives.cpp - Each collective as a start and a wait --------===//

#include "mt/IR/MtOps.h"
#include "mt/Transforms/Passes.h"

#include "mlir/Dialect/Func/IR/FuncOps.h"
#include "mlir/Dialect/Shard/IR/ShardOps.h"
#include "mlir/IR/IRMapping.h"

namespace mlir::mt {
#define GEN_PASS_DEF_SPLITCOLLECTIVESPASS
#include "mt/Transforms/Passes.h.inc"
} // namespace mlir::mt

using namespace mlir;
using namespace mlir::mt;

namespace {
struct SplitCollectivesPass
    : mt::impl::SplitCollectivesPassBase<SplitCollectivesPass> {
  void runOnOperation() override {
    SmallVector<Operation *> collectives;
    for (auto function : getOperation().getOps<func::FuncOp>())
      for (Block &block : function.getBody())
        for (Operation &op : block)
          if (isa<shard::AllReduceOp, shard::AllGatherOp,
                  shard::ReduceScatterOp>(op))
            collectives.push_back(&op);
    for (Operation *collective : collectives) {
      Value input = collective->getOperand(0);
      auto resultType =
          cast<RankedTensorType>(collective->getResult(0).getType());
      OpBuilder builder(collective);
      Location loc = collective->getLoc();
      auto start = CollectiveStartOp::create(
          builder, loc, FutureType::get(&getContext(), resultType), input);
      Block *body = builder.createBlock(&start.getBody(), {},
                                        {input.getType()}, {loc});
      IRMapping mapping;
      mapping.map(input, body->getArgument(0));
      Operation *inner = builder.clone(*collective, mapping);
      YieldOp::create(builder, loc, inner->getResult(0));
      builder.setInsertionPointAfter(start);
      auto wait = CollectiveWaitOp::create(builder, loc, resultType,
                                           start.getFuture());
      collective->getResult(0).replaceAllUsesWith(wait.getResult());
      collective->erase();
      ++numSplit;
    }
  }
};
} // namespace
