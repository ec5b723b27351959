//===- VerifyCollectives.cpp - Every rank issues the same collectives -----===//
//
// A plan that could hang is one where ranks of a group disagree on the next
// collective. SPMD functions can only disagree through control flow that
// depends on the rank or through shapes known only at run time; per-rank
// functions are compared collective by collective.
//
//===----------------------------------------------------------------------===//

#include "mt/Transforms/Passes.h"

#include "mlir/Dialect/Func/IR/FuncOps.h"
#include "mlir/Dialect/Shard/IR/ShardOps.h"
#include "mlir/IR/BuiltinAttributes.h"
#include "llvm/ADT/DenseSet.h"
#include "llvm/ADT/MapVector.h"

namespace mlir::mt {
#define GEN_PASS_DEF_VERIFYCOLLECTIVESPASS
#include "mt/Transforms/Passes.h.inc"
} // namespace mlir::mt

using namespace mlir;

namespace {

bool isCollective(Operation *op) {
  return isa<shard::AllGatherOp, shard::AllReduceOp, shard::AllSliceOp,
             shard::AllToAllOp, shard::BroadcastOp, shard::GatherOp,
             shard::RecvOp, shard::ReduceOp, shard::ReduceScatterOp,
             shard::ScatterOp, shard::SendOp, shard::ShiftOp>(op);
}

bool readsRank(Operation *op) {
  return isa<shard::ProcessMultiIndexOp, shard::ProcessLinearIndexOp,
             shard::NeighborsLinearIndicesOp>(op);
}

/// The values of `function` that depend on the rank: results of the process
/// index ops and of every op that reads one, and the block arguments of
/// regions whose op reads one (a loop's induction variable).
llvm::DenseSet<Value> rankDependentValues(func::FuncOp function) {
  llvm::DenseSet<Value> dependent;
  auto reads = [&](Operation *op) {
    return readsRank(op) || llvm::any_of(op->getOperands(), [&](Value v) {
             return dependent.contains(v);
           });
  };
  // Values can flow into a region's results from its yields; iterate until
  // nothing changes (a few passes over the function at most).
  bool changed = true;
  while (changed) {
    changed = false;
    function.walk<WalkOrder::PreOrder>([&](Operation *op) {
      if (!reads(op))
        return;
      for (Value result : op->getResults())
        changed |= dependent.insert(result).second;
      for (Region &region : op->getRegions())
        for (Block &block : region)
          for (BlockArgument argument : block.getArguments())
            changed |= dependent.insert(argument).second;
    });
  }
  return dependent;
}

std::string describe(Operation *op) {
  std::string text;
  llvm::raw_string_ostream os(text);
  os << op->getName() << " " << op->getAttrDictionary() << " : (";
  llvm::interleaveComma(op->getOperandTypes(), os);
  os << ") -> (";
  llvm::interleaveComma(op->getResultTypes(), os);
  os << ")";
  return text;
}

/// What every rank of the group must agree on: the operation and its
/// attributes (grid, grid axes, reduction, axes), the operand and result
/// types (shapes and element types).
bool sameCollective(Operation *a, Operation *b) {
  return a->getName() == b->getName() &&
         a->getAttrDictionary() == b->getAttrDictionary() &&
         a->getOperandTypes() == b->getOperandTypes() &&
         a->getResultTypes() == b->getResultTypes();
}

struct VerifyCollectivesPass
    : public mt::impl::VerifyCollectivesPassBase<VerifyCollectivesPass> {
  void runOnOperation() override;
  LogicalResult checkSpmd(func::FuncOp function);
  LogicalResult checkRankPrograms(StringRef step,
                                  ArrayRef<func::FuncOp> programs);
};

} // namespace

LogicalResult VerifyCollectivesPass::checkSpmd(func::FuncOp function) {
  llvm::DenseSet<Value> dependent = rankDependentValues(function);
  // A branch on the rank in unstructured control flow may skip any block
  // but the entry block.
  Operation *rankBranch = nullptr;
  function.walk([&](Operation *op) {
    if (!rankBranch && op->hasTrait<OpTrait::IsTerminator>() &&
        op->getNumSuccessors() > 1 &&
        llvm::any_of(op->getOperands(),
                     [&](Value v) { return dependent.contains(v); }))
      rankBranch = op;
  });
  WalkResult result = function.walk([&](Operation *op) {
    if (!isCollective(op))
      return WalkResult::advance();
    ++numChecked;
    for (Type type : llvm::concat<Type>(llvm::to_vector(op->getOperandTypes()),
                                        llvm::to_vector(op->getResultTypes())))
      if (auto shaped = dyn_cast<ShapedType>(type); shaped && !shaped.hasStaticShape()) {
        op->emitError() << "mt-verify-collectives: " << op->getName()
                        << " has the dynamic type " << type
                        << ": ranks could disagree on its size and hang; "
                           "collectives need static shapes";
        return WalkResult::interrupt();
      }
    for (Operation *parent = op->getParentOp(); parent && parent != function;
         parent = parent->getParentOp())
      for (Value operand : parent->getOperands())
        if (dependent.contains(operand)) {
          InFlightDiagnostic diag = op->emitError()
              << "mt-verify-collectives: " << op->getName()
              << " runs under " << parent->getName()
              << ", whose operands depend on the rank: ranks that skip it "
                 "leave the others of its group waiting; issue collectives "
                 "on every rank (select the data instead of the call)";
          diag.attachNote(parent->getLoc()) << "the rank-dependent control flow";
          return WalkResult::interrupt();
        }
    if (rankBranch && op->getBlock() != &function.getBody().front()) {
      InFlightDiagnostic diag = op->emitError()
          << "mt-verify-collectives: " << op->getName()
          << " is in a block that a branch on the rank may skip: ranks that "
             "skip it leave the others of its group waiting; issue "
             "collectives on every rank";
      diag.attachNote(rankBranch->getLoc()) << "the branch on the rank";
      return WalkResult::interrupt();
    }
    return WalkResult::advance();
  });
  return failure(result.wasInterrupted());
}

