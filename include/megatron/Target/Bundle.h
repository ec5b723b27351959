//===- Bundle.h - Writes a training bundle (docs/BundleFormat.md) -*- C++ -*-===//

#ifndef MEGATRON_TARGET_BUNDLE_H
#define MEGATRON_TARGET_BUNDLE_H


#include "mlir/IR/BuiltinOps.h"
#include "mlir/Support/LLVM.h"
#include "llvm/Support/JSON.h"

#include <string>

namespace megatron {

/// The bundle's bytes for a module that went through the training pipeline:
/// the header, the JSON manifest (model, parameters, one instruction stream
/// per function) and its SHA-256. The module's `mt.model` attribute
/// (#mt.model), when it has one, is recorded as the manifest's `model`
/// section, after checking that the module is partitioned for the layout it
/// names; a module without it (kernel-level tests) makes a bundle without a
/// model section. What the format cannot express is reported as an error
/// diagnostic at the op.
///
/// `pipeline`, for a pipeline-parallel module: the bundle's `pipeline`
/// section (megatron::PipelinePlan::toJSON); its axis becomes grid axis 0
/// and every parameter records the pipeline rank that holds it.
mlir::FailureOr<std::string>
serializeBundle(mlir::ModuleOp module,
                const llvm::json::Object *pipeline = nullptr);

/// Writes serializeBundle's bytes to `path` through a temporary file renamed
/// into place, so a failed write leaves any earlier file untouched.
mlir::LogicalResult writeBundle(mlir::ModuleOp module, llvm::StringRef path,
                                const llvm::json::Object *pipeline = nullptr);

/// Registers the `--mlir-to-bundle` translation for megatron-translate.
void registerBundleTranslation();

/// The version of docs/BundleFormat.md this writer produces.
constexpr uint32_t kBundleFormatVersion = 12;

} // namespace megatron

#endif // MEGATRON_TARGET_BUNDLE_H
