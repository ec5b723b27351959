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

namespace mtrt {

/// Whether `op`'s first result may take the memory of an operand of the same
/// size that dies at it: the elementwise ops (add, mul, gelu, gelu_grad,
/// silu, silu_grad, swiglu, dropout, bias_add) and reshape. The compiler's
/// list (mt::mayComputeInPlace) is the same.
bool mayComputeInPlace(Op op);

/// The bytes value `type` takes in the plan: its elements in its declared
/// type.
uint64_t planValueBytes(const TensorType &type);

/// A device arena laid out from the compiler's plan, for backends that place
/// values themselves (cuda/ArenaPlan takes it when it can): every value at
/// the plan's offset, then one scratch region after the plan's bytes that
/// every instruction's kernel scratch shares (instructions run one at a
/// time).
struct PlannedArena {
  uint64_t bytes = 0;
  uint64_t scratchOffset = 0;
  uint64_t scratchBytes = 0;
};

/// The layout of `function` in its memory plan, or nullopt when it has none
/// or the backend cannot use it: a value stored in more bytes than the plan
/// gave it (storageBytes(v) > planValueBytes), or offsets aligned more
/// loosely than `alignment`. The backend then plans on its own.
std::optional<PlannedArena>
layOutPlannedArena(const Function &function,
                   const std::function<uint64_t(int64_t)> &storageBytes,
                   uint64_t maxScratchBytes, uint64_t alignment);

} // namespace mtrt

#endif // MTRT_SRC_CORE_MEMORYPLAN_H
