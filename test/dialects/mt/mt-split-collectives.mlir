// RUN: megatron-opt %s -mt-split-collectives | FileCheck %s

// Each all-reduce, all-gather and reduce-scatter becomes a start holding it
// and a wait right after it; all_slice (no communication) stays.

shard.grid @grid(shape = 2x2)

// CHECK-LABEL: func.func @each_kind
func.func @each_kind(%x: tensor<4x8xf32>) -> (tensor<4x8xf32>, tensor<4x16xf32>, tensor<4x4xf32>, tensor<4x4xf32>) {
  // CHECK: %[[F0:.+]] = mt.collective_start %[[X:.+]] : tensor<4x8xf32> -> !mt.future<tensor<4x8xf32>>
  // CHECK: shard.all_reduce %{{.+}} on @grid grid_axes = [1] {mt.layer_note} :
  // CHECK: %[[R:.+]] = mt.collective_wait %[[F0]]
  // CHECK-NEXT: %[[F1:.+]] = mt.collective_start %[[R]] : tensor<4x8xf32> -> !mt.future<tensor<4x16xf32>>
  // CHECK: shard.all_gather
  // CHECK: %[[G:.+]] = mt.collective_wait %[[F1]]
  // CHECK-NEXT: %[[F2:.+]] = mt.collective_start %[[X]] : tensor<4x8xf32> -> !mt.future<tensor<4x4xf32>>
  // CHECK: shard.reduce_scatter
  // CHECK: %[[S:.+]] = mt.collective_wait %[[F2]]
  // CHECK-NEXT: %[[L:.+]] = shard.all_slice %[[X]]
  // CHECK-NEXT: return %[[R]], %[[G]], %[[S]], %[[L]]
  %r = shard.all_reduce %x on @grid grid_axes = [1] {mt.layer_note} : tensor<4x8xf32> -> tensor<4x8xf32>
  %g = shard.all_gather %r on @grid grid_axes = [1] gather_axis = 1 : tensor<4x8xf32> -> tensor<4x16xf32>
  %s = shard.reduce_scatter %x on @grid grid_axes = [0] scatter_axis = 1 : tensor<4x8xf32> -> tensor<4x4xf32>
  %l = shard.all_slice %x on @grid grid_axes = [0] slice_axis = 1 : tensor<4x8xf32> -> tensor<4x4xf32>
  return %r, %g, %s, %l : tensor<4x8xf32>, tensor<4x16xf32>, tensor<4x4xf32>, tensor<4x4xf32>
}
