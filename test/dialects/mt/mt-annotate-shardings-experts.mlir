// RUN: megatron-opt %s '-mt-annotate-shardings=data-parallel-size=2 expert-parallel-size=2' | FileCheck %s
// RUN: not megatron-opt %s '-mt-annotate-shardings=data-parallel-size=3 expert-parallel-size=3' 2>&1 | FileCheck %s --check-prefix=DIVIDE
// RUN: megatron-opt %s '-mt-annotate-shardings=data-parallel-size=4 expert-parallel-size=2' | FileCheck %s --check-prefix=EDP

// Expert parallelism (docs/MoE.md): the routed experts ([E, ...], named
// .mlp.experts.) split by experts over the data axis, parameter and
// gradient alike; the router and the dense weights as without it.

// Over part of the data-parallel ranks (EP2 of DP4): the grid
// expert-data x expert x tensor, marked with its expert axis; the tokens
// split over both first axes, the experts over the expert axis only.
// EDP: shard.grid @grid(shape = 2x2x1) {mt.expert_axis = 1 : i64}
// EDP: shard.sharding @grid split_axes = {{\[\[}}0, 1], []]
// EDP: shard.sharding @grid split_axes = {{\[\[}}], []]
// EDP: shard.sharding @grid split_axes = {{\[\[}}1], [], []]
// EDP: shard.sharding @grid split_axes = {{\[\[}}1], [], []]

// DIVIDE: error: mt-annotate-shardings: the 4 experts of model.layers.0.mlp.experts.up_proj.weight are not divisible by expert-parallel-size 3

// CHECK-LABEL: func.func @train_step
func.func @train_step(%tokens: tensor<4x16xi32>,
                      %router: tensor<4x32xf32> {mt.parameter = @model.layers.0.mlp.gate.weight},
                      %up: tensor<4x48x32xf32> {mt.parameter = @model.layers.0.mlp.experts.up_proj.weight})
    -> (tensor<4x48x32xf32> {mt.gradient = @model.layers.0.mlp.experts.up_proj.weight}) {
  // CHECK: shard.sharding @grid split_axes = {{\[\[}}0], []]
  // CHECK: shard.sharding @grid split_axes = {{\[\[}}], []]
  // CHECK: shard.sharding @grid split_axes = {{\[\[}}0], [], []]
  // CHECK: shard.sharding @grid split_axes = {{\[\[}}0], [], []]
  // CHECK-NEXT: shard.shard %{{.+}} to %{{.+}} : tensor<4x48x32xf32>
  // CHECK-NEXT: return
  return %up : tensor<4x48x32xf32>
}
