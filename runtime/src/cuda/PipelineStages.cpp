// The CUDA backend of the pipeline schedule: stage executors, device values,
// messages on device buffers.
#include "cuda/PipelineStages.h"

#include "cuda/CudaCheck.h"
#include "cuda/DeviceCollective.h"
#include "cuda/DeviceMemory.h"
#include "cuda/Executor.h"
#include "cuda/ParameterStore.h"
#include "cuda/PeerCollective.h"
#include "cuda/kernels/Kernels.h"

#include <algorithm>
#include <cstring>

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
  buffer_ = pool.take(bytes());
}

DeviceTensor::DeviceTensor(DType dtype, std::vector<int64_t> shape,
                           void *data)
    : dtype_(dtype), shape_(std::move(shape)), borrowed_(data) {}

DeviceTensor::~DeviceTensor() { release(); }

void DeviceTensor::release() {
  if (pool_ && buffer_.data())
    pool_->give(std::move(buffer_));
  pool_ = nullptr;
  borrowed_ = nullptr;
}

DeviceTensor::DeviceTensor(DeviceTensor &&other) noexcept
    : dtype_(other.dtype_), shape_(std::move(other.shape_)),
      pool_(other.pool_), buffer_(std::move(other.buffer_)),
      borrowed_(other.borrowed_) {
  other.pool_ = nullptr;
  other.borrowed_ = nullptr;
}

DeviceTensor &DeviceTensor::operator=(DeviceTensor &&other) noexcept {
  if (this != &other) {
    release();
    dtype_ = other.dtype_;
    shape_ = std::move(other.shape_);
    pool_ = other.pool_;
    buffer_ = std::move(other.buffer_);
    borrowed_ = other.borrowed_;
    other.pool_ = nullptr;
    other.borrowed_ = nullptr;
  }
  return *this;
}

int64_t DeviceTensor::numElements() const {
  int64_t count = 1;
  for (int64_t extent : shape_)
    count *= extent;
  return count;
}

namespace {

size_t viewBytes(const host::TensorView &view) {
  int64_t count = 1;
  for (int64_t extent : view.shape)
    count *= extent;
  return static_cast<size_t>(count) * dtypeSize(view.dtype);
}

/// The bytes of the largest input a pipeline's stage function takes from
/// the host: token ids and labels (integers), the loss seed (a scalar).
size_t largestHostInput(const Bundle &bundle) {
  size_t largest = sizeof(double);
  for (const Function &fn : bundle.functions())
    for (int64_t v : fn.inputs) {
      const TensorType &type = fn.values[static_cast<size_t>(v)];
      if (!isFloatingPoint(type.dtype) || type.numElements == 1)
        largest = std::max(largest, static_cast<size_t>(type.numElements) *
                                        dtypeSize(type.dtype));
    }
  return largest;
}

} // namespace

/// Pinned host copies of a run's host inputs, so that their uploads do not
/// wait for the stream (a copy from pageable memory does): a ring of
/// buffers, each reused once the stream has passed the run that read it.
/// Every buffer is allocated when the ring is made, as large as the
/// largest host input: cudaHostAlloc and cudaFreeHost wait for the whole
/// device, and while another in-process rank's graph spins at a PeerGroup
/// barrier for a rank that has not launched yet, such a call never
/// returns (bench/NOTES.md, session 20: a pipeline stage's eval input grew
/// a buffer that had held a loss seed).
class PipelineStages::PinnedStaging {
public:
  explicit PinnedStaging(size_t entryBytes) {
    for (Entry &entry : entries_) {
      MTRT_CUDA_CHECK(
          cudaHostAlloc(&entry.host, entryBytes, cudaHostAllocDefault),
          "allocating " + std::to_string(entryBytes) +
              " bytes of pinned memory for the pipeline's inputs");
      entry.bytes = entryBytes;
    }
  }

  ~PinnedStaging() {
    for (Entry &entry : entries_) {
      if (entry.used)
        (void)cudaEventDestroy(entry.used);
      if (entry.host)
        (void)cudaFreeHost(entry.host);
    }
  }

