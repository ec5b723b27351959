// The CUDA executor's set-up and run loop: the arena plan, input checks and
// uploads, parameter binding, outputs.
#include "cuda/Executor.h"

#include "comm/RankContext.h"
#include "core/ExecutorChecks.h"
#include "core/OpShapes.h"
#include "core/ValueTrace.h"
#include "cuda/CudaCheck.h"
#include "cuda/DeviceCollective.h"
#include "cuda/DeviceMemory.h"
#include "cuda/ParameterStore.h"
#include "cuda/PeerCollective.h"
#include "cuda/kernels/Kernels.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <map>
#include <optional>

namespace mtrt::cuda {

Executor::Executor(const Bundle &bundle, std::string_view functionName,
                   ParameterStore &parameters, comm::RankContext *rank,
                   Bf16Boundary bf16Boundary, SharedArena *sharedArena)
    : bundle_(bundle), parameters_(parameters), rank_(rank),
      context_(parameters.context()), bf16Boundary_(std::move(bf16Boundary)) {
  function_ = &requireFunction(bundle, functionName);
  checkParameterStore(bundle, parameters, "cuda::Executor");
  const Function &fn = *function_;
  checkNoF16Values(bundle, fn);
  bf16_ = bundle.hasModel() && bundle.model().precision == "bf16";
  if (bundle.rankCount() > 1 && !rank_)
    throw Error(MTRT_STATUS_FAILED_PRECONDITION,
                "bundle '" + bundle.name() + "' is compiled for " +
                    std::to_string(bundle.rankCount()) + " ranks (grid " +
                    shapeString(bundle.gridShape()) +
                    "); each rank's executor needs its RankContext");

  for (const Instruction &inst : fn.instructions)
    if (inst.op == Op::Fused && !fusedKernels_)
      fusedKernels_ = std::make_unique<FusedKernelLibrary>(bundle);

  parameterOf_.assign(fn.values.size(), -1);
  for (size_t position = 0; position < fn.instructions.size(); ++position) {
    const Instruction &inst = fn.instructions[position];
    checkShapes(position, inst);
    if (inst.op == Op::GetParameter)
      parameterOf_[inst.results[0]] = inst.attrs.parameter;
  }
  // A reshape's result shares its operand's memory.
  aliasOf_.assign(fn.values.size(), -1);
  for (const Instruction &inst : fn.instructions)
    if (inst.op == Op::Reshape &&
        storageType(inst.results[0]) == storageType(inst.operands[0]))
      aliasOf_[inst.results[0]] = inst.operands[0];
  planKernelBlocks();
  planBf16Values();
  planAttentionViews();
  planCudnnAttention();
  planBf16Copies();
  planGemmAccumulation();
  planFp8Casts();
  reserveFp8Staging();
  planFp8Amaxes();
  plan_ = planArena(
      fn,
      [&](int64_t v) -> size_t {
        if (parameterOf_[v] >= 0)
          return 0;
        // Typed bundles: a value's declared size (bf16: 2 bytes). Older
        // ones: F32's, which a value held in bf16 fills half of.
        DType declared = fn.values[v].dtype;
        if (!bundle.typedPrecision() && isFloatingPoint(declared))
          declared = DType::F32;
        return static_cast<size_t>(fn.values[v].numElements) *
               dtypeSize(declared);
      },
      [&](size_t position) { return scratchBytes(position); },
      [&](size_t position) { return kernelBlocks_.keptUntil[position]; },
      [&](int64_t v) { return aliasOf_[v]; },
      [&](size_t position) { return bf16CopiesMadeAt(position); });
  if (plan_.fromCompiler) // each value has its own block: reshapes copy
    aliasOf_.assign(fn.values.size(), -1);
  else if (viewsInPlan_)
    throw Error(MTRT_STATUS_FAILED_PRECONDITION,
                fn.name + " of bundle '" + bundle.name() +
                    "': its memory plan places attention views "
                    "(memory_plan.views), and the CUDA backend cannot run "
                    "in that plan (it lays out its own arena: a value is "
                    "stored in more bytes than the plan gives it, or the "
                    "plan has no side buffers); recompile the bundle with "
                    "the megatron-compile of this runtime's release");
  checkHeldAttentionOutputs();
  viewRegion_ = (plan_.bytes + kArenaAlignment - 1) / kArenaAlignment *
                kArenaAlignment;
  arena_ = ArenaMemory(arenaBytes(),
                       "the arena of " + fn.name + " of bundle '" +
                           bundle.name() + "'",
                       sharedArena);
  slots_.assign(fn.values.size(), nullptr);
  if (!arena_.shared())
    bindArena();
  bool accumulates = std::any_of(fn.instructions.begin(), fn.instructions.end(),
                                 [](const Instruction &inst) {
                                   return inst.op == Op::AccumulateGradient;
                                 });
  if (accumulates && parameters.gradientsInArena() &&
      !ParameterStore::gradientsFitArena(bundle, fn))
    throw Error(MTRT_STATUS_FAILED_PRECONDITION,
                fn.name + " of bundle '" + bundle.name() +
                    "': its parameter store keeps no gradients (they live "
                    "in the arena), but the function does not end with one "
                    "f32 accumulate_gradient per parameter");

  // Ids that come straight from the caller are checked on the host, before
  // they reach a kernel, with the host executor's messages.
  auto inputIndex = [&](int64_t v) -> int64_t {
    for (size_t i = 0; i < fn.inputs.size(); ++i)
      if (fn.inputs[i] == v)
        return static_cast<int64_t>(i);
    return -1;
  };
  for (size_t position = 0; position < fn.instructions.size(); ++position) {
    const Instruction &inst = fn.instructions[position];
    auto add = [&](size_t operand, int64_t limit, const char *what,
                   const char *limitName, bool hasIgnore) {
      int64_t input = inputIndex(inst.operands[operand]);
      if (input >= 0)
        idChecks_.push_back({static_cast<size_t>(input), position, operand,
                             limit, what, limitName, hasIgnore,
                             inst.attrs.ignoreIndex});
    };
    switch (inst.op) {
    case Op::Embedding:
    case Op::EmbeddingGrad:
      if (isRankInstruction(inst)) // a vocabulary block: the whole's limit
        add(1, embeddingDims(fn, inst).vocab * vocabBlock(position, inst).second,
            "id", "the vocabulary size (all ranks' blocks)", false);
      else
        add(1, embeddingDims(fn, inst).vocab, "id",
            "the embedding table's vocabulary size", false);
      break;
    case Op::LinearVocabPartials:
    case Op::LinearVocabCrossEntropyGrad: {
      const std::vector<int64_t> &w = fn.values[inst.operands[1]].shape;
      add(2,
          (inst.attrs.transposeWeight ? w[0] : w[1]) *
              vocabBlock(position, inst).second,
          "label", "the vocabulary size (all ranks' blocks)",
          inst.op == Op::LinearVocabCrossEntropyGrad);
      break;
    }
    case Op::VocabPartials:
    case Op::VocabCrossEntropyGrad: {
      bool grad = inst.op == Op::VocabCrossEntropyGrad;
      size_t logitsAt = grad ? 1 : 0;
      add(logitsAt + 1,
          fn.values[inst.operands[logitsAt]].shape.back() *
              vocabBlock(position, inst).second,
          "label", "the vocabulary size (all ranks' blocks)", grad);
      break;
    }
    case Op::CrossEntropy:
    case Op::CrossEntropyGrad: {
      CrossEntropyDims d = crossEntropyDims(fn, inst);
      add(d.labelsAt, d.vocab, "label", "the logits' vocabulary size", true);
      break;
    }
    default:
      break;
    }
  }

  if (context_.options().cudaGraphs)
    if (std::optional<std::string> obstacle = graphObstacle())
      graphOff_ = *obstacle;
  prepareRankInstructions();
  prepareMoe();
  stepped_.assign(fn.instructions.size(), false);
  for (size_t position = 0; position < fn.instructions.size(); ++position)
    stepped_[position] = usesStep(fn.instructions[position]);
}

std::vector<float *> Executor::gradientSlots() const {
  const Function &fn = *function_;
  if (!ParameterStore::gradientsFitArena(bundle_, fn))
    throw Error(MTRT_STATUS_FAILED_PRECONDITION,
                fn.name + " of bundle '" + bundle_.name() +
                    "' cannot keep the gradients in its arena (it needs one "
                    "f32 accumulate_gradient per parameter)");
  if (!arenaBound_)
    throw Error(MTRT_STATUS_FAILED_PRECONDITION,
                fn.name + " of bundle '" + bundle_.name() +
                    "': its shared arena is not allocated yet (bindArena)");
  std::vector<float *> slots(parameters_.size(), nullptr);
  for (const Instruction &inst : fn.instructions)
    if (inst.op == Op::AccumulateGradient)
      slots[static_cast<size_t>(inst.attrs.parameter)] =
          static_cast<float *>(slot(inst.operands[0]));
  return slots;
}

void Executor::bindArena() {
  if (arenaBound_)
    return;
  auto *base = static_cast<char *>(arena_.allocate());
  for (size_t v = 0; v < slots_.size(); ++v)
    slots_[v] = plan_.valueOffset[v] == ArenaPlan::kNone
                    ? base
                    : base + plan_.valueOffset[v];
  bindAttentionViews(base + viewRegion_);
  bindFp8Amaxes();
  arenaBound_ = true;
}

Executor::~Executor() {
  for (auto *events :
       {&events_, &collectiveStart_, &collectiveDone_, &commBegin_, &commEnd_})
    for (cudaEvent_t event : *events)
      if (event)
        cudaEventDestroy(event);
}

std::string Executor::instructionProfile() const {
  // One line per distinct op and types, in order of first appearance:
  // "calibration: linear 8x128x128xf32,128x384xf32 -> 8x128x384xf32 12.345
  // us x2" (microseconds a run for one instruction, and how many share it).
  const Function &fn = *function_;
  auto types = [&](const std::vector<int64_t> &values) {
    std::string text;
    for (int64_t v : values) {
      if (!text.empty())
        text += ",";
      for (int64_t d : fn.values[v].shape)
        text += std::to_string(d) + "x";
      text += dtypeName(fn.values[v].dtype);
    }
    return text;
  };
  std::vector<std::string> keys;
  std::map<std::string, std::pair<double, int64_t>> sums;
  for (size_t position = 0; position < fn.instructions.size() &&
                            position < instructionMilliseconds_.size();
       ++position) {
    const Instruction &inst = fn.instructions[position];
    std::string key = std::string(opName(inst.op)) + " " +
                      types(inst.operands) + " -> " + types(inst.results);
    auto [it, inserted] = sums.try_emplace(key, 0.0, 0);
    if (inserted)
      keys.push_back(key);
    it->second.first += instructionMilliseconds_[position];
    ++it->second.second;
  }
  std::string text;
  auto runs = static_cast<double>(profiledRuns_);
  for (const std::string &key : keys) {
    const auto &[ms, count] = sums[key];
    char figures[64];
    std::snprintf(figures, sizeof(figures), " %.3f us x%lld",
                  1e3 * ms / runs / static_cast<double>(count),
                  static_cast<long long>(count));
    text += "calibration: " + key + figures + "\n";
  }
  return text;
}

std::string Executor::profile() const {
  if (!context_.options().profile)
    return std::string();
  const std::string &name = function_->name;
  if (!profiledRuns_)
    return name + ": not profiled: only its first run was timed, and the " +
           "first run (GEMM algorithm timing, kernel loading) is left out\n";
  std::vector<size_t> order;
  double total = 0;
  for (size_t op = 0; op < opMilliseconds_.size(); ++op)
    if (opCounts_[op]) {
      order.push_back(op);
      total += opMilliseconds_[op];
    }
  std::sort(order.begin(), order.end(), [&](size_t a, size_t b) {
    return opMilliseconds_[a] > opMilliseconds_[b];
  });
  auto runs = static_cast<double>(profiledRuns_);
  char line[256];
  std::snprintf(line, sizeof(line),
                "%s: %.2f ms per run on the device (the sum of its ops), "
                "%.2f ms per run of wall time (inputs up to outputs back), "
                "over %lld runs (the first run, which times GEMM algorithms "
                "and loads kernels, left out)\n",
                name.c_str(), total / runs, profiledWallMilliseconds_ / runs,
                static_cast<long long>(profiledRuns_));
  std::string text = line;
  for (size_t op : order) {
    std::snprintf(line, sizeof(line),
                  "  %-20s %9.3f ms per run  %5.1f%%  (%lld per run)\n",
                  opName(static_cast<Op>(op)), opMilliseconds_[op] / runs,
                  100.0 * opMilliseconds_[op] / total,
                  static_cast<long long>(opCounts_[op] / profiledRuns_));
    text += line;
  }
  if (context_.options().profileInstructions)
    text += instructionProfile();
  for (const std::string &fallback : context_.gemm().epiloguesByKernel())
    text += "  cuBLASLt epilogue run as kernels: " + fallback + "\n";
  for (const std::string &choice : context_.gemm().tuningChoices())
    text += "  GEMM tuned: " + choice + "\n";
  text +=
      "  values held in bf16: " + std::to_string(bf16ValueCount()) + "\n";
  return text;
}

std::string Executor::graphSummary() const {
  if (!context_.options().cudaGraphs)
    return std::string();
  const std::string &name = function_->name;
  if (!graphOff_.empty())
    return name + ": no CUDA graph: " + graphOff_ + "\n";
  if (graphs_.empty())
    return name + ": no CUDA graph yet (captured at the second run)\n";
  const StepGraph &graph = graphs_.front()->graph;
  return name + ": CUDA graph of " + std::to_string(graph.nodeCount()) +
         " nodes, " + std::to_string(graph.steppedKernelCount()) +
         " kernels updated per step, " + std::to_string(graphs_.size()) +
         " input binding(s), captured " +
         std::to_string(graphCaptures_) + " time(s), replayed in " +
         std::to_string(graphReplays_) + " of " + std::to_string(runs_) +
         " runs\n";
}

DType Executor::storageType(int64_t v) const {
  DType dtype = function_->values[v].dtype;
  if (!isFloatingPoint(dtype) || isFp8(dtype))
    return dtype;
  bool bf16 = static_cast<size_t>(v) < bf16Value_.size() && bf16Value_[v];
  return bf16 ? DType::BF16 : DType::F32;
}

std::string Executor::where(size_t position) const {
  return instructionWhere(*function_, position);
}

void *Executor::scratch(size_t position) const {
  if (plan_.scratchOffset[position] == ArenaPlan::kNone)
    return nullptr;
  return static_cast<char *>(arena_.data()) + plan_.scratchOffset[position];
}

void Executor::checkInputIds(
    const std::vector<host::TensorView> &inputs) const {
  const Function &fn = *function_;
  for (const IdCheck &check : idChecks_) {
    const host::TensorView &view = inputs[check.input];
    if (isDeviceMemory(view.data)) // the kernels check them (the fault word)
      continue;
    int64_t value = fn.inputs[check.input];
    int64_t count = fn.values[value].numElements;
    const int64_t *ignore = check.hasIgnore ? &check.ignore : nullptr;
    if (view.dtype == DType::I64)
      checkIds(where(check.position), check.what, check.operand, value,
               static_cast<const int64_t *>(view.data), count, check.limit,
               check.limitName, ignore);
    else
      checkIds(where(check.position), check.what, check.operand, value,
               static_cast<const int32_t *>(view.data), count, check.limit,
               check.limitName, ignore);
  }
}

std::vector<host::Tensor>
Executor::run(const std::vector<host::TensorView> &inputs,
              const MicroBatchKey &key, bool inputsOnDevice,
              const OutputSink &keepOutputs, bool wait) {
  if (!wait && !keepOutputs)
    throw Error(MTRT_STATUS_INTERNAL,
                function_->name + ": a run that does not wait must keep its "
                                  "outputs on the device");
  auto started = std::chrono::steady_clock::now();
  const Function &fn = *function_;
  cudaStream_t stream = context_.stream();
  if (rank_)
    PeerGroup::setTraceRank(rank_->world().rank());
  // The first run tunes the GEMMs (cuBLASLt loads its candidates' kernels
  // then) and allocates: CUDA calls that may wait for the device, not while
  // another rank's graph spins for a peer (PeerGroup::Setup).
  std::optional<PeerGroup::Setup> firstRun;
  if (runs_ == 0)
    firstRun.emplace();
  if (!arenaBound_)
    bindArena();
  checkInputs(fn, inputs, [&](int64_t v) { return storageType(v); });
  if (!inputsOnDevice)
    checkInputIds(inputs);

  // Device inputs are bound in place of their arena slots for this run.
  struct RestoreSlots {
    std::vector<void *> &slots;
    std::vector<std::pair<int64_t, void *>> saved;
    ~RestoreSlots() {
      for (auto &[v, data] : saved)
        slots[v] = data;
    }
  } restore{slots_, {}};
  if (wait)
    context_.resetFault();
  for (size_t i = 0; i < inputs.size(); ++i) {
    int64_t v = fn.inputs[i];
    size_t bytes = static_cast<size_t>(fn.values[v].numElements) *
                   dtypeSize(storageType(v));
    if (inputsOnDevice) {
      restore.saved.emplace_back(v, slots_[v]);
      slots_[v] = const_cast<void *>(inputs[i].data);
    } else if (bytes)
      MTRT_CUDA_CHECK(cudaMemcpyAsync(slots_[v], inputs[i].data, bytes,
                                      cudaMemcpyDefault, stream),
                      fn.name + ": uploading inputs[" + std::to_string(i) +
                          "]");
  }
  bool profiling = context_.options().profile;
  bool timed = profiling && runs_ > 0 && wait;
  // Graphs from the second run: the first times GEMM algorithms (which
  // synchronizes) and loads kernels.
  if (graphOff_.empty() && context_.options().cudaGraphs && runs_ > 0 &&
      !observer_ && !deferJoin_) {
    if (!replayGraph(key))
      executeAll(key, timed);
  } else {
    if (collective_ && PeerGroup::tracing())
      PeerGroup::trace(fn.name + ": run " + std::to_string(runs_) +
                       " without a graph");
    executeAll(key, timed);
  }
  std::vector<host::Tensor> outputs;
  for (size_t i = 0; keepOutputs && i < fn.outputs.size(); ++i) {
    int64_t v = fn.outputs[i];
    keepOutputs(i, slots_[v],
                static_cast<size_t>(fn.values[v].numElements) *
                    dtypeSize(storageType(v)));
  }
  for (int64_t v : fn.outputs) {
    if (keepOutputs)
      break;
    host::Tensor out(storageType(v), fn.values[v].shape);
    if (out.buffer.size())
      MTRT_CUDA_CHECK(cudaMemcpyAsync(out.buffer.data(), slots_[v],
                                      out.buffer.size(),
                                      cudaMemcpyDeviceToHost, stream),
                      fn.name + ": copying output value " + std::to_string(v) +
                          " to the host");
    outputs.push_back(std::move(out));
  }
  if (!wait) {
    ++runs_;
    return outputs;
  }
  context_.synchronize(fn.name + ": running " +
                       std::to_string(fn.instructions.size()) +
                       " instructions on " + context_.description() +
                       " (set MTRT_CUDA_SYNC=1 to find the failing one)");
  ++runs_;
  if (timed) {
    profiledWallMilliseconds_ +=
        std::chrono::duration<double, std::milli>(
            std::chrono::steady_clock::now() - started)
            .count();
    for (size_t position = 0; position < fn.instructions.size(); ++position) {
      float ms = 0;
      MTRT_CUDA_CHECK(cudaEventElapsedTime(&ms, events_[position],
                                           events_[position + 1]),
                      fn.name + ": profiling");
      auto op = static_cast<size_t>(fn.instructions[position].op);
      opMilliseconds_[op] += ms;
      ++opCounts_[op];
      if (position < instructionMilliseconds_.size())
        instructionMilliseconds_[position] += ms;
    }
    ++profiledRuns_;
    // The timeline: every interval from the run's first event.
    timeline_.clear();
    auto since = [&](cudaEvent_t event) {
      float ms = 0;
      MTRT_CUDA_CHECK(cudaEventElapsedTime(&ms, events_.front(), event),
                      fn.name + ": profiling");
      return static_cast<double>(ms);
    };
    for (size_t position = 0; position < fn.instructions.size(); ++position) {
      timeline_.push_back({position, false, since(events_[position]),
                           since(events_[position + 1])});
      if (!commBegin_.empty() && commBegin_[position])
        timeline_.push_back({position, true, since(commBegin_[position]),
                             since(commEnd_[position])});
    }
  }
  if (unsigned tag = context_.readFault())
    throw Error(MTRT_STATUS_OUT_OF_RANGE,
                where(tag - 1) +
                    ": an id or label outside its table reached the kernel "
                    "on the device (it was skipped); the data must be "
                    "tokenized for this vocabulary");
  return outputs;
}

void Executor::executeAll(const MicroBatchKey &key, bool timed) {
  const Function &fn = *function_;
  cudaStream_t stream = context_.stream();
  if (timed && events_.empty()) {
    events_.resize(fn.instructions.size() + 1);
    for (cudaEvent_t &event : events_)
      MTRT_CUDA_CHECK(cudaEventCreate(&event), "creating profiling events");
    opMilliseconds_.assign(kOpCount, 0);
    opCounts_.assign(opMilliseconds_.size(), 0);
    instructionMilliseconds_.assign(fn.instructions.size(), 0);
    if (commStream_) {
      commBegin_.assign(fn.instructions.size(), nullptr);
      commEnd_.assign(fn.instructions.size(), nullptr);
      for (size_t position = 0; position < fn.instructions.size(); ++position)
        if (communicates(fn.instructions[position]))
          for (cudaEvent_t *event :
               {&commBegin_[position], &commEnd_[position]})
            MTRT_CUDA_CHECK(cudaEventCreate(event),
                            "creating profiling events");
    }
  }
  ValueTrace *trace = ValueTrace::fromEnvironment();
  if (trace && !trace->startRun(fn.name))
    trace = nullptr;
  for (size_t position = 0; position < fn.instructions.size(); ++position) {
    awaitCollectives(position);
    if (timed)
      MTRT_CUDA_CHECK(cudaEventRecord(events_[position], stream),
                      where(position));
    execute(position, fn.instructions[position], key);
    if (context_.options().syncEachInstruction || trace)
      context_.synchronize(where(position));
    if (trace)
      traceResults(*trace, position);
    if (observer_)
      observer_(position);
  }
  if (!deferJoin_)
    awaitCollectives(fn.instructions.size());
  if (timed)
    MTRT_CUDA_CHECK(cudaEventRecord(events_.back(), stream),
                    fn.name + ": profiling");
}

void Executor::joinCollectives() {
  awaitCollectives(function_->instructions.size());
}

void Executor::traceResults(ValueTrace &trace, size_t position) {
  const Function &fn = *function_;
  const Instruction &inst = fn.instructions[position];
  auto read = [&](const void *data, size_t count, DType type) {
    std::vector<float> values(count);
    if (type == DType::BF16) {
      std::vector<uint16_t> bits(count);
      MTRT_CUDA_CHECK(cudaMemcpy(bits.data(), data, count * sizeof(uint16_t),
                                 cudaMemcpyDeviceToHost),
                      where(position) + ": tracing");
      for (size_t e = 0; e < count; ++e) {
        uint32_t wide = static_cast<uint32_t>(bits[e]) << 16;
        std::memcpy(&values[e], &wide, sizeof wide);
      }
    } else {
      MTRT_CUDA_CHECK(cudaMemcpy(values.data(), data, count * sizeof(float),
                                 cudaMemcpyDeviceToHost),
                      where(position) + ": tracing");
    }
    return values;
  };
  if (inst.op == Op::AccumulateGradient) { // the parameter's gradient so far
    auto p = static_cast<size_t>(inst.attrs.parameter);
    std::vector<float> values =
        read(parameters_.gradient(p), parameters_.count(p), DType::F32);
    trace.record(fn.name, position, opName(inst.op), 0, inst.operands[0],
                 values.data(), static_cast<int64_t>(values.size()));
    return;
  }
  auto absSum = [](const std::vector<float> &values) {
    double sum = 0;
    for (float x : values)
      sum += std::fabs(x);
    return sum;
  };
  // Values are written once: a live value whose bytes change before its
  // last reader frees it was overwritten by another instruction.
  if (position == 0)
    traceLive_.assign(fn.values.size(), -1);
  for (int64_t v : inst.free)
    traceLive_[v] = -1;
  for (size_t i = 0; i < inst.results.size(); ++i) {
    int64_t v = inst.results[i];
    DType type = storageType(v);
    // A weight gradient its GEMM added into the parameter's has no slot;
    // flash attention's views (split pieces, dq/dk/dv) live elsewhere.
    if (!isFloatingPoint(type) || isFp8(type) || !slots_[v] ||
        (i == 0 && gemmAccumulates_[position] >= 0))
      continue;
    auto count = static_cast<size_t>(fn.values[v].numElements);
    std::vector<float> values = read(slots_[v], count, type);
    trace.record(fn.name, position, opName(inst.op), i, v, values.data(),
                 static_cast<int64_t>(count));
    if (inst.op != Op::Split && inst.op != Op::AttentionGrad) {
      traceLive_[v] = static_cast<int64_t>(position);
      traceSums_.resize(fn.values.size());
      traceSums_[v] = absSum(values);
    }
  }
  for (size_t v = 0; v < traceLive_.size(); ++v) {
    if (traceLive_[v] < 0 || traceLive_[v] == static_cast<int64_t>(position))
      continue;
    double now = absSum(read(slots_[v],
                             static_cast<size_t>(fn.values[v].numElements),
                             storageType(static_cast<int64_t>(v))));
    if (now == traceSums_[v])
      continue;
    std::fprintf(stderr,
                 "MTRT_VALUE_TRACE: %s: value %zu (written by instruction "
                 "%lld) changed at instruction %zu (%s): abs sum %.9g -> "
                 "%.9g\n",
                 fn.name.c_str(), v, static_cast<long long>(traceLive_[v]),
                 position, opName(inst.op), traceSums_[v], now);
    traceSums_[v] = now;
  }
}

std::optional<std::string> Executor::graphObstacle() const {
  const ContextOptions &options = context_.options();
  if (ValueTrace::fromEnvironment())
    return std::string("tracing values (MTRT_VALUE_TRACE) reads each result");
  if (options.profile)
    return std::string("profiling (MTRT_CUDA_PROFILE) times each instruction");
  if (options.syncEachInstruction)
    return std::string(
        "synchronizing after each instruction (MTRT_CUDA_SYNC) is on");
  const Function &fn = *function_;
  for (size_t position = 0; position < fn.instructions.size(); ++position) {
    const Instruction &inst = fn.instructions[position];
    if (inst.op == Op::MoeGroupedLinear ||
        inst.op == Op::MoeGroupedLinearWeightGrad)
      return where(position) +
             " reads its experts' row counts back to the host (" +
             opName(inst.op) + ")";
    if (!communicates(inst))
      continue;
    comm::Communicator &comm = rank_->group(inst.attrs.gridAxes);
    if (comm.takesDeviceMemory()) {
      if (!options.ncclGraphs)
        return where(position) + " calls NCCL (" + opName(inst.op) +
               "), captured only with ContextOptions::ncclGraphs "
               "(MTRT_CUDA_NCCL_GRAPHS=1), which several GPUs have not run "
               "yet";
      continue;
    }
    if (!options.peerCollectives || pointToPoint(inst.op) ||
        !PeerGroup::serves(comm, storageType(inst.operands[0])))
      return where(position) + " calls the rank's communicator (" +
             opName(inst.op) +
             " over several ranks staged through the host: not captured)";
    if (!PeerGroup::eagerModuleLoading())
      return where(position) + ": " + opName(inst.op) +
             " over in-process ranks is captured only with "
             "CUDA_MODULE_LOADING=EAGER (its barrier kernels wait for the "
             "peers', which a lazily loaded kernel could hold up)";
    // Each rank's compute and communication streams (Context) need a
    // hardware queue of their own: in a shared one a rank's graph waits
    // behind the barrier kernel another rank's graph spins in for it.
    int ranks = rank_->world().size(), queues = PeerGroup::hardwareQueues();
    if (2 * ranks > queues)
      return where(position) + ": " + opName(inst.op) + " over " +
             std::to_string(ranks) +
             " in-process ranks: their streams (2 a rank) share CUDA's " +
             std::to_string(queues) +
             " hardware work queues, where a rank's graph can wait behind "
             "another's barrier kernel spinning for it; set "
             "CUDA_DEVICE_MAX_CONNECTIONS=32 (up to 16 ranks) before CUDA "
             "starts";
    const comm::Communicator &connected =
        rank_->group(comm::RankContext::connectedAxes(fn));
    if (!PeerGroup::serves(connected))
      return where(position) + ": " + opName(inst.op) + " connects " +
             std::to_string(connected.size()) +
             " in-process ranks through its function's collectives; CUDA "
             "graphs launch together at most " +
             std::to_string(kMaxPeerRanks);
  }
  return std::nullopt;
}

bool Executor::usesStep(const Instruction &inst) const {
  switch (inst.op) {
  case Op::Fill: // fp16's loss scale: an argument that changes between runs
    return inst.attrs.lossSeed;
  case Op::Dropout:
    return inst.attrs.p != 0;
  case Op::Attention:
  case Op::AttentionGrad:
  case Op::AttentionBlock:
  case Op::AttentionBlockGrad:
    return attentionParams(*function_, inst, 0).dropoutP > 0;
  case Op::Fused:
    for (const Instruction &op : inst.body)
      if (op.op == Op::Dropout && op.attrs.p != 0)
        return true;
    return false;
  default:
    return false;
  }
}

bool Executor::replayGraph(const MicroBatchKey &key) {
  const Function &fn = *function_;
  cudaStream_t stream = context_.stream();
  std::string what = fn.name + " of bundle '" + bundle_.name() + "'";
  StepGraph::Enqueue enqueue = [&](size_t position) {
    execute(position, fn.instructions[position], key);
  };
  // The communication stream's joins, before each instruction and at the
  // end (not in the stepped instructions' side captures: no collective is
  // stepped).
  StepGraph::Enqueue await = [&](size_t position) {
    awaitCollectives(position);
  };
  bool barriers = false;
  std::optional<PeerGroup::LaunchWindow> window;
  try {
    // The inputs as bound for this run (device batches bind their own
    // memory): a graph captured with others reads stale memory.
    std::vector<void *> inputSlots;
    for (int64_t v : fn.inputs)
      inputSlots.push_back(slots_[v]);
    BoundGraph *bound = nullptr;
    for (auto &graph : graphs_)
      if (graph->inputSlots == inputSlots)
        bound = graph.get();
    if (!bound) {
      if (graphs_.size() < kBoundGraphs) {
        graphs_.push_back(std::make_unique<BoundGraph>());
        bound = graphs_.back().get();
      } else {
        for (auto &graph : graphs_)
          if (!bound || graph->lastRun < bound->lastRun)
            bound = graph.get();
        bound->graph.reset();
      }
      if (collective_)
        collective_->takeCapturedCalls();
      bound->graph.capture(stream, fn.instructions.size(), stepped_, enqueue,
                           what, await);
      if (collective_)
        bound->peerCalls = collective_->takeCapturedCalls();
      {
        // Instantiating a graph, and its upload (which its first launch
        // does otherwise), may wait for the device's work: not while a
        // graph with barriers is in flight in this process, whose ranks
        // may wait for the CUDA calls this one would hold up
        // (bench/NOTES.md, session 21: a first launch waited 7.4 s until
        // the peer's barrier trapped). Uploaded here, a launch only
        // enqueues.
        PeerGroup::Setup setup;
        bound->graph.instantiate(what);
        bound->graph.upload(stream, what);
      }
      bound->inputSlots = inputSlots;
      bound->key = key;
      bound->lossScale = lossScale_;
      ++graphCaptures_;
    } else if (key != bound->key || lossScale_ != bound->lossScale) {
      bound->graph.refresh(stream, enqueue, what);
      bound->key = key;
      bound->lossScale = lossScale_;
    }
    bound->lastRun = runs_;
    // The peers' host threads meet before the launch (PeerGroup): every
    // rank the graph's barriers wait for, directly or through another
    // group, is at its launch (the gate over the connected ranks), so each
    // launches with nothing in between that could wait for the device.
    barriers = !bound->peerCalls.empty();
    if (barriers) {
      if (!launchGate_) {
        comm::Communicator &connected =
            rank_->group(comm::RankContext::connectedAxes(fn));
        launchGate_ = PeerGroup::attach(connected, stream, what);
        gateRank_ = connected.rank();
      }
      std::string traced;
      for (const DeviceCollective::CapturedCalls &calls : bound->peerCalls) {
        uint64_t phase =
            calls.group->post(calls.rank, calls.count, calls.barriers);
        if (PeerGroup::tracing())
          traced += " group " + calls.group->name() + " (" +
                    std::to_string(calls.group->id()) + ") rank " +
                    std::to_string(calls.rank) + ": " +
                    std::to_string(calls.count) + " calls, barriers to " +
                    std::to_string(phase) + ";";
      }
      PeerGroup::trace(what + ": run " + std::to_string(runs_) +
                       ": gate, then graph launch;" + traced);
      launchGate_->gate(gateRank_, what);
      for (const DeviceCollective::CapturedCalls &calls : bound->peerCalls)
        calls.group->await(calls.rank, what);
      window.emplace();
    }
    bound->graph.launch(stream, what);
    if (barriers)
      PeerGroup::trace(what + ": run " + std::to_string(runs_) + " launched");
  } catch (const Error &e) {
    if (collective_)
      collective_->takeCapturedCalls();
    graphs_.clear();
    graphOff_ = std::string("turned off after a failure: ") + e.what();
    std::fprintf(stderr,
                 "warning: %s runs without a CUDA graph from now on: %s\n",
                 what.c_str(), e.what());
    return false;
  }
  ++graphReplays_;
  // The launch window lasts until the graph has finished, and nothing is
  // queued behind a graph with barriers while it runs: work queued after
  // a graph that spins for a peer (an output's copy, the pipeline's staged
  // send, the next run's inputs) waits at the head of its hardware work
  // queue (CUDA_DEVICE_MAX_CONNECTIONS) for that graph, and where the
  // queue is shared it holds up what another rank queued behind it
  // (bench/NOTES.md, sessions 21 and 22).
  if (barriers)
    context_.synchronize(what + ": the CUDA graph of run " +
                         std::to_string(runs_) +
                         " (its barriers wait for the peers' graphs)");
  return true;
}

} // namespace mtrt::cuda
