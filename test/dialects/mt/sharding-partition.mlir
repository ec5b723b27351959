// RUN: megatron-opt %s -split-input-file -verify-diagnostics \
// RUN:   --pass-pipeline='builtin.module(func.func(sharding-propagation,shard-partition))' | FileCheck %s

// Megatron-LM's tensor-parallel MLP from upstream shard's passes over mt ops:
// the first projection column-parallel (weight and bias split on the output
// dimension), the activation local, the second row-parallel: one all_reduce
// of the partial products, then the bias, added once.

shard.grid @tp(shape = 2)

// CHECK-LABEL: func.func @mlp
// CHECK-SAME: %[[X:.+]]: tensor<2x4x8xf32>, %[[W1:.+]]: tensor<8x16xf32>, %[[B1:.+]]: tensor<16xf32>, %[[W2:.+]]: tensor<16x8xf32>, %[[B2:.+]]: tensor<8xf32>
func.func @mlp(%x: tensor<2x4x8xf32>, %w1: tensor<8x32xf32>, %b1: tensor<32xf32>, %w2: tensor<32x8xf32>, %b2: tensor<8xf32>) -> tensor<2x4x8xf32> {
  %column = shard.sharding @tp split_axes = [[], [0]] : !shard.sharding
  %w1s = shard.shard %w1 to %column annotate_for_users : tensor<8x32xf32>
  %split = shard.sharding @tp split_axes = [[0]] : !shard.sharding
  %b1s = shard.shard %b1 to %split annotate_for_users : tensor<32xf32>
  %row = shard.sharding @tp split_axes = [[0], []] : !shard.sharding
  %w2s = shard.shard %w2 to %row annotate_for_users : tensor<32x8xf32>
  // CHECK: %[[H:.+]] = mt.linear %[[X]], %[[W1]], %[[B1]] : (tensor<2x4x8xf32>, tensor<8x16xf32>, tensor<16xf32>) -> tensor<2x4x16xf32>
  %h = mt.linear %x, %w1s, %b1s : (tensor<2x4x8xf32>, tensor<8x32xf32>, tensor<32xf32>) -> tensor<2x4x32xf32>
  // CHECK: %[[G:.+]] = mt.gelu %[[H]] approximate = tanh : tensor<2x4x16xf32>
  %g = mt.gelu %h approximate = tanh : tensor<2x4x32xf32>
  // CHECK: %[[P:.+]] = mt.linear %[[G]], %[[W2]] : (tensor<2x4x16xf32>, tensor<16x8xf32>) -> tensor<2x4x8xf32>
  // CHECK: %[[R:.+]] = shard.all_reduce %[[P]] on @tp grid_axes = [0] : tensor<2x4x8xf32> -> tensor<2x4x8xf32>
  // CHECK: %[[Y:.+]] = mt.bias_add %[[R]], %[[B2]]
  // CHECK-NOT: shard.all_reduce
  // CHECK: return %[[Y]]
  %y = mt.linear %g, %w2s, %b2 : (tensor<2x4x32xf32>, tensor<32x8xf32>, tensor<8xf32>) -> tensor<2x4x8xf32>
  %replicated = shard.sharding @tp split_axes = [[]] : !shard.sharding
  %yr = shard.shard %y to %replicated : tensor<2x4x8xf32>
  return %yr : tensor<2x4x8xf32>
}

// -----

// The attention core with heads split over the grid: with grouped-query
// attention each rank keeps whole groups (4 query heads and 2 key/value
// heads become 2 and 1); nothing is communicated.

shard.grid @tp(shape = 2)

