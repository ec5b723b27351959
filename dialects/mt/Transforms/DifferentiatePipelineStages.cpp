//===- DifferentiatePipelineStages.cpp - Backward passes of pipeline stages -===//
//
// A pipeline stage's forward function gets the gradient of its output as an
// argument and returns the gradient of its input activation, so the stages
// chain their backward passes through the schedule's send/recv. A stage's
// MoE auxiliary losses (a second result, aux_loss) are seeded with 1.
//
//===----------------------------------------------------------------------===//

#include "mt/IR/MtOps.h"
#include "mt/Transforms/Passes.h"

#include "mlir/Dialect/Func/IR/FuncOps.h"
#include "mlir/IR/Builders.h"

namespace mlir::mt {
#define GEN_PASS_DEF_DIFFERENTIATEPIPELINESTAGESPASS
#include "mt/Transforms/Passes.h.inc"
} // namespace mlir::mt

using namespace mlir;
using namespace mlir::mt;

namespace {

struct DifferentiatePipelineStagesPass
    : public mt::impl::DifferentiatePipelineStagesPassBase<
          DifferentiatePipelineStagesPass> {
  using Base::Base;

  void runOnOperation() override {
    SmallVector<func::FuncOp> stages;
    for (auto function : getOperation().getOps<func::FuncOp>())
      if (function->hasAttr("mt.pipeline_stage") &&
          function.getSymName().starts_with(prefix))
        stages.push_back(function);
    for (func::FuncOp function : stages)
      if (failed(differentiate(function)))
        return signalPassFailure();
  }

  LogicalResult differentiate(func::FuncOp function);
};

} // namespace

LogicalResult
DifferentiatePipelineStagesPass::differentiate(func::FuncOp function) {
  StringAttr nameKey = StringAttr::get(&getContext(), "mt.name");
  // The results after the output are the stage's reported MoE losses:
  // aux_loss (which the runtime adds to the loss), then the logged
  // balancing loss and z_loss, all scalars.
  SmallVector<StringRef> reported = reportedLossResults(function);
  bool auxLoss = !reported.empty();
  bool scalars =
      llvm::all_of(function.getResultTypes().drop_front(), [](Type type) {
        return cast<RankedTensorType>(type).getRank() == 0;
      });
  if (!function.getBody().hasOneBlock() ||
      function.getNumResults() != 1 + reported.size() || !scalars ||
      function.getNumArguments() < 1)
    return function.emitOpError()
           << "is not a pipeline stage: it needs one block, an input and one "
              "result (its output activation or the loss), optionally "
              "followed by scalar results named aux_loss, then "
              "load_balancing_loss (or seq_load_balancing_loss) and z_loss";
  Block &body = function.getBody().front();
  Type outputType = function.getResultTypes().front();
  bool lossStage = cast<RankedTensorType>(outputType).getRank() == 0;
  unsigned seedIndex = function.getNumArguments();
  if (failed(function.insertArgument(
          seedIndex, outputType,
          DictionaryAttr::get(&getContext(),
                              {NamedAttribute(
                                  nameKey,
                                  StringAttr::get(&getContext(),
                                                  lossStage ? "loss_gradient"
                                                            : "output_gradient"))}),
          function.getLoc())))
    return failure();
  Value input = body.getArgument(0);
  // The first stage's input is the tokens, which have no gradient.
  bool activationInput = isa<FloatType>(
      cast<RankedTensorType>(input.getType()).getElementType());
  SmallVector<Value> inputs;
  if (activationInput)
    inputs.push_back(input);
  SmallVector<Value> seeds = {body.getArgument(seedIndex)};
  if (auxLoss) {
    // The auxiliary losses' gradient is the loss's, 1: a fill that the
    // runtime scales as the loss's (fp16's loss scale).
    auto ret = cast<func::ReturnOp>(body.getTerminator());
    OpBuilder builder(ret);
    auto lossType = cast<RankedTensorType>(function.getResultTypes()[1]);
    auto fill = FillOp::create(builder, ret.getLoc(), lossType,
                               builder.getF64FloatAttr(1.0));
    fill->setAttr(kLossSeedAttrName, builder.getUnitAttr());
    seeds.push_back(fill);
  }
  FailureOr<SmallVector<Value>> gradients =
      appendBackwardPass(function, seeds, inputs);
  if (failed(gradients))
    return failure();
  ++numStages;
  if (!activationInput)
    return success();
  Value inputGradient = gradients->front();
  if (!inputGradient)
    return function.emitOpError()
           << "its output does not depend on its input activation, so no "
              "gradient reaches the stage before it";
  auto ret = cast<func::ReturnOp>(body.getTerminator());
  // After the forward results: the output and the auxiliary losses.
  unsigned gradientIndex = function.getNumResults();
  if (failed(function.insertResult(
          gradientIndex, input.getType(),
          DictionaryAttr::get(&getContext(),
                              {NamedAttribute(nameKey,
                                              StringAttr::get(
                                                  &getContext(),
                                                  "input_gradient"))}))))
    return failure();
  ret->insertOperands(gradientIndex, inputGradient);
  return success();
}
