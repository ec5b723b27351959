//===- Recompute.h - Activation recomputation policies ---------*- C++ -*-===//
//
// Megatron-LM's recomputation policies as a transformation of a
// differentiated step function: the forward ops a policy recomputes are
// cloned into the backward pass right before their first backward use, so the
// activations they saved die at their last forward use (mt-recompute).
//
//===----------------------------------------------------------------------===//

#ifndef MT_TRANSFORMS_RECOMPUTE_H
#define MT_TRANSFORMS_RECOMPUTE_H

#include "mlir/Dialect/Func/IR/FuncOps.h"
#include "mlir/Support/LLVM.h"

#include <cstdint>
#include <string>

namespace mlir::mt {

enum class RecomputeGranularity { None, Selective, Full };
enum class RecomputeMethod { Uniform, Block };

/// Megatron-LM's --recompute-granularity, --recompute-method and
/// --recompute-num-layers.
struct RecomputePolicy {
  RecomputeGranularity granularity = RecomputeGranularity::None;
  RecomputeMethod method = RecomputeMethod::Uniform;
  int64_t numLayers = 1;

  /// "none", "selective", "full uniform 2", "full block 4".
  std::string str() const;
};

/// The name of the discardable unit attribute on recomputed clones; it keeps
/// CSE from merging a clone back into its original.
inline constexpr llvm::StringLiteral kRecomputedAttrName = "mt.recomputed";

/// Applies `policy` to `function`, whose backward pass follows the op that
/// defines its returned loss (mt-differentiate's layout). Layers are found by
/// the ops' `mt.layer` attributes (#mt.layer, mt/IR/MtDialect.h): selective recomputes each
/// layer's core attention; full uniform recomputes every layer, checkpointing
/// the input of each group of numLayers layers; full block recomputes the
/// first numLayers layers, each from its own input. Layers count from the
/// function's first (a pipeline stage's, Megatron-LM's per-stage policy).
/// Returns the number of cloned ops, or failure with a diagnostic.
FailureOr<int64_t> recomputeActivations(func::FuncOp function,
                                        const RecomputePolicy &policy);

} // namespace mlir::mt

#endif // MT_TRANSFORMS_RECOMPUTE_H
