// The CUDA backend of a session: the device executors, parameter store and
// optimizer, with the host store as the mirror that initialization and
// checkpoints go through (as cuda::Trainer does).
#include "capi/SessionBackend.h"

#include "cuda/Context.h"
#include "cuda/CudaCheck.h"
#include "cuda/Executor.h"
#include "cuda/GradientUnscaler.h"
#include "cuda/Optimizer.h"
#include "cuda/ParameterStore.h"
#include "host/ParameterStore.h"
#include "host/ThreadPool.h"

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

class CudaBackend final : public SessionBackend {
public:
  CudaBackend(const Bundle &bundle, const SessionBackendOptions &options)
      : context_(contextOptions(options)), pool_(0),
        hostParameters_(bundle, DType::F32),
        parameters_(bundle, context_) {
    // Initialized on the CPU and uploaded, so that both backends start from
    // the same bits (cuda::Trainer does the same).
    hostParameters_.initialize(pool_, options.seed);
    parameters_.upload(hostParameters_);
    trainStep_ =
        std::make_unique<cuda::Executor>(bundle, "train_step", parameters_);
    if (bundle.findFunction("eval_step"))
      evalStep_ =
          std::make_unique<cuda::Executor>(bundle, "eval_step", parameters_);
    optimizer_ =
        std::make_unique<cuda::Optimizer>(parameters_, options.optimizer);
  }

  mtrt_backend_t backend() const override { return MTRT_BACKEND_CUDA; }
  int device() const override { return context_.device(); }
  bool hasEvalStep() const override { return evalStep_ != nullptr; }

  double run(bool train, const BatchView &batch,
             const MicroBatchKey &key) override {
    cuda::Executor &executor = train ? *trainStep_ : *evalStep_;
    // The caller may have written parameters through a view since: the
    // GEMMs' bf16 copies follow the fp32 values.
    if (viewGiven_)
      parameters_.refreshBf16Copies();
    std::vector<host::Tensor> outputs =
        executor.run({batch.tokens, batch.labels}, key, batch.onDevice);
    return static_cast<double>(outputs[0].data<float>()[0]);
  }
  void zeroGradients() override { parameters_.zeroGradients(); }
  void setLossScale(double scale) override {
    trainStep_->setLossScale(scale);
  }
  void reduceGradients() override {}
  bool unscaleAndCheckFinite(double factor, int64_t iteration) override {
    // The device's unscale and overflow check, as cuda::Trainer's.
    if (!unscaler_)
      unscaler_ = std::make_unique<cuda::GradientUnscaler>(parameters_);
    return unscaler_->unscaleAndCheckFinite(factor, iteration);
  }
  train::OptimizerStepResult step(int64_t iteration,
                                  double gradScale) override {
    return optimizer_->step(iteration, gradScale);
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
  std::vector<train::CheckpointTensor> checkpointTensors(bool) override {
    return train::storeCheckpointTensors(hostParameters(), false);
  }
  void checkpointLoaded() override { hostParametersChanged(); }
  void *stream() override { return context_.stream(); }

private:
  cuda::Context context_;
  host::ThreadPool pool_;
  host::ParameterStore hostParameters_;
  cuda::ParameterStore parameters_;
  std::unique_ptr<cuda::Executor> trainStep_, evalStep_;
  std::unique_ptr<cuda::Optimizer> optimizer_;
  /// fp16: made at the first unscale.
  std::unique_ptr<cuda::GradientUnscaler> unscaler_;
  cuda::DeviceBuffer batch_[2];
  /// A parameter's storage was handed out (mtrt_session_parameter_view and
  /// the copies through it): runs refresh the bf16 copies first.
  bool viewGiven_ = false;
};

} // namespace

std::unique_ptr<SessionBackend>
createCudaBackend(const Bundle &bundle, const SessionBackendOptions &options) {
  return std::make_unique<CudaBackend>(bundle, options);
}

} // namespace mtrt::capi
