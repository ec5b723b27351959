// RUN: megatron-opt %s '-mt-fuse-linear-cross-entropy=chunk-rows=3' | FileCheck %s
// RUN: megatron-opt %s '-mt-fuse-linear-cross-entropy=chunk-rows=3' | megatron-opt | FileCheck %s
// RUN: megatron-opt %s -mt-fuse-linear-cross-entropy | FileCheck %s --check-prefix=BYTES
// RUN: megatron-opt %s '-mt-fuse-linear-cross-entropy=chunk-bytes=4096' | FileCheck %s --check-prefix=SMALL
// RUN: megatron-opt %s '-mt-fuse-linear-cross-entropy=chunk-bytes=5120' | FileCheck %s --check-prefix=EVEN
// RUN: megatron-opt %s '-megatron-fusion-pipeline=linear-cross-entropy=true linear-cross-entropy-chunk-rows=3' | FileCheck %s --check-prefix=PIPELINE
// RUN: megatron-opt %s -megatron-fusion-pipeline | FileCheck %s --check-prefix=OFF

// A tied output layer (the vocabulary x hidden embedding table, read
// transposed) as mt-differentiate writes it: the logits, the loss, the
// logits' gradient and both gradient GEMMs become one chunked op in the
// forward pass and two scalings by the seed in the backward pass.

// CHECK-LABEL: func.func @tied
// CHECK-SAME: (%[[H:.+]]: tensor<2x4x8xf32>, %[[W:.+]]: tensor<256x8xf32>, %[[L:.+]]: tensor<2x4xi32>)
// CHECK: %[[LOSS:.+]], %[[DH1:.+]], %[[DW1:.+]] = mt.linear_cross_entropy %[[H]], %[[W]], %[[L]] reduction = mean chunk_rows = 3 transpose_weight
// CHECK-SAME: -> (tensor<f32>, tensor<2x4x8xf32>, tensor<256x8xf32>)
// CHECK: %[[SEED:.+]] = mt.fill
// CHECK: %[[DH:.+]] = mt.scale %[[DH1]], %[[SEED]] : (tensor<2x4x8xf32>, tensor<f32>) -> tensor<2x4x8xf32>
// CHECK: %[[DW:.+]] = mt.scale %[[DW1]], %[[SEED]] : (tensor<256x8xf32>, tensor<f32>) -> tensor<256x8xf32>
// CHECK-NOT: mt.linear
// CHECK-NOT: mt.cross_entropy
// CHECK: return %[[LOSS]], %[[DH]], %[[DW]]
func.func @tied(%h: tensor<2x4x8xf32>, %w: tensor<256x8xf32>, %labels: tensor<2x4xi32>)
    -> (tensor<f32>, tensor<2x4x8xf32>, tensor<256x8xf32>) {
  %logits = mt.linear %h, %w transpose_weight : (tensor<2x4x8xf32>, tensor<256x8xf32>) -> tensor<2x4x256xf32>
  %loss = mt.cross_entropy %logits, %labels reduction = mean : (tensor<2x4x256xf32>, tensor<2x4xi32>) -> tensor<f32>
  %seed = mt.fill 1.000000e+00 {mt.loss_seed} : tensor<f32>
  %dlogits = mt.cross_entropy_grad %seed, %logits, %labels reduction = mean : (tensor<f32>, tensor<2x4x256xf32>, tensor<2x4xi32>) -> tensor<2x4x256xf32>
  %dh = mt.linear %dlogits, %w : (tensor<2x4x256xf32>, tensor<256x8xf32>) -> tensor<2x4x8xf32>
  %dw = mt.linear_weight_grad %h, %dlogits transpose_weight : (tensor<2x4x8xf32>, tensor<2x4x256xf32>) -> tensor<256x8xf32>
  return %loss, %dh, %dw : tensor<f32>, tensor<2x4x8xf32>, tensor<256x8xf32>
}

// An untied output layer in the hidden x vocabulary layout, summed.

