//===- FuseLinearCrossEntropy.cpp - The loss without whole logits ---------===//
//
// Forms mt.linear_cross_entropy (MtFusedOps.td) from a training step's output
// layer: its linear, cross_entropy, cross_entropy_grad and the two gradient
// GEMMs. The fused op runs where the logits were computed and yields the
// gradients for a loss gradient of one; mt.scale ops multiply them by the
// seed where cross_entropy_grad was, so the backward pass keeps its order.
//
//===----------------------------------------------------------------------===//

#include "mt/IR/MtOps.h"
#include "mt/Transforms/Passes.h"

#include "mlir/Dialect/Func/IR/FuncOps.h"
#include "mlir/IR/Builders.h"

namespace mlir::mt {
#define GEN_PASS_DEF_FUSELINEARCROSSENTROPYPASS
#include "mt/Transforms/Passes.h.inc"
} // namespace mlir::mt

using namespace mlir;
using namespace mlir::mt;

namespace {

/// The ops of one output layer that the fused op replaces.
struct OutputLayer {
  LinearOp linear;
  CrossEntropyOp loss;
  CrossEntropyGradOp lossGrad;
  LinearOp inputGrad;
  LinearWeightGradOp weightGrad;
};

/// Whether `value` is defined before `op` in op's block (or is an argument
/// of that block), so that an op built at `op` may read it.
bool availableAt(Value value, Operation *op) {
  if (auto argument = dyn_cast<BlockArgument>(value))
    return argument.getOwner() == op->getBlock();
  Operation *definition = value.getDefiningOp();
  return definition->getBlock() == op->getBlock() &&
         definition->isBeforeInBlock(op);
}

/// The output layer whose logits `linear` computes, when it has exactly
/// the shape the fused op stands for (Passes.td).
std::optional<OutputLayer> matchOutputLayer(LinearOp linear) {
  if (linear.getBias())
    return std::nullopt;
  OutputLayer layer{linear, {}, {}, {}, {}};
  Block *block = linear->getBlock();
  for (Operation *user : linear->getUsers()) {
    if (user->getBlock() != block)
      return std::nullopt;
    if (auto loss = dyn_cast<CrossEntropyOp>(user)) {
      if (layer.loss || loss.getLogits() != linear.getResult())
        return std::nullopt;
      layer.loss = loss;
    } else if (auto grad = dyn_cast<CrossEntropyGradOp>(user)) {
      if (layer.lossGrad || grad.getLogits() != linear.getResult())
        return std::nullopt;
      layer.lossGrad = grad;
    } else {
      return std::nullopt;
    }
  }
  if (!layer.loss || !layer.lossGrad ||
      layer.loss.getReduction() == LossReduction::None ||
      layer.loss.getReduction() != layer.lossGrad.getReduction() ||
      layer.loss.getIgnoreIndex() != layer.lossGrad.getIgnoreIndex() ||
      layer.loss.getLabels() != layer.lossGrad.getLabels() ||
      !availableAt(layer.loss.getLabels(), linear))
    return std::nullopt;
  Value dlogits = layer.lossGrad.getResult();
  for (Operation *user : dlogits.getUsers()) {
    if (auto data = dyn_cast<LinearOp>(user)) {
      // dh = dlogits @ op(W)^T: the weight read the other way round.
      if (layer.inputGrad || data.getInput() != dlogits || data.getBias() ||
          data.getWeight() != linear.getWeight() ||
          data.getTransposeWeight() == linear.getTransposeWeight())
        return std::nullopt;
      layer.inputGrad = data;
    } else if (auto weight = dyn_cast<LinearWeightGradOp>(user)) {
      if (layer.weightGrad || weight.getInput() != linear.getInput() ||
          weight.getOutputGrad() != dlogits ||
          weight.getTransposeWeight() != linear.getTransposeWeight())
        return std::nullopt;
      layer.weightGrad = weight;
    } else {
      return std::nullopt;
    }
  }
  if (!layer.inputGrad || !layer.weightGrad)
    return std::nullopt;
  return layer;
}

/// Tokens per chunk: `rows` when it fits in `chunkBytes` of logits of
/// `logitBytes` each, else the most that fit, rounded down to a multiple of
/// 64 when above 64.
int64_t chooseChunkRows(int64_t rows, int64_t vocab, int64_t chunkRows,
                        int64_t chunkBytes, int64_t logitBytes) {
  if (chunkRows > 0)
    return std::min(chunkRows, rows);
  int64_t fit = std::max<int64_t>(1, chunkBytes / (logitBytes * vocab));
  if (fit > 64)
    fit -= fit % 64;
  return std::min(fit, rows);
}

struct FuseLinearCrossEntropyPass
    : mt::impl::FuseLinearCrossEntropyPassBase<FuseLinearCrossEntropyPass> {
  using Base::Base;

  void runOnOperation() override {
    int64_t rows = chunkRows, bytes = chunkBytes;
    if (rows < 0 || bytes < 1) {
      getOperation().emitError()
          << "mt-fuse-linear-cross-entropy: chunk-rows is " << rows
          << " and chunk-bytes " << bytes
          << "; expected chunk-rows >= 0 (0: from chunk-bytes) and "
             "chunk-bytes >= 1";
      return signalPassFailure();
    }
    // mt-mixed-precision, later, types the op as the unfused output layer:
    // under bf16 its input, and so the chunk's logits, are bf16.
    auto model = getOperation()->getAttrOfType<ModelAttr>(kModelAttrName);
    logitBytes = model && model.getPrecision() == "bf16" ? 2 : 4;
    SmallVector<OutputLayer> layers;
    getOperation().walk([&](LinearOp linear) {
      if (std::optional<OutputLayer> layer = matchOutputLayer(linear))
        layers.push_back(*layer);
    });
    for (OutputLayer &layer : layers)
      fuse(layer);
  }

  void fuse(OutputLayer &layer) {
    LinearOp linear = layer.linear;
    auto logits = cast<RankedTensorType>(linear.getType());
    int64_t vocab = logits.getShape().back();
    int64_t rows = logits.getNumElements() / std::max<int64_t>(1, vocab);
    int64_t chunk =
        chooseChunkRows(rows, vocab, chunkRows, chunkBytes, logitBytes);

    OpBuilder builder(linear);
    Location loc = FusedLoc::get(linear->getContext(),
                                 {linear->getLoc(), layer.loss->getLoc()});
    Value input = linear.getInput(), weight = linear.getWeight();
    auto fused = LinearCrossEntropyOp::create(
        builder, loc, layer.loss.getType(), input.getType(), weight.getType(),
        input, weight, layer.loss.getLabels(), layer.loss.getReductionAttr(),
        layer.loss.getIgnoreIndexAttr(), builder.getI64IntegerAttr(chunk),
        linear.getTransposeWeightAttr());
    for (NamedAttribute attr : linear->getDiscardableAttrs())
      fused->setDiscardableAttr(attr.getName(), attr.getValue());
    layer.loss.getResult().replaceAllUsesWith(fused.getLoss());

    // The seed is the backward pass's; the scaled gradients take the place
    // of cross_entropy_grad, before both of their old producers.
    builder.setInsertionPoint(layer.lossGrad);
    Value seed = layer.lossGrad.getLossGrad();
    auto scale = [&](Operation *old, Value unit) {
      auto scaled = ScaleOp::create(builder, old->getLoc(), unit.getType(),
                                    unit, seed);
      for (NamedAttribute attr : old->getDiscardableAttrs())
        scaled->setDiscardableAttr(attr.getName(), attr.getValue());
      old->getResult(0).replaceAllUsesWith(scaled.getResult());
    };
    scale(layer.inputGrad, fused.getInputGrad());
    scale(layer.weightGrad, fused.getWeightGrad());
    layer.inputGrad->erase();
    layer.weightGrad->erase();
    layer.lossGrad->erase();
    layer.loss->erase();
    linear->erase();
    ++numFused;
  }

  /// Bytes of one logit in the chunk: the training precision's.
  int64_t logitBytes = 4;
};

} // namespace
