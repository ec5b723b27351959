//===- SideBuffers.h - What a device backend keeps besides the values -*- C++ -*-===//
//
// The CUDA backend keeps buffers that are no value of the program: kernel
// scratch (norm statistics, column sums, sort space), state a forward kernel
// saves for its gradient (flash attention's output copy, logsumexp and
// dropout bits; cross-entropy's logsumexps), and under mixed precision one
// 16-bit copy of every GEMM operand, kept from its first GEMM to its last,
// except parameters: their bf16 copies persist beside the fp32 masters in the
// runtime's parameter store (counted with the parameters, not here).
// This file declares them, per instruction, each block with the last
// instruction that reads it, so that the memory plan places them in the arena
// beside the values (docs/Memory.md, "Side buffers"). The runtime computes
// the same blocks (runtime/src/cuda/OpDispatch.cpp, Executor::scratchBytes and
// its pairing) and refuses a plan that gives less: a kernel change that needs
// other scratch updates both, and the load-time check says which.
//
//===----------------------------------------------------------------------===//

#ifndef MT_TRANSFORMS_SIDEBUFFERS_H
#define MT_TRANSFORMS_SIDEBUFFERS_H

#include "mlir/IR/BuiltinAttributes.h"
#include "mlir/IR/Operation.h"
#include "mlir/IR/Value.h"
#include "llvm/ADT/ArrayRef.h"
#include "llvm/ADT/DenseSet.h"
#include "llvm/ADT/SmallVector.h"

#include <cstdint>

namespace mlir::mt {

/// How the device backend stores what it computes.
struct SideBufferOptions {
  /// GEMMs and the attention core take bf16 operands (precision bf16): GEMM
  /// operands get bf16 copies and attention runs on the flash kernels.
  bool mixedPrecision = false;
  /// Paired attentions whose bf16 output the memory plan holds through the
  /// gradient, which reads it there: their blocks keep no copy of it
  /// (planFunctionMemory finds them; the runtime's ScratchPlan::outputHeld).
  llvm::DenseSet<Operation *> heldAttentionOutputs;
};

/// A side buffer of an instruction: `bytes` (a multiple of the arena's
/// alignment), live from the instruction through instruction `until`.
struct SideBuffer {
  int64_t bytes = 0;
  int64_t until = 0;
  /// The value this block holds a bf16 copy of; null for the instruction's
  /// kernel block (its scratch and the state it saves for a gradient).
  Value copyOf;
};

/// The side buffers of an instruction stream: `stream[i]` is the op of
/// instruction i, or null for instructions without one (the parameter reads
/// of a partitioned function's arguments, accumulate_gradient). By
/// instruction: its kernel block first when it needs one, then the copies it
/// makes (of its first operand first), each kept until its last reader.
SmallVector<SmallVector<SideBuffer, 1>>
declareSideBuffers(ArrayRef<Operation *> stream,
                   const SideBufferOptions &options);

/// The parameter `value` reads (a get_parameter's result, or a partitioned
/// function's argument marked mt.parameter, or an mt.cast of either: the
/// runtime's persistent bf16 copy), or null.
FlatSymbolRefAttr parameterRead(Value value);

/// Whether `op` is a GEMM whose operands A and B (its first two) get bf16
/// copies under mixed precision: linear, linear_gelu, linear_gelu_grad,
/// matmul and the weight-gradient GEMMs. A parameter such an operand reads
/// straight (parameterRead) has a persistent copy in the runtime's store
/// (runtime/src/cuda/ParameterStore.h, gemmReadParameters).
bool readsGemmOperands(Operation *op);

/// Whether the CUDA backend runs `op` (an attention or attention_grad) with
/// the flash kernels: under mixed precision, for the shapes they take
/// (runtime/src/core/ScratchPlan.h, runsFlashAttention). False for other ops.
bool runsFlashAttention(Operation *op, const SideBufferOptions &options);

} // namespace mlir::mt

#endif // MT_TRANSFORMS_SIDEBUFFERS_H
