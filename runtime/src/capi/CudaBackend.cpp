// The CUDA backend of a session: the device executors, parameter store and
// optimizer, with the host store as the mirror that initialization and
// checkpoints go through (as cuda::Trainer does).
#include "capi/SessionBackend.h"

#include "comm/RankContext.h"
#include "cuda/Context.h"
#include "cuda/CudaCheck.h"
#include "cuda/DataParallel.h"
#include "cuda/Executor.h"
#include "cuda/GradientUnscaler.h"
#include "cuda/Optimizer.h"
#include "cuda/ParameterStore.h"
#include "cuda/PipelineStages.h"
#include "host/ParameterStore.h"
#include "host/ThreadPool.h"
#include "train/DataParallelBuffer.h"
#include "train/DistributedOptimizer.h"
#include "train/TrainingLoop.h"

namespace mtrt::capi {

namespace {

cuda::ContextOptions contextOptions(const SessionBackendOptions &options) {
  if (options.device >= cuda::Context::deviceCount())
    throw Error(MTRT_STATUS_UNAVAILABLE,
                "CUDA device " + std::to_string(options.device) +
                    " does not exist: this machine has " +
                    std::to_string(cuda::Context::deviceCount()) +
                    " CUDA device(s)");
  cuda::ContextOptions context;
  context.device = options.device;
  context.tf32 = options.tf32;
  return context;
}

/// Whether the rank keeps AdamW's moments for its shard of the gradient
/// buffer only (the store then holds none).
bool distributed(const Bundle &bundle, comm::RankContext *rank) {
  return rank && bundle.hasGradientBuffer() &&
         bundle.gradientBuffer().distributedOptimizer;
}

class CudaBackend final : public SessionBackend {
public:
  CudaBackend(const Bundle &bundle, const SessionBackendOptions &options,
              comm::RankContext *rank)
      : context_(contextOptions(options)), pool_(0),
        hostParameters_(bundle, DType::F32,
                        rank ? rank->coordinates() : std::vector<int64_t>(),
                        !distributed(bundle, rank)),
        parameters_(bundle, context_, !distributed(bundle, rank)) {
    if (rank)
      rank->prepare(bundle);
    // Initialized on the CPU and uploaded, so that both backends start from
    // the same bits (cuda::Trainer does the same).
    hostParameters_.initialize(pool_, options.seed);
    parameters_.upload(hostParameters_);
    // A pipeline bundle has several ranks, so the session gave it one.
    if (bundle.pipeline())
      pipeline_ =
          std::make_unique<cuda::PipelineRunner>(bundle, parameters_, *rank);
    else
      trainStep_ = std::make_unique<cuda::Executor>(bundle, "train_step",
                                                    parameters_, rank);
    if (bundle.findFunction("eval_step"))
      evalStep_ = std::make_unique<cuda::Executor>(bundle, "eval_step",
                                                   parameters_, rank);
    // The data-parallel gradient reduction runs once per step, before the
    // optimizer, on the device (cuda::Trainer's pieces).
    if (rank && bundle.hasGradientBuffer())
      gradientBuffer_ = std::make_unique<cuda::DataParallelBuffer>(
          bundle, parameters_, *rank);
    if (distributed(bundle, rank)) {
      distributedOptimizer_ = std::make_unique<cuda::DistributedOptimizer>(
          parameters_, *gradientBuffer_, options.optimizer, *rank);
      // Checkpoints take the moments through the host's distributed
      // optimizer of the same rank (as cuda::Trainer's do).
      hostBuffer_ = std::make_unique<train::DataParallelBuffer>(
          bundle, hostParameters_, pool_, *rank);
      hostDistributed_ = std::make_unique<train::DistributedOptimizer>(
          hostParameters_, *hostBuffer_, pool_, options.optimizer, *rank);
    } else {
      optimizer_ = std::make_unique<cuda::Optimizer>(parameters_,
                                                     options.optimizer, rank);
    }
    rank_ = rank;
  }

  mtrt_backend_t backend() const override { return MTRT_BACKEND_CUDA; }
  int device() const override { return context_.device(); }
  bool hasEvalStep() const override { return evalStep_ || pipeline_; }