  /// A pinned copy of data[bytes], valid until the work enqueued before the
  /// next commit() has run.
  const void *stage(const void *data, size_t bytes) {
    Entry &entry = entries_[next_];
    pending_.push_back(next_);
    next_ = (next_ + 1) % entries_.size();
    if (entry.recorded)
      MTRT_CUDA_CHECK(cudaEventSynchronize(entry.used),
                      "waiting for a pipeline input's staging buffer");
    entry.recorded = false;
    if (!entry.used)
      MTRT_CUDA_CHECK(
          cudaEventCreateWithFlags(&entry.used, cudaEventDisableTiming),
          "creating a pipeline staging event");
    if (entry.bytes < bytes) {
      PeerGroup::Setup setup;
      if (entry.host)
        MTRT_CUDA_CHECK(cudaFreeHost(entry.host),
                        "freeing a pipeline staging buffer");
      entry.host = nullptr;
      entry.bytes = 0;
      MTRT_CUDA_CHECK(cudaHostAlloc(&entry.host, bytes, cudaHostAllocDefault),
                      "allocating " + std::to_string(bytes) +
                          " bytes of pinned memory for a pipeline input");
      entry.bytes = bytes;
    }
    std::memcpy(entry.host, data, bytes);
    return entry.host;
  }

  /// The copies staged since the last commit are read by work enqueued on
  /// `stream` so far.
  void commit(cudaStream_t stream) {
    for (size_t index : pending_) {
      MTRT_CUDA_CHECK(cudaEventRecord(entries_[index].used, stream),
                      "recording a pipeline staging event");
      entries_[index].recorded = true;
    }
    pending_.clear();
  }

private:
  struct Entry {
    void *host = nullptr;
    size_t bytes = 0;
    cudaEvent_t used = nullptr;
    bool recorded = false;
  };
  // More than a run's host inputs (tokens, labels, the loss seed).
  std::vector<Entry> entries_ = std::vector<Entry>(16);
  size_t next_ = 0;
  std::vector<size_t> pending_;
};

/// Events around each run of a schedule (the compute time), and the one that
/// orders the senders' streams before the context's at the schedule's end.
class PipelineStages::Events {
public:
  ~Events() {
    for (auto &[begin, end] : runs_) {
      (void)cudaEventDestroy(begin);
      (void)cudaEventDestroy(end);
    }
    if (sent_)
      (void)cudaEventDestroy(sent_);
  }

  void recordBegin(cudaStream_t stream) {
    if (used_ == runs_.size()) {
      std::pair<cudaEvent_t, cudaEvent_t> pair{};
      MTRT_CUDA_CHECK(cudaEventCreate(&pair.first),
                      "creating a pipeline timing event");
      runs_.push_back(pair);
      MTRT_CUDA_CHECK(cudaEventCreate(&runs_.back().second),
                      "creating a pipeline timing event");
    }
    MTRT_CUDA_CHECK(cudaEventRecord(runs_[used_].first, stream),
                    "recording a pipeline timing event");
  }
  void recordEnd(cudaStream_t stream) {
    MTRT_CUDA_CHECK(cudaEventRecord(runs_[used_].second, stream),
                    "recording a pipeline timing event");
    ++used_;
  }
  /// Seconds between each begin and its end since the last call (waits).
  double takeSeconds() {
    double seconds = 0;
    if (used_)
      MTRT_CUDA_CHECK(cudaEventSynchronize(runs_[used_ - 1].second),
                      "waiting for the pipeline's runs");
    for (size_t i = 0; i < used_; ++i) {
      float ms = 0;
      MTRT_CUDA_CHECK(
          cudaEventElapsedTime(&ms, runs_[i].first, runs_[i].second),
          "timing the pipeline's runs");
      seconds += ms / 1e3;
    }
    used_ = 0;
    return seconds;
  }
  /// `waiter` waits for the work enqueued on `stream` so far.
  void order(cudaStream_t stream, cudaStream_t waiter) {
    if (!sent_)
      MTRT_CUDA_CHECK(cudaEventCreateWithFlags(&sent_, cudaEventDisableTiming),
                      "creating a pipeline event");
    MTRT_CUDA_CHECK(cudaEventRecord(sent_, stream),
                    "recording the pipeline's sends");
    MTRT_CUDA_CHECK(cudaStreamWaitEvent(waiter, sent_, 0),
                    "waiting for the pipeline's sends");
  }

private:
  std::vector<std::pair<cudaEvent_t, cudaEvent_t>> runs_;
  size_t used_ = 0;
  cudaEvent_t sent_ = nullptr;
};

