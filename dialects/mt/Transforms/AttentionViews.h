//===- AttentionViews.h - Flash attention views in the plan -*- C++ -*-===//
//
// Under mixed precision the CUDA backend's flash kernels read q, k and v in
// place in the qkv GEMM's result and write dq, dk and dv in place in the
// concat that gathers them, so the split and the concat copy nothing. The
// memory plan places such a group as one block: the whole (the split's
// operand, the concat's result), the values holding the same bytes through
// reshapes, and the pieces at their offsets inside it (docs/Memory.md,
// "Attention views"; docs/BundleFormat.md, `memory_plan.views`). The
// runtime checks the groups it reads against the same rule
// (runtime/src/core/AttentionViews.cpp).
//
//===----------------------------------------------------------------------===//

#ifndef MT_TRANSFORMS_ATTENTIONVIEWS_H
#define MT_TRANSFORMS_ATTENTIONVIEWS_H

#include "mt/Transforms/SideBuffers.h"

#include "mlir/Dialect/Func/IR/FuncOps.h"
#include "llvm/ADT/SmallVector.h"

#include <cstdint>

namespace mlir::mt {

/// One group: `whole`'s block holds every member.
struct AttentionViewGroup {
  /// The split's operand or the concat's result.
  Value whole;
  /// The split or concat that copies nothing.
  Operation *copy = nullptr;
  /// The other members and their byte offsets in the whole's block: the
  /// values sharing its bytes through reshapes (offset 0), then the pieces.
  SmallVector<std::pair<Value, int64_t>, 6> members;
};

/// The groups of `function` (none unless `options.mixedPrecision`): a split
/// on axis 2 or 3 of a 4-D tensor whose every result only flash attentions
/// read, as q, k or v; a concat on such an axis of exactly one flash
/// attention_grad's dq, dk, dv, read by it only. Pieces start at multiples
/// of 8 elements (the flash kernels load 16-byte rows), the whole's last
/// dimension is a multiple of 8, and no member is an argument, a returned
/// value, a parameter read or in another group.
SmallVector<AttentionViewGroup>
findAttentionViews(func::FuncOp function, const SideBufferOptions &options);

} // namespace mlir::mt

#endif // MT_TRANSFORMS_ATTENTIONVIEWS_H
