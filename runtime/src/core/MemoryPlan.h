// The compiler's static arena (docs/BundleFormat.md, "Memory plan"): which
// ops may compute in place, and the bytes a value takes. The checks run when
// the bundle is read (core/MemoryPlan.cpp); backends that run in the plan's
// arena (host/Executor) trust it after that.
#ifndef MTRT_SRC_CORE_MEMORYPLAN_H
#define MTRT_SRC_CORE_MEMORYPLAN_H

#include "core/Bundle.h"

#include <cstdint>

namespace mtrt {

/// Whether `op`'s first result may take the memory of an operand of the same
/// size that dies at it: the elementwise ops (add, mul, gelu, gelu_grad,
/// silu, silu_grad, swiglu, dropout, bias_add) and reshape. The compiler's
/// list (mt::mayComputeInPlace) is the same.
bool mayComputeInPlace(Op op);

/// The bytes value `type` takes in the plan: its elements in its declared
/// type.
uint64_t planValueBytes(const TensorType &type);

} // namespace mtrt

#endif // MTRT_SRC_CORE_MEMORYPLAN_H
