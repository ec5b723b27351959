// The views in the compiler's memory plan: which splits and concats copy
// nothing because the plan places their pieces inside the whole's block
// (`memory_plan.views`, docs/BundleFormat.md): flash attention's strided
// q, k, v and dq, dk, dv (issue 21), with the strides the flash kernels
// read or write them with, and --tp-comm-overlap's contiguous chunks. The
// CUDA executor runs in these; checkCudaMemoryPlan (mtrt-run
// --check-cuda-plan) checks them on any machine. The compiler's rule:
// dialects/mt/Transforms/ViewGroups.cpp.
#ifndef MTRT_SRC_CORE_ATTENTIONVIEWS_H
#define MTRT_SRC_CORE_ATTENTIONVIEWS_H

#include "core/Bundle.h"

#include <array>
#include <cstdint>
#include <vector>

namespace mtrt {

struct AttentionViewLayout {
  /// By instruction: a split or concat whose pieces are views (elided).
  std::vector<bool> elided;
  /// By value: a piece's strides in its whole, in elements (position,
  /// head); {0, 0}: packed.
  std::vector<std::array<int64_t, 2>> strides;
  /// The view groups (wholes with views) and the views.
  size_t groups = 0, views = 0;
};

/// The views of `fn`'s memory plan, checked against what the flash kernels
/// can do with them (`mixedPrecision`: the bundle's precision is bf16):
/// every view is a piece of a split or concat at its offset in the whole,
/// either contiguous there (only dimensions of 1 before the axis; any op
/// reads or writes it) or on axis 2 or 3 of a 4-D whole (a multiple of 8
/// elements, the whole's last dimension a multiple of 8, under bf16 only),
/// whose every reader is a flash kernel reading it as q, k or v (a
/// split's) or whose only writer is one flash attention_grad and only
/// reader the concat (a concat's); or a value with its whole's bytes at
/// offset 0 (through a reshape). All false and packed
/// when the plan has no views. Throws Error (FAILED_PRECONDITION) naming the
/// instruction, the values and the reason otherwise.
AttentionViewLayout readAttentionViews(const Function &fn, bool mixedPrecision);

} // namespace mtrt

#endif // MTRT_SRC_CORE_ATTENTIONVIEWS_H
