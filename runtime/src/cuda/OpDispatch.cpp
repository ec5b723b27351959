// One bundle instruction to CUDA kernel launches or cuBLASLt calls: sizes
// from the values table, scratch from the arena plan.
#include "cuda/Executor.h"

#include "comm/RankContext.h"
#include "core/OpScratch.h"
#include "core/OpShapes.h"
#include "cuda/CudaCheck.h"
#include "cuda/CudnnAttention.h"
#include "cuda/ParameterStore.h"
#include "cuda/kernels/AttentionBlocks.h"
#include "cuda/kernels/HopperAttention.h"
#include "cuda/kernels/Kernels.h"

#include <algorithm>
#include <cstdlib>
#include <cstring>

namespace mtrt::cuda {

namespace {

size_t roundUp(size_t bytes) {
  return (bytes + kArenaAlignment - 1) / kArenaAlignment * kArenaAlignment;
}

/// Carves an instruction's scratch into aligned pieces, in the order
/// scratchBytes counts them.
class Carver {
public:
  explicit Carver(void *base) : base_(static_cast<char *>(base)) {}
  template <typename T> T *take(size_t bytes) {
    T *piece = reinterpret_cast<T *>(base_ + used_);
    used_ += roundUp(bytes);
    return piece;
  }

private:
  char *base_;
  size_t used_ = 0;
};

/// The mask tile of a fused group's dropouts: the first with p > 0 (the
/// group's values share one shape and the reader admits no split_axes in a
/// body), or an unused one.
random::MaskTile fusedMaskTile(const Function &fn, const Instruction &inst,
                               const std::vector<int64_t> &grid,
                               const std::vector<int64_t> &coordinates,
                               uint64_t firstSample) {
  for (const Instruction &op : inst.body)
    if (op.op == Op::Dropout && op.attrs.p != 0)
      return dropoutMaskTile(fn, op, grid, coordinates, firstSample);
  return random::MaskTile{};
}

} // namespace

bool Executor::flashAttention(const AttentionParams &params) const {
  return runsFlashAttention(params, bf16_);
}

FlashTensors Executor::flashTensorLayout(const Instruction &inst,
                                         size_t first) const {
  FlashTensors io;
  io.inputsBf16 = heldInBf16(inst.operands[first]);
  io.outputsBf16 = heldInBf16(inst.results[0]);
  io.deterministic = context_.options().deterministicAttention;
  io.qLayout = flashLayout(inst.operands[first]);
  io.kLayout = flashLayout(inst.operands[first + 1]);
  io.vLayout = flashLayout(inst.operands[first + 2]);
  if (first == 0) {
    io.outLayout = flashLayout(inst.results[0]);
  } else {
    io.doutLayout = flashLayout(inst.operands[0]);
    io.dqLayout = flashLayout(inst.results[0]);
    io.dkLayout = flashLayout(inst.results[1]);
    io.dvLayout = flashLayout(inst.results[2]);
  }
  return io;
}

void Executor::planCudnnAttention() {
  const Function &fn = *function_;
  cudnnAttention_.assign(fn.instructions.size(), false);
  cudnnDeclined_.clear();
  for (size_t position = 0; position < fn.instructions.size(); ++position) {
    const Instruction &inst = fn.instructions[position];
    if (inst.op != Op::Attention && inst.op != Op::AttentionGrad)
      continue;
    AttentionParams p = attentionParams(fn, inst, 0);
    if (!flashAttention(p) || p.dropoutP > 0)
      continue;
    bool grad = inst.op == Op::AttentionGrad;
    FlashTensors io = flashTensorLayout(inst, grad ? 1 : 0);
    // Grouped-query heads at head dimension 64 stay on the own Hopper
    // kernels (forward and backward alike, so that a pair runs on one
    // side): llama-1.5b's step (32 query heads on 8) took 128.6 -> 127.3 ms
    // without cuDNN, where gpt2-124m, gpt2-350m and gpt-1.3b (a key head a
    // query head) took 0.3-2.5 ms longer (H100, bench/NOTES.md, session
    // 37). Not measured at 128 (the Llama 3 shapes): cuDNN there.
    if (p.headsKv < p.headsQ && p.headDim == 64 &&
        context_.options().hopperAttention &&
        hopperAttentionBackwardUnsupportedReason(p, io).empty())
      continue;
    std::string why;
    CudnnAttention *cudnn = context_.cudnnAttention();
    if (!cudnn)
      why = context_.cudnnAttentionMissing();
    // The forward: the attention's, or the rerun of an unpaired gradient
    // (into the packed copy only).
    if (why.empty() &&
        (!grad || kernelBlocks_.attentionPartner[position] == kNoPartner)) {
      FlashTensors forward = io;
      forward.outLayout = FlashLayout{};
      if (!grad)
        forward.outLayout = io.outLayout;
      size_t bytes = 0;
      why = cudnn->prepare(p, forward, false, &bytes);
      if (why.empty() && bytes > scratch::kCudnnAttentionForwardWorkspaceBytes)
        why = "its forward plan needs " + std::to_string(bytes) +
              " bytes of workspace, over the memory plan's " +
              std::to_string(scratch::kCudnnAttentionForwardWorkspaceBytes);
    }
    if (why.empty() && grad) {
      size_t bytes = 0;
      why = cudnn->prepare(p, io, true, &bytes);
      uint64_t bound = scratch::cudnnAttentionWorkspaceBoundBytes(
          scratch::attentionShapeOf(p));
      if (why.empty() && bytes > bound)
        why = "its backward plan needs " + std::to_string(bytes) +
              " bytes of workspace, over the memory plan's " +
              std::to_string(bound);
    }
    cudnnAttention_[position] = why.empty();
    if (!why.empty() && cudnnDeclined_.empty())
      cudnnDeclined_ = where(position) + ": " + why;
  }
}

void Executor::checkHeldAttentionOutputs() const {
  const Function &fn = *function_;
  for (size_t position = 0; position < fn.instructions.size(); ++position) {
    if (!kernelBlocks_.outputHeld[position])
      continue;
    int64_t out = fn.instructions[position].results[0];
    FlashLayout layout = flashLayout(out);
    if (!plan_.fromCompiler || !heldInBf16(out) || layout.position != 0 ||
        layout.head != 0)
      throw Error(MTRT_STATUS_INTERNAL,
                  where(position) +
                      ": the memory plan holds the attention's output for "
                      "its gradient (its block keeps no copy), but the "
                      "executor " +
                      (!plan_.fromCompiler ? "lays out its own arena"
                       : !heldInBf16(out)  ? "stores the output in fp32"
                                           : "reads the output as a view"));
  }
}

void Executor::flashForward(cudaStream_t stream, const AttentionParams &p,
                            const FlashTensors &io, __nv_bfloat16 *kept,
                            float *lse, uint64_t *mask) const {
  if (context_.options().hopperAttention &&
      hopperAttentionUnsupportedReason(p, io).empty())
    hopperAttentionForward(stream, p, io, kept, lse, mask);
  else
    flashAttentionForward(stream, p, io, kept, lse, mask);
}

void Executor::flashBackward(cudaStream_t stream, const AttentionParams &p,
                             const FlashTensors &io,
                             const __nv_bfloat16 *kept, const float *lse,
                             const uint64_t *mask, void *scratch) const {
  if (context_.options().hopperAttention &&
      hopperAttentionBackwardUnsupportedReason(p, io).empty())
    hopperAttentionBackward(stream, p, io, kept, lse, mask, scratch);
  else
    flashAttentionBackward(stream, p, io, kept, lse, mask, scratch);
}

size_t Executor::cudnnAttentionCount() const {
  return static_cast<size_t>(
      std::count(cudnnAttention_.begin(), cudnnAttention_.end(), true));
}

void Executor::planKernelBlocks() {
  gemmWorkspaceInPlan_ = planHoldsGemmWorkspace(*function_);
  kernelBlocks_ = planScratch(*function_, bf16_, gemmWorkspaceInPlan_);
}

void Executor::planGemmAccumulation() {
  const Function &fn = *function_;
  gemmAccumulates_.assign(fn.instructions.size(), -1);
  accumulatedByGemm_.assign(fn.instructions.size(), false);
  if (parameters_.gradientsInArena()) // the gradients stay in their slots
    return;
  // Each value's uses (as an operand or a function output), and its last
  // reader (kNoPartner: none).
  std::vector<int64_t> uses(fn.values.size(), 0);
  std::vector<size_t> reader(fn.values.size(), kNoPartner);
  for (size_t position = 0; position < fn.instructions.size(); ++position)
    for (int64_t v : fn.instructions[position].operands) {
      ++uses[v];
      reader[v] = position;
    }
  for (int64_t v : fn.outputs)
    ++uses[v];
  for (size_t position = 0; position < fn.instructions.size(); ++position) {
    const Instruction &inst = fn.instructions[position];
    if ((inst.op != Op::LinearWeightGrad &&
         inst.op != Op::LinearWeightBiasGrad) ||
        isRankInstruction(inst))
      continue;
    // Its one use must be an instruction's: a weight gradient that is only
    // a function output has no reader (reader[] would index before the
    // instructions; that read crashed one-rank tests now and then).
    int64_t gradient = inst.results[0];
    if (uses[gradient] != 1 || reader[gradient] == kNoPartner ||
        heldInBf16(gradient))
      continue;
    const Instruction &accumulate = fn.instructions[reader[gradient]];
    if (accumulate.op != Op::AccumulateGradient ||
        accumulate.operands[0] != gradient || accumulate.attrs.parameter < 0 ||
        parameters_.count(static_cast<size_t>(accumulate.attrs.parameter)) !=
            fn.values[gradient].numElements)
      continue;
    gemmAccumulates_[position] = accumulate.attrs.parameter;
    accumulatedByGemm_[reader[gradient]] = true;
  }
}

size_t Executor::gemmAccumulationCount() const {
  size_t count = 0;
  for (int64_t parameter : gemmAccumulates_)
    count += parameter >= 0;
  return count;
}

void Executor::checkShapes(size_t position, const Instruction &inst) const {
  const Function &fn = *function_;
  auto shapeOf = [&](int64_t v) -> const std::vector<int64_t> & {
    return fn.values[v].shape;
  };
  if (inst.op == Op::AttentionBlock || inst.op == Op::AttentionBlockGrad) {
    std::string reason = attentionBlockUnsupportedReason(
        attentionParams(fn, inst, 0), context_.device());
    if (!reason.empty())
      throw Error(MTRT_STATUS_UNIMPLEMENTED,
                  "bundle '" + bundle_.name() + "': " + where(position) +
                      ": the cuda backend cannot run this attention block "
                      "yet: " +
                      reason);
  }
  // A fused group's kernel keys its dropout on one tile of the tensor; at
  // global positions (context parallelism) the rows are two runs of the
  // sequence, which only the unfused dropout draws.
  if (inst.op == Op::Fused)
    for (const Instruction &op : inst.body)
      if (op.op == Op::Dropout && op.attrs.p != 0 && op.attrs.contextSize > 1)
        throw Error(MTRT_STATUS_UNIMPLEMENTED,
                    "bundle '" + bundle_.name() + "': " + where(position) +
                        ": a fused group's dropout at global positions "
                        "(context_size " +
                        std::to_string(op.attrs.contextSize) +
                        ") is not implemented on CUDA yet (issue 24); "
                        "compile the bundle without --fuse-kernels");
  if (isFp8Op(inst.op)) {
    // FP8 tensor cores: compute capability 8.9 (Ada) and later.
    int major = 0, minor = 0;
    MTRT_CUDA_CHECK(cudaDeviceGetAttribute(&major,
                                           cudaDevAttrComputeCapabilityMajor,
                                           context_.device()),
                    where(position));
    MTRT_CUDA_CHECK(cudaDeviceGetAttribute(&minor,
                                           cudaDevAttrComputeCapabilityMinor,
                                           context_.device()),
                    where(position));
    if (major * 10 + minor < 89)
      throw Error(MTRT_STATUS_UNIMPLEMENTED,
                  "bundle '" + bundle_.name() + "': " + where(position) + ": " +
                      opName(inst.op) +
                      ": FP8 GEMMs need FP8 tensor cores (compute "
                      "capability 8.9 or later), and " +
                      context_.description() + " has " + std::to_string(major) +
                      "." + std::to_string(minor) +
                      "; compile without --fp8-format, or run on the host "
                      "backend");
  }
  if (isMoeOp(inst.op))
    checkMoe(position, inst);
  if (inst.op == Op::Attention || inst.op == Op::AttentionGrad) {
    AttentionParams p = attentionParams(fn, inst, 0);
    if (flashAttention(p))
      return;
    std::string reason = attentionUnsupportedReason(p, context_.device());
    if (!reason.empty())
      throw Error(MTRT_STATUS_UNIMPLEMENTED,
                  "bundle '" + bundle_.name() + "': " + where(position) +
                      ": the cuda backend cannot run this attention yet: " +
                      reason);
  }
  bool norm = inst.op == Op::LayerNorm || inst.op == Op::RmsNorm ||
              inst.op == Op::LayerNormGrad || inst.op == Op::RmsNormGrad;
  if (norm && normDims(fn, inst).hidden > kMaxNormHidden)
    throw Error(MTRT_STATUS_UNIMPLEMENTED,
                "bundle '" + bundle_.name() + "': " + where(position) +
                    ": the cuda backend's norm kernels take a hidden size of "
                    "up to " +
                    std::to_string(kMaxNormHidden) + ", found " +
                    std::to_string(normDims(fn, inst).hidden) +
                    "; run this model on the host backend");
  if (inst.op == Op::Transpose &&
      shapeOf(inst.operands[0]).size() > static_cast<size_t>(kMaxTransposeRank))
    throw Error(MTRT_STATUS_UNIMPLEMENTED,
                "bundle '" + bundle_.name() + "': " + where(position) +
                    ": the cuda backend transposes up to rank " +
                    std::to_string(kMaxTransposeRank) + ", found rank " +
                    std::to_string(shapeOf(inst.operands[0]).size()));
}

void Executor::execute(size_t position, const Instruction &inst,
                       const MicroBatchKey &key) {
  if (position == fp8AmaxesZeroedAt_)
    MTRT_CUDA_CHECK(cudaMemsetAsync(fp8Amaxes_.data(), 0, fp8Amaxes_.size(),
                                    context_.stream()),
                    where(position) + ": zeroing the FP8 casts' amaxes");
  if (isRankInstruction(inst)) {
    executeRankInstruction(position, inst, key);
    return;
  }
  if (isContextParallelInstruction(inst)) {
    executeContextParallel(position, inst, key);
    return;
  }
  const Function &fn = *function_;
  const Attributes &a = inst.attrs;
  cudaStream_t stream = context_.stream();
  unsigned *fault = context_.fault();
  unsigned tag = static_cast<unsigned>(position + 1);
  Carver carve(scratch(position));
  // Random ops key their masks on the rank's tile of the global tensor.
  static const std::vector<int64_t> kOneRank;
  const std::vector<int64_t> &coordinates =
      rank_ ? rank_->coordinates() : kOneRank;
  auto in = [&](size_t i) {
    return static_cast<const float *>(slots_[inst.operands[i]]);
  };
  auto out = [&](size_t i) { return static_cast<float *>(slots_[inst.results[i]]); };
  // Operand and result i in their storage type (fp32, or bf16 when held so).
  auto inElements = [&](size_t i) -> InElements {
    const void *data = slots_[inst.operands[i]];
    if (heldInBf16(inst.operands[i]))
      return static_cast<const __nv_bfloat16 *>(data);
    return static_cast<const float *>(data);
  };
  auto outElements = [&](size_t i) -> OutElements {
    void *data = slots_[inst.results[i]];
    if (heldInBf16(inst.results[i]))
      return static_cast<__nv_bfloat16 *>(data);
    return static_cast<float *>(data);
  };
  auto shapeOf = [&](int64_t v) -> const std::vector<int64_t> & {
    return fn.values[v].shape;
  };
  auto operandShape = [&](size_t i) -> const std::vector<int64_t> & {
    return shapeOf(inst.operands[i]);
  };
  auto count = [&](int64_t v) { return fn.values[v].numElements; };
  auto bytesOf = [&](int64_t v) {
    return static_cast<size_t>(count(v)) * dtypeSize(storageType(v));
  };
  // Calls body(ids) with operand `operand`'s ids as int32_t or int64_t.
  auto withIds = [&](size_t operand, auto &&body) {
    const void *data = slots_[inst.operands[operand]];
    if (fn.values[inst.operands[operand]].dtype == DType::I64)
      body(static_cast<const int64_t *>(data));
    else
      body(static_cast<const int32_t *>(data));
  };
  auto gemm = [&](int64_t batch, int64_t m, int64_t n, int64_t k,
                  const float *lhs, bool transLhs, const float *rhs,
                  bool transRhs, float *result, const float *bias,
                  GemmEpilogue epilogue = {}) {
    Bf16Operands bf16 = bf16Operands(position, inst);
    // A bias gradient's scratch: the instruction's kernel block, cuBLASLt's
    // workspace after it (older plans: the Gemm's own).
    epilogue.scratch = scratch(position);
    if (gemmWorkspaceInPlan_)
      epilogue.workspace = static_cast<char *>(scratch(position)) +
                           gemmWorkspaceOffset(fn, inst);
    // A declared bf16 result's bytes are bf16-sized: its bias vector goes
    // to the kernel block (older plans: past C in C's fp32-sized slot).
    if (bundle_.typedPrecision() && gemmBf16VectorColumns(fn, inst) > 0)
      epilogue.bf16Vector = static_cast<char *>(scratch(position)) +
                            gemmBf16VectorOffset(fn, inst);
    // A weight gradient added into its parameter's gradient (beta = 1);
    // algorithms are timed into the result's own slot.
    bool accumulate = gemmAccumulates_[position] >= 0;
    if (accumulate) {
      epilogue.tuningScratch = result;
      result = parameters_.gradient(
          static_cast<size_t>(gemmAccumulates_[position]));
    }
    try {
      // A --tp-comm-overlap chunk takes its whole's algorithm.
      context_.gemm().run(batch, m, n, k, lhs, transLhs, rhs, transRhs, result,
                          bias, accumulate, bf16, epilogue,
                          inst.attrs.wholeRows);
    } catch (const Error &e) {
      throw Error(e.code(), where(position) + ": " + e.what());
    }
  };
  auto copy = [&](void *to, const void *from, size_t bytes) {
    // A reshape in place (the bundle's memory plan) has nothing to copy.
    if (bytes && to != from)
      MTRT_CUDA_CHECK(cudaMemcpyAsync(to, from, bytes,
                                      cudaMemcpyDeviceToDevice, stream),
                      where(position));
  };
  // Split and concat: `outer` rows of `width` bytes each between buffers of
  // pitch `toPitch` and `fromPitch`.
  auto copyRows = [&](void *to, size_t toPitch, const void *from,
                      size_t fromPitch, size_t width, int64_t outer) {
    if (width && outer > 0)
      MTRT_CUDA_CHECK(cudaMemcpy2DAsync(to, toPitch, from, fromPitch, width,
                                        static_cast<size_t>(outer),
                                        cudaMemcpyDeviceToDevice, stream),
                      where(position));
  };

  // Flash attention's q, k, v (operands first..first+2) and their element
  // types: planBf16Values gives q, k, v and dout one type, dq, dk, dv one.
  auto flashTensors = [&](size_t first) {
    auto oneType = [&](const std::vector<int64_t> &values) {
      for (int64_t v : values)
        if (heldInBf16(v) != heldInBf16(values[0]))
          throw Error(MTRT_STATUS_INTERNAL,
                      where(position) +
                          ": flash attention's tensors are held in bf16 and "
                          "fp32: Executor::planBf16Values must join them");
      return heldInBf16(values[0]);
    };
    FlashTensors io;
    io.inputsBf16 = oneType(inst.operands);
    io.outputsBf16 = oneType(inst.results);
    io.deterministic = context_.options().deterministicAttention;
    io.q = slots_[inst.operands[first]];
    io.k = slots_[inst.operands[first + 1]];
    io.v = slots_[inst.operands[first + 2]];
    // In place in a packed tensor (planAttentionViews), or packed.
    io.qLayout = flashLayout(inst.operands[first]);
    io.kLayout = flashLayout(inst.operands[first + 1]);
    io.vLayout = flashLayout(inst.operands[first + 2]);
    return io;
  };

  switch (inst.op) {
  case Op::GetParameter:
    slots_[inst.results[0]] =
        parameters_.value(static_cast<size_t>(a.parameter));
    break;
  case Op::Cast: { // mixed precision's conversions (format version 8)
    int64_t x = inst.operands[0], y = inst.results[0];
    if (!heldInBf16(y)) {
      widenBf16(stream, count(y),
                static_cast<const __nv_bfloat16 *>(slots_[x]),
                static_cast<float *>(slots_[y]));
    } else if (const __nv_bfloat16 *persistent = parameterBf16(x)) {
      // A master weight's bf16 copy is the store's, rounded after each
      // optimizer step: the same bits, without a rounding pass.
      slots_[y] = const_cast<__nv_bfloat16 *>(persistent);
    } else {
      roundToBf16(stream, count(y), static_cast<const float *>(slots_[x]),
                  static_cast<__nv_bfloat16 *>(slots_[y]));
    }
    break;
  }
  case Op::AccumulateGradient: {
    if (accumulatedByGemm_[position]) // its GEMM added the product in
      break;
    if (parameters_.gradientsInArena()) // the gradient is its operand's slot
      break;
    auto p = static_cast<size_t>(a.parameter);
    accumulateInto(stream, parameters_.count(p), in(0),
                   parameters_.gradient(p));
    break;
  }
  case Op::Fill:
    fill(stream, count(inst.results[0]), outElements(0),
         static_cast<float>(a.lossSeed ? a.value * lossScale_ : a.value));
    break;
  case Op::PositionIds: {
    // Under sequence parallelism the ids are the rank's sequence tile: its
    // positions start at the tile's offset in the global sequence.
    int64_t v = inst.results[0];
    int64_t seq = shapeOf(v).back(), first = 0;
    if (!a.splitAxes.empty() && rank_)
      first = seq * gridGroupIndex(bundle_.gridShape(), rank_->coordinates(),
                                   a.splitAxes.back());
    if (fn.values[v].dtype == DType::I64)
      positionIds(stream, count(v), seq, static_cast<int64_t *>(slots_[v]),
                  first);
    else
      positionIds(stream, count(v), seq, static_cast<int32_t *>(slots_[v]),
                  first);
    break;
  }
  case Op::Embedding: {
    EmbeddingDims d = embeddingDims(fn, inst);
    withIds(1, [&](auto *ids) {
      embeddingForward(stream, d.count, d.vocab, d.hidden, in(0), ids,
                       outElements(0), fault, tag);
    });
    break;
  }
  case Op::EmbeddingGrad: {
    EmbeddingDims d = embeddingDims(fn, inst);
    withIds(1, [&](auto *ids) {
      embeddingBackward(stream, d.count, d.vocab, d.hidden, ids,
                        inElements(0), out(0), carve.take<char>(0), fault,
                        tag);
    });
    break;
  }
  case Op::LayerNorm:
  case Op::RmsNorm: {
    if (fp8CastFused(position)) {
      executeFusedFp8Cast(position, inst);
      break;
    }
    auto [rows, hidden] = normDims(fn, inst);
    NormRows x{slots_[inst.operands[0]], heldInBf16(inst.operands[0])};
    NormRowsOut y{slots_[inst.results[0]], heldInBf16(inst.results[0])};
    if (inst.op == Op::LayerNorm)
      layerNormForward(stream, rows, hidden, x, in(1),
                       inst.operands.size() == 3 ? in(2) : nullptr, a.epsilon,
                       y);
    else
      rmsNormForward(stream, rows, hidden, x, in(1), a.epsilon, y);
    break;
  }
  case Op::LayerNormGrad:
  case Op::RmsNormGrad: {
    // Operands dy, x, weight; the statistics are recomputed from x.
    auto [rows, hidden] = normDims(fn, inst);
    NormRows dy{slots_[inst.operands[0]], heldInBf16(inst.operands[0])};
    NormRows x{slots_[inst.operands[1]], heldInBf16(inst.operands[1])};
    NormRowsOut dx{slots_[inst.results[0]], heldInBf16(inst.results[0])};
    void *partials = carve.take<char>(0);
    if (inst.op == Op::LayerNormGrad)
      layerNormBackward(stream, rows, hidden, x, in(2), dy, a.epsilon, dx,
                        out(1), inst.results.size() == 3 ? out(2) : nullptr,
                        partials);
    else
      rmsNormBackward(stream, rows, hidden, x, in(2), dy, a.epsilon, dx,
                      out(1), partials);
    break;
  }
  case Op::Linear: {
    auto [rows, inSize, outSize] = linearDims(fn, inst);
    gemm(1, rows, outSize, inSize, in(0), false, in(1), a.transposeWeight,
         out(0), inst.operands.size() == 3 ? in(2) : nullptr);
    break;
  }
  case Op::LinearAdd: { // x W (+ b) + addend: the addend is cuBLASLt's C
    if (heldInBf16(inst.operands[2]) != heldInBf16(inst.results[0]))
      throw Error(MTRT_STATUS_INTERNAL,
                  where(position) +
                      ": linear_add's addend and result are held in "
                      "different types: Executor::planBf16Values must join "
                      "them");
    auto [rows, inSize, outSize] = linearDims(fn, inst);
    GemmEpilogue epilogue;
    epilogue.addend = slots_[inst.operands[2]];
    gemm(1, rows, outSize, inSize, in(0), false, in(1), a.transposeWeight,
         out(0), inst.operands.size() == 4 ? in(3) : nullptr, epilogue);
    break;
  }
  case Op::LinearGelu: { // results: gelu(x W + b), and x W + b
    auto [rows, inSize, outSize] = linearDims(fn, inst);
    GemmEpilogue epilogue;
    epilogue.kind = GemmEpilogue::Kind::GeluAux;
    epilogue.approximation = toKernel(a.approximate);
    epilogue.aux = out(1);
    gemm(1, rows, outSize, inSize, in(0), false, in(1), a.transposeWeight,
         out(0), inst.operands.size() == 3 ? in(2) : nullptr, epilogue);
    break;
  }
  case Op::LinearGeluGrad: { // operands dy, W, the pre-activation
    // The GEMM into the result, then the GeLU gradient in place, summing
    // the bias gradient's columns as it writes them: cuBLASLt's DGELU and
    // DGELU_BGRAD epilogues run the GEMM at a third of its speed, and
    // BGRAD in the next weight gradient costs 20-35% of that GEMM
    // (bench/NOTES.md, 2026-11-29 and session 24).
    auto [rows, inSize, outSize] = linearDims(fn, inst);
    gemm(1, rows, outSize, inSize, in(0), false, in(1), a.transposeWeight,
         out(0), nullptr);
    OutElements dx = outElements(0);
    InElements dy(dx.data, dx.bf16); // the GEMM's result, read in place
    if (inst.results.size() == 2)
      geluBackwardBiasGrad(stream, rows, outSize, inElements(2), dy, dx,
                           toKernel(a.approximate), out(1), scratch(position));
    else
      geluBackward(stream, rows * outSize, inElements(2), dy, dx,
                   toKernel(a.approximate));
    break;
  }
  case Op::LinearWeightGrad:
  case Op::LinearWeightBiasGrad: {
    auto [rows, inSize, outSize] = linearDims(fn, inst);
    // The bias gradient sums dy's rows (operand 1) by the column-sum kernel
    // after the plain GEMM, its sums in the kernel block's first bytes.
    // (cuBLASLt's BGRAD epilogue made the GEMM slower than the plain GEMM
    // and the sums together: on the H200, 0.545 against 0.460 + 0.060 ms at
    // gpt-1.3b's qkv, 0.305 against 0.230 + 0.062 at gpt2-350m's;
    // bench/NOTES.md, session 34.)
    if (!a.transposeWeight) // dW [in, out] = x^T @ dy
      gemm(1, inSize, outSize, rows, in(0), true, in(1), false, out(0),
           nullptr);
    else // dW [out, in] = dy^T @ x
      gemm(1, outSize, inSize, rows, in(1), true, in(0), false, out(0),
           nullptr);
    if (inst.op == Op::LinearWeightBiasGrad)
      biasGrad(stream, rows, outSize,
               NormRows{slots_[inst.operands[1]], heldInBf16(inst.operands[1])},
               out(1), scratch(position));
    break;
  }
  case Op::BiasGrad: {
    LinearDims d = linearDims(fn, inst);
    NormRows dy{slots_[inst.operands[0]], heldInBf16(inst.operands[0])};
    biasGrad(stream, d.rows, d.outSize, dy, out(0), carve.take<char>(0));
    break;
  }
  case Op::Matmul: {
    auto [batch, m, n, k] = matmulDims(fn, inst);
    gemm(batch, m, n, k, in(0), a.transposeLhs, in(1), a.transposeRhs, out(0),
         nullptr);
    break;
  }
  case Op::Attention: {
    AttentionParams p = attentionParams(fn, inst, key.firstSample);
    setAttentionTile(p, fn, inst, bundle_.gridShape(), coordinates);
    float *lse = carve.take<float>(sizeof(float) * p.batch * p.headsQ * p.seqQ);
    if (!flashAttention(p)) {
      attentionForward(stream, p, in(0), in(1), in(2), out(0), lse);
      break;
    }
    // The copy for the gradient, unless it reads the output itself.
    __nv_bfloat16 *kept = nullptr;
    if (kernelBlocks_.attentionPartner[position] != kNoPartner &&
        !kernelBlocks_.outputHeld[position])
      kept = carve.take<__nv_bfloat16>(flashAttentionSavedOutputBytes(p));
    uint64_t *mask = carve.take<uint64_t>(flashAttentionMaskBytes(p));
    FlashTensors io = flashTensors(0);
    io.out = slots_[inst.results[0]];
    io.outLayout = flashLayout(inst.results[0]);
    if (cudnnAttention_[position])
      context_.cudnnAttention()->forward(
          stream, p, io, kept, lse,
          carve.take<char>(scratch::kCudnnAttentionForwardWorkspaceBytes),
          scratch::kCudnnAttentionForwardWorkspaceBytes);
    else
      flashForward(stream, p, io, kept, lse, mask);
    break;
  }
  case Op::AttentionGrad: {
    // Operands dy, q, k, v; the forward is rerun for its logsumexp only.
    AttentionParams p = attentionParams(fn, inst, key.firstSample);
    setAttentionTile(p, fn, inst, bundle_.gridShape(), coordinates);
    if (flashAttention(p)) {
      // The paired forward's kept scratch, else the forward rerun here.
      size_t forward = kernelBlocks_.attentionPartner[position];
      Carver saved(forward != kNoPartner ? scratch(forward)
                                         : scratch(position));
      size_t rows = static_cast<size_t>(p.batch * p.headsQ * p.seqQ);
      float *lse = saved.take<float>(sizeof(float) * rows);
      auto *o =
          forward != kNoPartner && kernelBlocks_.outputHeld[forward]
              ? static_cast<__nv_bfloat16 *>(
                    slots_[fn.instructions[forward].results[0]])
              : saved.take<__nv_bfloat16>(flashAttentionSavedOutputBytes(p));
      uint64_t *mask = saved.take<uint64_t>(flashAttentionMaskBytes(p));
      void *delta = forward != kNoPartner ? carve.take<char>(0)
                                          : saved.take<char>(0);
      FlashTensors io = flashTensors(1);
      CudnnAttention *cudnn =
          cudnnAttention_[position] ? context_.cudnnAttention() : nullptr;
      // The backward's scratch, free until the backward: cuDNN's forward
      // workspace when it reruns the forward.
      size_t backwardScratch =
          scratch::roundUp(scratch::flashAttentionBackwardScratchBytes(
              scratch::attentionShapeOf(p)));
      if (forward == kNoPartner && cudnn)
        cudnn->forward(stream, p, io, o, lse, delta, backwardScratch);
      else if (forward == kNoPartner)
        flashForward(stream, p, io, o, lse, mask);
      io.dout = slots_[inst.operands[0]];
      io.dq = slots_[inst.results[0]];
      io.dk = slots_[inst.results[1]];
      io.dv = slots_[inst.results[2]];
      io.doutLayout = flashLayout(inst.operands[0]);
      io.dqLayout = flashLayout(inst.results[0]);
      io.dkLayout = flashLayout(inst.results[1]);
      io.dvLayout = flashLayout(inst.results[2]);
      if (cudnn)
        cudnn->backward(stream, p, io, o, lse, delta, backwardScratch);
      else
        flashBackward(stream, p, io, o, lse,
                      flashAttentionMaskBytes(p) ? mask : nullptr, delta);
      break;
    }
    float *lse = carve.take<float>(sizeof(float) * p.batch * p.headsQ * p.seqQ);
    void *delta = carve.take<char>(0);
    attentionForward(stream, p, in(1), in(2), in(3), nullptr, lse);
    attentionBackward(stream, p, in(1), in(2), in(3), lse, in(0), out(0),
                      out(1), out(2), delta);
    break;
  }
  case Op::Rope: {
    RopeDims d = ropeDims(fn, inst);
    rope(stream, d.batch, d.seq, d.heads, d.headDim, d.rotary,
         ropeFrequencies(a), a.inverse, inElements(0), outElements(0), carve.take<char>(0));
    break;
  }
  case Op::Gelu:
    geluForward(stream, count(inst.operands[0]), inElements(0),
                outElements(0), toKernel(a.approximate));
    break;
  case Op::GeluGrad:
    geluBackward(stream, count(inst.operands[1]), inElements(1),
                 inElements(0), outElements(0), toKernel(a.approximate));
    break;
  case Op::Silu:
    siluForward(stream, count(inst.operands[0]), inElements(0),
                outElements(0));
    break;
  case Op::SiluGrad:
    siluBackward(stream, count(inst.operands[1]), inElements(1),
                 inElements(0), outElements(0));
    break;
  case Op::Swiglu:
    if (fp8CastFused(position)) {
      executeFusedFp8Cast(position, inst);
      break;
    }
    swigluForward(stream, count(inst.operands[0]), inElements(0),
                  inElements(1), outElements(0));
    break;
  case Op::SwigluGrad:
    if (fp8CastFused(position)) {
      executeFusedFp8Cast(position, inst);
      break;
    }
    swigluBackward(stream, count(inst.operands[1]), inElements(1),
                   inElements(2), inElements(0), outElements(0),
                   outElements(1));
    break;
  case Op::Dropout:
    dropout(stream, count(inst.operands[0]), inElements(0), outElements(0), a.p,
            static_cast<uint64_t>(a.seed),
            dropoutMaskTile(fn, inst, bundle_.gridShape(), coordinates,
                            key.firstSample));
    break;
  case Op::Add:
    add(stream, count(inst.operands[0]), inElements(0), inElements(1),
        outElements(0));
    break;
  case Op::Fused: { // the group's generated kernel
    std::vector<InElements> operands;
    std::vector<OutElements> results;
    for (size_t i = 0; i < inst.operands.size(); ++i)
      operands.push_back(inElements(i));
    // The stored results, and the column sums (f32 vectors) apart.
    std::vector<FusedColumnSum> columnSums = fusedColumnSums(inst);
    std::vector<size_t> storedIndex(inst.results.size());
    for (size_t i = 0; i < inst.results.size(); ++i)
      if (std::none_of(
              columnSums.begin(), columnSums.end(),
              [&](const FusedColumnSum &s) { return s.result == i; })) {
        storedIndex[i] = results.size();
        results.push_back(outElements(i));
      }
    std::vector<FusedKernelLibrary::ColumnSum> sums;
    for (const FusedColumnSum &s : columnSums)
      sums.push_back({storedIndex[s.summed], out(s.result)});
    const std::vector<int64_t> &shape = shapeOf(inst.operands[0]);
    fusedKernels_->launch(stream, inst, count(inst.operands[0]), operands,
                          results,
                          fusedMaskTile(fn, inst, bundle_.gridShape(),
                                        coordinates, key.firstSample),
                          where(position), shape.empty() ? 1 : shape.back(),
                          sums, sums.empty() ? nullptr : scratch(position));
    break;
  }
  case Op::Mul:
    mul(stream, count(inst.operands[0]), inElements(0), inElements(1),
        outElements(0));
    break;
  case Op::Softmax:
  case Op::SoftmaxGrad: {
    auto [outer, axis, inner] = softmaxDims(fn, inst);
    if (inst.op == Op::SoftmaxGrad)
      softmaxBackward(stream, outer, axis, inner, inElements(1),
                      inElements(0), outElements(0));
    else
      softmaxForward(stream, outer, axis, inner, inElements(0),
                     outElements(0));
    break;
  }
  case Op::CrossEntropy:
  case Op::CrossEntropyGrad: {
    bool grad = inst.op == Op::CrossEntropyGrad;
    CrossEntropyDims d = crossEntropyDims(fn, inst);
    void *work = carve.take<char>(crossEntropyScratchBytes(d.rows));
    // The rows' logsumexps: after the forward's own scratch, kept for the
    // paired gradient.
    double *saved = nullptr;
    size_t partner = kernelBlocks_.lossPartner[position];
    if (!grad && partner != kNoPartner)
      saved = carve.take<double>(crossEntropySavedBytes(d.rows));
    if (grad && partner != kNoPartner) {
      Carver forward(scratch(partner));
      forward.take<char>(crossEntropyScratchBytes(d.rows));
      saved = forward.take<double>(crossEntropySavedBytes(d.rows));
    }
    // The logits and their gradient each in float or bf16 (the plan's).
    auto withType = [&](int64_t v, auto &&body) {
      if (heldInBf16(v))
        body(static_cast<__nv_bfloat16 *>(slots_[v]));
      else
        body(static_cast<float *>(slots_[v]));
    };
    withIds(d.labelsAt, [&](auto *labels) {
      withType(inst.operands[d.logitsAt], [&](auto *logits) {
        if (!grad) {
          crossEntropyForward(stream, d.rows, d.vocab, logits, labels,
                              a.ignoreIndex, toKernel(a.reduction), out(0),
                              work, saved, fault, tag);
          return;
        }
        withType(inst.results[0], [&](auto *dlogits) {
          crossEntropyBackward(stream, d.rows, d.vocab, logits, labels,
                               a.ignoreIndex, toKernel(a.reduction), in(0),
                               dlogits, work, saved, fault, tag);
        });
      });
    });
    break;
  }
  case Op::Reshape:
    // The result shares the operand's memory (aliasOf_), or the plan gives
    // both one block (in place, or one view group): the bytes are there.
    if (aliasOf_[inst.results[0]] == inst.operands[0])
      slots_[inst.results[0]] = slots_[inst.operands[0]];
    else if (slots_[inst.results[0]] != slots_[inst.operands[0]])
      copy(slots_[inst.results[0]], slots_[inst.operands[0]],
           bytesOf(inst.operands[0]));
    break;
  case Op::Transpose: {
    const auto &x = operandShape(0);
    transpose(stream, static_cast<int>(x.size()), x.data(),
              a.permutation.data(), inElements(0), outElements(0));
    break;
  }
  case Op::Split:
  case Op::Concat: {
    if (elided_[position]) // flash attention reads or writes the pieces in
      break;               // place (planAttentionViews, memory_plan.views)
    bool split = inst.op == Op::Split;
    auto [whole, axis, outer, innerElements] = splitDims(fn, inst);
    size_t inner =
        static_cast<size_t>(innerElements) * dtypeSize(storageType(whole));
    size_t wholePitch = static_cast<size_t>(shapeOf(whole)[axis]) * inner;
    const auto &pieces = split ? inst.results : inst.operands;
    size_t offset = 0;
    for (int64_t piece : pieces) {
      size_t width = static_cast<size_t>(shapeOf(piece)[axis]) * inner;
      auto *wholeData = static_cast<char *>(slots_[whole]) + offset;
      if (split)
        copyRows(slots_[piece], width, wholeData, wholePitch, width, outer);
      else
        copyRows(wholeData, wholePitch, slots_[piece], width, width, outer);
      offset += width;
    }
    break;
  }
  case Op::LinearCrossEntropy:
    linearCrossEntropy(position, inst);
    break;
  case Op::LinearVocabMax:
  case Op::LinearVocabPartials:
  case Op::LinearVocabCrossEntropyGrad:
    linearVocab(position, inst);
    break;
  case Op::Fp8Scale:
  case Op::Fp8CurrentScale:
  case Op::Fp8Quantize:
  case Op::Fp8Linear:
  case Op::Fp8LinearWeightGrad:
  case Op::Fp8Update:
    executeFp8(position, inst);
    break;
  case Op::Scale: // a gradient of the fused loss times the seed (a scalar)
    scale(stream, count(inst.operands[0]), inElements(0), in(1),
          outElements(0));
    break;
  case Op::MoeRoute: // MoeOps.cpp
  case Op::MoeAuxLoss:
  case Op::MoeZLoss:
  case Op::MoePermute:
  case Op::MoeUnpermute:
  case Op::MoeGroupedLinear:
  case Op::MoeRouteGrad:
  case Op::MoeAuxLossGrad:
  case Op::MoeZLossGrad:
  case Op::MoeProbsGrad:
  case Op::MoeGroupedLinearWeightGrad:
  case Op::MoeTokensPerExpert:
  case Op::MoeDispatchRows:
  case Op::MoeDispatchExperts:
  case Op::MoeCombineRows:
    executeMoe(position, inst);
    break;
  case Op::AttentionBlock: // run by executeContextParallel
  case Op::AttentionMerge:
  case Op::AttentionDelta:
  case Op::AttentionBlockGrad:
#define MTRT_RANK_CASE(name) case Op::name:
    MTRT_CUDA_RANK_OPS(MTRT_RANK_CASE)
#undef MTRT_RANK_CASE
    // Run by executeRankInstruction (RankOps.cpp) or executeContextParallel
    // (ContextParallelOps.cpp).
    throw Error(MTRT_STATUS_INTERNAL, where(position) + ": " +
                                          opName(inst.op) +
                                          " reached the device dispatch");
  }
  cudaError_t launch = cudaGetLastError();
  if (launch != cudaSuccess)
    throwCudaError(launch, "launching the instruction's kernels",
                   where(position));
}

void Executor::chunkGemm(size_t position, bool bf16,
                         const GemmEpilogue &epilogue, int64_t m, int64_t n,
                         int64_t k, const void *lhs, bool transLhs,
                         const void *rhs, bool transRhs, void *result,
                         bool bf16Result, bool accumulate) {
  Bf16Operands operands;
  if (bf16) {
    operands.a = static_cast<const __nv_bfloat16 *>(lhs);
    operands.b = static_cast<const __nv_bfloat16 *>(rhs);
    operands.result = bf16Result;
  }
  try {
    context_.gemm().run(1, m, n, k, static_cast<const float *>(lhs), transLhs,
                        static_cast<const float *>(rhs), transRhs,
                        static_cast<float *>(result), nullptr, accumulate,
                        operands, epilogue);
  } catch (const Error &e) {
    throw Error(e.code(), where(position) + ": " + e.what());
  }
}

void Executor::chunkGradients(size_t position, bool bf16,
                              const GemmEpilogue &epilogue, int64_t n,
                              int64_t inSize, int64_t vocab,
                              const void *dlogits, const void *weight,
                              bool transposeWeight, const void *x, void *dx,
                              bool dxBf16, float *dweight, bool accumulate) {
  // dx_c [n, in] = dlogits @ op(W)^T, in dx's type.
  chunkGemm(position, bf16, epilogue, n, inSize, vocab, dlogits, false, weight,
            !transposeWeight, dx, dxBf16, false);
  // dweight (+)= x_c^T @ dlogits ([in, vocab]), or dlogits^T @ x_c
  // ([vocab, in]) for a transposed (tied) weight; fp32.
  if (transposeWeight)
    chunkGemm(position, bf16, epilogue, vocab, inSize, n, dlogits, true, x,
              false, dweight, false, accumulate);
  else
    chunkGemm(position, bf16, epilogue, inSize, vocab, n, x, true, dlogits,
              false, dweight, false, accumulate);
}

void Executor::linearCrossEntropy(size_t position, const Instruction &inst) {
  // input [rows..., in], weight, labels [rows...] -> loss, dx, dweight, one
  // chunk of tokens at a time (docs/Memory.md, "The loss without
  // whole-vocabulary logits"): the chunk's logits in the kernel block, the
  // row kernel's gradient in their place, then the chunk's rows of dx and
  // its share of dweight. Typed bf16 (docs/MixedPrecision.md), as the
  // unfused output layer: x and W bf16, the GEMMs on the tensor cores with
  // fp32 accumulation, the chunk's logits and their gradient bf16 (the
  // input's type), dx bf16 as declared; the statistics, the loss and
  // dweight (accumulated over the chunks) fp32.
  const Function &fn = *function_;
  const Attributes &a = inst.attrs;
  cudaStream_t stream = context_.stream();
  bool bf16 = heldInBf16(inst.operands[0]);
  auto refuse = [&](const std::string &what) {
    throw Error(MTRT_STATUS_UNIMPLEMENTED,
                where(position) + ": linear_cross_entropy " + what +
                    "; recompile the bundle with this megatron-compile");
  };
  if (heldInBf16(inst.operands[1]) != bf16)
    refuse(std::string("reads its input and weight in one type, but the "
                       "input is ") +
           (bf16 ? "bf16" : "fp32") + " and the weight " +
           (bf16 ? "fp32" : "bf16"));
  if (heldInBf16(inst.results[1]) && !bf16)
    refuse("writes a bf16 input gradient from bf16 operands only, but its "
           "input and weight are fp32");
  if (heldInBf16(inst.results[0]) || heldInBf16(inst.results[2]))
    refuse("writes its loss and weight gradient in fp32, but one is bf16");
  const std::vector<int64_t> &w = fn.values[inst.operands[1]].shape;
  int64_t inSize = fn.values[inst.operands[0]].shape.back();
  int64_t vocab = a.transposeWeight ? w[0] : w[1];
  int64_t rows = fn.values[inst.operands[2]].numElements;
  // The block holds the attribute's chunk (scratch::linearCrossEntropyOpBytes).
  int64_t chunkRows = a.chunkRows;
  if (chunkRows < 1)
    throw Error(MTRT_STATUS_INVALID_ARGUMENT,
                where(position) + ": linear_cross_entropy's chunk_rows is " +
                    std::to_string(chunkRows) + "; it must be at least 1");
  size_t element = bf16 ? sizeof(__nv_bfloat16) : sizeof(float);
  size_t dxElement = heldInBf16(inst.results[1]) ? sizeof(__nv_bfloat16)
                                                 : sizeof(float);
  Carver carve(scratch(position));
  auto *logits =
      carve.take<char>(element * static_cast<size_t>(chunkRows * vocab));
  auto *rowLoss =
      carve.take<double>(scratch::linearCrossEntropyStatisticsBytes(chunkRows));
  double *state = rowLoss + chunkRows;
  GemmEpilogue epilogue;
  epilogue.workspace = carve.take<char>(scratch::kGemmWorkspaceBytes);
  auto x = static_cast<const char *>(slots_[inst.operands[0]]);
  auto *weight = slots_[inst.operands[1]];
  auto loss = static_cast<float *>(slots_[inst.results[0]]);
  auto dx = static_cast<char *>(slots_[inst.results[1]]);
  auto dweight = static_cast<float *>(slots_[inst.results[2]]);
  // C = op(A) op(B): fp32, or bf16 operands with fp32 accumulation and a C
  // in bf16 (`bf16Result`) or fp32.
  auto gemm = [&](int64_t m, int64_t n, int64_t k, const void *lhs,
                  bool transLhs, const void *rhs, bool transRhs, void *result,
                  bool bf16Result, bool accumulate) {
    chunkGemm(position, bf16, epilogue, m, n, k, lhs, transLhs, rhs, transRhs,
              result, bf16Result, accumulate);
  };
  auto launched = [&](const char *what) {
    MTRT_CUDA_CHECK(cudaGetLastError(),
                    where(position) + ": launching " + what);
  };
  auto run = [&](const auto *labels) {
    linearCrossEntropyStart(stream, rows, labels, a.ignoreIndex,
                            toKernel(a.reduction), state);
    launched("linear_cross_entropy's label count");
    if (rows == 0) // nothing to accumulate into: dweight is zero
      MTRT_CUDA_CHECK(cudaMemsetAsync(dweight, 0,
                                      sizeof(float) * static_cast<size_t>(
                                                          inSize * vocab),
                                      stream),
                      where(position));
    for (int64_t first = 0; first < rows; first += chunkRows) {
      int64_t n = std::min(chunkRows, rows - first);
      const char *xc = x + static_cast<size_t>(first * inSize) * element;
      // logits [n, vocab] = x_c @ op(W), in the input's type.
      gemm(n, vocab, inSize, xc, false, weight, a.transposeWeight, logits,
           bf16, false);
      if (bf16)
        linearCrossEntropyChunk(
            stream, n, vocab, reinterpret_cast<__nv_bfloat16 *>(logits),
            labels + first, a.ignoreIndex, rowLoss, state, context_.fault(),
            static_cast<unsigned>(position + 1));
      else
        linearCrossEntropyChunk(stream, n, vocab,
                                reinterpret_cast<float *>(logits),
                                labels + first, a.ignoreIndex, rowLoss, state,
                                context_.fault(),
                                static_cast<unsigned>(position + 1));
      launched("linear_cross_entropy's row kernel");
      chunkGradients(position, bf16, epilogue, n, inSize, vocab, logits,
                     weight, a.transposeWeight, xc,
                     dx + static_cast<size_t>(first * inSize) * dxElement,
                     dxElement == sizeof(__nv_bfloat16), dweight, first > 0);
    }
    linearCrossEntropyFinish(stream, state, toKernel(a.reduction), loss);
    launched("linear_cross_entropy's loss");
  };
  if (fn.values[inst.operands[2]].dtype == DType::I64)
    run(static_cast<const int64_t *>(slots_[inst.operands[2]]));
  else
    run(static_cast<const int32_t *>(slots_[inst.operands[2]]));
}

void Executor::linearVocab(size_t position, const Instruction &inst) {
  // The vocabulary-parallel output layer, one chunk of tokens at a time
  // (docs/Memory.md, "The loss without whole-vocabulary logits"): the
  // chunk's logits of the rank's block in the kernel block (the input's
  // type), then VocabParallel.cu's row kernels on them; for the gradient,
  // the logits' gradient in their place and the chunk's two GEMMs, as
  // linearCrossEntropy's. Typed bf16 as the unfused layer: x, W, the
  // chunk's logits and their gradient and dx bf16; the statistics and
  // dweight fp32.
  const Function &fn = *function_;
  const Attributes &a = inst.attrs;
  cudaStream_t stream = context_.stream();
  const char *name = opName(inst.op);
  bool bf16 = heldInBf16(inst.operands[0]);
  bool grad = inst.op == Op::LinearVocabCrossEntropyGrad;
  auto refuse = [&](const std::string &what) {
    throw Error(MTRT_STATUS_UNIMPLEMENTED,
                where(position) + ": " + name + " " + what +
                    "; recompile the bundle with this megatron-compile");
  };
  if (heldInBf16(inst.operands[1]) != bf16)
    refuse(std::string("reads its input and weight in one type, but the "
                       "input is ") +
           (bf16 ? "bf16" : "fp32") + " and the weight " +
           (bf16 ? "fp32" : "bf16"));
  if (grad && heldInBf16(inst.results[0]) && !bf16)
    refuse("writes a bf16 input gradient from bf16 operands only, but its "
           "input and weight are fp32");
  if (grad && heldInBf16(inst.results[1]))
    refuse("writes its weight gradient in fp32, but it is bf16");
  const std::vector<int64_t> &w = fn.values[inst.operands[1]].shape;
  int64_t inSize = fn.values[inst.operands[0]].shape.back();
  int64_t vocab = a.transposeWeight ? w[0] : w[1];
  int64_t rows =
      fn.values[inst.operands[0]].numElements / std::max<int64_t>(inSize, 1);
  // The block holds the attribute's chunk (scratch::linearCrossEntropyOpBytes).
  int64_t chunkRows = a.chunkRows;
  if (chunkRows < 1)
    throw Error(MTRT_STATUS_INVALID_ARGUMENT,
                where(position) + ": " + name + "'s chunk_rows is " +
                    std::to_string(chunkRows) + "; it must be at least 1");
  int64_t start = vocabBlock(position, inst).first * vocab;
  size_t element = bf16 ? sizeof(__nv_bfloat16) : sizeof(float);
  Carver carve(scratch(position));
  auto *logits =
      carve.take<char>(element * static_cast<size_t>(chunkRows * vocab));
  auto *factor =
      carve.take<double>(scratch::linearCrossEntropyStatisticsBytes(chunkRows));
  GemmEpilogue epilogue;
  epilogue.workspace = carve.take<char>(scratch::kGemmWorkspaceBytes);
  auto x = static_cast<const char *>(slots_[inst.operands[0]]);
  auto *weight = slots_[inst.operands[1]];
  auto gemm = [&](int64_t m, int64_t n, int64_t k, const void *lhs,
                  bool transLhs, const void *rhs, bool transRhs, void *result,
                  bool bf16Result, bool accumulate) {
    chunkGemm(position, bf16, epilogue, m, n, k, lhs, transLhs, rhs, transRhs,
              result, bf16Result, accumulate);
  };
  auto launched = [&](const char *what) {
    MTRT_CUDA_CHECK(cudaGetLastError(),
                    where(position) + ": launching " + name + "'s " + what);
  };
  InElements chunkIn =
      bf16 ? InElements(reinterpret_cast<__nv_bfloat16 *>(logits))
           : InElements(reinterpret_cast<float *>(logits));
  OutElements chunkOut =
      bf16 ? OutElements(reinterpret_cast<__nv_bfloat16 *>(logits))
           : OutElements(reinterpret_cast<float *>(logits));
  // logits [n, vocab] = x_c @ op(W), in the input's type.
  auto chunkLogits = [&](int64_t first, int64_t n) {
    gemm(n, vocab, inSize, x + static_cast<size_t>(first * inSize) * element,
         false, weight, a.transposeWeight, logits, bf16, false);
  };
  if (inst.op == Op::LinearVocabMax) {
    auto *max = static_cast<float *>(slots_[inst.results[0]]);
    for (int64_t first = 0; first < rows; first += chunkRows) {
      int64_t n = std::min(chunkRows, rows - first);
      chunkLogits(first, n);
      vocabMax(stream, n, vocab, chunkIn, max + first);
      launched("row kernel");
    }
    return;
  }
  auto run = [&](const auto *labels) {
    if (!grad) {
      auto *max = static_cast<const float *>(slots_[inst.operands[3]]);
      auto *partials = static_cast<float *>(slots_[inst.results[0]]);
      for (int64_t first = 0; first < rows; first += chunkRows) {
        int64_t n = std::min(chunkRows, rows - first);
        chunkLogits(first, n);
        vocabPartials(stream, n, vocab, start, chunkIn, labels + first,
                      max + first, partials + 2 * first);
        launched("row kernel");
      }
      return;
    }
    auto *max = static_cast<const float *>(slots_[inst.operands[3]]);
    auto *partials = static_cast<const float *>(slots_[inst.operands[4]]);
    auto *dloss = static_cast<const float *>(slots_[inst.operands[5]]);
    size_t dxElement =
        heldInBf16(inst.results[0]) ? sizeof(__nv_bfloat16) : sizeof(float);
    auto dx = static_cast<char *>(slots_[inst.results[0]]);
    auto dweight = static_cast<float *>(slots_[inst.results[1]]);
    vocabCrossEntropyGradFactor(stream, rows, labels, a.ignoreIndex,
                                toKernel(a.reduction), dloss, factor);
    launched("loss gradient's factor");
    if (rows == 0) // nothing to accumulate into: dweight is zero
      MTRT_CUDA_CHECK(
          cudaMemsetAsync(dweight, 0,
                          sizeof(float) * static_cast<size_t>(inSize * vocab),
                          stream),
          where(position));
    for (int64_t first = 0; first < rows; first += chunkRows) {
      int64_t n = std::min(chunkRows, rows - first);
      const char *xc = x + static_cast<size_t>(first * inSize) * element;
      chunkLogits(first, n);
      // The logits' gradient in their place (the input's type).
      vocabCrossEntropyGradRows(stream, n, vocab, start, chunkIn,
                                labels + first, a.ignoreIndex,
                                toKernel(a.reduction), dloss, max + first,
                                partials + 2 * first, factor, chunkOut);
      launched("row kernel");
      chunkGradients(position, bf16, epilogue, n, inSize, vocab, logits,
                     weight, a.transposeWeight, xc,
                     dx + static_cast<size_t>(first * inSize) * dxElement,
                     dxElement == sizeof(__nv_bfloat16), dweight, first > 0);
    }
  };
  if (fn.values[inst.operands[2]].dtype == DType::I64)
    run(static_cast<const int64_t *>(slots_[inst.operands[2]]));
  else
    run(static_cast<const int32_t *>(slots_[inst.operands[2]]));
}

} // namespace mtrt::cuda
