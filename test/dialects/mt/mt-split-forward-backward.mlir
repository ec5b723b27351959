// RUN: megatron-opt %s -split-input-file -mt-split-forward-backward -verify-diagnostics | FileCheck %s

// A differentiated middle stage becomes a forward function that returns its
// output and the stash (the forward values the backward pass reads), and a
// backward function that takes the stash (in the order the backward pass
// first reads it) and the output's gradient. The
// parameter view is read again, not stashed; the weight-gradient product,
// which only the backward pass needs, moves there.

mt.parameter @w : tensor<8x8xf32> init = normal std = 2.000000e-02

// CHECK-LABEL: func.func @train_step_stage1_forward
// CHECK-SAME: (%[[H:.+]]: tensor<2x4x8xf32>) -> (tensor<2x4x8xf32>, tensor<2x4x8xf32> {mt.name = "stash"}, tensor<2x4x8xf32> {mt.name = "stash"})
// CHECK-SAME: mt.pipeline_stage = 1
// CHECK: %[[W:.+]] = mt.get_parameter @w
// CHECK: %[[Y:.+]] = mt.linear %[[H]], %[[W]]
// CHECK: %[[A:.+]] = mt.silu %[[Y]]
// CHECK-NOT: linear_weight_grad
// CHECK: return %[[A]], %[[Y]], %[[H]]

// CHECK-LABEL: func.func @train_step_stage1_backward
// CHECK-SAME: (%[[SY:.+]]: tensor<2x4x8xf32> {mt.name = "stash"}, %[[SH:.+]]: tensor<2x4x8xf32> {mt.name = "stash"}, %[[DOUT:.+]]: tensor<2x4x8xf32> {mt.name = "output_gradient"})
// CHECK-SAME: -> (tensor<2x4x8xf32> {mt.name = "input_gradient"})
// CHECK: %[[W2:.+]] = mt.get_parameter @w
// CHECK: %[[DY:.+]] = mt.silu_grad %[[DOUT]], %[[SY]]
// CHECK: %[[DH:.+]] = mt.linear %[[DY]], %[[W2]] transpose_weight
// CHECK: %[[DW:.+]] = mt.linear_weight_grad %[[SH]], %[[DY]]
// CHECK: mt.accumulate_gradient @w, %[[DW]]
// CHECK: return %[[DH]]
// CHECK-NOT: func.func @train_step_stage1(
func.func @train_step_stage1(%h: tensor<2x4x8xf32>, %dout: tensor<2x4x8xf32> {mt.name = "output_gradient"}) -> (tensor<2x4x8xf32>, tensor<2x4x8xf32> {mt.name = "input_gradient"}) attributes {mt.pipeline_stage = 1 : i64} {
  %w = mt.get_parameter @w : tensor<8x8xf32>
  %y = mt.linear %h, %w : (tensor<2x4x8xf32>, tensor<8x8xf32>) -> tensor<2x4x8xf32>
  %a = mt.silu %y : tensor<2x4x8xf32>
  %dy = mt.silu_grad %dout, %y : tensor<2x4x8xf32>
  %dh = mt.linear %dy, %w transpose_weight : (tensor<2x4x8xf32>, tensor<8x8xf32>) -> tensor<2x4x8xf32>
  %dw = mt.linear_weight_grad %h, %dy : (tensor<2x4x8xf32>, tensor<2x4x8xf32>) -> tensor<8x8xf32>
  mt.accumulate_gradient @w, %dw : tensor<8x8xf32>
  return %a, %dh : tensor<2x4x8xf32>, tensor<2x4x8xf32>
}

// -----

// After partitioning, parameters are arguments: each function takes those it
// reads, and gradients stay results of the backward function.

// CHECK-LABEL: func.func @train_step_stage0_forward
// CHECK-SAME: (%[[IDS:.+]]: tensor<2x4xi32>, %[[T:.+]]: tensor<16x8xf32> {mt.parameter = @table}) -> (tensor<2x4x8xf32>, tensor<2x4xi32> {mt.name = "stash"})
// CHECK-LABEL: func.func @train_step_stage0_backward
// CHECK-SAME: (%[[SIDS:.+]]: tensor<2x4xi32> {mt.name = "stash"}, %[[DOUT:.+]]: tensor<2x4x8xf32> {mt.name = "output_gradient"})
// CHECK-SAME: -> (tensor<16x8xf32> {mt.gradient = @table})
// CHECK: %[[DT:.+]] = mt.embedding_grad %[[DOUT]], %[[SIDS]]
// CHECK: return %[[DT]]
mt.parameter @table : tensor<16x8xf32> init = normal std = 2.000000e-02
func.func @train_step_stage0(%ids: tensor<2x4xi32>, %dout: tensor<2x4x8xf32> {mt.name = "output_gradient"}, %table: tensor<16x8xf32> {mt.parameter = @table}) -> (tensor<2x4x8xf32>, tensor<16x8xf32> {mt.gradient = @table}) attributes {mt.pipeline_stage = 0 : i64} {
  %h = mt.embedding %table, %ids : (tensor<16x8xf32>, tensor<2x4xi32>) -> tensor<2x4x8xf32>
  %dt = mt.embedding_grad %dout, %ids : (tensor<2x4x8xf32>, tensor<2x4xi32>) -> tensor<16x8xf32>
  return %h, %dt : tensor<2x4x8xf32>, tensor<16x8xf32>
}

// -----

// expected-error @+1 {{'func.func' op returns an output that depends on its output's gradient}}
func.func @train_step_stage1(%h: tensor<2x4x8xf32>, %dout: tensor<2x4x8xf32> {mt.name = "output_gradient"}) -> tensor<2x4x8xf32> attributes {mt.pipeline_stage = 1 : i64} {
  %a = mt.add %h, %dout : tensor<2x4x8xf32>
  return %a : tensor<2x4x8xf32>
}
