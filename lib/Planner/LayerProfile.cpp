//===- LayerProfile.cpp - One layer's cost and memory, compiled -----------===//
//
// A layout's layers cost the same whatever their number, so the planner
// compiles each layout's layers once at one and once at two layers and takes
// the difference: one layer's kernels, collectives, parameters and arena,
// from the same passes and memory plan the bundle gets.
//
//===----------------------------------------------------------------------===//

#include "PlannerInternal.h"

#include "megatron/Frontend/ModelBuilder.h"
#include "megatron/Memory/Memory.h"
#include "megatron/Pipelines/Pipelines.h"
#include "mt/IR/MtOps.h"

#include "mlir/Dialect/Func/IR/FuncOps.h"
#include "mlir/Dialect/Shard/IR/ShardOps.h"
#include "mlir/IR/Diagnostics.h"
#include "mlir/Pass/PassManager.h"

using namespace mlir;
using namespace megatron;
using namespace megatron::planner;

bool planner::compileModel(MLIRContext &context, const CompileConfig &config,
                           const CompileFlags &flags, CompiledModel &out,
                           std::string &error) {
  // The candidates' diagnostics are the planner's to report, not the user's.
  ScopedDiagnosticHandler capture(&context, [&](Diagnostic &diagnostic) {
    if (diagnostic.getSeverity() == DiagnosticSeverity::Error && error.empty())
      error = diagnostic.str();
    return success();
  });
  out.pipelined = config.parallel.pipelineModelParallelSize > 1;
  if (out.pipelined) {
    out.plan.layout = planPipelineLayout(config);
    int64_t v = out.plan.layout.virtualSize;
    ScheduleKind kind =
        v > 1 ? ScheduleKind::Interleaved : ScheduleKind::OneFOneB;
    llvm::Expected<PipelineSchedule> schedule =
        buildPipelineSchedule(kind, out.plan.layout.pipelineSize, v,
                              microBatchesPerIteration(config));
    if (!schedule) {
      error = llvm::toString(schedule.takeError());
      return false;
    }
    out.plan.schedule = std::move(*schedule);
  }
  std::vector<StageLayers> stages =
      out.pipelined ? out.plan.stageLayers() : std::vector<StageLayers>();
  out.module = buildModelModule(context, config, stages);
  CompilePipelineOptions options;
  options.parallel = config.parallel;
  options.recompute = recomputePolicyOf(config.recompute);
  options.expertParallelSize = config.moe.expertModelParallelSize;
  options.gemmEpilogues = flags.gemmEpilogues;
  options.elementwiseKernels = flags.elementwiseKernels;
  options.linearCrossEntropy = flags.linearCrossEntropy;
  options.linearCrossEntropyChunkRows = flags.linearCrossEntropyChunkRows;
  PassManager pm(&context);
  buildCompilePipeline(pm, options);
  if (failed(pm.run(*out.module))) {
    if (error.empty())
      error = "the compile pipelines failed";
    return false;
  }
  if (out.pipelined)
    if (llvm::Error failure = finishPipelinePlan(*out.module, out.plan)) {
      error = llvm::toString(std::move(failure));
      return false;
    }
  return true;
}

mt::CostModel planner::clusterCostModel(const mt::CostModel &base,
                                        const ClusterSpec &cluster) {
  // The built-in figures are the H200's: 989 TFLOP/s dense bf16, 4800 GB/s.
  mt::CostModel model = base;
  double compute = cluster.peakTflops / 989.0;
  for (auto &entry : model.gemmFlopsPerUs)
    entry.second *= compute;
  model.attentionForwardFlopsPerUs *= compute;
  model.attentionBackwardFlopsPerUs *= compute;
  model.memoryBytesPerUs *= cluster.memoryBandwidthGBps / 4800.0;
  model.gpusPerNode = cluster.gpusPerNode;
  model.nvlink = cluster.intraNode;
  model.network = cluster.interNode;
  // Measured kernel times are the H200's: another GPU's scale by its peak.
  model.calibrationScale = 989.0 / cluster.peakTflops;
  return model;
}

namespace {
/// One compile's figures, for the difference of two.
struct Measured {
  double compute = 0, firstCompute = 0, communication = 0;
  int64_t parameters = 0, stateBytes = 0, optimizerBytes = 0;
  int64_t arena = 0, stash = 0;
};
} // namespace

static bool isCollective(Operation *op) {
  return isa<shard::AllReduceOp, shard::AllGatherOp, shard::ReduceScatterOp,
             shard::AllToAllOp, shard::ShiftOp>(op);
}

