// RUN: megatron-opt %s -split-input-file '-mt-fuse-linear-cross-entropy=chunk-rows=3' 2>/dev/null | FileCheck %s
// RUN: megatron-opt %s -split-input-file '-mt-fuse-linear-cross-entropy=chunk-rows=3' 2>&1 >/dev/null | FileCheck %s --check-prefix=WARN
// RUN: megatron-opt %s -split-input-file '-mt-fuse-linear-cross-entropy=chunk-rows=3' | megatron-opt -split-input-file | FileCheck %s --check-prefix=ROUNDTRIP

// The vocabulary-parallel output layer of TP2 as shard-partition and CSE
// leave it (a tied table's block, read transposed): the three readers of
// the block's logits become chunked ops where they stand, the all-reduces
// between them (max, then sum of the partials) and the data gradient's
// all-reduce keep their places, and no op reads whole logits.

shard.grid @grid(shape = 1x2)

// CHECK-LABEL: func.func @tied
// CHECK-SAME: (%[[H:[^:]+]]: tensor<2x4x8xf32>, %[[W:[^:]+]]: tensor<16x8xf32>, %[[L:[^:]+]]: tensor<2x4xi32>)
// CHECK: %[[M:.+]] = mt.linear_vocab_max %[[H]], %[[W]] chunk_rows = 3 transpose_weight : (tensor<2x4x8xf32>, tensor<16x8xf32>) -> tensor<2x4xf32>
// CHECK: %[[GM:.+]] = shard.all_reduce %[[M]] on @grid grid_axes = [1] reduction = max
// CHECK: %[[P:.+]] = mt.linear_vocab_partials %[[H]], %[[W]], %[[L]], %[[GM]] chunk_rows = 3 transpose_weight {vocab_shard_axes = array<i64: 1>}
// CHECK-SAME: -> tensor<2x4x2xf32>
// CHECK: %[[GP:.+]] = shard.all_reduce %[[P]] on @grid grid_axes = [1] :
// CHECK: %[[LOSS:.+]] = mt.vocab_cross_entropy %[[GP]], %[[L]] reduction = mean
// CHECK: %[[SEED:.+]] = mt.fill
// CHECK: %[[DH:.+]], %[[DW:.+]] = mt.linear_vocab_cross_entropy_grad %[[H]], %[[W]], %[[L]], %[[GM]], %[[GP]], %[[SEED]] reduction = mean chunk_rows = 3 transpose_weight {vocab_shard_axes = array<i64: 1>}
// CHECK-SAME: -> (tensor<2x4x8xf32>, tensor<16x8xf32>)
// CHECK: %[[GDH:.+]] = shard.all_reduce %[[DH]] on @grid grid_axes = [1] :
// CHECK-NOT: mt.linear
// CHECK-NOT: mt.vocab_max
// CHECK-NOT: mt.vocab_partials
// CHECK-NOT: mt.vocab_cross_entropy_grad
// CHECK: return %[[LOSS]], %[[GDH]], %[[DW]]
// ROUNDTRIP-LABEL: func.func @tied
// ROUNDTRIP: mt.linear_vocab_max
// ROUNDTRIP: mt.linear_vocab_partials
// ROUNDTRIP: mt.linear_vocab_cross_entropy_grad
func.func @tied(%h: tensor<2x4x8xf32>, %w: tensor<16x8xf32>, %labels: tensor<2x4xi32>)
    -> (tensor<f32>, tensor<2x4x8xf32>, tensor<16x8xf32>) {
  %logits = mt.linear %h, %w transpose_weight : (tensor<2x4x8xf32>, tensor<16x8xf32>) -> tensor<2x4x16xf32>
  %m = mt.vocab_max %logits : (tensor<2x4x16xf32>) -> tensor<2x4xf32>
  %gm = shard.all_reduce %m on @grid grid_axes = [1] reduction = max : tensor<2x4xf32> -> tensor<2x4xf32>
  %p = mt.vocab_partials %logits, %labels, %gm {vocab_shard_axes = array<i64: 1>} : (tensor<2x4x16xf32>, tensor<2x4xi32>, tensor<2x4xf32>) -> tensor<2x4x2xf32>
  %gp = shard.all_reduce %p on @grid grid_axes = [1] : tensor<2x4x2xf32> -> tensor<2x4x2xf32>
  %loss = mt.vocab_cross_entropy %gp, %labels reduction = mean : (tensor<2x4x2xf32>, tensor<2x4xi32>) -> tensor<f32>
  %seed = mt.fill 1.000000e+00 {mt.loss_seed} : tensor<f32>
  %dlogits = mt.vocab_cross_entropy_grad %seed, %logits, %labels, %gm, %gp reduction = mean {vocab_shard_axes = array<i64: 1>} : (tensor<f32>, tensor<2x4x16xf32>, tensor<2x4xi32>, tensor<2x4xf32>, tensor<2x4x2xf32>) -> tensor<2x4x16xf32>
  %dh = mt.linear %dlogits, %w : (tensor<2x4x16xf32>, tensor<16x8xf32>) -> tensor<2x4x8xf32>
  %gdh = shard.all_reduce %dh on @grid grid_axes = [1] : tensor<2x4x8xf32> -> tensor<2x4x8xf32>
  %dw = mt.linear_weight_grad %h, %dlogits transpose_weight : (tensor<2x4x8xf32>, tensor<2x4x16xf32>) -> tensor<16x8xf32>
  return %loss, %gdh, %dw : tensor<f32>, tensor<2x4x8xf32>, tensor<16x8xf32>
}

