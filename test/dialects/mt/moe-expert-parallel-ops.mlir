// RUN: megatron-opt %s | megatron-opt | FileCheck %s
// RUN: megatron-opt %s --mlir-print-op-generic | megatron-opt | FileCheck %s

// Round trip of expert parallelism's dispatch ops (docs/MoE.md, "Expert
// parallelism"): 6 tokens, top-2, 4 experts over 2 ranks, hidden 8, and the
// all-to-all that exchanges their blocks.

shard.grid @grid(shape = 2)

// CHECK-LABEL: func.func @dispatch
func.func @dispatch(%rows: tensor<12x8xf32>, %indices: tensor<6x2xi32>) -> tensor<12x8xf32> {
  // CHECK: mt.moe_dispatch_experts %{{.+}} num_experts = 4 expert_ranks = 2 : (tensor<6x2xi32>) -> tensor<24x1xi32>
  %experts = mt.moe_dispatch_experts %indices num_experts = 4 expert_ranks = 2 : (tensor<6x2xi32>) -> tensor<24x1xi32>
  // CHECK: mt.moe_dispatch_rows %{{.+}}, %{{.+}} num_experts = 4 expert_ranks = 2 : (tensor<12x8xf32>, tensor<6x2xi32>) -> tensor<24x8xf32>
  %blocks = mt.moe_dispatch_rows %rows, %indices num_experts = 4 expert_ranks = 2 : (tensor<12x8xf32>, tensor<6x2xi32>) -> tensor<24x8xf32>
  %received = shard.all_to_all %blocks on @grid grid_axes = [0] split_axis = 0 concat_axis = 0 : tensor<24x8xf32> -> tensor<24x8xf32>
  %routing = shard.all_to_all %experts on @grid grid_axes = [0] split_axis = 0 concat_axis = 0 : tensor<24x1xi32> -> tensor<24x1xi32>
  %sorted = mt.moe_permute %received, %routing : (tensor<24x8xf32>, tensor<24x1xi32>) -> tensor<24x8xf32>
  %back = mt.moe_unpermute %sorted, %routing : (tensor<24x8xf32>, tensor<24x1xi32>) -> tensor<24x8xf32>
  // CHECK: mt.moe_combine_rows %{{.+}}, %{{.+}} num_experts = 4 expert_ranks = 2 : (tensor<24x8xf32>, tensor<6x2xi32>) -> tensor<12x8xf32>
  %combined = mt.moe_combine_rows %back, %indices num_experts = 4 expert_ranks = 2 : (tensor<24x8xf32>, tensor<6x2xi32>) -> tensor<12x8xf32>
  return %combined : tensor<12x8xf32>
}
