// RUN: megatron-opt %s '-mt-fuse-linear-cross-entropy=chunk-rows=3' -split-input-file | FileCheck %s
// RUN: megatron-opt %s '-mt-fuse-linear-cross-entropy=chunk-rows=3' -split-input-file | megatron-opt -split-input-file | FileCheck %s

// A pipeline's last stage after mt-split-forward-backward (tied table,
// read transposed): the forward computes the logits and the loss and
// stashes the logits, the labels and the final norm's output; the backward
// computes the logits' gradient and both gradient GEMMs. The fused op runs
// in the forward, which stashes dx in the logits' place and dW after it;
// the backward scales them by its seed. The labels' and the norm output's
// stashes are no longer read and leave both functions; the activation's
// stays.

// CHECK-LABEL: func.func @step_stage1_forward
// CHECK-SAME: (%[[ACT:.+]]: tensor<2x4x8xf32> {mt.name = "activation"}, %[[L:.+]]: tensor<2x4xi32> {mt.name = "labels"})
// CHECK-SAME: -> (tensor<f32>, tensor<2x4x8xf32> {mt.name = "stash"}, tensor<64x8xf32> {mt.name = "stash"}, tensor<2x4x8xf32> {mt.name = "stash"})
// CHECK: %[[W:.+]] = mt.get_parameter @wte
// CHECK: %[[H:.+]] = mt.add %[[ACT]], %[[ACT]]
// CHECK-NEXT: %[[LOSS:.+]], %[[DX1:.+]], %[[DW1:.+]] = mt.linear_cross_entropy %[[H]], %[[W]], %[[L]] reduction = mean chunk_rows = 3 transpose_weight
// CHECK-NOT: mt.linear
// CHECK-NOT: mt.cross_entropy
// CHECK: return %[[LOSS]], %[[DX1]], %[[DW1]], %[[ACT]] :

// CHECK-LABEL: func.func @step_stage1_backward
// CHECK-SAME: (%[[SDX:.+]]: tensor<2x4x8xf32> {mt.name = "stash"}, %[[SDW:.+]]: tensor<64x8xf32> {mt.name = "stash"}, %[[SACT:.+]]: tensor<2x4x8xf32> {mt.name = "stash"}, %[[SEED:.+]]: tensor<f32> {mt.name = "loss_gradient"})
// CHECK-SAME: -> (tensor<2x4x8xf32> {mt.name = "input_gradient"}, tensor<64x8xf32>)
// CHECK: %[[DX:.+]] = mt.scale %[[SDX]], %[[SEED]] : (tensor<2x4x8xf32>, tensor<f32>) -> tensor<2x4x8xf32>
// CHECK-NEXT: %[[DW:.+]] = mt.scale %[[SDW]], %[[SEED]] : (tensor<64x8xf32>, tensor<f32>) -> tensor<64x8xf32>
// CHECK-NOT: mt.linear
// CHECK-NOT: mt.cross_entropy
// CHECK: %[[DA:.+]] = mt.add %[[DX]], %[[SACT]]
// CHECK: return %[[DA]], %[[DW]]
module {
  mt.parameter @wte : tensor<64x8xf32> init = normal std = 2.000000e-02
  func.func @step_stage1_forward(%act: tensor<2x4x8xf32> {mt.name = "activation"}, %labels: tensor<2x4xi32> {mt.name = "labels"})
      -> (tensor<f32>, tensor<2x4x64xf32> {mt.name = "stash"}, tensor<2x4xi32> {mt.name = "stash"}, tensor<2x4x8xf32> {mt.name = "stash"}, tensor<2x4x8xf32> {mt.name = "stash"})
      attributes {mt.pipeline_stage = 1 : i64} {
    %w = mt.get_parameter @wte : tensor<64x8xf32>
    %h = mt.add %act, %act : tensor<2x4x8xf32>
    %logits = mt.linear %h, %w transpose_weight : (tensor<2x4x8xf32>, tensor<64x8xf32>) -> tensor<2x4x64xf32>
    %loss = mt.cross_entropy %logits, %labels reduction = mean : (tensor<2x4x64xf32>, tensor<2x4xi32>) -> tensor<f32>
    return %loss, %logits, %labels, %h, %act : tensor<f32>, tensor<2x4x64xf32>, tensor<2x4xi32>, tensor<2x4x8xf32>, tensor<2x4x8xf32>
  }
  func.func @step_stage1_backward(%logits: tensor<2x4x64xf32> {mt.name = "stash"}, %labels: tensor<2x4xi32> {mt.name = "stash"}, %h: tensor<2x4x8xf32> {mt.name = "stash"}, %act: tensor<2x4x8xf32> {mt.name = "stash"}, %seed: tensor<f32> {mt.name = "loss_gradient"})
      -> (tensor<2x4x8xf32> {mt.name = "input_gradient"}, tensor<64x8xf32>)
      attributes {mt.pipeline_stage = 1 : i64} {
    %w = mt.get_parameter @wte : tensor<64x8xf32>
    %dlogits = mt.cross_entropy_grad %seed, %logits, %labels reduction = mean : (tensor<f32>, tensor<2x4x64xf32>, tensor<2x4xi32>) -> tensor<2x4x64xf32>
    %dh = mt.linear %dlogits, %w : (tensor<2x4x64xf32>, tensor<64x8xf32>) -> tensor<2x4x8xf32>
    %dw = mt.linear_weight_grad %h, %dlogits transpose_weight : (tensor<2x4x8xf32>, tensor<2x4x64xf32>) -> tensor<64x8xf32>
    %da = mt.add %dh, %act : tensor<2x4x8xf32>
    return %da, %dw : tensor<2x4x8xf32>, tensor<64x8xf32>
  }
}

