// The CUDA backend's kernel blocks from a bundle function: the pairing of
// forwards with their gradients and each op's case of core/OpScratch.h.
#include "core/ScratchPlan.h"

#include "core/AttentionViews.h"
#include "core/Error.h"
#include "core/MemoryPlan.h"
#include "core/OpShapes.h"

#include <utility>

namespace mtrt {

scratch::AttentionShape attentionScratchShape(const host::AttentionParams &p) {
  return scratch::attentionShapeOf(p);
}

bool runsFlashAttention(const host::AttentionParams &p, bool mixedPrecision) {
  return mixedPrecision &&
         scratch::flashAttentionUnsupportedReason(attentionScratchShape(p))
             .empty();
}

namespace {

bool sameAttention(const host::AttentionParams &a,
                   const host::AttentionParams &b) {
  return a.batch == b.batch && a.seqQ == b.seqQ && a.seqK == b.seqK &&
         a.headsQ == b.headsQ && a.headsKv == b.headsKv &&
         a.headDim == b.headDim && a.headDimV == b.headDimV &&
         a.causal == b.causal && a.scale == b.scale &&
         a.dropoutP == b.dropoutP && a.seed == b.seed;
}

/// Each flash attention_grad reads the state of the nearest earlier
/// attention of the same q, k, v and attributes (a recomputed clone when
/// there is one); each cross_entropy_grad the logsumexps of its forward.
void pair(const Function &fn, bool mixedPrecision, ScratchPlan &plan) {
  constexpr size_t kNone = ScratchPlan::kNoPartner;
  for (size_t grad = 0; grad < fn.instructions.size(); ++grad) {
    const Instruction &g = fn.instructions[grad];
    if (g.op == Op::AttentionGrad) {
      host::AttentionParams p = attentionParams(fn, g, 0);
      if (!runsFlashAttention(p, mixedPrecision))
        continue;
      for (size_t forward = grad; forward-- > 0;) {
        const Instruction &f = fn.instructions[forward];
        if (f.op != Op::Attention || plan.attentionPartner[forward] != kNone ||
            f.operands[0] != g.operands[1] || f.operands[1] != g.operands[2] ||
            f.operands[2] != g.operands[3] ||
            !sameAttention(attentionParams(fn, f, 0), p))
          continue;
        plan.attentionPartner[forward] = grad;
        plan.attentionPartner[grad] = forward;
        plan.keptUntil[forward] = grad;
        break;
      }
    } else if (g.op == Op::CrossEntropyGrad) {
      for (size_t forward = grad; forward-- > 0;) {
        const Instruction &f = fn.instructions[forward];
        if (f.op != Op::CrossEntropy || plan.lossPartner[forward] != kNone ||
            f.operands[0] != g.operands[1] || f.operands[1] != g.operands[2] ||
            f.attrs.ignoreIndex != g.attrs.ignoreIndex ||
            f.attrs.reduction != g.attrs.reduction)
          continue;
        plan.lossPartner[forward] = grad;
        plan.lossPartner[grad] = forward;
        plan.keptUntil[forward] = grad;
        break;
      }
    }
  }
}

/// The bytes value `v` takes in `fn`'s memory plan: its block, or for an
/// attention view its group's whole block (the views interleave there);
/// {0, 0} for a value without memory.
std::pair<uint64_t, uint64_t> planBytes(const Function &fn, int64_t v) {
  const MemoryPlan &plan = *fn.memoryPlan;
  int64_t whole = plan.wholeOf(static_cast<size_t>(v));
  auto at = static_cast<size_t>(whole >= 0 ? whole : v);
  if (at >= plan.offsets.size() || plan.offsets[at] < 0)
    return {0, 0};
  auto begin = static_cast<uint64_t>(plan.offsets[at]);
  return {begin, begin + planValueBytes(fn.values[at])};
}

/// ScratchPlan::outputHeld of the attention at `forward` and its gradient
/// at `grad` (the compiler's rule too: dialects/mt/Transforms/MemoryPlan.cpp,
/// heldAttentionOutputs).
bool outputHeldThrough(const Function &fn, size_t forward, size_t grad) {
  if (!fn.memoryPlan || !fn.memoryPlan->hasSideBuffers ||
      fn.memoryPlan->alignment % scratch::kAlignment != 0 ||
      fn.instructions[forward].results.empty())
    return false;
  int64_t out = fn.instructions[forward].results[0];
  if (fn.values[out].dtype != DType::BF16 ||
      fn.memoryPlan->wholeOf(static_cast<size_t>(out)) >= 0)
    return false;
  std::pair<uint64_t, uint64_t> held = planBytes(fn, out);
  auto overlaps = [&](std::pair<uint64_t, uint64_t> bytes) {
    return bytes.first < held.second && held.first < bytes.second;
  };
  if (held.first == held.second)
    return false;
  for (size_t position = forward + 1; position <= grad; ++position) {
    const Instruction &inst = fn.instructions[position];
    for (int64_t result : inst.results) {
      std::pair<uint64_t, uint64_t> bytes = planBytes(fn, result);
      if (!overlaps(bytes))
        continue;
      // A reshape in place of the output's own bytes leaves them as they
      // are (the backend copies nothing onto itself).
      bool reshapedInPlace = inst.op == Op::Reshape && bytes == held &&
                             !inst.operands.empty() &&
                             planBytes(fn, inst.operands[0]) == held;
      if (!reshapedInPlace)
        return false;
    }
  }
  for (const MemoryPlan::SideBuffer &side : fn.memoryPlan->sideBuffers)
    if (side.instruction > forward && side.instruction <= grad &&
        overlaps({side.offset, side.offset + side.bytes}))
      return false;
  return true;
}

bool isGemm(Op op) {
  switch (op) {
  case Op::Linear:
  case Op::LinearGelu:
  case Op::LinearGeluGrad:
  case Op::LinearAdd:
  case Op::Matmul:
  case Op::LinearWeightGrad:
  case Op::LinearWeightBiasGrad:
    return true;
  default:
    return false;
  }
}

/// A GEMM's bias gradient: the column sums of linear_gelu_grad's kernel, or
/// of a BGRAD epilogue's in case cuBLASLt cannot do them (0 without one).
uint64_t gemmColumnSumBytes(const Function &fn, const Instruction &inst) {
  bool biasGrad = inst.op == Op::LinearWeightBiasGrad ||
                  (inst.op == Op::LinearGeluGrad && inst.results.size() == 2);
  if (!biasGrad)
    return 0;
  LinearDims d = linearDims(fn, inst);
  return scratch::biasGradOpBytes(d.rows, d.outSize);
}

/// The column sums, then a bf16 result's bias vector.
uint64_t gemmEpilogueBytes(const Function &fn, const Instruction &inst) {
  return gemmColumnSumBytes(fn, inst) +
         scratch::gemmBf16VectorBytes(gemmBf16VectorColumns(fn, inst));
}

uint64_t blockBytes(const Function &fn, const ScratchPlan &plan,
                    size_t position, bool mixedPrecision, bool gemmWorkspace) {
  const Instruction &inst = fn.instructions[position];
  if (isGemm(inst.op)) {
    uint64_t epilogue = gemmEpilogueBytes(fn, inst);
    return gemmWorkspace ? scratch::gemmOpBytes(epilogue) : epilogue;
  }
  switch (inst.op) {
  case Op::LayerNormGrad:
  case Op::RmsNormGrad: {
    NormDims d = normDims(fn, inst);
    return scratch::normGradOpBytes(d.rows, d.hidden, inst.results.size() == 3);
  }
  case Op::BiasGrad: {
    LinearDims d = linearDims(fn, inst);
    return scratch::biasGradOpBytes(d.rows, d.outSize);
  }
  case Op::Fused: { // each column sum's partial rows, one after another
    uint64_t bytes = 0;
    for (const FusedColumnSum &sum : fusedColumnSums(inst)) {
      const TensorType &summed = fn.values[inst.results[sum.summed]];
      int64_t cols = summed.shape.empty() ? 1 : summed.shape.back();
      bytes +=
          scratch::biasGradOpBytes(cols ? summed.numElements / cols : 0, cols);
    }
    return bytes;
  }
  case Op::EmbeddingGrad:
    return scratch::embeddingGradOpBytes(
        embeddingDims(fn, inst).count,
        fn.values[inst.operands[1]].dtype == DType::I64);
  case Op::Attention:
  case Op::AttentionGrad: {
    host::AttentionParams p = attentionParams(fn, inst, 0);
    bool flash = runsFlashAttention(p, mixedPrecision);
    bool paired = plan.attentionPartner[position] != ScratchPlan::kNoPartner;
    scratch::AttentionShape shape = attentionScratchShape(p);
    return inst.op == Op::Attention
               ? scratch::attentionOpBytes(shape, flash, paired,
                                           plan.outputHeld[position])
               : scratch::attentionGradOpBytes(shape, flash, paired);
  }
  case Op::Rope: {
    RopeDims d = ropeDims(fn, inst);
    return scratch::ropeOpBytes(d.seq, d.rotary);
  }
  case Op::CrossEntropy:
  case Op::CrossEntropyGrad:
    return scratch::crossEntropyOpBytes(
        crossEntropyDims(fn, inst).rows,
        inst.op == Op::CrossEntropy &&
            plan.lossPartner[position] != ScratchPlan::kNoPartner);
  case Op::LinearCrossEntropy:
  case Op::LinearVocabMax:
  case Op::LinearVocabPartials:
  case Op::LinearVocabCrossEntropyGrad: {
    // The compiler's chunk (its attribute, not clamped to the rows), as
    // SideBuffers.cpp sizes it; x and W are operands 0 and 1 of each.
    const std::vector<int64_t> &w = fn.values[inst.operands[1]].shape;
    return scratch::linearCrossEntropyOpBytes(
        inst.attrs.chunkRows, inst.attrs.transposeWeight ? w[0] : w[1],
        dtypeSize(fn.values[inst.operands[0]].dtype));
  }
  default:
    return 0;
  }
}

} // namespace

bool planHoldsGemmWorkspace(const Function &fn) {
  if (!fn.memoryPlan)
    return false;
  std::vector<uint64_t> block(fn.instructions.size(), 0);
  for (const MemoryPlan::SideBuffer &side : fn.memoryPlan->sideBuffers)
    if (side.copyOf < 0 && side.instruction < block.size())
      block[side.instruction] = side.bytes;
  bool any = false, all = true;
  for (size_t position = 0; position < fn.instructions.size(); ++position) {
    const Instruction &inst = fn.instructions[position];
    if (!isGemm(inst.op))
      continue;
    bool holds =
        block[position] >= scratch::gemmOpBytes(gemmEpilogueBytes(fn, inst));
    any = any || holds;
    all = all && holds;
  }
  return any || all;
}

uint64_t gemmWorkspaceOffset(const Function &fn, const Instruction &inst) {
  return scratch::gemmWorkspaceOffset(gemmEpilogueBytes(fn, inst));
}

int64_t gemmBf16VectorColumns(const Function &fn, const Instruction &inst) {
  if (!isGemm(inst.op) || inst.results.empty() ||
      fn.values[inst.results[0]].dtype != DType::BF16)
    return 0;
  bool bias = ((inst.op == Op::Linear || inst.op == Op::LinearGelu) &&
               inst.operands.size() == 3) ||
              (inst.op == Op::LinearAdd && inst.operands.size() == 4);
  if (!bias)
    return 0;
  return fn.values[inst.results[0]].shape.back();
}

uint64_t gemmBf16VectorOffset(const Function &fn, const Instruction &inst) {
  return gemmColumnSumBytes(fn, inst);
}

ScratchPlan planScratch(const Function &fn, bool mixedPrecision,
                        bool gemmWorkspace) {
  size_t n = fn.instructions.size();
  ScratchPlan plan;
  plan.attentionPartner.assign(n, ScratchPlan::kNoPartner);
  plan.lossPartner.assign(n, ScratchPlan::kNoPartner);
  plan.keptUntil.resize(n);
  for (size_t position = 0; position < n; ++position)
    plan.keptUntil[position] = position;
  pair(fn, mixedPrecision, plan);
  plan.outputHeld.assign(n, false);
  for (size_t position = 0; position < n; ++position)
    if (fn.instructions[position].op == Op::Attention &&
        plan.attentionPartner[position] != ScratchPlan::kNoPartner)
      plan.outputHeld[position] =
          outputHeldThrough(fn, position, plan.attentionPartner[position]);
  plan.bytes.resize(n);
  for (size_t position = 0; position < n; ++position)
    plan.bytes[position] =
        blockBytes(fn, plan, position, mixedPrecision, gemmWorkspace);
  return plan;
}

void checkCudaMemoryPlan(const Bundle &bundle, const Function &fn,
                         bool &gemmWorkspace) {
  if (!bundle.typedPrecision())
    throw Error(MTRT_STATUS_INVALID_ARGUMENT,
                "bundle '" + bundle.name() +
                    "': the CUDA plan check needs format version 8 or later "
                    "(value types say what is stored); recompile the bundle "
                    "with this megatron-compile");
  bool mixedPrecision =
      bundle.hasModel() && bundle.model().precision == "bf16";
  gemmWorkspace = planHoldsGemmWorkspace(fn);
  ScratchPlan scratchPlan = planScratch(fn, mixedPrecision, gemmWorkspace);
  std::vector<bool> view(fn.values.size(), false);
  for (const Instruction &inst : fn.instructions)
    if (inst.op == Op::GetParameter)
      view[inst.results[0]] = true;
  std::optional<PlannedArena> planned = layOutPlannedArena(
      fn,
      [&](int64_t v) -> uint64_t {
        if (view[v])
          return 0;
        return uint64_t(fn.values[v].numElements) *
               dtypeSize(fn.values[v].dtype);
      },
      [&](size_t position) {
        return std::vector<SideBufferNeed>{
            {scratchPlan.bytes[position], scratchPlan.keptUntil[position]}};
      },
      scratch::kAlignment, "cuda");
  if (!planned)
    throw Error(MTRT_STATUS_FAILED_PRECONDITION,
                "bundle '" + bundle.name() + "': " + fn.name +
                    " has no memory plan with side buffers, or one that "
                    "holds less than a value's declared bytes; the CUDA "
                    "backend would lay out its own arena");
  readAttentionViews(fn, mixedPrecision);
}

} // namespace mtrt
