//===- MtMoeOps.cpp - Verifiers of the mixture-of-experts ops -------------===//

#include "mt/IR/MtOps.h"
#include "mt/IR/MtShapeRules.h"

#include <cmath>

using namespace mlir;
using namespace mlir::mt;

/// Checks an op's declared type against the one its shape rule derives.
static LogicalResult verifyMoeType(Operation *op, StringRef what, Type actual,
                                   FailureOr<RankedTensorType> expected) {
  if (failed(expected))
    return failure();
  if (!matchesUpToPrecision(actual, *expected))
    return op->emitOpError() << what << " type " << actual
                             << " does not match the expected " << *expected;
  return success();
}

/// A loss coefficient: finite and not negative.
static LogicalResult verifyCoefficient(Operation *op, double coeff) {
  if (!std::isfinite(coeff) || coeff < 0.0)
    return op->emitOpError()
           << "coeff must be a finite number >= 0, got " << coeff;
  return success();
}

/// A loss's scalar (or its incoming gradient's).
static LogicalResult verifyScalar(Operation *op, StringRef what,
                                  RankedTensorType type) {
  if (type.getRank() != 0)
    return op->emitOpError()
           << what << " must be a scalar tensor<f32>, got " << type;
  return success();
}

/// Group-limited routing's attributes: both or neither; the groups divide
/// the experts, and the kept groups hold the top-k, at least one expert's
/// score from each.
static LogicalResult verifyMoeGroups(Operation *op, int64_t experts,
                                     int64_t topk,
                                     std::optional<uint64_t> numGroups,
                                     std::optional<uint64_t> groupTopk) {
  if (!numGroups && !groupTopk)
    return success();
  if (!numGroups || !groupTopk)
    return op->emitOpError()
           << "num_groups and group_topk go together (group-limited routing)";
  int64_t groups = static_cast<int64_t>(*numGroups);
  int64_t kept = static_cast<int64_t>(*groupTopk);
  if (groups < 1 || experts % groups != 0)
    return op->emitOpError() << "num_groups " << groups << " must divide the "
                             << experts << " experts";
  if (kept < 1 || kept > groups || kept > topk)
    return op->emitOpError()
           << "group_topk " << kept << " must be in [1, min(num_groups "
           << groups << ", topk " << topk
           << ")]: each kept group's score sums its topk / group_topk "
              "highest scores";
  if (topk > kept * (experts / groups))
    return op->emitOpError()
           << "topk " << topk << " exceeds the " << kept * (experts / groups)
           << " experts of the " << kept << " kept groups";
  return success();
}

/// The expert bias of aux-loss-free balancing: `[E]` f32, sigmoid scores.
static LogicalResult verifyExpertBias(Operation *op, Value bias,
                                      int64_t experts, MoeScoreFunction score) {
  if (!bias)
    return success();
  auto type = cast<RankedTensorType>(bias.getType());
  if (type.getRank() != 1 || type.getDimSize(0) != experts ||
      !type.getElementType().isF32())
    return op->emitOpError() << "expert_bias must be tensor<" << experts
                             << "xf32> (one f32 per expert), got " << type;
  if (score != MoeScoreFunction::Sigmoid)
    return op->emitOpError()
           << "expert_bias applies to sigmoid scores only (Megatron-LM's "
              "aux-loss-free balancing), not "
           << stringifyMoeScoreFunction(score);
  return success();
}

LogicalResult MoeRouteOp::verify() {
  auto emit = [&] { return emitOpError(); };
  FailureOr<RankedTensorType> probs =
      inferMoeRouteType(getLogits().getType(), getTopk(), emit);
  if (failed(
          verifyMoeType(*this, "routing weights", getProbs().getType(), probs)))
    return failure();
  if (getIndices().getType().getShape() != probs->getShape())
    return emitOpError() << "routing indices type " << getIndices().getType()
                         << " must have the weights' shape ["
                         << probs->getDimSize(0) << ", " << probs->getDimSize(1)
                         << "]";
  std::optional<APFloat> factor = getCapacityFactor();
  if (factor && !(factor->convertToDouble() > 0.0 &&
                  std::isfinite(factor->convertToDouble())))
    return emitOpError() << "capacity_factor must be a finite number > 0, got "
                         << factor->convertToDouble();
  if (getDropPolicy() && !factor)
    return emitOpError() << "drop_policy needs a capacity_factor: dropless "
                            "routing drops nothing";
  if (failed(verifyExpertBias(*this, getExpertBias(),
                              getLogits().getType().getDimSize(1),
                              getScoreFunction())))
    return failure();
  return verifyMoeGroups(*this, getLogits().getType().getDimSize(1), getTopk(),
                         getNumGroups(), getGroupTopk());
}

/// The sequence-level aux loss's sequences: S >= 1 dividing the T tokens.
static LogicalResult verifySequences(Operation *op, int64_t tokens,
                                     std::optional<uint64_t> sequenceLength) {
  if (!sequenceLength)
    return success();
  int64_t s = static_cast<int64_t>(*sequenceLength);
  if (s < 1 || (tokens >= 0 && tokens % s != 0))
    return op->emitOpError() << "per_sequence " << s << " must divide the "
                             << tokens << " tokens into whole sequences";
  return success();
}

