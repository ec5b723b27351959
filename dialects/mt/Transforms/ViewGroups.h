//===- ViewGroups.h - Splits and concats the memory plan elides -*- C++ -*-===//
//
// Two kinds of split and concat copy nothing, because the memory plan
// places their pieces inside their whole's block:
//
// - Attention views: under mixed precision the CUDA backend's flash
//   kernels read q, k and v in place in the qkv GEMM's result and write dq,
//   dk and dv in place in the concat that gathers them (strided pieces).
// - Contiguous views: --tp-comm-overlap's chunks of whole samples
//   (mt.chunk_copy splits and concats along a leading axis), each piece a
//   contiguous block of its whole that any op reads or writes as it is.
//
// The memory plan places a group as one block: the whole (the split's
// operand, the concat's result), the values holding the same bytes through
// reshapes, and the pieces at their offsets inside it (docs/Memory.md,
// "Views"; docs/BundleFormat.md, `memory_plan.views`). The runtime checks
// the groups it reads against the same rules
// (runtime/src/core/AttentionViews.cpp).
//
//===----------------------------------------------------------------------===//

#ifndef MT_TRANSFORMS_VIEWGROUPS_H
#define MT_TRANSFORMS_VIEWGROUPS_H

#include "mt/Transforms/SideBuffers.h"

#include "mlir/Dialect/Func/IR/FuncOps.h"
#include "llvm/ADT/SmallVector.h"

#include <cstdint>

namespace mlir::mt {

/// One group: `whole`'s block holds every member.
struct ViewGroup {
  /// The split's operand or the concat's result.
  Value whole;
  /// The splits and concats that copy nothing.
  SmallVector<Operation *, 1> copies;
  /// The other members and their byte offsets in the whole's block: the
  /// values sharing its bytes through reshapes (offset 0), then the pieces.
  SmallVector<std::pair<Value, int64_t>, 6> members;
};

/// Whether `op` is a chunk copy (mt.chunk_copy) whose pieces are
/// contiguous blocks of its whole, which the memory plan makes views: a
/// split or concat along an axis with only dimensions of 1 before it.
bool isContiguousChunkCopy(Operation *op);

/// The groups of `function`:
/// - attention views (only under `options.mixedPrecision`): a split on
///   axis 2 or 3 of a 4-D tensor whose every result only flash attentions
///   read, as q, k or v; a concat on such an axis of exactly one flash
///   attention_grad's dq, dk, dv, read by it only. Pieces start at
///   multiples of 8 elements (the flash kernels load 16-byte rows) and the
///   whole's last dimension is a multiple of 8;
/// - contiguous views: a split or concat marked mt.chunk_copy along an axis
///   with only dimensions of 1 before it, so that each piece is a
///   contiguous block of the whole. Where its whole is already a member of
///   a group (the qkv GEMM's joined chunks, which the flash kernels then
///   read in place), its pieces join that group at the whole's offset.
/// No member is an argument, a returned value, a parameter read or in
/// another group.
SmallVector<ViewGroup> findViewGroups(func::FuncOp function,
                                      const SideBufferOptions &options);

} // namespace mlir::mt

#endif // MT_TRANSFORMS_VIEWGROUPS_H
