// The CUDA executor's multi-rank instructions, on the device: the
// collectives through DeviceCollective over the rank's communicators (NCCL
// takes the arena's buffers in place; the in-process communicator of the
// one-GPU checks is staged through the host), context parallelism's shift
// (a send to the next rank and a receive from the previous at once),
// all_slice and the gathers' and scatters' interleaving as strided copies, bias_add, and Megatron-LM's
// vocabulary-parallel embedding and cross-entropy as kernels
// (kernels/Embedding.cu, kernels/VocabParallel.cu).
//
// Under bf16, the bf16-values plan (Bf16Values.cpp) holds in bf16 what
// Megatron-LM does: the tensor-parallel sums, gathers and scatters of
// activations and their gradients (NCCL's bf16 reduction; the staged path
// sums in fp32 and rounds once), bias_add's input and result, the
// vocabulary block's logits and their gradient, the vocabulary-parallel
// embedding's rows. The loss's max and sums, the biases, the parameters and
// their gradients stay fp32. With fp32 bundles every value is fp32, and the
// tensor-parallel sums are fp32 sums of the ranks' partial products, as the
// host's.
#include "cuda/Executor.h"

#include "comm/RankContext.h"
#include "core/ExecutorChecks.h"
#include "core/OpShapes.h"
#include "cuda/CudaCheck.h"
#include "cuda/DeviceCollective.h"
#include "cuda/PeerCollective.h"
#include "cuda/kernels/Kernels.h"
#include "host/RankCollective.h"

#include <algorithm>

