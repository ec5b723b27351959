// RUN: megatron-opt %s --megatron-training-pipeline | FileCheck %s

// The training pipeline differentiates train_step and leaves the other steps
// as they are.

mt.parameter @w : tensor<8x16xf32> init = normal std = 2.000000e-02

// CHECK-LABEL: func.func @train_step
// CHECK: mt.linear_weight_grad
// CHECK: mt.accumulate_gradient @w
func.func @train_step(%x: tensor<2x8xf32>, %labels: tensor<2xi32>) -> tensor<f32> {
  %w = mt.get_parameter @w : tensor<8x16xf32>
  %y = mt.linear %x, %w : (tensor<2x8xf32>, tensor<8x16xf32>) -> tensor<2x16xf32>
  %loss = mt.cross_entropy %y, %labels reduction = mean : (tensor<2x16xf32>, tensor<2xi32>) -> tensor<f32>
  return %loss : tensor<f32>
}

// CHECK-LABEL: func.func @eval_step
// CHECK-NOT: mt.accumulate_gradient
// CHECK: return
func.func @eval_step(%x: tensor<2x8xf32>, %labels: tensor<2xi32>) -> tensor<f32> {
  %w = mt.get_parameter @w : tensor<8x16xf32>
  %y = mt.linear %x, %w : (tensor<2x8xf32>, tensor<8x16xf32>) -> tensor<2x16xf32>
  %loss = mt.cross_entropy %y, %labels reduction = mean : (tensor<2x16xf32>, tensor<2xi32>) -> tensor<f32>
  return %loss : tensor<f32>
}
