// Megatron-LM's distributed optimizer on the host: AdamW state and the update
// sharded over the data-parallel ranks.
#ifndef MTRT_SRC_TRAIN_DISTRIBUTEDOPTIMIZER_H
#define MTRT_SRC_TRAIN_DISTRIBUTEDOPTIMIZER_H

#include "host/HostTensor.h"
#include "train/Optimizer.h"

#include <cstddef>
#include <cstdint>
#include <vector>

namespace mtrt::train {

class DataParallelBuffer;

/// The optimizer step of Megatron-LM's --use-distributed-optimizer, after
/// DataParallelBuffer::reduceGradients has reduce-scattered the gradient
/// buffer: each data-parallel rank holds AdamW's moments for its range of
/// the buffer only (a 1/dp share, padded), and steps just those elements:
///
///   shard *= gradScale (1/micro-batches);
///   norm = sqrt(sum over the world of each rank's shard squares), the
///     tensor-parallel replicas of unsplit parameters counted once, summed
///     exactly (ExactSquareSum): the same norm whatever the shards;
///   shard *= the clip coefficient; AdamW on the rank's elements of each
///   parameter (the fp32 parameters are their own master weights);
///   gather_parameters all-gathers every rank's updated range (with
///   --overlap-param-gather, per bucket before the next step reads it).
///
/// The formulas are Optimizer's, element by element, so parameters differ
/// from the replicated optimizer's only through the norm's summation (a
/// float sum there, exact here).
/// Parameters the buffer leaves out (expert parallelism's experts, whose
/// gradients are whole on every rank that holds them) are stepped whole
/// from the store's gradients, with moments of their own: the rank's
/// `localParameters()`. (Megatron-Core shards them over the
/// expert-data-parallel group in a buffer of their own; here their moments
/// are whole on each replica.)
///
/// Thread-safety: none; the rank's thread drives it.
class DistributedOptimizer {
public:
  /// Everything must outlive the optimizer; `buffer` is distributed.
  DistributedOptimizer(host::ParameterStore &parameters,
                       DataParallelBuffer &buffer, host::ThreadPool &pool,
                       const OptimizerConfig &config, comm::RankContext &rank);

  /// As Optimizer::step, after buffer.reduceGradients(). With
  /// `deferGather`, the buffer's gather of the updated parameters is left to
  /// the next step where the bundle overlaps it
  /// (DataParallelBuffer::gatherParameters).
  OptimizerStepResult step(int64_t iteration, double gradScale,
                           bool deferGather = false);
  /// As Optimizer::unscaleAndCheckFinite, over the rank's shard of the
  /// reduced buffer (the shards cover every gradient element once).
  bool unscaleAndCheckFinite(double factor, int64_t iteration);

  const OptimizerConfig &config() const { return config_; }
  /// AdamW's moments of the rank's range of the gradient buffer
  /// (DataParallelBuffer::pieces() maps them onto parameters); checkpoints
  /// save and restore them.
  host::Tensor &expAvg() { return expAvg_; }
  host::Tensor &expAvgSq() { return expAvgSq_; }
  /// The parameters outside the buffer that the rank steps whole, and their
  /// moments (by position in localParameters()).
  const std::vector<size_t> &localParameters() const { return local_; }
  host::Tensor &localExpAvg(size_t k) { return localExpAvg_[k]; }
  host::Tensor &localExpAvgSq(size_t k) { return localExpAvgSq_[k]; }
  /// The bytes of AdamW's moments this rank holds.
  size_t stateBytes() const {
    size_t bytes = expAvg_.buffer.size() + expAvgSq_.buffer.size();
    for (size_t k = 0; k < local_.size(); ++k)
      bytes += localExpAvg_[k].buffer.size() + localExpAvgSq_[k].buffer.size();
    return bytes;
  }

private:
  template <typename T>
  OptimizerStepResult stepTyped(int64_t, double, bool deferGather);
  /// The expert biases' update (updateExpertBias) on this rank's pieces,
  /// from each bias's count summed over the world, before the step scales
  /// the shard; the gather after AdamW brings the other ranks' pieces.
  template <typename T> void updateExpertBiases(int64_t iteration);

  host::ParameterStore &parameters_;
  DataParallelBuffer &buffer_;
  host::ThreadPool &pool_;
  OptimizerConfig config_;
  comm::RankContext &rank_;
  host::Tensor expAvg_, expAvgSq_;
  std::vector<size_t> local_;
  std::vector<host::Tensor> localExpAvg_, localExpAvgSq_;
};

} // namespace mtrt::train

#endif // MTRT_SRC_TRAIN_DISTRIBUTEDOPTIMIZER_H
