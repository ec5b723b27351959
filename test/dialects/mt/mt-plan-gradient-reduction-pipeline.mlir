// RUN: megatron-opt %s '-mt-plan-gradient-reduction=pipeline-size=2' | FileCheck %s
// RUN: megatron-opt %s \
// RUN:   '-mt-plan-gradient-reduction=pipeline-size=2 distributed-optimizer=true' \
// RUN:   | FileCheck %s --check-prefix=DIST
// RUN: megatron-opt %s -mt-plan-gradient-reduction -verify-diagnostics

// Pipeline parallelism 2 with 2 virtual stages per rank (stage k on rank
// k % 2) and data parallelism 2: every stage's data-axis all-reduces leave
// the stage (which runs once per micro-batch), the evaluation stage keeps
// its loss reduction, and each pipeline rank gets a buffer of its own,
// reduced once per iteration: its chunks in order (rank 0: stages 0 and 2,
// rank 1: stages 1 and 3), each chunk's parameters in reverse declaration
// order. Rank 0 holds w0 (4), e (32), w2 (4); rank 1 w1, o, w3: 40
// elements each, padded to lcm(2, 128) = 128 with the distributed
// optimizer and reduce-scattered to 64 per data rank. Without pipeline-size
// the pass cannot tell the stages' ranks and says so.

shard.grid @grid(shape = 2x1)
mt.parameter @e : tensor<8x4xf32> init = zeros
mt.parameter @w0 : tensor<4xf32> init = zeros
mt.parameter @w1 : tensor<4xf32> init = zeros
mt.parameter @w2 : tensor<4xf32> init = zeros
mt.parameter @w3 : tensor<4xf32> init = zeros
mt.parameter @o : tensor<4x8xf32> init = zeros

