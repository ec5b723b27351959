//===- RankCollective.h - A rank's collective instruction on host buffers -===//
//
// The layouts of the collective instructions, written once for both
// executors: the host executor runs them on its slots, the CUDA executor on
// host copies of its device buffers (cuda/RankOps.cpp).
//
//===----------------------------------------------------------------------===//
#ifndef MTRT_HOST_RANKCOLLECTIVE_H
#define MTRT_HOST_RANKCOLLECTIVE_H

#include "comm/Communicator.h"
#include "core/Bundle.h"

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

namespace mtrt::comm {
class RankContext;
} // namespace mtrt::comm

namespace mtrt::host {

class ThreadPool;

/// The rank's block of a vocabulary split over `vocabShardAxes`: its index
/// and the number of blocks ({0, 1} when not split). Throws
/// FAILED_PRECONDITION, naming `where`, when the vocabulary is split but
/// there is no rank context.
std::pair<int64_t, int64_t>
vocabularyBlock(const std::vector<int64_t> &gridShape,
                const comm::RankContext *rank,
                const std::vector<int64_t> &vocabShardAxes,
                const std::string &where);

/// The elements of staging that runRankCollective needs for `inst`: the
/// gathered result of all_gather, the operand's blocks of reduce_scatter.
int64_t rankCollectiveStaging(const Function &fn, const Instruction &inst,
                              const std::vector<int64_t> &gridShape);

/// Runs all_reduce, all_gather or reduce_scatter over the rank's group along
/// the instruction's grid_axes, all_slice (the rank's block of the axis),
/// or shift (a rotation along shift_axis by Communicator::sendRecv), from `x` (the operand) into `y` (the result). Groups of one rank copy;
/// only they may run without a rank context. all_gather interleaves the
/// ranks' blocks along the axis; reduce_scatter makes each rank's block of
/// the axis contiguous first. `staging` holds rankCollectiveStaging
/// elements.
template <typename T>
void runRankCollective(ThreadPool &pool, const Function &fn,
                       const Instruction &inst,
                       const std::vector<int64_t> &gridShape,
                       comm::RankContext *rank, const comm::CallInfo &info,
                       const T *x, T *y, T *staging);

} // namespace mtrt::host

#endif // MTRT_HOST_RANKCOLLECTIVE_H