PipelineStages::PipelineStages(const Bundle &bundle,
                               ParameterStore &parameters,
                               comm::RankContext &rank)
    : bundle_(&bundle), parameters_(&parameters),
      context_(&parameters.context()), rank_(&rank),
      pool_(std::make_unique<BufferPool>(
          "the pipeline activations and gradients of bundle '" +
          bundle.name() + "'")),
      arena_(std::make_unique<SharedArena>(
          "the arena of the pipeline stages of bundle '" + bundle.name() +
          "'")),
      collective_(std::make_unique<DeviceCollective>(
          context_->stream(),
          "the pipeline of bundle '" + bundle.name() + "'")),
      staging_(std::make_unique<PinnedStaging>(largestHostInput(bundle))),
      events_(std::make_unique<Events>()) {
  makeChannels(bundle);
}

PipelineStages::PipelineStages(PipelineStages &&) noexcept = default;
PipelineStages::~PipelineStages() = default;

void PipelineStages::makeChannels(const Bundle &bundle) {
  comm::Communicator &world = rank_->world();
  if (!world.takesDeviceMemory())
    return;
  const PipelineInfo &pipeline = *bundle.pipeline();
  int64_t size = pipeline.size;
  std::vector<int64_t> coordinates = rank_->coordinates();
  int64_t mine = coordinates[pipeline.axis];
  auto worldRank = [&](int64_t pipelineRank) {
    std::vector<int64_t> at = coordinates;
    at[pipeline.axis] = pipelineRank;
    int64_t linear = 0;
    for (size_t a = 0; a < at.size(); ++a)
      linear = linear * rank_->gridShape()[a] + at[a];
    return static_cast<int>(linear);
  };
  // The replicas (data- and tensor-parallel coordinates) split at once.
  int replica = worldRank(0);
  std::set<std::pair<int64_t, int64_t>> made;
  for (int64_t from = 0; from < size; ++from) {
    for (int64_t step : {int64_t{1}, size - 1}) {
      int64_t to = (from + step) % size;
      if (to == from || !made.insert({from, to}).second)
        continue;
      bool member = mine == from || mine == to;
      std::string name = "pp" + std::to_string(from) + ">" + std::to_string(to);
      std::unique_ptr<comm::Communicator> pair = world.split(
          member ? replica : comm::Communicator::kNoColor, mine == from ? 0 : 1,
          name, comm::CallInfo{"the pipeline's message pairs", -1});
      if (!member)
        continue;
      if (!pair || pair->size() != 2 || !pair->takesDeviceMemory())
        throw Error(MTRT_STATUS_INTERNAL,
                    "the pipeline's message pair " + name + " of world rank " +
                        std::to_string(world.rank()) +
                        " is not a two-rank NCCL communicator");
      // One message now: NCCL connects a pair at its first call, which
      // waits on the host for the peer; here every rank meets its peers in
      // the same order.
      DeviceBuffer word(sizeof(float), "the pipeline's first message");
      comm::CallInfo first{"the first message of " + name, -1};
      if (mine == from)
        collective_->sendAsync(*pair, word.data(), 1, DType::F32, 1, first);
      else
        collective_->recv(*pair, word.data(), 1, DType::F32, 0, first);
      MTRT_CUDA_CHECK(cudaStreamSynchronize(
                          static_cast<cudaStream_t>(pair->deviceStream())),
                      "the first message of the pipeline's pair " + name);
      context_->synchronize("the first message of the pipeline's pair " +
                            name);
      channels_[{worldRank(from), worldRank(to)}] = std::move(pair);
    }
  }
}

std::pair<comm::Communicator *, int> PipelineStages::channel(int peer,
                                                             bool sending) {
  comm::Communicator &world = rank_->world();
  if (channels_.empty())
    return {&world, peer};
  int me = world.rank();
  auto found = channels_.find(sending ? std::make_pair(me, peer)
                                      : std::make_pair(peer, me));
  if (found == channels_.end())
    throw Error(MTRT_STATUS_INTERNAL,
                "the pipeline has no message pair from world rank " +
                    std::to_string(sending ? me : peer) + " to " +
                    std::to_string(sending ? peer : me));
  // The sender is rank 0 of its pair, the receiver rank 1.
  return {found->second.get(), sending ? 1 : 0};
}

