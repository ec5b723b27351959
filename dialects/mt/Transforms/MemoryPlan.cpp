//===- MemoryPlan.cpp - Best-fit arena offsets from the bundle's liveness -===//

#include "mt/Transforms/MemoryPlan.h"

#include "mt/IR/MtOps.h"

#include "mlir/IR/BuiltinTypes.h"
#include "llvm/ADT/STLExtras.h"
#include "llvm/ADT/SetOperations.h"

#include <algorithm>
#include <map>

using namespace mlir;
using namespace mlir::mt;

SmallVector<Value, 2> mt::instructionResults(Operation *op) {
  if (auto start = dyn_cast<CollectiveStartOp>(op))
    if (CollectiveWaitOp wait = start.getWait())
      return {wait.getResult()};
  return SmallVector<Value, 2>(op->getResults().begin(), op->getResults().end());
}

bool mt::mayComputeInPlace(Operation *op) {
  return isa<AddOp, MulOp, GeluOp, GeluGradOp, SiluOp, SiluGradOp, SwigluOp,
             DropoutOp, BiasAddOp, ReshapeOp, FusedOp>(op);
}

namespace {

int64_t blockBytes(int64_t bytes) {
  int64_t rounded =
      (bytes + kArenaAlignment - 1) / kArenaAlignment * kArenaAlignment;
  return std::max(rounded, kArenaAlignment);
}

/// Best-fit offsets in a region that grows at its top; released neighbours
/// merge.
class OffsetAllocator {
public:
  int64_t allocate(int64_t bytes) {
    bytes = blockBytes(bytes);
    auto best = free.end();
    for (auto it = free.begin(); it != free.end(); ++it)
      if (it->second >= bytes &&
          (best == free.end() || it->second < best->second))
        best = it;
    if (best != free.end()) {
      auto [offset, size] = *best;
      free.erase(best);
      if (size > bytes)
        free.emplace(offset + bytes, size - bytes);
      return offset;
    }
    // Grow the top; a free block that ends at the top is extended instead.
    int64_t offset = top;
    if (!free.empty()) {
      auto last = std::prev(free.end());
      if (last->first + last->second == top) {
        offset = last->first;
        free.erase(last);
      }
    }
    top = offset + bytes;
    return offset;
  }

  void release(int64_t offset, int64_t bytes) {
    bytes = blockBytes(bytes);
    auto it = free.emplace(offset, bytes).first;
    if (auto next = std::next(it);
        next != free.end() && it->first + it->second == next->first) {
      it->second += next->second;
      free.erase(next);
    }
    if (it != free.begin()) {
      auto previous = std::prev(it);
      if (previous->first + previous->second == it->first) {
        previous->second += it->second;
        free.erase(it);
      }
    }
    // The top shrinks back over a free block that ends there, so the next
    // growth reuses it.
    auto last = free.empty() ? free.end() : std::prev(free.end());
    if (last != free.end() && last->first + last->second == top) {
      top = last->first;
      free.erase(last);
    }
  }