LogicalResult MoeAuxLossOp::verify() {
  if (failed(inferMoeRouteType(getLogits().getType(), getTopk(),
                               [&] { return emitOpError(); })) ||
      failed(verifyCoefficient(*this, getCoeff().convertToDouble())) ||
      failed(verifySequences(*this, getLogits().getType().getDimSize(0),
                             getSequenceLength())))
    return failure();
  return verifyScalar(*this, "the loss", getType());
}

LogicalResult MoeZLossOp::verify() {
  // The top-k does not matter to the z-loss; 1 is always in range.
  if (failed(inferMoeRouteType(getLogits().getType(), 1,
                               [&] { return emitOpError(); })) ||
      failed(verifyCoefficient(*this, getCoeff().convertToDouble())))
    return failure();
  return verifyScalar(*this, "the loss", getType());
}

LogicalResult MoePermuteOp::verify() {
  auto probs = getProbs() ? cast<RankedTensorType>(getProbs().getType())
                          : RankedTensorType();
  return verifyMoeType(*this, "result", getType(),
                       inferMoePermuteType(getInput().getType(),
                                           getIndices().getType(), probs,
                                           [&] { return emitOpError(); }));
}

LogicalResult MoeUnpermuteOp::verify() {
  auto probs = getProbs() ? cast<RankedTensorType>(getProbs().getType())
                          : RankedTensorType();
  return verifyMoeType(*this, "result", getType(),
                       inferMoeUnpermuteType(getRows().getType(),
                                             getIndices().getType(), probs,
                                             [&] { return emitOpError(); }));
}

LogicalResult MoeGroupedLinearOp::verify() {
  return verifyMoeType(
      *this, "result", getType(),
      inferMoeGroupedLinearType(getInput().getType(), getWeight().getType(),
                                getIndices().getType(), getTransposeWeight(),
                                [&] { return emitOpError(); }));
}

LogicalResult MoeRouteGradOp::verify() {
  auto emit = [&] { return emitOpError(); };
  RankedTensorType logits = getLogits().getType();
  FailureOr<RankedTensorType> probs =
      inferMoeRouteType(logits, getTopk(), emit);
  if (failed(verifyMoeType(*this, "routing weights' gradient",
                           getProbsGrad().getType(), probs)) ||
      failed(verifyMoeRouting(getIndices().getType(), *probs,
                              logits.getDimSize(0), emit)) ||
      failed(verifyMoeGroups(*this, logits.getDimSize(1), getTopk(),
                             getNumGroups(), getGroupTopk())) ||
      failed(verifyExpertBias(*this, getExpertBias(), logits.getDimSize(1),
                              getScoreFunction())))
    return failure();
  return verifyMoeType(*this, "result", getType(), logits);
}

LogicalResult MoeTokensPerExpertOp::verify() {
  RankedTensorType indices = getIndices().getType(), result = getType();
  if (indices.getRank() != 2)
    return emitOpError() << "routing indices must be rank 2 (tokens x topk), "
                            "got "
                         << indices;
  if (result.getRank() != 1)
    return emitOpError() << "result must be rank 1 (one count per expert), "
                            "got "
                         << result;
  return success();
}

LogicalResult MoeAuxLossGradOp::verify() {
  RankedTensorType logits = getLogits().getType();
  if (failed(inferMoeRouteType(logits, getTopk(),
                               [&] { return emitOpError(); })) ||
      failed(verifyCoefficient(*this, getCoeff().convertToDouble())) ||
      failed(
          verifyScalar(*this, "the loss gradient", getLossGrad().getType())) ||
      failed(verifySequences(*this, logits.getDimSize(0), getSequenceLength())))
    return failure();
  return verifyMoeType(*this, "result", getType(), logits);
}

LogicalResult MoeZLossGradOp::verify() {
  RankedTensorType logits = getLogits().getType();
  if (failed(inferMoeRouteType(logits, 1, [&] { return emitOpError(); })) ||
      failed(verifyCoefficient(*this, getCoeff().convertToDouble())) ||
      failed(verifyScalar(*this, "the loss gradient", getLossGrad().getType())))
    return failure();
  return verifyMoeType(*this, "result", getType(), logits);
}

LogicalResult MoeProbsGradOp::verify() {
  auto emit = [&] { return emitOpError(); };
  RankedTensorType indices = getIndices().getType();
  if (failed(verifyMoeType(*this, "tokens", getTokens().getType(),
                           inferMoeUnpermuteType(getRows().getType(), indices,
                                                 RankedTensorType(), emit))))
    return failure();
  return verifyMoeType(
      *this, "result", getType(),
      RankedTensorType::get(indices.getShape(),
                            getTokens().getType().getElementType()));
}

LogicalResult MoeGroupedLinearWeightGradOp::verify() {
  RankedTensorType weight = getType();
  if (weight.getRank() != 3 || weight.getDimSize(0) < 1)
    return emitOpError() << "result must be the expert weights, rank 3 with "
                            "at least one expert, got "
                         << weight;
  return verifyMoeType(
      *this, "output gradient", getOutputGrad().getType(),
      inferMoeGroupedLinearType(getInput().getType(), weight,
                                getIndices().getType(), getTransposeWeight(),
                                [&] { return emitOpError(); }));
}