std::unique_ptr<Executor> PipelineStages::executor(const std::string &function,
                                                   bool sharedArena) {
  // Mixed precision: the stash (a forward's outputs but the first, its
  // backward's inputs but the last) may be held in bf16 on either side.
  Executor::Bf16Boundary boundary;
  const auto &functions = bundle_->functions();
  const PipelineStageInfo *forwardOf = nullptr;
  for (const PipelineStageInfo &info : bundle_->pipeline()->stages) {
    const Function &forward = functions[info.forward];
    const Function &backward = functions[info.backward];
    if (forward.name == function) {
      // The stash follows the activation and, on a stage with MoE layers,
      // its reported losses (`aux_loss` and the logged ones: losses, not
      // stash).
      for (size_t i = info.leadingOutputs(); i < forward.outputs.size(); ++i)
        boundary.outputs.push_back(i);
      forwardOf = &info;
    }
    if (backward.name == function)
      for (size_t i = 0; i + 1 < backward.inputs.size(); ++i)
        boundary.inputs.push_back(i);
  }
  auto made = std::make_unique<Executor>(*bundle_, function, *parameters_,
                                         rank_, std::move(boundary),
                                         sharedArena ? arena_.get() : nullptr);
  executors_[function] = made.get();
  if (forwardOf) {
    backwardOf_[made.get()] = functions[forwardOf->backward].name;
    stashFirst_[made.get()] = forwardOf->leadingOutputs();
  }
  return made;
}

const Executor *PipelineStages::backwardOf(const Executor &forward) const {
  auto name = backwardOf_.find(&forward);
  if (name == backwardOf_.end())
    return nullptr;
  auto found = executors_.find(name->second);
  return found == executors_.end() ? nullptr : found->second;
}

void *PipelineStages::slotBuffer(const Executor &executor, int64_t slot,
                                 size_t index, size_t bytes) {
  auto key = std::make_tuple(&executor, slot, index);
  auto found = slotBuffers_.find(key);
  if (found == slotBuffers_.end()) {
    found = slotBuffers_
                .emplace(key, DeviceBuffer(bytes, "stash slot " +
                                                      std::to_string(slot) +
                                                      " of " +
                                                      executor.function().name))
                .first;
    slotAddresses_.insert(found->second.data());
  }
  if (found->second.size() != bytes)
    throw Error(MTRT_STATUS_INTERNAL,
                executor.function().name + ": stash slot " +
                    std::to_string(slot) + " value " + std::to_string(index) +
                    " has " + std::to_string(found->second.size()) +
                    " bytes, the run " + std::to_string(bytes));
  return found->second.data();
}

