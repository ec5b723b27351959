// RUN: megatron-opt %s '-mt-fuse-gemm-epilogues=gelu-epilogues=true' | FileCheck %s
// RUN: megatron-opt %s '-mt-fuse-gemm-epilogues=gelu-epilogues=true' | megatron-opt | FileCheck %s --check-prefix=ROUNDTRIP
// RUN: megatron-opt %s -mt-fuse-gemm-epilogues | FileCheck %s --check-prefix=DEFAULT
// RUN: megatron-opt %s -megatron-fusion-pipeline | FileCheck %s --check-prefix=DEFAULT
// RUN: megatron-opt %s '-megatron-fusion-pipeline=gemm-epilogues=false' | FileCheck %s --check-prefix=OFF

// An MLP's forward and backward pass as mt-differentiate writes it: the tanh
// GeLU goes into the first GEMM (its pre-activation is the second result),
// its gradient and the first layer's bias gradient into the second layer's
// data-gradient GEMM, the second layer's bias gradient into its
// weight-gradient GEMM.

// CHECK-LABEL: func.func @mlp
func.func @mlp(%x: tensor<2x4x8xf32>, %w1: tensor<8x32xf32>, %b1: tensor<32xf32>,
               %w2: tensor<32x8xf32>, %b2: tensor<8xf32>, %dz: tensor<2x4x8xf32>)
    -> (tensor<2x4x8xf32>, tensor<2x4x8xf32>, tensor<8x32xf32>, tensor<32xf32>,
        tensor<32x8xf32>, tensor<8xf32>) {
  // CHECK: %[[Y:.+]], %[[H:.+]] = mt.linear_gelu %arg0, %arg1, %arg2 approximate = tanh
  // CHECK-SAME: -> (tensor<2x4x32xf32>, tensor<2x4x32xf32>)
  // CHECK: %[[Z:.+]] = mt.linear %[[Y]], %arg3, %arg4
  // CHECK: %[[DW2:.+]], %[[DB2:.+]] = mt.linear_weight_bias_grad %[[Y]], %arg5
  // CHECK-SAME: -> (tensor<32x8xf32>, tensor<8xf32>)
  // CHECK: %[[DH:.+]], %[[DB1:.+]] = mt.linear_gelu_grad %arg5, %arg3, %[[H]] approximate = tanh transpose_weight
  // CHECK-SAME: -> (tensor<2x4x32xf32>, tensor<32xf32>)
  // CHECK: %[[DX:.+]] = mt.linear %[[DH]], %arg1 transpose_weight
  // CHECK: %[[DW1:.+]] = mt.linear_weight_grad %arg0, %[[DH]]
  // CHECK-NOT: mt.gelu
  // CHECK-NOT: mt.bias_grad
  // CHECK: return %[[Z]], %[[DX]], %[[DW1]], %[[DB1]], %[[DW2]], %[[DB2]]
  %h = mt.linear %x, %w1, %b1 : (tensor<2x4x8xf32>, tensor<8x32xf32>, tensor<32xf32>) -> tensor<2x4x32xf32>
  %y = mt.gelu %h approximate = tanh : tensor<2x4x32xf32>
  %z = mt.linear %y, %w2, %b2 : (tensor<2x4x32xf32>, tensor<32x8xf32>, tensor<8xf32>) -> tensor<2x4x8xf32>
  %dw2 = mt.linear_weight_grad %y, %dz : (tensor<2x4x32xf32>, tensor<2x4x8xf32>) -> tensor<32x8xf32>
  %db2 = mt.bias_grad %dz : tensor<2x4x8xf32> -> tensor<8xf32>
  %dy = mt.linear %dz, %w2 transpose_weight : (tensor<2x4x8xf32>, tensor<32x8xf32>) -> tensor<2x4x32xf32>
  %dh = mt.gelu_grad %dy, %h approximate = tanh : tensor<2x4x32xf32>
  %dx = mt.linear %dh, %w1 transpose_weight : (tensor<2x4x32xf32>, tensor<8x32xf32>) -> tensor<2x4x8xf32>
  %dw1 = mt.linear_weight_grad %x, %dh : (tensor<2x4x8xf32>, tensor<2x4x32xf32>) -> tensor<8x32xf32>
  %db1 = mt.bias_grad %dh : tensor<2x4x32xf32> -> tensor<32xf32>
  return %z, %dx, %dw1, %db1, %dw2, %db2 : tensor<2x4x8xf32>, tensor<2x4x8xf32>, tensor<8x32xf32>, tensor<32xf32>, tensor<32x8xf32>, tensor<8xf32>
}

