//===- MtOps.h - Operations of the mt dialect -------------------*- C++ -*-===//

#ifndef MT_IR_MTOPS_H
#define MT_IR_MTOPS_H

#include "mlir/Bytecode/BytecodeOpInterface.h"
#include "mlir/IR/BuiltinTypes.h"
#include "mlir/IR/OpDefinition.h"
#include "mlir/IR/SymbolTable.h"
#include "mlir/Interfaces/SideEffectInterfaces.h"
#include "mt/IR/MtDialect.h"

#include "mt/IR/MtInterfaces.h.inc"

#define GET_OP_CLASSES
#include "mt/IR/MtOps.h.inc"

#endif // MT_IR_MTOPS_H
