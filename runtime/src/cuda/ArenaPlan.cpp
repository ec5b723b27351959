// Best-fit offset allocation and the simulated run that plans a function's
// arena.
#include "cuda/ArenaPlan.h"

#include "core/MemoryPlan.h"

#include <algorithm>

namespace mtrt::cuda {

namespace {
size_t roundUp(size_t bytes) {
  return (bytes + kArenaAlignment - 1) / kArenaAlignment * kArenaAlignment;
}
} // namespace

size_t OffsetAllocator::allocate(size_t bytes) {
  bytes = std::max(roundUp(bytes), kArenaAlignment);
  auto best = free_.end();
  for (auto it = free_.begin(); it != free_.end(); ++it)
    if (it->second >= bytes &&
        (best == free_.end() || it->second < best->second))
      best = it;
  if (best != free_.end()) {
    size_t offset = best->first, size = best->second;
    free_.erase(best);
    if (size > bytes)
      free_.emplace(offset + bytes, size - bytes);
    return offset;
  }
  // Grow the top; a free block that ends at the top is extended instead.
  size_t offset = top_;
  if (!free_.empty()) {
    auto last = std::prev(free_.end());
    if (last->first + last->second == top_) {
      offset = last->first;
      free_.erase(last);
    }
  }
  top_ = offset + bytes;
  peak_ = std::max(peak_, top_);
  return offset;
}

void OffsetAllocator::release(size_t offset, size_t bytes) {
  bytes = std::max(roundUp(bytes), kArenaAlignment);
  auto it = free_.emplace(offset, bytes).first;
  auto next = std::next(it);
  if (next != free_.end() && it->first + it->second == next->first) {
    it->second += next->second;
    free_.erase(next);
  }
  if (it != free_.begin()) {
    auto previous = std::prev(it);
    if (previous->first + previous->second == it->first) {
      previous->second += it->second;
      free_.erase(it);
    }
  }
}

ArenaPlan planArena(
    const Function &function,
    const std::function<size_t(int64_t)> &valueBytes,
    const std::function<size_t(size_t)> &scratchBytes,
    const std::function<size_t(size_t)> &scratchKeptUntil,
    const std::function<int64_t(int64_t)> &aliasOf,
    const std::function<std::vector<SideBufferNeed>(size_t)> &copiesAt) {
  // The compiler's plan (core/MemoryPlan.h), when the bundle has one with
  // side buffers that holds this backend's storage: the values at its
  // offsets, each instruction's scratch in its side-buffer block (checked to
  // be large enough and kept long enough). Aliases are not used with it (it
  // gives each value its own block).
  if (std::optional<PlannedArena> planned = layOutPlannedArena(
          function, [&](int64_t v) { return uint64_t(valueBytes(v)); },
          [&](size_t position) {
            std::vector<SideBufferNeed> needs =
                copiesAt ? copiesAt(position) : std::vector<SideBufferNeed>();
            needs.insert(
                needs.begin(),
                {scratchBytes(position),
                 scratchKeptUntil ? scratchKeptUntil(position) : position});
            return needs;
          },
          kArenaAlignment, "cuda")) {
    ArenaPlan plan;
    plan.fromCompiler = true;
    plan.bytes = planned->bytes;
    for (size_t v = 0; v < function.values.size(); ++v) {
      int64_t offset = function.memoryPlan->offsets[v];
      plan.valueOffset.push_back(offset < 0 || valueBytes(int64_t(v)) == 0
                                     ? ArenaPlan::kNone
                                     : size_t(offset));
    }
    for (size_t position = 0; position < function.instructions.size();
         ++position) {
      size_t scratch = scratchBytes(position);
      plan.scratchBytes.push_back(scratch);
      plan.scratchOffset.push_back(
          scratch ? size_t(planned->kernelOffset[position]) : ArenaPlan::kNone);
    }
    for (int64_t offset : planned->copyOffset)
      plan.copyOffset.push_back(offset < 0 ? ArenaPlan::kNone : size_t(offset));
    return plan;
  }
  ArenaPlan plan;
  size_t values = function.values.size();
  plan.valueOffset.assign(values, ArenaPlan::kNone);
  plan.scratchOffset.assign(function.instructions.size(), ArenaPlan::kNone);
  plan.scratchBytes.assign(function.instructions.size(), 0);
  plan.copyOffset.assign(values, ArenaPlan::kNone);
  std::vector<bool> pinned(values, false); // inputs and outputs
  std::vector<bool> released(values, false);
  for (int64_t v : function.inputs)
    pinned[v] = true;
  for (int64_t v : function.outputs)
    pinned[v] = true;

  // Kept scratch to release after each instruction: (offset, bytes).
  std::vector<std::vector<std::pair<size_t, size_t>>> keptEnds(
      function.instructions.size());
  OffsetAllocator allocator;
  // Values sharing memory: each value's root, and the live values per root.
  std::vector<int64_t> root(values);
  std::vector<int64_t> live(values, 0);
  for (size_t v = 0; v < values; ++v)
    root[v] = static_cast<int64_t>(v);
  auto place = [&](int64_t v) {
    int64_t shared = aliasOf ? aliasOf(v) : -1;
    if (shared >= 0) {
      root[v] = root[shared];
      plan.valueOffset[v] = plan.valueOffset[root[v]];
      ++live[root[v]];
      if (pinned[v])
        pinned[root[v]] = true;
      return;
    }
    size_t bytes = valueBytes(v);
    live[v] = 1;
    if (bytes > 0 && plan.valueOffset[v] == ArenaPlan::kNone)
      plan.valueOffset[v] = allocator.allocate(bytes);
  };
  for (int64_t v : function.inputs)
    place(v);
  for (size_t position = 0; position < function.instructions.size();
       ++position) {
    const Instruction &inst = function.instructions[position];
    for (int64_t v : inst.results)
      place(v);
    size_t scratch = scratchBytes(position);
    plan.scratchBytes[position] = scratch;
    // Scratch and copies read by this instruction alone are released after
    // all of its blocks are placed: they are live together while it runs.
    auto endOf = [&](size_t until) {
      return until > position && until < function.instructions.size()
                 ? until
                 : position;
    };
    if (scratch > 0) {
      plan.scratchOffset[position] = allocator.allocate(scratch);
      size_t until = scratchKeptUntil ? scratchKeptUntil(position) : position;
      keptEnds[endOf(until)].emplace_back(plan.scratchOffset[position],
                                          scratch);
    }
    if (copiesAt)
      for (const SideBufferNeed &copy : copiesAt(position)) {
        size_t offset = allocator.allocate(copy.bytes);
        plan.copyOffset[copy.copyOf] = offset;
        keptEnds[endOf(copy.until)].emplace_back(offset, copy.bytes);
      }
    for (auto [offset, bytes] : keptEnds[position])
      allocator.release(offset, bytes);
    for (int64_t v : inst.free) {
      if (released[v])
        continue;
      released[v] = true;
      int64_t r = root[v];
      if (--live[r] > 0 || pinned[r] ||
          plan.valueOffset[r] == ArenaPlan::kNone)
        continue;
      allocator.release(plan.valueOffset[r], valueBytes(r));
    }
  }
  plan.bytes = allocator.peak();
  return plan;
}

} // namespace mtrt::cuda
