// The host backend of the pipeline schedule.
#include "pipeline/PipelineRunner.h"

#include "host/Executor.h"
#include "host/ParameterStore.h"

#include <chrono>

namespace mtrt::pipeline {

HostStages::HostStages(const Bundle &bundle, host::ParameterStore &parameters,
                       host::ThreadPool &pool, comm::RankContext &rank)
    : bundle_(&bundle), parameters_(&parameters), pool_(&pool), rank_(&rank),
      floatType_(parameters.floatType()) {}

std::unique_ptr<host::Executor>
HostStages::executor(const std::string &function) {
  return std::make_unique<host::Executor>(*bundle_, function, *parameters_,
                                          *pool_, rank_);
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

PipelineRunner::PipelineRunner(const Bundle &bundle,
                               host::ParameterStore &parameters,
                               host::ThreadPool &pool, comm::RankContext &rank)
    : ScheduleRunner<HostStages>(bundle,
                                 HostStages(bundle, parameters, pool, rank),
                                 rank) {}

} // namespace mtrt::pipeline