// CHECK-LABEL: func.func @train_step_stage0
// CHECK-SAME: %[[DE:[a-z0-9]+]]: tensor<8x4xf32>, %[[DW:[a-z0-9]+]]: tensor<4xf32>
// CHECK-NOT: shard.all_reduce
// CHECK: return %{{.+}}, %[[DE]], %[[DW]]
// expected-error @+1 {{the module holds pipeline stages (@train_step_stage0); give the pipeline's size with pipeline-size= (found 0, expected 1 or more) so that each stage's gradients join its pipeline rank's buffer}}
func.func @train_step_stage0(%x: tensor<4xf32>, %de: tensor<8x4xf32>, %dw: tensor<4xf32>)
    -> (tensor<4xf32>, tensor<8x4xf32> {mt.gradient = @e},
        tensor<4xf32> {mt.gradient = @w0}) attributes {mt.pipeline_stage = 0 : i64} {
  %re = shard.all_reduce %de on @grid grid_axes = [0] : tensor<8x4xf32> -> tensor<8x4xf32>
  %rw = shard.all_reduce %dw on @grid grid_axes = [0] : tensor<4xf32> -> tensor<4xf32>
  return %x, %re, %rw : tensor<4xf32>, tensor<8x4xf32>, tensor<4xf32>
}
// CHECK-LABEL: func.func @train_step_stage1
// CHECK-NOT: shard.all_reduce
// CHECK: return
func.func @train_step_stage1(%x: tensor<4xf32>, %dw: tensor<4xf32>)
    -> (tensor<4xf32>, tensor<4xf32> {mt.gradient = @w1})
    attributes {mt.pipeline_stage = 1 : i64} {
  %rw = shard.all_reduce %dw on @grid grid_axes = [0] : tensor<4xf32> -> tensor<4xf32>
  return %x, %rw : tensor<4xf32>, tensor<4xf32>
}
// CHECK-LABEL: func.func @train_step_stage2
// CHECK-NOT: shard.all_reduce
// CHECK: return
func.func @train_step_stage2(%x: tensor<4xf32>, %dw: tensor<4xf32>)
    -> (tensor<4xf32>, tensor<4xf32> {mt.gradient = @w2})
    attributes {mt.pipeline_stage = 2 : i64} {
  %rw = shard.all_reduce %dw on @grid grid_axes = [0] : tensor<4xf32> -> tensor<4xf32>
  return %x, %rw : tensor<4xf32>, tensor<4xf32>
}
// CHECK-LABEL: func.func @train_step_stage3
// CHECK-NEXT: %[[L:.+]] = shard.all_reduce %{{.+}} on @grid grid_axes = [0] : tensor<f32>
// CHECK-NEXT: return %[[L]], %{{.+}}, %{{.+}} :
func.func @train_step_stage3(%loss: tensor<f32>, %dw: tensor<4xf32>, %do: tensor<4x8xf32>)
    -> (tensor<f32>, tensor<4xf32> {mt.gradient = @w3},
        tensor<4x8xf32> {mt.gradient = @o}) attributes {mt.pipeline_stage = 3 : i64} {
  %l = shard.all_reduce %loss on @grid grid_axes = [0] : tensor<f32> -> tensor<f32>
  %rw = shard.all_reduce %dw on @grid grid_axes = [0] : tensor<4xf32> -> tensor<4xf32>
  %ro = shard.all_reduce %do on @grid grid_axes = [0] : tensor<4x8xf32> -> tensor<4x8xf32>
  return %l, %rw, %ro : tensor<f32>, tensor<4xf32>, tensor<4x8xf32>
}
// CHECK-LABEL: func.func @eval_step_stage3
// CHECK-NEXT: shard.all_reduce
func.func @eval_step_stage3(%loss: tensor<f32>) -> tensor<f32>
    attributes {mt.pipeline_stage = 3 : i64} {
  %l = shard.all_reduce %loss on @grid grid_axes = [0] : tensor<f32> -> tensor<f32>
  return %l : tensor<f32>
}
// CHECK-NOT: func.func @reduce_gradients(
// CHECK-LABEL: func.func @reduce_gradients_pp0
// CHECK-SAME: (%[[B0:.+]]: tensor<40xf32>) -> tensor<40xf32>
// CHECK-SAME: mt.buffer_offsets = array<i64: 0, 4, 36>, mt.gradient_buffer = [@w0, @e, @w2], mt.pipeline_rank = 0 : i64
// CHECK-NEXT: %[[R0:.+]] = shard.all_reduce %[[B0]] on @grid grid_axes = [0] : tensor<40xf32> -> tensor<40xf32>
// CHECK-NEXT: return %[[R0]]
// CHECK-LABEL: func.func @reduce_gradients_pp1
// CHECK-SAME: (%[[B1:.+]]: tensor<40xf32>) -> tensor<40xf32>
// CHECK-SAME: mt.buffer_offsets = array<i64: 0, 4, 36>, mt.gradient_buffer = [@w1, @o, @w3], mt.pipeline_rank = 1 : i64
// CHECK-NEXT: shard.all_reduce %[[B1]] on @grid grid_axes = [0]
// CHECK-NOT: gather_parameters

// DIST-LABEL: func.func @reduce_gradients_pp0
// DIST-SAME: (%[[B0:.+]]: tensor<128xf32>) -> tensor<64xf32>
// DIST-SAME: mt.gradient_buffer = [@w0, @e, @w2], mt.pipeline_rank = 0 : i64
// DIST-NEXT: shard.reduce_scatter %[[B0]] on @grid grid_axes = [0] scatter_axis = 0 : tensor<128xf32> -> tensor<64xf32>
// DIST-LABEL: func.func @gather_parameters_pp0
// DIST-SAME: (%[[S0:.+]]: tensor<64xf32>) -> tensor<128xf32>
// DIST-SAME: mt.buffer_offsets = array<i64: 0, 4, 36>, mt.parameter_buffer = [@w0, @e, @w2], mt.pipeline_rank = 0 : i64
// DIST-NEXT: shard.all_gather %[[S0]] on @grid grid_axes = [0] gather_axis = 0 : tensor<64xf32> -> tensor<128xf32>
// DIST-LABEL: func.func @reduce_gradients_pp1
// DIST-SAME: mt.gradient_buffer = [@w1, @o, @w3], mt.pipeline_rank = 1 : i64
// DIST-LABEL: func.func @gather_parameters_pp1
// DIST-SAME: mt.parameter_buffer = [@w1, @o, @w3], mt.pipeline_rank = 1 : i64
