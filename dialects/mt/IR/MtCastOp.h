//===- MtCastOp.h - mt.cast, mixed precision's conversion -------*- C++ -*-===//

#ifndef MT_IR_MTCASTOP_H
#define MT_IR_MTCASTOP_H

#include "mlir/Bytecode/BytecodeOpInterface.h"
#include "mlir/IR/BuiltinTypes.h"
#include "mlir/IR/OpDefinition.h"
#include "mlir/Interfaces/SideEffectInterfaces.h"
#include "mt/IR/MtDialect.h"

#define GET_OP_CLASSES
#include "mt/IR/MtCastOps.h.inc"

#endif // MT_IR_MTCASTOP_H
