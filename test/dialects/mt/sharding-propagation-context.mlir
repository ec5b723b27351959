// RUN: megatron-opt %s -split-input-file \
// RUN:   --pass-pipeline='builtin.module(func.func(sharding-propagation,shard-partition))' | FileCheck %s

// Context parallelism through propagation, as in a model: the queries',
// keys' and values' producers hold the sequence split over the context axis
// (no annotation for the attention itself). Upstream's default option gives
// both the query and the key loop that axis, a conflict it settles by
// gathering the keys and values; the attention's option keeps them split,
// so the ring (p2p, also when mt.cp_comm_type is absent) runs as a ring:
// shifts, no gather.

shard.grid @grid(shape = 2x2)

// CHECK-LABEL: func.func @ring_in_a_chain
// CHECK-SAME: %[[Q:.+]]: tensor<2x4x2x4xf32>, %[[K:.+]]: tensor<2x4x1x4xf32>, %[[V:.+]]: tensor<2x4x1x4xf32>
func.func @ring_in_a_chain(%q: tensor<2x8x4x4xf32>, %k: tensor<2x8x2x4xf32>, %v: tensor<2x8x2x4xf32>) -> tensor<2x8x4x4xf32> {
  %split = shard.sharding @grid split_axes = [[], [0], [1]] : !shard.sharding
  %qs = shard.shard %q to %split : tensor<2x8x4x4xf32>
  %ks = shard.shard %k to %split : tensor<2x8x2x4xf32>
  %vs = shard.shard %v to %split : tensor<2x8x2x4xf32>
  // CHECK: %[[Q2:.+]] = mt.add %[[Q]], %[[Q]] : tensor<2x4x2x4xf32>
  // CHECK: %[[K2:.+]] = mt.add %[[K]], %[[K]] : tensor<2x4x1x4xf32>
  // CHECK: %[[V2:.+]] = mt.add %[[V]], %[[V]] : tensor<2x4x1x4xf32>
  // CHECK-NOT: shard.all_gather
  // CHECK: %[[KS:.+]] = shard.shift %[[K2]] on @grid grid_axes = [0] shift_axis = 0 offset = 1 rotate
  // CHECK: %[[VS:.+]] = shard.shift %[[V2]] on @grid grid_axes = [0] shift_axis = 0 offset = 1 rotate
  // CHECK: %[[O0:.+]], %[[L0:.+]] = mt.attention_block %[[Q2]], %[[K2]], %[[V2]] causal {context_axis = 0 : i64, context_size = 2 : i64, key_step = 0 : i64}
  // CHECK: %[[O1:.+]], %[[L1:.+]] = mt.attention_block %[[Q2]], %[[KS]], %[[VS]] causal {context_axis = 0 : i64, context_size = 2 : i64, key_step = 1 : i64}
  // CHECK: %[[O:.+]], %{{.+}} = mt.attention_merge %[[O0]], %[[L0]], %[[O1]], %[[L1]]
  // CHECK-NOT: shard.
  // CHECK: mt.add %[[O]], %[[O]] : tensor<2x4x2x4xf32>
  %q2 = mt.add %qs, %qs : tensor<2x8x4x4xf32>
  %k2 = mt.add %ks, %ks : tensor<2x8x2x4xf32>
  %v2 = mt.add %vs, %vs : tensor<2x8x2x4xf32>
  %o = mt.attention %q2, %k2, %v2 causal {mt.context_axis = 0 : i64} : (tensor<2x8x4x4xf32>, tensor<2x8x2x4xf32>, tensor<2x8x2x4xf32>) -> tensor<2x8x4x4xf32>
  %o2 = mt.add %o, %o : tensor<2x8x4x4xf32>
  return %o2 : tensor<2x8x4x4xf32>
}

// -----

// all_gather: the partition gathers the keys and values itself (one
// gather each, not propagation's), and in the backward reduce-scatters
// their gradients to their owners (not an all-reduce of whole gradients).

