// Attention dropout masks drawn ahead (ContextOptions::attentionMaskAhead).
//
// An attention's keep bits depend on nothing the step computes: the op's
// seed, the micro-batch's first sample and the positions. Their draw is
// integer-bound (about 0.15 ms a layer at gpt-1.3b's shape, bench/NOTES.md
// session 30), so instead of running right before the attention it runs on
// a stream of the lowest priority from just after the previous attention:
// the block scheduler gives its blocks the multiprocessors the compute
// stream's kernels leave free (the norms, the element-wise kernels, the
// tails of the products), and the attention waits for its mask.
//
// Each such mask has a buffer of its own beside the memory plan, live from
// the draw through the gradient: the plan's kernel block of the attention
// starts at the attention, too late for the draw.
#include "cuda/Executor.h"

#include "comm/RankContext.h"
#include "core/OpShapes.h"
#include "cuda/CudaCheck.h"
#include "cuda/kernels/HopperAttention.h"

namespace mtrt::cuda {

void Executor::planMasksAhead() {
  const Function &fn = *function_;
  size_t count = fn.instructions.size();
  masksDrawnBefore_.clear();
  maskAhead_.assign(count, nullptr);
  if (!context_.options().attentionMaskAhead)
    return;
  std::vector<std::vector<size_t>> drawnBefore(count + 1);
  maskDrawn_.assign(count, nullptr);
  size_t from = 0;
  for (size_t position = 0; position < count; ++position) {
    const Instruction &inst = fn.instructions[position];
    if (inst.op != Op::Attention)
      continue;
    AttentionParams p = attentionParams(fn, inst, 0);
    if (!flashAttention(p) || p.dropoutP <= 0 || cudnnAttention_[position] ||
        kernelBlocks_.attentionPartner[position] == kNoPartner)
      continue;
    maskAheadBuffers_.emplace_back(flashAttentionMaskBytes(p),
                                   where(position) +
                                       ": its dropout mask, drawn ahead");
    maskAhead_[position] = maskAheadBuffers_.back().as<uint64_t>();
    MTRT_CUDA_CHECK(
        cudaEventCreateWithFlags(&maskDrawn_[position], cudaEventDisableTiming),
        where(position));
    drawnBefore[from].push_back(position);
    from = position + 1;
  }
  if (maskAheadBuffers_.empty())
    return;
  masksDrawnBefore_ = std::move(drawnBefore);
  MTRT_CUDA_CHECK(cudaEventCreateWithFlags(&maskFork_, cudaEventDisableTiming),
                  fn.name + ": the attention masks' fork");
  maskFirstSample_ =
      DeviceBuffer(sizeof(uint64_t), fn.name + ": the masks' first sample");
}

void Executor::beforeInstruction(size_t position) {
  awaitCollectives(position);
  if (masksDrawnBefore_.empty())
    return;
  const Function &fn = *function_;
  cudaStream_t stream = context_.stream();
  if (!masksDrawnBefore_[position].empty()) {
    std::string what = position < fn.instructions.size()
                           ? where(position) + ": drawing masks ahead"
                           : fn.name + ": drawing masks ahead";
    cudaStream_t side = context_.maskStream();
    MTRT_CUDA_CHECK(cudaEventRecord(maskFork_, stream), what);
    MTRT_CUDA_CHECK(cudaStreamWaitEvent(side, maskFork_, 0), what);
    static const std::vector<int64_t> kOneRank;
    const std::vector<int64_t> &coordinates =
        rank_ ? rank_->coordinates() : kOneRank;
    for (size_t attention : masksDrawnBefore_[position]) {
      const Instruction &inst = fn.instructions[attention];
      AttentionParams p = attentionParams(fn, inst, 0);
      setAttentionTile(p, fn, inst, bundle_.gridShape(), coordinates);
      flashAttentionDropoutMask(side, p, maskAhead_[attention],
                                maskFirstSample_.as<uint64_t>());
      MTRT_CUDA_CHECK(cudaEventRecord(maskDrawn_[attention], side), what);
    }
    cudaError_t launch = cudaGetLastError();
    if (launch != cudaSuccess)
      throwCudaError(launch, "launching the mask kernels", what);
  }
  if (position < maskAhead_.size() && maskAhead_[position])
    MTRT_CUDA_CHECK(cudaStreamWaitEvent(stream, maskDrawn_[position], 0),
                    where(position) + ": waiting for its mask");
}

} // namespace mtrt::cuda