// -----

// The backward's data-gradient GEMM reads another parameter than the
// forward's linear: not the same output layer, so nothing changes.

// CHECK-LABEL: func.func @other_stage1_forward
// CHECK: mt.linear
// CHECK: mt.cross_entropy
// CHECK-LABEL: func.func @other_stage1_backward
// CHECK: mt.cross_entropy_grad
// CHECK-NOT: mt.scale
module {
  mt.parameter @wte : tensor<64x8xf32> init = normal std = 2.000000e-02
  mt.parameter @other : tensor<64x8xf32> init = normal std = 2.000000e-02
  func.func @other_stage1_forward(%act: tensor<2x4x8xf32> {mt.name = "activation"}, %labels: tensor<2x4xi32> {mt.name = "labels"})
      -> (tensor<f32>, tensor<2x4x64xf32> {mt.name = "stash"}, tensor<2x4xi32> {mt.name = "stash"}, tensor<2x4x8xf32> {mt.name = "stash"})
      attributes {mt.pipeline_stage = 1 : i64} {
    %w = mt.get_parameter @wte : tensor<64x8xf32>
    %logits = mt.linear %act, %w transpose_weight : (tensor<2x4x8xf32>, tensor<64x8xf32>) -> tensor<2x4x64xf32>
    %loss = mt.cross_entropy %logits, %labels reduction = mean : (tensor<2x4x64xf32>, tensor<2x4xi32>) -> tensor<f32>
    return %loss, %logits, %labels, %act : tensor<f32>, tensor<2x4x64xf32>, tensor<2x4xi32>, tensor<2x4x8xf32>
  }
  func.func @other_stage1_backward(%logits: tensor<2x4x64xf32> {mt.name = "stash"}, %labels: tensor<2x4xi32> {mt.name = "stash"}, %h: tensor<2x4x8xf32> {mt.name = "stash"}, %seed: tensor<f32> {mt.name = "loss_gradient"})
      -> (tensor<2x4x8xf32> {mt.name = "input_gradient"}, tensor<64x8xf32>)
      attributes {mt.pipeline_stage = 1 : i64} {
    %w = mt.get_parameter @other : tensor<64x8xf32>
    %dlogits = mt.cross_entropy_grad %seed, %logits, %labels reduction = mean : (tensor<f32>, tensor<2x4x64xf32>, tensor<2x4xi32>) -> tensor<2x4x64xf32>
    %dh = mt.linear %dlogits, %w : (tensor<2x4x64xf32>, tensor<64x8xf32>) -> tensor<2x4x8xf32>
    %dw = mt.linear_weight_grad %h, %dlogits transpose_weight : (tensor<2x4x8xf32>, tensor<2x4x64xf32>) -> tensor<64x8xf32>
    return %dh, %dw : tensor<2x4x8xf32>, tensor<64x8xf32>
  }
}
