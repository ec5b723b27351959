//===- Pipelines.h - The compiler's pass pipelines -------------*- C++ -*-===//

#ifndef MEGATRON_PIPELINES_PIPELINES_H
#define MEGATRON_PIPELINES_PIPELINES_H

#include "mlir/Pass/PassOptions.h"

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
};

/// From the model-level module the front end builds to the one a bundle is
/// written from: differentiates train_step (its backward pass and gradient
/// accumulation) and removes redundant work.
void buildTrainingPipeline(mlir::OpPassManager &pm,
                           const TrainingPipelineOptions &options);

/// Registers the pipelines by name (megatron-training-pipeline) for
/// megatron-opt and lit.
void registerPipelines();

} // namespace megatron

#endif // MEGATRON_PIPELINES_PIPELINES_H
