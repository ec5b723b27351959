// The host executor's run loop: binding inputs and parameters, value memory,
// outputs.
#include "host/Executor.h"

#include "comm/RankContext.h"
#include "core/ExecutorChecks.h"
#include "core/MemoryPlan.h"
#include "host/ParameterStore.h"
#include "host/ThreadPool.h"

#include <cstring>

namespace mtrt::host {

void SharedArena::reserve(size_t bytes) {
  if (bytes <= bytes_)
    return;
  if (buffer_)
    throw Error(MTRT_STATUS_FAILED_PRECONDITION,
                "SharedArena: an executor needs " + std::to_string(bytes) +
                    " bytes after the arena was allocated with " +
                    std::to_string(bytes_) +
                    "; make every executor before the first run");
  bytes_ = bytes;
}

void *SharedArena::data() {
  if (!buffer_)
    buffer_ = Buffer(bytes_);
  return buffer_.data();
}

Executor::Executor(const Bundle &bundle, std::string_view functionName,
                   ParameterStore &parameters, ThreadPool &pool,
                   comm::RankContext *rank, SharedArena *sharedArena)
    : bundle_(bundle), parameters_(parameters), pool_(pool), rank_(rank),
      floatType_(parameters.floatType()) {
  function_ = &requireFunction(bundle, functionName);
  checkParameterStore(bundle, parameters, "Executor");
  checkNoHalfValues(bundle, *function_,
                    "the host backend computes in f32 or f64 only");
  slots_.resize(function_->values.size());
  if (const std::optional<MemoryPlan> &plan = function_->memoryPlan) {
    // f64 storage doubles every float value; doubled offsets keep disjoint
    // blocks disjoint, and ids fit in twice their declared bytes.
    arenaScale_ = floatType_ == DType::F64 ? 2 : 1;
    arenaBytes_ = static_cast<size_t>(plan->arenaBytes) * arenaScale_;
    if (sharedArena) {
      sharedArena_ = sharedArena;
      sharedArena_->reserve(arenaBytes_);
    } else {
      arena_ = Buffer(arenaBytes_);
    }
    peakBytes_ = arenaBytes_;
  }
  if (rank_ && rank_->gridShape() != bundle.gridShape())
    throw Error(MTRT_STATUS_INVALID_ARGUMENT,
                "Executor: the rank's grid " + shapeString(rank_->gridShape()) +
                    " is not bundle '" + bundle.name() + "''s grid " +
                    shapeString(bundle.gridShape()));
  if (!rank_)
    for (size_t position = 0; position < function_->instructions.size();
         ++position) {
      const Instruction &inst = function_->instructions[position];
      bool isCollective =
          inst.op == Op::AllReduce || inst.op == Op::AllGather ||
          inst.op == Op::ReduceScatter || inst.op == Op::AllSlice;
      if (isCollective &&
          gridGroupSize(bundle.gridShape(), inst.attrs.gridAxes) > 1)
        throw Error(MTRT_STATUS_FAILED_PRECONDITION,
                    where(position) + ": " + opName(inst.op) + " runs over " +
                        std::to_string(gridGroupSize(bundle.gridShape(),
                                                     inst.attrs.gridAxes)) +
                        " ranks, and the executor has no rank context; run "
                        "the bundle's " +
                        std::to_string(bundle.rankCount()) +
                        " ranks (megatron-train --in-process-ranks)");
    }
}

Executor::~Executor() = default;

DType Executor::storageType(int64_t v) const {
  DType dtype = function_->values[v].dtype;
  return isFloatingPoint(dtype) ? floatType_ : dtype;
}

std::string Executor::where(size_t position) const {
  return instructionWhere(*function_, position);
}

Buffer Executor::takeBuffer(size_t bytes) {
  Buffer buffer;
  auto it = spare_.find(bytes);
  if (it != spare_.end()) {
    buffer = std::move(it->second);
    spare_.erase(it);
  } else {
    buffer = Buffer(bytes);
  }
  liveBytes_ += bytes;
  peakBytes_ = std::max(peakBytes_, arenaBytes_ + liveBytes_);
  return buffer;
}

void Executor::giveBuffer(Buffer buffer) {
  if (!buffer)
    return;
  liveBytes_ -= buffer.size();
  size_t size = buffer.size();
  spare_.emplace(size, std::move(buffer));
}

char *Executor::arenaData() {
  return static_cast<char *>(sharedArena_ ? sharedArena_->data()
                                          : arena_.data());
}

void *Executor::allocate(int64_t value) {
  Slot &slot = slots_[value];
  // A fused group's inner values have no arena block (-1): they get a
  // buffer of their own while the group runs.
  if (function_->memoryPlan && function_->memoryPlan->offsets[value] >= 0) {
    int64_t offset = function_->memoryPlan->offsets[value];
    slot.data = arenaData() + static_cast<size_t>(offset) * arenaScale_;
    return slot.data;
  }
  const TensorType &type = function_->values[value];
  slot.owned = takeBuffer(static_cast<size_t>(type.numElements) *
                          dtypeSize(storageType(value)));
  slot.data = slot.owned.data();
  return slot.data;
}

void Executor::release(int64_t value) {
  Slot &slot = slots_[value];
  giveBuffer(std::move(slot.owned));
  slot.owned = Buffer();
  slot.data = nullptr;
}

std::vector<Tensor> Executor::run(const std::vector<TensorView> &inputs,
                                  const MicroBatchKey &key) {
  const Function &fn = *function_;
  for (size_t v = 0; v < slots_.size(); ++v)
    release(static_cast<int64_t>(v));
  checkInputs(fn, inputs, [&](int64_t v) { return storageType(v); });
  for (size_t i = 0; i < inputs.size(); ++i) {
    int64_t v = fn.inputs[i];
    // Inputs are read, never written: no instruction has one as a result.
    slots_[v].data = const_cast<void *>(inputs[i].data);
  }

  for (size_t position = 0; position < fn.instructions.size(); ++position) {
    const Instruction &inst = fn.instructions[position];
    if (floatType_ == DType::F32)
      execute<float>(position, inst, key);
    else
      execute<double>(position, inst, key);
    for (int64_t v : inst.free)
      release(v);
  }

  std::vector<Tensor> outputs;
  for (int64_t v : fn.outputs) {
    Tensor out(storageType(v), fn.values[v].shape);
    std::memcpy(out.buffer.data(), slots_[v].data, out.buffer.size());
    outputs.push_back(std::move(out));
  }
  for (size_t v = 0; v < slots_.size(); ++v)
    release(static_cast<int64_t>(v));
  return outputs;
}

} // namespace mtrt::host