LogicalResult
VerifyCollectivesPass::checkRankPrograms(StringRef step,
                                         ArrayRef<func::FuncOp> programs) {
  ModuleOp module = getOperation();
  // Every rank of the grid needs exactly one program of the step.
  int64_t ranks = 1;
  for (auto grid : module.getOps<shard::GridOp>())
    for (int64_t size : grid.getShape())
      ranks *= size;
  llvm::DenseMap<int64_t, func::FuncOp> byRank;
  for (func::FuncOp program : llvm::to_vector(programs)) {
    auto rank = program->getAttrOfType<IntegerAttr>("mt.rank");
    if (!rank)
      return program.emitError()
             << "mt-verify-collectives: " << program.getSymName()
             << " has mt.step = \"" << step
             << "\" but no integer mt.rank; give each rank's program its "
                "rank";
    int64_t index = rank.getInt();
    if (index < 0 || index >= ranks)
      return program.emitError()
             << "mt-verify-collectives: " << program.getSymName()
             << " is the program of rank " << index << ", outside the grid's "
             << ranks << " ranks";
    auto [it, inserted] = byRank.try_emplace(index, program);
    if (!inserted)
      return program.emitError()
             << "mt-verify-collectives: " << program.getSymName() << " and "
             << it->second.getSymName() << " are both rank " << index
             << "'s program of step '" << step << "'";
  }
  if (static_cast<int64_t>(byRank.size()) != ranks) {
    int64_t missing = 0;
    while (byRank.count(missing))
      ++missing;
    func::FuncOp some = programs.front();
    return some.emitError()
           << "mt-verify-collectives: step '" << step << "' has programs for "
           << byRank.size() << " of the grid's " << ranks
           << " ranks (none for rank " << missing
           << "); a rank without the step never joins its collectives";
  }

  auto collectivesOf = [&](func::FuncOp program) {
    SmallVector<Operation *> ops;
    program.walk([&](Operation *op) {
      if (isCollective(op))
        ops.push_back(op);
    });
    return ops;
  };
  func::FuncOp first = byRank.lookup(0);
  SmallVector<Operation *> reference = collectivesOf(first);
  for (int64_t rank = 1; rank < ranks; ++rank) {
    func::FuncOp program = byRank.lookup(rank);
    SmallVector<Operation *> mine = collectivesOf(program);
    numChecked += mine.size();
    size_t common = std::min(mine.size(), reference.size());
    for (size_t i = 0; i < common; ++i) {
      if (sameCollective(reference[i], mine[i]))
        continue;
      InFlightDiagnostic diag = mine[i]->emitError()
          << "mt-verify-collectives: collective " << i + 1 << " of step '"
          << step << "' differs between rank 0 and rank " << rank
          << ": rank 0 issues " << describe(reference[i]) << ", rank "
          << rank << " issues " << describe(mine[i])
          << "; the ranks would wait on each other forever";
      diag.attachNote(reference[i]->getLoc()) << "rank 0's collective";
      return failure();
    }
    if (mine.size() != reference.size())
      return program.emitError()
             << "mt-verify-collectives: rank " << rank << " issues "
             << mine.size() << " collectives in step '" << step
             << "' but rank 0 issues " << reference.size()
             << "; the ranks would wait on each other forever";
  }
  numChecked += reference.size();
  return success();
}

void VerifyCollectivesPass::runOnOperation() {
  llvm::MapVector<StringRef, SmallVector<func::FuncOp>> rankPrograms;
  bool failed = false;
  for (auto function : getOperation().getOps<func::FuncOp>()) {
    if (function.isExternal())
      continue;
    if (auto step = function->getAttrOfType<StringAttr>("mt.step"))
      rankPrograms[step.getValue()].push_back(function);
    failed |= mlir::failed(checkSpmd(function));
  }
  for (auto &[step, programs] : rankPrograms)
    failed |= mlir::failed(checkRankPrograms(step, programs));
  if (failed)
    signalPassFailure();
  markAllAnalysesPreserved();
}