// CHECK-LABEL: func.func @attention_heads
// CHECK-SAME: tensor<2x8x2x4xf32>, %{{.+}}: tensor<2x8x1x4xf32>, %{{.+}}: tensor<2x8x1x4xf32>
func.func @attention_heads(%q: tensor<2x8x4x4xf32>, %k: tensor<2x8x2x4xf32>, %v: tensor<2x8x2x4xf32>) -> tensor<2x8x4x4xf32> {
  %heads = shard.sharding @tp split_axes = [[], [], [0]] : !shard.sharding
  %qs = shard.shard %q to %heads annotate_for_users : tensor<2x8x4x4xf32>
  %ks = shard.shard %k to %heads annotate_for_users : tensor<2x8x2x4xf32>
  %vs = shard.shard %v to %heads annotate_for_users : tensor<2x8x2x4xf32>
  // CHECK: mt.attention %{{.+}}, %{{.+}}, %{{.+}} causal : (tensor<2x8x2x4xf32>, tensor<2x8x1x4xf32>, tensor<2x8x1x4xf32>) -> tensor<2x8x2x4xf32>
  // CHECK-NOT: shard.all_
  %o = mt.attention %qs, %ks, %vs causal : (tensor<2x8x4x4xf32>, tensor<2x8x2x4xf32>, tensor<2x8x2x4xf32>) -> tensor<2x8x4x4xf32>
  %os = shard.shard %o to %heads : tensor<2x8x4x4xf32>
  return %os : tensor<2x8x4x4xf32>
}

// -----

// Megatron-LM's tensor-parallel attention block (Llama's layout: separate
// q/k/v projections stored out x in, rotary embeddings, grouped-query heads):
// column-parallel projections, heads split through the reshapes, rope and the
// attention core, row-parallel output projection, one all_reduce.

shard.grid @tp(shape = 2)

// CHECK-LABEL: func.func @attention_block
// CHECK-SAME: %{{.+}}: tensor<2x8x16xf32>, %{{.+}}: tensor<8x16xf32>, %{{.+}}: tensor<4x16xf32>, %{{.+}}: tensor<4x16xf32>, %{{.+}}: tensor<16x8xf32>
func.func @attention_block(%x: tensor<2x8x16xf32>, %wq: tensor<16x16xf32>, %wk: tensor<8x16xf32>, %wv: tensor<8x16xf32>, %wo: tensor<16x16xf32>) -> tensor<2x8x16xf32> {
  %column = shard.sharding @tp split_axes = [[0]] : !shard.sharding
  %wqs = shard.shard %wq to %column annotate_for_users : tensor<16x16xf32>
  %wks = shard.shard %wk to %column annotate_for_users : tensor<8x16xf32>
  %wvs = shard.shard %wv to %column annotate_for_users : tensor<8x16xf32>
  %row = shard.sharding @tp split_axes = [[], [0]] : !shard.sharding
  %wos = shard.shard %wo to %row annotate_for_users : tensor<16x16xf32>
  // CHECK-NOT: shard.all_
  // CHECK: mt.reshape %{{.+}} : tensor<2x8x8xf32> -> tensor<2x8x2x4xf32>
  // CHECK: mt.reshape %{{.+}} : tensor<2x8x4xf32> -> tensor<2x8x1x4xf32>
  // CHECK: mt.rope %{{.+}} : tensor<2x8x2x4xf32>
  // CHECK: mt.attention %{{.+}} causal : (tensor<2x8x2x4xf32>, tensor<2x8x1x4xf32>, tensor<2x8x1x4xf32>) -> tensor<2x8x2x4xf32>
  // CHECK: %[[CONTEXT:.+]] = mt.reshape %{{.+}} : tensor<2x8x2x4xf32> -> tensor<2x8x8xf32>
  // CHECK: %[[PARTIAL:.+]] = mt.linear %[[CONTEXT]], %{{.+}} transpose_weight : (tensor<2x8x8xf32>, tensor<16x8xf32>) -> tensor<2x8x16xf32>
  // CHECK: %[[SUM:.+]] = shard.all_reduce %[[PARTIAL]] on @tp grid_axes = [0]
  // CHECK-NOT: shard.all_
  // CHECK: return %[[SUM]]
  %q = mt.linear %x, %wqs transpose_weight : (tensor<2x8x16xf32>, tensor<16x16xf32>) -> tensor<2x8x16xf32>
  %k = mt.linear %x, %wks transpose_weight : (tensor<2x8x16xf32>, tensor<8x16xf32>) -> tensor<2x8x8xf32>
  %v = mt.linear %x, %wvs transpose_weight : (tensor<2x8x16xf32>, tensor<8x16xf32>) -> tensor<2x8x8xf32>
  %qh = mt.reshape %q : tensor<2x8x16xf32> -> tensor<2x8x4x4xf32>
  %kh = mt.reshape %k : tensor<2x8x8xf32> -> tensor<2x8x2x4xf32>
  %vh = mt.reshape %v : tensor<2x8x8xf32> -> tensor<2x8x2x4xf32>
  %qr = mt.rope %qh base = 1.000000e+04 : tensor<2x8x4x4xf32>
  %kr = mt.rope %kh base = 1.000000e+04 : tensor<2x8x2x4xf32>
  %o = mt.attention %qr, %kr, %vh causal : (tensor<2x8x4x4xf32>, tensor<2x8x2x4xf32>, tensor<2x8x2x4xf32>) -> tensor<2x8x4x4xf32>
  %of = mt.reshape %o : tensor<2x8x4x4xf32> -> tensor<2x8x16xf32>
  %y = mt.linear %of, %wos transpose_weight : (tensor<2x8x16xf32>, tensor<16x16xf32>) -> tensor<2x8x16xf32>
  %replicated = shard.sharding @tp split_axes = [[]] : !shard.sharding
  %yr = shard.shard %y to %replicated : tensor<2x8x16xf32>
  return %yr : tensor<2x8x16xf32>
}