  int64_t top = 0;

private:
  std::map<int64_t, int64_t> free; // offset -> size
};

int64_t valueBytes(Value value) {
  auto type = cast<RankedTensorType>(value.getType());
  int64_t bits = type.getElementType().getIntOrFloatBitWidth();
  return type.getNumElements() * ((bits + 7) / 8);
}

/// The paired attentions whose bf16 output `plan` leaves as the forward wrote
/// it through the gradient: no result of an instruction after the forward
/// through the gradient, and no side buffer made there, overlaps the output's
/// bytes, but a reshape of those bytes in place; the output is no attention
/// view. The runtime's rule on the same plan (runtime/src/core/ScratchPlan.cpp,
/// outputHeldThrough), which must hold for every attention found here.
/// Without `onlyHeld`, every paired attention with a bf16 output outside the
/// views (those a plan may hold).
DenseSet<Operation *> heldAttentionOutputs(const FunctionMemoryPlan &plan,
                                           bool onlyHeld = true) {
  DenseMap<Value, Value> wholeOf;
  DenseSet<Value> inViews;
  for (const ViewPlan &view : plan.views) {
    wholeOf[view.value] = view.whole;
    inViews.insert(view.value);
    inViews.insert(view.whole);
  }
  // A value's bytes: its block, or a view's whole block.
  auto bytesOf = [&](Value value) -> std::pair<int64_t, int64_t> {
    if (auto it = wholeOf.find(value); it != wholeOf.end())
      value = it->second;
    const BufferPlan *buffer = plan.lookup(value);
    if (!buffer || buffer->offset < 0)
      return {0, 0};
    return {buffer->offset, buffer->offset + buffer->bytes};
  };
  DenseSet<Operation *> held;
  for (const SideBufferPlan &block : plan.sideBuffers) {
    auto attention = dyn_cast_or_null<AttentionOp>(block.op);
    if (!attention || block.copyOf || block.until <= block.position)
      continue;
    Value out = attention->getResult(0);
    if (!cast<RankedTensorType>(out.getType()).getElementType().isBF16() ||
        inViews.contains(out))
      continue;
    std::pair<int64_t, int64_t> output = bytesOf(out);
    if (output.first == output.second)
      continue;
    if (!onlyHeld) {
      held.insert(attention);
      continue;
    }
    auto overlaps = [&](std::pair<int64_t, int64_t> bytes) {
      return bytes.first < output.second && output.first < bytes.second;
    };
    auto between = [&](int64_t position) {
      return position > block.position && position <= block.until;
    };
    bool kept = true;
    for (const BufferPlan &buffer : plan.buffers) {
      if (!between(buffer.definedAt))
        continue;
      std::pair<int64_t, int64_t> bytes = bytesOf(buffer.value);
      if (!overlaps(bytes))
        continue;
      // A reshape in place of the output's own bytes leaves them as they are.
      auto reshape = buffer.value.getDefiningOp<ReshapeOp>();
      if (!reshape || bytes != output ||
          bytesOf(reshape->getOperand(0)) != output) {
        kept = false;
        break;
      }
    }
    for (const SideBufferPlan &side : plan.sideBuffers)
      kept = kept && !(between(side.position) &&
                       overlaps({side.offset, side.offset + side.bytes}));
    if (kept)
      held.insert(attention);
  }
  return held;
}

} // namespace

