// RUN: megatron-opt %s -split-input-file -verify-diagnostics

// Every diagnostic of the mixture-of-experts ops, one case each.

func.func @logits_rank(%l: tensor<2x3x4xf32>) {
  // expected-error @+1 {{'mt.moe_route' op router logits must be rank 2 (tokens x experts), got 'tensor<2x3x4xf32>'}}
  %p, %i = mt.moe_route %l topk = 2 score = softmax : (tensor<2x3x4xf32>) -> (tensor<2x2xf32>, tensor<2x2xi32>)
  return
}

// -----

func.func @topk_above_experts(%l: tensor<6x4xf32>) {
  // expected-error @+1 {{'mt.moe_route' op topk 5 must be in [1, 4] (the number of experts)}}
  %p, %i = mt.moe_route %l topk = 5 score = softmax : (tensor<6x4xf32>) -> (tensor<6x5xf32>, tensor<6x5xi32>)
  return
}

// -----

func.func @route_weights_type(%l: tensor<6x4xf32>) {
  // expected-error @+1 {{'mt.moe_route' op routing weights type 'tensor<6x3xf32>' does not match the expected 'tensor<6x2xf32>'}}
  %p, %i = mt.moe_route %l topk = 2 score = softmax : (tensor<6x4xf32>) -> (tensor<6x3xf32>, tensor<6x2xi32>)
  return
}

// -----

func.func @route_indices_shape(%l: tensor<6x4xf32>) {
  // expected-error @+1 {{'mt.moe_route' op routing indices type 'tensor<6x3xi32>' must have the weights' shape [6, 2]}}
  %p, %i = mt.moe_route %l topk = 2 score = softmax : (tensor<6x4xf32>) -> (tensor<6x2xf32>, tensor<6x3xi32>)
  return
}

// -----

func.func @groups_alone(%l: tensor<6x4xf32>) {
  // expected-error @+1 {{'mt.moe_route' op num_groups and group_topk go together (group-limited routing)}}
  %p, %i = "mt.moe_route"(%l) <{score_function = 0 : i32, topk = 2 : i64, num_groups = 2 : i64}> : (tensor<6x4xf32>) -> (tensor<6x2xf32>, tensor<6x2xi32>)
  return
}

// -----

func.func @groups_not_dividing(%l: tensor<6x4xf32>) {
  // expected-error @+1 {{'mt.moe_route' op num_groups 3 must divide the 4 experts}}
  %p, %i = mt.moe_route %l topk = 2 score = softmax groups = 3 group_topk = 1 : (tensor<6x4xf32>) -> (tensor<6x2xf32>, tensor<6x2xi32>)
  return
}

// -----

func.func @group_topk_above_topk(%dp: tensor<6x2xf32>, %l: tensor<6x8xf32>, %i: tensor<6x2xi32>) {
  // expected-error @+1 {{'mt.moe_route_grad' op group_topk 3 must be in [1, min(num_groups 4, topk 2)]: each kept group's score sums its topk / group_topk highest scores}}
  %r = mt.moe_route_grad %dp, %l, %i topk = 2 score = softmax groups = 4 group_topk = 3 : (tensor<6x2xf32>, tensor<6x8xf32>, tensor<6x2xi32>) -> tensor<6x8xf32>
  return
}

// -----

func.func @topk_beyond_kept_groups(%l: tensor<6x8xf32>) {
  // expected-error @+1 {{'mt.moe_route' op topk 4 exceeds the 2 experts of the 1 kept groups}}
  %p, %i = mt.moe_route %l topk = 4 score = sigmoid normalize groups = 4 group_topk = 1 : (tensor<6x8xf32>) -> (tensor<6x4xf32>, tensor<6x4xi32>)
  return
}

// -----

func.func @sequences_not_whole(%l: tensor<6x4xf32>) {
  // expected-error @+1 {{'mt.moe_aux_loss' op per_sequence 4 must divide the 6 tokens into whole sequences}}
  %aux = mt.moe_aux_loss %l topk = 2 score = softmax coeff = 0.01 per_sequence = 4 : (tensor<6x4xf32>) -> tensor<f32>
  return
}

// -----

func.func @capacity_not_positive(%l: tensor<6x4xf32>) {
  // expected-error @+1 {{'mt.moe_route' op capacity_factor must be a finite number > 0, got 0.000000e+00}}
  %p, %i = mt.moe_route %l topk = 2 score = softmax capacity_factor = 0.0 : (tensor<6x4xf32>) -> (tensor<6x2xf32>, tensor<6x2xi32>)
  return
}

