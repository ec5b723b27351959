// RUN: megatron-opt %s -split-input-file -mt-plan-gradient-reduction | FileCheck %s
// RUN: megatron-opt %s -split-input-file \
// RUN:   '-mt-plan-gradient-reduction=distributed-optimizer=true' \
// RUN:   | FileCheck %s --check-prefix=DIST

// Data parallelism 2: the data-axis all-reduces leave the step (which runs
// once per micro-batch), an all-reduce over both axes keeps its
// tensor-parallel part, and @reduce_gradients all-reduces the buffer once,
// the gradients in reverse declaration order (Megatron-LM's). With the
// distributed optimizer the buffer (4 + 8 = 12 elements) is padded to
// lcm(2, 128) = 128, reduce-scattered to 64 per rank, and the parameters
// all-gathered by @gather_parameters.

shard.grid @grid(shape = 2x2)
mt.parameter @a : tensor<4xf32> init = zeros
mt.parameter @b : tensor<2x4xf32> init = zeros

// CHECK-LABEL: func.func @train_step
// CHECK-SAME: %[[DA:[a-z0-9]+]]: tensor<4xf32>, %[[DB:[a-z0-9]+]]: tensor<2x4xf32>
// CHECK-NEXT: %[[L:.+]] = shard.all_reduce %{{.+}} on @grid grid_axes = [0] : tensor<f32>
// CHECK-NEXT: %[[T:.+]] = shard.all_reduce %[[DB]] on @grid grid_axes = [1]
// CHECK-NEXT: return %[[L]], %[[DA]], %[[T]]
func.func @train_step(%loss: tensor<f32>, %da: tensor<4xf32>, %db: tensor<2x4xf32>)
    -> (tensor<f32>, tensor<4xf32> {mt.gradient = @a},
        tensor<2x4xf32> {mt.gradient = @b}) {
  %l = shard.all_reduce %loss on @grid grid_axes = [0] : tensor<f32> -> tensor<f32>
  %ra = shard.all_reduce %da on @grid grid_axes = [0] : tensor<4xf32> -> tensor<4xf32>
  %rb = shard.all_reduce %db on @grid grid_axes = [0, 1] : tensor<2x4xf32> -> tensor<2x4xf32>
  return %l, %ra, %rb : tensor<f32>, tensor<4xf32>, tensor<2x4xf32>
}
// CHECK-LABEL: func.func @reduce_gradients
// CHECK-SAME: (%[[BUF:.+]]: tensor<12xf32>) -> tensor<12xf32>
// CHECK-SAME: mt.buffer_offsets = array<i64: 0, 8>, mt.gradient_buffer = [@b, @a]
// CHECK-NEXT: %[[R:.+]] = shard.all_reduce %[[BUF]] on @grid grid_axes = [0] : tensor<12xf32> -> tensor<12xf32>
// CHECK-NEXT: return %[[R]]
// CHECK-NOT: gather_parameters

// DIST-LABEL: func.func @reduce_gradients
// DIST-SAME: (%[[BUF:.+]]: tensor<128xf32>) -> tensor<64xf32>
// DIST-SAME: mt.gradient_buffer = [@b, @a]
// DIST-NEXT: shard.reduce_scatter %[[BUF]] on @grid grid_axes = [0] scatter_axis = 0 : tensor<128xf32> -> tensor<64xf32>
// DIST-LABEL: func.func @gather_parameters
// DIST-SAME: (%[[SHARD:.+]]: tensor<64xf32>) -> tensor<128xf32>
// DIST-SAME: mt.buffer_offsets = array<i64: 0, 8>, mt.parameter_buffer = [@b, @a]
// DIST-NEXT: shard.all_gather %[[SHARD]] on @grid grid_axes = [0] gather_axis = 0 : tensor<64xf32> -> tensor<128xf32>

// -----

// One data rank: nothing to reduce; the distributed optimizer still shards
// its state over a group of one (Megatron-LM allows it).

shard.grid @grid(shape = 1x2)
mt.parameter @a : tensor<4xf32> init = zeros

// CHECK-LABEL: func.func @train_step
// CHECK-NOT: func.func @reduce_gradients
// DIST-LABEL: func.func @reduce_gradients
// DIST-SAME: (%{{.+}}: tensor<128xf32>) -> tensor<128xf32>
// DIST: shard.reduce_scatter
func.func @train_step(%da: tensor<4xf32>) -> (tensor<4xf32> {mt.gradient = @a}) {
  return %da : tensor<4xf32>
}
