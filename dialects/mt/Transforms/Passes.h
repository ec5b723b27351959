//===- Passes.h - Passes over the mt dialect --------------------*- C++ -*-===//

#ifndef MT_TRANSFORMS_PASSES_H
#define MT_TRANSFORMS_PASSES_H

#include "mt/IR/MtDialect.h"

#include "mlir/Dialect/Shard/IR/ShardDialect.h"
#include "mlir/IR/BuiltinOps.h"
#include "mlir/Pass/Pass.h"

namespace mlir::mt {

#define GEN_PASS_DECL
#include "mt/Transforms/Passes.h.inc"

#define GEN_PASS_REGISTRATION
#include "mt/Transforms/Passes.h.inc"

/// Writes the parameter table of `module` (see mt-print-parameter-table).
void printParameterTable(ModuleOp module, llvm::raw_ostream &os);

/// Writes the collectives of each function of a partitioned `module` (see
/// mt-print-collectives).
void printCollectives(ModuleOp module, llvm::raw_ostream &os);

} // namespace mlir::mt

#endif // MT_TRANSFORMS_PASSES_H
