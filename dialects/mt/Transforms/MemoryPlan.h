//===- MemoryPlan.h - Liveness and a static arena for a step function -*- C++ -*-===//
//
// The buffer plan the bundle carries (docs/BundleFormat.md, `memory_plan`):
// for every value of a function, an offset in one arena, from the liveness of
// the instruction stream the bundle writer emits, and for every instruction
// the block of its side buffers (SideBuffers.h: kernel scratch, state saved
// for a gradient, bf16 GEMM operand copies). The runtime validates it and
// runs the function in that arena; the memory report reads its peak.
//
//===----------------------------------------------------------------------===//

#ifndef MT_TRANSFORMS_MEMORYPLAN_H
#define MT_TRANSFORMS_MEMORYPLAN_H

#include "mt/Transforms/SideBuffers.h"
#include "mt/Transforms/ViewGroups.h"

#include "mlir/Dialect/Func/IR/FuncOps.h"
#include "llvm/ADT/DenseMap.h"
#include "llvm/ADT/SmallVector.h"

#include <cstdint>

namespace mlir::mt {

/// Every offset and every block is a multiple of this (cuBLASLt's preferred
/// alignment, and enough for any element type).
inline constexpr int64_t kArenaAlignment = 256;

/// Whether `op`'s result may take the memory of an operand of the same size
/// that dies at it: elementwise ops that read element i only to write element
/// i, and reshape (a copy in the same order). The runtime accepts in-place
/// results only for these ops (runtime/src/core/MemoryPlan.cpp).
bool mayComputeInPlace(Operation *op);

/// The values an op's instruction writes: a split collective's start
/// (mt.collective_start) writes its wait's result, which the memory plan
/// allocates at the start; the wait is no instruction.
SmallVector<Value, 2> instructionResults(Operation *op);

/// One value's place in the plan. Positions count the bundle's instructions:
/// the parameter reads of a partitioned function's arguments first, then the
/// body's ops, then one accumulate_gradient per gradient result.
struct BufferPlan {
  Value value;
  int64_t bytes = 0;
  /// Offset in the arena; -1 for values without memory (parameter views).
  int64_t offset = -1;
  /// The instruction defining it; -1 for inputs.
  int64_t definedAt = -1;
  /// The last instruction reading it; the stream's length for inputs,
  /// outputs and gradients, which live to the end.
  int64_t lastUse = -1;
  /// The operand whose memory it took in place, or null.
  Value inPlaceOf;
};

/// A value that lies inside another's block (an attention view,
/// AttentionViews.h): `value` at `byteOffset` in the block of `whole`, which
/// lives from the first member's definition through the members' last use.
struct ViewPlan {
  Value value;
  Value whole;
  int64_t byteOffset = 0;
};

/// One side buffer in the plan.
struct SideBufferPlan {
  /// The instruction that makes it, and its op (null for the parameter
  /// reads of arguments and accumulate_gradient, which have none).
  int64_t position = 0;
  Operation *op = nullptr;
  int64_t bytes = 0;
  /// The last instruction reading it.
  int64_t until = 0;
  /// Offset in the arena.
  int64_t offset = 0;
  /// The value it holds a bf16 copy of; null for the instruction's kernel
  /// block.
  Value copyOf;
};

struct FunctionMemoryPlan {
  /// The arena's size: the highest end of any block, values and side
  /// buffers.
  int64_t arenaBytes = 0;
  /// Of the arena at its peak: the bytes of live side buffers.
  int64_t peakSideBufferBytes = 0;
  /// The instructions in the stream.
  int64_t numInstructions = 0;
  /// The first instruction at which the arena reaches its size.
  int64_t peakAt = 0;
  /// In definition order (arguments first).
  SmallVector<BufferPlan> buffers;
  DenseMap<Value, int64_t> bufferIndex;
  /// Results that took an operand's memory.
  int64_t numInPlace = 0;
  /// In instruction order (SideBuffers.h: per instruction its kernel block
  /// first, then its copies).
  SmallVector<SideBufferPlan> sideBuffers;
  /// The attention views, group by group.
  SmallVector<ViewPlan> views;

  const BufferPlan *lookup(Value value) const {
    auto it = bufferIndex.find(value);
    return it == bufferIndex.end() ? nullptr : &buffers[it->second];
  }
};

/// Plans `function`'s arena: a simulated run that allocates inputs first (held
/// for the whole run), then at each instruction its results (best fit, or in
/// place where mayComputeInPlace allows) and its side buffers (best fit),
/// then releases the values whose last use it is and the side buffers it
/// reads last. Outputs and gradients stay to the end. An attention view
/// group (findViewGroups) is one block, the whole's, allocated when its
/// first member is defined and released after its members' last use; its
/// members neither compute in place nor lend their memory. `options`: how
/// the device backend stores what it computes (the bundle's precision).
FunctionMemoryPlan planFunctionMemory(func::FuncOp function,
                                      const SideBufferOptions &options);

} // namespace mlir::mt

#endif // MT_TRANSFORMS_MEMORYPLAN_H
