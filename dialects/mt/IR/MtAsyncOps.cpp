//===- MtAsyncOps.cpp - Collectives split into a start and a wait ---------===//

#include "mt/IR/MtOps.h"

using namespace mlir;
using namespace mlir::mt;

/// The shard collectives a start may hold (the dialect is not linked here:
/// ops are matched by name).
static bool isSplittableCollective(Operation *op) {
  return isa_and_present<Operation *>(op) &&
         llvm::is_contained({StringRef("shard.all_reduce"),
                             StringRef("shard.all_gather"),
                             StringRef("shard.reduce_scatter")},
                            op->getName().getStringRef());
}

CollectiveWaitOp CollectiveStartOp::getWait() {
  for (Operation *user : getFuture().getUsers())
    if (auto wait = dyn_cast<CollectiveWaitOp>(user))
      return wait;
  return nullptr;
}

LogicalResult CollectiveStartOp::verify() {
  Block &body = getBody().front();
  if (body.getNumArguments() != 1 ||
      body.getArgument(0).getType() != getInput().getType())
    return emitOpError() << "needs one block argument of the operand's type "
                         << getInput().getType();
  if (body.getOperations().size() != 2 ||
      !isSplittableCollective(&body.front()) || !isa<YieldOp>(body.back()))
    return emitOpError()
           << "holds one shard.all_reduce, shard.all_gather or "
              "shard.reduce_scatter and the mt.yield of its result; found "
           << (body.getOperations().size() - 1) << " op(s), the first '"
           << body.front().getName() << "'";
  Operation *collective = &body.front();
  auto yield = cast<YieldOp>(body.getTerminator());
  if (yield.getValues().size() != 1 ||
      yield.getValues().front() != collective->getResult(0))
    return emitOpError() << "must yield the result of its '"
                         << collective->getName() << "'";
  Type result = collective->getResult(0).getType();
  if (getFuture().getType().getValueType() != result)
    return emitOpError() << "returns " << getFuture().getType()
                         << " for a collective whose result is " << result;
  // One wait (dominance puts it after the start): the memory plan keeps
  // the buffers from the start to it.
  if (!getFuture().hasOneUse() ||
      !isa<CollectiveWaitOp>(*getFuture().getUsers().begin()))
    return emitOpError() << "needs exactly one mt.collective_wait on its "
                            "future; it has "
                         << std::distance(getFuture().use_begin(),
                                          getFuture().use_end())
                         << " use(s)";
  return success();
}
