// RUN: megatron-opt %s -split-input-file '-mt-plan-gradient-reduction=context-axis=1' | FileCheck %s
// RUN: megatron-opt %s -split-input-file \
// RUN:   '-mt-plan-gradient-reduction=distributed-optimizer=true context-axis=1' \
// RUN:   | FileCheck %s --check-prefix=DIST

// Context parallelism (a grid dp x cp x tp, 2 x 2 x 2): a weight gradient
// sums the rows of every data and context rank, so the step's all-reduces
// over both axes leave it (one over [0, 1, 2] keeps its tensor part), and
// the buffer is reduced over the data x context group, [0, 1]
// (Megatron-LM's intra_dp_cp group); the distributed optimizer shards it
// over those 4 ranks: 12 elements padded to lcm(4, 128) = 128, 32 a rank.

shard.grid @grid(shape = 2x2x2)
mt.parameter @a : tensor<4xf32> init = zeros
mt.parameter @b : tensor<2x4xf32> init = zeros

// CHECK-LABEL: func.func @train_step
// CHECK-SAME: %[[DA:[a-z0-9]+]]: tensor<4xf32>, %[[DB:[a-z0-9]+]]: tensor<2x4xf32>
// CHECK-NEXT: %[[L:.+]] = shard.all_reduce %{{.+}} on @grid grid_axes = [1] : tensor<f32>
// CHECK-NEXT: %[[T:.+]] = shard.all_reduce %[[DB]] on @grid grid_axes = [2]
// CHECK-NEXT: return %[[L]], %[[DA]], %[[T]]
func.func @train_step(%loss: tensor<f32>, %da: tensor<4xf32>, %db: tensor<2x4xf32>)
    -> (tensor<f32>, tensor<4xf32> {mt.gradient = @a},
        tensor<2x4xf32> {mt.gradient = @b}) {
  %l = shard.all_reduce %loss on @grid grid_axes = [1] : tensor<f32> -> tensor<f32>
  %ra = shard.all_reduce %da on @grid grid_axes = [0, 1] : tensor<4xf32> -> tensor<4xf32>
  %rb = shard.all_reduce %db on @grid grid_axes = [0, 1, 2] : tensor<2x4xf32> -> tensor<2x4xf32>
  return %l, %ra, %rb : tensor<f32>, tensor<4xf32>, tensor<2x4xf32>
}
// CHECK-LABEL: func.func @reduce_gradients
// CHECK-SAME: (%[[BUF:.+]]: tensor<12xf32>) -> tensor<12xf32>
// CHECK-NEXT: %[[R:.+]] = shard.all_reduce %[[BUF]] on @grid grid_axes = [0, 1] : tensor<12xf32> -> tensor<12xf32>

// DIST-LABEL: func.func @reduce_gradients
// DIST-SAME: (%[[BUF:.+]]: tensor<128xf32>) -> tensor<32xf32>
// DIST-NEXT: shard.reduce_scatter %[[BUF]] on @grid grid_axes = [0, 1] scatter_axis = 0 : tensor<128xf32> -> tensor<32xf32>
// DIST-LABEL: func.func @gather_parameters
// DIST-SAME: (%[[SHARD:.+]]: tensor<32xf32>) -> tensor<128xf32>
// DIST-NEXT: shard.all_gather %[[SHARD]] on @grid grid_axes = [0, 1] gather_axis = 0 : tensor<32xf32> -> tensor<128xf32>

// -----

// One data rank (2 context ranks): partitioning names no axis of one rank,
// so the buffer is reduced over the context axis alone; the distributed
// optimizer shards it over the 2 context ranks.

shard.grid @grid(shape = 1x2x1)
mt.parameter @a : tensor<4xf32> init = zeros

// CHECK-LABEL: func.func @train_step
// CHECK-SAME: %[[DA:[a-z0-9]+]]: tensor<4xf32>
// CHECK-NEXT: return %[[DA]]
func.func @train_step(%da: tensor<4xf32>) -> (tensor<4xf32> {mt.gradient = @a}) {
  %ra = shard.all_reduce %da on @grid grid_axes = [1] : tensor<4xf32> -> tensor<4xf32>
  return %ra : tensor<4xf32>
}
// CHECK-LABEL: func.func @reduce_gradients
// CHECK-NEXT: shard.all_reduce %{{.+}} on @grid grid_axes = [1] : tensor<4xf32> -> tensor<4xf32>

// DIST-LABEL: func.func @reduce_gradients
// DIST-SAME: (%[[BUF:.+]]: tensor<128xf32>) -> tensor<64xf32>
// DIST-NEXT: shard.reduce_scatter %[[BUF]] on @grid grid_axes = [1] scatter_axis = 0