// By default the forward GeLU stays a separate op (its epilogue is slower
// than the plain GEMM and a GeLU kernel); the backward's GeLU gradient and
// the first layer's bias gradient still join the data-gradient GEMM (the
// cuda backend runs it as a plain GEMM and a GeLU-gradient kernel that sums
// the bias gradient as it writes), and the second layer's bias gradient its
// weight gradient.
// DEFAULT-LABEL: func.func @mlp
// DEFAULT: %[[H:.+]] = mt.linear %arg0, %arg1, %arg2
// DEFAULT: mt.gelu %[[H]] approximate = tanh
// DEFAULT: mt.linear_weight_bias_grad
// DEFAULT: %[[DH:.+]], %[[DB1:.+]] = mt.linear_gelu_grad %arg5, %arg3, %[[H]] approximate = tanh transpose_weight
// DEFAULT: mt.linear_weight_grad %arg0, %[[DH]]
// DEFAULT-NOT: mt.linear_gelu {{.+}}
// DEFAULT-NOT: mt.bias_grad
// DEFAULT-LABEL: func.func @kept

// OFF-LABEL: func.func @mlp
// OFF-NOT: mt.linear_gelu
// OFF: mt.gelu
// OFF-NOT: mt.linear_gelu

// ROUNDTRIP-LABEL: func.func @mlp
// ROUNDTRIP: mt.linear_gelu
// ROUNDTRIP: mt.linear_weight_bias_grad
// ROUNDTRIP: mt.linear_gelu_grad

// The erf GeLU stays (cuBLASLt's GELU epilogues are the tanh approximation);
// so does a GeLU gradient whose GEMM result is also read elsewhere, and a
// bias gradient (here taken before its weight gradient, whose input is
// defined in between) is fused at the earlier op only when the weight
// gradient's input is available there. The erf GeLU's gradient is fused
// (no epilogue runs it).

// CHECK-LABEL: func.func @kept
func.func @kept(%x: tensor<4x8xf32>, %w: tensor<8x8xf32>, %b: tensor<8xf32>,
                %dz: tensor<4x8xf32>)
    -> (tensor<4x8xf32>, tensor<4x8xf32>, tensor<4x8xf32>, tensor<8xf32>, tensor<8x8xf32>) {
  // CHECK: mt.linear %arg0, %arg1, %arg2
  // CHECK-NEXT: mt.gelu {{.+}} approximate = erf
  // CHECK: %[[DY:.+]] = mt.linear %arg3, %arg1 transpose_weight
  // CHECK-NEXT: mt.gelu_grad %[[DY]]
  // CHECK-NEXT: mt.bias_grad %arg3
  // CHECK-NEXT: %[[LATE:.+]] = mt.add
  // CHECK-NEXT: mt.linear_weight_grad %[[LATE]], %arg3
  %h = mt.linear %x, %w, %b : (tensor<4x8xf32>, tensor<8x8xf32>, tensor<8xf32>) -> tensor<4x8xf32>
  %y = mt.gelu %h approximate = erf : tensor<4x8xf32>
  %dy = mt.linear %dz, %w transpose_weight : (tensor<4x8xf32>, tensor<8x8xf32>) -> tensor<4x8xf32>
  %dh = mt.gelu_grad %dy, %h approximate = tanh : tensor<4x8xf32>
  %db = mt.bias_grad %dz : tensor<4x8xf32> -> tensor<8xf32>
  %late = mt.add %x, %dy : tensor<4x8xf32>
  %dw = mt.linear_weight_grad %late, %dz : (tensor<4x8xf32>, tensor<4x8xf32>) -> tensor<8x8xf32>
  return %y, %dh, %dy, %db, %dw : tensor<4x8xf32>, tensor<4x8xf32>, tensor<4x8xf32>, tensor<8xf32>, tensor<8x8xf32>
}

