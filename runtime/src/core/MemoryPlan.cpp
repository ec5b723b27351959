// Reads a function's `memory_plan` and proves it safe: every value with memory
// inside the arena and aligned, parameter views without memory, and no two
// values that are live at the same time sharing a byte, except a result
// computed in place of an operand that dies at its instruction.
#include "core/MemoryPlan.h"

#include "core/BundleReader.h"

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
                   uint64_t maxScratchBytes, uint64_t alignment) {
  const std::optional<MemoryPlan> &plan = function.memoryPlan;
  if (!plan || plan->alignment % alignment != 0)
    return std::nullopt;
  for (size_t v = 0; v < function.values.size(); ++v)
    if (plan->offsets[v] >= 0 &&
        storageBytes(static_cast<int64_t>(v)) >
            planValueBytes(function.values[v]))
      return std::nullopt;
  PlannedArena arena;
  arena.scratchOffset = (plan->arenaBytes + alignment - 1) / alignment * alignment;
  arena.scratchBytes = maxScratchBytes;
  arena.bytes = arena.scratchOffset + maxScratchBytes;
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
  for (auto it = json.begin(); it != json.end(); ++it)
    if (it.key() != "alignment" && it.key() != "arena_bytes" &&
        it.key() != "offsets")
      fail(member(path, it.key().c_str()), "a field \"" + it.key() + "\"",
           "only \"alignment\", \"arena_bytes\" and \"offsets\"");
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

  const Json &offsets = field(json, path, "offsets");
  std::string offsetsAt = member(path, "offsets");
  expectArray(offsets, offsetsAt);
  size_t count = function.values.size();
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
    } else {
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

  // A sweep in program order over the values that hold memory: live maps an
  // offset to the end and the value of the block there; blocks in it never
  // overlap.
  std::map<uint64_t, std::pair<uint64_t, int64_t>> live;
  auto bytesOf = [&](int64_t v) {
    return planValueBytes(function.values[v]);
  };
  auto insert = [&](int64_t v, const std::string &when) {
    if (plan.offsets[v] < 0 || bytesOf(v) == 0)
      return;
    uint64_t start = static_cast<uint64_t>(plan.offsets[v]);
    uint64_t end = start + bytesOf(v);
    auto next = live.lower_bound(start);
    int64_t other = -1;
    if (next != live.end() && next->first < end)
      other = next->second.second;
    else if (next != live.begin() && std::prev(next)->second.first > start)
      other = std::prev(next)->second.second;
    if (other >= 0)
      fail(index(offsetsAt, static_cast<size_t>(v)),
           std::to_string(start) + ": value " + std::to_string(v) + " at " +
               range(start, bytesOf(v)) + " overlaps value " +
               std::to_string(other) + " at " +
               range(static_cast<uint64_t>(plan.offsets[other]),
                     bytesOf(other)) +
               ", both live " + when,
           "disjoint memory for values live at the same time (a result may "
           "share only the memory of an operand that dies at its "
           "instruction, for ops that compute in place)");
    live[start] = {end, v};
  };
  auto erase = [&](int64_t v) {
    if (plan.offsets[v] < 0 || bytesOf(v) == 0)
      return;
    auto it = live.find(static_cast<uint64_t>(plan.offsets[v]));
    if (it != live.end() && it->second.second == v)
      live.erase(it);
  };

  for (int64_t v : function.inputs)
    insert(v, "at the start (inputs)");
  for (size_t position = 0; position < function.instructions.size();
       ++position) {
    const Instruction &inst = function.instructions[position];
    std::string when = "at instructions[" + std::to_string(position) + "]";
    std::set<int64_t> taken;
    for (size_t i = 0; i < inst.results.size(); ++i) {
      int64_t r = inst.results[i];
      if (i == 0 && mayComputeInPlace(inst.op) && plan.offsets[r] >= 0)
        for (int64_t o : inst.operands)
          if (plan.offsets[o] == plan.offsets[r] &&
              freedAt_[o] == static_cast<int64_t>(position) &&
              bytesOf(o) == bytesOf(r) && !taken.count(o)) {
            erase(o);
            taken.insert(o);
            break;
          }
      insert(r, when);
    }
    for (int64_t v : inst.free)
      if (!taken.count(v))
        erase(v);
  }
  function.memoryPlan = std::move(plan);
}

} // namespace bundle_detail
} // namespace mtrt
