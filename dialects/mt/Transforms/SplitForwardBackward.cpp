//===- SplitForwardBackward.cpp - A stage's step into forward and backward ---===//
//
// A pipeline schedule runs a stage's forward pass for one micro-batch and its
// backward pass later, after other micro-batches: the differentiated stage
// becomes two functions, and the forward values the backward pass reads
// (the stashed activations) are the forward's extra results and the
// backward's leading arguments.
//
//===----------------------------------------------------------------------===//

#include "mt/IR/MtOps.h"
#include "mt/Transforms/BackwardPass.h"
#include "mt/Transforms/Passes.h"

#include "mlir/Dialect/Func/IR/FuncOps.h"
#include "mlir/IR/Builders.h"
#include "mlir/IR/IRMapping.h"
#include "llvm/ADT/SetVector.h"

namespace mlir::mt {
#define GEN_PASS_DEF_SPLITFORWARDBACKWARDPASS
#include "mt/Transforms/Passes.h.inc"
} // namespace mlir::mt

using namespace mlir;
using namespace mlir::mt;

namespace {

struct SplitForwardBackwardPass
    : public mt::impl::SplitForwardBackwardPassBase<SplitForwardBackwardPass> {
  void runOnOperation() override {
    SmallVector<func::FuncOp> stages;
    for (auto function : getOperation().getOps<func::FuncOp>())
      if (function->hasAttr("mt.pipeline_stage") && seedOf(function) >= 0)
        stages.push_back(function);
    for (func::FuncOp function : stages)
      if (failed(split(function)))
        return signalPassFailure();
  }

  /// The argument that carries the output's gradient, or -1.
  static int seedOf(func::FuncOp function) {
    for (unsigned i = 0, e = function.getNumArguments(); i < e; ++i)
      if (auto name = function.getArgAttrOfType<StringAttr>(i, "mt.name"))
        if (name.getValue() == "output_gradient" ||
            name.getValue() == "loss_gradient")
          return i;
    return -1;
  }

  LogicalResult split(func::FuncOp function);
};

} // namespace

