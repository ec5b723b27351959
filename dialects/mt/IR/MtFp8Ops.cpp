//===- MtFp8Ops.cpp - Verifiers of the FP8 ops ----------------------------===//

#include "mt/IR/MtFp8Ops.h"
#include "mt/IR/MtShapeRules.h"

#include "mlir/IR/Builders.h"
#include "mlir/IR/BuiltinOps.h"
#include "mlir/IR/OpImplementation.h"

using namespace mlir;
using namespace mlir::mt;

#define GET_OP_CLASSES
#include "mt/IR/MtFp8Ops.cpp.inc"

static LogicalResult verifyFormat(Operation *op, Type format) {
  if (!isFp8Type(format))
    return op->emitOpError() << "format " << format
                             << " is not an FP8 format; expected f8E4M3FN or "
                                "f8E5M2";
  return success();
}

/// The meta `name` refers to, or an error.
static LogicalResult verifyMetaUse(Operation *op, FlatSymbolRefAttr name,
                                   SymbolTableCollection &symbolTable) {
  if (!symbolTable.lookupNearestSymbolFrom<Fp8MetaOp>(op, name))
    return op->emitOpError() << "refers to " << name
                             << ", which is not an mt.fp8_meta of the module";
  return success();
}

/// `type` with f32 elements: the FP8 ops' shape rules are mt.linear's.
static RankedTensorType asF32(RankedTensorType type) {
  if (!type)
    return type;
  return RankedTensorType::get(type.getShape(),
                               Float32Type::get(type.getContext()));
}

LogicalResult Fp8MetaOp::verify() {
  return verifyFormat(*this, getFormat());
}

LogicalResult
Fp8ScaleOp::verifySymbolUses(SymbolTableCollection &symbolTable) {
  return verifyMetaUse(*this, getMetaAttr(), symbolTable);
}

LogicalResult
Fp8UpdateOp::verifySymbolUses(SymbolTableCollection &symbolTable) {
  return verifyMetaUse(*this, getMetaAttr(), symbolTable);
}

LogicalResult Fp8CurrentScaleOp::verify() {
  if (getMargin() < 0 || getMargin() > 64)
    return emitOpError() << "margin is " << getMargin()
                         << "; expected 0 to 64";
  return verifyFormat(*this, getFormat());
}

LogicalResult Fp8QuantizeOp::verify() {
  if (getInput().getType().getShape() != getResult().getType().getShape())
    return emitOpError() << "result " << getResult().getType()
                         << " must have the input's shape, "
                         << getInput().getType();
  return success();
}

LogicalResult Fp8LinearOp::verify() {
  Type bias = getBias() ? getBias().getType().getElementType() : Type();
  if (bias && !bias.isF32())
    return emitOpError() << "bias " << getBias().getType()
                         << " must be f32 (the kernels add it in f32)";
  Type result = getType().getElementType();
  if (!result.isBF16() && !result.isF32())
    return emitOpError() << "result " << getType()
                         << " must be bf16 or f32 (the FP8 GEMM's outputs)";
  FailureOr<RankedTensorType> expected = inferLinearType(
      asF32(getInput().getType()), asF32(getWeight().getType()),
      getBias() ? asF32(getBias().getType()) : RankedTensorType(),
      getTransposeWeight(), [&] { return emitOpError(); });
  if (failed(expected))
    return failure();
  if (expected->getShape() != getType().getShape())
    return emitOpError() << "result " << getType() << " must have shape "
                         << *expected << "'s";
  return success();
}

LogicalResult Fp8LinearWeightGradOp::verify() {
  RankedTensorType x = getInput().getType();
  RankedTensorType dy = getOutputGrad().getType();
  if (x.getRank() < 1 || x.getRank() != dy.getRank() ||
      x.getShape().drop_back() != dy.getShape().drop_back())
    return emitOpError() << "input " << x << " and output gradient " << dy
                         << " must agree in every dimension but the last";
  int64_t in = x.getShape().back(), out = dy.getShape().back();
  SmallVector<int64_t, 2> shape =
      getTransposeWeight() ? SmallVector<int64_t, 2>{out, in}
                           : SmallVector<int64_t, 2>{in, out};
  if (getType().getShape() != ArrayRef<int64_t>(shape))
    return emitOpError() << "result " << getType() << " must be "
                         << (getTransposeWeight() ? "out x in" : "in x out")
                         << ": " << shape[0] << "x" << shape[1];
  return success();
}
