// The host executor's run loop: binding inputs and parameters, value memory,
// outputs.
#include "host/Executor.h"

#include "comm/RankContext.h"
#include "core/ExecutorChecks.h"
#include "core/MemoryPlan.h"
#include "core/ValueTrace.h"
#include "host/ParameterStore.h"
#include "host/ThreadPool.h"
#include "host/kernels/Bf16Rounding.h"

#include <algorithm>
#include <cmath>
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
  checkNoF16Values(bundle, *function_);
  slots_.resize(function_->values.size());
  if (const std::optional<MemoryPlan> &plan = function_->memoryPlan) {
    // Storage in the float type grows each float value by that type's size
    // over its declared one; offsets scaled by the largest ratio keep
    // disjoint blocks disjoint, and ids fit in their scaled bytes.
    size_t smallest = 4;
    for (const TensorType &type : function_->values)
      if (isFloatingPoint(type.dtype))
        smallest = std::min(smallest, dtypeSize(type.dtype));
    arenaScale_ = std::max<size_t>(1, dtypeSize(floatType_) / smallest);
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
      if (isGridGroupOp(inst.op) &&
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

void Executor::roundBf16Results(const Instruction &inst) {
  for (int64_t v : inst.results) {
    const TensorType &type = function_->values[v];
    if (type.dtype != DType::BF16)
      continue;
    if (floatType_ == DType::F32)
      roundAllToBf16(static_cast<float *>(slots_[v].data), type.numElements);
    else
      roundAllToBf16(static_cast<double *>(slots_[v].data), type.numElements);
  }
}

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
  // buffer of their own while the group runs. So do attention views that
  // are pieces of their whole (a split's results, a concat's operands): the
  // CUDA backend's flash kernels read them strided in the whole, the host's
  // kernels read packed tensors. A view with its whole's bytes (through a
  // reshape) shares the whole's block.
  const std::optional<MemoryPlan> &plan = function_->memoryPlan;
  int64_t whole = plan ? plan->wholeOf(static_cast<size_t>(value)) : -1;
  bool piece = whole >= 0 && (plan->viewOffset[value] != 0 ||
                              planValueBytes(function_->values[value]) !=
                                  planValueBytes(function_->values[whole]));
  if (plan && plan->offsets[value] >= 0 && !piece) {
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

void Executor::traceResults(ValueTrace &trace, size_t position,
                            const Instruction &inst) const {
  const Function &fn = *function_;
  if (inst.op == Op::AccumulateGradient) { // the parameter's gradient so far
    const Tensor &gradient =
        parameters_.gradient(static_cast<size_t>(inst.attrs.parameter));
    std::vector<float> values(gradient.numElements());
    for (size_t e = 0; e < values.size(); ++e)
      values[e] = floatType_ == DType::F32
                      ? gradient.data<float>()[e]
                      : static_cast<float>(gradient.data<double>()[e]);
    trace.record(fn.name, position, opName(inst.op), 0, inst.operands[0],
                 values.data(), static_cast<int64_t>(values.size()));
    return;
  }
  for (size_t i = 0; i < inst.results.size(); ++i) {
    int64_t v = inst.results[i];
    if (!isFloatingPoint(fn.values[v].dtype) || !slots_[v].data)
      continue;
    int64_t count = fn.values[v].numElements;
    std::vector<float> values(static_cast<size_t>(count));
    for (int64_t e = 0; e < count; ++e)
      values[e] = floatType_ == DType::F32
                      ? static_cast<const float *>(slots_[v].data)[e]
                      : static_cast<float>(
                            static_cast<const double *>(slots_[v].data)[e]);
    trace.record(fn.name, position, opName(inst.op), i, v, values.data(),
                 count);
  }
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

  ValueTrace *trace = ValueTrace::fromEnvironment();
  if (trace && !trace->startRun(fn.name))
    trace = nullptr;
  for (size_t position = 0; position < fn.instructions.size(); ++position) {
    const Instruction &inst = fn.instructions[position];
    if (floatType_ == DType::F32)
      execute<float>(position, inst, key);
    else
      execute<double>(position, inst, key);
    roundBf16Results(inst);
    if (trace)
      traceResults(*trace, position, inst);
    for (int64_t v : inst.free)
      release(v);
    if (observer_)
      observer_(position);
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