// A transposed weight (Megatron-LM's layout) keeps its attribute; a linear
// without bias gives the GELU_AUX form.

// CHECK-LABEL: func.func @transposed
func.func @transposed(%x: tensor<4x8xf32>, %w: tensor<16x8xf32>, %dz: tensor<4x16xf32>)
    -> (tensor<4x16xf32>, tensor<16x8xf32>, tensor<16xf32>) {
  // CHECK: mt.linear_gelu %arg0, %arg1 approximate = tanh transpose_weight
  // CHECK: mt.linear_weight_bias_grad %arg0, %arg2 transpose_weight
  %h = mt.linear %x, %w transpose_weight : (tensor<4x8xf32>, tensor<16x8xf32>) -> tensor<4x16xf32>
  %y = mt.gelu %h approximate = tanh : tensor<4x16xf32>
  %db = mt.bias_grad %dz : tensor<4x16xf32> -> tensor<16xf32>
  %dw = mt.linear_weight_grad %x, %dz transpose_weight : (tensor<4x8xf32>, tensor<4x16xf32>) -> tensor<16x8xf32>
  return %y, %dw, %db : tensor<4x16xf32>, tensor<16x8xf32>, tensor<16xf32>
}

// CHECK-LABEL: func.func @erf_grad
// DEFAULT-LABEL: func.func @erf_grad
func.func @erf_grad(%h: tensor<4x16xf32>, %w: tensor<16x8xf32>, %dz: tensor<4x8xf32>)
    -> (tensor<4x16xf32>, tensor<16xf32>) {
  // CHECK: mt.linear_gelu_grad %arg2, %arg1, %arg0 approximate = erf transpose_weight
  // CHECK-SAME: -> (tensor<4x16xf32>, tensor<16xf32>)
  // DEFAULT: mt.linear_gelu_grad %arg2, %arg1, %arg0 approximate = erf transpose_weight
  %dy = mt.linear %dz, %w transpose_weight : (tensor<4x8xf32>, tensor<16x8xf32>) -> tensor<4x16xf32>
  %dh = mt.gelu_grad %dy, %h approximate = erf : tensor<4x16xf32>
  %db = mt.bias_grad %dh : tensor<4x16xf32> -> tensor<16xf32>
  return %dh, %db : tensor<4x16xf32>, tensor<16xf32>
}

// Under sequence parallelism the data-gradient GEMM reads an all-gathered
// gradient: it stays a linear (--tp-comm-overlap cuts it into chunks
// against the gather's), the GeLU gradient a separate op.

shard.grid @grid(shape = 2)

// CHECK-LABEL: func.func @gathered
// DEFAULT-LABEL: func.func @gathered
func.func @gathered(%h: tensor<4x16xf32>, %w: tensor<16x8xf32>, %dz: tensor<2x8xf32>)
    -> (tensor<4x16xf32>, tensor<16xf32>) {
  // DEFAULT: %[[G:.+]] = shard.all_gather
  // DEFAULT-NEXT: %[[DY:.+]] = mt.linear %[[G]], %arg1 transpose_weight
  // DEFAULT-NEXT: mt.gelu_grad %[[DY]], %arg0 approximate = tanh
  // DEFAULT-NOT: mt.linear_gelu_grad
  %g = shard.all_gather %dz on @grid grid_axes = [0] gather_axis = 0 : tensor<2x8xf32> -> tensor<4x8xf32>
  %dy = mt.linear %g, %w transpose_weight : (tensor<4x8xf32>, tensor<16x8xf32>) -> tensor<4x16xf32>
  %dh = mt.gelu_grad %dy, %h approximate = tanh : tensor<4x16xf32>
  %db = mt.bias_grad %dh : tensor<4x16xf32> -> tensor<16xf32>
  return %dh, %db : tensor<4x16xf32>, tensor<16xf32>
}
