// RUN: megatron-opt %s -split-input-file -verify-diagnostics \
// RUN:   --pass-pipeline='builtin.module(func.func(sharding-propagation,shard-partition))' | FileCheck %s

// Context parallelism (docs/Parallelism.md, "Context parallelism"): the
// attention core with the sequence of its queries, keys and values split
// over the axis mt-annotate-shardings marks (mt.context_axis), here axis 0
// of a cp x tp grid with the heads over axis 1, becomes one block of the
// rank's queries against every rank's keys and values, gathered along the
// sequence (cp_comm_type all_gather); the dropout's tile is recorded.

shard.grid @grid(shape = 2x2)

// CHECK-LABEL: func.func @attention_gathered
// CHECK-SAME: %[[Q:.+]]: tensor<2x4x2x4xf32>, %[[K:.+]]: tensor<2x4x1x4xf32>, %[[V:.+]]: tensor<2x4x1x4xf32>
func.func @attention_gathered(%q: tensor<2x8x4x4xf32>, %k: tensor<2x8x2x4xf32>, %v: tensor<2x8x2x4xf32>) -> tensor<2x8x4x4xf32> {
  %split = shard.sharding @grid split_axes = [[], [0], [1]] : !shard.sharding
  %qs = shard.shard %q to %split annotate_for_users : tensor<2x8x4x4xf32>
  %ks = shard.shard %k to %split annotate_for_users : tensor<2x8x2x4xf32>
  %vs = shard.shard %v to %split annotate_for_users : tensor<2x8x2x4xf32>
  // CHECK: %[[KG:.+]] = shard.all_gather %[[K]] on @grid grid_axes = [0] gather_axis = 1 : tensor<2x4x1x4xf32> -> tensor<2x8x1x4xf32>
  // CHECK: %[[VG:.+]] = shard.all_gather %[[V]] on @grid grid_axes = [0] gather_axis = 1 : tensor<2x4x1x4xf32> -> tensor<2x8x1x4xf32>
  // CHECK: %[[O:.+]], %{{.+}} = mt.attention_block %[[Q]], %[[KG]], %[[VG]] causal {context_axis = 0 : i64, context_size = 2 : i64, dropout_p = 1.000000e-01 : f64, mt.split_axes = [array<i16>, array<i16: 0>, array<i16: 1>, array<i16>], seed = 7 : i64} : (tensor<2x4x2x4xf32>, tensor<2x8x1x4xf32>, tensor<2x8x1x4xf32>) -> (tensor<2x4x2x4xf32>, tensor<2x2x4xf32>)
  // CHECK-NOT: shard.
  // CHECK: return %[[O]]
  %o = mt.attention %qs, %ks, %vs causal {dropout_p = 0.1 : f64, seed = 7 : i64, mt.context_axis = 0 : i64, mt.cp_comm_type = "all_gather"} : (tensor<2x8x4x4xf32>, tensor<2x8x2x4xf32>, tensor<2x8x2x4xf32>) -> tensor<2x8x4x4xf32>
  %os = shard.shard %o to %split : tensor<2x8x4x4xf32>
  return %os : tensor<2x8x4x4xf32>
}

// -----

// The backward: the gathered keys and values, the block's logsumexp
// recomputed, the delta, the block's gradients, and the keys' and values'
// gradients (every rank's queries' terms) reduce-scattered back to their
// owners along the sequence.

shard.grid @grid(shape = 2)

