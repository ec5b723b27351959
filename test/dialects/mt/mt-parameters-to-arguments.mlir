// RUN: megatron-opt %s -mt-parameters-to-arguments | FileCheck %s

// Parameter reads become trailing arguments in declaration order, each read
// once however often the body reads it; gradient accumulations become
// trailing results. Functions that read no parameters keep their signature.

mt.parameter @a : tensor<4x4xf32> init = zeros
mt.parameter @b : tensor<4xf32> init = ones
mt.parameter @unused : tensor<2xf32> init = zeros

// CHECK-LABEL: func.func @train_step
// CHECK-SAME: (%[[X:.+]]: tensor<2x4xf32>, %[[A:.+]]: tensor<4x4xf32> {mt.parameter = @a}, %[[B:.+]]: tensor<4xf32> {mt.parameter = @b})
// CHECK-SAME: -> (tensor<2x4xf32>, tensor<4xf32> {mt.gradient = @b})
func.func @train_step(%x: tensor<2x4xf32>) -> tensor<2x4xf32> {
  // CHECK-NOT: mt.get_parameter
  %b = mt.get_parameter @b : tensor<4xf32>
  %a = mt.get_parameter @a : tensor<4x4xf32>
  %a2 = mt.get_parameter @a : tensor<4x4xf32>
  // CHECK: %[[Y:.+]] = mt.linear %[[X]], %[[A]], %[[B]]
  %y = mt.linear %x, %a, %b : (tensor<2x4xf32>, tensor<4x4xf32>, tensor<4xf32>) -> tensor<2x4xf32>
  // CHECK: %[[Z:.+]] = mt.linear %[[Y]], %[[A]] transpose_weight
  %z = mt.linear %y, %a2 transpose_weight : (tensor<2x4xf32>, tensor<4x4xf32>) -> tensor<2x4xf32>
  %g = mt.bias_grad %z : tensor<2x4xf32> -> tensor<4xf32>
  // CHECK-NOT: mt.accumulate_gradient
  mt.accumulate_gradient @b, %g : tensor<4xf32>
  // CHECK: return %[[Z]], %{{.+}} : tensor<2x4xf32>, tensor<4xf32>
  return %z : tensor<2x4xf32>
}

// CHECK-LABEL: func.func @no_parameters(%{{.+}}: tensor<4xf32>) -> tensor<4xf32>
func.func @no_parameters(%x: tensor<4xf32>) -> tensor<4xf32> {
  return %x : tensor<4xf32>
}
