//===- LayerReshardings.cpp - Layers for the collectives of shard-partition ===//

#include "mt/IR/MtDialect.h"
#include "mt/Transforms/Passes.h"

#include "mlir/Dialect/Shard/IR/ShardDialect.h"

namespace mlir::mt {
#define GEN_PASS_DEF_LAYERRESHARDINGSPASS
#include "mt/Transforms/Passes.h.inc"
} // namespace mlir::mt

using namespace mlir;
using namespace mlir::mt;

namespace {

struct LayerReshardingsPass
    : public mt::impl::LayerReshardingsPassBase<LayerReshardingsPass> {
  using Base::Base;

  void runOnOperation() override {
    auto *shardDialect = getContext().getLoadedDialect<shard::ShardDialect>();
    // The walk reaches a block's ops in order, a value's definition before
    // its users, so a chain of reshardings passes the layer along.
    getOperation()->walk([&](Operation *op) {
      if (op->getDialect() != shardDialect || op->getNumOperands() == 0 ||
          getLayer(op))
        return;
      Operation *producer = op->getOperand(0).getDefiningOp();
      LayerAttr layer = producer ? getLayer(producer) : LayerAttr();
      if (!layer)
        return;
      setLayer(op, LayerAttr::get(&getContext(), layer.getIndex(),
                                  /*coreAttention=*/false));
      ++numTagged;
    });
  }
};

} // namespace