// CHECK-LABEL: func.func @attention_grad_gathered
// CHECK-SAME: %[[DO:.+]]: tensor<1x4x2x4xf32>, %[[Q:.+]]: tensor<1x4x2x4xf32>, %[[K:.+]]: tensor<1x4x2x4xf32>, %[[V:.+]]: tensor<1x4x2x4xf32>
func.func @attention_grad_gathered(%do: tensor<1x8x2x4xf32>, %q: tensor<1x8x2x4xf32>, %k: tensor<1x8x2x4xf32>, %v: tensor<1x8x2x4xf32>) -> (tensor<1x8x2x4xf32>, tensor<1x8x2x4xf32>, tensor<1x8x2x4xf32>) {
  %split = shard.sharding @grid split_axes = [[], [0]] : !shard.sharding
  %dos = shard.shard %do to %split annotate_for_users : tensor<1x8x2x4xf32>
  %qs = shard.shard %q to %split annotate_for_users : tensor<1x8x2x4xf32>
  %ks = shard.shard %k to %split annotate_for_users : tensor<1x8x2x4xf32>
  %vs = shard.shard %v to %split annotate_for_users : tensor<1x8x2x4xf32>
  // CHECK: %[[KG:.+]] = shard.all_gather %[[K]] on @grid grid_axes = [0] gather_axis = 1 : tensor<1x4x2x4xf32> -> tensor<1x8x2x4xf32>
  // CHECK: %[[VG:.+]] = shard.all_gather %[[V]] on @grid grid_axes = [0] gather_axis = 1
  // CHECK: %[[O:.+]], %[[L:.+]] = mt.attention_block %[[Q]], %[[KG]], %[[VG]] causal {context_axis = 0 : i64, context_size = 2 : i64
  // CHECK: %[[D:.+]] = mt.attention_delta %[[O]], %[[DO]] : tensor<1x4x2x4xf32> -> tensor<1x2x4xf32>
  // CHECK: %[[DQ:.+]], %[[DKG:.+]], %[[DVG:.+]] = mt.attention_block_grad %[[DO]], %[[Q]], %[[KG]], %[[VG]], %[[L]], %[[D]] causal {context_axis = 0 : i64, context_size = 2 : i64
  // CHECK: %[[DK:.+]] = shard.reduce_scatter %[[DKG]] on @grid grid_axes = [0] scatter_axis = 1 : tensor<1x8x2x4xf32> -> tensor<1x4x2x4xf32>
  // CHECK: %[[DV:.+]] = shard.reduce_scatter %[[DVG]] on @grid grid_axes = [0] scatter_axis = 1 : tensor<1x8x2x4xf32> -> tensor<1x4x2x4xf32>
  // CHECK: return %[[DQ]], %[[DK]], %[[DV]]
  %dq, %dk, %dv = mt.attention_grad %dos, %qs, %ks, %vs causal {mt.context_axis = 0 : i64, mt.cp_comm_type = "all_gather"} : (tensor<1x8x2x4xf32>, tensor<1x8x2x4xf32>, tensor<1x8x2x4xf32>, tensor<1x8x2x4xf32>) -> (tensor<1x8x2x4xf32>, tensor<1x8x2x4xf32>, tensor<1x8x2x4xf32>)
  %dqs = shard.shard %dq to %split : tensor<1x8x2x4xf32>
  %dks = shard.shard %dk to %split : tensor<1x8x2x4xf32>
  %dvs = shard.shard %dv to %split : tensor<1x8x2x4xf32>
  return %dqs, %dks, %dvs : tensor<1x8x2x4xf32>, tensor<1x8x2x4xf32>, tensor<1x8x2x4xf32>
}

// -----

// A sequence split over another axis than the marked context axis is a
// plain block of the sequence, not the load-balanced chunks: refused.

shard.grid @grid(shape = 2x2)

func.func @attention_other_axis(%q: tensor<2x8x4x4xf32>) -> tensor<2x8x4x4xf32> {
  %split = shard.sharding @grid split_axes = [[], [1]] : !shard.sharding
  %qs = shard.shard %q to %split annotate_for_users : tensor<2x8x4x4xf32>
  // expected-error @+1 {{'mt.attention' op can be partitioned along batch and heads only; dimension 1 is sharded (a sequence split alike for the queries, keys and values over the context axis that mt-annotate-shardings{context-parallel-size} marks, mt.context_axis, is context parallelism)}}
  %o = mt.attention %qs, %qs, %qs causal {mt.context_axis = 0 : i64} : (tensor<2x8x4x4xf32>, tensor<2x8x4x4xf32>, tensor<2x8x4x4xf32>) -> tensor<2x8x4x4xf32>
  %os = shard.shard %o to %split : tensor<2x8x4x4xf32>
  return %os : tensor<2x8x4x4xf32>
}

// -----

// The ring (cp_comm_type p2p, Megatron-LM's default, also when absent) over
// CP4: step s holds rank (r - s)'s keys and values, one shard.shift per
// step, each block merged into the running output and logsumexp.

shard.grid @grid(shape = 4)

