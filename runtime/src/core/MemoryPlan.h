// The compiler's static arena (docs/BundleFormat.md, "Memory plan"): which
// ops may compute in place, and the bytes a value takes. The checks run when
// the bundle is read (core/MemoryPlan.cpp); backends that run in the plan's
// arena (host/Executor) trust it after that.
#ifndef MTRT_SRC_CORE_MEMORYPLAN_H
#define MTRT_SRC_CORE_MEMORYPLAN_H

#include "core/Bundle.h"

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

namespace mtrt {

/// Whether `op`'s first result may take the memory of an operand of the same
/// size that dies at it: the elementwise ops (add, mul, gelu, gelu_grad,
/// silu, silu_grad, swiglu, dropout, bias_add) and reshape. The compiler's
/// list (mt::mayComputeInPlace) is the same.
bool mayComputeInPlace(Op op);

/// The bytes value `type` takes in the plan: its elements in its declared
/// type.
uint64_t planValueBytes(const TensorType &type);

/// A block a device backend needs besides the values at one instruction:
/// `bytes`, live from the instruction through instruction `until`; its
/// kernel block (scratch, state kept for a later instruction) when `copyOf`
/// is -1, else a copy of value `copyOf` (a bf16 GEMM operand).
struct SideBufferNeed {
  uint64_t bytes = 0;
  size_t until = 0;
  int64_t copyOf = -1;
};

/// A device arena laid out from the compiler's plan, for backends that place
/// values themselves (cuda/ArenaPlan): every value at the plan's offset and
/// every side buffer in the plan's block for it.
struct PlannedArena {
  uint64_t bytes = 0;
  /// By instruction: the offset of its kernel block; -1: none.
  std::vector<int64_t> kernelOffset;
  /// By value: the offset of its copy; -1: none.
  std::vector<int64_t> copyOffset;
};

/// The layout of `function` in its memory plan, or nullopt when the backend
/// plans on its own: the function has no plan, or one without side buffers
/// (bundles before format version 3), or the plan's blocks are aligned more
/// loosely than `alignment`, or a value is stored in more bytes than the plan
/// gave it (storageBytes(v) > planValueBytes).
///
/// `need(position)`: the side buffers the backend makes at an instruction.
/// Throws Error (FAILED_PRECONDITION), naming `backend`, the instruction,
/// the block, the bytes and the instructions that hold them, when the plan
/// has no such block there, a smaller one, or one released before the
/// backend's last use: the compiler's declaration
/// (dialects/mt/Transforms/SideBuffers.cpp) and the backend disagree.
std::optional<PlannedArena>
layOutPlannedArena(const Function &function,
                   const std::function<uint64_t(int64_t)> &storageBytes,
                   const std::function<std::vector<SideBufferNeed>(size_t)> &need,
                   uint64_t alignment, const std::string &backend);

} // namespace mtrt

#endif // MTRT_SRC_CORE_MEMORYPLAN_H
