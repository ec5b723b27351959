// Flash attention in place: q, k and v read from the qkv GEMM's result and
// dq, dk and dv written into the concat that gathers them, instead of the
// split's and the concat's copies.
//
// Since issue 21 the compiler decides the groups and its memory plan places
// them (`memory_plan.views`; core/AttentionViews.cpp checks them): the
// executor reads them from the bundle. For bundles written before, it
// decides on its own as below.
//
// A view group is one block of its own, after the compiler's arena: a
// tensor the flash kernels read or write in pieces (a split's operand, a
// concat's result), the values that hold the same bytes through reshapes
// (the qkv GEMM's result before its reshape; the reshape of the concat that
// the data-gradient GEMM reads), and the pieces at their offsets. The
// group lives from its first member's producer through its members' last
// reader, so a piece read by the backward (q, k, v by attention_grad) keeps
// the whole alive that long; the members' blocks in the compiler's plan go
// unused (the region costs about one qkv tensor per layer: 3744 MiB at
// gpt2-124m's micro-batch 32, which bundles with planned views save).
// Groups are fixed at set-up: slots never move, so CUDA graphs stay valid.
#include "cuda/Executor.h"

#include "core/AttentionViews.h"
#include "core/OpShapes.h"
#include "cuda/ArenaPlan.h"
#include "cuda/kernels/Kernels.h"

#include <algorithm>