// CHECK-LABEL: func.func @attention_ring
// CHECK-SAME: %[[Q:.+]]: tensor<1x4x2x4xf32>, %[[K:.+]]: tensor<1x4x2x4xf32>, %[[V:.+]]: tensor<1x4x2x4xf32>
func.func @attention_ring(%q: tensor<1x16x2x4xf32>, %k: tensor<1x16x2x4xf32>, %v: tensor<1x16x2x4xf32>) -> tensor<1x16x2x4xf32> {
  %split = shard.sharding @grid split_axes = [[], [0]] : !shard.sharding
  %qs = shard.shard %q to %split annotate_for_users : tensor<1x16x2x4xf32>
  %ks = shard.shard %k to %split annotate_for_users : tensor<1x16x2x4xf32>
  %vs = shard.shard %v to %split annotate_for_users : tensor<1x16x2x4xf32>
  // CHECK: %[[K1:.+]] = shard.shift %[[K]] on @grid grid_axes = [0] shift_axis = 0 offset = 1 rotate : tensor<1x4x2x4xf32> -> tensor<1x4x2x4xf32>
  // CHECK: %[[V1:.+]] = shard.shift %[[V]] on @grid grid_axes = [0] shift_axis = 0 offset = 1 rotate
  // CHECK: %[[K2:.+]] = shard.shift %[[K1]]
  // CHECK: %[[V2:.+]] = shard.shift %[[V1]]
  // CHECK: %[[K3:.+]] = shard.shift %[[K2]]
  // CHECK: %[[V3:.+]] = shard.shift %[[V2]]
  // CHECK-NOT: shard.
  // CHECK: %[[O0:.+]], %[[L0:.+]] = mt.attention_block %[[Q]], %[[K]], %[[V]] causal {context_axis = 0 : i64, context_size = 4 : i64, key_step = 0 : i64}
  // CHECK: %[[O1:.+]], %[[L1:.+]] = mt.attention_block %[[Q]], %[[K1]], %[[V1]] causal {context_axis = 0 : i64, context_size = 4 : i64, key_step = 1 : i64}
  // CHECK: %[[M1:.+]], %[[N1:.+]] = mt.attention_merge %[[O0]], %[[L0]], %[[O1]], %[[L1]]
  // CHECK: mt.attention_block %[[Q]], %[[K2]], %[[V2]] causal {context_axis = 0 : i64, context_size = 4 : i64, key_step = 2 : i64}
  // CHECK: mt.attention_merge %[[M1]], %[[N1]]
  // CHECK: mt.attention_block %[[Q]], %[[K3]], %[[V3]] causal {context_axis = 0 : i64, context_size = 4 : i64, key_step = 3 : i64}
  // CHECK: %[[O:.+]], %{{.+}} = mt.attention_merge
  // CHECK-NOT: shard.
  // CHECK: return %[[O]]
  %o = mt.attention %qs, %ks, %vs causal {mt.context_axis = 0 : i64} : (tensor<1x16x2x4xf32>, tensor<1x16x2x4xf32>, tensor<1x16x2x4xf32>) -> tensor<1x16x2x4xf32>
  %os = shard.shard %o to %split : tensor<1x16x2x4xf32>
  return %os : tensor<1x16x2x4xf32>
}

// -----

// The ring's backward over CP2: the forward's blocks and merge recomputed,
// the delta, each step's block gradients; dq sums on the rank, the keys'
// and values' gradients move on with their block (shift, then add the
// rank's term) and a last shift returns them to their owners.

shard.grid @grid(shape = 2)

