//===- MtGradOps.cpp - Verifiers of the mt dialect's backward ops ---------===//

#include "mt/IR/MtOps.h"
#include "mt/IR/MtShapeRules.h"

using namespace mlir;
using namespace mlir::mt;

/// Checks that the value named `what` has the type the rule derives.
static LogicalResult expectType(Operation *op, StringRef what, Type actual,
                                FailureOr<RankedTensorType> expected) {
  if (failed(expected))
    return failure();
  if (!matchesUpToPrecision(actual, *expected))
    return op->emitOpError() << what << " type " << actual
                             << " does not match the expected " << *expected;
  return success();
}

LogicalResult EmbeddingGradOp::verify() {
  RankedTensorType grad = getOutputGrad().getType();
  if (grad.getRank() != getIds().getType().getRank() + 1 ||
      grad.getShape().drop_back() != getIds().getType().getShape())
    return emitOpError() << "output_grad " << grad
                         << " must have the ids' shape "
                         << getIds().getType() << " plus a hidden dimension";
  if (getType().getRank() != 2 ||
      getType().getDimSize(1) != grad.getShape().back() ||
      !areMixablePrecisions(getType().getElementType(), grad.getElementType()))
    return emitOpError() << "result " << getType()
                         << " must be a vocabulary x " << grad.getShape().back()
                         << " table of " << grad.getElementType();
  return success();
}

/// Layer and RMS norm gradients: every gradient has its forward value's type.
static LogicalResult verifyNormGrad(Operation *op, Value outputGrad,
                                    Value input, Value weight, Value inputGrad,
                                    Value weightGrad, Value biasGrad) {
  auto inputType = cast<RankedTensorType>(input.getType());
  auto weightType = cast<RankedTensorType>(weight.getType());
  FailureOr<RankedTensorType> expected =
      inferNormType(inputType, weightType, RankedTensorType(),
                    [&] { return op->emitOpError(); });
  if (failed(expectType(op, "output_grad", outputGrad.getType(), expected)) ||
      failed(expectType(op, "input_grad", inputGrad.getType(), inputType)) ||
      failed(expectType(op, "weight_grad", weightGrad.getType(), weightType)))
    return failure();
  if (biasGrad)
    return expectType(op, "bias_grad", biasGrad.getType(), weightType);
  return success();
}

LogicalResult LayerNormGradOp::verify() {
  return verifyNormGrad(*this, getOutputGrad(), getInput(), getWeight(),
                        getInputGrad(), getWeightGrad(), getBiasGrad());
}

LogicalResult RmsNormGradOp::verify() {
  return verifyNormGrad(*this, getOutputGrad(), getInput(), getWeight(),
                        getInputGrad(), getWeightGrad(), Value());
}

LogicalResult LinearWeightGradOp::verify() {
  RankedTensorType input = getInput().getType(), grad = getOutputGrad().getType();
  if (input.getRank() < 1 || input.getRank() != grad.getRank() ||
      input.getShape().drop_back() != grad.getShape().drop_back())
    return emitOpError() << "input " << input << " and output_grad " << grad
                         << " must agree on every dimension but the last";
  int64_t in = input.getShape().back(), out = grad.getShape().back();
  SmallVector<int64_t> shape = getTransposeWeight() ? SmallVector<int64_t>{out, in}
                                                    : SmallVector<int64_t>{in, out};
  return expectType(*this, "result", getType(),
                    RankedTensorType::get(shape, input.getElementType()));
}

LogicalResult BiasGradOp::verify() {
  RankedTensorType grad = getOutputGrad().getType();
  if (grad.getRank() < 1)
    return emitOpError() << "output_grad must have rank >= 1, got " << grad;
  return expectType(
      *this, "result", getType(),
      RankedTensorType::get({grad.getShape().back()}, grad.getElementType()));
}

