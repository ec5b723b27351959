//===- FuseElementwise.cpp - Chains of elementwise ops into mt.fused ------===//

#include "mt/IR/MtDialect.h"
#include "mt/IR/MtOps.h"
#include "mt/Transforms/Passes.h"

#include "mlir/IR/Builders.h"
#include "mlir/IR/IRMapping.h"

namespace mlir::mt {
#define GEN_PASS_DEF_FUSEELEMENTWISEPASS
#include "mt/Transforms/Passes.h.inc"
} // namespace mlir::mt

using namespace mlir;
using namespace mlir::mt;

namespace {

/// A group of ops in block order; it becomes one mt.fused at its last op.
struct Group {
  SmallVector<Operation *> ops;
  DenseSet<Operation *> members;
  Type type;

  bool contains(Operation *op) const { return members.contains(op); }

  /// Values the group reads that it does not compute, in first-use order.
  SmallVector<Value> inputs(Operation *extra = nullptr) const {
    SmallVector<Value> result;
    auto visit = [&](Operation *op) {
      for (Value operand : op->getOperands()) {
        Operation *def = operand.getDefiningOp();
        if ((def && (contains(def) || def == extra)) ||
            llvm::is_contained(result, operand))
          continue;
        result.push_back(operand);
      }
    };
    for (Operation *op : ops)
      visit(op);
    if (extra)
      visit(extra);
    return result;
  }

  /// Values the group computes that something outside it reads.
  SmallVector<Value> outputs(Operation *extra = nullptr) const {
    SmallVector<Value> result;
    auto visit = [&](Operation *op) {
      for (Value value : op->getResults())
        if (llvm::any_of(value.getUsers(), [&](Operation *user) {
              return !contains(user) && user != extra;
            }))
          result.push_back(value);
    };
    for (Operation *op : ops)
      visit(op);
    if (extra)
      visit(extra);
    return result;
  }

  /// Whether `op` may join: same type, every outside use of the group's
  /// values after `op` (the group moves to `op`'s position), and the
  /// kernel's parameter limits kept.
  bool canJoin(Operation *op) const {
    if (op->getResult(0).getType() != type)
      return false;
    for (Operation *member : ops)
      for (Value value : member->getResults())
        for (Operation *user : value.getUsers())
          if (!contains(user) && user != op &&
              (user->getBlock() != op->getBlock() ||
               !op->isBeforeInBlock(user)))
            return false;
    return inputs(op).size() <= kMaxFusedGroupValues &&
           outputs(op).size() <= kMaxFusedGroupValues;
  }
};

struct FuseElementwisePass
    : public mt::impl::FuseElementwisePassBase<FuseElementwisePass> {
  void runOnOperation() override {
    ModuleOp module = getOperation();
    module->setAttr(kElementwiseKernelsAttrName, UnitAttr::get(&getContext()));
    for (auto function : module.getOps<func::FuncOp>())
      for (Block &block : function.getBody())
        fuseBlock(block);
  }

  void fuseBlock(Block &block) {
    std::vector<Group> groups;
    DenseMap<Operation *, size_t> groupOf;
    for (Operation &op : block.without_terminator()) {
      if (!isFusibleElementwiseOp(&op) || op.getNumResults() != 1 ||
          llvm::any_of(op.getOperandTypes(),
                       [&](Type t) { return t != op.getResult(0).getType(); }))
        continue;
      std::optional<size_t> joined;
      for (Value operand : op.getOperands()) {
        auto it = groupOf.find(operand.getDefiningOp());
        if (it != groupOf.end() && groups[it->second].canJoin(&op)) {
          joined = it->second;
          break;
        }
      }
      if (!joined) {
        joined = groups.size();
        groups.emplace_back();
        groups.back().type = op.getResult(0).getType();
      }
      groups[*joined].ops.push_back(&op);
      groups[*joined].members.insert(&op);
      groupOf[&op] = *joined;
    }
    for (Group &group : groups)
      if (group.ops.size() >= 2)
        outline(group);
  }

  /// Replaces the group's ops by one mt.fused at the position of its last.
  void outline(Group &group) {
    SmallVector<Value> inputs = group.inputs();
    SmallVector<Value> outputs = group.outputs();
    if (outputs.empty())
      return;
    Operation *last = group.ops.back();
    OpBuilder builder(last->getContext());
    builder.setInsertionPointAfter(last);
    auto fused = FusedOp::create(builder, last->getLoc(),
                                 TypeRange(ValueRange(outputs)), inputs);
    // A group is in the layer of its last op, as the kernel runs there.
    setLayer(fused, getLayer(last));
    Block *body = builder.createBlock(&fused.getBody());
    IRMapping mapping;
    for (Value input : inputs)
      mapping.map(input, body->addArgument(input.getType(), input.getLoc()));
    for (Operation *op : group.ops)
      builder.clone(*op, mapping);
    YieldOp::create(builder, last->getLoc(),
                    llvm::map_to_vector(outputs, [&](Value value) {
                      return mapping.lookup(value);
                    }));
    for (auto [output, result] : llvm::zip(outputs, fused.getResults()))
      output.replaceUsesWithIf(result, [&](OpOperand &use) {
        return !group.contains(use.getOwner()) && use.getOwner() != fused;
      });
    for (Operation *op : llvm::reverse(group.ops))
      op->erase();
    ++numGroups;
    numFusedOps += group.ops.size();
  }
};

} // namespace
