//===- MtFp8Ops.h - FP8 GEMMs and their scaling state -----------*- C++ -*-===//

#ifndef MT_IR_MTFP8OPS_H
#define MT_IR_MTFP8OPS_H

#include "mlir/Bytecode/BytecodeOpInterface.h"
#include "mlir/IR/BuiltinTypes.h"
#include "mlir/IR/OpDefinition.h"
#include "mlir/IR/SymbolTable.h"
#include "mlir/Interfaces/SideEffectInterfaces.h"
#include "mt/IR/MtDialect.h"

#define GET_OP_CLASSES
#include "mt/IR/MtFp8Ops.h.inc"

namespace mlir::mt {
/// Whether `type` is one of the FP8 formats the tensor cores read
/// (f8E4M3FN, f8E5M2).
inline bool isFp8Type(Type type) {
  return isa<Float8E4M3FNType, Float8E5M2Type>(type);
}
} // namespace mlir::mt

#endif // MT_IR_MTFP8OPS_H
