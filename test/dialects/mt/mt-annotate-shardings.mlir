// RUN: megatron-opt %s -split-input-file -verify-diagnostics \
// RUN:   '-mt-annotate-shardings=tensor-parallel-size=2 data-parallel-size=4' | FileCheck %s

// Megatron-LM's layout on a step's arguments: a dp x tp grid, column-parallel
// weights split on their output dimension, row-parallel weights on their
// input dimension, norms and row-parallel biases replicated, batches split
// over the data-parallel axis, gradients sharded as their parameters.

// CHECK: shard.grid @grid(shape = 4x2)
// CHECK-LABEL: func.func @train_step
func.func @train_step(%tokens: tensor<8x16xi32>,
                      %q: tensor<32x16xf32> {mt.parameter = @model.layers.0.self_attn.q_proj.weight},
                      %o: tensor<16x32xf32> {mt.parameter = @model.layers.0.self_attn.o_proj.weight},
                      %fc: tensor<16x64xf32> {mt.parameter = @transformer.h.0.mlp.c_fc.weight},
                      %fcb: tensor<64xf32> {mt.parameter = @transformer.h.0.mlp.c_fc.bias},
                      %proj: tensor<64x16xf32> {mt.parameter = @transformer.h.0.mlp.c_proj.weight},
                      %projb: tensor<16xf32> {mt.parameter = @transformer.h.0.mlp.c_proj.bias},
                      %norm: tensor<16xf32> {mt.parameter = @model.norm.weight})
    -> (tensor<32x16xf32> {mt.gradient = @model.layers.0.self_attn.q_proj.weight}) {
  // CHECK: shard.sharding @grid split_axes = {{\[\[}}0], []]
  // CHECK: shard.sharding @grid split_axes = {{\[\[}}1], []]
  // CHECK: shard.sharding @grid split_axes = {{\[\[}}], [1]]
  // CHECK: shard.sharding @grid split_axes = {{\[\[}}], [1]]
  // CHECK: shard.sharding @grid split_axes = {{\[\[}}1]]
  // CHECK: shard.sharding @grid split_axes = {{\[\[}}1], []]
  // CHECK: shard.sharding @grid split_axes = {{\[\[}}]]
  // CHECK: shard.sharding @grid split_axes = {{\[\[}}]]
  // CHECK: %[[S:.+]] = shard.sharding @grid split_axes = {{\[\[}}1], []]
  // CHECK: %[[G:.+]] = shard.shard %{{.+}} to %[[S]] : tensor<32x16xf32>
  // CHECK: return %[[G]]
  return %q : tensor<32x16xf32>
}

// -----

// GPT-2's fused c_attn is stored per query group (docs/Parallelism.md), so it
// is column-parallel like q/k/v_proj: weight and bias split on the output.

// CHECK-LABEL: func.func @fused_qkv
func.func @fused_qkv(%w: tensor<16x48xf32> {mt.parameter = @transformer.h.0.attn.c_attn.weight},
                     %b: tensor<48xf32> {mt.parameter = @transformer.h.0.attn.c_attn.bias}) {
  // CHECK: shard.sharding @grid split_axes = {{\[\[}}], [1]]
  // CHECK: shard.sharding @grid split_axes = {{\[\[}}1]]
  return
}

// -----

// expected-error @+1 {{mt-annotate-shardings: dimension 0 of model.layers.0.mlp.up_proj.weight (5) is not divisible by tensor-parallel-size 2}}
func.func @indivisible(%w: tensor<5x16xf32> {mt.parameter = @model.layers.0.mlp.up_proj.weight}) {
  return
}

// -----

// Vocabulary tables are split by rows (vocabulary-parallel embedding and
// output layer); a vocabulary the tensor-parallel ranks cannot share equally
// is refused with the fix.

// CHECK-LABEL: func.func @vocabulary
func.func @vocabulary(%wte: tensor<32x16xf32> {mt.parameter = @transformer.wte.weight},
                      %head: tensor<32x16xf32> {mt.parameter = @lm_head.weight}) {
  // CHECK: shard.sharding @grid split_axes = {{\[\[}}1], []]
  // CHECK: shard.sharding @grid split_axes = {{\[\[}}1], []]
  return
}

// -----

// expected-error @+1 {{mt-annotate-shardings: the vocabulary of model.embed_tokens.weight (31 rows) is not divisible by tensor-parallel-size 2: each rank holds an equal block of the vocabulary; pad it as Megatron-LM does (megatron-compile --make-vocab-size-divisible-by, which pads to a multiple of it times the tensor-parallel size)}}
func.func @vocabulary_indivisible(%w: tensor<31x16xf32> {mt.parameter = @model.embed_tokens.weight}) {
  return
}