// -----

// An untied lm_head [hidden, vocabulary block] under sequence parallelism:
// the input is the all-gathered sequence, the data gradient is
// reduce-scattered back, and mt-regather-in-backward has gathered the
// input again for the weight gradient. The statistics ops read the
// forward's gather as the linear did; the gradient op reads the backward's
// and stands right after it, so the forward's gather is not kept for the
// backward pass. Summed loss.

shard.grid @grid(shape = 2)

// CHECK-LABEL: func.func @untied_sequence_parallel
// CHECK: %[[X:.+]] = shard.all_gather
// CHECK: mt.linear_vocab_max %[[X]], %{{.+}} chunk_rows = 3 : (tensor<8x8xf32>, tensor<8x16xf32>) -> tensor<8xf32>
// CHECK: mt.linear_vocab_partials %[[X]], %{{.+}} chunk_rows = 3 {vocab_shard_axes = array<i64: 0>}
// CHECK: mt.vocab_cross_entropy %{{.+}} reduction = sum
// CHECK: %[[X2:.+]] = shard.all_gather {{.+}} {mt.regathered}
// CHECK-NEXT: %[[DX:.+]], %[[DW:.+]] = mt.linear_vocab_cross_entropy_grad %[[X2]], {{.+}} reduction = sum chunk_rows = 3 {vocab_shard_axes = array<i64: 0>}
// CHECK-NEXT: shard.reduce_scatter %[[DX]]
// CHECK-NOT: mt.linear
func.func @untied_sequence_parallel(%xs: tensor<4x8xf32>, %w: tensor<8x16xf32>, %labels: tensor<8xi32>, %seed: tensor<f32>)
    -> (tensor<f32>, tensor<4x8xf32>, tensor<8x16xf32>) {
  %x = shard.all_gather %xs on @grid grid_axes = [0] gather_axis = 0 : tensor<4x8xf32> -> tensor<8x8xf32>
  %logits = mt.linear %x, %w : (tensor<8x8xf32>, tensor<8x16xf32>) -> tensor<8x16xf32>
  %m = mt.vocab_max %logits : (tensor<8x16xf32>) -> tensor<8xf32>
  %gm = shard.all_reduce %m on @grid grid_axes = [0] reduction = max : tensor<8xf32> -> tensor<8xf32>
  %p = mt.vocab_partials %logits, %labels, %gm {vocab_shard_axes = array<i64: 0>} : (tensor<8x16xf32>, tensor<8xi32>, tensor<8xf32>) -> tensor<8x2xf32>
  %gp = shard.all_reduce %p on @grid grid_axes = [0] : tensor<8x2xf32> -> tensor<8x2xf32>
  %loss = mt.vocab_cross_entropy %gp, %labels reduction = sum : (tensor<8x2xf32>, tensor<8xi32>) -> tensor<f32>
  %dlogits = mt.vocab_cross_entropy_grad %seed, %logits, %labels, %gm, %gp reduction = sum {vocab_shard_axes = array<i64: 0>} : (tensor<f32>, tensor<8x16xf32>, tensor<8xi32>, tensor<8xf32>, tensor<8x2xf32>) -> tensor<8x16xf32>
  %dx = mt.linear %dlogits, %w transpose_weight : (tensor<8x16xf32>, tensor<8x16xf32>) -> tensor<8x8xf32>
  %x2 = shard.all_gather %xs on @grid grid_axes = [0] gather_axis = 0 {mt.regathered} : tensor<4x8xf32> -> tensor<8x8xf32>
  %dw = mt.linear_weight_grad %x2, %dlogits : (tensor<8x8xf32>, tensor<8x16xf32>) -> tensor<8x16xf32>
  %dxs = shard.reduce_scatter %dx on @grid grid_axes = [0] scatter_axis = 0 : tensor<8x8xf32> -> tensor<4x8xf32>
  return %loss, %dxs, %dw : tensor<f32>, tensor<4x8xf32>, tensor<8x16xf32>
}

