//===- MtFusedOps.cpp - Verifiers of the GEMMs fused with epilogues -------===//
//
// Each fused op is checked as the unfused ops it stands for: its linear
// layer's shape rule (inferLinearType), then the elementwise results' types.
//
//===----------------------------------------------------------------------===//

#include "mt/IR/MtOps.h"
#include "mt/IR/MtShapeRules.h"

using namespace mlir;
using namespace mlir::mt;

/// Checks that `what`, of type `actual`, has the type `expected` derived by a
/// shape rule (which has reported its own failure).
static LogicalResult expectFusedType(Operation *op, StringRef what, Type actual,
                                     FailureOr<RankedTensorType> expected) {
  if (failed(expected))
    return failure();
  if (!matchesUpToPrecision(actual, *expected))
    return op->emitOpError() << what << " has type " << actual
                             << ", the fused linear layer gives " << *expected;
  return success();
}

/// The bias gradient of a `rows x out` gradient: its last dimension.
static RankedTensorType biasTypeOf(RankedTensorType grad) {
  return RankedTensorType::get({grad.getShape().back()}, grad.getElementType());
}

/// The result type of a fused op's linear layer (inferLinearType), whose
/// failure `op` reports.
static FailureOr<RankedTensorType> fusedLinearType(Operation *op, Value input,
                                                   Value weight, Value bias,
                                                   bool transposeWeight) {
  RankedTensorType biasType =
      bias ? cast<RankedTensorType>(bias.getType()) : RankedTensorType();
  return inferLinearType(cast<RankedTensorType>(input.getType()),
                         cast<RankedTensorType>(weight.getType()), biasType,
                         transposeWeight, [op] { return op->emitOpError(); });
}

LogicalResult LinearGeluOp::verify() {
  FailureOr<RankedTensorType> linear = fusedLinearType(
      *this, getInput(), getWeight(), getBias(), getTransposeWeight());
  if (failed(expectFusedType(*this, "pre_activation",
                             getPreActivation().getType(), linear)))
    return failure();
  return expectFusedType(*this, "output", getOutput().getType(), linear);
}

LogicalResult LinearAddOp::verify() {
  FailureOr<RankedTensorType> linear = fusedLinearType(
      *this, getInput(), getWeight(), getBias(), getTransposeWeight());
  if (failed(expectFusedType(*this, "addend", getAddend().getType(), linear)))
    return failure();
  if (getAddend().getType() != getResult().getType())
    return emitOpError() << "addend has type " << getAddend().getType()
                         << ", the result " << getResult().getType()
                         << " (an add of one type)";
  return expectFusedType(*this, "result", getResult().getType(), linear);
}

LogicalResult LinearGeluGradOp::verify() {
  FailureOr<RankedTensorType> linear = fusedLinearType(
      *this, getOutputGrad(), getWeight(), Value(), getTransposeWeight());
  if (failed(expectFusedType(*this, "pre_activation",
                             getPreActivation().getType(), linear)) ||
      failed(expectFusedType(*this, "input_grad", getInputGrad().getType(),
                             linear)))
    return failure();
  if (Value biasGrad = getBiasGrad())
    return expectFusedType(*this, "bias_grad", biasGrad.getType(),
                           biasTypeOf(*linear));
  return success();
}

LogicalResult LinearWeightBiasGradOp::verify() {
  RankedTensorType input = getInput().getType(),
                   grad = getOutputGrad().getType();
  if (input.getRank() < 1 || input.getRank() != grad.getRank() ||
      input.getShape().drop_back() != grad.getShape().drop_back())
    return emitOpError() << "input " << input << " and output_grad " << grad
                         << " must agree on every dimension but the last "
                            "(fused weight gradient)";
  int64_t in = input.getShape().back(), out = grad.getShape().back();
  SmallVector<int64_t> shape = getTransposeWeight()
                                   ? SmallVector<int64_t>{out, in}
                                   : SmallVector<int64_t>{in, out};
  if (failed(expectFusedType(
          *this, "weight_grad", getWeightGrad().getType(),
          RankedTensorType::get(shape, input.getElementType()))))
    return failure();
  return expectFusedType(*this, "bias_grad", getBiasGrad().getType(),
                         biasTypeOf(grad));
}

