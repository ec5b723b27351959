// RUN: megatron-opt %s -split-input-file -verify-diagnostics \
// RUN:   '-mt-annotate-shardings=tensor-parallel-size=2 data-parallel-size=2 context-parallel-size=2 sequence-parallel=true' \
// RUN:   | FileCheck %s
// RUN: not megatron-opt %s -split-input-file '-mt-annotate-shardings=context-parallel-size=0' 2>&1 \
// RUN:   | FileCheck %s --check-prefix=SIZE
// RUN: megatron-opt %s -split-input-file \
// RUN:   '-mt-annotate-shardings=context-parallel-size=2 cp-comm-type=all_gather' \
// RUN:   | FileCheck %s --check-prefix=GATHER

// Context parallelism (docs/Parallelism.md, "Context parallelism"): a
// dp x cp x tp grid, the tensor axis fastest; token and label batches,
// per-token results and the positions split along the sequence over the
// context axis (axis 1), and under sequence parallelism a stage's
// activations over the context axis, then the tensor axis (axis 2).
// Parameters split over the tensor axis as without it.

// SIZE: error: mt-annotate-shardings: tensor-parallel-size (1), data-parallel-size (1) and context-parallel-size (0) must be positive

// CHECK: shard.grid @grid(shape = 2x2x2)
// CHECK-LABEL: func.func @train_step
func.func @train_step(%tokens: tensor<4x16xi32>,
                      %q: tensor<32x16xf32> {mt.parameter = @model.layers.0.self_attn.q_proj.weight})
    -> tensor<4x16x32xf32> {
  // CHECK: shard.sharding @grid split_axes = {{\[\[}}0], [1]]
  // CHECK: shard.sharding @grid split_axes = {{\[\[}}2], []]
  // CHECK: %[[P:.+]] = mt.position_ids
  // CHECK: shard.sharding @grid split_axes = {{\[\[}}0], [1, 2]]
  // CHECK-NEXT: shard.shard %[[P]]
  %positions = mt.position_ids : tensor<4x16xi32>
  %logits = tensor.empty() : tensor<4x16x32xf32>
  // CHECK: shard.sharding @grid split_axes = {{\[\[}}0], [1], []]
  // CHECK: return
  return %logits : tensor<4x16x32xf32>
}

// -----

// A pipeline stage's activation under sequence parallelism: the sequence
// over the context axis, then the tensor axis.

// CHECK-LABEL: func.func @stage
func.func @stage(%x: tensor<4x16x8xf32>) -> tensor<4x16x8xf32> attributes {mt.pipeline_stage = 0 : i64} {
  // CHECK: shard.sharding @grid split_axes = {{\[\[}}0], [1, 2], []]
  return %x : tensor<4x16x8xf32>
}

// -----

// The attention ops carry the context axis and the exchange (the ring,
// Megatron-LM's default, or all_gather), which their partition reads; rope
// and dropout carry the axis (their rows' global positions).

// CHECK-LABEL: func.func @marked
// GATHER-LABEL: func.func @marked
func.func @marked(%q: tensor<1x16x2x4xf32>, %do: tensor<1x16x2x4xf32>) -> tensor<1x16x2x4xf32> {
  // CHECK: mt.rope {{.*}}{mt.context_axis = 1 : i64}
  // CHECK: mt.dropout {{.*}}{mt.context_axis = 1 : i64}
  // CHECK: mt.attention {{.*}}causal {mt.context_axis = 1 : i64, mt.cp_comm_type = "p2p"}
  // CHECK: mt.attention_grad {{.*}}causal {mt.context_axis = 1 : i64, mt.cp_comm_type = "p2p"}
  // GATHER: mt.attention {{.*}}causal {mt.context_axis = 1 : i64, mt.cp_comm_type = "all_gather"}
  %r = mt.rope %q base = 1.000000e+04 : tensor<1x16x2x4xf32>
  %d = mt.dropout %r p = 1.000000e-01 seed = 1 : tensor<1x16x2x4xf32>
  %o = mt.attention %q, %q, %q causal : (tensor<1x16x2x4xf32>, tensor<1x16x2x4xf32>, tensor<1x16x2x4xf32>) -> tensor<1x16x2x4xf32>
  %dq, %dk, %dv = mt.attention_grad %do, %q, %q, %q causal : (tensor<1x16x2x4xf32>, tensor<1x16x2x4xf32>, tensor<1x16x2x4xf32>, tensor<1x16x2x4xf32>) -> (tensor<1x16x2x4xf32>, tensor<1x16x2x4xf32>, tensor<1x16x2x4xf32>)
  return %o : tensor<1x16x2x4xf32>
}

// -----

// Causal load balancing cuts the sequence into 2 x cp chunks, each split
// over the tensor ranks under sequence parallelism: 12 tokens do not cut
// into 8 pieces.

// expected-error @+1 {{mt-annotate-shardings: the sequence length 12 is not divisible by 8 (4 load-balanced chunks of context-parallel-size 2, each split over the tensor ranks under sequence parallelism); use a sequence length that is a multiple of 8}}
func.func @indivisible(%tokens: tensor<4x12xi32>) {
  return
}
