// The CUDA executor's instructions of context parallelism
// (docs/Parallelism.md, "Context parallelism"): ring attention's blocks,
// merge, delta and block gradients (kernels/AttentionBlocks.cu), and
// position_ids, rope and dropout on a tile of the load-balanced sequence,
// each row at its global position (core/ContextLayout.h), as the host
// executor runs them (host/OpDispatch.cpp). The ring's shift is a
// multi-rank instruction (RankOps.cpp).
#include "cuda/Executor.h"

#include "comm/RankContext.h"
#include "core/ContextLayout.h"
#include "core/OpShapes.h"
#include "core/Random.h"
#include "cuda/CudaCheck.h"
#include "cuda/kernels/AttentionBlocks.h"
#include "cuda/kernels/Kernels.h"

namespace mtrt::cuda {

bool Executor::isContextParallelInstruction(const Instruction &inst) {
  switch (inst.op) {
  case Op::AttentionBlock:
  case Op::AttentionMerge:
  case Op::AttentionDelta:
  case Op::AttentionBlockGrad:
    return true;
  case Op::PositionIds:
  case Op::Rope:
  case Op::Dropout:
    return inst.attrs.contextSize > 1;
  default:
    return false;
  }
}

void Executor::executeContextParallel(size_t position, const Instruction &inst,
                                      const MicroBatchKey &key) {
  const Function &fn = *function_;
  const Attributes &a = inst.attrs;
  cudaStream_t stream = context_.stream();
  static const std::vector<int64_t> kOneRank;
  const std::vector<int64_t> &coordinates =
      rank_ ? rank_->coordinates() : kOneRank;
  // Operand and result i in their storage type, from element `at` on.
  auto inElements = [&](size_t i, int64_t at = 0) -> InElements {
    const void *data = slots_[inst.operands[i]];
    if (heldInBf16(inst.operands[i]))
      return static_cast<const __nv_bfloat16 *>(data) + at;
    return static_cast<const float *>(data) + at;
  };
  auto outElements = [&](size_t i, int64_t at = 0) -> OutElements {
    void *data = slots_[inst.results[i]];
    if (heldInBf16(inst.results[i]))
      return static_cast<__nv_bfloat16 *>(data) + at;
    return static_cast<float *>(data) + at;
  };
  // The statistics (logsumexp, delta) are f32 (the reader checks them).
  auto statisticIn = [&](size_t i) {
    return static_cast<const float *>(slots_[inst.operands[i]]);
  };
  auto statisticOut = [&](size_t i) {
    return static_cast<float *>(slots_[inst.results[i]]);
  };
  // The context rank along the instruction's context axis (0 on one rank:
  // the reader admits a context_size > 1 only where the grid has the axis).
  auto contextRank = [&]() -> int64_t {
    if (coordinates.empty())
      throw Error(MTRT_STATUS_FAILED_PRECONDITION,
                  where(position) + ": " + opName(inst.op) +
                      " is context-parallel over " +
                      std::to_string(a.contextSize) +
                      " ranks; run the bundle's ranks together "
                      "(megatron-train --in-process-ranks or one process "
                      "per rank)");
    return coordinates[static_cast<size_t>(a.contextAxis)];
  };

  switch (inst.op) {
  case Op::AttentionBlock:
  case Op::AttentionBlockGrad: {
    // The queries are the rank's chunks; the keys one ring step's rank's
    // (key_step s: rank (r - s) mod cp) or every rank's in rank order.
    AttentionParams p = attentionParams(fn, inst, key.firstSample);
    setAttentionTile(p, fn, inst, bundle_.gridShape(), coordinates);
    int64_t cp = a.contextSize, seq = p.seqQ * cp, rank = contextRank();
    AttentionBlockLayout layout;
    layout.queries = ContextTile{rank * p.seqQ, seq, cp};
    layout.keys = ContextTile{
        a.keyStep ? ((rank - *a.keyStep) % cp + cp) % cp * p.seqK : 0, seq,
        cp};
    if (inst.op == Op::AttentionBlock)
      attentionBlockForward(stream, p, layout, inElements(0), inElements(1),
                            inElements(2), outElements(0), statisticOut(1));
    else // operands dout, q, k, v, logsumexp, delta
      attentionBlockBackward(stream, p, layout, inElements(1), inElements(2),
                             inElements(3), statisticIn(4), statisticIn(5),
                             inElements(0), outElements(0), outElements(1),
                             outElements(2));
    break;
  }
  case Op::AttentionMerge:
  case Op::AttentionDelta: {
    // Outputs [batch, seq, heads, value_dim].
    const std::vector<int64_t> &o = fn.values[inst.operands[0]].shape;
    if (inst.op == Op::AttentionDelta)
      attentionDelta(stream, o[0], o[1], o[2], o[3], inElements(0),
                     inElements(1), statisticOut(0));
    else // operands out, logsumexp, the block's out and logsumexp
      attentionMerge(stream, o[0], o[1], o[2], o[3], inElements(0),
                     statisticIn(1), inElements(2), statisticIn(3),
                     outElements(0), statisticOut(1));
    break;
  }
  case Op::PositionIds: {
    // The tile's rows of the load-balanced sequence (split over the context
    // axis, then the tensor ranks under sequence parallelism).
    int64_t v = inst.results[0];
    int64_t seq = fn.values[v].shape.back(), first = 0, global = seq;
    if (!a.splitAxes.empty()) {
      host::GlobalTile tile =
          globalTile(fn, inst, v, bundle_.gridShape(), coordinates);
      first = tile.offsets.back();
      global = tile.globalShape.back();
    }
    ContextTile rows{first, global, a.contextSize};
    if (fn.values[v].dtype == DType::I64)
      positionIds(stream, fn.values[v].numElements, seq,
                  static_cast<int64_t *>(slots_[v]), rows);
    else
      positionIds(stream, fn.values[v].numElements, seq,
                  static_cast<int32_t *>(slots_[v]), rows);
    break;
  }
  case Op::Rope: {
    RopeDims d = ropeDims(fn, inst);
    host::GlobalTile tile = globalTile(fn, inst, inst.operands[0],
                                       bundle_.gridShape(), coordinates);
    rope(stream, d.batch, d.seq, d.heads, d.headDim, d.rotary,
         ropeFrequencies(a), a.inverse, inElements(0), outElements(0),
         scratch(position),
         ContextTile{tile.offsets[1], tile.globalShape[1], a.contextSize});
    break;
  }
  case Op::Dropout: {
    // Each sample's runs of rows that are consecutive in the global
    // sequence are a mask tile of their own, at their global positions, so
    // every element keeps the one-rank run's bit (the host's rule).
    host::GlobalTile tile = globalTile(fn, inst, inst.operands[0],
                                       bundle_.gridShape(), coordinates);
    const int64_t rows = tile.localShape[1];
    ContextTile layout{tile.offsets[1], tile.globalShape[1], a.contextSize};
    int64_t inner = 1;
    for (size_t d = 2; d < tile.localShape.size(); ++d)
      inner *= tile.localShape[d];
    for (int64_t b = 0; b < tile.localShape[0]; ++b)
      for (int64_t first = 0, last; first < rows; first = last) {
        int64_t start = contextGlobalPosition(layout, first);
        for (last = first + 1; last < rows &&
                               contextGlobalPosition(layout, last) ==
                                   start + (last - first);
             ++last)
          ;
        std::vector<int64_t> local = tile.localShape, offsets = tile.offsets;
        local[0] = 1;
        local[1] = last - first;
        offsets[0] += b;
        offsets[1] = start;
        random::MaskTile run;
        if (!random::makeMaskTile(local.data(), tile.globalShape.data(),
                                  offsets.data(),
                                  static_cast<unsigned>(local.size()),
                                  key.firstSample, run))
          throw Error(MTRT_STATUS_INTERNAL,
                      where(position) + ": dropout's tile of rank " +
                          std::to_string(local.size()) +
                          " does not fit a mask tile");
        int64_t at = (b * rows + first) * inner;
        dropout(stream, (last - first) * inner, inElements(0, at),
                outElements(0, at), a.p, static_cast<uint64_t>(a.seed), run);
      }
    break;
  }
  default:
    throw Error(MTRT_STATUS_INTERNAL,
                where(position) + ": " + opName(inst.op) +
                    " is not a context-parallel instruction");
  }
  cudaError_t launch = cudaGetLastError();
  if (launch != cudaSuccess)
    throwCudaError(launch, "launching the instruction's kernels",
                   where(position));
}

} // namespace mtrt::cuda
