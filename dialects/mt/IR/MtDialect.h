//===- MtDialect.h - The mt dialect, its enums and attributes ---*- C++ -*-===//

#ifndef MT_IR_MTDIALECT_H
#define MT_IR_MTDIALECT_H

#include "mlir/IR/Dialect.h"
#include "mlir/IR/BuiltinAttributes.h"
#include "mlir/IR/DialectImplementation.h"

#include "mt/IR/MtDialect.h.inc"
#include "mt/IR/MtEnums.h.inc"

#define GET_ATTRDEF_CLASSES
#include "mt/IR/MtAttrDefs.h.inc"

namespace mlir::mt {
/// The module attribute that says what a module trains (ModelAttr).
inline constexpr llvm::StringLiteral kModelAttrName = "mt.model";
} // namespace mlir::mt

#endif // MT_IR_MTDIALECT_H
