// RUN: megatron-opt %s | megatron-opt | FileCheck %s
// RUN: megatron-opt %s --mlir-print-op-generic | megatron-opt | FileCheck %s

// Round trip of the mixture-of-experts ops (docs/MoE.md): 6 tokens over 4
// experts, top-2, hidden 8, expert width 12.

// CHECK-LABEL: func.func @router
func.func @router(%logits: tensor<6x4xf32>, %bias: tensor<4xf32>) -> (tensor<6x2xf32>, tensor<6x2xi32>, tensor<f32>, tensor<f32>) {
  // CHECK: %{{.+}}, %{{.+}} = mt.moe_route %{{.+}} topk = 2 score = softmax normalize : (tensor<6x4xf32>) -> (tensor<6x2xf32>, tensor<6x2xi32>)
  %p, %i = mt.moe_route %logits topk = 2 score = softmax normalize : (tensor<6x4xf32>) -> (tensor<6x2xf32>, tensor<6x2xi32>)
  // CHECK: mt.moe_route %{{.+}} topk = 2 score = sigmoid capacity_factor = 1.250000e+00 drop_policy = position : (tensor<6x4xf32>) -> (tensor<6x2xf32>, tensor<6x2xi32>)
  %dp, %di = mt.moe_route %logits topk = 2 score = sigmoid capacity_factor = 1.25 drop_policy = position : (tensor<6x4xf32>) -> (tensor<6x2xf32>, tensor<6x2xi32>)
  // CHECK: mt.moe_route %{{.+}} topk = 2 score = sigmoid normalize groups = 2 group_topk = 1 capacity_factor = 1.000000e+00 drop_policy = probs : (tensor<6x4xf32>) -> (tensor<6x2xf32>, tensor<6x2xi32>)
  %gp, %gi = mt.moe_route %logits topk = 2 score = sigmoid normalize groups = 2 group_topk = 1 capacity_factor = 1.0 drop_policy = probs : (tensor<6x4xf32>) -> (tensor<6x2xf32>, tensor<6x2xi32>)
  // CHECK: mt.moe_route %{{.+}} bias %{{.+}} topk = 2 score = sigmoid normalize groups = 2 group_topk = 1 : (tensor<6x4xf32>, tensor<4xf32>) -> (tensor<6x2xf32>, tensor<6x2xi32>)
  %bp, %bi = mt.moe_route %logits bias %bias topk = 2 score = sigmoid normalize groups = 2 group_topk = 1 : (tensor<6x4xf32>, tensor<4xf32>) -> (tensor<6x2xf32>, tensor<6x2xi32>)
  // CHECK: mt.moe_route_grad %{{.+}}, %{{.+}}, %{{.+}} bias %{{.+}} topk = 2 score = sigmoid normalize groups = 2 group_topk = 1 : (tensor<6x2xf32>, tensor<6x4xf32>, tensor<6x2xi32>, tensor<4xf32>) -> tensor<6x4xf32>
  %bg = mt.moe_route_grad %bp, %logits, %bi bias %bias topk = 2 score = sigmoid normalize groups = 2 group_topk = 1 : (tensor<6x2xf32>, tensor<6x4xf32>, tensor<6x2xi32>, tensor<4xf32>) -> tensor<6x4xf32>
  // CHECK: mt.moe_tokens_per_expert %{{.+}} : (tensor<6x2xi32>) -> tensor<4xf32>
  %load = mt.moe_tokens_per_expert %bi : (tensor<6x2xi32>) -> tensor<4xf32>
  // CHECK: mt.moe_aux_loss %{{.+}} topk = 2 score = softmax coeff = 1.000000e-02 : (tensor<6x4xf32>) -> tensor<f32>
  %aux = mt.moe_aux_loss %logits topk = 2 score = softmax coeff = 0.01 : (tensor<6x4xf32>) -> tensor<f32>
  // CHECK: mt.moe_aux_loss %{{.+}} topk = 2 score = softmax coeff = 1.000000e-02 per_sequence = 3 : (tensor<6x4xf32>) -> tensor<f32>
  %seq = mt.moe_aux_loss %logits topk = 2 score = softmax coeff = 0.01 per_sequence = 3 : (tensor<6x4xf32>) -> tensor<f32>
  // CHECK: mt.moe_z_loss %{{.+}} coeff = 1.000000e-03 : (tensor<6x4xf32>) -> tensor<f32>
  %z = mt.moe_z_loss %logits coeff = 0.001 : (tensor<6x4xf32>) -> tensor<f32>
  return %p, %di, %aux, %z : tensor<6x2xf32>, tensor<6x2xi32>, tensor<f32>, tensor<f32>
}

