//===- ModelBuilder.h - A CompileConfig into model-level (mt) IR -*- C++ -*-===//

#ifndef MEGATRON_FRONTEND_MODELBUILDER_H
#define MEGATRON_FRONTEND_MODELBUILDER_H

#include "megatron/Frontend/CompileConfig.h"
#include "mt/IR/MtDialect.h"

#include "mlir/IR/BuiltinOps.h"
#include "mlir/IR/OwningOpRef.h"

namespace megatron {

/// Builds the model-level module of a validated configuration: one
/// `mt.parameter` per trainable tensor (Hugging Face's GPT-2 names for models
/// with learned absolute positions, Llama's for rotary ones), and the
/// functions
///
///   train_step(tokens, labels: tensor<B x S x i32>) -> tensor<f32>
///   eval_step(tokens, labels: tensor<B x S x i32>) -> tensor<f32>
///   predict_step(tokens: tensor<B x S x i32>) -> tensor<B x S x V x f32>
///
/// computing the mean cross-entropy loss of one micro-batch on every
/// data-parallel rank (B = micro_batch_size * data_parallel_size, the global
/// shape that data parallelism later shards), or the logits over the padded
/// vocabulary V; only train_step has dropout.
/// Shapes are global; values are f32 (precision is chosen when lowering).
///
/// With two or more pipeline `stages` (contiguous layer ranges in model
/// order), the steps are built per stage instead: train_step_stage<k>,
/// eval_step_stage<k> and predict_step_stage<k>, marked
/// `mt.pipeline_stage = k`; the first takes the tokens and embeds them, the
/// last takes the previous stage's activation (and, but for predict, the
/// labels) and returns the loss (the logits), the others map an activation
/// (B x S x hidden, f32) to the next.
///
/// The module carries `mt.model` (modelAttr): what it trains, which the
/// bundle writer records.
struct StageLayers {
  int64_t firstLayer = 0, numLayers = 0;
};
mlir::OwningOpRef<mlir::ModuleOp>
buildModelModule(mlir::MLIRContext &context, const CompileConfig &config,
                 llvm::ArrayRef<StageLayers> stages = {});

/// The `#mt.model` attribute of `config`: the model's shape, batch, layout
/// and precision, as the bundle's model section records them.
mlir::mt::ModelAttr modelAttr(mlir::MLIRContext &context,
                              const CompileConfig &config);

/// The `#mt.fp8_recipe` of an FP8 configuration (the module attribute
/// `mt.fp8` that `mt-fp8-gemms` reads).
mlir::mt::Fp8RecipeAttr fp8RecipeAttr(mlir::MLIRContext &context,
                                      const Fp8Config &fp8);

} // namespace megatron

#endif // MEGATRON_FRONTEND_MODELBUILDER_H
