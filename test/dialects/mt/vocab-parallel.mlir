// RUN: megatron-opt %s -split-input-file \
// RUN:   --pass-pipeline='builtin.module(func.func(sharding-propagation{traversal=forward},shard-partition),canonicalize,cse)' \
// RUN:   | FileCheck %s

// Megatron-LM's vocabulary-parallel embedding: each rank looks up the ids in
// its half of the table (zero rows for the others); one all-reduce over the
// tensor axis completes the lookup. No rank holds the whole table.

shard.grid @tp(shape = 2)

// CHECK-LABEL: func.func @embedding
// CHECK-SAME: %[[TABLE:.+]]: tensor<16x8xf32>, %[[IDS:.+]]: tensor<2x4xi32>
func.func @embedding(%table: tensor<32x8xf32>, %ids: tensor<2x4xi32>) -> tensor<2x4x8xf32> {
  %vocabulary = shard.sharding @tp split_axes = [[0]] : !shard.sharding
  %ts = shard.shard %table to %vocabulary annotate_for_users : tensor<32x8xf32>
  // CHECK: %[[ROWS:.+]] = mt.embedding %[[TABLE]], %[[IDS]] {vocab_shard_axes = array<i64: 0>} : (tensor<16x8xf32>, tensor<2x4xi32>) -> tensor<2x4x8xf32>
  // CHECK: %[[SUM:.+]] = shard.all_reduce %[[ROWS]] on @tp grid_axes = [0] : tensor<2x4x8xf32> -> tensor<2x4x8xf32>
  // CHECK: return %[[SUM]]
  %h = mt.embedding %ts, %ids : (tensor<32x8xf32>, tensor<2x4xi32>) -> tensor<2x4x8xf32>
  %replicated = shard.sharding @tp split_axes = [[]] : !shard.sharding
  %hr = shard.shard %h to %replicated : tensor<2x4x8xf32>
  return %hr : tensor<2x4x8xf32>
}

// -----

// The output layer on a vocabulary-split table gives vocabulary-split
// logits; the cross-entropy all-reduces each row's maximum, then its sum of
// exponentials and target logit ([rows, 2]), never the logits.

shard.grid @tp(shape = 2)

// CHECK-LABEL: func.func @cross_entropy
// CHECK-SAME: %[[H:[^:]+]]: tensor<2x4x8xf32>, %[[TABLE:[^:]+]]: tensor<16x8xf32>, %[[LABELS:[^:]+]]: tensor<2x4xi32>
func.func @cross_entropy(%h: tensor<2x4x8xf32>, %table: tensor<32x8xf32>, %labels: tensor<2x4xi32>) -> tensor<f32> {
  %vocabulary = shard.sharding @tp split_axes = [[0]] : !shard.sharding
  %ts = shard.shard %table to %vocabulary annotate_for_users : tensor<32x8xf32>
  // CHECK: %[[LOGITS:.+]] = mt.linear %[[H]], %[[TABLE]] transpose_weight : (tensor<2x4x8xf32>, tensor<16x8xf32>) -> tensor<2x4x16xf32>
  %logits = mt.linear %h, %ts transpose_weight : (tensor<2x4x8xf32>, tensor<32x8xf32>) -> tensor<2x4x32xf32>
  // CHECK: %[[MAX:.+]] = mt.vocab_max %[[LOGITS]] : (tensor<2x4x16xf32>) -> tensor<2x4xf32>
  // CHECK: %[[GMAX:.+]] = shard.all_reduce %[[MAX]] on @tp grid_axes = [0] reduction = max : tensor<2x4xf32> -> tensor<2x4xf32>
  // CHECK: %[[P:.+]] = mt.vocab_partials %[[LOGITS]], %[[LABELS]], %[[GMAX]] {vocab_shard_axes = array<i64: 0>} : (tensor<2x4x16xf32>, tensor<2x4xi32>, tensor<2x4xf32>) -> tensor<2x4x2xf32>
  // CHECK: %[[GP:.+]] = shard.all_reduce %[[P]] on @tp grid_axes = [0] : tensor<2x4x2xf32> -> tensor<2x4x2xf32>
  // CHECK: %[[LOSS:.+]] = mt.vocab_cross_entropy %[[GP]], %[[LABELS]] reduction = mean : (tensor<2x4x2xf32>, tensor<2x4xi32>) -> tensor<f32>
  // CHECK-NOT: all_gather
  // CHECK: return %[[LOSS]]
  %loss = mt.cross_entropy %logits, %labels reduction = mean : (tensor<2x4x32xf32>, tensor<2x4xi32>) -> tensor<f32>
  return %loss : tensor<f32>
}