// CHECK-LABEL: func.func @attention_grad_ring
// CHECK-SAME: %[[DO:.+]]: tensor<1x4x2x4xf32>, %[[Q:.+]]: tensor<1x4x2x4xf32>, %[[K:.+]]: tensor<1x4x2x4xf32>, %[[V:.+]]: tensor<1x4x2x4xf32>
func.func @attention_grad_ring(%do: tensor<1x8x2x4xf32>, %q: tensor<1x8x2x4xf32>, %k: tensor<1x8x2x4xf32>, %v: tensor<1x8x2x4xf32>) -> (tensor<1x8x2x4xf32>, tensor<1x8x2x4xf32>, tensor<1x8x2x4xf32>) {
  %split = shard.sharding @grid split_axes = [[], [0]] : !shard.sharding
  %dos = shard.shard %do to %split annotate_for_users : tensor<1x8x2x4xf32>
  %qs = shard.shard %q to %split annotate_for_users : tensor<1x8x2x4xf32>
  %ks = shard.shard %k to %split annotate_for_users : tensor<1x8x2x4xf32>
  %vs = shard.shard %v to %split annotate_for_users : tensor<1x8x2x4xf32>
  // CHECK: %[[K1:.+]] = shard.shift %[[K]]
  // CHECK: %[[V1:.+]] = shard.shift %[[V]]
  // CHECK: %[[O0:.+]], %[[L0:.+]] = mt.attention_block %[[Q]], %[[K]], %[[V]] causal {{.*}}key_step = 0
  // CHECK: %[[O1:.+]], %[[L1:.+]] = mt.attention_block %[[Q]], %[[K1]], %[[V1]] causal {{.*}}key_step = 1
  // CHECK: %[[O:.+]], %[[L:.+]] = mt.attention_merge %[[O0]], %[[L0]], %[[O1]], %[[L1]]
  // CHECK: %[[D:.+]] = mt.attention_delta %[[O]], %[[DO]]
  // CHECK: %[[DQ0:.+]], %[[DK0:.+]], %[[DV0:.+]] = mt.attention_block_grad %[[DO]], %[[Q]], %[[K]], %[[V]], %[[L]], %[[D]] causal {{.*}}key_step = 0
  // CHECK: %[[DQ1:.+]], %[[DK1:.+]], %[[DV1:.+]] = mt.attention_block_grad %[[DO]], %[[Q]], %[[K1]], %[[V1]], %[[L]], %[[D]] causal {{.*}}key_step = 1
  // CHECK: %[[DQ:.+]] = mt.add %[[DQ0]], %[[DQ1]]
  // CHECK: %[[DKM:.+]] = shard.shift %[[DK0]]
  // CHECK: %[[DKS:.+]] = mt.add %[[DKM]], %[[DK1]]
  // CHECK: %[[DVM:.+]] = shard.shift %[[DV0]]
  // CHECK: %[[DVS:.+]] = mt.add %[[DVM]], %[[DV1]]
  // CHECK: %[[DKH:.+]] = shard.shift %[[DKS]]
  // CHECK: %[[DVH:.+]] = shard.shift %[[DVS]]
  // CHECK: return %[[DQ]], %[[DKH]], %[[DVH]]
  %dq, %dk, %dv = mt.attention_grad %dos, %qs, %ks, %vs causal {mt.context_axis = 0 : i64, mt.cp_comm_type = "p2p"} : (tensor<1x8x2x4xf32>, tensor<1x8x2x4xf32>, tensor<1x8x2x4xf32>, tensor<1x8x2x4xf32>) -> (tensor<1x8x2x4xf32>, tensor<1x8x2x4xf32>, tensor<1x8x2x4xf32>)
  %dqs = shard.shard %dq to %split : tensor<1x8x2x4xf32>
  %dks = shard.shard %dk to %split : tensor<1x8x2x4xf32>
  %dvs = shard.shard %dv to %split : tensor<1x8x2x4xf32>
  return %dqs, %dks, %dvs : tensor<1x8x2x4xf32>, tensor<1x8x2x4xf32>, tensor<1x8x2x4xf32>
}

// -----

// In a model, propagation gathers the keys and values itself (upstream
// replicates the key loop's operands against a split query loop, in rank
// order): the block takes them as they are, whatever the exchange, and the
// backward sums the keys' and values' gradients over the context axis for
// their whole results (an all_reduce; a split result would take a
// reduce_scatter).

shard.grid @grid(shape = 1x2x1)

