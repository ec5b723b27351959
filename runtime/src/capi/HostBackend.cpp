// The host backend of a session: the reference executors, parameter store
// and optimizer on the CPU.
#include "capi/SessionBackend.h"

#include "comm/RankContext.h"
#include "host/Executor.h"
#include "host/ParameterStore.h"
#include "host/ThreadPool.h"
#include "pipeline/PipelineRunner.h"
#include "train/DataParallelBuffer.h"
#include "train/DistributedOptimizer.h"
#include "train/TrainingLoop.h"

#include <cstring>

namespace mtrt::capi {

namespace {

class HostBackend final : public SessionBackend {
public:
  HostBackend(const Bundle &bundle, const SessionBackendOptions &options,
              comm::RankContext *rank)
      : pool_(static_cast<unsigned>(options.threads)),
        parameters_(bundle, DType::F32,
                    rank ? rank->coordinates() : std::vector<int64_t>(),
                    !distributed(bundle, rank)) {
    if (rank)
      rank->prepare(bundle);
    // A pipeline bundle has several ranks, so the session gave it one.
    if (bundle.pipeline())
      pipeline_ = std::make_unique<pipeline::PipelineRunner>(
          bundle, parameters_, pool_, *rank);
    else
      trainStep_ = std::make_unique<host::Executor>(bundle, "train_step",
                                                    parameters_, pool_, rank);
    if (bundle.findFunction("eval_step"))
      evalStep_ = std::make_unique<host::Executor>(bundle, "eval_step",
                                                   parameters_, pool_, rank);
    // The data-parallel gradient reduction runs once per step, before the
    // optimizer (docs/BundleFormat.md, "Gradient reduction").
    if (rank && bundle.hasGradientBuffer())
      gradientBuffer_ = std::make_unique<train::DataParallelBuffer>(
          bundle, parameters_, pool_, *rank);
    if (distributed(bundle, rank))
      distributedOptimizer_ = std::make_unique<train::DistributedOptimizer>(
          parameters_, *gradientBuffer_, pool_, options.optimizer, *rank);
    else
      optimizer_ = std::make_unique<train::Optimizer>(parameters_, pool_,
                                                      options.optimizer, rank);
    parameters_.initialize(pool_, options.seed);
  }

  mtrt_backend_t backend() const override { return MTRT_BACKEND_HOST; }
  int device() const override { return 0; }
  bool hasEvalStep() const override { return evalStep_ || pipeline_; }

  double run(bool train, const BatchView &batch, const MicroBatchKey &key,
             train::ReportedLosses &reported) override {
    if (pipeline_)
      return pipeline_->evaluate(
          [&](int64_t) { return std::pair(batch.tokens, batch.labels); }, 1);
    host::Executor &executor = train ? *trainStep_ : *evalStep_;
    std::vector<host::Tensor> outputs =
        executor.run({batch.tokens, batch.labels}, key);
    if (train)
      train::addReportedLosses(executor.function(), outputs, reported);
    return static_cast<double>(outputs[0].data<float>()[0]);
  }
  double runSchedule(const std::vector<BatchView> &batches,
                     const MicroBatchKey &first, uint64_t globalBatch,
                     train::ReportedLosses &reported) override {
    double loss = pipeline_->train(scheduleSource(batches), first, globalBatch);
    reported = pipeline_->reportedLosses();
    return loss;
  }
  void zeroGradients() override { parameters_.zeroGradients(pool_); }
  void setLossScale(double scale) override {
    if (pipeline_)
      pipeline_->setLossScale(scale);
    else
      trainStep_->setLossScale(scale);
  }
  void reduceGradients() override {
    if (gradientBuffer_)
      gradientBuffer_->reduceGradients();
  }
  bool unscaleAndCheckFinite(double factor, int64_t iteration) override {
    return distributedOptimizer_
               ? distributedOptimizer_->unscaleAndCheckFinite(factor,
                                                              iteration)
               : optimizer_->unscaleAndCheckFinite(factor, iteration);
  }
  train::OptimizerStepResult step(int64_t iteration,
                                  double gradScale) override {
    return distributedOptimizer_
               ? distributedOptimizer_->step(iteration, gradScale)
               : optimizer_->step(iteration, gradScale);
  }

  void *value(size_t i) override { return parameters_.value(i).buffer.data(); }
  void copy(void *to, bool, const void *from, bool, size_t bytes) override {
    std::memcpy(to, from, bytes);
  }
  void *batchBuffer(int, size_t) override {
    throw Error(MTRT_STATUS_INTERNAL, "the host backend has no device memory");
  }
  host::ParameterStore &hostParameters() override { return parameters_; }
  void hostParametersChanged() override {}
  std::vector<train::CheckpointTensor>
  checkpointTensors(bool severalRanks) override {
    return train::storeCheckpointTensors(parameters_, severalRanks,
                                         distributedOptimizer_.get(),
                                         gradientBuffer_.get());
  }
  // The tensors point into the store and the optimizer: nothing to take.
  void checkpointLoaded() override {}
  void *stream() override { return nullptr; }

private:
  static bool distributed(const Bundle &bundle, comm::RankContext *rank) {
    return rank && bundle.hasGradientBuffer() &&
           bundle.gradientBuffer().distributedOptimizer;
  }

  host::ThreadPool pool_;
  host::ParameterStore parameters_;
  std::unique_ptr<host::Executor> trainStep_, evalStep_;
  std::unique_ptr<pipeline::PipelineRunner> pipeline_;
  std::unique_ptr<train::DataParallelBuffer> gradientBuffer_;
  std::unique_ptr<train::Optimizer> optimizer_;
  std::unique_ptr<train::DistributedOptimizer> distributedOptimizer_;
};

} // namespace

std::unique_ptr<SessionBackend>
createHostBackend(const Bundle &bundle, const SessionBackendOptions &options,
                  comm::RankContext *rank) {
  return std::make_unique<HostBackend>(bundle, options, rank);
}

} // namespace mtrt::capi
