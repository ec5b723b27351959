//===- ViewGroups.cpp - Splits and concats the memory plan elides --------===//
//
// The attention views are the rule the CUDA executor applied on its own
// before issue 21 (runtime/src/cuda/AttentionViews.cpp), now the
// compiler's; the contiguous views are --tp-comm-overlap's chunks of whole
// samples. The memory plan places the groups, and the runtime reads them
// from the bundle.
//
//===----------------------------------------------------------------------===//

#include "mt/Transforms/ViewGroups.h"

#include "mt/IR/MtOps.h"
#include "mt/Transforms/Passes.h"

#include "mlir/IR/BuiltinTypes.h"
#include "llvm/ADT/DenseSet.h"

using namespace mlir;
using namespace mlir::mt;

namespace {

RankedTensorType typeOf(Value value) {
  return cast<RankedTensorType>(value.getType());
}

int64_t elementBytes(Value value) {
  return (typeOf(value).getElementType().getIntOrFloatBitWidth() + 7) / 8;
}

class ViewFinder {
public:
  ViewFinder(func::FuncOp function, const SideBufferOptions &options)
      : options(options) {
    for (BlockArgument argument : function.getArguments())
      taken.insert(argument);
    function.walk([&](func::ReturnOp ret) {
      for (Value value : ret.getOperands())
        taken.insert(value);
    });
    function.walk([&](GetParameterOp read) { taken.insert(read.getResult()); });
  }

  SmallVector<ViewGroup> find(func::FuncOp function) {
    if (options.mixedPrecision)
      findAttention(function);
    for (Operation &op : function.getBody().front().without_terminator())
      if (isContiguousChunkCopy(&op)) {
        if (auto split = dyn_cast<SplitOp>(op))
          addContiguous(&op, split.getInput(), split.getResults(),
                        split.getAxis());
        else if (auto concat = dyn_cast<ConcatOp>(op))
          addContiguous(&op, concat.getResult(), concat.getInputs(),
                        concat.getAxis());
      }
    return std::move(groups);
  }

private:
  void findAttention(func::FuncOp function) {
    for (Operation &op : function.getBody().front().without_terminator()) {
      if (auto split = dyn_cast<SplitOp>(op)) {
        if (llvm::all_of(split.getResults(),
                         [&](Value v) { return readAsQkvOnly(v); }))
          addAttention(&op, split.getInput(), split.getResults(),
                       split.getAxis());
      } else if (auto concat = dyn_cast<ConcatOp>(op)) {
        if (gradientsOfOneFlashGrad(concat))
          addAttention(&op, concat.getResult(), concat.getInputs(),
                       concat.getAxis());
      }
    }
  }

  bool flash(Operation *op) { return runsFlashAttention(op, options); }

  /// Read only by flash kernels, as q, k or v.
  bool readAsQkvOnly(Value v) {
    if (v.use_empty())
      return false;
    for (OpOperand &use : v.getUses()) {
      Operation *reader = use.getOwner();
      if (!flash(reader))
        return false;
      unsigned first = isa<AttentionGradOp>(reader) ? 1 : 0;
      unsigned at = use.getOperandNumber();
      if (at < first || at > first + 2)
        return false;
    }
    return true;
  }

  /// The concat reads exactly one flash attention_grad's results, each once,
  /// and nothing else reads them.
  bool gradientsOfOneFlashGrad(ConcatOp concat) {
    auto grad = concat.getInputs().front().getDefiningOp<AttentionGradOp>();
    if (!grad || !flash(grad) ||
        concat.getInputs().size() != grad->getNumResults())
      return false;
    for (Value v : concat.getInputs())
      if (v.getDefiningOp() != grad.getOperation() || !v.hasOneUse())
        return false;
    return true;
  }

  bool movable(Value v) const { return !taken.contains(v); }

  /// The whole and the values holding its bytes through reshapes.
  SmallVector<Value> sameBytes(Value whole) {
    SmallVector<Value> members{whole}, stack{whole};
    auto take = [&](Value v) {
      if (!movable(v) ||
          typeOf(v).getElementType() != typeOf(whole).getElementType() ||
          llvm::is_contained(members, v))
        return;
      members.push_back(v);
      stack.push_back(v);
    };
    while (!stack.empty()) {
      Value v = stack.pop_back_val();
      if (auto reshape = v.getDefiningOp<ReshapeOp>())
        take(reshape.getInput());
      for (Operation *reader : v.getUsers())
        if (auto reshape = dyn_cast<ReshapeOp>(reader))
          take(reshape.getResult());
    }
    return members;
  }

