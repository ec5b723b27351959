//===- InitAll.h - The one place every tool registers what it uses -*- C++ -*-===//

#ifndef MEGATRON_INITALL_H
#define MEGATRON_INITALL_H

namespace mlir {
class DialectRegistry;
} // namespace mlir

namespace megatron {

/// Adds the project's dialects, the upstream dialects the compiler uses
/// (shard, func, arith, tensor, linalg, scf) and their interface models.
void registerAllDialects(mlir::DialectRegistry &registry);

/// Registers the project's passes and pipelines, those of the upstream
/// dialects above, and the generic transforms (canonicalize, cse, ...).
void registerAllPasses();

} // namespace megatron

#endif // MEGATRON_INITALL_H
