// The host backend of the pipeline schedule.
#include "pipeline/PipelineRunner.h"

#include "host/Executor.h"
#include "host/ParameterStore.h"

#include <chrono>

namespace mtrt::pipeline {

HostStages::HostStages(const Bundle &bundle, host::ParameterStore &parameters,
                       host::ThreadPool &pool, comm::RankContext &rank)
    : bundle_(&bundle), parameters_(&parameters), pool_(&pool), rank_(&rank),
      floatType_(parameters.floatType()),
      arena_(std::make_unique<host::SharedArena>()) {}

std::unique_ptr<host::Executor>
HostStages::executor(const std::string &function, bool sharedArena) {
  return std::make_unique<host::Executor>(*bundle_, function, *parameters_,
                                          *pool_, rank_,
                                          sharedArena ? arena_.get() : nullptr);
}

std::vector<host::Tensor> HostStages::run(
    host::Executor &executor, const std::vector<host::TensorView> &inputs,
    const MicroBatchKey &key, int64_t /*slot*/, bool /*readsStash*/) {
  auto start = std::chrono::steady_clock::now();
  std::vector<host::Tensor> outputs = executor.run(inputs, key);
  computeSeconds_ += std::chrono::duration<double>(
                         std::chrono::steady_clock::now() - start)
                         .count();
  return outputs;
}

double HostStages::scalar(const host::Tensor &tensor) const {
  return tensor.dtype == DType::F64
             ? tensor.data<double>()[0]
             : static_cast<double>(tensor.data<float>()[0]);
}

host::Tensor HostStages::receive(int peer, const TensorType &type,
                                 const comm::CallInfo &info) {
  host::Tensor tensor(floatType_, type.shape);
  rank_->world().recv(tensor.buffer.data(), tensor.numElements(), floatType_,
                      peer, info);
  return tensor;
}

void HostStages::send(int peer, host::Tensor tensor,
                      const comm::CallInfo &info) {
  rank_->world().sendAsync(tensor.buffer.data(), tensor.numElements(),
                           floatType_, peer, info);
}

void HostStages::allReduceGradient(comm::Communicator &group,
                                   size_t parameter,
                                   const comm::CallInfo &info) {
  host::Tensor &gradient = parameters_->gradient(parameter);
  group.allReduce(gradient.buffer.data(), gradient.buffer.data(),
                  gradient.numElements(), floatType_, comm::ReduceOp::Sum,
                  info);
}

PipelineRunner::PipelineRunner(const Bundle &bundle,
                               host::ParameterStore &parameters,
                               host::ThreadPool &pool, comm::RankContext &rank)
    : ScheduleRunner<HostStages>(bundle,
                                 HostStages(bundle, parameters, pool, rank),
                                 rank) {}

std::string PipelineRunner::describeMemory() {
  // Per pipeline rank: the shared arena, the stash peak.
  const int64_t size = pipeline_.size;
  std::vector<double> figures(static_cast<size_t>(2 * size), 0.0);
  double *own = &figures[static_cast<size_t>(2 * pipelineRank_)];
  own[0] = double(stages_.arenaBytes());
  own[1] = double(peakStashBytes());
  rank_.world().allReduce<double>(
      figures.data(), figures.data(), static_cast<int64_t>(figures.size()),
      comm::ReduceOp::Max, comm::CallInfo{"pipeline memory", -1});
  std::string line = "pipeline memory per pipeline rank (the arena its "
                     "stage functions share + most stash held):";
  for (int64_t r = 0; r < size; ++r) {
    const double *f = &figures[static_cast<size_t>(2 * r)];
    line += " rank " + std::to_string(r) + ": " +
            std::to_string(static_cast<int64_t>(f[0])) + " + " +
            std::to_string(static_cast<int64_t>(f[1])) + " bytes;";
  }
  line.pop_back();
  return line;
}

} // namespace mtrt::pipeline