// -----

func.func @drop_policy_without_capacity(%l: tensor<6x4xf32>) {
  // expected-error @+1 {{'mt.moe_route' op drop_policy needs a capacity_factor: dropless routing drops nothing}}
  %p, %i = mt.moe_route %l topk = 2 score = softmax drop_policy = position : (tensor<6x4xf32>) -> (tensor<6x2xf32>, tensor<6x2xi32>)
  return
}

// -----

func.func @negative_coeff(%l: tensor<6x4xf32>) {
  // expected-error @+1 {{'mt.moe_aux_loss' op coeff must be a finite number >= 0, got -1.000000e+00}}
  %a = mt.moe_aux_loss %l topk = 2 score = softmax coeff = -1.0 : (tensor<6x4xf32>) -> tensor<f32>
  return
}

// -----

func.func @loss_not_scalar(%l: tensor<6x4xf32>) {
  // expected-error @+1 {{'mt.moe_z_loss' op the loss must be a scalar tensor<f32>, got 'tensor<6xf32>'}}
  %z = mt.moe_z_loss %l coeff = 1.0 : (tensor<6x4xf32>) -> tensor<6xf32>
  return
}

// -----

func.func @tokens_rank(%x: tensor<2x3x8xf32>, %i: tensor<6x2xi32>) {
  // expected-error @+1 {{'mt.moe_permute' op tokens must be rank 2 (tokens x hidden), got 'tensor<2x3x8xf32>'}}
  %r = mt.moe_permute %x, %i : (tensor<2x3x8xf32>, tensor<6x2xi32>) -> tensor<12x8xf32>
  return
}

// -----

func.func @indices_tokens(%x: tensor<6x8xf32>, %i: tensor<5x2xi32>) {
  // expected-error @+1 {{'mt.moe_permute' op routing indices must be [6, topk] (one row per token), got 'tensor<5x2xi32>'}}
  %r = mt.moe_permute %x, %i : (tensor<6x8xf32>, tensor<5x2xi32>) -> tensor<12x8xf32>
  return
}

// -----

func.func @weights_shape(%x: tensor<6x8xf32>, %i: tensor<6x2xi32>, %p: tensor<6x3xf32>) {
  // expected-error @+1 {{'mt.moe_permute' op routing weights must have the indices' shape [6, 2], got 'tensor<6x3xf32>'}}
  %r = mt.moe_permute %x, %i, %p : (tensor<6x8xf32>, tensor<6x2xi32>, tensor<6x3xf32>) -> tensor<12x8xf32>
  return
}

// -----

func.func @permute_result(%x: tensor<6x8xf32>, %i: tensor<6x2xi32>) {
  // expected-error @+1 {{'mt.moe_permute' op result type 'tensor<6x8xf32>' does not match the expected 'tensor<12x8xf32>'}}
  %r = mt.moe_permute %x, %i : (tensor<6x8xf32>, tensor<6x2xi32>) -> tensor<6x8xf32>
  return
}

// -----

func.func @rows_rank(%r: tensor<12xf32>, %i: tensor<6x2xi32>) {
  // expected-error @+1 {{'mt.moe_unpermute' op permuted rows must be rank 2 (tokens * topk x hidden), got 'tensor<12xf32>'}}
  %y = mt.moe_unpermute %r, %i : (tensor<12xf32>, tensor<6x2xi32>) -> tensor<6x8xf32>
  return
}

// -----

func.func @rows_count(%r: tensor<10x8xf32>, %i: tensor<6x2xi32>) {
  // expected-error @+1 {{'mt.moe_unpermute' op permuted rows must number tokens * topk = 12 (indices 'tensor<6x2xi32>'), got 10}}
  %y = mt.moe_unpermute %r, %i : (tensor<10x8xf32>, tensor<6x2xi32>) -> tensor<6x8xf32>
  return
}

// -----

func.func @grouped_input_rank(%r: tensor<12x8x1xf32>, %w: tensor<4x12x8xf32>, %i: tensor<6x2xi32>) {
  // expected-error @+1 {{'mt.moe_grouped_linear' op permuted rows must be rank 2 (tokens * topk x in), got 'tensor<12x8x1xf32>'}}
  %h = mt.moe_grouped_linear %r, %w, %i transpose_weight : (tensor<12x8x1xf32>, tensor<4x12x8xf32>, tensor<6x2xi32>) -> tensor<12x12xf32>
  return
}

