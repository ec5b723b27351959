//===- MtOps.cpp - Verifiers of the mt dialect's operations ---------------===//

#include "mt/IR/MtOps.h"
#include "mt/IR/MtShapeRules.h"

#include "mlir/IR/Builders.h"
#include "mlir/IR/OpImplementation.h"

#include <cmath>

using namespace mlir;
using namespace mlir::mt;

/// Checks an op's declared result type against the one its shape rule
/// derives from the operands.
static LogicalResult verifyResultType(Operation *op, Type actual,
                                      FailureOr<RankedTensorType> expected) {
  if (failed(expected))
    return failure();
  if (!matchesUpToPrecision(actual, *expected))
    return op->emitOpError() << "result type " << actual
                             << " does not match the expected " << *expected;
  return success();
}

/// Returns `value`'s type, or a null type for an absent optional operand.
static RankedTensorType typeOf(Value value) {
  return value ? cast<RankedTensorType>(value.getType()) : RankedTensorType();
}

//===----------------------------------------------------------------------===//
// Parameters
//===----------------------------------------------------------------------===//

LogicalResult ParameterOp::verify() {
  bool needsStd = getInit() == InitMethod::Normal;
  std::optional<double> std;
  if (FloatAttr attr = getStdAttr())
    std = attr.getValueAsDouble();
  if (needsStd && !std)
    return emitOpError() << "init = normal needs a std, e.g. `std = 0.02`";
  if (!needsStd && std)
    return emitOpError() << "init = " << stringifyInitMethod(getInit())
                         << " takes no std, got std = " << *std;
  if (std && !(*std > 0.0))
    return emitOpError() << "std must be positive, got " << *std;
  if (FloatAttr rate = getExpertBiasUpdateRateAttr()) {
    double r = rate.getValueAsDouble();
    if (!(r > 0.0) || !std::isfinite(r))
      return emitOpError()
             << "expert_bias_update_rate must be a finite number > 0, got "
             << r;
    if (getTensorType().getRank() != 1)
      return emitOpError() << "an expert bias (expert_bias_update_rate) is "
                              "one value per expert, got "
                           << getType();
  }
  return success();
}

LogicalResult
GetParameterOp::verifySymbolUses(SymbolTableCollection &symbolTable) {
  auto parameter =
      symbolTable.lookupNearestSymbolFrom<ParameterOp>(*this, getNameAttr());
  if (!parameter)
    return emitOpError() << getNameAttr()
                         << " does not name an mt.parameter in scope";
  if (parameter.getType() != getType())
    return emitOpError() << "result type " << getType()
                         << " does not match the type of parameter "
                         << getNameAttr() << ", " << parameter.getType();
  return success();
}

//===----------------------------------------------------------------------===//
// Embeddings and positions
//===----------------------------------------------------------------------===//

LogicalResult EmbeddingOp::verify() {
  return verifyResultType(
      *this, getType(),
      inferEmbeddingType(getTable().getType(), getIds().getType(),
                         [&] { return emitOpError(); }));
}

LogicalResult PositionIdsOp::verify() {
  if (getType().getRank() < 1)
    return emitOpError() << "result must have a sequence dimension (rank >= "
                            "1), got "
                         << getType();
  return success();
}

//===----------------------------------------------------------------------===//
// Normalization
//===----------------------------------------------------------------------===//

/// Layer and RMS norm share their shape rule and their epsilon check.
static LogicalResult verifyNorm(Operation *op, Value input, Value weight,
                                Value bias, double epsilon) {
  if (!(epsilon > 0.0))
    return op->emitOpError() << "epsilon must be positive, got " << epsilon;
  return verifyResultType(op, op->getResult(0).getType(),
                          inferNormType(typeOf(input), typeOf(weight),
                                        typeOf(bias),
                                        [&] { return op->emitOpError(); }));
}

LogicalResult LayerNormOp::verify() {
  return verifyNorm(*this, getInput(), getWeight(), getBias(),
                    getEpsilon().convertToDouble());
}

