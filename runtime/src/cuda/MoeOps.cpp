// The mixture-of-experts instructions on the device (docs/MoE.md, "On
// CUDA"): routing and its losses, the permutations and expert parallelism's
// blocks as kernels (kernels/Moe.cu), the experts' grouped GEMMs as one
// cuBLASLt GEMM per expert on its rows, whose counts the host reads back
// once per instruction. all_to_all is a rank instruction (RankOps.cpp).
#include "cuda/Executor.h"

#include "cuda/CudaCheck.h"
#include "cuda/MoeGemm.h"
#include "cuda/kernels/MoeKernels.h"

#include <algorithm>
#include <limits>

namespace mtrt::cuda {

namespace {

size_t pieceBytes(size_t bytes) {
  return (bytes + kArenaAlignment - 1) / kArenaAlignment * kArenaAlignment;
}

/// The routing indices [T, K]: operand 0 of moe_dispatch_experts, 1 of
/// the permutations and expert parallelism's blocks, 2 of the other ops
/// that read a layout.
size_t routingOperand(Op op) {
  switch (op) {
  case Op::MoeDispatchExperts:
    return 0;
  case Op::MoePermute:
  case Op::MoeUnpermute:
  case Op::MoeDispatchRows:
  case Op::MoeCombineRows:
    return 1;
  default:
    return 2;
  }
}

bool readsLayout(Op op) {
  return op == Op::MoePermute || op == Op::MoeUnpermute ||
         op == Op::MoeProbsGrad || op == Op::MoeGroupedLinear ||
         op == Op::MoeGroupedLinearWeightGrad || op == Op::MoeDispatchRows ||
         op == Op::MoeDispatchExperts || op == Op::MoeCombineRows;
}

bool isRouterOp(Op op) {
  return op == Op::MoeRoute || op == Op::MoeRouteGrad || op == Op::MoeAuxLoss ||
         op == Op::MoeAuxLossGrad;
}

} // namespace

MoeRouter Executor::moeRouter(const Instruction &inst) const {
  bool grad = inst.op == Op::MoeRouteGrad || inst.op == Op::MoeAuxLossGrad ||
              inst.op == Op::MoeZLossGrad;
  const std::vector<int64_t> &logits =
      function_->values[inst.operands[grad ? 1 : 0]].shape;
  MoeRouter r;
  r.tokens = logits[0];
  r.experts = logits[1];
  r.topk = inst.attrs.topk;
  r.sigmoid = inst.attrs.sigmoid;
  r.normalize = inst.attrs.normalize;
  r.numGroups = inst.attrs.numGroups;
  r.groupTopk = inst.attrs.groupTopk;
  r.sequenceLength = inst.attrs.sequenceLength;
  r.capacityFactor = inst.attrs.capacityFactor.value_or(0.0);
  r.dropByPosition = inst.attrs.dropByPosition;
  return r;
}

int64_t Executor::moeLayoutExperts(const Instruction &inst) const {
  const Function &fn = *function_;
  if (inst.op == Op::MoeGroupedLinear)
    return fn.values[inst.operands[1]].shape[0];
  if (inst.op == Op::MoeGroupedLinearWeightGrad)
    return fn.values[inst.results[0]].shape[0];
  if (inst.op == Op::MoeDispatchRows || inst.op == Op::MoeDispatchExperts ||
      inst.op == Op::MoeCombineRows)
    return inst.attrs.numExperts; // the layer's, over every rank's
  return kMoeMaxExperts; // the permutations bound no index but by this
}

void Executor::checkMoe(size_t position, const Instruction &inst) const {
  const Function &fn = *function_;
  auto refuse = [&](const std::string &what) {
    throw Error(MTRT_STATUS_UNIMPLEMENTED, "bundle '" + bundle_.name() +
                                               "': " + where(position) + ": " +
                                               opName(inst.op) + ": " + what);
  };
  if (isRouterOp(inst.op) || inst.op == Op::MoeZLoss ||
      inst.op == Op::MoeZLossGrad) {
    MoeRouter r = moeRouter(inst);
    if (!isRouterOp(inst.op))
      return;
    if (r.topk > kMoeMaxTopk)
      refuse("the cuda backend's routing kernels take a top-k of up to " +
             std::to_string(kMoeMaxTopk) + ", found " + std::to_string(r.topk) +
             "; run this model on the host backend");
    if (r.numGroups > kMoeMaxGroups)
      refuse("group-limited routing on the cuda backend takes up to " +
             std::to_string(kMoeMaxGroups) + " groups, found " +
             std::to_string(r.numGroups) +
             "; run this model on the host backend or use fewer groups");
    if (r.capacityFactor > 0 && r.experts > kMoeMaxExperts)
      refuse("capacity routing on the cuda backend takes up to " +
             std::to_string(kMoeMaxExperts) + " experts, found " +
             std::to_string(r.experts) +
             "; run this model on the host backend or drop no tokens");
  }
  if (readsLayout(inst.op)) {
    const std::vector<int64_t> &routing =
        fn.values[inst.operands[routingOperand(inst.op)]].shape;
    int64_t slots = routing[0] * routing[1];
    if (moeLayoutExperts(inst) > kMoeMaxExperts)
      refuse("the cuda backend's grouped GEMMs take up to " +
             std::to_string(kMoeMaxExperts) + " experts, found " +
             std::to_string(moeLayoutExperts(inst)) +
             "; run this model on the host backend");
    if (slots > std::numeric_limits<int32_t>::max())
      refuse("the routing has " + std::to_string(slots) +
             " slots (tokens x top-k), over the cuda backend's " +
             std::to_string(std::numeric_limits<int32_t>::max()) +
             "; use a smaller micro-batch");
  }
}

void Executor::prepareMoe() {
  const Function &fn = *function_;
  size_t bytes = 0;
  for (size_t position = 0; position < fn.instructions.size(); ++position) {
    const Instruction &inst = fn.instructions[position];
    if (!isMoeOp(inst.op))
      continue;
    // The grouped GEMMs take both operands in one type (bf16 products
    // accumulate in fp32) and write a weight gradient in fp32.
    bool grouped = inst.op == Op::MoeGroupedLinear ||
                   inst.op == Op::MoeGroupedLinearWeightGrad;
    if (grouped &&
        (heldInBf16(inst.operands[0]) != heldInBf16(inst.operands[1]) ||
         (inst.op == Op::MoeGroupedLinearWeightGrad &&
          heldInBf16(inst.results[0]))))
      throw Error(MTRT_STATUS_UNIMPLEMENTED,
                  "bundle '" + bundle_.name() + "': " + where(position) + ": " +
                      opName(inst.op) +
                      " takes its two operands in one type and writes a "
                      "weight gradient in fp32; recompile the bundle with "
                      "this megatron-compile");
    if (inst.op == Op::MoeRoute)
      bytes = std::max(bytes, moeRouteScratchBytes(moeRouter(inst)));
    if (inst.op == Op::MoeAuxLoss || inst.op == Op::MoeAuxLossGrad)
      bytes = std::max(bytes, moeAuxLossScratchBytes(moeRouter(inst)));
    if (readsLayout(inst.op)) {
      const std::vector<int64_t> &routing =
          fn.values[inst.operands[routingOperand(inst.op)]].shape;
      size_t slots = static_cast<size_t>(routing[0] * routing[1]);
      bytes = std::max(bytes, pieceBytes(4 * (kMoeMaxExperts + 1)) +
                                  pieceBytes(4 * slots));
    }
  }
  if (bytes)
    moeScratch_ = DeviceBuffer(bytes, fn.name + ": the mixture-of-experts "
                                                "layer's scratch");
}

void Executor::executeMoe(size_t position, const Instruction &inst) {
  const Function &fn = *function_;
  const Attributes &a = inst.attrs;
  cudaStream_t stream = context_.stream();
  auto value = [&](size_t i) { return slots_[inst.operands[i]]; };
  auto in = [&](size_t i) { return static_cast<const float *>(value(i)); };
  auto out = [&](size_t i) {
    return static_cast<float *>(slots_[inst.results[i]]);
  };
  auto inElements = [&](size_t i) -> InElements {
    if (heldInBf16(inst.operands[i]))
      return static_cast<const __nv_bfloat16 *>(value(i));
    return in(i);
  };
  auto outElements = [&](size_t i) -> OutElements {
    if (heldInBf16(inst.results[i]))
      return static_cast<__nv_bfloat16 *>(slots_[inst.results[i]]);
    return out(i);
  };
  auto shapeOf = [&](int64_t v) -> const std::vector<int64_t> & {
    return fn.values[v].shape;
  };
  auto launched = [&](const char *what) {
    MTRT_CUDA_CHECK(cudaGetLastError(),
                    where(position) + ": launching " + what);
  };
  void *scratch = moeScratch_.data();

  if (inst.op == Op::MoeTokensPerExpert) {
    const std::vector<int64_t> &routing = shapeOf(inst.operands[0]);
    moeTokensPerExpert(stream, routing[0] * routing[1],
                       shapeOf(inst.results[0])[0],
                       static_cast<const int32_t *>(value(0)), out(0));
    launched("the tokens per expert");
    return;
  }
  if (isRouterOp(inst.op) || inst.op == Op::MoeZLoss ||
      inst.op == Op::MoeZLossGrad) {
    MoeRouter r = moeRouter(inst);
    switch (inst.op) {
    case Op::MoeRoute:
      moeRouteForward(stream, r, in(0),
                      inst.operands.size() > 1 ? in(1) : nullptr, out(0),
                      static_cast<int32_t *>(slots_[inst.results[1]]), scratch);
      break;
    case Op::MoeRouteGrad:
      moeRouteBackward(stream, r, in(1),
                       inst.operands.size() > 3 ? in(3) : nullptr,
                       static_cast<const int32_t *>(value(2)), in(0), out(0));
      break;
    case Op::MoeAuxLoss:
      moeAuxLossForward(stream, r, a.coeff, in(0), out(0), scratch);
      break;
    case Op::MoeAuxLossGrad:
      moeAuxLossBackward(stream, r, a.coeff, in(1), in(0), out(0), scratch);
      break;
    case Op::MoeZLoss:
      moeZLossForward(stream, r.tokens, r.experts, a.coeff, in(0), out(0));
      break;
    default: // MoeZLossGrad
      moeZLossBackward(stream, r.tokens, r.experts, a.coeff, in(1), in(0),
                       out(0));
      break;
    }
    launched("the routing kernels");
    return;
  }

  size_t at = routingOperand(inst.op);
  const std::vector<int64_t> &routing = shapeOf(inst.operands[at]);
  const int64_t tokens = routing[0], topk = routing[1];
  const int64_t experts = moeLayoutExperts(inst);
  const int64_t indices = inst.operands[at];
  bool grouped = inst.op == Op::MoeGroupedLinear ||
                 inst.op == Op::MoeGroupedLinearWeightGrad;
  // A grouped GEMM whose routing's offsets this run has read back (a
  // layer's forward and backward GEMMs share one routing, which is written
  // once per run) reuses them: one read-back per routing and run.
  if (moeOffsetsRun_ != runs_) {
    moeOffsets_.clear();
    moeOffsetsRun_ = runs_;
  }
  std::vector<int32_t> &hostOffsets = moeOffsets_[{indices, experts}];
  bool cached = grouped && !hostOffsets.empty();
  // The layout of the routing indices in the scratch.
  auto *offsets = static_cast<int32_t *>(scratch);
  auto *positions = reinterpret_cast<int32_t *>(
      static_cast<char *>(scratch) + pieceBytes(4 * (kMoeMaxExperts + 1)));
  if (!cached) {
    moeLayout(stream, tokens * topk, experts,
              static_cast<const int32_t *>(value(at)), offsets, positions,
              nullptr, context_.fault(), static_cast<unsigned>(position + 1));
    launched("the routing's layout kernel");
  }
  const float *probs = inst.operands.size() == 3 && at == 1 ? in(2) : nullptr;
  switch (inst.op) {
  case Op::MoePermute:
    moePermute(stream, tokens, topk, shapeOf(inst.operands[0])[1], experts,
               offsets, positions, inElements(0), probs, outElements(0));
    launched("the permutation kernel");
    return;
  case Op::MoeUnpermute:
    moeUnpermute(stream, tokens, topk, shapeOf(inst.operands[0])[1], positions,
                 inElements(0), probs, outElements(0));
    launched("the unpermutation kernel");
    return;
  case Op::MoeProbsGrad:
    moeProbsGrad(stream, tokens, topk, shapeOf(inst.operands[0])[1], positions,
                 inElements(0), inElements(1), out(0));
    launched("the routing weights' gradient kernel");
    return;
  case Op::MoeDispatchRows:
  case Op::MoeCombineRows:
    moeDispatchRows(stream, tokens * topk, shapeOf(inst.operands[0])[1],
                    a.expertRanks, experts, offsets,
                    inst.op == Op::MoeCombineRows, inElements(0),
                    outElements(0));
    launched("the expert-parallel blocks' kernel");
    return;
  case Op::MoeDispatchExperts:
    moeDispatchExperts(stream, tokens * topk, a.expertRanks, experts, offsets,
                       static_cast<int32_t *>(slots_[inst.results[0]]));
    launched("the expert-parallel experts' kernel");
    return;
  default:
    break;
  }

  // The grouped GEMMs: each expert's row count, read back once.
  if (!cached) {
    hostOffsets.resize(static_cast<size_t>(experts + 1));
    MTRT_CUDA_CHECK(
        cudaMemcpyAsync(hostOffsets.data(), offsets,
                        sizeof(int32_t) * static_cast<size_t>(experts + 1),
                        cudaMemcpyDeviceToHost, stream),
        where(position) + ": reading the experts' row counts");
    MTRT_CUDA_CHECK(cudaStreamSynchronize(stream),
                    where(position) + ": waiting for the experts' row counts");
  }
  ExpertGroups groups;
  groups.offsets = hostOffsets.data();
  groups.experts = experts;
  groups.bf16 = heldInBf16(inst.operands[0]);
  const int64_t inSize = shapeOf(inst.operands[0])[1];
  try {
    if (inst.op == Op::MoeGroupedLinear)
      groupedLinear(context_.gemm(), stream, groups, tokens * topk, inSize,
                    shapeOf(inst.results[0])[1], value(0), value(1),
                    a.transposeWeight, slots_[inst.results[0]],
                    heldInBf16(inst.results[0]));
    else
      groupedLinearWeightGrad(context_.gemm(), stream, groups, inSize,
                              shapeOf(inst.operands[1])[1], value(0), value(1),
                              a.transposeWeight, out(0));
  } catch (const Error &e) {
    throw Error(e.code(), where(position) + ": " + e.what());
  }
}

} // namespace mtrt::cuda
