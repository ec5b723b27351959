//===- FuseGemmEpilogues.cpp - GeLU and bias gradients in GEMM epilogues --===//
//
// Forms mt.linear_gelu, mt.linear_gelu_grad, mt.linear_weight_bias_grad and
// mt.linear_add (MtFusedOps.td) from the ops each one means. A walk in program
// order, one rewrite per matched op; no pattern can undo another, so one sweep
// of each kind reaches the fixed point.
//
//===----------------------------------------------------------------------===//

#include "mt/IR/MtDialect.h"
#include "mt/IR/MtOps.h"
#include "mt/Transforms/Passes.h"

#include "mlir/Dialect/Shard/IR/ShardOps.h"
#include "mlir/IR/Builders.h"

namespace mlir::mt {
#define GEN_PASS_DEF_FUSEGEMMEPILOGUESPASS
#include "mt/Transforms/Passes.h.inc"
} // namespace mlir::mt

using namespace mlir;
using namespace mlir::mt;

namespace {

/// The fused op's location: both ops' (debug information).
Location fusedLoc(Operation *first, Operation *second) {
  return FusedLoc::get(first->getContext(),
                       {first->getLoc(), second->getLoc()});
}

/// Copies the discardable attributes (`mt.layer`, `mt.recomputed`) of
/// `from`.
void copyMarks(Operation *from, Operation *to) {
  for (NamedAttribute attr : from->getDiscardableAttrs())
    to->setDiscardableAttr(attr.getName(), attr.getValue());
}

/// Whether `value` is defined before `op` in op's block (or is an argument
/// of that block), so that an op built at `op` may read it.
bool availableAt(Value value, Operation *op) {
  if (auto argument = dyn_cast<BlockArgument>(value))
    return argument.getOwner() == op->getBlock();
  Operation *definition = value.getDefiningOp();
  return definition->getBlock() == op->getBlock() &&
         definition->isBeforeInBlock(op);
}

/// gelu(linear(x, w, b)) -> linear_gelu(x, w, b): the linear's result is
/// the fused op's pre-activation.
bool fuseLinearGelu(GeluOp gelu) {
  auto linear = gelu.getInput().getDefiningOp<LinearOp>();
  if (!linear || gelu.getApproximate() != GeluApproximation::Tanh ||
      linear->getBlock() != gelu->getBlock())
    return false;
  OpBuilder builder(linear);
  auto fused = LinearGeluOp::create(
      builder, fusedLoc(linear, gelu), gelu.getType(), linear.getType(),
      linear.getInput(), linear.getWeight(), linear.getBias(),
      gelu.getApproximateAttr(), linear.getTransposeWeightAttr());
  copyMarks(linear, fused);
  gelu.getResult().replaceAllUsesWith(fused.getOutput());
  linear.getResult().replaceAllUsesWith(fused.getPreActivation());
  gelu->erase();
  linear->erase();
  return true;
}

/// The first bias_grad of `grad` in `block`, if any.
BiasGradOp biasGradOf(Value grad, Block *block) {
  for (Operation *user : grad.getUsers())
    if (auto biasGrad = dyn_cast<BiasGradOp>(user))
      if (biasGrad->getBlock() == block)
        return biasGrad;
  return BiasGradOp();
}

/// gelu_grad(linear(dy, w), h) -> linear_gelu_grad(dy, w, h), with a
/// bias_grad of the result as its second result. Not where dy is
/// all-gathered (sequence parallelism): --tp-comm-overlap cuts such a GEMM
/// into chunks against the gather's, and a plain linear's chunks need no
/// slices of the pre-activation (the cost model predicts gpt-1.3b's TP2 +
/// SP step 2.8 ms longer with the fused op's).
bool fuseLinearGeluGrad(GeluGradOp geluGrad, bool &withBiasGrad) {
  auto linear = geluGrad.getOutputGrad().getDefiningOp<LinearOp>();
  if (!linear || linear.getBias() || !linear->hasOneUse() ||
      linear->getBlock() != geluGrad->getBlock() ||
      linear.getInput().getDefiningOp<shard::AllGatherOp>())
    return false;
  BiasGradOp biasGrad = biasGradOf(geluGrad.getResult(), geluGrad->getBlock());
  withBiasGrad = static_cast<bool>(biasGrad);
  OpBuilder builder(geluGrad);
  auto fused = LinearGeluGradOp::create(
      builder, fusedLoc(linear, geluGrad), geluGrad.getType(),
      biasGrad ? biasGrad.getType() : Type(), linear.getInput(),
      linear.getWeight(), geluGrad.getInput(), geluGrad.getApproximateAttr(),
      linear.getTransposeWeightAttr());
  copyMarks(linear, fused);
  geluGrad.getResult().replaceAllUsesWith(fused.getInputGrad());
  geluGrad->erase();
  linear->erase();
  if (biasGrad) {
    biasGrad.getResult().replaceAllUsesWith(fused.getBiasGrad());
    biasGrad->erase();
  }
  return true;
}

/// bias_grad(dy) beside linear_weight_grad(x, dy) ->
/// linear_weight_bias_grad(x, dy), built where the earlier of the two was
/// (when the weight gradient's input is available there).
bool fuseBiasGrad(BiasGradOp biasGrad) {
  Value grad = biasGrad.getOutputGrad();
  for (Operation *user : grad.getUsers()) {
    auto weightGrad = dyn_cast<LinearWeightGradOp>(user);
    if (!weightGrad || weightGrad.getOutputGrad() != grad ||
        weightGrad->getBlock() != biasGrad->getBlock())
      continue;
    Operation *at = weightGrad->isBeforeInBlock(biasGrad)
                        ? weightGrad.getOperation()
                        : biasGrad.getOperation();
    if (!availableAt(weightGrad.getInput(), at))
      continue;
    OpBuilder builder(at);
    auto fused = LinearWeightBiasGradOp::create(
        builder, fusedLoc(weightGrad, biasGrad), weightGrad.getType(),
        biasGrad.getType(), weightGrad.getInput(), grad,
        weightGrad.getTransposeWeightAttr());
    copyMarks(weightGrad, fused);
    weightGrad.getResult().replaceAllUsesWith(fused.getWeightGrad());
    biasGrad.getResult().replaceAllUsesWith(fused.getBiasGrad());
    weightGrad->erase();
    biasGrad->erase();
    return true;
  }
  return false;
}

/// add(linear(x, w[, b]), r) -> linear_add(x, w, r[, b]), built at the add,
/// when the linear's result has no other use: r becomes the product's C.
/// Of two linears (one data gradient added to another) the later one takes
/// the sum, so that the earlier's result is ready as its C.
bool fuseLinearAdd(AddOp add) {
  LinearOp linear;
  Value addend;
  for (auto [mine, other] : {std::pair(add.getLhs(), add.getRhs()),
                             std::pair(add.getRhs(), add.getLhs())}) {
    auto candidate = mine.getDefiningOp<LinearOp>();
    if (!candidate || !candidate->hasOneUse() ||
        candidate->getBlock() != add->getBlock())
      continue;
    if (linear && !linear->isBeforeInBlock(candidate))
      continue;
    linear = candidate;
    addend = other;
  }
  if (!linear)
    return false;
  OpBuilder builder(add);
  auto fused =
      LinearAddOp::create(builder, fusedLoc(linear, add), add.getType(),
                          linear.getInput(), linear.getWeight(), addend,
                          linear.getBias(), linear.getTransposeWeightAttr());
  copyMarks(linear, fused);
  add.getResult().replaceAllUsesWith(fused.getResult());
  add->erase();
  linear->erase();
  return true;
}

struct FuseGemmEpiloguesPass
    : public mt::impl::FuseGemmEpiloguesPassBase<FuseGemmEpiloguesPass> {
  using Base::Base;

  /// Each walk collects before rewriting.
  void fuseGelus(ModuleOp module) {
    SmallVector<GeluOp> gelus;
    module.walk([&](GeluOp op) { gelus.push_back(op); });
    for (GeluOp gelu : gelus)
      numLinearGelu += fuseLinearGelu(gelu);
  }

  void fuseGeluGrads(ModuleOp module) {
    SmallVector<GeluGradOp> geluGrads;
    module.walk([&](GeluGradOp op) { geluGrads.push_back(op); });
    for (GeluGradOp geluGrad : geluGrads) {
      bool withBiasGrad = false;
      if (fuseLinearGeluGrad(geluGrad, withBiasGrad)) {
        ++numLinearGeluGrad;
        numBiasGrad += withBiasGrad;
      }
    }
  }

  void runOnOperation() override {
    ModuleOp module = getOperation();
    // Forward first: the backward rewrites read the pre-activations it
    // leaves. Under FP8 the data-gradient GEMM stays a linear, which
    // mt-fp8-gemms casts (it leaves fused GEMMs in bf16).
    if (geluEpilogues)
      fuseGelus(module);
    if (!module->hasAttr(kFp8AttrName))
      fuseGeluGrads(module);
    SmallVector<BiasGradOp> biasGrads;
    module.walk([&](BiasGradOp op) { biasGrads.push_back(op); });
    for (BiasGradOp biasGrad : biasGrads)
      numBiasGrad += fuseBiasGrad(biasGrad);
    // Last, on the linears the other rewrites left; under FP8 the linears
    // are mt-fp8-gemms' to cast.
    if (!linearAdds || module->hasAttr(kFp8AttrName))
      return;
    SmallVector<AddOp> adds;
    module.walk([&](AddOp op) { adds.push_back(op); });
    for (AddOp add : adds)
      numLinearAdd += fuseLinearAdd(add);
  }
};

} // namespace
