//===- BackwardPass.cpp - Which ops of a differentiated step are backward -===//

#include "mt/Transforms/BackwardPass.h"

#include "mt/IR/MtOps.h"
#include "mt/Transforms/Passes.h"

using namespace mlir;

Value mt::backwardSeed(func::FuncOp function) {
  for (unsigned i = 0, e = function.getNumArguments(); i < e; ++i)
    if (auto name = function.getArgAttrOfType<StringAttr>(i, "mt.name"))
      if (name.getValue() == "output_gradient" ||
          name.getValue() == "loss_gradient")
        return function.getArgument(i);
  Value seed;
  function.walk([&](FillOp fill) {
    if (fill->hasAttr(kLossSeedAttrName))
      seed = fill.getResult();
  });
  return seed;
}

llvm::DenseSet<Operation *> mt::backwardOps(func::FuncOp function, Value seed) {
  Block &body = function.getBody().front();
  llvm::DenseSet<Operation *> backward;
  SmallVector<Operation *> ops;
  for (Operation &op : body.without_terminator()) {
    ops.push_back(&op);
    if (llvm::any_of(op.getOperands(), [&](Value operand) {
          Operation *def = operand.getDefiningOp();
          return operand == seed || (def && backward.contains(def));
        }))
      backward.insert(&op);
  }
  for (Operation *op : llvm::reverse(ops)) {
    if (backward.contains(op) || op->use_empty())
      continue;
    if (llvm::all_of(op->getUsers(),
                     [&](Operation *user) { return backward.contains(user); }))
      backward.insert(op);
  }
  return backward;
}