std::vector<DeviceTensor>
PipelineStages::run(Executor &executor,
                    const std::vector<host::TensorView> &inputs,
                    const MicroBatchKey &key, int64_t slot, bool readsStash) {
  const Function &fn = executor.function();
  cudaStream_t stream = context_->stream();
  if (!faultCleared_) {
    context_->resetFault();
    faultCleared_ = true;
  }
  // Host inputs through pinned memory; a backward's inputs all in slot
  // buffers, bound in place.
  std::vector<host::TensorView> bound = inputs;
  for (size_t i = 0; i < inputs.size(); ++i) {
    size_t bytes = viewBytes(inputs[i]);
    if (!bytes || (readsStash && slotAddresses_.count(inputs[i].data)))
      continue;
    const void *source = isDeviceMemory(inputs[i].data)
                             ? inputs[i].data
                             : staging_->stage(inputs[i].data, bytes);
    if (!readsStash) {
      bound[i].data = source;
      continue;
    }
    void *place = slotBuffer(executor, slot, i, bytes);
    MTRT_CUDA_CHECK(cudaMemcpyAsync(place, source, bytes, cudaMemcpyDefault,
                                    stream),
                    fn.name + ": placing input " + std::to_string(i) +
                        " in stash slot " + std::to_string(slot));
    bound[i].data = place;
  }
  std::vector<DeviceTensor> outputs;
  outputs.reserve(fn.outputs.size());
  const Executor *backward = readsStash ? nullptr : backwardOf(executor);
  auto first = stashFirst_.find(&executor);
  size_t stashFirst = first == stashFirst_.end() ? 1 : first->second;
  events_->recordBegin(stream);
  executor.run(
      bound, key, /*inputsOnDevice=*/readsStash,
      [&](size_t i, const void *data, size_t bytes) {
        int64_t v = fn.outputs[i];
        DType from = executor.storageType(v);
        std::string what = fn.name + ": keeping output " + std::to_string(i) +
                           " on the device";
        if (backward && i >= stashFirst) {
          // A forward's outputs after its activation (and aux_loss) are
          // its stash: in its slot, of the type the backward reads it in.
          const Function &reader = backward->function();
          DType to = backward->storageType(reader.inputs[i - stashFirst]);
          int64_t count = fn.values[v].numElements;
          outputs.emplace_back(
              to, fn.values[v].shape,
              slotBuffer(executor, slot, i,
                         static_cast<size_t>(count) * dtypeSize(to)));
          void *place = outputs.back().data();
          if (from == to)
            MTRT_CUDA_CHECK(cudaMemcpyAsync(place, data, bytes,
                                            cudaMemcpyDeviceToDevice, stream),
                            what);
          else if (from == DType::F32 && to == DType::BF16)
            roundToBf16(stream, count,
                                 static_cast<const float *>(data),
                                 static_cast<__nv_bfloat16 *>(place));
          else if (from == DType::BF16 && to == DType::F32)
            widenBf16(stream, count,
                               static_cast<const __nv_bfloat16 *>(data),
                               static_cast<float *>(place));
          else
            throw Error(MTRT_STATUS_INTERNAL,
                        what + ": " + dtypeName(from) + " to " +
                            dtypeName(to));
          MTRT_CUDA_CHECK(cudaGetLastError(), what);
          return;
        }
        outputs.emplace_back(from, fn.values[v].shape, *pool_);
        if (outputs.back().bytes() != bytes)
          throw Error(MTRT_STATUS_INTERNAL,
                      fn.name + ": output " + std::to_string(i) + " has " +
                          std::to_string(bytes) + " bytes, its type " +
                          std::to_string(outputs.back().bytes()));
        MTRT_CUDA_CHECK(cudaMemcpyAsync(outputs.back().data(), data, bytes,
                                        cudaMemcpyDeviceToDevice, stream),
                        what);
      },
      /*wait=*/false);
  events_->recordEnd(stream);
  staging_->commit(stream);
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
  // Typed bundles send what the stage functions declare (bf16 boundaries
  // under mixed precision); older ones send the float type.
  DType dtype = bundle_->typedPrecision() && isFloatingPoint(type.dtype)
                    ? type.dtype
                    : floatType();
  DeviceTensor tensor(dtype, type.shape, *pool_);
  auto [comm, from] = channel(peer, /*sending=*/false);
  collective_->recv(*comm, tensor.data(), tensor.numElements(),
                    tensor.dtype(), from, info);
  return tensor;
}

void PipelineStages::send(int peer, DeviceTensor tensor,
                          const comm::CallInfo &info) {
  auto [comm, to] = channel(peer, /*sending=*/true);
  collective_->sendAsync(*comm, tensor.data(), tensor.numElements(),
                         tensor.dtype(), to, info);
  if (comm->takesDeviceMemory())
    inFlight_.push_back(std::move(tensor));
}

void PipelineStages::sendsDone() {
  // The sends' buffers go back to the pool once the context's stream has
  // waited for the senders' streams: later work there may reuse them.
  cudaStream_t stream = context_->stream();
  int me = rank_->world().rank();
  for (auto &[pair, comm] : channels_)
    if (pair.first == me)
      events_->order(static_cast<cudaStream_t>(comm->deviceStream()), stream);
  inFlight_.clear();
  if (!faultCleared_)
    return;
  faultCleared_ = false;
  if (unsigned tag = context_->readFault())
    throw Error(MTRT_STATUS_OUT_OF_RANGE,
                "bundle '" + bundle_->name() + "': an id or label outside " +
                    "its table reached a pipeline stage's kernel on the " +
                    "device (fault tag " + std::to_string(tag) +
                    "; it was skipped): the data must be tokenized for this " +
                    "vocabulary");
}

void PipelineStages::allReduceGradient(comm::Communicator &group,
                                       size_t parameter,
                                       const comm::CallInfo &info) {
  float *gradient = parameters_->gradient(parameter);
  collective_->allReduce(group, gradient, gradient,
                         parameters_->count(parameter), DType::F32,
                         comm::ReduceOp::Sum, info);
}

double PipelineStages::takeComputeSeconds() { return events_->takeSeconds(); }

PipelineRunner::PipelineRunner(const Bundle &bundle,
                               ParameterStore &parameters,
                               comm::RankContext &rank)
    : pipeline::ScheduleRunner<PipelineStages>(
          bundle, PipelineStages(bundle, parameters, rank), rank) {}

} // namespace mtrt::cuda
