// RUN: megatron-opt %s -split-input-file '-mt-fuse-linear-cross-entropy=chunk-rows=3' | FileCheck %s
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

// Context x sequence parallelism leaves the data gradient whole over the
// tensor ranks: its all-reduce comes right after it, before the regathered
// input of the weight gradient. The gather, whose shard exists before the
// loss gradient, moves up to the gradient op (rather than the gradient op
// moving past the all-reduce, which reads its result).

shard.grid @grid(shape = 2)

// CHECK-LABEL: func.func @regathered_after_a_reader
// CHECK: mt.vocab_cross_entropy %{{.+}} reduction = sum
// CHECK: %[[X2:.+]] = shard.all_gather {{.+}} {mt.regathered}
// CHECK-NEXT: %[[DX:.+]], %[[DW:.+]] = mt.linear_vocab_cross_entropy_grad %[[X2]], {{.+}} reduction = sum chunk_rows = 3 {vocab_shard_axes = array<i64: 0>}
// CHECK-NEXT: %[[SUM:.+]] = shard.all_reduce %[[DX]]
// CHECK-NOT: mt.linear
// CHECK: return %{{.+}}, %[[SUM]], %[[DW]]
func.func @regathered_after_a_reader(%xs: tensor<4x8xf32>, %w: tensor<8x16xf32>, %labels: tensor<8xi32>, %seed: tensor<f32>)
    -> (tensor<f32>, tensor<8x8xf32>, tensor<8x16xf32>) {
  %x = shard.all_gather %xs on @grid grid_axes = [0] gather_axis = 0 : tensor<4x8xf32> -> tensor<8x8xf32>
  %logits = mt.linear %x, %w : (tensor<8x8xf32>, tensor<8x16xf32>) -> tensor<8x16xf32>
  %m = mt.vocab_max %logits : (tensor<8x16xf32>) -> tensor<8xf32>
  %gm = shard.all_reduce %m on @grid grid_axes = [0] reduction = max : tensor<8xf32> -> tensor<8xf32>
  %p = mt.vocab_partials %logits, %labels, %gm {vocab_shard_axes = array<i64: 0>} : (tensor<8x16xf32>, tensor<8xi32>, tensor<8xf32>) -> tensor<8x2xf32>
  %gp = shard.all_reduce %p on @grid grid_axes = [0] : tensor<8x2xf32> -> tensor<8x2xf32>
  %loss = mt.vocab_cross_entropy %gp, %labels reduction = sum : (tensor<8x2xf32>, tensor<8xi32>) -> tensor<f32>
  %dlogits = mt.vocab_cross_entropy_grad %seed, %logits, %labels, %gm, %gp reduction = sum {vocab_shard_axes = array<i64: 0>} : (tensor<f32>, tensor<8x16xf32>, tensor<8xi32>, tensor<8xf32>, tensor<8x2xf32>) -> tensor<8x16xf32>
  %dx = mt.linear %dlogits, %w transpose_weight : (tensor<8x16xf32>, tensor<8x16xf32>) -> tensor<8x8xf32>
  %dxsum = shard.all_reduce %dx on @grid grid_axes = [0] : tensor<8x8xf32> -> tensor<8x8xf32>
  %x2 = shard.all_gather %xs on @grid grid_axes = [0] gather_axis = 0 {mt.regathered} : tensor<4x8xf32> -> tensor<8x8xf32>
  %dw = mt.linear_weight_grad %x2, %dlogits : (tensor<8x8xf32>, tensor<8x16xf32>) -> tensor<8x16xf32>
  return %loss, %dxsum, %dw : tensor<f32>, tensor<8x8xf32>, tensor<8x16xf32>
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

// Logits read by anything else (returned, as predictions), or a per-token
// loss gradient, keep the unfused ops.

shard.grid @grid(shape = 2)

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

// -----

// TP2 on a pipeline's last stage after mt-split-forward-backward (tied
// table, read transposed): the forward computes the block's logits and the
// statistics and stashes the logits, the labels, the maxima, the partials
// and the final norm's output; the backward computes the logits' gradient
// and both gradient GEMMs. The forward's statistics become the chunked
// ops, the backward's gradient the chunked gradient op reading the
// stashed input and the backward's read of the parameter; the logits'
// stash leaves both functions.

shard.grid @grid(shape = 1x2)
mt.parameter @wte : tensor<16x8xf32> init = normal std = 2.000000e-02

// CHECK-LABEL: func.func @step_stage1_forward
// CHECK-SAME: (%[[ACT:[^:]+]]: tensor<2x4x8xf32> {mt.name = "activation"}, %[[L:[^:]+]]: tensor<2x4xi32> {mt.name = "labels"})
// CHECK-SAME: -> (tensor<f32>, tensor<2x4xi32> {mt.name = "stash"}, tensor<2x4xf32> {mt.name = "stash"}, tensor<2x4x2xf32> {mt.name = "stash"}, tensor<2x4x8xf32> {mt.name = "stash"})
// CHECK: %[[W:.+]] = mt.get_parameter @wte
// CHECK: %[[H:.+]] = mt.add %[[ACT]], %[[ACT]]
// CHECK-NEXT: %[[M:.+]] = mt.linear_vocab_max %[[H]], %[[W]] chunk_rows = 3 transpose_weight
// CHECK-NEXT: %[[GM:.+]] = shard.all_reduce %[[M]]
// CHECK-NEXT: %[[P:.+]] = mt.linear_vocab_partials %[[H]], %[[W]], %[[L]], %[[GM]] chunk_rows = 3 transpose_weight {vocab_shard_axes = array<i64: 1>}
// CHECK-NEXT: %[[GP:.+]] = shard.all_reduce %[[P]]
// CHECK-NEXT: %[[LOSS:.+]] = mt.vocab_cross_entropy %[[GP]], %[[L]]
// CHECK-NOT: mt.linear
// CHECK: return %[[LOSS]], %[[L]], %[[GM]], %[[GP]], %[[H]] :

// CHECK-LABEL: func.func @step_stage1_backward
// CHECK-SAME: (%[[SL:[^:]+]]: tensor<2x4xi32> {mt.name = "stash"}, %[[SM:[^:]+]]: tensor<2x4xf32> {mt.name = "stash"}, %[[SP:[^:]+]]: tensor<2x4x2xf32> {mt.name = "stash"}, %[[SH:[^:]+]]: tensor<2x4x8xf32> {mt.name = "stash"}, %[[SEED:[^:]+]]: tensor<f32> {mt.name = "loss_gradient"})
// CHECK: %[[BW:.+]] = mt.get_parameter @wte
// CHECK-NEXT: %[[DH:.+]], %[[DW:.+]] = mt.linear_vocab_cross_entropy_grad %[[SH]], %[[BW]], %[[SL]], %[[SM]], %[[SP]], %[[SEED]] reduction = mean chunk_rows = 3 transpose_weight {vocab_shard_axes = array<i64: 1>}
// CHECK-NEXT: %[[GDH:.+]] = shard.all_reduce %[[DH]]
// CHECK-NOT: mt.linear
// CHECK-NOT: mt.vocab_cross_entropy_grad
// CHECK: return %[[GDH]], %[[DW]]
func.func @step_stage1_forward(%act: tensor<2x4x8xf32> {mt.name = "activation"}, %labels: tensor<2x4xi32> {mt.name = "labels"})
    -> (tensor<f32>, tensor<2x4x16xf32> {mt.name = "stash"}, tensor<2x4xi32> {mt.name = "stash"}, tensor<2x4xf32> {mt.name = "stash"}, tensor<2x4x2xf32> {mt.name = "stash"}, tensor<2x4x8xf32> {mt.name = "stash"})
    attributes {mt.pipeline_stage = 1 : i64} {
  %w = mt.get_parameter @wte : tensor<16x8xf32>
  %h = mt.add %act, %act : tensor<2x4x8xf32>
  %logits = mt.linear %h, %w transpose_weight : (tensor<2x4x8xf32>, tensor<16x8xf32>) -> tensor<2x4x16xf32>
  %m = mt.vocab_max %logits : (tensor<2x4x16xf32>) -> tensor<2x4xf32>
  %gm = shard.all_reduce %m on @grid grid_axes = [1] reduction = max : tensor<2x4xf32> -> tensor<2x4xf32>
  %p = mt.vocab_partials %logits, %labels, %gm {vocab_shard_axes = array<i64: 1>} : (tensor<2x4x16xf32>, tensor<2x4xi32>, tensor<2x4xf32>) -> tensor<2x4x2xf32>
  %gp = shard.all_reduce %p on @grid grid_axes = [1] : tensor<2x4x2xf32> -> tensor<2x4x2xf32>
  %loss = mt.vocab_cross_entropy %gp, %labels reduction = mean : (tensor<2x4x2xf32>, tensor<2x4xi32>) -> tensor<f32>
  return %loss, %logits, %labels, %gm, %gp, %h : tensor<f32>, tensor<2x4x16xf32>, tensor<2x4xi32>, tensor<2x4xf32>, tensor<2x4x2xf32>, tensor<2x4x8xf32>
}
func.func @step_stage1_backward(%logits: tensor<2x4x16xf32> {mt.name = "stash"}, %labels: tensor<2x4xi32> {mt.name = "stash"}, %gm: tensor<2x4xf32> {mt.name = "stash"}, %gp: tensor<2x4x2xf32> {mt.name = "stash"}, %h: tensor<2x4x8xf32> {mt.name = "stash"}, %seed: tensor<f32> {mt.name = "loss_gradient"})
    -> (tensor<2x4x8xf32> {mt.name = "input_gradient"}, tensor<16x8xf32>)
    attributes {mt.pipeline_stage = 1 : i64} {
  %w = mt.get_parameter @wte : tensor<16x8xf32>
  %dlogits = mt.vocab_cross_entropy_grad %seed, %logits, %labels, %gm, %gp reduction = mean {vocab_shard_axes = array<i64: 1>} : (tensor<f32>, tensor<2x4x16xf32>, tensor<2x4xi32>, tensor<2x4xf32>, tensor<2x4x2xf32>) -> tensor<2x4x16xf32>
  %dh = mt.linear %dlogits, %w : (tensor<2x4x16xf32>, tensor<16x8xf32>) -> tensor<2x4x8xf32>
  %gdh = shard.all_reduce %dh on @grid grid_axes = [1] : tensor<2x4x8xf32> -> tensor<2x4x8xf32>
  %dw = mt.linear_weight_grad %h, %dlogits transpose_weight : (tensor<2x4x8xf32>, tensor<2x4x16xf32>) -> tensor<16x8xf32>
  return %gdh, %dw : tensor<2x4x8xf32>, tensor<16x8xf32>
}
