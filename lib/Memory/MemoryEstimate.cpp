//===- MemoryEstimate.cpp - One rank's bytes from the compiled module -----===//

#include "megatron/Memory/Memory.h"
#include "megatron/Pipelines/PipelinePlan.h"

#include "mt/IR/MtDialect.h"
#include "mt/IR/MtOps.h"
#include "mt/Transforms/MemoryPlan.h"
#include "mt/Transforms/SideBuffers.h"

#include "mlir/Dialect/Func/IR/FuncOps.h"
#include "mlir/Dialect/Shard/IR/ShardOps.h"
#include "llvm/ADT/StringSet.h"
#include "llvm/Support/FormatVariadic.h"

using namespace mlir;
using namespace megatron;

static int64_t elements(Type type) {
  return cast<RankedTensorType>(type).getNumElements();
}

static int64_t bytesOf(Type type) {
  auto tensor = cast<RankedTensorType>(type);
  return tensor.getNumElements() *
         static_cast<int64_t>(tensor.getElementTypeBitWidth() / 8);
}

/// The FLOPs an op redoes when it is recomputed: multiply-adds count 2.
static double recomputeFlops(Operation *op) {
  auto resultElements = [&] {
    return op->getNumResults() ? double(elements(op->getResult(0).getType()))
                               : 0.0;
  };
  if (isa<mt::LinearOp, mt::LinearGeluOp, mt::LinearGeluGradOp,
          mt::LinearAddOp>(op)) {
    auto input = cast<RankedTensorType>(op->getOperand(0).getType());
    return 2.0 * resultElements() * double(input.getShape().back());
  }
  if (auto attention = dyn_cast<mt::AttentionOp>(op)) {
    // [b, s, heads, d]: QK^T and PV, half of them under the causal mask.
    auto q = cast<RankedTensorType>(attention.getQuery().getType());
    auto k = cast<RankedTensorType>(attention.getKey().getType());
    double flops = 4.0 * double(q.getNumElements()) * double(k.getShape()[1]);
    return attention.getCausal() ? flops / 2 : flops;
  }
  return resultElements();
}

/// Parameters, their bf16 copies, gradients and optimizer state of the
/// parameters `train` reads; `eval` adds bf16 copies only.
static void countWeights(ArrayRef<func::FuncOp> train,
                         ArrayRef<func::FuncOp> eval,
                         const CompileConfig &config,
                         const mt::SideBufferOptions &storage,
                         MemoryEstimate &estimate) {
  // The rank's parameters: partitioned steps read them as arguments with
  // local shapes; otherwise through get_parameter (a tied table once).
  llvm::StringSet<> seen;
  for (func::FuncOp function : train) {
    for (BlockArgument argument : function.getArguments())
      if (auto name = function.getArgAttrOfType<FlatSymbolRefAttr>(
              argument.getArgNumber(), "mt.parameter"))
        if (seen.insert(name.getValue()).second)
          estimate.parameterElements += elements(argument.getType());
    function.walk([&](mt::GetParameterOp read) {
      if (seen.insert(read.getName()).second)
        estimate.parameterElements += elements(read.getType());
    });
  }

  // The runtime keeps fp32 weights (the master copy), fp32 gradients
  // and AdamW's two fp32 moments, the moments split over the data-parallel
  // (and context-parallel) ranks by the distributed optimizer. Under bf16, the parameters that
  // GEMMs read have a persistent bf16 copy besides (the other GEMM
  // operands' copies are side buffers in the arena).
  const int64_t n = estimate.parameterElements;
  estimate.parameterBytes = n * 4;
  if (storage.mixedPrecision) {
    llvm::StringSet<> copied;
    auto countCopies = [&](func::FuncOp function) {
      function.walk([&](Operation *op) {
        // The fused output layer's GEMMs read the same copy of its weight.
        if (!mt::readsGemmOperands(op) &&
            !isa<mt::LinearCrossEntropyOp, mt::LinearVocabMaxOp,
                 mt::LinearVocabPartialsOp, mt::LinearVocabCrossEntropyGradOp>(
                op))
          return;
        for (Value operand : op->getOperands().take_front(2))
          if (FlatSymbolRefAttr name = mt::parameterRead(operand))
            if (copied.insert(name.getValue()).second)
              estimate.bf16ParameterElements += elements(operand.getType());
      });
    };
    for (func::FuncOp function : train)
      countCopies(function);
    for (func::FuncOp function : eval)
      countCopies(function);
    estimate.bf16ParameterBytes = estimate.bf16ParameterElements * 2;
  }
  estimate.gradientBytes = n * 4;
  int64_t optimizer = n * 8;
  // The distributed optimizer shards over the data x context ranks
  // (mt-plan-gradient-reduction's buffer, Megatron-LM's intra_dp_cp group).
  int64_t shards = config.parallel.dataParallelSize *
                   config.parallel.contextParallelSize;
  if (config.parallel.useDistributedOptimizer)
    optimizer = (optimizer + shards - 1) / shards;
  estimate.optimizerBytes = optimizer;
}

