//===- RecomputeLayerPass.cpp - Full recomputation of one chosen layer ----===//
//
// `example-recompute-layer{layer=K}` recomputes layer K alone in full: its
// forward activations are dropped after the forward pass and rerun from the
// layer's input in the backward pass, while every other layer keeps its
// own (Megatron-LM's policies pick layers by count, not by index). It runs
// after mt-differentiate, in place of the training pipeline's mt-recompute,
// and finds the layer by the ops' mt.layer attribute (#mt.layer).
//
// It hands mt-recompute's library entry point the full block policy over
// one layer, with the chosen layer's ops the only ones tagged while it
// runs; the other tags are put back afterwards.
//
//===----------------------------------------------------------------------===//

#include "mt/IR/MtDialect.h"
#include "mt/Transforms/Recompute.h"

#include "mlir/Dialect/Func/IR/FuncOps.h"
#include "mlir/IR/BuiltinOps.h"
#include "mlir/Pass/Pass.h"

using namespace mlir;

namespace {

struct RecomputeLayerPass
    : public PassWrapper<RecomputeLayerPass, OperationPass<ModuleOp>> {
  MLIR_DEFINE_EXPLICIT_INTERNAL_INLINE_TYPE_ID(RecomputeLayerPass)

  RecomputeLayerPass() = default;
  RecomputeLayerPass(const RecomputeLayerPass &other) : PassWrapper(other) {}

  StringRef getArgument() const final { return "example-recompute-layer"; }
  StringRef getDescription() const final {
    return "Recomputes one chosen transformer layer in full (after "
           "mt-differentiate)";
  }

  Option<int64_t> layer{*this, "layer",
                        llvm::cl::desc("The layer to recompute (#mt.layer)"),
                        llvm::cl::init(0)};
  Option<std::string> functionName{
      *this, "function", llvm::cl::desc("The differentiated step function"),
      llvm::cl::init("train_step")};

  void runOnOperation() override {
    auto function = getOperation().lookupSymbol<func::FuncOp>(functionName);
    if (!function) {
      getOperation().emitError()
          << "example-recompute-layer: no function named '" << functionName
          << "'; pass function=<name>";
      return signalPassFailure();
    }
    const int64_t chosen = layer;
    // Untag every op of the other layers while the policy runs.
    SmallVector<std::pair<Operation *, mt::LayerAttr>> others;
    bool found = false;
    function.walk([&](Operation *op) {
      mt::LayerAttr tag = mt::getLayer(op);
      if (!tag)
        return;
      if (tag.getIndex() == chosen) {
        found = true;
        return;
      }
      others.push_back({op, tag});
      op->removeAttr(mt::kLayerAttrName);
    });
    if (!found) {
      for (auto [op, tag] : others)
        op->setAttr(mt::kLayerAttrName, tag);
      function.emitError() << "example-recompute-layer: no op of layer "
                           << chosen << " (no op with mt.layer = #mt.layer<"
                           << chosen << ">); give a layer of the model";
      return signalPassFailure();
    }
    mt::RecomputePolicy policy;
    policy.granularity = mt::RecomputeGranularity::Full;
    policy.method = mt::RecomputeMethod::Block;
    policy.numLayers = 1;
    FailureOr<int64_t> cloned = mt::recomputeActivations(function, policy);
    for (auto [op, tag] : others)
      op->setAttr(mt::kLayerAttrName, tag);
    if (failed(cloned))
      return signalPassFailure();
  }
};

} // namespace

void registerRecomputeLayerPass() { PassRegistration<RecomputeLayerPass>(); }