// -----

// The backward pass: the logits' gradient stays on each rank's block (after
// the same statistics), and the embedding gradient is the rank's rows.

shard.grid @tp(shape = 2)

// CHECK-LABEL: func.func @backward
// CHECK-SAME: %[[DLOSS:[^:]+]]: tensor<f32>, %[[LOGITS:[^:]+]]: tensor<2x4x16xf32>, %[[LABELS:[^:]+]]: tensor<2x4xi32>, %[[DH:[^:]+]]: tensor<2x4x8xf32>
func.func @backward(%dloss: tensor<f32>, %logits: tensor<2x4x32xf32>, %labels: tensor<2x4xi32>, %dh: tensor<2x4x8xf32>) -> (tensor<2x4x32xf32>, tensor<32x8xf32>) {
  %vocabulary = shard.sharding @tp split_axes = [[], [], [0]] : !shard.sharding
  %ls = shard.shard %logits to %vocabulary annotate_for_users : tensor<2x4x32xf32>
  // CHECK: %[[MAX:.+]] = mt.vocab_max %[[LOGITS]]
  // CHECK: %[[GMAX:.+]] = shard.all_reduce %[[MAX]] on @tp grid_axes = [0] reduction = max
  // CHECK: %[[P:.+]] = mt.vocab_partials %[[LOGITS]], %[[LABELS]], %[[GMAX]] {vocab_shard_axes = array<i64: 0>}
  // CHECK: %[[GP:.+]] = shard.all_reduce %[[P]] on @tp grid_axes = [0]
  // CHECK: %[[DLOGITS:.+]] = mt.vocab_cross_entropy_grad %[[DLOSS]], %[[LOGITS]], %[[LABELS]], %[[GMAX]], %[[GP]] reduction = mean {vocab_shard_axes = array<i64: 0>} : (tensor<f32>, tensor<2x4x16xf32>, tensor<2x4xi32>, tensor<2x4xf32>, tensor<2x4x2xf32>) -> tensor<2x4x16xf32>
  %dlogits = mt.cross_entropy_grad %dloss, %ls, %labels reduction = mean : (tensor<f32>, tensor<2x4x32xf32>, tensor<2x4xi32>) -> tensor<2x4x32xf32>
  %dls = shard.shard %dlogits to %vocabulary : tensor<2x4x32xf32>
  // CHECK: %[[DTABLE:.+]] = mt.embedding_grad %[[DH]], %[[LABELS]] {vocab_shard_axes = array<i64: 0>} : (tensor<2x4x8xf32>, tensor<2x4xi32>) -> tensor<16x8xf32>
  // CHECK-NOT: shard.all_reduce
  // CHECK: return %[[DLOGITS]], %[[DTABLE]]
  %dtable = mt.embedding_grad %dh, %labels : (tensor<2x4x8xf32>, tensor<2x4xi32>) -> tensor<32x8xf32>
  %rows = shard.sharding @tp split_axes = [[0]] : !shard.sharding
  %dts = shard.shard %dtable to %rows : tensor<32x8xf32>
  return %dls, %dts : tensor<2x4x32xf32>, tensor<32x8xf32>
}
