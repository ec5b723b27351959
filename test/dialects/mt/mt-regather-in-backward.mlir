// RUN: megatron-opt %s -split-input-file -mt-regather-in-backward | FileCheck %s

// A pipeline stage's column-parallel linear under sequence parallelism: the
// forward reads the gathered input; the weight gradient reads a gather of
// the shard made again right before it, so only the shard lives from the
// forward to the backward pass. The backward pass's own gather (of the
// output's gradient) and a gather that only the forward reads stay as they
// are.

shard.grid @grid(shape = 1x2)

// CHECK-LABEL: func.func @train_step_stage1
// CHECK-SAME: (%[[X:.+]]: tensor<2x4x16xf32>, %[[DOUT:.+]]: tensor<2x4x8xf32> {mt.name = "output_gradient"}, %[[W:.+]]: tensor<8x16xf32>
// CHECK: %[[DY:.+]] = shard.all_gather %[[DOUT]] on @grid grid_axes = [1] gather_axis = 1 : tensor<2x4x8xf32> -> tensor<2x8x8xf32>
// CHECK-NOT: mt.regathered
// CHECK: %[[G:.+]] = shard.all_gather %[[X]] on @grid grid_axes = [1] gather_axis = 1 : tensor<2x4x16xf32> -> tensor<2x8x16xf32>
// CHECK-NOT: mt.regathered
// CHECK: %[[Y:.+]] = mt.linear %[[G]], %[[W]] transpose_weight
// CHECK: %[[F:.+]] = shard.all_gather %[[X]] on @grid grid_axes = [1] gather_axis = 1
// CHECK-NOT: mt.regathered
// CHECK: mt.add %[[F]], %[[F]]
// CHECK: %[[G2:.+]] = shard.all_gather %[[X]] on @grid grid_axes = [1] gather_axis = 1 {mt.regathered} : tensor<2x4x16xf32> -> tensor<2x8x16xf32>
// CHECK-NEXT: %[[DW:.+]] = mt.linear_weight_grad %[[G2]], %[[DY]] transpose_weight
// CHECK: return %[[Y]], %{{.+}}, %[[DW]]
func.func @train_step_stage1(%x: tensor<2x4x16xf32>, %dout: tensor<2x4x8xf32> {mt.name = "output_gradient"}, %w: tensor<8x16xf32> {mt.parameter = @w}) -> (tensor<2x8x8xf32>, tensor<2x8x16xf32>, tensor<8x16xf32> {mt.gradient = @w}) {
  %dy = shard.all_gather %dout on @grid grid_axes = [1] gather_axis = 1 : tensor<2x4x8xf32> -> tensor<2x8x8xf32>
  %g = shard.all_gather %x on @grid grid_axes = [1] gather_axis = 1 : tensor<2x4x16xf32> -> tensor<2x8x16xf32>
  %y = mt.linear %g, %w transpose_weight : (tensor<2x8x16xf32>, tensor<8x16xf32>) -> tensor<2x8x8xf32>
  %f = shard.all_gather %x on @grid grid_axes = [1] gather_axis = 1 : tensor<2x4x16xf32> -> tensor<2x8x16xf32>
  %sum = mt.add %f, %f : tensor<2x8x16xf32>
  %dw = mt.linear_weight_grad %g, %dy transpose_weight : (tensor<2x8x16xf32>, tensor<2x8x8xf32>) -> tensor<8x16xf32>
  return %y, %sum, %dw : tensor<2x8x8xf32>, tensor<2x8x16xf32>, tensor<8x16xf32>
}

// -----

// A whole step (no pipeline): the backward pass starts at the fill marked
// mt.loss_seed; every backward reader of the gathered input reads the one
// gather made before the first of them. (The forward's linear is returned:
// a forward op only the backward pass reads would move there too.)

shard.grid @grid(shape = 1x2)

// CHECK-LABEL: func.func @train_step
// CHECK-SAME: (%[[X:.+]]: tensor<2x4x16xf32>, %[[W:.+]]: tensor<8x16xf32>
// CHECK: %[[G:.+]] = shard.all_gather %[[X]]
// CHECK: mt.linear %[[G]], %[[W]]
// CHECK: mt.fill 1.000000e+00 {mt.loss_seed}
// CHECK: %[[G2:.+]] = shard.all_gather %[[X]] on @grid grid_axes = [1] gather_axis = 1 {mt.regathered}
// CHECK-NEXT: mt.linear_weight_grad %[[G2]]
// CHECK-NEXT: mt.linear_weight_grad %[[G2]]
// CHECK-NOT: shard.all_gather
// CHECK: return
func.func @train_step(%x: tensor<2x4x16xf32>, %w: tensor<8x16xf32> {mt.parameter = @w}) -> (tensor<f32>, tensor<2x8x8xf32>, tensor<8x16xf32> {mt.gradient = @w}) {
  %g = shard.all_gather %x on @grid grid_axes = [1] gather_axis = 1 : tensor<2x4x16xf32> -> tensor<2x8x16xf32>
  %y = mt.linear %g, %w transpose_weight : (tensor<2x8x16xf32>, tensor<8x16xf32>) -> tensor<2x8x8xf32>
  %loss = mt.fill 0.000000e+00 : tensor<f32>
  %seed = mt.fill 1.000000e+00 {mt.loss_seed} : tensor<2x8x8xf32>
  %dy = mt.mul %seed, %y : tensor<2x8x8xf32>
  %dw1 = mt.linear_weight_grad %g, %dy transpose_weight : (tensor<2x8x16xf32>, tensor<2x8x8xf32>) -> tensor<8x16xf32>
  %dw2 = mt.linear_weight_grad %g, %dy transpose_weight : (tensor<2x8x16xf32>, tensor<2x8x8xf32>) -> tensor<8x16xf32>
  %dw = mt.add %dw1, %dw2 : tensor<8x16xf32>
  return %loss, %y, %dw : tensor<f32>, tensor<2x8x8xf32>, tensor<8x16xf32>
}