static Measured measure(ModuleOp module, const CompileConfig &config,
                        const mt::CostModel &costModel) {
  Measured m;
  if (auto step = module.lookupSymbol<func::FuncOp>("train_step")) {
    // Collectives in line with the kernels are exposed whole; the split
    // ones of --tp-comm-overlap only where their wait finds them running.
    mt::CommunicationTimeline timeline;
    DenseMap<Operation *, double> endOf;
    for (Operation &op : step.getBody().front()) {
      if (auto start = dyn_cast<mt::CollectiveStartOp>(op)) {
        double us = costModel.collective(start.getCollective()).us;
        endOf[start.getWait()] = timeline.issue(us).second;
        continue;
      }
      if (isa<mt::CollectiveWaitOp>(op)) {
        timeline.wait(endOf.lookup(&op));
        continue;
      }
      if (isCollective(&op)) {
        timeline.wait(timeline.issue(costModel.collective(&op).us).second);
        continue;
      }
      double us = costModel.opMicroseconds(&op);
      timeline.compute(us);
      if (isa<mt::EmbeddingOp, mt::EmbeddingGradOp, mt::PositionIdsOp>(op))
        m.firstCompute += us;
    }
    m.compute = timeline.computeUs;
    m.communication = timeline.exposedUs;
  }
  MemoryEstimate estimate = estimateMemory(module, config);
  m.parameters = estimate.parameterElements;
  // Gradients as the runtime keeps them beside the arena (fp32), whatever
  // the profile's one micro-batch let the plan do.
  int64_t gradients = estimate.gradientsInArena ? 4 * estimate.parameterElements
                                                : estimate.gradientBytes;
  m.stateBytes = estimate.parameterBytes + estimate.bf16ParameterBytes +
                 gradients + estimate.optimizerBytes;
  m.optimizerBytes = estimate.optimizerBytes;
  m.arena = std::max(estimate.activationBytes, estimate.evalArenaBytes);
  for (int64_t bytes : estimate.savedBytesByLayer)
    m.stash = std::max(m.stash, bytes);
  return m;
}

bool planner::profileLayers(MLIRContext &context, const CompileConfig &base,
                            const CompileFlags &flags, const Layout &layout,
                            int64_t period, const mt::CostModel &costModel,
                            const ClusterSpec &cluster, StepProfile &out,
                            std::string &error) {
  Measured measured[2];
  for (int64_t layers : {1, 2}) {
    CompileConfig config = base;
    Layout one = layout;
    one.pp = 1;
    one.vp = 1;
    // Expert parallelism splits the experts over data-parallel ranks; the
    // other data-parallel ranks only repeat the same program.
    one.dp = layout.ep;
    one.distributedOptimizer = false;
    one.applyTo(config);
    config.model.numLayers = layers * period;
    // Two micro-batches: gradients accumulate beside the arena, as in
    // every layout with several micro-batches or data-parallel ranks.
    config.batch.globalBatchSize = 2 * layout.microBatch * one.dp;
    if (llvm::Error invalid = validateCompileConfig(config)) {
      error = llvm::toString(std::move(invalid));
      return false;
    }
    CompiledModel compiled;
    if (!compileModel(context, config, flags, compiled, error))
      return false;
    measured[layers - 1] =
        measure(*compiled.module, config, clusterCostModel(costModel, cluster));
  }
  const Measured &one = measured[0], &two = measured[1];
  out.layerCompute = two.compute - one.compute;
  out.firstCompute = one.firstCompute;
  out.lastCompute =
      std::max(0.0, one.compute - out.layerCompute - one.firstCompute);
  out.layerCommunication = two.communication - one.communication;
  out.otherCommunication =
      std::max(0.0, one.communication - out.layerCommunication);
  out.layerParameters = two.parameters - one.parameters;
  out.otherParameters = one.parameters - out.layerParameters;
  out.layerStateBytes = two.stateBytes - one.stateBytes;
  out.otherStateBytes = one.stateBytes - out.layerStateBytes;
  out.layerOptimizerBytes = two.optimizerBytes - one.optimizerBytes;
  out.otherOptimizerBytes = one.optimizerBytes - out.layerOptimizerBytes;
  out.arenaOneLayer = one.arena;
  out.arenaPerLayer = std::max<int64_t>(0, two.arena - one.arena);
  out.stashPerLayer = two.stash;
  return true;
}

std::vector<int64_t> planner::profiledMicroBatches(const Layout &layout) {
  if (layout.microBatch == 1 || layout.tpCommOverlap)
    return {layout.microBatch};
  return {1, 2};
}

StepProfile planner::profileForMicroBatch(const StepProfile &one,
                                          const StepProfile &two, int64_t first,
                                          int64_t microBatch) {
  double k = double(microBatch - first);
  auto real = [&](double a, double b) { return a + k * (b - a); };
  auto bytes = [&](int64_t a, int64_t b) {
    return a + static_cast<int64_t>(k * double(b - a));
  };
  StepProfile p = one;
  p.layerCompute = real(one.layerCompute, two.layerCompute);
  p.firstCompute = real(one.firstCompute, two.firstCompute);
  p.lastCompute = real(one.lastCompute, two.lastCompute);
  p.layerCommunication = real(one.layerCommunication, two.layerCommunication);
  p.otherCommunication = real(one.otherCommunication, two.otherCommunication);
  p.arenaOneLayer = bytes(one.arenaOneLayer, two.arenaOneLayer);
  p.arenaPerLayer = bytes(one.arenaPerLayer, two.arenaPerLayer);
  p.stashPerLayer = bytes(one.stashPerLayer, two.stashPerLayer);
  return p;
}
