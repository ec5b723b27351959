// Pipeline parallelism on the GPU: the CUDA backend of the pipeline schedule
// (pipeline/ScheduleRunner.h), its values in device memory.
#ifndef MTRT_SRC_CUDA_PIPELINESTAGES_H
#define MTRT_SRC_CUDA_PIPELINESTAGES_H

#include "cuda/Context.h"
#include "pipeline/ScheduleRunner.h"

#include <map>
#include <memory>
#include <string>
#include <vector>

namespace mtrt::cuda {

class DeviceCollective;
class Executor;
class ParameterStore;

/// Device buffers of a pipeline rank's activations, gradients and stash,
/// reused from one micro-batch to the next (cudaMalloc and cudaFree
/// synchronize the device). A buffer is handed out again only after the
/// host has enqueued its last use on the context's one stream.
class BufferPool {
public:
  explicit BufferPool(std::string what) : what_(std::move(what)) {}
  /// A buffer of exactly `bytes` (a free one, or a new allocation).
  DeviceBuffer take(size_t bytes);
  void give(DeviceBuffer buffer);

private:
  std::string what_;
  std::multimap<size_t, DeviceBuffer> free_;
};

/// A value of a pipeline stage in device memory, of its function's declared
/// type (f32 or an integer type); its buffer goes back to its pool when it
/// is destroyed.
class DeviceTensor {
public:
  DeviceTensor() = default;
  DeviceTensor(DType dtype, std::vector<int64_t> shape, BufferPool &pool);
  ~DeviceTensor();
  DeviceTensor(DeviceTensor &&other) noexcept;
  DeviceTensor &operator=(DeviceTensor &&other) noexcept;

  DType dtype() const { return dtype_; }
  const std::vector<int64_t> &shape() const { return shape_; }
  int64_t numElements() const;
  void *data() const { return buffer_.data(); }
  size_t bytes() const { return buffer_.size(); }

private:
  DType dtype_ = DType::F32;
  std::vector<int64_t> shape_;
  BufferPool *pool_ = nullptr;
  DeviceBuffer buffer_;
};

/// pipeline::ScheduleRunner's backend on the GPU: the stage functions on
/// cuda::Executors over one cuda::ParameterStore (their backward passes
/// accumulate the gradients there), every activation, gradient and stashed
/// value kept in device memory: an executor's outputs are copied from its
/// arena into pooled buffers and read from there by the next function
/// (Executor::run's keepOutputs and device inputs).
///
/// Messages: through the world communicator on device buffers
/// (DeviceCollective): NCCL straight on the device pointers, ordered with
/// the context's stream by events; the in-process communicator of the
/// one-GPU checks staged through the host. NCCL runs one stream's calls in
/// order, so a send waits there for its receiver: a send and the receive
/// right after it from the same peer go as one sendRecv (Megatron-LM's
/// send_forward_recv_backward), and the buffers of asynchronous sends are
/// kept until the schedule's end (sendsDone), when the loss's all-reduce
/// has passed them on the communicator's stream. Staged, the same pair is a
/// sendAsync (which copies) and a recv, as on the host.
class PipelineStages {
public:
  using Tensor = DeviceTensor;
  using Executor = cuda::Executor;

  PipelineStages(const Bundle &bundle, ParameterStore &parameters,
                 comm::RankContext &rank);
  PipelineStages(PipelineStages &&) noexcept;
  ~PipelineStages();

  DType floatType() const { return DType::F32; }
  std::unique_ptr<Executor> executor(const std::string &function);
  host::TensorView view(const Tensor &tensor) const {
    return {tensor.dtype(), tensor.shape(), tensor.data()};
  }
  std::vector<Tensor> run(Executor &executor,
                          const std::vector<host::TensorView> &inputs,
                          uint64_t step);
  double scalar(const Tensor &tensor) const;
  Tensor receive(int peer, const TensorType &type, const comm::CallInfo &info);
  void send(int peer, Tensor tensor, const comm::CallInfo &info);
  Tensor exchange(int peer, Tensor tensor, const TensorType &type,
                  const comm::CallInfo &sendInfo,
                  const comm::CallInfo &recvInfo);
  /// Gives the sent buffers back to the pool.
  void sendsDone() { inFlight_.clear(); }

private:
  const Bundle *bundle_;
  ParameterStore *parameters_;
  Context *context_;
  comm::RankContext *rank_;
  std::unique_ptr<BufferPool> pool_;
  std::unique_ptr<DeviceCollective> collective_;
  /// Sent straight through (NCCL), until sendsDone.
  std::vector<DeviceTensor> inFlight_;
};

/// One rank of a pipeline bundle on the GPU (pipeline::ScheduleRunner's
/// contract).
class PipelineRunner : public pipeline::ScheduleRunner<PipelineStages> {
public:
  /// Collective over the world (it makes the pipeline group). Throws Error.
  PipelineRunner(const Bundle &bundle, ParameterStore &parameters,
                 comm::RankContext &rank);
};

} // namespace mtrt::cuda

#endif // MTRT_SRC_CUDA_PIPELINESTAGES_H