shard.grid @grid(shape = 2)

// CHECK-LABEL: func.func @gathered_grad_in_a_chain
// CHECK-SAME: %[[DO:.+]]: tensor<1x4x2x4xf32>, %[[Q:.+]]: tensor<1x4x2x4xf32>, %[[K:.+]]: tensor<1x4x2x4xf32>, %[[V:.+]]: tensor<1x4x2x4xf32>
func.func @gathered_grad_in_a_chain(%do: tensor<1x8x2x4xf32>, %q: tensor<1x8x2x4xf32>, %k: tensor<1x8x2x4xf32>, %v: tensor<1x8x2x4xf32>) -> (tensor<1x8x2x4xf32>, tensor<1x8x2x4xf32>, tensor<1x8x2x4xf32>) {
  %split = shard.sharding @grid split_axes = [[], [0]] : !shard.sharding
  %dos = shard.shard %do to %split : tensor<1x8x2x4xf32>
  %qs = shard.shard %q to %split : tensor<1x8x2x4xf32>
  %ks = shard.shard %k to %split : tensor<1x8x2x4xf32>
  %vs = shard.shard %v to %split : tensor<1x8x2x4xf32>
  // CHECK: %[[KG:.+]] = shard.all_gather %[[K]] on @grid grid_axes = [0] gather_axis = 1 : tensor<1x4x2x4xf32> -> tensor<1x8x2x4xf32>
  // CHECK: %[[VG:.+]] = shard.all_gather %[[V]] on @grid grid_axes = [0] gather_axis = 1 : tensor<1x4x2x4xf32> -> tensor<1x8x2x4xf32>
  // CHECK: %[[DQ:.+]], %[[DKG:.+]], %[[DVG:.+]] = mt.attention_block_grad %[[DO]], %[[Q]], %[[KG]], %[[VG]]
  // CHECK-NOT: shard.all_reduce
  // CHECK: %[[DK:.+]] = shard.reduce_scatter %[[DKG]] on @grid grid_axes = [0] scatter_axis = 1 : tensor<1x8x2x4xf32> -> tensor<1x4x2x4xf32>
  // CHECK: %[[DV:.+]] = shard.reduce_scatter %[[DVG]] on @grid grid_axes = [0] scatter_axis = 1 : tensor<1x8x2x4xf32> -> tensor<1x4x2x4xf32>
  // CHECK-NOT: shard.all_reduce
  // CHECK: return %[[DQ]]
  %dq, %dk, %dv = mt.attention_grad %dos, %qs, %ks, %vs causal {mt.context_axis = 0 : i64, mt.cp_comm_type = "all_gather"} : (tensor<1x8x2x4xf32>, tensor<1x8x2x4xf32>, tensor<1x8x2x4xf32>, tensor<1x8x2x4xf32>) -> (tensor<1x8x2x4xf32>, tensor<1x8x2x4xf32>, tensor<1x8x2x4xf32>)
  %dk2 = mt.add %dk, %dk : tensor<1x8x2x4xf32>
  %dv2 = mt.add %dv, %dv : tensor<1x8x2x4xf32>
  return %dq, %dk2, %dv2 : tensor<1x8x2x4xf32>, tensor<1x8x2x4xf32>, tensor<1x8x2x4xf32>
}

// -----

// The ring's backward: the keys' and values' gradients travel with their
// block and a last shift returns them home; nothing is gathered or
// all-reduced.

shard.grid @grid(shape = 2)

