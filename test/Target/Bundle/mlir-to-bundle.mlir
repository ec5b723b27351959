// RUN: megatron-opt %s --megatron-training-pipeline | megatron-translate --mlir-to-bundle -o %t.mtb
// RUN: %python %S/check-bundle-header.py %t.mtb | FileCheck %s

// A module that went through the training pipeline translates to a bundle
// without a model section.

// CHECK: version 12 flags 0 payload 0
// CHECK-NEXT: parameters 1
// CHECK-NEXT: train_step: 8 values, 7 instructions, 1 gradients, outputs {{\[\[\]\]}}

mt.parameter @w : tensor<8x16xf32> init = normal std = 2.000000e-02

func.func @train_step(%x: tensor<2x8xf32>, %labels: tensor<2xi32>) -> tensor<f32> {
  %w = mt.get_parameter @w : tensor<8x16xf32>
  %y = mt.linear %x, %w : (tensor<2x8xf32>, tensor<8x16xf32>) -> tensor<2x16xf32>
  %loss = mt.cross_entropy %y, %labels reduction = mean : (tensor<2x16xf32>, tensor<2xi32>) -> tensor<f32>
  return %loss : tensor<f32>
}