LogicalResult AttentionGradOp::verify() {
  FailureOr<RankedTensorType> output = inferAttentionType(
      getQuery().getType(), getKey().getType(), getValue().getType(),
      getCausal(), [&] { return emitOpError(); });
  if (failed(expectType(*this, "output_grad", getOutputGrad().getType(),
                        output)) ||
      failed(expectType(*this, "query_grad", getQueryGrad().getType(),
                        getQuery().getType())) ||
      failed(expectType(*this, "key_grad", getKeyGrad().getType(),
                        getKey().getType())))
    return failure();
  return expectType(*this, "value_grad", getValueGrad().getType(),
                    getValue().getType());
}

LogicalResult SoftmaxGradOp::verify() {
  return normalizeAxis(getAxis(), getType().getRank(),
                       [&] { return emitOpError(); });
}

LogicalResult CrossEntropyGradOp::verify() {
  FailureOr<RankedTensorType> loss =
      inferCrossEntropyType(getLogits().getType(), getLabels().getType(),
                            getReduction(), [&] { return emitOpError(); });
  if (failed(expectType(*this, "loss_grad", getLossGrad().getType(), loss)))
    return failure();
  return expectType(*this, "result", getType(), getLogits().getType());
}

LogicalResult
AccumulateGradientOp::verifySymbolUses(SymbolTableCollection &symbolTable) {
  auto parameter = symbolTable.lookupNearestSymbolFrom<ParameterOp>(
      *this, getParameterAttr());
  if (!parameter)
    return emitOpError() << getParameterAttr()
                         << " does not name an mt.parameter in scope";
  return expectType(*this, "gradient", getGradient().getType(),
                    parameter.getTensorType());
}

//===----------------------------------------------------------------------===//
// Vocabulary-parallel cross-entropy
//===----------------------------------------------------------------------===//

/// The f32 type of one value per row of `logits` ([rows..., V] -> [rows...]),
/// with `extra` appended when given.
static RankedTensorType perRowType(RankedTensorType logits,
                                   std::optional<int64_t> extra = {}) {
  SmallVector<int64_t> shape(logits.getShape().drop_back());
  if (extra)
    shape.push_back(*extra);
  return RankedTensorType::get(shape, Float32Type::get(logits.getContext()));
}

LogicalResult VocabMaxOp::verify() {
  if (getLogits().getType().getRank() < 1)
    return emitOpError() << "logits need a vocabulary dimension, got "
                         << getLogits().getType();
  return expectType(*this, "result", getType(),
                    perRowType(getLogits().getType()));
}

LogicalResult VocabPartialsOp::verify() {
  RankedTensorType logits = getLogits().getType();
  if (failed(inferCrossEntropyType(logits, getLabels().getType(),
                                   LossReduction::None,
                                   [&] { return emitOpError(); })) ||
      failed(expectType(*this, "max", getMax().getType(), perRowType(logits))))
    return failure();
  return expectType(*this, "result", getType(), perRowType(logits, 2));
}

LogicalResult VocabCrossEntropyOp::verify() {
  RankedTensorType partials = getPartials().getType();
  if (partials.getRank() < 1 || partials.getShape().back() != 2)
    return emitOpError() << "partials must be [rows..., 2] (sum of "
                            "exponentials, target logit), got "
                         << partials;
  // The partials stand where the logits stand in cross_entropy.
  return expectType(*this, "result", getType(),
                            inferCrossEntropyType(partials,
                                                  getLabels().getType(),
                                                  getReduction(), [&] {
                                                    return emitOpError();
                                                  }));
}

LogicalResult VocabCrossEntropyGradOp::verify() {
  RankedTensorType logits = getLogits().getType();
  FailureOr<RankedTensorType> loss =
      inferCrossEntropyType(logits, getLabels().getType(), getReduction(),
                            [&] { return emitOpError(); });
  if (failed(expectType(*this, "loss_grad", getLossGrad().getType(), loss)) ||
      failed(expectType(*this, "max", getMax().getType(), perRowType(logits))) ||
      failed(expectType(*this, "partials", getPartials().getType(),
                        perRowType(logits, 2))))
    return failure();
  return expectType(*this, "result", getType(), logits);
}