LogicalResult RmsNormOp::verify() {
  return verifyNorm(*this, getInput(), getWeight(), Value(),
                    getEpsilon().convertToDouble());
}

//===----------------------------------------------------------------------===//
// Linear algebra
//===----------------------------------------------------------------------===//

LogicalResult LinearOp::verify() {
  return verifyResultType(
      *this, getType(),
      inferLinearType(typeOf(getInput()), typeOf(getWeight()),
                      typeOf(getBias()), getTransposeWeight(),
                      [&] { return emitOpError(); }));
}

LogicalResult BiasAddOp::verify() {
  return verifyResultType(*this, getType(),
                          inferNormType(getInput().getType(),
                                        RankedTensorType(), getBias().getType(),
                                        [&] { return emitOpError(); }));
}

LogicalResult MatmulOp::verify() {
  return verifyResultType(
      *this, getType(),
      inferMatmulType(getLhs().getType(), getRhs().getType(),
                      getTransposeLhs(), getTransposeRhs(),
                      [&] { return emitOpError(); }));
}

//===----------------------------------------------------------------------===//
// Attention
//===----------------------------------------------------------------------===//

LogicalResult AttentionOp::verify() {
  if (FloatAttr scale = getScaleAttr(); scale && !(scale.getValueAsDouble() > 0.0))
    return emitOpError() << "scale must be positive, got "
                         << scale.getValueAsDouble();
  double dropout = getDropoutP().convertToDouble();
  if (!(dropout >= 0.0 && dropout < 1.0))
    return emitOpError() << "dropout_p must be in [0, 1), got " << dropout;
  return verifyResultType(
      *this, getType(),
      inferAttentionType(getQuery().getType(), getKey().getType(),
                         getValue().getType(), getCausal(),
                         [&] { return emitOpError(); }));
}

LogicalResult RopeOp::verify() {
  RankedTensorType type = getInput().getType();
  if (type.getRank() != 4)
    return emitOpError() << "input must be rank 4 (batch x sequence x heads x "
                            "head_dim), got "
                         << type;
  if (!(getBase().convertToDouble() > 0.0))
    return emitOpError() << "base must be positive, got "
                         << getBase().convertToDouble();
  int64_t headDim = type.getDimSize(3);
  int64_t rotaryDim = getRotaryDim().value_or(headDim);
  if (rotaryDim <= 0 || rotaryDim > headDim || rotaryDim % 2 != 0)
    return emitOpError() << "rotary_dim (" << rotaryDim
                         << ") must be even and in (0, head_dim = " << headDim
                         << "]";
  for (std::optional<APFloat> factor :
       {getScalingFactor(), getLowFreqFactor(), getHighFreqFactor()})
    if (factor && !(factor->convertToDouble() > 0.0 &&
                    std::isfinite(factor->convertToDouble())))
      return emitOpError() << "scaling factors must be finite and positive, "
                              "got "
                           << factor->convertToDouble();
  for (std::optional<APFloat> factor :
       {getBetaFast(), getBetaSlow(), getAttentionFactor()})
    if (factor && !(factor->convertToDouble() > 0.0 &&
                    std::isfinite(factor->convertToDouble())))
      return emitOpError() << "beta_fast, beta_slow and attention_factor "
                              "must be finite and positive, got "
                           << factor->convertToDouble();
  int yarn = bool(getBetaFast()) + bool(getBetaSlow());
  if (yarn != 0) {
    if (yarn != 2 || !getScalingFactor() || !getOriginalMaxPositions() ||
        getLowFreqFactor() || getHighFreqFactor())
      return emitOpError() << "yarn scaling needs scaling_factor, "
                              "original_max_positions, beta_fast and "
                              "beta_slow together, without llama3's "
                              "low_freq_factor and high_freq_factor";
    if (*getOriginalMaxPositions() <= 0 ||
        !(getBetaFast()->convertToDouble() > getBetaSlow()->convertToDouble()))
      return emitOpError() << "yarn scaling needs beta_fast ("
                           << getBetaFast()->convertToDouble()
                           << ") above beta_slow ("
                           << getBetaSlow()->convertToDouble()
                           << ") and a positive original_max_positions ("
                           << *getOriginalMaxPositions() << ")";
    return success();
  }
  if (getTruncate())
    return emitOpError() << "truncate belongs to yarn scaling; it needs "
                            "beta_fast and beta_slow";
  int llama3 = bool(getLowFreqFactor()) + bool(getHighFreqFactor()) +
               bool(getOriginalMaxPositions());
  if (llama3 != 0 && (llama3 != 3 || !getScalingFactor()))
    return emitOpError() << "llama3 scaling needs scaling_factor, "
                            "low_freq_factor, high_freq_factor and "
                            "original_max_positions together";
  if (llama3 == 3 && (*getOriginalMaxPositions() <= 0 ||
                      !(getHighFreqFactor()->convertToDouble() >
                        getLowFreqFactor()->convertToDouble())))
    return emitOpError() << "llama3 scaling needs high_freq_factor ("
                         << getHighFreqFactor()->convertToDouble()
                         << ") above low_freq_factor ("
                         << getLowFreqFactor()->convertToDouble()
                         << ") and a positive original_max_positions ("
                         << *getOriginalMaxPositions() << ")";
  return success();
}

