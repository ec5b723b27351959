//===- Pipelines.cpp - The compiler's pass pipelines ----------------------===//

#include "megatron/Pipelines/Pipelines.h"

#include "mt/Transforms/Passes.h"
#include "mt/Transforms/PrecisionPasses.h"

#include "mlir/Dialect/Func/IR/FuncOps.h"
#include "mlir/Dialect/Shard/Transforms/Passes.h"
#include "mlir/Pass/PassManager.h"
#include "mlir/Pass/PassRegistry.h"
#include "mlir/Transforms/Passes.h"

void megatron::buildTrainingPipeline(mlir::OpPassManager &pm,
                                     const TrainingPipelineOptions &options) {
  if (options.pipelineStages) {
    mlir::mt::DifferentiatePipelineStagesPassOptions stages;
    stages.prefix = options.trainFunction;
    pm.addPass(mlir::mt::createDifferentiatePipelineStagesPass(stages));
  } else {
    mlir::mt::DifferentiatePassOptions differentiate;
    differentiate.functionName = options.trainFunction;
    pm.addPass(mlir::mt::createDifferentiatePass(differentiate));
  }
  pm.addPass(mlir::createCSEPass());
  if (options.recomputeGranularity != "none") {
    mlir::mt::RecomputePassOptions recompute;
    recompute.functionName = options.trainFunction;
    recompute.granularity = options.recomputeGranularity;
    recompute.method = options.recomputeMethod;
    recompute.numLayers = options.recomputeNumLayers;
    recompute.stages = options.pipelineStages;
    pm.addPass(mlir::mt::createRecomputePass(recompute));
  }
}

void megatron::buildStageSplitPipeline(mlir::OpPassManager &pm) {
  pm.addPass(mlir::mt::createSplitForwardBackwardPass());
  pm.addPass(mlir::createCSEPass());
}

void megatron::buildPartitionPipeline(mlir::OpPassManager &pm,
                                      const PartitionPipelineOptions &options) {
  pm.addPass(mlir::mt::createParametersToArgumentsPass());
  mlir::mt::AnnotateShardingsPassOptions annotate;
  annotate.tensorParallelSize = options.tensorParallelSize;
  annotate.dataParallelSize = options.dataParallelSize;
  annotate.sequenceParallel = options.sequenceParallel;
  annotate.contextParallelSize = options.contextParallelSize;
  annotate.cpCommType = options.cpCommType;
  annotate.expertParallelSize = options.expertParallelSize;
  pm.addPass(mlir::mt::createAnnotateShardingsPass(annotate));
  mlir::OpPassManager &functions = pm.nest<mlir::func::FuncOp>();
  // Forward from the arguments: the batch split of the tokens reaches the
  // backward pass's weight gradients as summed rows, which become
  // data-parallel all-reduces instead of gathered activations.
  mlir::shard::ShardingPropagationOptions propagation;
  propagation.traversal = mlir::shard::TraversalOrder::Forward;
  functions.addPass(mlir::shard::createShardingPropagation(propagation));
  functions.addPass(mlir::shard::createPartition());
  // Before CSE: reshardings of one value in the forward and the backward
  // pass get the same layer, and merge as before.
  functions.addPass(mlir::mt::createLayerReshardingsPass());
  pm.addPass(mlir::createCanonicalizerPass());
  // The backward pass's cross-entropy statistics repeat the forward pass's
  // (each op partitions alone); CSE keeps one set, as Megatron-LM saves them.
  pm.addPass(mlir::createCSEPass());
  pm.addPass(mlir::mt::createCombineAllReducesPass());
  mlir::mt::PlanGradientReductionPassOptions reduction;
  reduction.distributedOptimizer = options.distributedOptimizer;
  reduction.pipelineSize = options.pipelineSize;
  // mt-annotate-shardings' grid dp x cp x tp, or under expert parallelism
  // over part of the data-parallel ranks edp x ep x tp: the buffer reduces
  // over both of the first axes.
  bool expertAxis = options.expertParallelSize > 1 &&
                    options.expertParallelSize < options.dataParallelSize;
  reduction.contextAxis =
      options.contextParallelSize > 1 || expertAxis ? 1 : -1;
  reduction.bucketSize = options.gradientBucketSize;
  reduction.overlapParamGather = options.overlapParamGather;
  pm.addPass(mlir::mt::createPlanGradientReductionPass(reduction));
  // Sequence shards, not gathered tensors, live until the backward pass.
  pm.addPass(mlir::mt::createRegatherInBackwardPass());
  // Last: nothing may change the collectives after they are proven to match.
  pm.addPass(mlir::mt::createVerifyCollectivesPass());
}

void megatron::buildFusionPipeline(mlir::OpPassManager &pm,
                                   const FusionPipelineOptions &options) {
  // First: the output layer's data-gradient linear is not one the
  // epilogues would take, but its ops must be whole when matched.
  if (options.linearCrossEntropy) {
    mlir::mt::FuseLinearCrossEntropyPassOptions loss;
    loss.chunkRows = options.linearCrossEntropyChunkRows;
    pm.addPass(mlir::mt::createFuseLinearCrossEntropyPass(loss));
  }
  if (options.gemmEpilogues)
    pm.addPass(mlir::mt::createFuseGemmEpiloguesPass());
  // After the epilogues: the GeLU and gradients they take are gone, and
  // the groups hold only what stays elementwise.
  if (options.elementwiseKernels)
    pm.addPass(mlir::mt::createFuseElementwisePass());
}

