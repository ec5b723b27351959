// RUN: megatron-opt %s -split-input-file -mt-differentiate-pipeline-stages -verify-diagnostics | FileCheck %s

// A middle stage: the gradient of its output comes in as an argument, the
// gradient of its input activation goes out as the second result, and its
// parameter's gradient is accumulated.

mt.parameter @w : tensor<8x8xf32> init = normal std = 2.000000e-02

// CHECK-LABEL: func.func @train_step_stage1
// CHECK-SAME: (%[[H:.+]]: tensor<2x4x8xf32>, %[[DOUT:.+]]: tensor<2x4x8xf32> {mt.name = "output_gradient"})
// CHECK-SAME: -> (tensor<2x4x8xf32>, tensor<2x4x8xf32> {mt.name = "input_gradient"})
func.func @train_step_stage1(%h: tensor<2x4x8xf32>) -> tensor<2x4x8xf32> attributes {mt.pipeline_stage = 1 : i64} {
  // CHECK: %[[W:.+]] = mt.get_parameter @w
  %w = mt.get_parameter @w : tensor<8x8xf32>
  // CHECK: %[[Y:.+]] = mt.linear %[[H]], %[[W]]
  %y = mt.linear %h, %w : (tensor<2x4x8xf32>, tensor<8x8xf32>) -> tensor<2x4x8xf32>
  // CHECK: %[[A:.+]] = mt.silu %[[Y]]
  %a = mt.silu %y : tensor<2x4x8xf32>
  // CHECK: %[[DY:.+]] = mt.silu_grad %[[DOUT]], %[[Y]]
  // CHECK: %[[DH:.+]] = mt.linear %[[DY]], %[[W]] transpose_weight
  // CHECK: %[[DW:.+]] = mt.linear_weight_grad %[[H]], %[[DY]]
  // CHECK: mt.accumulate_gradient @w, %[[DW]]
  // CHECK: return %[[A]], %[[DH]]
  return %a : tensor<2x4x8xf32>
}

// Not a stage: untouched.
// CHECK-LABEL: func.func @eval_step_stage1
// CHECK-SAME: (%{{.+}}: tensor<2x4x8xf32>) -> tensor<2x4x8xf32>
func.func @eval_step_stage1(%h: tensor<2x4x8xf32>) -> tensor<2x4x8xf32> attributes {mt.pipeline_stage = 1 : i64} {
  return %h : tensor<2x4x8xf32>
}

// -----

// The last stage: the loss's gradient is an argument (the runtime passes 1);
// the first stage's input is the tokens, which get no gradient.

mt.parameter @table : tensor<16x8xf32> init = normal std = 2.000000e-02

// CHECK-LABEL: func.func @train_step_stage0
// CHECK-SAME: (%{{.+}}: tensor<2x4xi32>, %[[DOUT:.+]]: tensor<2x4x8xf32> {mt.name = "output_gradient"}) -> tensor<2x4x8xf32>
func.func @train_step_stage0(%ids: tensor<2x4xi32>) -> tensor<2x4x8xf32> attributes {mt.pipeline_stage = 0 : i64} {
  %table = mt.get_parameter @table : tensor<16x8xf32>
  %h = mt.embedding %table, %ids : (tensor<16x8xf32>, tensor<2x4xi32>) -> tensor<2x4x8xf32>
  // CHECK: %[[DT:.+]] = mt.embedding_grad %[[DOUT]]
  // CHECK: mt.accumulate_gradient @table, %[[DT]]
  return %h : tensor<2x4x8xf32>
}

// CHECK-LABEL: func.func @train_step_stage1
// CHECK-SAME: (%[[H:.+]]: tensor<2x4x8xf32>, %[[LABELS:.+]]: tensor<2x4xi32>, %[[DLOSS:.+]]: tensor<f32> {mt.name = "loss_gradient"})
// CHECK-SAME: -> (tensor<f32>, tensor<2x4x8xf32> {mt.name = "input_gradient"})
func.func @train_step_stage1(%h: tensor<2x4x8xf32>, %labels: tensor<2x4xi32>) -> tensor<f32> attributes {mt.pipeline_stage = 1 : i64} {
  %loss = mt.cross_entropy %h, %labels reduction = mean : (tensor<2x4x8xf32>, tensor<2x4xi32>) -> tensor<f32>
  // CHECK: %[[DH:.+]] = mt.cross_entropy_grad %[[DLOSS]], %[[H]], %[[LABELS]]
  // CHECK: return %{{.+}}, %[[DH]]
  return %loss : tensor<f32>
}

// -----

// expected-error @+1 {{'func.func' op is not a pipeline stage: it needs one block, an input and one result (its output activation or the loss), optionally followed by scalar results named aux_loss, then load_balancing_loss (or seq_load_balancing_loss) and z_loss}}
func.func @train_step_stage0(%h: tensor<2x4x8xf32>) -> (tensor<2x4x8xf32>, tensor<2x4x8xf32>) attributes {mt.pipeline_stage = 0 : i64} {
  return %h, %h : tensor<2x4x8xf32>, tensor<2x4x8xf32>
}

// -----

// A stage's MoE auxiliary losses (a second, scalar result named aux_loss):
// their gradient is a fill of 1 marked loss_seed, and the input's gradient
// comes after them.

mt.parameter @router : tensor<4x8xf32> init = normal std = 2.000000e-02

// CHECK-LABEL: func.func @train_step_stage1
// CHECK-SAME: (%[[H:.+]]: tensor<8x8xf32>, %[[DOUT:.+]]: tensor<8x8xf32> {mt.name = "output_gradient"})
// CHECK-SAME: -> (tensor<8x8xf32>, tensor<f32> {mt.name = "aux_loss"}, tensor<8x8xf32> {mt.name = "input_gradient"})
func.func @train_step_stage1(%h: tensor<8x8xf32>) -> (tensor<8x8xf32>, tensor<f32> {mt.name = "aux_loss"}) attributes {mt.pipeline_stage = 1 : i64} {
  %router = mt.get_parameter @router : tensor<4x8xf32>
  // CHECK: %[[LOGITS:.+]] = mt.linear %[[H]]
  %logits = mt.linear %h, %router transpose_weight : (tensor<8x8xf32>, tensor<4x8xf32>) -> tensor<8x4xf32>
  // CHECK: %[[Z:.+]] = mt.moe_z_loss %[[LOGITS]]
  %z = mt.moe_z_loss %logits coeff = 1.000000e-03 : (tensor<8x4xf32>) -> tensor<f32>
  // CHECK: %[[SEED:.+]] = mt.fill 1.000000e+00 {mt.loss_seed} : tensor<f32>
  // CHECK: %[[DLOGITS:.+]] = mt.moe_z_loss_grad %[[SEED]], %[[LOGITS]]
  // CHECK: mt.linear %[[DLOGITS]]
  // CHECK: mt.linear_weight_grad
  // CHECK: mt.accumulate_gradient @router
  // CHECK: return %[[H]], %[[Z]], %{{.+}}
  return %h, %z : tensor<8x8xf32>, tensor<f32>
}

// -----

mt.parameter @w : tensor<8x8xf32> init = normal std = 2.000000e-02

// expected-error @+1 {{'func.func' op its output does not depend on its input activation, so no gradient reaches the stage before it}}
func.func @train_step_stage1(%h: tensor<2x4x8xf32>) -> tensor<8x8xf32> attributes {mt.pipeline_stage = 1 : i64} {
  %w = mt.get_parameter @w : tensor<8x8xf32>
  %a = mt.silu %w : tensor<8x8xf32>
  return %a : tensor<8x8xf32>
}
