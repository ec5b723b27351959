//===- Pipelines.cpp - The compiler's pass pipelines ----------------------===//

#include "megatron/Pipelines/Pipelines.h"

#include "mt/Transforms/Passes.h"

#include "mlir/Pass/PassManager.h"
#include "mlir/Pass/PassRegistry.h"
#include "mlir/Transforms/Passes.h"

void megatron::buildTrainingPipeline(mlir::OpPassManager &pm,
                                     const TrainingPipelineOptions &options) {
  mlir::mt::DifferentiatePassOptions differentiate;
  differentiate.functionName = options.trainFunction;
  pm.addPass(mlir::mt::createDifferentiatePass(differentiate));
  pm.addPass(mlir::createCSEPass());
}

void megatron::registerPipelines() {
  mlir::PassPipelineRegistration<TrainingPipelineOptions>(
      "megatron-training-pipeline",
      "From the model-level IR to the IR a training bundle is written from",
      buildTrainingPipeline);
}