// -----

// Evaluation's vocabulary-parallel loss (no gradient): the two statistics
// ops are chunked too, so evaluation holds no block of logits either.

shard.grid @grid(shape = 2)

// CHECK-LABEL: func.func @eval
// CHECK: mt.linear_vocab_max
// CHECK: mt.linear_vocab_partials
// CHECK: mt.vocab_cross_entropy
// CHECK-NOT: mt.linear
func.func @eval(%h: tensor<6x8xf32>, %w: tensor<16x8xf32>, %labels: tensor<6xi32>) -> tensor<f32> {
  %logits = mt.linear %h, %w transpose_weight : (tensor<6x8xf32>, tensor<16x8xf32>) -> tensor<6x16xf32>
  %m = mt.vocab_max %logits : (tensor<6x16xf32>) -> tensor<6xf32>
  %gm = shard.all_reduce %m on @grid grid_axes = [0] reduction = max : tensor<6xf32> -> tensor<6xf32>
  %p = mt.vocab_partials %logits, %labels, %gm {vocab_shard_axes = array<i64: 0>} : (tensor<6x16xf32>, tensor<6xi32>, tensor<6xf32>) -> tensor<6x2xf32>
  %gp = shard.all_reduce %p on @grid grid_axes = [0] : tensor<6x2xf32> -> tensor<6x2xf32>
  %loss = mt.vocab_cross_entropy %gp, %labels reduction = mean : (tensor<6x2xf32>, tensor<6xi32>) -> tensor<f32>
  return %loss : tensor<f32>
}

// -----

// Logits read by anything else (returned: a pipeline stage's stash, or
// predictions), or a per-token loss gradient, keep the unfused ops; a
// vocabulary-parallel loss gradient left unfused is warned about.

shard.grid @grid(shape = 2)

// WARN: warning: mt-fuse-linear-cross-entropy: the vocabulary-parallel loss split between a pipeline stage's forward and backward functions (tensor and pipeline parallelism together) is not fused yet
// WARN-NOT: warning
// CHECK-LABEL: func.func @other_reader
// CHECK: mt.linear
// CHECK: mt.vocab_max
// CHECK-NOT: mt.linear_vocab
func.func @other_reader(%h: tensor<6x8xf32>, %w: tensor<16x8xf32>, %labels: tensor<6xi32>, %seed: tensor<6xf32>)
    -> (tensor<6x16xf32>, tensor<6x16xf32>) {
  %logits = mt.linear %h, %w transpose_weight : (tensor<6x8xf32>, tensor<16x8xf32>) -> tensor<6x16xf32>
  %m = mt.vocab_max %logits : (tensor<6x16xf32>) -> tensor<6xf32>
  %gm = shard.all_reduce %m on @grid grid_axes = [0] reduction = max : tensor<6xf32> -> tensor<6xf32>
  %p = mt.vocab_partials %logits, %labels, %gm {vocab_shard_axes = array<i64: 0>} : (tensor<6x16xf32>, tensor<6xi32>, tensor<6xf32>) -> tensor<6x2xf32>
  %gp = shard.all_reduce %p on @grid grid_axes = [0] : tensor<6x2xf32> -> tensor<6x2xf32>
  %dlogits = mt.vocab_cross_entropy_grad %seed, %logits, %labels, %gm, %gp reduction = none {vocab_shard_axes = array<i64: 0>} : (tensor<6xf32>, tensor<6x16xf32>, tensor<6xi32>, tensor<6xf32>, tensor<6x2xf32>) -> tensor<6x16xf32>
  return %logits, %dlogits : tensor<6x16xf32>, tensor<6x16xf32>
}
