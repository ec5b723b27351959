//===- RankCollective.cpp - A rank's collective instruction on host buffers ===//

#include "host/RankCollective.h"

#include "comm/RankContext.h"
#include "core/Error.h"
#include "host/ThreadPool.h"
#include "host/kernels/Kernels.h"

#include <cstring>

namespace mtrt::host {

std::pair<int64_t, int64_t>
vocabularyBlock(const std::vector<int64_t> &gridShape,
                const comm::RankContext *rank,
                const std::vector<int64_t> &vocabShardAxes,
                const std::string &where) {
  if (vocabShardAxes.empty())
    return {0, 1};
  int64_t blocks = gridGroupSize(gridShape, vocabShardAxes);
  if (blocks == 1)
    return {0, 1};
  if (!rank)
    throw Error(MTRT_STATUS_FAILED_PRECONDITION,
                where + ": the vocabulary is split over " +
                    std::to_string(blocks) +
                    " ranks; run the bundle's ranks together "
                    "(megatron-train --in-process-ranks)");
  return {gridGroupIndex(rank->gridShape(), rank->coordinates(),
                         vocabShardAxes),
          blocks};
}

int64_t rankCollectiveStaging(const Function &fn, const Instruction &inst,
                              const std::vector<int64_t> &gridShape) {
  if (gridGroupSize(gridShape, inst.attrs.gridAxes) == 1)
    return 0;
  if (inst.op == Op::AllGather)
    return fn.values[inst.results[0]].numElements;
  if (inst.op == Op::ReduceScatter)
    return fn.values[inst.operands[0]].numElements;
  return 0;
}

template <typename T>
void runRankCollective(ThreadPool &pool, const Function &fn,
                       const Instruction &inst,
                       const std::vector<int64_t> &gridShape,
                       comm::RankContext *rank, const comm::CallInfo &info,
                       const T *x, T *y, T *staging) {
  const Attributes &a = inst.attrs;
  int64_t inCount = fn.values[inst.operands[0]].numElements;
  int64_t outCount = fn.values[inst.results[0]].numElements;
  int64_t group = gridGroupSize(gridShape, a.gridAxes);
  if (group == 1) {
    std::memcpy(y, x, sizeof(T) * static_cast<size_t>(outCount));
    return;
  }
  // The operand as [outer, axisSize, inner] around the op's axis.
  const std::vector<int64_t> &shape = fn.values[inst.operands[0]].shape;
  int64_t outer = 1, inner = 1;
  if (inst.op != Op::AllReduce) {
    for (int64_t d = 0; d < a.axis; ++d)
      outer *= shape[d];
    for (size_t d = static_cast<size_t>(a.axis) + 1; d < shape.size(); ++d)
      inner *= shape[d];
  }
  if (inst.op == Op::AllSlice) {
    int64_t index = gridGroupIndex(rank->gridShape(), rank->coordinates(),
                                   a.gridAxes);
    int64_t block = shape[a.axis] / group * inner;
    for (int64_t o = 0; o < outer; ++o)
      std::memcpy(y + o * block, x + (o * group + index) * block,
                  sizeof(T) * static_cast<size_t>(block));
    return;
  }
  comm::Communicator &comm = rank->group(a.gridAxes);
  if (inst.op == Op::Shift) {
    // The group ranks its members by their coordinates along grid_axes, the
    // first slowest: moving along shift_axis moves by its stride there.
    int64_t stride = 1;
    for (size_t i = a.gridAxes.size(); i-- > 0 && a.gridAxes[i] != a.shiftAxis;)
      stride *= gridShape[a.gridAxes[i]];
    int64_t n = gridShape[a.shiftAxis];
    int64_t c = rank->coordinates()[a.shiftAxis];
    int64_t index = comm.rank();
    auto peer = [&](int64_t by) {
      return static_cast<int>(index + (((c + by) % n + n) % n - c) * stride);
    };
    int to = peer(a.offset), from = peer(-a.offset);
    if (to == index)
      std::memcpy(y, x, sizeof(T) * static_cast<size_t>(outCount));
    else
      comm.sendRecv<T>(x, to, y, from, inCount, info);
    return;
  }
  comm::ReduceOp op = a.collectiveReduction == CollectiveReduction::Max
                          ? comm::ReduceOp::Max
                          : comm::ReduceOp::Sum;
  std::vector<int64_t> sizes(static_cast<size_t>(group));
  std::vector<T *> pieces(static_cast<size_t>(group));
  switch (inst.op) {
  case Op::AllReduce:
    comm.allReduce<T>(x, y, inCount, op, info);
    break;
  case Op::AllGather: {
    // The ranks' blocks arrive one after another; interleave them along the
    // axis.
    comm.allGather<T>(x, staging, inCount, info);
    for (int64_t r = 0; r < group; ++r) {
      sizes[r] = shape[a.axis];
      pieces[r] = staging + r * inCount;
    }
    std::vector<const T *> inputs(pieces.begin(), pieces.end());
    concatForward<T>(pool, outer, inner, static_cast<int>(group), sizes.data(),
                     inputs.data(), y);
    break;
  }
  case Op::ReduceScatter: {
    // Each rank's block of the axis, made contiguous, one after another.
    for (int64_t r = 0; r < group; ++r) {
      sizes[r] = shape[a.axis] / group;
      pieces[r] = staging + r * outCount;
    }
    splitForward<T>(pool, outer, inner, static_cast<int>(group), sizes.data(),
                    x, pieces.data());
    comm.reduceScatter<T>(staging, y, outCount, op, info);
    break;
  }
  default:
    break;
  }
}

template void runRankCollective<float>(ThreadPool &, const Function &,
                                       const Instruction &,
                                       const std::vector<int64_t> &,
                                       comm::RankContext *,
                                       const comm::CallInfo &, const float *,
                                       float *, float *);
template void runRankCollective<double>(ThreadPool &, const Function &,
                                        const Instruction &,
                                        const std::vector<int64_t> &,
                                        comm::RankContext *,
                                        const comm::CallInfo &, const double *,
                                        double *, double *);

} // namespace mtrt::host