LogicalResult LinearCrossEntropyOp::verify() {
  auto emitError = [&] { return emitOpError(); };
  RankedTensorType input = getInput().getType(), weight = getWeight().getType();
  FailureOr<RankedTensorType> logits = inferLinearType(
      input, weight, RankedTensorType(), getTransposeWeight(), emitError);
  if (failed(logits))
    return failure();
  if (getReduction() == LossReduction::None)
    return emitOpError() << "takes reduction mean or sum, not none: its "
                            "gradients are computed for one scalar loss "
                            "gradient (keep mt.linear and mt.cross_entropy "
                            "for per-token losses)";
  if (failed(expectFusedType(*this, "loss", getLoss().getType(),
                             inferCrossEntropyType(*logits,
                                                   getLabels().getType(),
                                                   getReduction(), emitError))))
    return failure();
  if (getChunkRows() < 1)
    return emitOpError() << "chunk_rows is " << getChunkRows()
                         << ", expected at least 1 (tokens per chunk)";
  if (failed(expectFusedType(*this, "input_grad", getInputGrad().getType(),
                             input)))
    return failure();
  return expectFusedType(*this, "weight_grad", getWeightGrad().getType(),
                         weight);
}

/// The f32 type of one value per row of `logits` ([rows..., V] ->
/// [rows...]), with `extra` appended when given.
static RankedTensorType perRowType(RankedTensorType logits,
                                   std::optional<int64_t> extra = {}) {
  SmallVector<int64_t> shape(logits.getShape().drop_back());
  if (extra)
    shape.push_back(*extra);
  return RankedTensorType::get(shape, Float32Type::get(logits.getContext()));
}

/// The vocabulary block's logits of a chunked vocabulary op, after checking
/// its chunk.
static FailureOr<RankedTensorType> vocabBlockLogits(Operation *op, Value input,
                                                    Value weight,
                                                    bool transpose,
                                                    int64_t chunkRows) {
  FailureOr<RankedTensorType> logits = inferLinearType(
      cast<RankedTensorType>(input.getType()),
      cast<RankedTensorType>(weight.getType()), RankedTensorType(), transpose,
      [&] { return op->emitOpError(); });
  if (failed(logits))
    return failure();
  if (chunkRows < 1)
    return op->emitOpError() << "chunk_rows is " << chunkRows
                             << ", expected at least 1 (tokens per chunk)";
  return logits;
}

LogicalResult LinearVocabMaxOp::verify() {
  FailureOr<RankedTensorType> logits = vocabBlockLogits(
      *this, getInput(), getWeight(), getTransposeWeight(), getChunkRows());
  if (failed(logits))
    return failure();
  return expectFusedType(*this, "result", getType(), perRowType(*logits));
}

LogicalResult LinearVocabPartialsOp::verify() {
  FailureOr<RankedTensorType> logits = vocabBlockLogits(
      *this, getInput(), getWeight(), getTransposeWeight(), getChunkRows());
  if (failed(logits) ||
      failed(inferCrossEntropyType(*logits, getLabels().getType(),
                                   LossReduction::None,
                                   [&] { return emitOpError(); })) ||
      failed(expectFusedType(*this, "max", getMax().getType(),
                             perRowType(*logits))))
    return failure();
  return expectFusedType(*this, "result", getType(), perRowType(*logits, 2));
}

LogicalResult LinearVocabCrossEntropyGradOp::verify() {
  auto emitError = [&] { return emitOpError(); };
  FailureOr<RankedTensorType> logits = vocabBlockLogits(
      *this, getInput(), getWeight(), getTransposeWeight(), getChunkRows());
  if (failed(logits))
    return failure();
  if (getReduction() == LossReduction::None)
    return emitOpError() << "takes reduction mean or sum, not none (keep "
                            "mt.vocab_cross_entropy_grad for per-token loss "
                            "gradients)";
  if (failed(
          expectFusedType(*this, "loss_grad", getLossGrad().getType(),
                          inferCrossEntropyType(*logits, getLabels().getType(),
                                                getReduction(), emitError))) ||
      failed(expectFusedType(*this, "max", getMax().getType(),
                             perRowType(*logits))) ||
      failed(expectFusedType(*this, "partials", getPartials().getType(),
                             perRowType(*logits, 2))) ||
      failed(expectFusedType(*this, "input_grad", getInputGrad().getType(),
                             getInput().getType())))
    return failure();
  return expectFusedType(*this, "weight_grad", getWeightGrad().getType(),
                         getWeight().getType());
}

LogicalResult ScaleOp::verify() {
  if (getFactor().getType().getRank() != 0)
    return emitOpError() << "factor has type " << getFactor().getType()
                         << ", expected a scalar tensor<f32>";
  if (!matchesUpToPrecision(getType(), getInput().getType()))
    return emitOpError() << "result has type " << getType()
                         << ", expected the input's shape "
                         << getInput().getType();
  return success();
}