// -----

func.func @grouped_weight_rank(%r: tensor<12x8xf32>, %w: tensor<12x8xf32>, %i: tensor<6x2xi32>) {
  // expected-error @+1 {{'mt.moe_grouped_linear' op expert weights must be rank 3 (experts x out x in), got 'tensor<12x8xf32>'}}
  %h = mt.moe_grouped_linear %r, %w, %i transpose_weight : (tensor<12x8xf32>, tensor<12x8xf32>, tensor<6x2xi32>) -> tensor<12x12xf32>
  return
}

// -----

func.func @grouped_in_dimension(%r: tensor<12x8xf32>, %w: tensor<4x8x12xf32>, %i: tensor<6x2xi32>) {
  // expected-error @+1 {{'mt.moe_grouped_linear' op input's last dimension (8) must equal the expert weights' input dimension (12) of 'tensor<4x8x12xf32>' (transposed, experts x out x in)}}
  %h = mt.moe_grouped_linear %r, %w, %i transpose_weight : (tensor<12x8xf32>, tensor<4x8x12xf32>, tensor<6x2xi32>) -> tensor<12x8xf32>
  return
}

// -----

func.func @weight_grad_experts(%r: tensor<12x8xf32>, %d: tensor<12x12xf32>, %i: tensor<6x2xi32>) {
  // expected-error @+1 {{'mt.moe_grouped_linear_weight_grad' op result must be the expert weights, rank 3 with at least one expert, got 'tensor<12x8xf32>'}}
  %w = mt.moe_grouped_linear_weight_grad %r, %d, %i : (tensor<12x8xf32>, tensor<12x12xf32>, tensor<6x2xi32>) -> tensor<12x8xf32>
  return
}

// -----

func.func @loss_grad_not_scalar(%d: tensor<1xf32>, %l: tensor<6x4xf32>) {
  // expected-error @+1 {{'mt.moe_z_loss_grad' op the loss gradient must be a scalar tensor<f32>, got 'tensor<1xf32>'}}
  %g = mt.moe_z_loss_grad %d, %l coeff = 1.0 : (tensor<1xf32>, tensor<6x4xf32>) -> tensor<6x4xf32>
  return
}

// -----

func.func @expert_bias_not_per_expert(%l: tensor<6x4xf32>, %b: tensor<3xf32>) {
  // expected-error @+1 {{'mt.moe_route' op expert_bias must be tensor<4xf32> (one f32 per expert), got 'tensor<3xf32>'}}
  %p, %i = mt.moe_route %l bias %b topk = 2 score = sigmoid normalize : (tensor<6x4xf32>, tensor<3xf32>) -> (tensor<6x2xf32>, tensor<6x2xi32>)
  return
}

// -----

func.func @expert_bias_with_softmax(%dp: tensor<6x2xf32>, %l: tensor<6x4xf32>, %i: tensor<6x2xi32>, %b: tensor<4xf32>) {
  // expected-error @+1 {{'mt.moe_route_grad' op expert_bias applies to sigmoid scores only (Megatron-LM's aux-loss-free balancing), not softmax}}
  %r = mt.moe_route_grad %dp, %l, %i bias %b topk = 2 score = softmax normalize : (tensor<6x2xf32>, tensor<6x4xf32>, tensor<6x2xi32>, tensor<4xf32>) -> tensor<6x4xf32>
  return
}

// -----

func.func @load_of_3d_indices(%i: tensor<2x3x2xi32>) {
  // expected-error @+1 {{'mt.moe_tokens_per_expert' op routing indices must be rank 2 (tokens x topk), got 'tensor<2x3x2xi32>'}}
  %c = mt.moe_tokens_per_expert %i : (tensor<2x3x2xi32>) -> tensor<4xf32>
  return
}

// -----

func.func @load_not_per_expert(%i: tensor<6x2xi32>) {
  // expected-error @+1 {{'mt.moe_tokens_per_expert' op result must be rank 1 (one count per expert), got 'tensor<4x1xf32>'}}
  %c = mt.moe_tokens_per_expert %i : (tensor<6x2xi32>) -> tensor<4x1xf32>
  return
}