// -----

// Llama's MLP: gate and up projections column-parallel, SwiGLU local, the
// down projection row-parallel.

shard.grid @tp(shape = 2)

// CHECK-LABEL: func.func @swiglu_mlp
func.func @swiglu_mlp(%x: tensor<2x8x16xf32>, %wg: tensor<32x16xf32>, %wu: tensor<32x16xf32>, %wd: tensor<16x32xf32>) -> tensor<2x8x16xf32> {
  %column = shard.sharding @tp split_axes = [[0]] : !shard.sharding
  %wgs = shard.shard %wg to %column annotate_for_users : tensor<32x16xf32>
  %wus = shard.shard %wu to %column annotate_for_users : tensor<32x16xf32>
  %row = shard.sharding @tp split_axes = [[], [0]] : !shard.sharding
  %wds = shard.shard %wd to %row annotate_for_users : tensor<16x32xf32>
  // CHECK: mt.swiglu %{{.+}}, %{{.+}} : tensor<2x8x16xf32>
  // CHECK: shard.all_reduce
  // CHECK-NOT: shard.all_
  %g = mt.linear %x, %wgs transpose_weight : (tensor<2x8x16xf32>, tensor<32x16xf32>) -> tensor<2x8x32xf32>
  %u = mt.linear %x, %wus transpose_weight : (tensor<2x8x16xf32>, tensor<32x16xf32>) -> tensor<2x8x32xf32>
  %h = mt.swiglu %g, %u : tensor<2x8x32xf32>
  %y = mt.linear %h, %wds transpose_weight : (tensor<2x8x32xf32>, tensor<16x32xf32>) -> tensor<2x8x16xf32>
  %replicated = shard.sharding @tp split_axes = [[]] : !shard.sharding
  %yr = shard.shard %y to %replicated : tensor<2x8x16xf32>
  return %yr : tensor<2x8x16xf32>
}

// -----

// Data parallelism: a norm and the residual add on batch shards run locally.

shard.grid @dp(shape = 2)