namespace mtrt::cuda {

bool Executor::isRankInstruction(const Instruction &inst) {
  switch (inst.op) {
#define MTRT_RANK_CASE(name) case Op::name:
    MTRT_CUDA_RANK_OPS(MTRT_RANK_CASE)
#undef MTRT_RANK_CASE
    return true;
  case Op::Embedding:
  case Op::EmbeddingGrad:
    return !inst.attrs.vocabShardAxes.empty();
  default:
    return false;
  }
}

bool Executor::communicates(const Instruction &inst) const {
  switch (inst.op) {
  case Op::AllReduce:
  case Op::AllGather:
  case Op::ReduceScatter:
  case Op::Shift:
  case Op::AllToAll:
    return gridGroupSize(bundle_.gridShape(), inst.attrs.gridAxes) > 1;
  default:
    return false;
  }
}

std::pair<int64_t, int64_t>
Executor::vocabBlock(size_t position, const Instruction &inst) const {
  return host::vocabularyBlock(bundle_.gridShape(), rank_,
                               inst.attrs.vocabShardAxes, where(position));
}

namespace {

/// An operand of all_gather, reduce_scatter or all_slice as
/// [outer, axisSize, inner] around the instruction's axis.
struct AxisView {
  int64_t outer = 1, axisSize = 1, inner = 1;
};

AxisView axisView(const std::vector<int64_t> &shape, int64_t axis) {
  AxisView view;
  for (int64_t d = 0; d < axis; ++d)
    view.outer *= shape[d];
  view.axisSize = shape[axis];
  for (size_t d = static_cast<size_t>(axis) + 1; d < shape.size(); ++d)
    view.inner *= shape[d];
  return view;
}

} // namespace

void Executor::prepareRankInstructions() {
  const Function &fn = *function_;
  size_t staging = 0, collectiveStaging = 0;
  bool any = false, anyCommunicates = false;
  for (size_t position = 0; position < fn.instructions.size(); ++position) {
    const Instruction &inst = fn.instructions[position];
    if (!isRankInstruction(inst))
      continue;
    any = true;
    if (inst.op == Op::VocabCrossEntropyGrad)
      staging = std::max(staging, kVocabCrossEntropyGradScratchBytes);
    if (!communicates(inst))
      continue;
    anyCommunicates = true;
    if (inst.op != Op::AllGather && inst.op != Op::ReduceScatter)
      continue;
    // Along the outermost axis the ranks' blocks are already contiguous.
    if (axisView(fn.values[inst.operands[0]].shape, inst.attrs.axis).outer == 1)
      continue;
    int64_t v = inst.op == Op::AllGather ? inst.results[0] : inst.operands[0];
    collectiveStaging =
        std::max(collectiveStaging,
                 sizeof(float) * static_cast<size_t>(fn.values[v].numElements));
  }
  if (!any)
    return;
  std::string what = fn.name + " of bundle '" + bundle_.name() + "'";
  // A communication stream where a collective runs on the device without
  // the host waiting (NCCL, PeerGroup); a call staged through the host
  // waits for its result anyway, and stays on the compute stream.
  bool onDevice = false;
  for (const Instruction &inst : fn.instructions)
    if (communicates(inst) && rank_) {
      const comm::Communicator &comm = rank_->group(inst.attrs.gridAxes);
      // PeerGroup runs the collectives; a shift or an all-to-all (sendRecv)
      // is staged.
      bool served = !comm.takesDeviceMemory() && !pointToPoint(inst.op) &&
                    context_.options().peerCollectives &&
                    PeerGroup::serves(comm, storageType(inst.operands[0]));
      onDevice = onDevice || comm.takesDeviceMemory() || served;
    }
  if (anyCommunicates && onDevice) {
    commStream_ = context_.communicationStream();
    collectiveStart_.assign(fn.instructions.size(), nullptr);
    collectiveDone_.assign(fn.instructions.size(), nullptr);
    for (size_t position = 0; position < fn.instructions.size(); ++position) {
      if (!communicates(fn.instructions[position]))
        continue;
      for (cudaEvent_t *event :
           {&collectiveStart_[position], &collectiveDone_[position]})
        MTRT_CUDA_CHECK(cudaEventCreateWithFlags(event, cudaEventDisableTiming),
                        where(position) + ": creating the collective's events");
    }
  }
  collective_ = std::make_unique<DeviceCollective>(
      commStream_ ? commStream_ : context_.stream(), what,
      context_.options().peerCollectives);
  if (staging)
    rankStaging_ =
        DeviceBuffer(staging, "the rank instructions' staging of " + what);
  if (collectiveStaging)
    collectiveStaging_ =
        DeviceBuffer(collectiveStaging, "the collectives' staging of " + what);
  if (commStream_)
    planCollectiveWaits();
}

void Executor::planCollectiveWaits() {
  const Function &fn = *function_;
  size_t count = fn.instructions.size();
  awaitedBefore_.assign(count + 1, {});
  for (size_t start = 0; start < count; ++start) {
    const Instruction &inst = fn.instructions[start];
    if (!communicates(inst))
      continue;
    int64_t operand = inst.operands[0], result = inst.results[0];
    auto lists = [&](const std::vector<int64_t> &values) {
      return std::find(values.begin(), values.end(), result) != values.end() ||
             std::find(values.begin(), values.end(), operand) != values.end();
    };
    // An unsplit collective's `free` ends its operand's life at the
    // collective itself: the plan may give that memory to the next
    // instruction's results, while this rank's kernel, or a peer's
    // (PeerGroup reads the ranks' operands in place), still reads it.
    size_t wait = lists(inst.free) ? start + 1 : count;
    for (size_t position = start + 1; position < count && wait == count;
         ++position) {
      const Instruction &later = fn.instructions[position];
      bool reads = std::find(later.operands.begin(), later.operands.end(),
                             result) != later.operands.end();
      if (reads || lists(later.free))
        wait = position;
    }
    awaitedBefore_[wait].push_back(start);
  }
}

void Executor::awaitCollectives(size_t position) {
  if (awaitedBefore_.empty())
    return;
  for (size_t start : awaitedBefore_[position])
    MTRT_CUDA_CHECK(
        cudaStreamWaitEvent(context_.stream(), collectiveDone_[start], 0),
        where(start) + ": waiting for the collective");
}

void Executor::executeCollective(size_t position, const Instruction &inst,
                                 const MicroBatchKey &key) {
  const Function &fn = *function_;
  const Attributes &a = inst.attrs;
  // A collective over several ranks runs on the communication stream, after
  // the compute stream's work so far; awaitCollectives joins it back.
  bool async = communicates(inst) && commStream_;
  cudaStream_t stream = async ? commStream_ : context_.stream();
  if (async) {
    MTRT_CUDA_CHECK(
        cudaEventRecord(collectiveStart_[position], context_.stream()),
        where(position));
    MTRT_CUDA_CHECK(
        cudaStreamWaitEvent(commStream_, collectiveStart_[position], 0),
        where(position));
    if (!commBegin_.empty())
      MTRT_CUDA_CHECK(cudaEventRecord(commBegin_[position], commStream_),
                      where(position) + ": profiling");
  }
  int64_t x = inst.operands[0], y = inst.results[0];
  // The plan gives a collective's operand and result one type
  // (Bf16Values.cpp): fp32, or bf16 for the tensor-parallel sums, gathers
  // and scatters of activations and their gradients. all_to_all also moves
  // the routing's i32 experts, as 4-byte f32 words: it only moves bytes,
  // and the communicators take floating types.
  DType type = storageType(x);
  bool words = inst.op == Op::AllToAll && type == DType::I32;
  if (storageType(y) != type ||
      (type != DType::F32 && type != DType::BF16 && !words))
    throw Error(MTRT_STATUS_INTERNAL,
                where(position) + ": " + opName(inst.op) + " from " +
                    dtypeName(type) + " to " + dtypeName(storageType(y)) +
                    "; the cuda backend's collectives take f32 or bf16 "
                    "values of one type");
  if (words)
    type = DType::F32;
  const size_t element = dtypeSize(type);
  const auto *in = static_cast<const char *>(slot(x));
  auto *out = static_cast<char *>(slot(y));
  int64_t inCount = fn.values[x].numElements;
  int64_t outCount = fn.values[y].numElements;
  int64_t group = gridGroupSize(bundle_.gridShape(), a.gridAxes);
  if (group == 1) {
    if (in != out && outCount > 0)
      MTRT_CUDA_CHECK(cudaMemcpyAsync(out, in, element * outCount,
                                      cudaMemcpyDeviceToDevice, stream),
                      where(position));
    return;
  }
  if (!rank_)
    throw Error(MTRT_STATUS_FAILED_PRECONDITION,
                where(position) + ": " + opName(inst.op) + " over " +
                    std::to_string(group) +
                    " ranks needs the bundle's ranks run together (a rank "
                    "context: megatron-train --in-process-ranks or one "
                    "process per rank)");
  AxisView view = inst.op == Op::AllReduce
                      ? AxisView{}
                      : axisView(fn.values[x].shape, a.axis);
  // Copies `rows` rows of `width` elements between pitched arrays; the
  // offsets and pitches are in elements.
  auto copyRows = [&](char *to, int64_t toPitch, const char *from,
                      int64_t fromPitch, int64_t width, int64_t rows) {
    if (width > 0 && rows > 0)
      MTRT_CUDA_CHECK(cudaMemcpy2DAsync(to, element * toPitch, from,
                                        element * fromPitch, element * width,
                                        rows, cudaMemcpyDeviceToDevice, stream),
                      where(position));
  };
  auto at = [&](auto *base, int64_t offset) { return base + element * offset; };
  if (inst.op == Op::AllSlice) {
    int64_t index =
        gridGroupIndex(rank_->gridShape(), rank_->coordinates(), a.gridAxes);
    int64_t block = view.axisSize / group * view.inner;
    copyRows(out, block, at(in, index * block), group * block, block,
             view.outer);
    return;
  }
  comm::Communicator &comm = rank_->group(a.gridAxes);
  std::string label = where(position);
  comm::CallInfo info{label, static_cast<int64_t>(key.step)};
  if (inst.op == Op::Shift) {
    // Context parallelism's ring (the host's RankCollective.cpp): the rank
    // `offset` places ahead along shift_axis receives this rank's operand,
    // the one as far behind sends it hers. The group ranks its members by
    // their coordinates along grid_axes, the first slowest: moving along
    // shift_axis moves by its stride there.
    const std::vector<int64_t> &grid = bundle_.gridShape();
    int64_t stride = 1;
    for (size_t i = a.gridAxes.size();
         i-- > 0 && a.gridAxes[i] != a.shiftAxis;)
      stride *= grid[static_cast<size_t>(a.gridAxes[i])];
    int64_t n = grid[static_cast<size_t>(a.shiftAxis)];
    int64_t c = rank_->coordinates()[static_cast<size_t>(a.shiftAxis)];
    int64_t index = comm.rank();
    auto peer = [&](int64_t by) {
      return static_cast<int>(index + (((c + by) % n + n) % n - c) * stride);
    };
    int to = peer(a.offset), from = peer(-a.offset);
    if (to == index) {
      if (in != out && outCount > 0)
        MTRT_CUDA_CHECK(cudaMemcpyAsync(out, in, element * outCount,
                                        cudaMemcpyDeviceToDevice, stream),
                        where(position));
      return;
    }
    collective_->sendRecv(comm, in, to, out, from, inCount, type, info);
    return;
  }
  if (inst.op == Op::AllToAll) {
    // Block r of the operand to rank r, block r of the result from it
    // (split and concatenation along axis 0): this rank's own block by a
    // copy, then round k sends to the rank k ahead and receives from the
    // rank k behind, as the host's pairwise exchange.
    const int r = comm.rank(), n = comm.size();
    if (in == out)
      throw Error(MTRT_STATUS_INTERNAL,
                  where(position) +
                      ": all_to_all's result shares its operand's memory, "
                      "which the exchange's receives would overwrite before "
                      "its sends read it");
    const int64_t block = inCount / n;
    const size_t bytes = element * static_cast<size_t>(block);
    if (bytes > 0)
      MTRT_CUDA_CHECK(cudaMemcpyAsync(out + r * bytes, in + r * bytes, bytes,
                                      cudaMemcpyDeviceToDevice, stream),
                      where(position));
    for (int k = 1; k < n; ++k) {
      int to = (r + k) % n, from = (r - k + n) % n;
      collective_->sendRecv(comm, in + to * bytes, to, out + from * bytes, from,
                            block, type, info);
    }
  }
  comm::ReduceOp op = a.collectiveReduction == CollectiveReduction::Max
                          ? comm::ReduceOp::Max
                          : comm::ReduceOp::Sum;
  auto *staging = static_cast<char *>(collectiveStaging_.data());
  switch (inst.op) {
  case Op::AllReduce:
    collective_->allReduce(comm, in, out, inCount, type, op, info);
    break;
  case Op::AllGather: {
    // The ranks' blocks arrive one after another; along an inner axis they
    // are interleaved into place.
    if (view.outer == 1) {
      collective_->allGather(comm, in, out, inCount, type, info);
      break;
    }
    collective_->allGather(comm, in, staging, inCount, type, info);
    int64_t block = view.axisSize * view.inner;
    for (int64_t r = 0; r < group; ++r)
      copyRows(at(out, r * block), group * block, at(staging, r * inCount),
               block, block, view.outer);
    break;
  }
  case Op::ReduceScatter: {
    // Each rank's block of the axis, made contiguous, one after another.
    if (view.outer == 1) {
      collective_->reduceScatter(comm, in, out, outCount, type, op, info);
      break;
    }
    int64_t block = view.axisSize / group * view.inner;
    for (int64_t r = 0; r < group; ++r)
      copyRows(at(staging, r * outCount), block, at(in, r * block),
               group * block, block, view.outer);
    collective_->reduceScatter(comm, staging, out, outCount, type, op, info);
    break;
  }
  default:
    break;
  }
  if (!async)
    return;
  if (!commEnd_.empty())
    MTRT_CUDA_CHECK(cudaEventRecord(commEnd_[position], commStream_),
                    where(position) + ": profiling");
  MTRT_CUDA_CHECK(cudaEventRecord(collectiveDone_[position], commStream_),
                  where(position));
}

void Executor::executeRankInstruction(size_t position, const Instruction &inst,
                                      const MicroBatchKey &key) {
  const Function &fn = *function_;
  const Attributes &a = inst.attrs;
  cudaStream_t stream = context_.stream();
  unsigned *fault = context_.fault();
  unsigned tag = static_cast<unsigned>(position + 1);
  auto in = [&](size_t i) {
    return static_cast<const float *>(slot(inst.operands[i]));
  };
  auto out = [&](size_t i) {
    return static_cast<float *>(slot(inst.results[i]));
  };
  // An operand or result the plan may hold in bf16 (Bf16Values.cpp).
  auto inElements = [&](size_t i) {
    const void *data = slot(inst.operands[i]);
    return heldInBf16(inst.operands[i])
               ? InElements(static_cast<const __nv_bfloat16 *>(data))
               : InElements(static_cast<const float *>(data));
  };
  auto outElements = [&](size_t i) {
    void *data = slot(inst.results[i]);
    return heldInBf16(inst.results[i])
               ? OutElements(static_cast<__nv_bfloat16 *>(data))
               : OutElements(static_cast<float *>(data));
  };
  auto count = [&](int64_t v) { return fn.values[v].numElements; };
  auto withIds = [&](size_t operand, auto &&body) {
    const void *data = slot(inst.operands[operand]);
    if (fn.values[inst.operands[operand]].dtype == DType::I64)
      body(static_cast<const int64_t *>(data));
    else
      body(static_cast<const int32_t *>(data));
  };

  switch (inst.op) {
  case Op::AllReduce:
  case Op::AllGather:
  case Op::ReduceScatter:
  case Op::AllSlice:
  case Op::Shift:
  case Op::AllToAll:
    executeCollective(position, inst, key);
    return;
  case Op::BiasAdd: { // y = x + bias per row, in place or not
    int64_t n = fn.values[inst.operands[0]].shape.back();
    int64_t total = count(inst.operands[0]);
    biasAdd(stream, n ? total / n : 0, n, inElements(0), in(1), outElements(0));
    break;
  }
  case Op::VocabMax: {
    int64_t vocab = fn.values[inst.operands[0]].shape.back();
    vocabMax(stream, count(inst.operands[0]) / vocab, vocab, inElements(0),
             out(0));
    break;
  }
  case Op::VocabPartials:
  case Op::VocabCrossEntropyGrad: {
    bool grad = inst.op == Op::VocabCrossEntropyGrad;
    size_t logitsAt = grad ? 1 : 0, labelsAt = logitsAt + 1;
    int64_t vocab = fn.values[inst.operands[logitsAt]].shape.back();
    int64_t rows = count(inst.operands[logitsAt]) / vocab;
    int64_t start = vocabBlock(position, inst).first * vocab;
    withIds(labelsAt, [&](auto *labels) {
      if (grad)
        vocabCrossEntropyGrad(stream, rows, vocab, start, inElements(1), labels,
                              a.ignoreIndex, toKernel(a.reduction), in(0),
                              in(3), in(4), outElements(0),
                              rankStaging_.data());
      else
        vocabPartials(stream, rows, vocab, start, inElements(0), labels, in(2),
                      out(0));
    });
    break;
  }
  case Op::VocabCrossEntropy: {
    int64_t rows = count(inst.operands[1]);
    withIds(1, [&](auto *labels) {
      vocabCrossEntropy(stream, rows, in(0), labels, a.ignoreIndex,
                        toKernel(a.reduction), out(0));
    });
    break;
  }
  case Op::Embedding:
  case Op::EmbeddingGrad: {
    EmbeddingDims d = embeddingDims(fn, inst);
    auto [block, blocks] = vocabBlock(position, inst);
    withIds(1, [&](auto *ids) {
      if (inst.op == Op::Embedding)
        vocabEmbeddingForward(stream, d.count, d.vocab, d.hidden,
                              block * d.vocab, blocks * d.vocab, in(0), ids,
                              outElements(0), fault, tag);
      else
        vocabEmbeddingBackward(stream, d.count, d.vocab, d.hidden,
                               block * d.vocab, blocks * d.vocab, ids,
                               inElements(0), out(0), scratch(position), fault,
                               tag);
    });
    break;
  }
  default:
    throw Error(MTRT_STATUS_INTERNAL, where(position) + ": " + opName(inst.op) +
                                          " is not a multi-rank instruction");
  }
  cudaError_t launch = cudaGetLastError();
  if (launch != cudaSuccess)
    throwCudaError(launch, "launching the instruction's kernels",
                   where(position));
}

} // namespace mtrt::cuda