// CHECK-LABEL: func.func @untied_sum
// CHECK: mt.linear_cross_entropy %arg0, %arg1, %arg2 reduction = sum chunk_rows = 3 :
// CHECK-SAME: (tensor<6x8xf32>, tensor<8x128xf32>, tensor<6xi32>) -> (tensor<f32>, tensor<6x8xf32>, tensor<8x128xf32>)
// CHECK-COUNT-2: mt.scale
// CHECK-NOT: mt.linear
func.func @untied_sum(%h: tensor<6x8xf32>, %w: tensor<8x128xf32>, %labels: tensor<6xi32>, %seed: tensor<f32>)
    -> (tensor<f32>, tensor<6x8xf32>, tensor<8x128xf32>) {
  %logits = mt.linear %h, %w : (tensor<6x8xf32>, tensor<8x128xf32>) -> tensor<6x128xf32>
  %loss = mt.cross_entropy %logits, %labels reduction = sum : (tensor<6x128xf32>, tensor<6xi32>) -> tensor<f32>
  %dlogits = mt.cross_entropy_grad %seed, %logits, %labels reduction = sum : (tensor<f32>, tensor<6x128xf32>, tensor<6xi32>) -> tensor<6x128xf32>
  %dh = mt.linear %dlogits, %w transpose_weight : (tensor<6x128xf32>, tensor<8x128xf32>) -> tensor<6x8xf32>
  %dw = mt.linear_weight_grad %h, %dlogits : (tensor<6x8xf32>, tensor<6x128xf32>) -> tensor<8x128xf32>
  return %loss, %dh, %dw : tensor<f32>, tensor<6x8xf32>, tensor<8x128xf32>
}

// Evaluation (no gradient) and a logits gradient read by anything else keep
// the unfused ops: the fused op would compute gradients nobody reads, or
// lose the logits' gradient.

// CHECK-LABEL: func.func @eval
// CHECK: mt.linear
// CHECK: mt.cross_entropy
// CHECK-NOT: mt.linear_cross_entropy
func.func @eval(%h: tensor<2x4x8xf32>, %w: tensor<256x8xf32>, %labels: tensor<2x4xi32>) -> tensor<f32> {
  %logits = mt.linear %h, %w transpose_weight : (tensor<2x4x8xf32>, tensor<256x8xf32>) -> tensor<2x4x256xf32>
  %loss = mt.cross_entropy %logits, %labels reduction = mean : (tensor<2x4x256xf32>, tensor<2x4xi32>) -> tensor<f32>
  return %loss : tensor<f32>
}

// CHECK-LABEL: func.func @other_reader
// CHECK: mt.cross_entropy_grad
// CHECK-NOT: mt.linear_cross_entropy
func.func @other_reader(%h: tensor<6x8xf32>, %w: tensor<8x128xf32>, %labels: tensor<6xi32>, %seed: tensor<f32>)
    -> (tensor<f32>, tensor<6x8xf32>, tensor<8x128xf32>, tensor<6x128xf32>) {
  %logits = mt.linear %h, %w : (tensor<6x8xf32>, tensor<8x128xf32>) -> tensor<6x128xf32>
  %loss = mt.cross_entropy %logits, %labels reduction = sum : (tensor<6x128xf32>, tensor<6xi32>) -> tensor<f32>
  %dlogits = mt.cross_entropy_grad %seed, %logits, %labels reduction = sum : (tensor<f32>, tensor<6x128xf32>, tensor<6xi32>) -> tensor<6x128xf32>
  %dh = mt.linear %dlogits, %w transpose_weight : (tensor<6x128xf32>, tensor<8x128xf32>) -> tensor<6x8xf32>
  %dw = mt.linear_weight_grad %h, %dlogits : (tensor<6x8xf32>, tensor<6x128xf32>) -> tensor<8x128xf32>
  return %loss, %dh, %dw, %dlogits : tensor<f32>, tensor<6x8xf32>, tensor<8x128xf32>, tensor<6x128xf32>
}

// Without chunk-rows, a chunk is all the rows when their f32 logits fit
// in chunk-bytes (1 GiB: all 8 and 6 rows here), else the fewest chunks
// that fit, made even (4 KiB: 4096 / (4 * 256) = 4 rows of @tied's
// vocabulary; 5 KiB: 5 rows fit, so two chunks of 4, not 5 and 3).
// BYTES-LABEL: func.func @tied
// BYTES: mt.linear_cross_entropy {{.*}} chunk_rows = 8 transpose_weight
// BYTES-LABEL: func.func @untied_sum
// BYTES: mt.linear_cross_entropy {{.*}} chunk_rows = 6 :
// SMALL-LABEL: func.func @tied
// SMALL: mt.linear_cross_entropy {{.*}} chunk_rows = 4 transpose_weight
// EVEN-LABEL: func.func @tied
// EVEN: mt.linear_cross_entropy {{.*}} chunk_rows = 4 transpose_weight

// The fusion pipeline runs the pass only when asked.
// PIPELINE-LABEL: func.func @tied
// PIPELINE: mt.linear_cross_entropy {{.*}} chunk_rows = 3 transpose_weight
// OFF-LABEL: func.func @tied
// OFF-NOT: mt.linear_cross_entropy
// OFF: mt.cross_entropy_grad