/// Whether `value` is one of an MoE layer's row values, `[T K, ...]` or a
/// dispatched block of them: a result of the permutation, the grouped
/// linear layers, the dispatch and combine ops, an all-to-all, or of an op
/// that reads one (the experts' activation on the rows). The routing's
/// per-token results and the unpermuted output are not rows.
static bool isMoeRowValue(Value value, bool direct = false) {
  Operation *op = value.getDefiningOp();
  if (!op)
    return false;
  if (isa<shard::AllToAllOp, mt::MoePermuteOp, mt::MoeGroupedLinearOp,
          mt::MoeDispatchRowsOp, mt::MoeCombineRowsOp>(op))
    return true;
  if (direct || op->getDialect() != op->getContext()->getLoadedDialect("mt") ||
      isa<mt::MoeRouteOp, mt::MoeUnpermuteOp, mt::MoeAuxLossOp, mt::MoeZLossOp>(
          op))
    return false;
  return llvm::any_of(op->getOperands(), [](Value operand) {
    return isMoeRowValue(operand, /*direct=*/true);
  });
}

/// The rank's routed-expert elements (mt-annotate-shardings' routed expert
/// tensors, `*.mlp.experts.*`), read as countWeights reads the parameters.
static void countExperts(ArrayRef<func::FuncOp> train,
                         MemoryEstimate &estimate) {
  llvm::StringSet<> seen;
  auto count = [&](StringRef name, Type type) {
    if (name.contains(".mlp.experts.") && seen.insert(name).second)
      estimate.expertParameterElements += elements(type);
  };
  for (func::FuncOp function : train) {
    for (BlockArgument argument : function.getArguments())
      if (auto name = function.getArgAttrOfType<FlatSymbolRefAttr>(
              argument.getArgNumber(), "mt.parameter"))
        count(name.getValue(), argument.getType());
    function.walk([&](mt::GetParameterOp read) {
      count(read.getName(), read.getType());
    });
  }
}

/// Under expert parallelism the experts' gradients stay out of the
/// gradient buffer, so the distributed optimizer keeps their moments whole
/// (DistributedOptimizer's local parameters): only the rest is sharded.
static void unshardExpertMoments(const CompileConfig &config,
                                 MemoryEstimate &estimate) {
  const ParallelConfig &p = config.parallel;
  if (!p.useDistributedOptimizer || config.moe.expertModelParallelSize == 1)
    return;
  int64_t shards = p.dataParallelSize * p.contextParallelSize;
  int64_t sharded =
      (estimate.parameterElements - estimate.expertParameterElements) * 8;
  estimate.optimizerBytes =
      (sharded + shards - 1) / shards + estimate.expertParameterElements * 8;
}

/// The all-to-all results of one micro-batch's forward and backward passes
/// in `function` (expert parallelism's dispatch and combine buffers).
static void countAllToAlls(func::FuncOp function, MemoryEstimate &estimate) {
  function.walk([&](shard::AllToAllOp op) {
    int64_t bytes = bytesOf(op.getResult().getType());
    ++estimate.allToAlls;
    estimate.allToAllBytes += bytes;
    estimate.largestAllToAllBytes =
        std::max(estimate.largestAllToAllBytes, bytes);
  });
}

static void countRecomputed(func::FuncOp function, MemoryEstimate &estimate) {
  for (Operation &op : function.getBody().front().without_terminator()) {
    if (op.hasAttr(mt::kRecomputedAttrName)) {
      ++estimate.recomputedOps;
      estimate.recomputedFlops += recomputeFlops(&op);
    }
  }
}

/// Adds `bytes` saved by the op that defines `value` (or of none) to its
/// layer's figure, or to the figure outside the layers.
static void addSaved(Operation *definingOp, int64_t bytes,
                     const CompileConfig &config, MemoryEstimate &estimate) {
  if (definingOp && definingOp->getNumResults() &&
      isMoeRowValue(definingOp->getResult(0)))
    estimate.savedMoeRowBytes += bytes;
  mt::LayerAttr tag = definingOp ? mt::getLayer(definingOp) : mt::LayerAttr();
  if (tag && tag.getIndex() < config.model.numLayers)
    estimate.savedBytesByLayer[tag.getIndex()] += bytes;
  else
    estimate.savedOtherBytes += bytes;
}

