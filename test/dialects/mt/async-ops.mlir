// RUN: megatron-opt %s | megatron-opt | FileCheck %s

// A collective split into a start and a wait prints and parses back.

shard.grid @grid(shape = 2x2)

// CHECK-LABEL: func.func @split
func.func @split(%x: tensor<4x8xf32>) -> tensor<4x16xf32> {
  // CHECK: %[[F:.+]] = mt.collective_start %{{.+}} : tensor<4x8xf32> -> !mt.future<tensor<4x16xf32>> {
  // CHECK-NEXT: ^bb0(%[[A:.+]]: tensor<4x8xf32>):
  // CHECK-NEXT: %[[G:.+]] = shard.all_gather %[[A]] on @grid grid_axes = [1] gather_axis = 1
  // CHECK-NEXT: mt.yield %[[G]] : tensor<4x16xf32>
  // CHECK: mt.collective_wait %[[F]] : !mt.future<tensor<4x16xf32>>
  %f = mt.collective_start %x : tensor<4x8xf32> -> !mt.future<tensor<4x16xf32>> {
  ^bb0(%a: tensor<4x8xf32>):
    %g = shard.all_gather %a on @grid grid_axes = [1] gather_axis = 1 : tensor<4x8xf32> -> tensor<4x16xf32>
    mt.yield %g : tensor<4x16xf32>
  }
  %y = mt.collective_wait %f : !mt.future<tensor<4x16xf32>>
  return %y : tensor<4x16xf32>
}