/// One plan of `function`'s arena with the side buffers `options` declares.
static FunctionMemoryPlan planArena(func::FuncOp function,
                                    const SideBufferOptions &options) {
  FunctionMemoryPlan plan;
  Block &body = function.getBody().front();
  auto ret = cast<func::ReturnOp>(body.getTerminator());

  auto add = [&](Value value, int64_t definedAt, bool memory) {
    BufferPlan buffer;
    buffer.value = value;
    buffer.bytes = valueBytes(value);
    buffer.definedAt = definedAt;
    buffer.lastUse = definedAt;
    buffer.offset = memory ? 0 : -1;
    plan.bufferIndex[value] = plan.buffers.size();
    plan.buffers.push_back(buffer);
  };

  // The bundle's stream: parameter arguments become get_parameter views.
  int64_t position = 0;
  for (BlockArgument argument : body.getArguments()) {
    bool parameter = static_cast<bool>(function.getArgAttr(
        argument.getArgNumber(), "mt.parameter"));
    add(argument, parameter ? position++ : -1, !parameter);
  }
  DenseMap<Operation *, int64_t> positionOf;
  SmallVector<Operation *> stream(position, nullptr);
  // A split collective is one instruction at its start, which writes the
  // wait's result; the wait is no instruction, but its start's operand is
  // read until it: it lives to the next instruction at least.
  DenseSet<Value> heldToWait;
  for (Operation &op : body.without_terminator()) {
    if (auto wait = dyn_cast<CollectiveWaitOp>(op)) {
      auto start = wait.getFuture().getDefiningOp<CollectiveStartOp>();
      BufferPlan &input = plan.buffers[plan.bufferIndex.lookup(start.getInput())];
      input.lastUse = std::max(input.lastUse, position);
      heldToWait.insert(start.getInput());
      continue;
    }
    positionOf[&op] = position;
    stream.push_back(&op);
    for (Value result : instructionResults(&op))
      add(result, position, !isa<GetParameterOp>(op));
    for (Value operand : op.getOperands())
      plan.buffers[plan.bufferIndex.lookup(operand)].lastUse = position;
    ++position;
  }
  DenseMap<int64_t, SmallVector<Value>> heldUntil;
  for (Value value : heldToWait)
    heldUntil[plan.buffers[plan.bufferIndex.lookup(value)].lastUse].push_back(
        value);
  // Gradient results are read by accumulate_gradient instructions at the end.
  for (OpOperand &output : ret->getOpOperands())
    if (function.getResultAttr(output.getOperandNumber(), "mt.gradient"))
      ++position;
  plan.numInstructions = position;
  stream.resize(position, nullptr);
  // By instruction: the indices of its side buffers in plan.sideBuffers, and
  // of those to release after it.
  SmallVector<SmallVector<int64_t, 2>> sideStarts(position), sideEnds(position);
  for (auto [at, blocks] :
       llvm::enumerate(declareSideBuffers(stream, options)))
    for (const SideBuffer &side : blocks) {
      sideStarts[at].push_back(plan.sideBuffers.size());
      sideEnds[side.until].push_back(plan.sideBuffers.size());
      plan.sideBuffers.push_back({int64_t(at), stream[at], side.bytes,
                                  side.until, 0, side.copyOf});
    }
  int64_t sideLive = 0;

  // Attention views: each group's block, its members' offsets in it, and
  // the instruction after which it is released.
  struct Group {
    int64_t bytes = 0, offset = -1, last = 0;
  };
  SmallVector<Group> groups;
  DenseMap<Value, std::pair<int64_t, int64_t>> groupOf; // group, offset
  SmallVector<SmallVector<int64_t, 1>> groupEnds(position);

  // Inputs, outputs and gradients live to the end.
  for (BlockArgument argument : body.getArguments())
    plan.buffers[plan.bufferIndex.lookup(argument)].lastUse = position;
  for (Value output : ret.getOperands())
    plan.buffers[plan.bufferIndex.lookup(output)].lastUse = position;

  for (const ViewGroup &found : findViewGroups(function, options)) {
    int64_t index = groups.size();
    Group group;
    group.bytes = valueBytes(found.whole);
    groupOf[found.whole] = {index, 0};
    group.last = plan.buffers[plan.bufferIndex.lookup(found.whole)].lastUse;
    for (auto [member, byteOffset] : found.members) {
      groupOf[member] = {index, byteOffset};
      group.last = std::max(
          group.last, plan.buffers[plan.bufferIndex.lookup(member)].lastUse);
      plan.views.push_back({member, found.whole, byteOffset});
    }
    if (group.last < position) // else held to the end
      groupEnds[group.last].push_back(index);
    groups.push_back(group);
  }

  // The outputs of options.heldAttentionOutputs stay until their
  // gradients, which read them there: through a reshape computed in place
  // of them (the bytes unchanged), which then stays as long; no other op
  // takes their bytes in place.
  DenseMap<Value, int64_t> holdUntil;
  DenseMap<int64_t, SmallVector<Value>> releaseAt;
  auto holdThrough = [&](Value value, int64_t until) {
    int64_t &end = holdUntil[value];
    end = std::max(end, until);
    if (end > plan.buffers[plan.bufferIndex.lookup(value)].lastUse)
      releaseAt[end].push_back(value);
  };
  for (const SideBufferPlan &side : plan.sideBuffers)
    if (side.op && !side.copyOf && side.until > side.position &&
        options.heldAttentionOutputs.contains(side.op) &&
        !groupOf.contains(side.op->getResult(0)))
      holdThrough(side.op->getResult(0), side.until);
  DenseSet<Value> givenInPlace;

  // The simulated run.
  OffsetAllocator allocator;
  auto bump = [&](int64_t at) {
    if (allocator.top > plan.arenaBytes) {
      plan.arenaBytes = allocator.top;
      plan.peakAt = at;
      plan.peakSideBufferBytes = sideLive;
    }
  };
  for (BlockArgument argument : body.getArguments()) {
    BufferPlan &buffer = plan.buffers[plan.bufferIndex.lookup(argument)];
    if (buffer.offset >= 0)
      buffer.offset = allocator.allocate(buffer.bytes);
  }
  bump(0);
  for (Operation &op : body.without_terminator()) {
    if (isa<CollectiveWaitOp>(op))
      continue;
    int64_t at = positionOf[&op];
    DenseSet<Value> taken;
    for (auto [index, result] : llvm::enumerate(instructionResults(&op))) {
      BufferPlan &buffer = plan.buffers[plan.bufferIndex.lookup(result)];
      if (buffer.offset < 0)
        continue;
      if (auto it = groupOf.find(result); it != groupOf.end()) {
        Group &group = groups[it->second.first];
        if (group.offset < 0)
          group.offset = allocator.allocate(group.bytes);
        buffer.offset = group.offset + it->second.second;
        continue;
      }
      if (index == 0 && mayComputeInPlace(&op))
        for (Value operand : op.getOperands()) {
          const BufferPlan &source =
              plan.buffers[plan.bufferIndex.lookup(operand)];
          int64_t hold = holdUntil.lookup(operand);
          if (source.offset >= 0 && source.lastUse == at &&
              (hold <= at || isa<ReshapeOp>(op)) &&
              !groupOf.contains(operand) && source.bytes == buffer.bytes &&
              !taken.contains(operand) && source.definedAt >= 0) {
            buffer.offset = source.offset;
            buffer.inPlaceOf = operand;
            taken.insert(operand);
            givenInPlace.insert(operand);
            if (hold > at)
              holdThrough(result, hold);
            ++plan.numInPlace;
            break;
          }
        }
      if (!buffer.inPlaceOf)
        buffer.offset = allocator.allocate(buffer.bytes);
    }
    for (int64_t index : sideStarts[at]) {
      SideBufferPlan &side = plan.sideBuffers[index];
      side.offset = allocator.allocate(side.bytes);
      sideLive += side.bytes;
    }
    bump(at);
    // Release what dies here (an operand read twice is released once), and
    // results nothing reads.
    DenseSet<Value> released;
    auto releaseIfDead = [&](Value value) {
      const BufferPlan &buffer = plan.buffers[plan.bufferIndex.lookup(value)];
      if (buffer.offset < 0 ||
          std::max(buffer.lastUse, holdUntil.lookup(value)) != at ||
          givenInPlace.contains(value) || groupOf.contains(value) ||
          !released.insert(value).second)
        return;
      allocator.release(buffer.offset, buffer.bytes);
    };
    for (Value operand : op.getOperands())
      releaseIfDead(operand);
    for (Value result : instructionResults(&op))
      releaseIfDead(result);
    for (Value held : heldUntil.lookup(at))
      releaseIfDead(held);
    for (Value held : releaseAt.lookup(at))
      releaseIfDead(held);
    for (int64_t index : sideEnds[at]) {
      const SideBufferPlan &ended = plan.sideBuffers[index];
      allocator.release(ended.offset, ended.bytes);
      sideLive -= ended.bytes;
    }
    for (int64_t index : groupEnds[at])
      allocator.release(groups[index].offset, groups[index].bytes);
  }
  return plan;
}

