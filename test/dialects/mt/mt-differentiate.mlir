// RUN: megatron-opt %s -split-input-file -mt-differentiate -verify-diagnostics | FileCheck %s

// A linear layer into the loss: the seed gradient is 1, marked mt.loss_seed
// (fp16 training multiplies it by the loss scale), the input gradient
// reads the same weight in the other layout, and each parameter's gradient
// is accumulated once, in declaration order.

mt.parameter @w : tensor<8x16xf32> init = normal std = 2.000000e-02
mt.parameter @b : tensor<16xf32> init = zeros

// CHECK-LABEL: func.func @train_step
// CHECK-SAME: (%[[X:.+]]: tensor<2x4x8xf32>, %[[LABELS:.+]]: tensor<2x4xi32>)
func.func @train_step(%x: tensor<2x4x8xf32>, %labels: tensor<2x4xi32>) -> tensor<f32> {
  // CHECK: %[[W:.+]] = mt.get_parameter @w
  %w = mt.get_parameter @w : tensor<8x16xf32>
  %b = mt.get_parameter @b : tensor<16xf32>
  // CHECK: %[[Y:.+]] = mt.linear %[[X]], %[[W]], %{{.+}} :
  %y = mt.linear %x, %w, %b : (tensor<2x4x8xf32>, tensor<8x16xf32>, tensor<16xf32>) -> tensor<2x4x16xf32>
  // CHECK: %[[LOSS:.+]] = mt.cross_entropy %[[Y]], %[[LABELS]]
  %loss = mt.cross_entropy %y, %labels reduction = mean : (tensor<2x4x16xf32>, tensor<2x4xi32>) -> tensor<f32>
  // CHECK: %[[ONE:.+]] = mt.fill 1.000000e+00 {mt.loss_seed} : tensor<f32>
  // CHECK: %[[DY:.+]] = mt.cross_entropy_grad %[[ONE]], %[[Y]], %[[LABELS]] reduction = mean
  // CHECK: mt.linear %[[DY]], %[[W]] transpose_weight : (tensor<2x4x16xf32>, tensor<8x16xf32>) -> tensor<2x4x8xf32>
  // CHECK: %[[DW:.+]] = mt.linear_weight_grad %[[X]], %[[DY]] : (tensor<2x4x8xf32>, tensor<2x4x16xf32>) -> tensor<8x16xf32>
  // CHECK: %[[DB:.+]] = mt.bias_grad %[[DY]] : tensor<2x4x16xf32> -> tensor<16xf32>
  // CHECK: mt.accumulate_gradient @w, %[[DW]] : tensor<8x16xf32>
  // CHECK-NEXT: mt.accumulate_gradient @b, %[[DB]] : tensor<16xf32>
  // CHECK-NEXT: return %[[LOSS]]
  return %loss : tensor<f32>
}

// -----

// A parameter read twice (tied embedding and output layer) receives the sum
// of both gradients in one accumulation; ids get no gradient.

mt.parameter @wte : tensor<16x8xf32> init = normal std = 2.000000e-02

// CHECK-LABEL: func.func @train_step
func.func @train_step(%ids: tensor<2x4xi32>, %labels: tensor<2x4xi32>) -> tensor<f32> {
  %table = mt.get_parameter @wte : tensor<16x8xf32>
  %h = mt.embedding %table, %ids : (tensor<16x8xf32>, tensor<2x4xi32>) -> tensor<2x4x8xf32>
  %out = mt.get_parameter @wte : tensor<16x8xf32>
  %logits = mt.linear %h, %out transpose_weight : (tensor<2x4x8xf32>, tensor<16x8xf32>) -> tensor<2x4x16xf32>
  %loss = mt.cross_entropy %logits, %labels reduction = mean : (tensor<2x4x16xf32>, tensor<2x4xi32>) -> tensor<f32>
  // CHECK: %[[FROM_OUTPUT:.+]] = mt.linear_weight_grad %{{.+}}, %{{.+}} transpose_weight
  // CHECK: %[[FROM_EMBEDDING:.+]] = mt.embedding_grad %{{.+}}, %{{.+}} : (tensor<2x4x8xf32>, tensor<2x4xi32>) -> tensor<16x8xf32>
  // CHECK: %[[SUM:.+]] = mt.add %[[FROM_OUTPUT]], %[[FROM_EMBEDDING]]
  // CHECK: mt.accumulate_gradient @wte, %[[SUM]]
  // CHECK-NOT: mt.accumulate_gradient
  return %loss : tensor<f32>
}

// -----

// A split piece that does not reach the loss contributes zeros; rope's
// gradient is the inverse rotation; a parameter that does not reach the loss
// gets no accumulation.

mt.parameter @w : tensor<8x24xf32> init = normal std = 2.000000e-02
mt.parameter @unused : tensor<4xf32> init = ones

// CHECK-LABEL: func.func @train_step
func.func @train_step(%x: tensor<2x4x8xf32>, %labels: tensor<2x4xi32>) -> tensor<f32> {
  %w = mt.get_parameter @w : tensor<8x24xf32>
  %u = mt.get_parameter @unused : tensor<4xf32>
  %y = mt.linear %x, %w : (tensor<2x4x8xf32>, tensor<8x24xf32>) -> tensor<2x4x24xf32>
  %a, %b = mt.split %y axis = 2 : tensor<2x4x24xf32> -> tensor<2x4x16xf32>, tensor<2x4x8xf32>
  %heads = mt.reshape %a : tensor<2x4x16xf32> -> tensor<2x4x2x8xf32>
  %rotated = mt.rope %heads base = 1.000000e+04 : tensor<2x4x2x8xf32>
  %logits = mt.reshape %rotated : tensor<2x4x2x8xf32> -> tensor<2x4x16xf32>
  %loss = mt.cross_entropy %logits, %labels reduction = sum : (tensor<2x4x16xf32>, tensor<2x4xi32>) -> tensor<f32>
  // CHECK: mt.rope %{{.+}} base = 1.000000e+04 inverse : tensor<2x4x2x8xf32>
  // CHECK: %[[ZEROS:.+]] = mt.fill 0.000000e+00 : tensor<2x4x8xf32>
  // CHECK: mt.concat %{{.+}}, %[[ZEROS]] axis = 2
  // CHECK: mt.accumulate_gradient @w
  // CHECK-NOT: mt.accumulate_gradient @unused
  return %loss : tensor<f32>
}

// -----

// expected-error @+1 {{mt-differentiate: no function named 'train_step' to differentiate; pass function=<name>}}
module {
  func.func @other() {
    return
  }
}

// -----

// expected-error @+1 {{'func.func' op must return the loss, a tensor<f32>, as its first result to be differentiated}}
func.func @train_step(%x: tensor<4xf32>) -> tensor<4xf32> {
  return %x : tensor<4xf32>
}

// -----

func.func @train_step(%x: tensor<4xf32>, %labels: tensor<i32>) -> tensor<f32> {
  // expected-error @+1 {{'arith.addf' op lies between the parameters and the loss of @train_step but has no VJP rule}}
  %y = arith.addf %x, %x : tensor<4xf32>
  %loss = mt.cross_entropy %y, %labels reduction = mean : (tensor<4xf32>, tensor<i32>) -> tensor<f32>
  return %loss : tensor<f32>
}

// -----

// expected-error @+1 {{'func.func' op must have one block to be differentiated, it has 2}}
func.func @train_step(%loss: tensor<f32>) -> tensor<f32> {
  cf.br ^next
^next:
  return %loss : tensor<f32>
}
