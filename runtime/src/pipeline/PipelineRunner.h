// Runs a pipeline bundle's static schedule on one rank: its stages' forward
// and backward functions over the micro-batches, with the activations and
// their gradients sent to and received from the neighbouring stages.
#ifndef MTRT_SRC_PIPELINE_PIPELINERUNNER_H
#define MTRT_SRC_PIPELINE_PIPELINERUNNER_H

#include "core/Bundle.h"
#include "host/HostTensor.h"

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <utility>
#include <vector>

namespace mtrt::comm {
class Communicator;
class RankContext;
} // namespace mtrt::comm

namespace mtrt::host {
class Executor;
class ParameterStore;
class ThreadPool;
} // namespace mtrt::host

namespace mtrt::pipeline {

/// One rank of a pipeline bundle (docs/Pipeline.md). The rank runs the
/// virtual stages the schedule gives its pipeline coordinate, and exchanges
/// messages with the ranks that share its data- and tensor-parallel
/// coordinates: sends are asynchronous (Communicator::sendAsync), receives
/// block, in the schedule's order, which the compiler proved cannot
/// deadlock. Gradients accumulate into the ParameterStore as the backward
/// passes run; the caller zeroes them and steps the optimizer.
///
/// Thread-safety: the rank's thread only.
class PipelineRunner {
public:
  /// The rank's tokens and labels of micro-batch m of the current iteration
  /// (or evaluation), valid until the next call.
  using MicroBatchSource =
      std::function<std::pair<host::TensorView, host::TensorView>(int64_t)>;

  /// Prepares the executors of the rank's stages. Collective over the world
  /// (it makes the pipeline group). Throws Error.
  PipelineRunner(const Bundle &bundle, host::ParameterStore &parameters,
                 host::ThreadPool &pool, comm::RankContext &rank);
  ~PipelineRunner();

  /// Runs the schedule once: returns the sum of the micro-batches' losses,
  /// the same on every rank. `firstStep` keys the dropout of micro-batch 0.
  double train(const MicroBatchSource &source, uint64_t firstStep);
  /// Runs the eval functions over `microBatches` micro-batches, one after
  /// another through all stages; returns the sum of their losses on every
  /// rank.
  double evaluate(const MicroBatchSource &source, int64_t microBatches);

  /// fp16 loss scaling: the last stage's loss gradient from the next train()
  /// on, instead of 1.
  void setLossScale(double scale) { lossScale_ = scale; }

  /// The fraction of train()'s time this rank computed nothing, over all
  /// calls so far.
  double idleFraction() const;
  /// Every pipeline rank's idleFraction(), on every rank (a collective over
  /// the world; data- and tensor-parallel replicas are averaged).
  std::vector<double> gatherIdleFractions();

private:
  struct Stage {
    const PipelineStageInfo *info = nullptr;
    std::unique_ptr<host::Executor> forward, backward, eval;
  };
  using Key = std::pair<int64_t, int64_t>; // (stage, micro-batch)

  int peerWorldRank(int64_t pipelineRank) const;
  host::Tensor receive(int64_t peer, const TensorType &type,
                       const std::string &label, uint64_t step);
  void send(int64_t peer, const host::Tensor &tensor, const std::string &label,
            uint64_t step);
  host::TensorView view(const host::Tensor &tensor) const;
  double scalar(const host::Tensor &tensor) const;

  const Bundle &bundle_;
  const PipelineInfo &pipeline_;
  host::ParameterStore &parameters_;
  comm::RankContext &rank_;
  comm::Communicator *pipelineGroup_ = nullptr;
  int64_t pipelineRank_ = 0;
  int64_t lastStage_ = 0;
  DType floatType_;
  double lossScale_ = 1.0;
  std::map<int64_t, Stage> stages_;

  // Messages and stashes in flight during one schedule.
  std::map<Key, host::Tensor> inputs_, outputGradients_, outputs_,
      inputGradients_;
  std::map<Key, std::vector<host::Tensor>> stash_;

  double computeSeconds_ = 0, wallSeconds_ = 0;
};

} // namespace mtrt::pipeline

#endif // MTRT_SRC_PIPELINE_PIPELINERUNNER_H