LogicalResult SplitForwardBackwardPass::split(func::FuncOp function) {
  Block &body = function.getBody().front();
  auto ret = cast<func::ReturnOp>(body.getTerminator());
  Value seed = body.getArgument(seedOf(function));
  auto isParameter = [&](Value value) {
    auto argument = dyn_cast<BlockArgument>(value);
    return argument && function.getArgAttr(argument.getArgNumber(),
                                           "mt.parameter");
  };

  // Backward: what depends on the seed, and what only the backward pass
  // reads (no forward result needs it).
  DenseSet<Operation *> backward = backwardOps(function, seed);
  SmallVector<Operation *> ops;
  for (Operation &op : body.without_terminator())
    ops.push_back(&op);
  // The forward's results: the output, and a stage's reported MoE losses
  // (aux_loss) after it; the rest are the backward's.
  unsigned forwardCount = 1 + reportedLossResults(function).size();
  auto forwardOperands = ret.getOperands().take_front(forwardCount);
  auto backwardOperands = ret.getOperands().drop_front(forwardCount);
  for (Value output : forwardOperands)
    if (output.getDefiningOp() && backward.contains(output.getDefiningOp()))
      return function.emitOpError()
             << "returns an output that depends on its output's gradient";

  // Forward values the backward pass reads: stashed, except parameters
  // (each function reads its own) and values without operands (cheaper to
  // make again than to keep, e.g. parameter views).
  llvm::SetVector<Value> stashed;
  SmallVector<Operation *> remade;
  for (Operation *op : ops) {
    if (!backward.contains(op))
      continue;
    for (Value operand : op->getOperands()) {
      Operation *def = operand.getDefiningOp();
      if (operand == seed || isParameter(operand) ||
          (def && backward.contains(def)))
        continue;
      if (def && def->getNumOperands() == 0 && def->getNumRegions() == 0) {
        if (!llvm::is_contained(remade, def))
          remade.push_back(def);
        continue;
      }
      stashed.insert(operand);
    }
  }

  OpBuilder builder(function);
  MLIRContext *context = &getContext();
  auto nameAttr = [&](StringRef name) {
    return DictionaryAttr::get(
        context, {NamedAttribute(StringAttr::get(context, "mt.name"),
                                 StringAttr::get(context, name))});
  };
  auto copyStageAttr = [&](func::FuncOp to) {
    to->setAttr("mt.pipeline_stage", function->getAttr("mt.pipeline_stage"));
  };

  // The forward function: the original arguments but the seed, returning the
  // output and the stash.
  SmallVector<Type> forwardInputs, forwardResults;
  SmallVector<DictionaryAttr> forwardArgAttrs;
  for (BlockArgument argument : body.getArguments()) {
    if (argument == seed)
      continue;
    forwardInputs.push_back(argument.getType());
    forwardArgAttrs.push_back(function.getArgAttrDict(argument.getArgNumber()));
  }
  for (Value output : forwardOperands)
    forwardResults.push_back(output.getType());
  for (Value value : stashed)
    forwardResults.push_back(value.getType());
  auto forward = func::FuncOp::create(
      builder, function.getLoc(), (function.getSymName() + "_forward").str(),
      builder.getFunctionType(forwardInputs, forwardResults));
  copyStageAttr(forward);
  forward.setAllArgAttrs(forwardArgAttrs);
  for (unsigned i = 0; i < forwardCount; ++i)
    forward.setResultAttrs(i, function.getResultAttrDict(i));
  for (unsigned i = forwardCount; i < forwardResults.size(); ++i)
    forward.setResultAttrs(i, nameAttr("stash"));
  {
    Block *block = forward.addEntryBlock();
    IRMapping mapping;
    unsigned next = 0;
    for (BlockArgument argument : body.getArguments())
      if (argument != seed)
        mapping.map(argument, block->getArgument(next++));
    OpBuilder inner = OpBuilder::atBlockEnd(block);
    for (Operation *op : ops)
      if (!backward.contains(op))
        inner.clone(*op, mapping);
    SmallVector<Value> results;
    for (Value output : forwardOperands)
      results.push_back(mapping.lookup(output));
    for (Value value : stashed)
      results.push_back(mapping.lookup(value));
    func::ReturnOp::create(inner, ret.getLoc(), results);
  }

  // The backward function: the stash, the seed, then the parameters it
  // reads; returning the input's gradient (if any) and the gradients.
  SmallVector<Value> backwardArguments(stashed.begin(), stashed.end());
  backwardArguments.push_back(seed);
  for (BlockArgument argument : body.getArguments())
    if (isParameter(argument) &&
        llvm::any_of(argument.getUsers(), [&](Operation *user) {
          return backward.contains(user);
        }))
      backwardArguments.push_back(argument);
  SmallVector<Type> backwardInputs;
  SmallVector<DictionaryAttr> backwardArgAttrs;
  for (Value value : backwardArguments) {
    backwardInputs.push_back(value.getType());
    auto argument = dyn_cast<BlockArgument>(value);
    bool own = argument && argument.getOwner() == &body &&
               (argument == seed || isParameter(argument));
    backwardArgAttrs.push_back(own ? function.getArgAttrDict(
                                         argument.getArgNumber())
                                   : nameAttr("stash"));
  }
  SmallVector<Type> backwardResults(backwardOperands.getTypes());
  auto backwardFunction = func::FuncOp::create(
      builder, function.getLoc(), (function.getSymName() + "_backward").str(),
      builder.getFunctionType(backwardInputs, backwardResults));
  copyStageAttr(backwardFunction);
  backwardFunction.setAllArgAttrs(backwardArgAttrs);
  for (unsigned i = forwardCount; i < ret.getNumOperands(); ++i)
    backwardFunction.setResultAttrs(i - forwardCount,
                                    function.getResultAttrDict(i));
  {
    Block *block = backwardFunction.addEntryBlock();
    IRMapping mapping;
    for (auto [value, argument] :
         llvm::zip_equal(backwardArguments, block->getArguments()))
      mapping.map(value, argument);
    OpBuilder inner = OpBuilder::atBlockEnd(block);
    for (Operation *op : remade)
      inner.clone(*op, mapping);
    for (Operation *op : ops)
      if (backward.contains(op))
        inner.clone(*op, mapping);
    SmallVector<Value> results;
    for (Value value : backwardOperands)
      results.push_back(mapping.lookupOrDefault(value));
    func::ReturnOp::create(inner, ret.getLoc(), results);
  }
  numStashed += stashed.size();
  function.erase();
  return success();
}
