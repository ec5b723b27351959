// Runs a pipeline bundle's static schedule on one rank on the host: its
// stages' forward and backward functions over the micro-batches, with the
// activations and their gradients sent to and received from the
// neighbouring stages (the schedule itself: ScheduleRunner.h).
#ifndef MTRT_SRC_PIPELINE_PIPELINERUNNER_H
#define MTRT_SRC_PIPELINE_PIPELINERUNNER_H

#include "host/Executor.h"
#include "pipeline/ScheduleRunner.h"

#include <memory>
#include <string>
#include <utility>
#include <vector>

namespace mtrt::pipeline {

/// ScheduleRunner's backend on the host: host executors over a
/// host::ParameterStore, values in host tensors, messages through the
/// world's sendAsync (which copies) and recv. The rank's stage functions
/// (forward, backward, eval) run one at a time, so they share one arena, as
/// large as the largest of theirs (host::SharedArena): their inputs, outputs
/// and the stash are host tensors outside it.
class HostStages {
public:
  using Tensor = host::Tensor;
  using Executor = host::Executor;

  HostStages(const Bundle &bundle, host::ParameterStore &parameters,
             host::ThreadPool &pool, comm::RankContext &rank);

  DType floatType() const { return floatType_; }
  /// An executor of `function` in the rank's shared arena, or in one of its
  /// own (a function run outside the schedule, made after the others ran).
  std::unique_ptr<Executor> executor(const std::string &function,
                                     bool sharedArena = true);
  /// The shared arena's bytes: the largest of its executors' arenas.
  size_t arenaBytes() const { return arena_->bytes(); }
  host::TensorView view(const Tensor &tensor) const {
    return {tensor.dtype, tensor.shape, tensor.buffer.data()};
  }
  /// Runs the function (the host keeps no stash in place: `slot` and
  /// `readsStash` are unused).
  std::vector<Tensor> run(Executor &executor,
                          const std::vector<host::TensorView> &inputs,
                          const MicroBatchKey &key, int64_t slot,
                          bool readsStash);
  double scalar(const Tensor &tensor) const;
  Tensor receive(int peer, const TensorType &type, const comm::CallInfo &info);
  void send(int peer, Tensor tensor, const comm::CallInfo &info);
  /// sendAsync copies: nothing to wait for.
  void sendsDone() {}
  void allReduceGradient(comm::Communicator &group, size_t parameter,
                         const comm::CallInfo &info);
  /// The runs' wall time since the last call.
  double takeComputeSeconds() { return std::exchange(computeSeconds_, 0.0); }

private:
  const Bundle *bundle_;
  host::ParameterStore *parameters_;
  host::ThreadPool *pool_;
  comm::RankContext *rank_;
  DType floatType_;
  double computeSeconds_ = 0;
  /// A pointer: ScheduleRunner moves the backend, its executors keep this.
  std::unique_ptr<host::SharedArena> arena_;
};

/// One rank of a pipeline bundle on the host (ScheduleRunner's contract).
/// Gradients accumulate into the host::ParameterStore.
class PipelineRunner : public ScheduleRunner<HostStages> {
public:
  /// Collective over the world (it makes the pipeline group). Throws Error.
  PipelineRunner(const Bundle &bundle, host::ParameterStore &parameters,
                 host::ThreadPool &pool, comm::RankContext &rank);

  /// The log line of every pipeline rank's memory for activations: the
  /// arena its stage functions share and the most stash it held at once;
  /// the largest of the data- and tensor-parallel replicas. What
  /// `megatron-compile --report memory` predicts per pipeline rank. A
  /// collective over the world.
  std::string describeMemory();
};

} // namespace mtrt::pipeline

#endif // MTRT_SRC_PIPELINE_PIPELINERUNNER_H
