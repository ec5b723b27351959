// Pipeline parallelism on the GPU: the CUDA backend of the pipeline schedule
// (pipeline/ScheduleRunner.h), its values in device memory.
#ifndef MTRT_SRC_CUDA_PIPELINESTAGES_H
#define MTRT_SRC_CUDA_PIPELINESTAGES_H

#include "cuda/Context.h"
#include "cuda/SharedArena.h"
#include "pipeline/ScheduleRunner.h"

#include <map>
#include <memory>
#include <set>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

namespace mtrt::cuda {

class DeviceCollective;
class Executor;
class ParameterStore;

/// Device buffers of a pipeline rank's activations and gradients,
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
/// type (f32 or an integer type) or its storage type (bf16): its own buffer,
/// which goes back to its pool when it is destroyed, or one it borrows (a
/// stash slot's).
class DeviceTensor {
public:
  DeviceTensor() = default;
  DeviceTensor(DType dtype, std::vector<int64_t> shape, BufferPool &pool);
  /// Borrows `data` (numElements * dtypeSize bytes), which outlives it.
  DeviceTensor(DType dtype, std::vector<int64_t> shape, void *data);
  ~DeviceTensor();
  DeviceTensor(DeviceTensor &&other) noexcept;
  DeviceTensor &operator=(DeviceTensor &&other) noexcept;

  DType dtype() const { return dtype_; }
  const std::vector<int64_t> &shape() const { return shape_; }
  int64_t numElements() const;
  void *data() const { return buffer_.data() ? buffer_.data() : borrowed_; }
  size_t bytes() const {
    return static_cast<size_t>(numElements()) * dtypeSize(dtype_);
  }

private:
  void release();

  DType dtype_ = DType::F32;
  std::vector<int64_t> shape_;
  BufferPool *pool_ = nullptr;
  DeviceBuffer buffer_;
  void *borrowed_ = nullptr;
};

/// pipeline::ScheduleRunner's backend on the GPU: the stage functions on
/// cuda::Executors over one cuda::ParameterStore (their backward passes
/// accumulate the gradients there), every activation, gradient and stashed
/// value kept in device memory.
///
/// Nothing waits on the host but the schedule's end (the loss): each run is
/// enqueued on the context's stream (Executor::run without `wait`), host
/// inputs (tokens, labels, the loss seed) go through pinned staging
/// buffers, and the compute time is measured by events around each run.
/// The fault word (ids outside their table met by a kernel) is read once,
/// at the schedule's end.
///
/// The stash stays in place: a forward's outputs but the first are copied
/// from its arena into its stash slot's buffers (one per executor, slot and
/// output, the same every iteration), and the backward binds them as its
/// inputs (Executor::run's `inputsOnDevice`), its CUDA graph captured once
/// per slot; the backward's other input (the output gradient or the loss
/// seed) is copied into a slot buffer of its own. In mixed precision each
/// side holds the stash in bf16 where its kernels can (Executor's
/// Bf16Boundary), and the copy into the slot converts to the backward's
/// type.
///
/// The rank's stage functions (forward, backward, eval) run one after
/// another on the context's stream, so they share one arena, as large as
/// the largest of theirs (SharedArena): what crosses from one run to a
/// later one (activations, gradients, the stash) lives in the pool's and
/// the slots' buffers, outside it, and the copies out of a run's arena are
/// enqueued before the next run writes there.
///
/// Messages, over NCCL (world.takesDeviceMemory()): one communicator per
/// directed pair of neighbouring pipeline ranks (split from the world at
/// construction), each on its own CUDA stream, on which the sender only
/// sends and the receiver only receives, in the schedule's order: a send
/// waits for its receiver only on its own stream, never in front of a
/// receive, so every schedule the compiler proved deadlock-free (sends
/// asynchronous, receives blocking) runs, interleaved and PP>2 included.
/// The buffers of sends stay alive until the schedule's end (sendsDone),
/// which waits for the senders' streams. The in-process communicator of the
/// one-GPU checks is staged through the host (DeviceCollective): its sends
/// copy, its receives block.
class PipelineStages {
public:
  using Tensor = DeviceTensor;
  using Executor = cuda::Executor;

  /// Collective over the world (the NCCL pairs' splits). Throws Error.
  PipelineStages(const Bundle &bundle, ParameterStore &parameters,
                 comm::RankContext &rank);
  PipelineStages(PipelineStages &&) noexcept;
  ~PipelineStages();

  DType floatType() const { return DType::F32; }
  /// An executor of `function` in the rank's shared arena, or in one of its
  /// own (a function run outside the schedule, made after the others ran:
  /// the shared arena's size is fixed by then).
  std::unique_ptr<Executor> executor(const std::string &function,
                                     bool sharedArena = true);
  /// The shared arena's bytes: the largest of its executors' arenas.
  size_t arenaBytes() const { return arena_->bytes(); }
  host::TensorView view(const Tensor &tensor) const {
    return {tensor.dtype(), tensor.shape(), tensor.data()};
  }
  std::vector<Tensor> run(Executor &executor,
                          const std::vector<host::TensorView> &inputs,
                          const MicroBatchKey &key, int64_t slot,
                          bool readsStash);
  double scalar(const Tensor &tensor) const;
  Tensor receive(int peer, const TensorType &type, const comm::CallInfo &info);
  void send(int peer, Tensor tensor, const comm::CallInfo &info);
  /// Waits for the sends, gives their buffers back to the pool, and reads
  /// the fault word. Throws Error (OUT_OF_RANGE) for a fault.
  void sendsDone();
  /// Enqueued on the context's stream, after the backward passes.
  void allReduceGradient(comm::Communicator &group, size_t parameter,
                         const comm::CallInfo &info);
  double takeComputeSeconds();

private:
  class PinnedStaging;
  class Events;
  /// The communicator a message to (from) world rank `peer` goes through,
  /// and the peer's rank in it.
  std::pair<comm::Communicator *, int> channel(int peer, bool sending);
  void makeChannels(const Bundle &bundle);
  /// The backward executor of a forward one made here, or nullptr.
  const Executor *backwardOf(const Executor &forward) const;
  /// The stash slot buffer (executor, slot, index) of `bytes`.
  void *slotBuffer(const Executor &executor, int64_t slot, size_t index,
                   size_t bytes);

  const Bundle *bundle_;
  ParameterStore *parameters_;
  Context *context_;
  comm::RankContext *rank_;
  std::unique_ptr<BufferPool> pool_;
  /// A pointer: ScheduleRunner moves the backend, its executors keep this.
  std::unique_ptr<SharedArena> arena_;
  std::unique_ptr<DeviceCollective> collective_;
  std::unique_ptr<PinnedStaging> staging_;
  /// Stash slot buffers by (executor, slot, index); their addresses.
  std::map<std::tuple<const Executor *, int64_t, size_t>, DeviceBuffer>
      slotBuffers_;
  std::set<const void *> slotAddresses_;
  /// The executors made here by function name, and each forward's
  /// backward's name.
  std::map<std::string, const Executor *> executors_;
  std::map<const Executor *, std::string> backwardOf_;
  /// A forward executor's first stash output: 1, or 2 after an aux_loss.
  std::map<const Executor *, size_t> stashFirst_;
  /// NCCL: the pair communicators by (sender, receiver) world rank.
  std::map<std::pair<int, int>, std::unique_ptr<comm::Communicator>>
      channels_;
  /// Sent straight through (NCCL), until sendsDone.
  std::vector<DeviceTensor> inFlight_;
  std::unique_ptr<Events> events_;
  /// Whether a run since the last sendsDone cleared the fault word.
  bool faultCleared_ = false;
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
