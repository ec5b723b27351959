// RUN: megatron-opt %s -mt-fuse-gemm-epilogues | FileCheck %s
// RUN: megatron-opt %s -mt-fuse-gemm-epilogues | megatron-opt | FileCheck %s
// RUN: megatron-opt %s '-mt-fuse-gemm-epilogues=linear-adds=false' | FileCheck %s --check-prefix=OFF

// mt-fuse-gemm-epilogues' last rewrite: an mt.add of an mt.linear used only
// there becomes mt.linear_add, the other operand the GEMM's C (beta = 1).

// A residual connection without dropout, after the attention's output
// layer (with a bias), on either side of the add.
// CHECK-LABEL: func.func @residual
// OFF-LABEL: func.func @residual
func.func @residual(%x: tensor<2x4x8xf32>, %h: tensor<2x4x8xf32>,
                    %w: tensor<8x8xf32>, %b: tensor<8xf32>)
    -> (tensor<2x4x8xf32>, tensor<2x4x8xf32>) {
  // CHECK: %[[Y:.+]] = mt.linear_add %arg1, %arg2, %arg0, %arg3 : (tensor<2x4x8xf32>, tensor<8x8xf32>, tensor<2x4x8xf32>, tensor<8xf32>) -> tensor<2x4x8xf32>
  // CHECK: %[[Z:.+]] = mt.linear_add %arg1, %arg2, %arg0 transpose_weight
  // CHECK-NOT: mt.add
  // CHECK: return %[[Y]], %[[Z]]
  // OFF: mt.linear
  // OFF: mt.add
  %o = mt.linear %h, %w, %b : (tensor<2x4x8xf32>, tensor<8x8xf32>, tensor<8xf32>) -> tensor<2x4x8xf32>
  %y = mt.add %x, %o : tensor<2x4x8xf32>
  %p = mt.linear %h, %w transpose_weight : (tensor<2x4x8xf32>, tensor<8x8xf32>) -> tensor<2x4x8xf32>
  %z = mt.add %p, %x : tensor<2x4x8xf32>
  return %y, %z : tensor<2x4x8xf32>, tensor<2x4x8xf32>
}

// A Llama's q, k and v data gradients summed: each later linear takes the
// sum so far as its C.
// CHECK-LABEL: func.func @data_gradients
func.func @data_gradients(%dq: tensor<4x8xbf16>, %dk: tensor<4x2xbf16>,
                          %dv: tensor<4x2xbf16>, %wq: tensor<8x8xbf16>,
                          %wk: tensor<8x2xbf16>, %wv: tensor<8x2xbf16>)
    -> tensor<4x8xbf16> {
  // CHECK: %[[Q:.+]] = mt.linear %arg0, %arg3 transpose_weight
  // CHECK: %[[QK:.+]] = mt.linear_add %arg1, %arg4, %[[Q]] transpose_weight
  // CHECK: %[[QKV:.+]] = mt.linear_add %arg2, %arg5, %[[QK]] transpose_weight
  // CHECK: return %[[QKV]]
  %q = mt.linear %dq, %wq transpose_weight : (tensor<4x8xbf16>, tensor<8x8xbf16>) -> tensor<4x8xbf16>
  %k = mt.linear %dk, %wk transpose_weight : (tensor<4x2xbf16>, tensor<8x2xbf16>) -> tensor<4x8xbf16>
  %v = mt.linear %dv, %wv transpose_weight : (tensor<4x2xbf16>, tensor<8x2xbf16>) -> tensor<4x8xbf16>
  %qk = mt.add %q, %k : tensor<4x8xbf16>
  %qkv = mt.add %qk, %v : tensor<4x8xbf16>
  return %qkv : tensor<4x8xbf16>
}

// A linear whose result is read elsewhere too stays, and so does the add.
// CHECK-LABEL: func.func @kept
func.func @kept(%x: tensor<4x8xf32>, %h: tensor<4x8xf32>, %w: tensor<8x8xf32>)
    -> (tensor<4x8xf32>, tensor<4x8xf32>) {
  // CHECK: %[[O:.+]] = mt.linear %arg1, %arg2
  // CHECK: mt.add %arg0, %[[O]]
  // CHECK-NOT: mt.linear_add
  %o = mt.linear %h, %w : (tensor<4x8xf32>, tensor<8x8xf32>) -> tensor<4x8xf32>
  %y = mt.add %x, %o : tensor<4x8xf32>
  return %y, %o : tensor<4x8xf32>, tensor<4x8xf32>
}