// CHECK-LABEL: func.func @ring_grad_in_a_chain
func.func @ring_grad_in_a_chain(%do: tensor<1x8x2x4xf32>, %q: tensor<1x8x2x4xf32>, %k: tensor<1x8x2x4xf32>, %v: tensor<1x8x2x4xf32>) -> (tensor<1x8x2x4xf32>, tensor<1x8x2x4xf32>, tensor<1x8x2x4xf32>) {
  %split = shard.sharding @grid split_axes = [[], [0]] : !shard.sharding
  %dos = shard.shard %do to %split : tensor<1x8x2x4xf32>
  %qs = shard.shard %q to %split : tensor<1x8x2x4xf32>
  %ks = shard.shard %k to %split : tensor<1x8x2x4xf32>
  %vs = shard.shard %v to %split : tensor<1x8x2x4xf32>
  // CHECK-NOT: shard.all_gather
  // CHECK-NOT: shard.all_reduce
  // CHECK-COUNT-2: mt.attention_block_grad
  // CHECK: %[[DK:.+]] = shard.shift %{{[0-9]+}} on @grid grid_axes = [0] shift_axis = 0 offset = 1 rotate
  // CHECK: %[[DV:.+]] = shard.shift %{{[0-9]+}} on @grid grid_axes = [0] shift_axis = 0 offset = 1 rotate
  // CHECK-NOT: shard.all_reduce
  // CHECK: mt.add %[[DK]], %[[DK]] : tensor<1x4x2x4xf32>
  // CHECK: mt.add %[[DV]], %[[DV]] : tensor<1x4x2x4xf32>
  %dq, %dk, %dv = mt.attention_grad %dos, %qs, %ks, %vs causal {mt.context_axis = 0 : i64, mt.cp_comm_type = "p2p"} : (tensor<1x8x2x4xf32>, tensor<1x8x2x4xf32>, tensor<1x8x2x4xf32>, tensor<1x8x2x4xf32>) -> (tensor<1x8x2x4xf32>, tensor<1x8x2x4xf32>, tensor<1x8x2x4xf32>)
  %dk2 = mt.add %dk, %dk : tensor<1x8x2x4xf32>
  %dv2 = mt.add %dv, %dv : tensor<1x8x2x4xf32>
  return %dq, %dk2, %dv2 : tensor<1x8x2x4xf32>, tensor<1x8x2x4xf32>, tensor<1x8x2x4xf32>
}

// -----

// Context x tensor parallelism with sequence parallelism: the ids hold the
// rank's context chunks ([cp] on the sequence), the vocabulary-parallel
// table's partial rows are summed over the tensor axis and scattered along
// the sequence into the residual stream's [cp, tp] split (the partial's own
// context split leads), not all-reduced whole.

shard.grid @grid(shape = 1x2x2)

// CHECK-LABEL: func.func @embedding_sequence_parallel
// CHECK-SAME: %[[T:.+]]: tensor<8x4xf32>, %[[IDS:.+]]: tensor<2x8xi32>
func.func @embedding_sequence_parallel(%table: tensor<16x4xf32>, %ids: tensor<2x16xi32>) -> tensor<2x16x4xf32> {
  %vocab = shard.sharding @grid split_axes = [[2]] : !shard.sharding
  %chunks = shard.sharding @grid split_axes = [[], [1]] : !shard.sharding
  %stream = shard.sharding @grid split_axes = [[], [1, 2]] : !shard.sharding
  %ts = shard.shard %table to %vocab annotate_for_users : tensor<16x4xf32>
  %is = shard.shard %ids to %chunks annotate_for_users : tensor<2x16xi32>
  // CHECK: %[[E:.+]] = mt.embedding %[[T]], %[[IDS]] {{.*}}-> tensor<2x8x4xf32>
  // CHECK-NOT: shard.all_reduce
  // CHECK: %[[S:.+]] = shard.reduce_scatter %[[E]] on @grid grid_axes = [2] scatter_axis = 1 : tensor<2x8x4xf32> -> tensor<2x4x4xf32>
  // CHECK: return %[[S]]
  %e = mt.embedding %ts, %is : (tensor<16x4xf32>, tensor<2x16xi32>) -> tensor<2x16x4xf32>
  %es = shard.shard %e to %stream : tensor<2x16x4xf32>
  return %es : tensor<2x16x4xf32>
}
