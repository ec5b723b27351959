// RUN: megatron-opt %s -mt-fuse-gemm-epilogues | FileCheck %s

// Under FP8 (mt.fp8 on the module) the GeLU gradient's data-gradient GEMM
// stays an mt.linear, which mt-fp8-gemms runs on FP8 operands (it leaves
// fused GEMMs in bf16); the bias gradients still join the weight gradients.

module attributes {mt.fp8 = #mt.fp8_recipe<format = "hybrid", scaling = "delayed", amax_history_len = 16, amax_compute_algo = "max", margin = 0, bf16_layers_at_start = 0, bf16_layers_at_end = 0>} {
  // CHECK-LABEL: func.func @mlp_backward
  func.func @mlp_backward(%x: tensor<4x8xf32>, %h: tensor<4x16xf32>, %w: tensor<16x8xf32>, %dz: tensor<4x8xf32>)
      -> (tensor<4x16xf32>, tensor<8x16xf32>, tensor<16xf32>) {
    // CHECK: %[[DY:.+]] = mt.linear %arg3, %arg2 transpose_weight
    // CHECK-NEXT: %[[DH:.+]] = mt.gelu_grad %[[DY]], %arg1 approximate = tanh
    // CHECK-NEXT: mt.linear_weight_bias_grad %arg0, %[[DH]]
    // CHECK-NOT: mt.linear_gelu_grad
    %dy = mt.linear %dz, %w transpose_weight : (tensor<4x8xf32>, tensor<16x8xf32>) -> tensor<4x16xf32>
    %dh = mt.gelu_grad %dy, %h approximate = tanh : tensor<4x16xf32>
    %dw = mt.linear_weight_grad %x, %dh : (tensor<4x8xf32>, tensor<4x16xf32>) -> tensor<8x16xf32>
    %db = mt.bias_grad %dh : tensor<4x16xf32> -> tensor<16xf32>
    return %dh, %dw, %db : tensor<4x16xf32>, tensor<8x16xf32>, tensor<16xf32>
  }

  // Nor does an add take an FP8 linear: mt-fp8-gemms casts the linear.
  // CHECK-LABEL: func.func @residual
  func.func @residual(%x: tensor<4x8xf32>, %h: tensor<4x8xf32>, %w: tensor<8x8xf32>) -> tensor<4x8xf32> {
    // CHECK: %[[O:.+]] = mt.linear %arg1, %arg2
    // CHECK-NEXT: mt.add %arg0, %[[O]]
    // CHECK-NOT: mt.linear_add
    %o = mt.linear %h, %w : (tensor<4x8xf32>, tensor<8x8xf32>) -> tensor<4x8xf32>
    %y = mt.add %x, %o : tensor<4x8xf32>
    return %y : tensor<4x8xf32>
  }
}
