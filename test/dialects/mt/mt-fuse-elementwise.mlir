// RUN: megatron-opt %s -split-input-file -mt-fuse-elementwise | FileCheck %s

// Dropout then the residual add (the hidden dropout of a transformer layer):
// one group, the dropout's output never leaves it.

// CHECK-LABEL: func.func @dropout_residual
// CHECK-SAME: (%[[X:.+]]: tensor<2x4x8xf32>, %[[RES:.+]]: tensor<2x4x8xf32>)
func.func @dropout_residual(%x: tensor<2x4x8xf32>, %res: tensor<2x4x8xf32>) -> tensor<2x4x8xf32> {
  // CHECK: %[[R:.+]] = mt.fused(%[[X]], %[[RES]]) : (tensor<2x4x8xf32>, tensor<2x4x8xf32>) -> tensor<2x4x8xf32>
  // CHECK-NEXT: ^bb0(%[[A:.+]]: tensor<2x4x8xf32>, %[[B:.+]]: tensor<2x4x8xf32>):
  // CHECK-NEXT: %[[D:.+]] = mt.dropout %[[A]] p = 1.000000e-01 seed = 2
  // CHECK-NEXT: %[[S:.+]] = mt.add %[[B]], %[[D]]
  // CHECK-NEXT: mt.yield %[[S]] : tensor<2x4x8xf32>
  // CHECK: return %[[R]]
  %d = mt.dropout %x p = 1.000000e-01 seed = 2 : tensor<2x4x8xf32>
  %s = mt.add %res, %d : tensor<2x4x8xf32>
  return %s : tensor<2x4x8xf32>
}

// -----

// The backward's gradient sum feeds the dropout and a later add: the sum is
// a second result (written once), and the later add, which comes after an
// op outside the chain, starts no group of its own (one op).

// CHECK-LABEL: func.func @sum_used_later
func.func @sum_used_later(%a: tensor<16xf32>, %b: tensor<16xf32>, %w: tensor<16x16xf32>) -> (tensor<16xf32>, tensor<16xf32>) {
  // CHECK: %[[F:.+]]:2 = mt.fused(%{{.+}}, %{{.+}}) : (tensor<16xf32>, tensor<16xf32>) -> (tensor<16xf32>, tensor<16xf32>)
  // CHECK: %[[S:.+]] = mt.add
  // CHECK: %[[D:.+]] = mt.dropout %[[S]]
  // CHECK: mt.yield %[[S]], %[[D]]
  // CHECK: %[[L:.+]] = mt.linear %[[F]]#1
  // CHECK: %[[T:.+]] = mt.add %[[F]]#0, %[[L]]
  // CHECK: return %[[T]], %[[F]]#1
  %s = mt.add %a, %b : tensor<16xf32>
  %d = mt.dropout %s p = 1.000000e-01 seed = 5 : tensor<16xf32>
  %l = mt.linear %d, %w : (tensor<16xf32>, tensor<16x16xf32>) -> tensor<16xf32>
  %t = mt.add %s, %l : tensor<16xf32>
  return %t, %d : tensor<16xf32>, tensor<16xf32>
}

// -----

// A use of the chain's first value between its ops keeps the later op out
// (the group would move past that use); GeLU stays for the GEMM epilogue;
// ops of different shapes never share a group.

// CHECK-LABEL: func.func @not_fused
func.func @not_fused(%a: tensor<16xf32>, %b: tensor<16xf32>, %w: tensor<16x16xf32>, %c: tensor<4xf32>) -> (tensor<16xf32>, tensor<16xf32>, tensor<4xf32>) {
  // CHECK-NOT: mt.fused
  // CHECK: mt.add
  // CHECK: mt.linear
  // CHECK: mt.dropout
  // CHECK: mt.gelu
  // CHECK: mt.add
  // CHECK-NOT: mt.fused
  %s = mt.add %a, %b : tensor<16xf32>
  %l = mt.linear %s, %w : (tensor<16xf32>, tensor<16x16xf32>) -> tensor<16xf32>
  %d = mt.dropout %s p = 1.000000e-01 seed = 5 : tensor<16xf32>
  %g = mt.gelu %d approximate = tanh : tensor<16xf32>
  %e = mt.add %c, %c : tensor<4xf32>
  return %l, %g, %e : tensor<16xf32>, tensor<16xf32>, tensor<4xf32>
}

// -----

// A dropout on a rank's tile (mt.split_axes) is keyed on global positions
// the kernel does not know: it stays outside; SwiGLU and mul chains fuse.

// CHECK-LABEL: func.func @split_dropout
func.func @split_dropout(%a: tensor<16xf32>, %b: tensor<16xf32>) -> tensor<16xf32> {
  // CHECK: mt.dropout
  // CHECK-SAME: mt.split_axes
  // CHECK: mt.fused
  // CHECK-NEXT: ^bb0
  // CHECK-NEXT: mt.swiglu
  // CHECK-NEXT: mt.mul
  // CHECK-NEXT: mt.add
  // CHECK-NEXT: mt.yield
  %d = mt.dropout %a p = 1.000000e-01 seed = 1 {mt.split_axes = [array<i16: 1>]} : tensor<16xf32>
  %g = mt.swiglu %d, %b : tensor<16xf32>
  %m = mt.mul %g, %b : tensor<16xf32>
  %r = mt.add %m, %a : tensor<16xf32>
  return %r : tensor<16xf32>
}

// -----

// A group is in the layer of its last op; the ops inside keep theirs.
// CHECK-LABEL: func.func @layer
func.func @layer(%x: tensor<2x4x8xf32>, %res: tensor<2x4x8xf32>) -> tensor<2x4x8xf32> {
  // CHECK: mt.fused(%{{.+}}, %{{.+}}) {mt.layer = #mt.layer<2>}
  // CHECK: mt.dropout {{.+}} {mt.layer = #mt.layer<2>}
  // CHECK-NEXT: mt.add {{.+}} {mt.layer = #mt.layer<2>}
  %d = mt.dropout %x p = 1.000000e-01 seed = 2 {mt.layer = #mt.layer<2>} : tensor<2x4x8xf32>
  %s = mt.add %res, %d {mt.layer = #mt.layer<2>} : tensor<2x4x8xf32>
  return %s : tensor<2x4x8xf32>
}