FunctionMemoryPlan mt::planFunctionMemory(func::FuncOp function,
                                          const SideBufferOptions &options) {
  FunctionMemoryPlan plan = planArena(function, options);
  if (!options.mixedPrecision)
    return plan;
  // A paired attention's block keeps a copy of its output for the gradient
  // unless the plan holds the output itself until then. Plan again with
  // every bf16 output outside the views held until its gradient and its
  // block without the copy (the same bytes for as long, and no copy to
  // write): a plan is consistent when it holds every output planned
  // without a copy. Where one is not, again with those the new plan holds,
  // until the set is stable or for a few rounds; the smallest consistent
  // plan.
  FunctionMemoryPlan best = std::move(plan);
  DenseSet<Operation *> bestHeld;
  SideBufferOptions held = options;
  held.heldAttentionOutputs = heldAttentionOutputs(best, /*onlyHeld=*/false);
  for (int round = 0; round < 8 && !held.heldAttentionOutputs.empty();
       ++round) {
    FunctionMemoryPlan next = planArena(function, held);
    DenseSet<Operation *> found = heldAttentionOutputs(next);
    bool consistent =
        llvm::all_of(held.heldAttentionOutputs,
                     [&](Operation *op) { return found.contains(op); });
    if (consistent && next.arenaBytes <= best.arenaBytes) {
      best = std::move(next);
      bestHeld = held.heldAttentionOutputs;
    }
    if (consistent && found.size() == held.heldAttentionOutputs.size())
      break;
    if (!consistent)
      llvm::set_intersect(found, held.heldAttentionOutputs);
    held.heldAttentionOutputs = std::move(found);
  }
  // The outputs the plan holds beyond those it was planned without copies
  // for: their blocks end before the copy (nothing moves).
  DenseSet<Operation *> found = heldAttentionOutputs(best);
  for (SideBufferPlan &side : best.sideBuffers) {
    if (side.copyOf || !found.contains(side.op) || bestHeld.contains(side.op))
      continue;
    int64_t copy = blockBytes(valueBytes(side.op->getResult(0)));
    side.bytes -= copy;
    if (side.position <= best.peakAt && best.peakAt <= side.until)
      best.peakSideBufferBytes -= copy;
  }
  return best;
}