llvm::StringRef megatron::getPipelineBoundaryName(PipelineBoundary boundary) {
  switch (boundary) {
  case PipelineBoundary::Training:
    return "training";
  case PipelineBoundary::Partition:
    return "partition";
  case PipelineBoundary::Fusion:
    return "fusion";
  case PipelineBoundary::Precision:
    return "precision";
  }
  return "precision";
}

void megatron::buildCompilePipeline(mlir::OpPassManager &pm,
                                    const CompilePipelineOptions &options,
                                    PipelineBoundary stopAfter) {
  const ParallelConfig &parallel = options.parallel;
  const mlir::mt::RecomputePolicy &recompute = options.recompute;
  const bool pipelined = parallel.pipelineModelParallelSize > 1;
  TrainingPipelineOptions training;
  training.recomputeGranularity =
      recompute.granularity == mlir::mt::RecomputeGranularity::None ? "none"
      : recompute.granularity == mlir::mt::RecomputeGranularity::Selective
          ? "selective"
          : "full";
  training.recomputeMethod =
      recompute.method == mlir::mt::RecomputeMethod::Block ? "block"
                                                           : "uniform";
  training.recomputeNumLayers = recompute.numLayers;
  training.pipelineStages = pipelined;
  buildTrainingPipeline(pm, training);
  if (stopAfter == PipelineBoundary::Training)
    return;
  // Tensor, context and data parallelism partition each pipeline stage.
  if (parallel.tensorModelParallelSize * parallel.dataParallelSize *
          parallel.contextParallelSize >
      1) {
    PartitionPipelineOptions partition;
    partition.tensorParallelSize = parallel.tensorModelParallelSize;
    partition.dataParallelSize = parallel.dataParallelSize;
    partition.sequenceParallel = parallel.sequenceParallel;
    partition.contextParallelSize = parallel.contextParallelSize;
    partition.expertParallelSize = options.expertParallelSize;
    partition.cpCommType =
        parallel.cpCommType == CpCommType::AllGather ? "all_gather" : "p2p";
    // One rank has nothing to shard the optimizer over: the plain
    // optimizer is the distributed one with a single shard.
    partition.distributedOptimizer = parallel.useDistributedOptimizer;
    partition.pipelineSize =
        pipelined ? parallel.pipelineModelParallelSize : 0;
    partition.gradientBucketSize =
        parallel.overlapGradReduce ? parallel.bucketElements() : 0;
    partition.overlapParamGather = parallel.overlapParamGather;
    buildPartitionPipeline(pm, partition);
  }
  if (pipelined)
    buildStageSplitPipeline(pm);
  if (stopAfter == PipelineBoundary::Partition)
    return;
  FusionPipelineOptions fusion;
  fusion.gemmEpilogues = options.gemmEpilogues;
  fusion.elementwiseKernels = options.elementwiseKernels;
  fusion.linearCrossEntropy = options.linearCrossEntropy;
  fusion.linearCrossEntropyChunkRows = options.linearCrossEntropyChunkRows;
  buildFusionPipeline(pm, fusion);
  if (stopAfter == PipelineBoundary::Fusion)
    return;
  buildPrecisionPipeline(pm);
  if (options.overlapCollectives || parallel.tpCommOverlap) {
    OverlapPipelineOptions overlap;
    overlap.costModel = options.costModel;
    overlap.tpCommOverlap = parallel.tpCommOverlap;
    buildOverlapPipeline(pm, overlap);
  }
}

void megatron::buildOverlapPipeline(mlir::OpPassManager &pm,
                                    const OverlapPipelineOptions &options) {
  if (options.tpCommOverlap) {
    pm.addPass(mlir::mt::createDecomposeCollectiveMatmulsPass());
    // The chunks are new collectives: every rank must still issue the same.
    pm.addPass(mlir::mt::createVerifyCollectivesPass());
  }
  pm.addPass(mlir::mt::createSplitCollectivesPass());
  mlir::mt::ScheduleCollectivesPassOptions schedule;
  schedule.costModel = options.costModel;
  pm.addPass(mlir::mt::createScheduleCollectivesPass(schedule));
}

void megatron::buildPrecisionPipeline(mlir::OpPassManager &pm) {
  pm.addPass(mlir::mt::createMixedPrecisionPass());
  pm.addPass(mlir::mt::createFp8GemmsPass());
  // On the typed IR: a group's column sums stay f32 (only with the
  // generated kernels, mt.elementwise_kernels).
  pm.addPass(mlir::mt::createFuseColumnSumsPass());
}

void megatron::registerPipelines() {
  mlir::PassPipelineRegistration<TrainingPipelineOptions>(
      "megatron-training-pipeline",
      "From the model-level IR to the IR a training bundle is written from",
      buildTrainingPipeline);
  mlir::PassPipelineRegistration<PartitionPipelineOptions>(
      "megatron-partition-pipeline",
      "From the training pipeline's IR to per-rank IR with collectives",
      buildPartitionPipeline);
  mlir::PassPipelineRegistration<FusionPipelineOptions>(
      "megatron-fusion-pipeline",
      "Ops fused into the kernels that run them (last, per rank)",
      buildFusionPipeline);
  mlir::PassPipelineRegistration<>(
      "megatron-precision-pipeline",
      "The types the precision in #mt.model stores (last, after fusion)",
      buildPrecisionPipeline);
  mlir::PassPipelineRegistration<OverlapPipelineOptions>(
      "megatron-overlap-pipeline",
      "Collectives split into starts and waits and placed by the cost model "
      "(last, after precision)",
      buildOverlapPipeline);
}
