//===- MtOps.h - Operations of the mt dialect -------------------*- C++ -*-===//

#ifndef MT_IR_MTOPS_H
#define MT_IR_MTOPS_H

#include "mlir/Bytecode/BytecodeOpInterface.h"
#include "mlir/IR/BuiltinTypes.h"
#include "mlir/IR/OpDefinition.h"
#include "mlir/IR/SymbolTable.h"
#include "mlir/Interfaces/SideEffectInterfaces.h"
#include "mt/IR/MtDialect.h"

#define GET_TYPEDEF_CLASSES
#include "mt/IR/MtTypes.h.inc"

#include "mt/IR/MtInterfaces.h.inc"

#define GET_OP_CLASSES
#include "mt/IR/MtOps.h.inc"

namespace mlir::mt {
/// Whether `op` may sit in an mt.fused group: an elementwise op whose
/// operands and result share one type and that a generated kernel computes
/// (add, mul, dropout without mt.split_axes, silu, swiglu).
bool isFusibleElementwiseOp(Operation *op);

/// The most operands, and the most results, of one mt.fused group: the
/// generated kernel's parameters (mt-fuse-elementwise, mt-fuse-column-sums).
inline constexpr size_t kMaxFusedGroupValues = 8;
} // namespace mlir::mt

#endif // MT_IR_MTOPS_H