// CHECK-LABEL: func.func @experts
func.func @experts(%x: tensor<6x8xf32>, %i: tensor<6x2xi32>, %p: tensor<6x2xf32>, %w1: tensor<4x12x8xf32>, %w2: tensor<4x12x8xf32>) -> tensor<6x8xf32> {
  // CHECK: %[[ROWS:.+]] = mt.moe_permute %{{.+}}, %{{.+}} : (tensor<6x8xf32>, tensor<6x2xi32>) -> tensor<12x8xf32>
  %rows = mt.moe_permute %x, %i : (tensor<6x8xf32>, tensor<6x2xi32>) -> tensor<12x8xf32>
  // CHECK: mt.moe_grouped_linear %[[ROWS]], %{{.+}}, %{{.+}} transpose_weight : (tensor<12x8xf32>, tensor<4x12x8xf32>, tensor<6x2xi32>) -> tensor<12x12xf32>
  %h = mt.moe_grouped_linear %rows, %w1, %i transpose_weight : (tensor<12x8xf32>, tensor<4x12x8xf32>, tensor<6x2xi32>) -> tensor<12x12xf32>
  // CHECK: mt.moe_grouped_linear %{{.+}}, %{{.+}}, %{{.+}} : (tensor<12x12xf32>, tensor<4x12x8xf32>, tensor<6x2xi32>) -> tensor<12x8xf32>
  %o = mt.moe_grouped_linear %h, %w2, %i : (tensor<12x12xf32>, tensor<4x12x8xf32>, tensor<6x2xi32>) -> tensor<12x8xf32>
  // CHECK: mt.moe_unpermute %{{.+}}, %{{.+}}, %{{.+}} : (tensor<12x8xf32>, tensor<6x2xi32>, tensor<6x2xf32>) -> tensor<6x8xf32>
  %y = mt.moe_unpermute %o, %i, %p : (tensor<12x8xf32>, tensor<6x2xi32>, tensor<6x2xf32>) -> tensor<6x8xf32>
  return %y : tensor<6x8xf32>
}

// CHECK-LABEL: func.func @backward
func.func @backward(%dy: tensor<6x8xf32>, %rows: tensor<12x8xf32>, %dh: tensor<12x12xf32>, %i: tensor<6x2xi32>, %dp: tensor<6x2xf32>, %logits: tensor<6x4xf32>, %dl: tensor<f32>) -> (tensor<6x2xf32>, tensor<4x12x8xf32>, tensor<6x4xf32>, tensor<6x4xf32>, tensor<6x4xf32>) {
  // CHECK: mt.moe_probs_grad %{{.+}}, %{{.+}}, %{{.+}} : (tensor<6x8xf32>, tensor<12x8xf32>, tensor<6x2xi32>) -> tensor<6x2xf32>
  %g = mt.moe_probs_grad %dy, %rows, %i : (tensor<6x8xf32>, tensor<12x8xf32>, tensor<6x2xi32>) -> tensor<6x2xf32>
  // CHECK: mt.moe_grouped_linear_weight_grad %{{.+}}, %{{.+}}, %{{.+}} transpose_weight : (tensor<12x8xf32>, tensor<12x12xf32>, tensor<6x2xi32>) -> tensor<4x12x8xf32>
  %dw = mt.moe_grouped_linear_weight_grad %rows, %dh, %i transpose_weight : (tensor<12x8xf32>, tensor<12x12xf32>, tensor<6x2xi32>) -> tensor<4x12x8xf32>
  // CHECK: mt.moe_route_grad %{{.+}}, %{{.+}}, %{{.+}} topk = 2 score = sigmoid normalize : (tensor<6x2xf32>, tensor<6x4xf32>, tensor<6x2xi32>) -> tensor<6x4xf32>
  %r = mt.moe_route_grad %dp, %logits, %i topk = 2 score = sigmoid normalize : (tensor<6x2xf32>, tensor<6x4xf32>, tensor<6x2xi32>) -> tensor<6x4xf32>
  // CHECK: mt.moe_route_grad %{{.+}}, %{{.+}}, %{{.+}} topk = 2 score = softmax groups = 4 group_topk = 2 : (tensor<6x2xf32>, tensor<6x4xf32>, tensor<6x2xi32>) -> tensor<6x4xf32>
  %rg = mt.moe_route_grad %dp, %logits, %i topk = 2 score = softmax groups = 4 group_topk = 2 : (tensor<6x2xf32>, tensor<6x4xf32>, tensor<6x2xi32>) -> tensor<6x4xf32>
  // CHECK: mt.moe_aux_loss_grad %{{.+}}, %{{.+}} topk = 2 score = sigmoid coeff = 1.000000e-02 : (tensor<f32>, tensor<6x4xf32>) -> tensor<6x4xf32>
  %a = mt.moe_aux_loss_grad %dl, %logits topk = 2 score = sigmoid coeff = 0.01 : (tensor<f32>, tensor<6x4xf32>) -> tensor<6x4xf32>
  // CHECK: mt.moe_z_loss_grad %{{.+}}, %{{.+}} coeff = 1.000000e-03 : (tensor<f32>, tensor<6x4xf32>) -> tensor<6x4xf32>
  %z = mt.moe_z_loss_grad %dl, %logits coeff = 0.001 : (tensor<f32>, tensor<6x4xf32>) -> tensor<6x4xf32>
  return %g, %dw, %r, %a, %z : tensor<6x2xf32>, tensor<4x12x8xf32>, tensor<6x4xf32>, tensor<6x4xf32>, tensor<6x4xf32>
}
