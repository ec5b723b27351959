//===- MtGroupOps.cpp - mt.fused: groups of ops run as one kernel ---------===//

#include "mt/IR/MtOps.h"

using namespace mlir;
using namespace mlir::mt;

bool mlir::mt::isFusibleElementwiseOp(Operation *op) {
  // GeLU and its gradient keep their own kernels (the runtime's bf16 forms,
  // and linear_gelu_grad's column sums).
  if (isa<AddOp, MulOp, SiluOp, SwigluOp>(op))
    return true;
  // A dropout keyed on a rank's tile needs the tile's global position.
  if (auto dropout = dyn_cast<DropoutOp>(op))
    return !dropout->hasAttr("mt.split_axes");
  return false;
}

/// Whether `op` is a column sum of a group value: an mt.bias_grad whose
/// result a group yields (its kernel sums the columns as it computes them).
static bool isGroupColumnSum(Operation *op) {
  return isa<BiasGradOp>(op) &&
         op->getOperand(0).getParentBlock() == op->getBlock();
}

LogicalResult FusedOp::verify() {
  Block &body = getBody().front();
  if (body.getNumArguments() != getInputs().size())
    return emitOpError() << "has " << body.getNumArguments()
                         << " block arguments for " << getInputs().size()
                         << " operands; expected one per operand";
  if (getOutputs().empty())
    return emitOpError() << "has no results; a group writes at least one";
  // mt.yield is the only terminator whose parent may be a group.
  auto yield = cast<YieldOp>(body.getTerminator());
  if (!llvm::equal(yield.getValues().getTypes(), getResultTypes()))
    return emitOpError() << "yields " << yield.getValues().size()
                         << " values whose types differ from its "
                         << getOutputs().size() << " results";
  // The elementwise results share the group's type; a column sum's is the
  // vector of its last dimension.
  Type type;
  for (auto [value, result] : llvm::zip(yield.getValues(), getOutputs()))
    if (!value.getDefiningOp() || !isGroupColumnSum(value.getDefiningOp())) {
      type = result.getType();
      break;
    }
  if (!type)
    return emitOpError() << "yields only column sums; a group writes at "
                            "least one elementwise result";
  for (auto [argument, input] : llvm::zip(body.getArguments(), getInputs()))
    if (argument.getType() != input.getType() || input.getType() != type)
      return emitOpError()
             << "operand of type " << input.getType()
             << " differs from its block argument or from the result type "
             << type << "; every operand and result of a group has one type";
  // The fusible ops keep their operands' type, so every value inside has
  // the group's type too; a column sum is only yielded.
  for (Operation &op : body.without_terminator()) {
    if (isGroupColumnSum(&op)) {
      if (!llvm::all_of(op.getUsers(),
                        [](Operation *user) { return isa<YieldOp>(user); }))
        return emitOpError() << "reads a column sum ('mt.bias_grad') "
                                "inside the group; it can only be yielded";
      continue;
    }
    if (!isFusibleElementwiseOp(&op))
      return emitOpError() << "holds '" << op.getName()
                           << "', which is not an elementwise op a fused "
                              "kernel computes (add, mul, dropout without "
                              "mt.split_axes, silu, swiglu) or a column sum "
                              "of one (bias_grad)";
  }
  return success();
}
