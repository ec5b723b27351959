// Reads a function's `memory_plan` and proves it safe: every value with memory
// inside the arena and aligned, parameter views without memory, and no two
// values that are live at the same time sharing a byte, except a result
// computed in place of an operand that dies at its instruction.
#include "core/MemoryPlan.h"

#include "core/BundleReader.h"
#include "core/Error.h"
#include "core/ExecutorChecks.h"

#include <map>
#include <set>

namespace mtrt {

bool mayComputeInPlace(Op op) {
  switch (op) {
  case Op::Add:
  case Op::Mul:
  case Op::Gelu:
  case Op::GeluGrad:
  case Op::Silu:
  case Op::SiluGrad:
  case Op::Swiglu:
  case Op::Fused:
  case Op::Dropout:
  case Op::BiasAdd:
  case Op::Reshape:
    return true;
  default:
    return false;
  }
}

uint64_t planValueBytes(const TensorType &type) {
  return static_cast<uint64_t>(type.numElements) * dtypeSize(type.dtype);
}

std::optional<PlannedArena>
layOutPlannedArena(const Function &function,
                   const std::function<uint64_t(int64_t)> &storageBytes,
                   const std::function<std::vector<SideBufferNeed>(size_t)> &need,
                   uint64_t alignment, const std::string &backend) {
  const std::optional<MemoryPlan> &plan = function.memoryPlan;
  if (!plan || !plan->hasSideBuffers || plan->alignment % alignment != 0)
    return std::nullopt;
  for (size_t v = 0; v < function.values.size(); ++v)
    if (plan->offsets[v] >= 0 &&
        storageBytes(static_cast<int64_t>(v)) >
            planValueBytes(function.values[v]))
      return std::nullopt;
  PlannedArena arena;
  arena.bytes = plan->arenaBytes;
  arena.kernelOffset.assign(function.instructions.size(), -1);
  arena.copyOffset.assign(function.values.size(), -1);
  // The plan's blocks by instruction.
  std::vector<std::vector<const MemoryPlan::SideBuffer *>> given(
      function.instructions.size());
  for (const MemoryPlan::SideBuffer &side : plan->sideBuffers)
    given[side.instruction].push_back(&side);
  for (size_t position = 0; position < function.instructions.size();
       ++position)
    for (const SideBufferNeed &needed : need(position)) {
      if (needed.bytes == 0)
        continue;
      const MemoryPlan::SideBuffer *block = nullptr;
      for (const MemoryPlan::SideBuffer *side : given[position])
        if (side->copyOf == needed.copyOf)
          block = side;
      if (!block || needed.bytes > block->bytes ||
          needed.until > block->until) {
        std::string what =
            needed.copyOf < 0
                ? std::string("its kernel block (scratch, saved state)")
                : "a bf16 copy of value " + std::to_string(needed.copyOf);
        throw Error(
            MTRT_STATUS_FAILED_PRECONDITION,
            instructionWhere(function, position) + ": the " + backend +
                " backend needs " + what + " of " +
                std::to_string(needed.bytes) + " bytes through instructions[" +
                std::to_string(needed.until) + "]; the bundle's memory plan " +
                (block ? "gives " + std::to_string(block->bytes) +
                             " bytes through instructions[" +
                             std::to_string(block->until) + "]"
                       : std::string("has none there")) +
                ". The compiler that wrote the bundle declares other side "
                "buffers (dialects/mt/Transforms/SideBuffers.cpp, sizes from "
                "core/OpScratch.h) than this "
                "runtime uses: recompile the bundle with the megatron-compile "
                "of this runtime's release");
      }
      if (needed.copyOf < 0)
        arena.kernelOffset[position] = static_cast<int64_t>(block->offset);
      else
        arena.copyOffset[static_cast<size_t>(needed.copyOf)] =
            static_cast<int64_t>(block->offset);
    }
  return arena;
}

namespace bundle_detail {

namespace {
std::string range(uint64_t offset, uint64_t bytes) {
  return "[" + std::to_string(offset) + ", " + std::to_string(offset + bytes) +
         ")";
}
} // namespace

void ManifestReader::readMemoryPlan(const Json &json, const std::string &path,
                                    Function &function) {
  expectObject(json, path);
  expectKnownKeys(json, path,
                  {"alignment", "arena_bytes", "offsets", "side_buffers",
                   "views"},
                  "a memory plan");
  MemoryPlan plan;
  std::string alignmentAt = member(path, "alignment");
  int64_t alignment =
      readInt(field(json, path, "alignment"), alignmentAt, 1, int64_t(1) << 20);
  if (alignment & (alignment - 1))
    fail(alignmentAt, std::to_string(alignment), "a power of two");
  plan.alignment = static_cast<uint64_t>(alignment);
  plan.arenaBytes = static_cast<uint64_t>(
      readInt(field(json, path, "arena_bytes"), member(path, "arena_bytes"), 0,
              int64_t(1) << 50));

  size_t count = function.values.size();
  // views: [value, whole, byte offset] (issue 21), read first: a view's
  // offset is its whole's plus its byte offset, neither aligned nor a block
  // of its own.
  plan.viewOf.assign(count, -1);
  plan.viewOffset.assign(count, 0);
  std::string viewsAt = member(path, "views");
  std::vector<bool> isWhole(count, false);
  if (const Json *views = optionalField(json, "views")) {
    expectArray(*views, viewsAt);
    plan.hasViews = true;
    auto owned = [&](int64_t v) {
      return definedAt_[v] >= 0 && !isOutput_[v] && !parameterView_[v] &&
             !function.innerValue[v];
    };
    for (size_t i = 0; i < views->size(); ++i) {
      std::string at = index(viewsAt, i);
      const Json &entry = (*views)[i];
      expectArray(entry, at);
      if (entry.size() != 3)
        fail(at, std::to_string(entry.size()) + " numbers",
             "[value, whole, byte offset]");
      int64_t last = static_cast<int64_t>(count) - 1;
      int64_t v = readInt(entry[0], index(at, 0), 0, last);
      int64_t whole = readInt(entry[1], index(at, 1), 0, last);
      int64_t byteOffset = readInt(entry[2], index(at, 2), 0);
      if (plan.viewOf[v] >= 0 || v == whole)
        fail(index(at, 0), std::to_string(v),
             v == whole ? "a value other than its whole"
                        : "each value a view once (value " + std::to_string(v) +
                              " is a view before)");
      for (int64_t member : {v, whole})
        if (!owned(member))
          fail(index(at, member == v ? 0 : 1), std::to_string(member),
               "a value an instruction computes and the function frees "
               "(no input, output, parameter view or fused group's inner "
               "value is in a view group)");
      uint64_t wholeBytes = planValueBytes(function.values[whole]);
      if (static_cast<uint64_t>(byteOffset) >= wholeBytes)
        fail(index(at, 2), std::to_string(byteOffset),
             "an offset inside the whole's " + std::to_string(wholeBytes) +
                 " bytes (value " + std::to_string(whole) + ")");
      plan.viewOf[v] = whole;
      plan.viewOffset[v] = static_cast<uint64_t>(byteOffset);
      isWhole[whole] = true;
    }
    for (size_t i = 0; i < views->size(); ++i) {
      int64_t whole = readInt((*views)[i][1], index(index(viewsAt, i), 1), 0,
                              static_cast<int64_t>(count) - 1);
      if (plan.viewOf[whole] >= 0)
        fail(index(index(viewsAt, i), 1), std::to_string(whole),
             "a whole that is no view itself (value " + std::to_string(whole) +
                 " is a view of value " + std::to_string(plan.viewOf[whole]) +
                 ")");
    }
  }

  const Json &offsets = field(json, path, "offsets");
  std::string offsetsAt = member(path, "offsets");
  expectArray(offsets, offsetsAt);
  if (offsets.size() != count)
    fail(offsetsAt, std::to_string(offsets.size()) + " offsets",
         "one per value (" + std::to_string(count) + ")");
  for (size_t v = 0; v < count; ++v) {
    std::string at = index(offsetsAt, v);
    int64_t offset = readInt(offsets[v], at, -1);
    if (parameterView_[v] || function.innerValue[v]) {
      if (offset != -1)
        fail(at, std::to_string(offset),
             "-1: value " + std::to_string(v) +
                 (parameterView_[v]
                      ? " is a parameter view and takes no arena memory"
                      : " lives inside a fused group and takes no arena "
                        "memory"));
    } else if (offset < 0) {
      fail(at, "-1",
           "an offset in the arena: value " + std::to_string(v) +
               " is not a parameter view or a fused group's inner value");
    } else if (plan.viewOf[v] < 0) {
      uint64_t start = static_cast<uint64_t>(offset);
      uint64_t bytes = planValueBytes(function.values[v]);
      if (start % plan.alignment)
        fail(at, std::to_string(offset),
             "a multiple of the alignment " + std::to_string(plan.alignment));
      if (start > plan.arenaBytes || bytes > plan.arenaBytes - start)
        fail(at,
             std::to_string(offset) + " (value " + std::to_string(v) + ", " +
                 std::to_string(bytes) + " bytes, ends at " +
                 std::to_string(start + bytes) + ")",
             "a block inside the arena of " +
                 std::to_string(plan.arenaBytes) + " bytes (arena_bytes)");
    }
    plan.offsets.push_back(offset);
  }
  for (size_t v = 0; v < count; ++v)
    if (int64_t whole = plan.viewOf[v];
        whole >= 0 &&
        plan.offsets[v] !=
            plan.offsets[whole] + static_cast<int64_t>(plan.viewOffset[v]))
      fail(index(offsetsAt, v), std::to_string(plan.offsets[v]),
           "the offset of the whole (value " + std::to_string(whole) + ", " +
               std::to_string(plan.offsets[whole]) + ") plus the view's " +
               std::to_string(plan.viewOffset[v]) + " bytes (views)");

  // side_buffers: [instruction, offset, bytes, until, copy of] in
  // instruction order, each instruction's kernel block (copy of -1) first.
  size_t instructionCount = function.instructions.size();
  std::string sideAt = member(path, "side_buffers");
  if (const Json *side = optionalField(json, "side_buffers")) {
    expectArray(*side, sideAt);
    plan.hasSideBuffers = true;
    std::vector<bool> copied(count, false);
    for (size_t i = 0; i < side->size(); ++i) {
      std::string at = index(sideAt, i);
      const Json &entry = (*side)[i];
      expectArray(entry, at);
      if (entry.size() != 5)
        fail(at, std::to_string(entry.size()) + " numbers",
             "[instruction, offset, bytes, until, copy of]");
      int64_t last = static_cast<int64_t>(instructionCount) - 1;
      int64_t position = readInt(entry[0], index(at, 0), 0, last);
      int64_t offset = readInt(entry[1], index(at, 1), 0);
      int64_t bytes = readInt(entry[2], index(at, 2), 1);
      int64_t until = readInt(entry[3], index(at, 3), position, last);
      int64_t copyOf = readInt(entry[4], index(at, 4), -1,
                               static_cast<int64_t>(count) - 1);
      if (i > 0) {
        const MemoryPlan::SideBuffer &before = plan.sideBuffers.back();
        if (static_cast<int64_t>(before.instruction) > position ||
            (static_cast<int64_t>(before.instruction) == position &&
             copyOf < 0))
          fail(index(at, 0), std::to_string(position),
               "side buffers in instruction order, each instruction's "
               "kernel block (copy of -1) first and at most once; the "
               "entry before is instruction " +
                   std::to_string(before.instruction) + "'s");
      }
      if (copyOf >= 0 && copied[static_cast<size_t>(copyOf)])
        fail(index(at, 4), std::to_string(copyOf),
             "one copy per value (value " + std::to_string(copyOf) +
                 " has one before)");
      if (copyOf >= 0)
        copied[static_cast<size_t>(copyOf)] = true;
      uint64_t start = static_cast<uint64_t>(offset);
      if (start % plan.alignment)
        fail(index(at, 1), std::to_string(offset),
             "a multiple of the alignment " + std::to_string(plan.alignment));
      if (start > plan.arenaBytes ||
          static_cast<uint64_t>(bytes) > plan.arenaBytes - start)
        fail(index(at, 1),
             std::to_string(offset) + " (" + std::to_string(bytes) +
                 " bytes, ends at " + std::to_string(start + bytes) + ")",
             "a block inside the arena of " +
                 std::to_string(plan.arenaBytes) + " bytes (arena_bytes)");
      plan.sideBuffers.push_back({static_cast<size_t>(position), start,
                                  static_cast<uint64_t>(bytes),
                                  static_cast<size_t>(until), copyOf});
    }
  }

  // A sweep in program order over the blocks that hold memory: live maps an
  // offset to the end and the owner of the block there (a value v >= 0, or
  // side buffer i as -1 - i); blocks in it never overlap.
  std::map<uint64_t, std::pair<uint64_t, int64_t>> live;
  auto bytesOf = [&](int64_t v) {
    return planValueBytes(function.values[v]);
  };
  auto sideOf = [&](int64_t owner) -> const MemoryPlan::SideBuffer & {
    return plan.sideBuffers[static_cast<size_t>(-1 - owner)];
  };
  auto startOf = [&](int64_t owner) {
    return owner >= 0 ? static_cast<uint64_t>(plan.offsets[owner])
                      : sideOf(owner).offset;
  };
  auto sizeOf = [&](int64_t owner) {
    return owner >= 0 ? bytesOf(owner) : sideOf(owner).bytes;
  };
  auto describe = [&](int64_t owner) {
    std::string what;
    if (owner >= 0)
      what = "value " + std::to_string(owner) +
             (isWhole[owner] ? " (with its views)" : "");
    else if (sideOf(owner).copyOf < 0)
      what = "the kernel block of instructions[" +
             std::to_string(sideOf(owner).instruction) + "]";
    else
      what = "the copy of value " + std::to_string(sideOf(owner).copyOf);
    return what + " at " + range(startOf(owner), sizeOf(owner));
  };
  auto placeBlock = [&](int64_t owner, const std::string &when) {
    uint64_t start = startOf(owner), end = start + sizeOf(owner);
    auto next = live.lower_bound(start);
    std::optional<int64_t> other;
    if (next != live.end() && next->first < end)
      other = next->second.second;
    else if (next != live.begin() && std::prev(next)->second.first > start)
      other = std::prev(next)->second.second;
    if (other)
      fail(owner >= 0
               ? index(offsetsAt, static_cast<size_t>(owner))
               : index(sideAt, static_cast<size_t>(-1 - owner)),
           std::to_string(start) + ": " + describe(owner) + " overlaps " +
               describe(*other) + ", both live " + when,
           "disjoint memory for blocks live at the same time (a result may "
           "share only the memory of an operand that dies at its "
           "instruction, for ops that compute in place)");
    live[start] = {end, owner};
  };
  auto eraseBlock = [&](int64_t owner) {
    auto it = live.find(startOf(owner));
    if (it != live.end() && it->second.second == owner)
      live.erase(it);
  };
  // A view group is its whole's block, placed when its first member is
  // defined and erased when its last live member is freed.
  std::vector<size_t> liveMembers(count, 0);
  auto groupOf = [&](int64_t v) -> int64_t {
    return plan.viewOf[v] >= 0 ? plan.viewOf[v] : isWhole[v] ? v : -1;
  };
  auto insert = [&](int64_t v, const std::string &when) {
    if (int64_t whole = groupOf(v); whole >= 0) {
      if (liveMembers[whole]++ == 0)
        placeBlock(whole, when);
    } else if (plan.offsets[v] >= 0 && bytesOf(v) > 0) {
      placeBlock(v, when);
    }
  };
  auto erase = [&](int64_t v) {
    if (int64_t whole = groupOf(v); whole >= 0) {
      if (liveMembers[whole] > 0 && --liveMembers[whole] == 0)
        eraseBlock(whole);
    } else if (plan.offsets[v] >= 0 && bytesOf(v) > 0) {
      eraseBlock(v);
    }
  };
  // The side buffers that start and end at each instruction.
  std::vector<std::vector<int64_t>> sideStarts(instructionCount),
      sideEnds(instructionCount);
  for (size_t i = 0; i < plan.sideBuffers.size(); ++i) {
    sideStarts[plan.sideBuffers[i].instruction].push_back(-1 - int64_t(i));
    sideEnds[plan.sideBuffers[i].until].push_back(-1 - int64_t(i));
  }
  for (int64_t v : function.inputs)
    insert(v, "at the start (inputs)");
  for (size_t position = 0; position < function.instructions.size();
       ++position) {
    const Instruction &inst = function.instructions[position];
    std::string when = "at instructions[" + std::to_string(position) + "]";
    std::set<int64_t> taken;
    for (size_t i = 0; i < inst.results.size(); ++i) {
      int64_t r = inst.results[i];
      if (i == 0 && mayComputeInPlace(inst.op) && plan.offsets[r] >= 0 &&
          groupOf(r) < 0)
        for (int64_t o : inst.operands)
          if (groupOf(o) < 0 && plan.offsets[o] == plan.offsets[r] &&
              freedAt_[o] == static_cast<int64_t>(position) &&
              bytesOf(o) == bytesOf(r) && !taken.count(o)) {
            erase(o);
            taken.insert(o);
            break;
          }
      insert(r, when);
    }
    for (int64_t owner : sideStarts[position])
      placeBlock(owner, when);
    for (int64_t v : inst.free)
      if (!taken.count(v))
        erase(v);
    for (int64_t owner : sideEnds[position])
      eraseBlock(owner);
  }
  function.memoryPlan = std::move(plan);
}

} // namespace bundle_detail
} // namespace mtrt