/// A pipeline rank: its stage functions (forward, backward, eval) run one at
/// a time in one arena, as large as the largest of theirs; the stash of the
/// micro-batches in flight lives besides.
static MemoryEstimate estimatePipelineRank(ModuleOp module,
                                           const CompileConfig &config,
                                           const PipelinePlan &plan,
                                           int64_t rank) {
  MemoryEstimate estimate;
  estimate.pipelineRank = rank;
  estimate.savedBytesByLayer.assign(config.model.numLayers, 0);
  mt::SideBufferOptions storage;
  storage.mixedPrecision = config.precision == Precision::BF16;
  SmallVector<func::FuncOp> train, forwards, eval;
  for (int64_t k : plan.stagesOf(rank)) {
    estimate.stages.push_back(k);
    std::string name = ("train_step_stage" + llvm::Twine(k)).str();
    auto forward = module.lookupSymbol<func::FuncOp>(name + "_forward");
    auto backward = module.lookupSymbol<func::FuncOp>(name + "_backward");
    if (forward && backward) {
      train.append({forward, backward});
      forwards.push_back(forward);
    }
    if (auto step = module.lookupSymbol<func::FuncOp>(
            ("eval_step_stage" + llvm::Twine(k)).str()))
      eval.push_back(step);
  }
  countWeights(train, eval, config, storage, estimate);
  countExperts(train, estimate);
  unshardExpertMoments(config, estimate);
  for (func::FuncOp function : train)
    countAllToAlls(function, estimate);
  auto share = [&](const mt::FunctionMemoryPlan &arena) {
    if (arena.arenaBytes <= estimate.arenaBytes)
      return;
    estimate.arenaBytes = arena.arenaBytes;
    estimate.peakSideBufferBytes = arena.peakSideBufferBytes;
  };
  for (func::FuncOp function : train) {
    mt::FunctionMemoryPlan arena = mt::planFunctionMemory(function, storage);
    share(arena);
    estimate.numInstructions += arena.numInstructions;
    estimate.inPlaceResults += arena.numInPlace;
    countRecomputed(function, estimate);
  }
  for (func::FuncOp function : eval)
    share(mt::planFunctionMemory(function, storage));
  // One micro-batch's stash by layer: the forward's results but the output.
  for (func::FuncOp forward : forwards) {
    auto ret = cast<func::ReturnOp>(forward.getBody().front().getTerminator());
    for (Value stashed : llvm::drop_begin(ret.getOperands()))
      addSaved(stashed.getDefiningOp(), bytesOf(stashed.getType()), config,
               estimate);
  }
  estimate.stashBytes = plan.peakStashBytes(rank);
  int64_t held = 0, most = 0;
  for (const ScheduleAction &a : plan.schedule.ranks[rank]) {
    if (a.kind == ScheduleAction::Forward)
      most = std::max(most, ++held);
    else if (a.kind == ScheduleAction::Backward)
      --held;
  }
  estimate.microBatchesInFlight = most;
  estimate.activationBytes = estimate.arenaBytes + estimate.stashBytes;
  return estimate;
}

/// Whether the CUDA trainer keeps `train`'s gradients in its arena instead
/// of a gradient buffer (runtime/src/cuda/Trainer.cpp, docs/Memory.md):
/// one micro-batch per iteration, no data-parallel gradient buffer, no
/// loss scaling, and exactly one f32 gradient result per parameter the
/// step reads (a result `mt.gradient` of a partitioned step, or an
/// mt.accumulate_gradient).
static bool gradientsLiveInArena(ModuleOp module, func::FuncOp train,
                                 const CompileConfig &config) {
  if (config.globalBatchSize() !=
          config.batch.microBatchSize * config.parallel.dataParallelSize ||
      config.precision == Precision::FP16)
    return false;
  for (auto function : module.getOps<func::FuncOp>())
    if (function->hasAttr("mt.gradient_buffer"))
      return false;
  llvm::StringMap<int> gradients;
  for (unsigned i = 0, e = train.getNumResults(); i < e; ++i)
    if (auto name =
            train.getResultAttrOfType<FlatSymbolRefAttr>(i, "mt.gradient")) {
      auto type = cast<RankedTensorType>(train.getResultTypes()[i]);
      if (!type.getElementType().isF32())
        return false;
      ++gradients[name.getValue()];
    }
  WalkResult typed = train.walk([&](mt::AccumulateGradientOp op) {
    if (!cast<RankedTensorType>(op.getGradient().getType())
             .getElementType()
             .isF32())
      return WalkResult::interrupt();
    ++gradients[op.getParameter()];
    return WalkResult::advance();
  });
  if (typed.wasInterrupted())
    return false;
  llvm::StringSet<> read;
  for (BlockArgument argument : train.getArguments())
    if (auto name = train.getArgAttrOfType<FlatSymbolRefAttr>(
            argument.getArgNumber(), "mt.parameter"))
      read.insert(name.getValue());
  train.walk([&](mt::GetParameterOp op) { read.insert(op.getName()); });
  if (read.size() != gradients.size())
    return false;
  for (const auto &entry : read)
    if (gradients.lookup(entry.getKey()) != 1)
      return false;
  return true;
}

