// RUN: megatron-opt %s \
// RUN:   --pass-pipeline='builtin.module(func.func(sharding-propagation,shard-partition),canonicalize)' | FileCheck %s

// Context x sequence parallelism (docs/Parallelism.md, "Context
// parallelism"): a learned position embedding's gradient may read the
// positions at a coarser layout than their tile (here the context rank's
// chunks, [cp], where the positions are made per [cp, tp] tile). Rather
// than gather integer ids over the tensor axis (the runtime gathers
// floating-point tensors only), each rank makes the positions again at the
// gathered layout: the tile without the gathered axes, still at the
// context layout, so nothing integer is gathered.

shard.grid @grid(shape = 2x2)

// CHECK-LABEL: func.func @positions_made_again
// CHECK-SAME: %[[DOUT:.+]]: tensor<2x8x8xf32>) -> (tensor<2x4x8xf32>, tensor<32x8xf32>)
func.func @positions_made_again(%dout: tensor<2x16x8xf32>) -> (tensor<2x16x8xf32>, tensor<32x8xf32>) {
  // CHECK: %[[TILE:.+]] = mt.position_ids {mt.context_axis = 0 : i64, mt.context_size = 2 : i64, mt.split_axes = [array<i16>, array<i16: 0, 1>]} : tensor<2x4xi32>
  // CHECK: %[[CHUNKS:.+]] = mt.position_ids {mt.context_axis = 0 : i64, mt.context_size = 2 : i64, mt.split_axes = [array<i16>, array<i16: 0>]} : tensor<2x8xi32>
  // CHECK-NOT: shard.all_gather
  // CHECK: %[[GRAD:.+]] = mt.embedding_grad %[[DOUT]], %[[CHUNKS]] : (tensor<2x8x8xf32>, tensor<2x8xi32>) -> tensor<32x8xf32>
  // CHECK: %[[SUM:.+]] = shard.all_reduce %[[GRAD]] on @grid grid_axes = [0]
  // CHECK-NOT: shard.all_gather
  // CHECK: %[[LOOKUP:.+]] = mt.embedding %{{.+}}, %[[TILE]]
  // CHECK: return %[[LOOKUP]], %[[SUM]]
  %positions = mt.position_ids {mt.context_axis = 0 : i64} : tensor<2x16xi32>
  %tile = shard.sharding @grid split_axes = [[], [0, 1]] : !shard.sharding
  %p = shard.shard %positions to %tile : tensor<2x16xi32>
  %chunks = shard.sharding @grid split_axes = [[], [0]] : !shard.sharding
  %pu = shard.shard %p to %chunks annotate_for_users : tensor<2x16xi32>
  %du = shard.shard %dout to %chunks annotate_for_users : tensor<2x16x8xf32>
  %grad = mt.embedding_grad %du, %pu : (tensor<2x16x8xf32>, tensor<2x16xi32>) -> tensor<32x8xf32>
  %tu = shard.shard %p to %tile annotate_for_users : tensor<2x16xi32>
  %table = arith.constant dense<1.0> : tensor<32x8xf32>
  %lookup = mt.embedding %table, %tu : (tensor<32x8xf32>, tensor<2x16xi32>) -> tensor<2x16x8xf32>
  %rows = shard.sharding @grid split_axes = [[], [0, 1]] : !shard.sharding
  %out = shard.shard %lookup to %rows : tensor<2x16x8xf32>
  return %out, %grad : tensor<2x16x8xf32>, tensor<32x8xf32>
}
