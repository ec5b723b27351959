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

LogicalResult FusedOp::verify() {
  Block &body = getBody().front();
  if (body.getNumArguments() != getInputs().size())
    return emitOpError() << "has " << body.getNumArguments()
                         << " block arguments for " << getInputs().size()
                         << " operands; expected one per operand";
  if (getOutputs().empty())
    return emitOpError() << "has no results; a group writes at least one";
  Type type = getOutputs().front().getType();
  for (auto [argument, input] : llvm::zip(body.getArguments(), getInputs()))
    if (argument.getType() != input.getType() || input.getType() != type)
      return emitOpError()
             << "operand of type " << input.getType()
             << " differs from its block argument or from the result type "
             << type << "; every operand and result of a group has one type";
  for (Type result : getResultTypes())
    if (result != type)
      return emitOpError() << "results of types " << type << " and " << result
                           << "; every result of a group has one type";
  // mt.yield is the only terminator whose parent may be a group.
  auto yield = cast<YieldOp>(body.getTerminator());
  if (!llvm::equal(yield.getValues().getTypes(), getResultTypes()))
    return emitOpError() << "yields " << yield.getValues().size()
                         << " values whose types differ from its "
                         << getOutputs().size() << " results";
  // The fusible ops keep their operands' type, so every value inside has
  // the group's type too.
  for (Operation &op : body.without_terminator())
    if (!isFusibleElementwiseOp(&op))
      return emitOpError() << "holds '" << op.getName()
                           << "', which is not an elementwise op a fused "
                              "kernel computes (add, mul, dropout without "
                              "mt.split_axes, silu, swiglu)";
  return success();
}