namespace mtrt::cuda {

namespace {

constexpr size_t kNowhere = ~size_t(0);

} // namespace

void Executor::planAttentionViews() {
  const Function &fn = *function_;
  size_t values = fn.values.size();
  elided_.assign(fn.instructions.size(), false);
  viewStrides_.assign(values, {0, 0});
  viewGroups_.clear();
  viewGroupOf_.assign(values, -1);
  viewOffset_.assign(values, 0);
  if (fn.memoryPlan && fn.memoryPlan->hasViews) {
    // The compiler decided (issue 21): the plan places each group in its
    // whole's block, and the members' offsets are the slots.
    AttentionViewLayout layout = readAttentionViews(fn, bf16_);
    elided_ = std::move(layout.elided);
    viewStrides_ = std::move(layout.strides);
    viewsInPlan_ = layout.views > 0;
    return;
  }
  if (!bf16_)
    return; // the exact fp32 kernels read packed tensors only

  // Each value's producer and readers (position, operand index).
  std::vector<size_t> producer(values, kNowhere);
  std::vector<std::vector<std::pair<size_t, size_t>>> readers(values);
  for (size_t position = 0; position < fn.instructions.size(); ++position) {
    const Instruction &inst = fn.instructions[position];
    for (size_t i = 0; i < inst.operands.size(); ++i)
      readers[inst.operands[i]].emplace_back(position, i);
    for (int64_t v : inst.results)
      producer[v] = position;
  }
  std::vector<bool> pinned(values, false); // where the caller sees it
  for (int64_t v : fn.inputs)
    pinned[v] = true;
  for (int64_t v : fn.outputs)
    pinned[v] = true;
  for (size_t v = 0; v < values; ++v)
    if (producer[v] == kNowhere ||
        fn.instructions[producer[v]].op == Op::GetParameter)
      pinned[v] = true;
  auto flashAt = [&](size_t position) {
    const Instruction &inst = fn.instructions[position];
    return (inst.op == Op::Attention || inst.op == Op::AttentionGrad) &&
           flashAttention(attentionParams(fn, inst, 0));
  };
  // Read only by flash kernels, as q, k or v.
  auto readAsQkvOnly = [&](int64_t v) {
    if (readers[v].empty())
      return false;
    for (auto [position, operand] : readers[v]) {
      if (!flashAt(position))
        return false;
      size_t first = fn.instructions[position].op == Op::AttentionGrad ? 1 : 0;
      if (operand < first || operand > first + 2)
        return false;
    }
    return true;
  };
  auto movable = [&](int64_t v) { return !pinned[v] && viewGroupOf_[v] < 0; };

  // The whole and its pieces: the pieces' offsets and strides, or false.
  struct Piece {
    int64_t value;
    size_t byteOffset;
  };
  auto layOut = [&](const Instruction &inst, std::vector<Piece> &pieces,
                    std::array<int64_t, 2> &strides) {
    auto [whole, axis, outer, inner] = splitDims(fn, inst);
    const auto &shape = fn.values[whole].shape;
    if (shape.size() != 4 || (axis != 2 && axis != 3) || !movable(whole))
      return false;
    DType type = storageType(whole);
    size_t elementBytes = dtypeSize(type);
    const auto &parts = inst.op == Op::Split ? inst.results : inst.operands;
    int64_t offset = 0;
    for (int64_t piece : parts) {
      // Flash tiles are loaded in 16-byte rows: offsets and strides in
      // multiples of 8 elements.
      if (!movable(piece) || storageType(piece) != type || offset % 8 != 0 ||
          std::count(parts.begin(), parts.end(), piece) != 1)
        return false;
      pieces.push_back({piece, static_cast<size_t>(offset) * elementBytes});
      offset += fn.values[piece].shape[axis] * inner;
    }
    if (shape[3] % 8 != 0)
      return false;
    strides = {shape[2] * shape[3], shape[3]};
    return true;
  };

  // The whole and the values holding its bytes through reshapes (none
  // pinned, all of its storage type).
  auto sameBytes = [&](int64_t whole) {
    std::vector<int64_t> members{whole}, stack{whole};
    auto take = [&](int64_t v) {
      if (!movable(v) || storageType(v) != storageType(whole) ||
          std::count(members.begin(), members.end(), v))
        return;
      members.push_back(v);
      stack.push_back(v);
    };
    while (!stack.empty()) {
      int64_t v = stack.back();
      stack.pop_back();
      if (fn.instructions[producer[v]].op == Op::Reshape)
        take(fn.instructions[producer[v]].operands[0]);
      for (auto [position, operand] : readers[v])
        if (fn.instructions[position].op == Op::Reshape)
          take(fn.instructions[position].results[0]);
    }
    return members;
  };

  auto addGroup = [&](size_t position, int64_t whole,
                      const std::vector<Piece> &pieces,
                      std::array<int64_t, 2> strides) {
    ViewGroup group;
    // The slot's fp32 size, as every value's (a bf16 GEMM result keeps its
    // bias vector in the second half: Gemm.h, Bf16Operands::result).
    DType declared = fn.values[whole].dtype;
    group.bytes =
        static_cast<size_t>(fn.values[whole].numElements) *
        dtypeSize(isFloatingPoint(declared) ? DType::F32 : declared);
    group.first = kNowhere;
    group.last = 0;
    auto join = [&](int64_t v, size_t byteOffset) {
      viewGroupOf_[v] = static_cast<int64_t>(viewGroups_.size());
      viewOffset_[v] = byteOffset;
      group.members.push_back(v);
      group.first = std::min(group.first, producer[v]);
      group.last = std::max(group.last, producer[v]);
      for (auto [reader, operand] : readers[v])
        group.last = std::max(group.last, reader);
    };
    for (int64_t v : sameBytes(whole))
      join(v, 0);
    for (const Piece &piece : pieces) {
      join(piece.value, piece.byteOffset);
      viewStrides_[piece.value] = strides;
    }
    viewGroups_.push_back(std::move(group));
    elided_[position] = true;
  };

  for (size_t position = 0; position < fn.instructions.size(); ++position) {
    const Instruction &inst = fn.instructions[position];
    std::vector<Piece> pieces;
    std::array<int64_t, 2> strides{};
    if (inst.op == Op::Split) {
      bool qkv = std::all_of(inst.results.begin(), inst.results.end(),
                             readAsQkvOnly);
      if (qkv && layOut(inst, pieces, strides))
        addGroup(position, inst.operands[0], pieces, strides);
    } else if (inst.op == Op::Concat) {
      // Exactly one flash attention_grad's dq, dk, dv, read by this concat
      // only.
      size_t grad = producer[inst.operands[0]];
      if (grad == kNowhere ||
          fn.instructions[grad].op != Op::AttentionGrad || !flashAt(grad))
        continue;
      const Instruction &g = fn.instructions[grad];
      bool gradients = inst.operands.size() == g.results.size();
      for (int64_t v : inst.operands)
        gradients = gradients && producer[v] == grad &&
                    readers[v].size() == 1;
      if (gradients && layOut(inst, pieces, strides))
        addGroup(position, inst.results[0], pieces, strides);
    }
  }

  // Members share their group's block: none aliases a block of the plan,
  // and no value outside a group aliases a member (reshapes across a
  // group's edge copy).
  for (size_t v = 0; v < values; ++v)
    if (viewGroupOf_[v] >= 0 ||
        (aliasOf_[v] >= 0 && viewGroupOf_[aliasOf_[v]] >= 0))
      aliasOf_[v] = -1;

  // The groups' blocks: live from `first` through `last`.
  std::vector<size_t> order(viewGroups_.size());
  for (size_t i = 0; i < order.size(); ++i)
    order[i] = i;
  std::sort(order.begin(), order.end(), [&](size_t a, size_t b) {
    return viewGroups_[a].first < viewGroups_[b].first;
  });
  OffsetAllocator allocator;
  std::vector<size_t> live;
  for (size_t i : order) {
    ViewGroup &group = viewGroups_[i];
    for (auto it = live.begin(); it != live.end();) {
      const ViewGroup &other = viewGroups_[*it];
      if (other.last < group.first) {
        allocator.release(other.offset, other.bytes);
        it = live.erase(it);
      } else {
        ++it;
      }
    }
    group.offset = allocator.allocate(group.bytes);
    live.push_back(i);
  }
  viewBytes_ = allocator.peak();
}

void Executor::bindAttentionViews(char *region) {
  for (size_t v = 0; v < viewGroupOf_.size(); ++v)
    if (viewGroupOf_[v] >= 0)
      slots_[v] = region +
                  viewGroups_[static_cast<size_t>(viewGroupOf_[v])].offset +
                  viewOffset_[v];
}

FlashLayout Executor::flashLayout(int64_t v) const {
  return {viewStrides_[v][0], viewStrides_[v][1]};
}

size_t Executor::elidedCopyCount() const {
  return static_cast<size_t>(std::count(elided_.begin(), elided_.end(), true));
}

} // namespace mtrt::cuda
