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
///     tensor-parallel replicas of unsplit parameters counted once;
///   shard *= the clip coefficient; AdamW on the rank's elements of each
///   parameter (the fp32 parameters are their own master weights);
///   gather_parameters all-gathers every rank's updated range.
///
/// The formulas are Optimizer's, element by element, so parameters differ
/// from the replicated optimizer's only through the norm's summation order.
///
/// Thread-safety: none; the rank's thread drives it.
class DistributedOptimizer {
public:
  /// Everything must outlive the optimizer; `buffer` is distributed.
  DistributedOptimizer(host::ParameterStore &parameters,
                       DataParallelBuffer &buffer, host::ThreadPool &pool,
                       const OptimizerConfig &config, comm::RankContext &rank);

  /// As Optimizer::step, after buffer.reduceGradients().
  OptimizerStepResult step(int64_t iteration, double gradScale);
  /// As Optimizer::unscaleAndCheckFinite, over the rank's shard of the
  /// reduced buffer (the shards cover every gradient element once).
  bool unscaleAndCheckFinite(double factor, int64_t iteration);

  const OptimizerConfig &config() const { return config_; }
  /// AdamW's moments of the rank's range of the gradient buffer
  /// (DataParallelBuffer::pieces() maps them onto parameters); checkpoints
  /// save and restore them.
  host::Tensor &expAvg() { return expAvg_; }
  host::Tensor &expAvgSq() { return expAvgSq_; }
  /// The bytes of AdamW's moments this rank holds.
  size_t stateBytes() const {
    return expAvg_.buffer.size() + expAvgSq_.buffer.size();
  }

private:
  template <typename T> OptimizerStepResult stepTyped(int64_t, double);

  host::ParameterStore &parameters_;
  DataParallelBuffer &buffer_;
  host::ThreadPool &pool_;
  OptimizerConfig config_;
  comm::RankContext &rank_;
  host::Tensor expAvg_, expAvgSq_;
};

} // namespace mtrt::train

#endif // MTRT_SRC_TRAIN_DISTRIBUTEDOPTIMIZER_H