  double run(bool train, const BatchView &batch, const MicroBatchKey &key,
             train::ReportedLosses &reported) override {
    // The caller may have written parameters through a view since: the
    // GEMMs' bf16 copies follow the fp32 values.
    if (viewGiven_)
      parameters_.refreshBf16Copies();
    if (pipeline_) {
      // The schedule reads its micro-batches from host memory.
      BatchView host = hostBatch(batch, 0);
      return pipeline_->evaluate(
          [&](int64_t) { return std::pair(host.tokens, host.labels); }, 1);
    }
    cuda::Executor &executor = train ? *trainStep_ : *evalStep_;
    std::vector<host::Tensor> outputs =
        executor.run({batch.tokens, batch.labels}, key, batch.onDevice);
    if (train)
      train::addReportedLosses(executor.function(), outputs, reported);
    return static_cast<double>(outputs[0].data<float>()[0]);
  }
  double runSchedule(const std::vector<BatchView> &batches,
                     const MicroBatchKey &first, uint64_t globalBatch,
                     train::ReportedLosses &reported) override {
    if (viewGiven_)
      parameters_.refreshBf16Copies();
    double loss = pipeline_->train(scheduleSource(batches), first, globalBatch);
    reported = pipeline_->reportedLosses();
    return loss;
  }
  void zeroGradients() override { parameters_.zeroGradients(); }
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
    // The device's unscale and overflow check, as cuda::Trainer's.
    if (distributedOptimizer_)
      return distributedOptimizer_->unscaleAndCheckFinite(factor, iteration);
    if (!unscaler_)
      unscaler_ = std::make_unique<cuda::GradientUnscaler>(parameters_, rank_);
    return unscaler_->unscaleAndCheckFinite(factor, iteration);
  }
  train::OptimizerStepResult step(int64_t iteration,
                                  double gradScale) override {
    return distributedOptimizer_ ? distributedOptimizer_->step(iteration,
                                                               gradScale)
                                 : optimizer_->step(iteration, gradScale);
  }

  void *value(size_t i) override {
    viewGiven_ = true;
    return parameters_.value(i);
  }
  void copy(void *to, bool, const void *from, bool, size_t bytes) override {
    // Unified addressing tells host from device memory.
    MTRT_CUDA_CHECK(cudaMemcpyAsync(to, from, bytes, cudaMemcpyDefault,
                                    context_.stream()),
                    "copying a tensor of " + std::to_string(bytes) +
                        " bytes");
    if (parameters_.overlapsValues(to, bytes))
      parameters_.refreshBf16Copies();
    context_.synchronize("copying a tensor");
  }
  void *batchBuffer(int slot, size_t bytes) override {
    cuda::DeviceBuffer &buffer = batch_[slot];
    if (buffer.size() < bytes)
      buffer = cuda::DeviceBuffer(bytes, "a copied batch");
    return buffer.data();
  }
  host::ParameterStore &hostParameters() override {
    parameters_.download(hostParameters_);
    return hostParameters_;
  }
  void hostParametersChanged() override { parameters_.upload(hostParameters_); }
  std::vector<train::CheckpointTensor>
  checkpointTensors(bool severalRanks) override {
    if (distributedOptimizer_)
      distributedOptimizer_->download(*hostDistributed_);
    return train::storeCheckpointTensors(hostParameters(), severalRanks,
                                         hostDistributed_.get(),
                                         hostBuffer_.get());
  }
  void checkpointLoaded() override {
    hostParametersChanged();
    if (distributedOptimizer_)
      distributedOptimizer_->upload(*hostDistributed_);
  }
  void *stream() override { return context_.stream(); }

private:
  /// `batch` in host memory: itself, or copied into hostBatch_[slot].
  BatchView hostBatch(const BatchView &batch, int slot) {
    if (!batch.onDevice)
      return batch;
    size_t bytes = dtypeSize(batch.tokens.dtype);
    for (int64_t extent : batch.tokens.shape)
      bytes *= static_cast<size_t>(extent);
    BatchView host = batch;
    host.onDevice = false;
    host::TensorView *views[2] = {&host.tokens, &host.labels};
    for (int k = 0; k < 2; ++k) {
      std::vector<uint8_t> &buffer = hostBatch_[slot][k];
      buffer.resize(bytes);
      copy(buffer.data(), false, views[k]->data, true, bytes);
      views[k]->data = buffer.data();
    }
    return host;
  }

  cuda::Context context_;
  host::ThreadPool pool_;
  host::ParameterStore hostParameters_;
  cuda::ParameterStore parameters_;
  comm::RankContext *rank_ = nullptr;
  std::unique_ptr<cuda::Executor> trainStep_, evalStep_;
  std::unique_ptr<cuda::PipelineRunner> pipeline_;
  std::unique_ptr<cuda::DataParallelBuffer> gradientBuffer_;
  std::unique_ptr<cuda::Optimizer> optimizer_;
  std::unique_ptr<cuda::DistributedOptimizer> distributedOptimizer_;
  std::unique_ptr<train::DataParallelBuffer> hostBuffer_;
  std::unique_ptr<train::DistributedOptimizer> hostDistributed_;
  /// fp16: made at the first unscale.
  std::unique_ptr<cuda::GradientUnscaler> unscaler_;
  cuda::DeviceBuffer batch_[2];
  std::vector<uint8_t> hostBatch_[1][2];
  /// A parameter's storage was handed out (mtrt_session_parameter_view and
  /// the copies through it): runs refresh the bf16 copies first.
  bool viewGiven_ = false;
};

} // namespace

std::unique_ptr<SessionBackend>
createCudaBackend(const Bundle &bundle, const SessionBackendOptions &options,
                  comm::RankContext *rank) {
  return std::make_unique<CudaBackend>(bundle, options, rank);
}

} // namespace mtrt::capi
