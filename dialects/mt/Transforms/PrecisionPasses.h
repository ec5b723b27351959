//===- PrecisionPasses.h - Mixed precision over the mt dialect --*- C++ -*-===//

#ifndef MT_TRANSFORMS_PRECISIONPASSES_H
#define MT_TRANSFORMS_PRECISIONPASSES_H

#include "mt/IR/MtDialect.h"

#include "mlir/Dialect/Func/IR/FuncOps.h"
#include "mlir/IR/BuiltinOps.h"
#include "mlir/Pass/Pass.h"

namespace mlir::mt {

#define GEN_PASS_DECL
#include "mt/Transforms/PrecisionPasses.h.inc"

#define GEN_PASS_REGISTRATION
#include "mt/Transforms/PrecisionPasses.h.inc"

} // namespace mlir::mt

#endif // MT_TRANSFORMS_PRECISIONPASSES_H
