// The CUDA backend of the pipeline schedule: stage executors, device values,
// messages on device buffers.
#include "cuda/PipelineStages.h"

#include "cuda/CudaCheck.h"
#include "cuda/DeviceCollective.h"
#include "cuda/Executor.h"
#include "cuda/ParameterStore.h"

namespace mtrt::cuda {

DeviceBuffer BufferPool::take(size_t bytes) {
  auto found = free_.find(bytes);
  if (found == free_.end())
    return DeviceBuffer(bytes, what_);
  DeviceBuffer buffer = std::move(found->second);
  free_.erase(found);
  return buffer;
}

void BufferPool::give(DeviceBuffer buffer) {
  size_t bytes = buffer.size();
  free_.emplace(bytes, std::move(buffer));
}

DeviceTensor::DeviceTensor(DType dtype, std::vector<int64_t> shape,
                           BufferPool &pool)
    : dtype_(dtype), shape_(std::move(shape)), pool_(&pool) {
  buffer_ = pool.take(static_cast<size_t>(numElements()) * dtypeSize(dtype));
}

DeviceTensor::~DeviceTensor() {
  if (pool_ && buffer_.data())
    pool_->give(std::move(buffer_));
}

DeviceTensor::DeviceTensor(DeviceTensor &&other) noexcept
    : dtype_(other.dtype_), shape_(std::move(other.shape_)),
      pool_(other.pool_), buffer_(std::move(other.buffer_)) {
  other.pool_ = nullptr;
}

DeviceTensor &DeviceTensor::operator=(DeviceTensor &&other) noexcept {
  if (this != &other) {
    if (pool_ && buffer_.data())
      pool_->give(std::move(buffer_));
    dtype_ = other.dtype_;
    shape_ = std::move(other.shape_);
    pool_ = other.pool_;
    buffer_ = std::move(other.buffer_);
    other.pool_ = nullptr;
  }
  return *this;
}

int64_t DeviceTensor::numElements() const {
  int64_t count = 1;
  for (int64_t extent : shape_)
    count *= extent;
  return count;
}

PipelineStages::PipelineStages(const Bundle &bundle,
                               ParameterStore &parameters,
                               comm::RankContext &rank)
    : bundle_(&bundle), parameters_(&parameters),
      context_(&parameters.context()), rank_(&rank),
      pool_(std::make_unique<BufferPool>(
          "the pipeline activations, gradients and stash of bundle '" +
          bundle.name() + "'")),
      collective_(std::make_unique<DeviceCollective>(
          context_->stream(), "the pipeline of bundle '" + bundle.name() +
                                  "'")) {}

PipelineStages::PipelineStages(PipelineStages &&) noexcept = default;
PipelineStages::~PipelineStages() = default;

std::unique_ptr<Executor>
PipelineStages::executor(const std::string &function) {
  return std::make_unique<Executor>(*bundle_, function, *parameters_, rank_);
}

std::vector<DeviceTensor>
PipelineStages::run(Executor &executor,
                    const std::vector<host::TensorView> &inputs,
                    uint64_t step) {
  const Function &fn = executor.function();
  std::vector<DeviceTensor> outputs;
  outputs.reserve(fn.outputs.size());
  cudaStream_t stream = context_->stream();
  executor.run(inputs, step, /*inputsOnDevice=*/false,
               [&](size_t i, const void *data, size_t bytes) {
                 int64_t v = fn.outputs[i];
                 outputs.emplace_back(executor.storageType(v),
                                      fn.values[v].shape, *pool_);
                 if (outputs.back().bytes() != bytes)
                   throw Error(MTRT_STATUS_INTERNAL,
                               fn.name + ": output " + std::to_string(i) +
                                   " has " + std::to_string(bytes) +
                                   " bytes, its type " +
                                   std::to_string(outputs.back().bytes()));
                 MTRT_CUDA_CHECK(cudaMemcpyAsync(outputs.back().data(), data,
                                                 bytes,
                                                 cudaMemcpyDeviceToDevice,
                                                 stream),
                                 fn.name + ": keeping output " +
                                     std::to_string(i) + " on the device");
               });
  return outputs;
}

double PipelineStages::scalar(const DeviceTensor &tensor) const {
  float value = 0;
  MTRT_CUDA_CHECK(cudaMemcpyAsync(&value, tensor.data(), sizeof(float),
                                  cudaMemcpyDeviceToHost, context_->stream()),
                  "copying the pipeline's loss to the host");
  context_->synchronize("copying the pipeline's loss to the host");
  return static_cast<double>(value);
}

DeviceTensor PipelineStages::receive(int peer, const TensorType &type,
                                     const comm::CallInfo &info) {
  DeviceTensor tensor(floatType(), type.shape, *pool_);
  collective_->recv(rank_->world(), tensor.data(), tensor.numElements(),
                    tensor.dtype(), peer, info);
  return tensor;
}

void PipelineStages::send(int peer, DeviceTensor tensor,
                          const comm::CallInfo &info) {
  comm::Communicator &world = rank_->world();
  collective_->sendAsync(world, tensor.data(), tensor.numElements(),
                         tensor.dtype(), peer, info);
  if (world.takesDeviceMemory())
    inFlight_.push_back(std::move(tensor));
}

DeviceTensor PipelineStages::exchange(int peer, DeviceTensor tensor,
                                      const TensorType &type,
                                      const comm::CallInfo &sendInfo,
                                      const comm::CallInfo &recvInfo) {
  comm::Communicator &world = rank_->world();
  if (!world.takesDeviceMemory() || tensor.shape() != type.shape) {
    send(peer, std::move(tensor), sendInfo);
    return receive(peer, type, recvInfo);
  }
  DeviceTensor received(floatType(), type.shape, *pool_);
  std::string label =
      std::string(sendInfo.label) + " / " + std::string(recvInfo.label);
  collective_->sendRecv(world, tensor.data(), peer, received.data(), peer,
                        tensor.numElements(), tensor.dtype(),
                        comm::CallInfo{label, recvInfo.step});
  // The stream waits for the exchange: `tensor` may go back to the pool.
  return received;
}

PipelineRunner::PipelineRunner(const Bundle &bundle,
                               ParameterStore &parameters,
                               comm::RankContext &rank)
    : pipeline::ScheduleRunner<PipelineStages>(
          bundle, PipelineStages(bundle, parameters, rank), rank) {}

} // namespace mtrt::cuda