// CHECK-LABEL: func.func @batch_shards
func.func @batch_shards(%x: tensor<4x8x16xf32>, %w: tensor<16xf32>, %b: tensor<16xf32>) -> tensor<4x8x16xf32> {
  %batch = shard.sharding @dp split_axes = [[0]] : !shard.sharding
  %xs = shard.shard %x to %batch annotate_for_users : tensor<4x8x16xf32>
  // CHECK: mt.layer_norm %{{.+}}, %{{.+}}, %{{.+}} epsilon = 1.000000e-05 : (tensor<2x8x16xf32>, tensor<16xf32>, tensor<16xf32>) -> tensor<2x8x16xf32>
  %y = mt.layer_norm %xs, %w, %b epsilon = 1.000000e-05 : (tensor<4x8x16xf32>, tensor<16xf32>, tensor<16xf32>) -> tensor<4x8x16xf32>
  // CHECK: mt.add %{{.+}}, %{{.+}} : tensor<2x8x16xf32>
  // CHECK-NOT: shard.all_
  %r = mt.add %xs, %y : tensor<4x8x16xf32>
  %rs = shard.shard %r to %batch : tensor<4x8x16xf32>
  return %rs : tensor<4x8x16xf32>
}

// -----

// A norm needs its whole normalized dimension on each rank.

shard.grid @tp(shape = 2)

func.func @norm_on_hidden_shards(%x: tensor<4x16xf32>, %w: tensor<16xf32>) -> tensor<4x16xf32> {
  %hidden = shard.sharding @tp split_axes = [[], [0]] : !shard.sharding
  %xs = shard.shard %x to %hidden annotate_for_users : tensor<4x16xf32>
  // expected-error @+1 {{'mt.rms_norm' op cannot be partitioned along its normalized (last) dimension; shard another dimension, or gather it first}}
  %y = mt.rms_norm %xs, %w epsilon = 1.000000e-05 : (tensor<4x16xf32>, tensor<16xf32>) -> tensor<4x16xf32>
  %ys = shard.shard %y to %hidden : tensor<4x16xf32>
  return %ys : tensor<4x16xf32>
}

// -----

// The attention core needs whole sequences on each rank.

shard.grid @sp(shape = 2)

func.func @attention_on_sequence_shards(%q: tensor<2x8x4x4xf32>) -> tensor<2x8x4x4xf32> {
  %sequence = shard.sharding @sp split_axes = [[], [0]] : !shard.sharding
  %qs = shard.shard %q to %sequence annotate_for_users : tensor<2x8x4x4xf32>
  // expected-error @+1 {{'mt.attention' op can be partitioned along batch and heads only; dimension 1 is sharded}}
  %o = mt.attention %qs, %qs, %qs causal : (tensor<2x8x4x4xf32>, tensor<2x8x4x4xf32>, tensor<2x8x4x4xf32>) -> tensor<2x8x4x4xf32>
  %os = shard.shard %o to %sequence : tensor<2x8x4x4xf32>
  return %os : tensor<2x8x4x4xf32>
}

// -----

// Rotary positions come from the sequence index: rope needs whole sequences.

shard.grid @sp(shape = 2)

func.func @rope_on_sequence_shards(%x: tensor<2x8x4x4xf32>) -> tensor<2x8x4x4xf32> {
  %sequence = shard.sharding @sp split_axes = [[], [0]] : !shard.sharding
  %xs = shard.shard %x to %sequence annotate_for_users : tensor<2x8x4x4xf32>
  // expected-error @+1 {{'mt.rope' op can be partitioned along batch and heads only; dimension 1 is sharded}}
  %r = mt.rope %xs base = 1.000000e+04 : tensor<2x8x4x4xf32>
  %rs = shard.shard %r to %sequence : tensor<2x8x4x4xf32>
  return %rs : tensor<2x8x4x4xf32>
}

// -----

// A split along its axis would cut [q | k | v] at other places than the
// global split does: refused.

shard.grid @tp(shape = 2)

func.func @split_along_its_axis(%x: tensor<2x12xf32>) -> tensor<2x4xf32> {
  %columns = shard.sharding @tp split_axes = [[], [0]] : !shard.sharding
  %xs = shard.shard %x to %columns annotate_for_users : tensor<2x12xf32>
  // expected-error @+1 {{'mt.split' op cannot be partitioned along the split axis yet (docs/Parallelism.md)}}
  %q, %k, %v = mt.split %xs axis = 1 : tensor<2x12xf32> -> tensor<2x4xf32>, tensor<2x4xf32>, tensor<2x4xf32>
  return %q : tensor<2x4xf32>
}
