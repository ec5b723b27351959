//===- MtCastOp.cpp - The verifier of mt.cast -----------------------------===//

#include "mt/IR/MtCastOp.h"
#include "mt/IR/MtShapeRules.h"

#include "mlir/IR/Builders.h"
#include "mlir/IR/ImplicitLocOpBuilder.h"
#include "mlir/IR/OpImplementation.h"

using namespace mlir;
using namespace mlir::mt;

#define GET_OP_CLASSES
#include "mt/IR/MtCastOps.cpp.inc"

LogicalResult CastOp::verify() {
  Type from = getInput().getType().getElementType();
  Type to = getType().getElementType();
  if (from == to)
    return emitOpError() << "converts " << from
                         << " to itself; remove the cast";
  if (!areMixablePrecisions(from, to))
    return emitOpError() << "converts " << from << " to " << to
                         << "; a cast joins f32 with bf16 or f16";
  return success();
}