//===----------------------------------------------------------------------===//
// Activations, dropout and elementwise arithmetic
//===----------------------------------------------------------------------===//

LogicalResult DropoutOp::verify() {
  double p = getP().convertToDouble();
  if (!(p >= 0.0 && p < 1.0))
    return emitOpError() << "p must be in [0, 1), got " << p;
  return success();
}

LogicalResult SoftmaxOp::verify() {
  return normalizeAxis(getAxis(), getType().getRank(),
                       [&] { return emitOpError(); });
}

//===----------------------------------------------------------------------===//
// Loss
//===----------------------------------------------------------------------===//

LogicalResult CrossEntropyOp::verify() {
  return verifyResultType(
      *this, getType(),
      inferCrossEntropyType(getLogits().getType(), getLabels().getType(),
                            getReduction(), [&] { return emitOpError(); }));
}

//===----------------------------------------------------------------------===//
// Shape manipulation
//===----------------------------------------------------------------------===//

LogicalResult ReshapeOp::verify() {
  int64_t from = getInput().getType().getNumElements();
  int64_t to = getType().getNumElements();
  if (from != to)
    return emitOpError() << "cannot reshape " << getInput().getType() << " ("
                         << from << " elements) to " << getType() << " (" << to
                         << " elements)";
  if (getInput().getType().getElementType() != getType().getElementType())
    return emitOpError() << "reshape keeps the element type, got "
                         << getInput().getType().getElementType() << " -> "
                         << getType().getElementType();
  return success();
}

LogicalResult TransposeOp::verify() {
  return verifyResultType(*this, getType(),
                          inferTransposeType(getInput().getType(),
                                             getPermutation(),
                                             [&] { return emitOpError(); }));
}

/// The ranked tensor types of a range of values.
static SmallVector<RankedTensorType> tensorTypes(TypeRange types) {
  return llvm::map_to_vector(
      types, [](Type type) { return cast<RankedTensorType>(type); });
}

LogicalResult SplitOp::verify() {
  return verifySplitTypes(getInput().getType(),
                          tensorTypes(getResults().getTypes()), getAxis(),
                          [&] { return emitOpError(); });
}

LogicalResult ConcatOp::verify() {
  return verifyResultType(*this, getType(),
                          inferConcatType(tensorTypes(getInputs().getTypes()),
                                          getAxis(),
                                          [&] { return emitOpError(); }));
}

#define GET_OP_CLASSES
#include "mt/IR/MtOps.cpp.inc"
