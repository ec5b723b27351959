// RUN: megatron-opt %s -split-input-file -verify-diagnostics \
// RUN:   --pass-pipeline='builtin.module(func.func(sharding-propagation,shard-partition))' | FileCheck %s

// Expert parallelism (docs/MoE.md, "Expert parallelism"): a grouped linear
// layer whose experts are split over the axis that splits the tokens (4
// experts over 2 ranks, 8 tokens top-2) becomes the all-to-all dispatch:
// the routing sent first, the rank's rows in one block per destination,
// sorted by the rank's experts, its experts' GEMMs, and the results back.

shard.grid @grid(shape = 2)

// CHECK-LABEL: func.func @grouped_linear
// CHECK-SAME: %[[ROWS:.+]]: tensor<8x6xf32>, %[[W:.+]]: tensor<2x6x5xf32>, %[[I:.+]]: tensor<4x2xi32>
func.func @grouped_linear(%rows: tensor<16x6xf32>, %w: tensor<4x6x5xf32>, %i: tensor<8x2xi32>) -> tensor<16x5xf32> {
  %tokens = shard.sharding @grid split_axes = [[0]] : !shard.sharding
  %experts = shard.sharding @grid split_axes = [[0]] : !shard.sharding
  %rs = shard.shard %rows to %tokens annotate_for_users : tensor<16x6xf32>
  %ws = shard.shard %w to %experts annotate_for_users : tensor<4x6x5xf32>
  %is = shard.shard %i to %tokens annotate_for_users : tensor<8x2xi32>
  // CHECK: %[[E:.+]] = mt.moe_dispatch_experts %[[I]] num_experts = 4 expert_ranks = 2 : (tensor<4x2xi32>) -> tensor<16x1xi32>
  // CHECK: %[[ROUTING:.+]] = shard.all_to_all %[[E]] on @grid grid_axes = [0] split_axis = 0 concat_axis = 0 : tensor<16x1xi32> -> tensor<16x1xi32>
  // CHECK: %[[SEND:.+]] = mt.moe_dispatch_rows %[[ROWS]], %[[I]] num_experts = 4 expert_ranks = 2 : (tensor<8x6xf32>, tensor<4x2xi32>) -> tensor<16x6xf32>
  // CHECK: %[[RECV:.+]] = shard.all_to_all %[[SEND]]
  // CHECK: %[[SORTED:.+]] = mt.moe_permute %[[RECV]], %[[ROUTING]] : (tensor<16x6xf32>, tensor<16x1xi32>) -> tensor<16x6xf32>
  // CHECK: %[[OUT:.+]] = mt.moe_grouped_linear %[[SORTED]], %[[W]], %[[ROUTING]] : (tensor<16x6xf32>, tensor<2x6x5xf32>, tensor<16x1xi32>) -> tensor<16x5xf32>
  // CHECK: %[[BACK:.+]] = mt.moe_unpermute %[[OUT]], %[[ROUTING]]
  // CHECK: %[[HOME:.+]] = shard.all_to_all %[[BACK]]
  // CHECK: %[[Y:.+]] = mt.moe_combine_rows %[[HOME]], %[[I]] num_experts = 4 expert_ranks = 2 : (tensor<16x5xf32>, tensor<4x2xi32>) -> tensor<8x5xf32>
  // CHECK: return %[[Y]]
  %y = mt.moe_grouped_linear %rs, %ws, %is : (tensor<16x6xf32>, tensor<4x6x5xf32>, tensor<8x2xi32>) -> tensor<16x5xf32>
  %ys = shard.shard %y to %tokens : tensor<16x5xf32>
  return %ys : tensor<16x5xf32>
}

// -----

// The weight gradient of split experts: both operands dispatched, the
// rank's experts' gradient made from every rank's rows, no all-reduce.

shard.grid @grid(shape = 2)

// CHECK-LABEL: func.func @weight_grad
func.func @weight_grad(%x: tensor<16x6xf32>, %dy: tensor<16x5xf32>, %i: tensor<8x2xi32>) -> tensor<4x6x5xf32> {
  %tokens = shard.sharding @grid split_axes = [[0]] : !shard.sharding
  %xs = shard.shard %x to %tokens annotate_for_users : tensor<16x6xf32>
  %dys = shard.shard %dy to %tokens annotate_for_users : tensor<16x5xf32>
  %is = shard.shard %i to %tokens annotate_for_users : tensor<8x2xi32>
  // CHECK-COUNT-3: shard.all_to_all
  // CHECK: mt.moe_grouped_linear_weight_grad %{{.+}}, %{{.+}}, %{{.+}} : (tensor<16x6xf32>, tensor<16x5xf32>, tensor<16x1xi32>) -> tensor<2x6x5xf32>
  // CHECK-NOT: shard.all_reduce
  // CHECK: return
  %dw = mt.moe_grouped_linear_weight_grad %xs, %dys, %is : (tensor<16x6xf32>, tensor<16x5xf32>, tensor<8x2xi32>) -> tensor<4x6x5xf32>
  %experts = shard.sharding @grid split_axes = [[0]] : !shard.sharding
  %dws = shard.shard %dw to %experts : tensor<4x6x5xf32>
  return %dws : tensor<4x6x5xf32>
}

// -----

// Experts split over another axis than the tokens: refused.

shard.grid @grid(shape = 2x2)

func.func @other_axis(%rows: tensor<16x6xf32>, %w: tensor<4x6x5xf32>, %i: tensor<8x2xi32>) -> tensor<16x5xf32> {
  %tokens = shard.sharding @grid split_axes = [[0]] : !shard.sharding
  %experts = shard.sharding @grid split_axes = [[1]] : !shard.sharding
  %rs = shard.shard %rows to %tokens annotate_for_users : tensor<16x6xf32>
  %ws = shard.shard %w to %experts annotate_for_users : tensor<4x6x5xf32>
  %is = shard.shard %i to %tokens annotate_for_users : tensor<8x2xi32>
  // expected-error @+1 {{'mt.moe_grouped_linear' op splits the experts over grid axes [1] but the tokens over [0]; expert parallelism dispatches each rank's tokens over the axes that split the experts, which must split the tokens too}}
  %y = mt.moe_grouped_linear %rs, %ws, %is : (tensor<16x6xf32>, tensor<4x6x5xf32>, tensor<8x2xi32>) -> tensor<16x5xf32>
  %ys = shard.shard %y to %tokens : tensor<16x5xf32>
  return %ys : tensor<16x5xf32>
}
