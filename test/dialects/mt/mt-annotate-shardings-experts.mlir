// RUN: megatron-opt %s '-mt-annotate-shardings=data-parallel-size=2 expert-parallel-size=2' | FileCheck %s
// RUN: not megatron-opt %s '-mt-annotate-shardings=data-parallel-size=3 expert-parallel-size=3' 2>&1 | FileCheck %s --check-prefix=DIVIDE

// Expert parallelism (docs/MoE.md): the routed experts ([E, ...], named
// .mlp.experts.) split by experts over the data axis, parameter and
// gradient alike; the router and the dense weights as without it.

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