// CHECK-LABEL: func.func @attention_keys_gathered
// CHECK-SAME: %[[DO:.+]]: tensor<1x4x2x4xf32>, %[[Q:.+]]: tensor<1x4x2x4xf32>, %[[K:.+]]: tensor<1x8x2x4xf32>, %[[V:.+]]: tensor<1x8x2x4xf32>
func.func @attention_keys_gathered(%do: tensor<1x8x2x4xf32>, %q: tensor<1x8x2x4xf32>, %k: tensor<1x8x2x4xf32>, %v: tensor<1x8x2x4xf32>) -> (tensor<1x8x2x4xf32>, tensor<1x8x2x4xf32>, tensor<1x8x2x4xf32>, tensor<1x8x2x4xf32>) {
  %split = shard.sharding @grid split_axes = [[], [1]] : !shard.sharding
  %whole = shard.sharding @grid split_axes = [[]] : !shard.sharding
  %dos = shard.shard %do to %split annotate_for_users : tensor<1x8x2x4xf32>
  %qs = shard.shard %q to %split annotate_for_users : tensor<1x8x2x4xf32>
  %ks = shard.shard %k to %whole annotate_for_users : tensor<1x8x2x4xf32>
  %vs = shard.shard %v to %whole annotate_for_users : tensor<1x8x2x4xf32>
  // CHECK-NOT: shard.shift
  // CHECK: %[[O:.+]], %{{.+}} = mt.attention_block %[[Q]], %[[K]], %[[V]] causal {context_axis = 1 : i64, context_size = 2 : i64} : (tensor<1x4x2x4xf32>, tensor<1x8x2x4xf32>, tensor<1x8x2x4xf32>)
  // CHECK: %[[B:.+]], %[[L:.+]] = mt.attention_block %[[Q]], %[[K]], %[[V]]
  // CHECK: %[[D:.+]] = mt.attention_delta %[[B]], %[[DO]]
  // CHECK: %[[DQ:.+]], %[[DKP:.+]], %[[DVP:.+]] = mt.attention_block_grad %[[DO]], %[[Q]], %[[K]], %[[V]], %[[L]], %[[D]]
  // CHECK: %[[DK:.+]] = shard.all_reduce %[[DKP]] on @grid grid_axes = [1] : tensor<1x8x2x4xf32> -> tensor<1x8x2x4xf32>
  // CHECK: %[[DV:.+]] = shard.all_reduce %[[DVP]] on @grid grid_axes = [1] : tensor<1x8x2x4xf32> -> tensor<1x8x2x4xf32>
  // CHECK: return %[[O]], %[[DQ]], %[[DK]], %[[DV]]
  %o = mt.attention %qs, %ks, %vs causal {mt.context_axis = 1 : i64, mt.cp_comm_type = "p2p"} : (tensor<1x8x2x4xf32>, tensor<1x8x2x4xf32>, tensor<1x8x2x4xf32>) -> tensor<1x8x2x4xf32>
  %dq, %dk, %dv = mt.attention_grad %dos, %qs, %ks, %vs causal {mt.context_axis = 1 : i64, mt.cp_comm_type = "p2p"} : (tensor<1x8x2x4xf32>, tensor<1x8x2x4xf32>, tensor<1x8x2x4xf32>, tensor<1x8x2x4xf32>) -> (tensor<1x8x2x4xf32>, tensor<1x8x2x4xf32>, tensor<1x8x2x4xf32>)
  %os = shard.shard %o to %split : tensor<1x8x2x4xf32>
  %dqs = shard.shard %dq to %split : tensor<1x8x2x4xf32>
  %dks = shard.shard %dk to %whole : tensor<1x8x2x4xf32>
  %dvs = shard.shard %dv to %whole : tensor<1x8x2x4xf32>
  return %os, %dqs, %dks, %dvs : tensor<1x8x2x4xf32>, tensor<1x8x2x4xf32>, tensor<1x8x2x4xf32>, tensor<1x8x2x4xf32>
}

// -----

// mt.rope: a sequence split over another axis than the marked one (a plain
// block of the sequence) is refused (the context-parallel rope:
// test/Target/Bundle/context-parallel-layout.mlir).

shard.grid @grid(shape = 2x2)

func.func @rope_other_axis(%x: tensor<2x16x2x4xf32>) -> tensor<2x16x2x4xf32> {
  %split = shard.sharding @grid split_axes = [[], [0]] : !shard.sharding
  %xs = shard.shard %x to %split annotate_for_users : tensor<2x16x2x4xf32>
  // expected-error @+1 {{'mt.rope' op can be partitioned along batch and heads only; dimension 1 is sharded (a sequence split first over the context axis that mt-annotate-shardings{context-parallel-size} marks, mt.context_axis, is context parallelism)}}
  %y = mt.rope %xs base = 1.000000e+04 {mt.context_axis = 1 : i64} : tensor<2x16x2x4xf32>
  %ys = shard.shard %y to %split : tensor<2x16x2x4xf32>
  return %ys : tensor<2x16x2x4xf32>
}
