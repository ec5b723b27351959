// RUN: megatron-opt %s -mt-fuse-column-sums | FileCheck %s
// RUN: megatron-opt %s -mt-fuse-column-sums | megatron-opt | FileCheck %s --check-prefix=ROUNDTRIP

// A bias gradient whose operand a group writes becomes a column sum of the
// group (a result, its bias_grad inside); one whose operand a lone
// elementwise op writes makes a group of that op and the sum; the weight
// gradient loses its BGRAD epilogue.

module attributes {mt.elementwise_kernels} {
  // CHECK-LABEL: func.func @grouped
  func.func @grouped(%a: tensor<4x8xbf16>, %b: tensor<4x8xbf16>, %x: tensor<4x16xbf16>)
      -> (tensor<4x8xbf16>, tensor<16x8xf32>, tensor<8xf32>) {
    // CHECK: %[[G:.+]]:3 = mt.fused(%arg0, %arg1) : (tensor<4x8xbf16>, tensor<4x8xbf16>) -> (tensor<4x8xbf16>, tensor<4x8xbf16>, tensor<8xf32>)
    // CHECK: %[[S:.+]] = mt.add
    // CHECK-NEXT: %[[D:.+]] = mt.dropout %[[S]]
    // CHECK-NEXT: %[[C:.+]] = mt.bias_grad %[[D]] : tensor<4x8xbf16> -> tensor<8xf32>
    // CHECK-NEXT: mt.yield %[[S]], %[[D]], %[[C]]
    // CHECK: %[[DW:.+]] = mt.linear_weight_grad %arg2, %[[G]]#1
    // CHECK-NOT: linear_weight_bias_grad
    // CHECK: return %[[G]]#0, %[[DW]], %[[G]]#2
    %g:2 = mt.fused(%a, %b) : (tensor<4x8xbf16>, tensor<4x8xbf16>) -> (tensor<4x8xbf16>, tensor<4x8xbf16>) {
    ^bb0(%u: tensor<4x8xbf16>, %v: tensor<4x8xbf16>):
      %s = mt.add %u, %v : tensor<4x8xbf16>
      %d = mt.dropout %s p = 1.000000e-01 seed = 5 : tensor<4x8xbf16>
      mt.yield %s, %d : tensor<4x8xbf16>, tensor<4x8xbf16>
    }
    %dw, %db = mt.linear_weight_bias_grad %x, %g#1 : (tensor<4x16xbf16>, tensor<4x8xbf16>) -> (tensor<16x8xf32>, tensor<8xf32>)
    %dx = mt.linear %g#1, %dw transpose_weight : (tensor<4x8xbf16>, tensor<16x8xf32>) -> tensor<4x16xbf16>
    return %g#0, %dw, %db : tensor<4x8xbf16>, tensor<16x8xf32>, tensor<8xf32>
  }

  // CHECK-LABEL: func.func @lone_add
  func.func @lone_add(%a: tensor<4x8xbf16>, %b: tensor<4x8xbf16>, %x: tensor<4x16xbf16>)
      -> (tensor<4x8xbf16>, tensor<16x8xf32>, tensor<8xf32>) {
    // CHECK: %[[G:.+]]:2 = mt.fused(%arg0, %arg1)
    // CHECK: %[[S:.+]] = mt.add
    // CHECK-NEXT: %[[C:.+]] = mt.bias_grad %[[S]]
    // CHECK-NEXT: mt.yield %[[S]], %[[C]]
    // CHECK: mt.linear_weight_grad %arg2, %[[G]]#0
    %s = mt.add %a, %b : tensor<4x8xbf16>
    %dw, %db = mt.linear_weight_bias_grad %x, %s : (tensor<4x16xbf16>, tensor<4x8xbf16>) -> (tensor<16x8xf32>, tensor<8xf32>)
    return %s, %dw, %db : tensor<4x8xbf16>, tensor<16x8xf32>, tensor<8xf32>
  }

  // A bias gradient of a value nothing else reads, or of a GEMM's result,
  // stays.
  // CHECK-LABEL: func.func @kept
  func.func @kept(%a: tensor<4x8xbf16>, %b: tensor<4x8xbf16>, %w: tensor<8x8xbf16>)
      -> (tensor<8xf32>, tensor<8xf32>) {
    // CHECK: mt.add
    // CHECK-NEXT: mt.bias_grad
    // CHECK: mt.linear
    // CHECK-NEXT: mt.bias_grad
    // CHECK-NOT: mt.fused
    %s = mt.add %a, %b : tensor<4x8xbf16>
    %db = mt.bias_grad %s : tensor<4x8xbf16> -> tensor<8xf32>
    %y = mt.linear %a, %w : (tensor<4x8xbf16>, tensor<8x8xbf16>) -> tensor<4x8xbf16>
    %dy = mt.bias_grad %y : tensor<4x8xbf16> -> tensor<8xf32>
    %z = mt.add %y, %b : tensor<4x8xbf16>
    return %db, %dy : tensor<8xf32>, tensor<8xf32>
  }
}

// ROUNDTRIP-LABEL: func.func @grouped
// ROUNDTRIP: mt.bias_grad
