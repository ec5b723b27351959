//===- Pipelines.h - The compiler's pass pipelines -------------*- C++ -*-===//

#ifndef MEGATRON_PIPELINES_PIPELINES_H
#define MEGATRON_PIPELINES_PIPELINES_H

#include "megatron/Frontend/CompileConfig.h"
#include "mt/Transforms/Recompute.h"

#include "mlir/Pass/PassOptions.h"
#include "llvm/ADT/StringRef.h"

#include <string>

namespace mlir {
class OpPassManager;
} // namespace mlir

namespace megatron {

struct TrainingPipelineOptions
    : public mlir::PassPipelineOptions<TrainingPipelineOptions> {
  Option<std::string> trainFunction{
      *this, "train-function",
      llvm::cl::desc("The step function to differentiate"),
      llvm::cl::init("train_step")};
  Option<bool> pipelineStages{
      *this, "pipeline-stages",
      llvm::cl::desc("Differentiate each pipeline stage of the train "
                     "function (train_step_stage<k>) instead of the whole "
                     "step"),
      llvm::cl::init(false)};
  Option<std::string> recomputeGranularity{
      *this, "recompute-granularity",
      llvm::cl::desc("none, selective or full (see mt-recompute)"),
      llvm::cl::init("none")};
  Option<std::string> recomputeMethod{
      *this, "recompute-method",
      llvm::cl::desc("uniform or block, for full recomputation"),
      llvm::cl::init("uniform")};
  Option<int64_t> recomputeNumLayers{
      *this, "recompute-num-layers",
      llvm::cl::desc("Layers per group (uniform) or recomputed (block)"),
      llvm::cl::init(1)};
};

/// From the model-level module the front end builds to the one a bundle is
/// written from: differentiates train_step (its backward pass and gradient
/// accumulation), or each of its pipeline stages, removes redundant work,
/// and applies the recomputation policy (mt-recompute; after CSE, which
/// would merge the clones back).
void buildTrainingPipeline(mlir::OpPassManager &pm,
                           const TrainingPipelineOptions &options);

struct PartitionPipelineOptions
    : public mlir::PassPipelineOptions<PartitionPipelineOptions> {
  Option<int64_t> tensorParallelSize{
      *this, "tensor-parallel-size",
      llvm::cl::desc("Ranks of the tensor-parallel grid axis"),
      llvm::cl::init(1)};
  Option<int64_t> dataParallelSize{
      *this, "data-parallel-size",
      llvm::cl::desc("Ranks of the data-parallel grid axis"),
      llvm::cl::init(1)};
  Option<bool> sequenceParallel{
      *this, "sequence-parallel",
      llvm::cl::desc("Megatron-LM's sequence parallelism: norms, dropout and "
                     "residual adds on sequence shards of the tensor-parallel "
                     "ranks"),
      llvm::cl::init(false)};
  Option<int64_t> contextParallelSize{
      *this, "context-parallel-size",
      llvm::cl::desc("Ranks of the context-parallel grid axis (the grid is "
                     "data x context x tensor above 1)"),
      llvm::cl::init(1)};
  Option<std::string> cpCommType{
      *this, "cp-comm-type",
      llvm::cl::desc("How attention exchanges keys and values over the "
                     "context axis: p2p (the ring) or all_gather"),
      llvm::cl::init("p2p")};
  Option<int64_t> expertParallelSize{
      *this, "expert-parallel-size",
      llvm::cl::desc("Megatron-LM's --expert-model-parallel-size: the routed "
                     "experts split over the data axis (its size here), "
                     "tokens dispatched to them by all-to-all"),
      llvm::cl::init(1)};
  Option<bool> distributedOptimizer{
      *this, "distributed-optimizer",
      llvm::cl::desc("Shard the optimizer over the data-parallel ranks "
                     "(reduce-scatter gradients, all-gather parameters)"),
      llvm::cl::init(false)};
  Option<int64_t> pipelineSize{
      *this, "pipeline-size",
      llvm::cl::desc("Pipeline ranks when the module holds pipeline stages: "
                     "each rank reduces its stages' gradients in a buffer of "
                     "its own, once per iteration (docs/Pipeline.md)"),
      llvm::cl::init(0)};
  Option<int64_t> gradientBucketSize{
      *this, "gradient-bucket-size",
      llvm::cl::desc("Megatron-LM's --overlap-grad-reduce: gradient buckets "
                     "of at least this many elements, each reduced during "
                     "the last micro-batch's backward pass; 0: one "
                     "reduction after it"),
      llvm::cl::init(0)};
  Option<bool> overlapParamGather{
      *this, "overlap-param-gather",
      llvm::cl::desc("Megatron-LM's --overlap-param-gather: gather each "
                     "bucket's updated parameters before their first use in "
                     "the next step (needs distributed-optimizer and "
                     "gradient-bucket-size > 0)"),
      llvm::cl::init(false)};
};

/// From the training pipeline's output to per-rank (SPMD) IR: parameters and
/// gradients become arguments and results, Megatron-LM's layout is annotated,
/// upstream shard propagates and partitions, and the all-reduces of summed
/// partials are combined, and the data-parallel gradient reduction
/// moves out of the step into its own functions, run once per iteration. See docs/Parallelism.md.
void buildPartitionPipeline(mlir::OpPassManager &pm,
                            const PartitionPipelineOptions &options);

/// For pipeline parallelism, after the training (and partition) pipelines:
/// each differentiated stage split into its forward and backward functions
/// (mt-split-forward-backward). See docs/Pipeline.md.
void buildStageSplitPipeline(mlir::OpPassManager &pm);

struct FusionPipelineOptions
    : public mlir::PassPipelineOptions<FusionPipelineOptions> {
  Option<bool> gemmEpilogues{
      *this, "gemm-epilogues",
      llvm::cl::desc("Fuse the tanh GeLU, its gradient and bias gradients "
                     "into the linear layers' GEMMs (mt-fuse-gemm-epilogues)"),
      llvm::cl::init(true)};
  Option<bool> elementwiseKernels{
      *this, "elementwise-kernels",
      llvm::cl::desc("Group chains of elementwise ops (dropout + residual "
                     "add, ...) into mt.fused ops, each written to the "
                     "bundle as one generated CUDA kernel "
                     "(mt-fuse-elementwise; needs nvrtc to write a bundle)"),
      llvm::cl::init(false)};
  Option<bool> linearCrossEntropy{
      *this, "linear-cross-entropy",
      llvm::cl::desc("Fuse the output layer's linear, cross-entropy and "
                     "their gradients into one op over chunks of tokens, "
                     "without whole-vocabulary logits "
                     "(mt-fuse-linear-cross-entropy; both backends run "
                     "it)"),
      llvm::cl::init(false)};
  Option<int64_t> linearCrossEntropyChunkRows{
      *this, "linear-cross-entropy-chunk-rows",
      llvm::cl::desc("Tokens per chunk of the fused loss (0: the fewest "
                     "even chunks whose logits fit in 1 GiB)"),
      llvm::cl::init(0)};
};

/// Last, on the per-rank functions a bundle is written from: ops fused into
/// the kernels that run them (with linearCrossEntropy first,
/// mt-fuse-linear-cross-entropy: the output layer and its loss; then
/// mt-fuse-gemm-epilogues: GEMMs with their
/// epilogues; then, with elementwiseKernels, mt-fuse-elementwise: the
/// elementwise chains left, each as one generated kernel). Every backend
/// runs the fused ops (the host as the ops they replace).
void buildFusionPipeline(mlir::OpPassManager &pm,
                         const FusionPipelineOptions &options);

/// The boundaries between the pipelines megatron-compile runs, where
/// `megatron-compile --emit mlir --stop-after <boundary>` writes the IR.
enum class PipelineBoundary { Training, Partition, Fusion, Precision };

/// "training", "partition", "fusion" or "precision".
llvm::StringRef getPipelineBoundaryName(PipelineBoundary boundary);

/// megatron-compile's pipelines and their options, in the order they run:
/// training; partition where the layout has more than one tensor- or
/// data-parallel rank; for pipeline parallelism the stage split (part of
/// the partition boundary); fusion; precision. megatron-opt's named pipelines with the
/// same options build the same passes (buildCompilePipeline calls the
/// build functions above), so IR written at a boundary and run through the
/// remaining pipelines with megatron-opt gives megatron-compile's module.
struct CompilePipelineOptions {
  /// The layout as the model file and the flags give it: the partition
  /// pipeline runs for more than one tensor- or data-parallel rank, with its
  /// sequence parallelism and distributed optimizer; pipeline parallelism
  /// (pipeline_model_parallel_size > 1) differentiates and splits stages.
  ParallelConfig parallel;
  /// The recomputation policy: the model file's, or one that --memory-budget
  /// tries.
  mlir::mt::RecomputePolicy recompute;
  /// Megatron-LM's expert_model_parallel_size (a MoE key, not in
  /// ParallelConfig): the routed experts split over the data axis.
  int64_t expertParallelSize = 1;
  bool gemmEpilogues = true;
  bool elementwiseKernels = false;
  bool linearCrossEntropy = false;
  int64_t linearCrossEntropyChunkRows = 0;
  /// After precision: the overlap pipeline (off by default,
  /// docs/Parallelism.md "Overlapped communication").
  /// Implied by parallel.tpCommOverlap, which adds the decomposition.
  bool overlapCollectives = false;
  std::string costModel;
};

/// Adds megatron-compile's pipelines to `pm`, up to and including the one
/// that ends at `stopAfter`.
void buildCompilePipeline(mlir::OpPassManager &pm,
                          const CompilePipelineOptions &options,
                          PipelineBoundary stopAfter = PipelineBoundary::Precision);

/// After the fusion pipeline, last: the precision #mt.model names made the
/// program's types (mt-mixed-precision: bf16 activations and GEMM operands,
/// f32 master weights, gradients, statistics and loss). Nothing is made
/// after it, so no op meets a bf16 gradient it would accumulate.
/// docs/MixedPrecision.md.
void buildPrecisionPipeline(mlir::OpPassManager &pm);

struct OverlapPipelineOptions
    : public mlir::PassPipelineOptions<OverlapPipelineOptions> {
  Option<std::string> costModel{
      *this, "cost-model",
      llvm::cl::desc("the cost model's JSON file (default: "
                     "data/cost-model.json, built in)"),
      llvm::cl::init("")};
  Option<bool> tpCommOverlap{
      *this, "tp-comm-overlap",
      llvm::cl::desc("Megatron-LM's --tp-comm-overlap: first the "
                     "tensor-parallel all-gathers and reduce-scatters beside "
                     "GEMMs in chunks (mt-decompose-collective-matmuls), "
                     "proven again to match (mt-verify-collectives)"),
      llvm::cl::init(false)};
};

/// After the precision pipeline, last, where the types are the stored
/// ones: with tpCommOverlap, the tensor-parallel collectives beside GEMMs in
/// chunks pipelined against chunks of the GEMMs
/// (mt-decompose-collective-matmuls, then mt-verify-collectives again); each
/// collective split into a start and a wait
/// (mt-split-collectives), placed by the cost model so that computation
/// hides it (mt-schedule-collectives). docs/Parallelism.md, "Overlapped
/// communication".
void buildOverlapPipeline(mlir::OpPassManager &pm,
                          const OverlapPipelineOptions &options);

/// Registers the pipelines by name (megatron-training-pipeline,
/// megatron-partition-pipeline, megatron-fusion-pipeline,
/// megatron-precision-pipeline, megatron-overlap-pipeline) for megatron-opt and lit.
void registerPipelines();

} // namespace megatron

#endif // MEGATRON_PIPELINES_PIPELINES_H