  void addAttention(Operation *copy, Value whole, ValueRange pieces,
                    int64_t axis) {
    ArrayRef<int64_t> shape = typeOf(whole).getShape();
    if (shape.size() != 4 || (axis != 2 && axis != 3) || !movable(whole) ||
        shape[3] % 8 != 0)
      return;
    int64_t inner = 1;
    for (int64_t d : shape.drop_front(axis + 1))
      inner *= d;
    Type element = typeOf(whole).getElementType();
    ViewGroup group;
    group.whole = whole;
    group.copies.push_back(copy);
    for (Value v : sameBytes(whole))
      if (v != whole)
        group.members.push_back({v, 0});
    int64_t offset = 0;
    for (Value piece : pieces) {
      if (!movable(piece) || typeOf(piece).getElementType() != element ||
          offset % 8 != 0 || llvm::count(pieces, piece) != 1)
        return;
      group.members.push_back({piece, offset * elementBytes(whole)});
      offset += typeOf(piece).getShape()[axis] * inner;
    }
    taken.insert(whole);
    for (auto [member, byteOffset] : group.members)
      taken.insert(member);
    groups.push_back(std::move(group));
  }

  /// A contiguous chunk copy's pieces of `whole`: a group of its own, or
  /// more members of the group `whole` is already in.
  void addContiguous(Operation *copy, Value whole, ValueRange pieces,
                     int64_t axis) {
    ArrayRef<int64_t> shape = typeOf(whole).getShape();
    int64_t inner = 1;
    for (int64_t d : shape.drop_front(axis + 1))
      inner *= d;
    Type element = typeOf(whole).getElementType();
    SmallVector<std::pair<Value, int64_t>> placed;
    int64_t offset = 0;
    for (Value piece : pieces) {
      if (!movable(piece) || typeOf(piece).getElementType() != element ||
          llvm::count(pieces, piece) != 1)
        return;
      placed.push_back({piece, offset * elementBytes(whole)});
      offset += typeOf(piece).getShape()[axis] * inner;
    }
    // Within a group already: the pieces at the whole's offset there.
    for (ViewGroup &group : groups) {
      int64_t base = -1;
      if (group.whole == whole)
        base = 0;
      for (auto [member, byteOffset] : group.members)
        if (member == whole)
          base = byteOffset;
      if (base < 0)
        continue;
      for (auto [piece, byteOffset] : placed) {
        group.members.push_back({piece, base + byteOffset});
        taken.insert(piece);
      }
      group.copies.push_back(copy);
      return;
    }
    if (!movable(whole))
      return;
    ViewGroup group;
    group.whole = whole;
    group.copies.push_back(copy);
    for (Value v : sameBytes(whole))
      if (v != whole)
        group.members.push_back({v, 0});
    group.members.append(placed.begin(), placed.end());
    taken.insert(whole);
    for (auto [member, byteOffset] : group.members)
      taken.insert(member);
    groups.push_back(std::move(group));
  }

  const SideBufferOptions &options;
  /// Pinned (arguments, returned values, parameter reads) or in a group.
  DenseSet<Value> taken;
  SmallVector<ViewGroup> groups;
};

} // namespace

bool mt::isContiguousChunkCopy(Operation *op) {
  if (!op->hasAttr(kChunkCopyAttrName))
    return false;
  Value whole;
  int64_t axis = 0;
  if (auto split = dyn_cast<SplitOp>(op)) {
    whole = split.getInput();
    axis = split.getAxis();
  } else if (auto concat = dyn_cast<ConcatOp>(op)) {
    whole = concat.getResult();
    axis = concat.getAxis();
  } else {
    return false;
  }
  return llvm::all_of(typeOf(whole).getShape().take_front(axis),
                      [](int64_t d) { return d == 1; });
}

SmallVector<ViewGroup> mt::findViewGroups(func::FuncOp function,
                                          const SideBufferOptions &options) {
  return ViewFinder(function, options).find(function);
}
