// Checks the memory plan's attention views against the flash kernels and
// says which splits and concats they elide.
#include "core/AttentionViews.h"

#include "core/Error.h"
#include "core/ExecutorChecks.h"
#include "core/MemoryPlan.h"
#include "core/OpShapes.h"
#include "core/ScratchPlan.h"

#include <algorithm>
#include <string>

namespace mtrt {

AttentionViewLayout readAttentionViews(const Function &fn,
                                       bool mixedPrecision) {
  AttentionViewLayout layout;
  layout.elided.assign(fn.instructions.size(), false);
  layout.strides.assign(fn.values.size(), {0, 0});
  if (!fn.memoryPlan || !fn.memoryPlan->hasViews)
    return layout;
  const MemoryPlan &plan = *fn.memoryPlan;
  size_t values = fn.values.size();
  std::vector<bool> whole(values, false);
  for (size_t v = 0; v < values; ++v)
    if (plan.viewOf[v] >= 0) {
      ++layout.views;
      whole[static_cast<size_t>(plan.viewOf[v])] = true;
    }
  layout.groups =
      static_cast<size_t>(std::count(whole.begin(), whole.end(), true));
  if (!layout.views)
    return layout;

  auto groupOf = [&](int64_t v) -> int64_t {
    return plan.viewOf[v] >= 0 ? plan.viewOf[v] : whole[v] ? v : -1;
  };
  std::vector<std::vector<std::pair<size_t, size_t>>> readers(values);
  std::vector<size_t> producer(values, ~size_t(0));
  for (size_t position = 0; position < fn.instructions.size(); ++position) {
    const Instruction &inst = fn.instructions[position];
    for (size_t i = 0; i < inst.operands.size(); ++i)
      readers[inst.operands[i]].emplace_back(position, i);
    for (int64_t v : inst.results)
      producer[v] = position;
  }
  auto flashAt = [&](size_t position) {
    const Instruction &inst = fn.instructions[position];
    return (inst.op == Op::Attention || inst.op == Op::AttentionGrad) &&
           runsFlashAttention(attentionParams(fn, inst, 0), mixedPrecision);
  };
  auto refuse = [&](size_t position, const std::string &why) {
    throw Error(MTRT_STATUS_FAILED_PRECONDITION,
                instructionWhere(fn, position) +
                    ": the bundle's memory plan places its pieces as views "
                    "of their whole (memory_plan.views), which the CUDA "
                    "backend's flash kernels cannot run in: " +
                    why +
                    ". Recompile the bundle with the megatron-compile of "
                    "this runtime's release");
  };

  std::vector<bool> piece(values, false);
  for (size_t position = 0; position < fn.instructions.size(); ++position) {
    const Instruction &inst = fn.instructions[position];
    if (inst.op != Op::Split && inst.op != Op::Concat)
      continue;
    bool split = inst.op == Op::Split;
    const std::vector<int64_t> &parts = split ? inst.results : inst.operands;
    int64_t wholeValue = split ? inst.operands[0] : inst.results[0];
    int64_t group = groupOf(wholeValue);
    // Elided where its pieces are views. One whose pieces have blocks of
    // their own is a copy like any other, also where its whole holds a
    // group's bytes: --tp-comm-overlap's join of the qkv GEMM's row chunks
    // (written into the qkv group's block, which the flash kernels then
    // read in place) and its slices of the concat of dq, dk and dv.
    bool pieces = false;
    for (int64_t p : parts)
      pieces = pieces || plan.viewOf[p] >= 0;
    if (!pieces)
      continue;
    auto [wholeV, axis, outer, inner] = splitDims(fn, inst);
    const auto &shape = fn.values[wholeV].shape;
    // Pieces that are contiguous blocks of the whole (only dimensions of 1
    // before the axis: --tp-comm-overlap's chunks of whole samples) are
    // packed tensors any op reads and writes; the others are the flash
    // kernels' strided q, k, v and dq, dk, dv.
    bool contiguous = outer == 1;
    if (!contiguous && !mixedPrecision)
      refuse(position, "the bundle is not bf16, and the fp32 kernels read "
                       "packed tensors only");
    if (!contiguous &&
        (shape.size() != 4 || (axis != 2 && axis != 3) || shape[3] % 8 != 0))
      refuse(position, "the whole is " + shapeString(shape) +
                           ", split on axis " + std::to_string(axis) +
                           "; the flash kernels take pieces on axis 2 or 3 "
                           "of a 4-D tensor whose last dimension is a "
                           "multiple of 8, and other pieces must be "
                           "contiguous blocks of it (no dimension above 1 "
                           "before the axis)");
    DType type = fn.values[wholeV].dtype;
    int64_t offset = 0;
    for (int64_t p : parts) {
      if (groupOf(p) != group || group < 0)
        refuse(position, "value " + std::to_string(p) +
                             " is not a view of the whole's group (value " +
                             std::to_string(group < 0 ? wholeValue : group) +
                             ")");
      int64_t expected =
          plan.offsets[wholeV] + offset * static_cast<int64_t>(dtypeSize(type));
      if (fn.values[p].dtype != type || (!contiguous && offset % 8 != 0) ||
          plan.offsets[p] != expected || piece[p])
        refuse(position, "value " + std::to_string(p) + " is at offset " +
                             std::to_string(plan.offsets[p]) + ", expected " +
                             std::to_string(expected) +
                             " (its elements' place in the whole, a "
                             "multiple of 8 elements for the flash kernels, "
                             "of the whole's type)");
      piece[p] = true;
      offset += fn.values[p].shape[axis] * inner;
      if (contiguous)
        continue;
      if (split) {
        for (auto [reader, operand] : readers[p]) {
          size_t first =
              fn.instructions[reader].op == Op::AttentionGrad ? 1 : 0;
          if (!flashAt(reader) || operand < first || operand > first + 2)
            refuse(position, "value " + std::to_string(p) + " is read by " +
                                 instructionWhere(fn, reader) +
                                 ", not by a flash kernel as q, k or v");
        }
        layout.strides[p] = {shape[2] * shape[3], shape[3]};
      } else {
        size_t grad = producer[p];
        if (grad == ~size_t(0) ||
            fn.instructions[grad].op != Op::AttentionGrad || !flashAt(grad) ||
            producer[parts.front()] != grad || readers[p].size() != 1 ||
            parts.size() != fn.instructions[grad].results.size())
          refuse(position, "value " + std::to_string(p) +
                               " is not one of exactly one flash "
                               "attention_grad's results read by this "
                               "concat only");
        layout.strides[p] = {shape[2] * shape[3], shape[3]};
      }
    }
    layout.elided[position] = true;
  }
  // Every other view holds its whole's bytes as they are (a reshape's).
  for (size_t v = 0; v < values; ++v) {
    int64_t w = plan.viewOf[v];
    if (w < 0 || piece[v])
      continue;
    if (plan.viewOffset[v] != 0 ||
        planValueBytes(fn.values[v]) != planValueBytes(fn.values[w]) ||
        fn.values[v].dtype != fn.values[w].dtype)
      throw Error(MTRT_STATUS_FAILED_PRECONDITION,
                  "function " + fn.name +
                      ": the bundle's memory plan makes "
                      "value " +
                      std::to_string(v) + " a view of value " +
                      std::to_string(w) + " at byte " +
                      std::to_string(plan.viewOffset[v]) +
                      ", neither a piece of a split or concat the flash "
                      "kernels elide nor the whole's bytes as they are; "
                      "recompile the bundle with the megatron-compile of "
                      "this runtime's release");
  }
  return layout;
}

} // namespace mtrt
