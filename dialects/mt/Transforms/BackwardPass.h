//===- BackwardPass.h - The backward ops of a step -------------*- C++ -*-===//
//
// A differentiated step (mt-differentiate, mt-differentiate-pipeline-stages)
// holds its forward and backward passes in one block; the passes that treat
// them apart (mt-split-forward-backward, mt-regather-in-backward) share one
// definition of the backward pass.
//
//===----------------------------------------------------------------------===//

#ifndef MT_TRANSFORMS_BACKWARDPASS_H
#define MT_TRANSFORMS_BACKWARDPASS_H

#include "mlir/Dialect/Func/IR/FuncOps.h"
#include "llvm/ADT/DenseSet.h"

namespace mlir::mt {

/// The gradient that seeds `function`'s backward pass: a pipeline stage's
/// argument named "output_gradient" or "loss_gradient", or the fill marked
/// `mt.loss_seed`; null when it has none.
Value backwardSeed(func::FuncOp function);

/// The backward pass of `function` (one block): every op that depends on
/// `seed`, and every op whose results only the backward pass reads.
llvm::DenseSet<Operation *> backwardOps(func::FuncOp function, Value seed);

} // namespace mlir::mt

#endif // MT_TRANSFORMS_BACKWARDPASS_H
