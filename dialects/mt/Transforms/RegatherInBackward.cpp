//===- RegatherInBackward.cpp - Keep shards, gather again in the backward -===//
//
// Under sequence parallelism a column-parallel linear reads its input
// all-gathered along the sequence, and its weight gradient reads the same
// gathered tensor in the backward pass. Megatron-LM keeps the sequence shard
// for the backward pass and all-gathers it again there (t times less memory
// held, one more all-gather per column-parallel layer); so does this pass:
// the backward pass reads a clone of each forward all-gather, placed right
// before its first backward reader, and the gathered original dies at its
// last forward use. A gather copies, so the clone's bits are the original's.
//
//===----------------------------------------------------------------------===//

#include "mt/Transforms/BackwardPass.h"
#include "mt/Transforms/Passes.h"

#include "mlir/Dialect/Shard/IR/ShardOps.h"
#include "mlir/IR/Builders.h"

namespace mlir::mt {
#define GEN_PASS_DEF_REGATHERINBACKWARDPASS
#include "mt/Transforms/Passes.h.inc"
} // namespace mlir::mt

using namespace mlir;
using namespace mlir::mt;

namespace {

struct RegatherInBackwardPass
    : public mt::impl::RegatherInBackwardPassBase<RegatherInBackwardPass> {
  void runOnOperation() override {
    for (auto function : getOperation().getOps<func::FuncOp>()) {
      if (!function.getBody().hasOneBlock())
        continue;
      Value seed = backwardSeed(function);
      if (!seed)
        continue;
      regather(function, seed);
    }
  }

  void regather(func::FuncOp function, Value seed) {
    DenseSet<Operation *> backward = backwardOps(function, seed);
    DenseMap<Operation *, int64_t> position;
    for (Operation &op : function.getBody().front())
      position[&op] = position.size();
    SmallVector<shard::AllGatherOp> gathers;
    for (auto gather : function.getBody().getOps<shard::AllGatherOp>())
      if (!backward.contains(gather))
        gathers.push_back(gather);
    OpBuilder builder(function.getContext());
    for (shard::AllGatherOp gather : gathers) {
      Operation *first = nullptr;
      for (Operation *user : gather->getUsers())
        if (backward.contains(user) &&
            (!first || position[user] < position[first]))
          first = user;
      if (!first)
        continue;
      builder.setInsertionPoint(first);
      Operation *clone = builder.clone(*gather);
      clone->setAttr(kRegatheredAttrName, builder.getUnitAttr());
      gather.getResult().replaceUsesWithIf(
          clone->getResult(0),
          [&](OpOperand &use) { return backward.contains(use.getOwner()); });
      ++numRegathered;
    }
  }
};

} // namespace
