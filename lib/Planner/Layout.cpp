//===- Layout.cpp - A candidate layout, as keys and as flags --------------===//

#include "megatron/Planner/Planner.h"

#include "llvm/Support/FormatVariadic.h"

using namespace megatron;

void Layout::applyTo(CompileConfig &config) const {
  ParallelConfig &p = config.parallel;
  p.tensorModelParallelSize = tp;
  p.sequenceParallel = sequenceParallel;
  p.pipelineModelParallelSize = pp;
  p.virtualPipelineModelParallelSize = vp > 1 ? vp : 0;
  p.numLayersPerVirtualPipelineStage = 0;
  p.decoderFirstPipelineNumLayers = 0;
  p.decoderLastPipelineNumLayers = 0;
  p.contextParallelSize = cp;
  p.dataParallelSize = dp;
  p.useDistributedOptimizer = distributedOptimizer;
  // Buckets reduced during the last micro-batch's backward pass, and with
  // the distributed optimizer gathered during the next forward pass: the
  // same bits as without (docs/Parallelism.md), so always on with data
  // parallel.
  p.overlapGradReduce = dp > 1;
  p.tpCommOverlap = tpCommOverlap;
  p.overlapParamGather = dp > 1 && distributedOptimizer;
  config.moe.expertModelParallelSize = ep;
  config.batch.microBatchSize = microBatch;
  config.recompute.granularity = recompute;
  config.recompute.method = "uniform";
  config.recompute.numLayers = 1;
}

llvm::StringRef Layout::recomputeName() const {
  switch (recompute) {
  case RecomputeGranularity::None:
    return "none";
  case RecomputeGranularity::Selective:
    return "selective";
  case RecomputeGranularity::Full:
    return "full";
  }
  return "none";
}

std::string Layout::flags() const {
  // Every layout key, so that the flags override whatever the model file
  // sets.
  std::string text = llvm::formatv(
      "--tensor-model-parallel-size {0} --sequence-parallel={1} "
      "--pipeline-model-parallel-size {2} "
      "--virtual-pipeline-model-parallel-size {3} "
      "--context-parallel-size {4} --data-parallel-size {5}",
      tp, sequenceParallel ? "true" : "false", pp, vp > 1 ? vp : 0, cp, dp);
  if (tpCommOverlap)
    text += " --tp-comm-overlap";
  if (ep > 1)
    text += llvm::formatv(" --expert-model-parallel-size {0}", ep);
  text += llvm::formatv(" --use-distributed-optimizer={0} "
                        "--overlap-grad-reduce={1}",
                        distributedOptimizer ? "true" : "false",
                        dp > 1 ? "true" : "false");
  if (dp > 1 && distributedOptimizer)
    text += " --overlap-param-gather";
  text += llvm::formatv(" --micro-batch-size {0} --recompute-granularity {1}",
                        microBatch, recomputeName());
  return text;
}

std::string Layout::family() const {
  std::string text = llvm::formatv("tp{0} pp{1} cp{2}", tp, pp, cp);
  if (ep > 1)
    text += llvm::formatv(" ep{0}", ep);
  return text;
}
