// The static device-memory plan of one function: an offset in one arena for
// every value and every instruction's scratch, from the bundle's `free` lists.
#ifndef MTRT_SRC_CUDA_ARENAPLAN_H
#define MTRT_SRC_CUDA_ARENAPLAN_H

#include "core/Bundle.h"
#include "core/MemoryPlan.h"

#include <cstddef>
#include <cstdint>
#include <functional>
#include <map>
#include <vector>

namespace mtrt::cuda {

/// Every block's offset and size is a multiple of this (cuBLASLt's preferred
/// alignment, and enough for any element type).
constexpr size_t kArenaAlignment = 256;

/// Best-fit allocation of offsets in a region that grows at its top;
/// released neighbours merge.
class OffsetAllocator {
public:
  /// An offset for `bytes` (rounded up to kArenaAlignment).
  size_t allocate(size_t bytes);
  void release(size_t offset, size_t bytes);
  /// The highest end of any block so far: the region's size.
  size_t peak() const { return peak_; }

private:
  std::map<size_t, size_t> free_; // offset -> size
  size_t top_ = 0, peak_ = 0;
};

/// Offsets in the arena, valid for every run. From the bundle's memory plan
/// when it has one with side buffers: each instruction's scratch in its
/// kernel block, each copy in its block (Error when the plan gives less than
/// the backend needs or releases it earlier). Otherwise planned here: a
/// simulated run that allocates inputs first (held for the whole run), then
/// at each instruction its results, its scratch and its copies, releasing
/// scratch and copies after their last instruction and the values listed in
/// `free` after that. Outputs and values
/// no instruction frees stay to the end. Values that need no memory (views
/// of parameters, empty tensors) have no offset.
struct ArenaPlan {
  static constexpr size_t kNone = ~size_t(0);
  size_t bytes = 0;
  std::vector<size_t> valueOffset;      // by value index; kNone: no memory
  std::vector<size_t> scratchOffset;    // by instruction; kNone: no scratch
  std::vector<size_t> scratchBytes;     // by instruction
  std::vector<size_t> copyOffset;       // by value: its copy; kNone: none
  /// The offsets are the bundle's memory plan (core/MemoryPlan.h); then no
  /// value shares another's memory (aliasOf is not applied).
  bool fromCompiler = false;
};

/// `valueBytes(v)`: the bytes value v needs on the device (0: none, e.g. a
/// get_parameter view); `scratchBytes(position)`: the scratch instruction
/// `position` needs; `scratchKeptUntil(position)`, when given: the later
/// instruction after which that scratch is released (results an instruction
/// leaves for a later one, such as attention's logsumexp for its gradient;
/// `position` itself releases it at once).
///
/// `aliasOf(v)`, when given: the earlier value whose memory v shares (a
/// reshape's result and its operand hold the same bytes), or -1. Shared
/// memory is released when the last value sharing it is; v gets its root's
/// offset (none when the root needs no memory, e.g. a parameter view: the
/// executor then binds v to the root's memory when it runs).
///
/// `copiesAt(position)`, when given: the copies of values the instruction
/// makes (bf16 GEMM operands; SideBufferNeed with copyOf set), each its own
/// block kept through its `until`.
ArenaPlan planArena(
    const Function &function,
    const std::function<size_t(int64_t)> &valueBytes,
    const std::function<size_t(size_t)> &scratchBytes,
    const std::function<size_t(size_t)> &scratchKeptUntil = nullptr,
    const std::function<int64_t(int64_t)> &aliasOf = nullptr,
    const std::function<std::vector<SideBufferNeed>(size_t)> &copiesAt =
        nullptr);

} // namespace mtrt::cuda

#endif // MTRT_SRC_CUDA_ARENAPLAN_H
