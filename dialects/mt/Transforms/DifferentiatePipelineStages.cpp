//===- DifferentiatePipelineStages.cpp - Backward passes of pipeline stages -===//
//
// A pipeline stage's forward function gets the gradient of its output as an
// argument and returns the gradient of its input activation, so the stages
// chain their backward passes through the schedule's send/recv.
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
  if (!function.getBody().hasOneBlock() || function.getNumResults() != 1 ||
      function.getNumArguments() < 1)
    return function.emitOpError()
           << "is not a pipeline stage: it needs one block, an input and one "
              "result (its output activation or the loss)";
  Block &body = function.getBody().front();
  Type outputType = function.getResultTypes().front();
  bool lossStage = cast<RankedTensorType>(outputType).getRank() == 0;
  StringAttr nameKey = StringAttr::get(&getContext(), "mt.name");
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
  FailureOr<SmallVector<Value>> gradients =
      appendBackwardPass(function, body.getArgument(seedIndex), inputs);
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
  if (failed(function.insertResult(
          1, input.getType(),
          DictionaryAttr::get(&getContext(),
                              {NamedAttribute(nameKey,
                                              StringAttr::get(
                                                  &getContext(),
                                                  "input_gradient"))}))))
    return failure();
  ret->insertOperands(1, inputGradient);
  return success();
}