MemoryEstimate megatron::estimateMemory(ModuleOp module,
                                        const CompileConfig &config,
                                        const PipelinePlan *pipeline,
                                        int64_t pipelineRank) {
  if (pipeline)
    return estimatePipelineRank(module, config, *pipeline, pipelineRank);
  MemoryEstimate estimate;
  estimate.savedBytesByLayer.assign(config.model.numLayers, 0);
  // The plan the bundle writer writes (the CUDA backend's side buffers under
  // the bundle's precision).
  mt::SideBufferOptions storage;
  storage.mixedPrecision = config.precision == Precision::BF16;
  auto train = module.lookupSymbol<func::FuncOp>("train_step");
  auto eval = module.lookupSymbol<func::FuncOp>("eval_step");
  if (eval)
    estimate.evalArenaBytes = mt::planFunctionMemory(eval, storage).arenaBytes;
  if (!train)
    return estimate;
  SmallVector<func::FuncOp> evals;
  if (eval)
    evals.push_back(eval);
  countWeights({train}, evals, config, storage, estimate);
  countExperts({train}, estimate);
  unshardExpertMoments(config, estimate);
  countAllToAlls(train, estimate);
  if (gradientsLiveInArena(module, train, config)) {
    estimate.gradientsInArena = true;
    estimate.gradientBytes = 0;
  }

  mt::FunctionMemoryPlan plan = mt::planFunctionMemory(train, storage);
  estimate.activationBytes = plan.arenaBytes;
  estimate.arenaBytes = plan.arenaBytes;
  estimate.peakSideBufferBytes = plan.peakSideBufferBytes;
  estimate.peakInstruction = plan.peakAt;
  estimate.numInstructions = plan.numInstructions;
  estimate.inPlaceResults = plan.numInPlace;
  countRecomputed(train, estimate);

  Block &body = train.getBody().front();
  auto ret = cast<func::ReturnOp>(body.getTerminator());
  const mt::BufferPlan *loss = plan.lookup(ret.getOperand(0));
  int64_t lossAt = loss ? loss->definedAt : plan.numInstructions;
  for (const mt::BufferPlan &buffer : plan.buffers) {
    if (buffer.offset < 0 || buffer.definedAt < 0 ||
        buffer.definedAt > lossAt || buffer.lastUse <= lossAt ||
        buffer.value == ret.getOperand(0) || !buffer.value.getDefiningOp())
      continue;
    addSaved(buffer.value.getDefiningOp(), buffer.bytes, config, estimate);
  }
  // Side buffers kept across the loss: state saved for a gradient, bf16
  // copies of the operands of GEMMs on both sides.
  for (const mt::SideBufferPlan &side : plan.sideBuffers) {
    if (!side.op || side.position > lossAt || side.until <= lossAt)
      continue;
    addSaved(side.op, side.bytes, config, estimate);
  }
  return estimate;
}

std::string megatron::formatBytes(double bytes) {
  const char *units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  int unit = 0;
  while (unit < 4 && std::abs(bytes) >= 1024.0) {
    bytes /= 1024.0;
    ++unit;
  }
  if (unit == 0)
    return llvm::formatv("{0} B", static_cast<int64_t>(bytes)).str();
  return llvm::formatv("{0:F2} {1}", bytes, units[unit]).str();
}

llvm::Expected<int64_t> megatron::parseByteSize(llvm::StringRef text) {
  llvm::StringRef number = text.trim();
  struct Suffix {
    const char *name;
    double scale;
  };
  // Binary units first, so "GiB" is not read as "G" + "iB".
  static const Suffix suffixes[] = {
      {"TiB", 1099511627776.0}, {"GiB", 1073741824.0}, {"MiB", 1048576.0},
      {"KiB", 1024.0},          {"TB", 1e12},          {"GB", 1e9},
      {"MB", 1e6},              {"KB", 1e3},           {"B", 1.0}};
  double scale = 1.0;
  for (const Suffix &suffix : suffixes)
    if (number.consume_back_insensitive(suffix.name)) {
      scale = suffix.scale;
      break;
    }
  number = number.trim();
  double value = 0;
  if (number.empty() || number.getAsDouble(value) || !(value > 0) ||
      value * scale > 9.0e18)
    return llvm::createStringError(
        "--memory-budget: '" + text.str() +
        "' is not a positive size; give bytes (17179869184) or a number with "
        "a unit: KiB, MiB, GiB, TiB (powers of 1024) or KB, MB, GB, TB");
  return static_cast<int64_t>(value * scale);
}
