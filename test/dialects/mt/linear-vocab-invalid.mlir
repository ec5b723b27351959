// RUN: megatron-opt %s -split-input-file -verify-diagnostics

// Every diagnostic of the vocabulary-parallel output layer's chunked ops
// (mt.linear_vocab_max, mt.linear_vocab_partials,
// mt.linear_vocab_cross_entropy_grad; MtFusedOps.td), one case each.

func.func @max_chunk_rows(%x: tensor<4x8xf32>, %w: tensor<16x8xf32>) {
  // expected-error @+1 {{'mt.linear_vocab_max' op chunk_rows is 0, expected at least 1 (tokens per chunk)}}
  %m = mt.linear_vocab_max %x, %w chunk_rows = 0 transpose_weight : (tensor<4x8xf32>, tensor<16x8xf32>) -> tensor<4xf32>
  return
}

// -----

func.func @max_weight(%x: tensor<4x8xf32>, %w: tensor<16x8xf32>) {
  // expected-error @+1 {{'mt.linear_vocab_max' op input's last dimension (8) must equal the weight's input dimension (16)}}
  %m = mt.linear_vocab_max %x, %w chunk_rows = 2 : (tensor<4x8xf32>, tensor<16x8xf32>) -> tensor<4xf32>
  return
}

// -----

func.func @max_result(%x: tensor<4x8xf32>, %w: tensor<16x8xf32>) {
  // expected-error @+1 {{'mt.linear_vocab_max' op result has type 'tensor<4x16xf32>', the fused linear layer gives 'tensor<4xf32>'}}
  %m = mt.linear_vocab_max %x, %w chunk_rows = 2 transpose_weight : (tensor<4x8xf32>, tensor<16x8xf32>) -> tensor<4x16xf32>
  return
}

// -----

func.func @partials_max(%x: tensor<4x8xf32>, %w: tensor<16x8xf32>, %l: tensor<4xi32>, %m: tensor<2xf32>) {
  // expected-error @+1 {{'mt.linear_vocab_partials' op max has type 'tensor<2xf32>', the fused linear layer gives 'tensor<4xf32>'}}
  %p = mt.linear_vocab_partials %x, %w, %l, %m chunk_rows = 2 transpose_weight : (tensor<4x8xf32>, tensor<16x8xf32>, tensor<4xi32>, tensor<2xf32>) -> tensor<4x2xf32>
  return
}

// -----

func.func @partials_result(%x: tensor<4x8xf32>, %w: tensor<16x8xf32>, %l: tensor<4xi32>, %m: tensor<4xf32>) {
  // expected-error @+1 {{'mt.linear_vocab_partials' op result has type 'tensor<4xf32>', the fused linear layer gives 'tensor<4x2xf32>'}}
  %p = mt.linear_vocab_partials %x, %w, %l, %m chunk_rows = 2 transpose_weight {vocab_shard_axes = array<i64: 0>} : (tensor<4x8xf32>, tensor<16x8xf32>, tensor<4xi32>, tensor<4xf32>) -> tensor<4xf32>
  return
}

// -----

func.func @grad_reduction_none(%x: tensor<4x8xf32>, %w: tensor<16x8xf32>, %l: tensor<4xi32>, %m: tensor<4xf32>, %p: tensor<4x2xf32>, %g: tensor<4xf32>) {
  // expected-error @+1 {{'mt.linear_vocab_cross_entropy_grad' op takes reduction mean or sum, not none (keep mt.vocab_cross_entropy_grad for per-token loss gradients)}}
  %dx, %dw = mt.linear_vocab_cross_entropy_grad %x, %w, %l, %m, %p, %g reduction = none chunk_rows = 2 transpose_weight : (tensor<4x8xf32>, tensor<16x8xf32>, tensor<4xi32>, tensor<4xf32>, tensor<4x2xf32>, tensor<4xf32>) -> (tensor<4x8xf32>, tensor<16x8xf32>)
  return
}

// -----

func.func @grad_partials(%x: tensor<4x8xf32>, %w: tensor<16x8xf32>, %l: tensor<4xi32>, %m: tensor<4xf32>, %p: tensor<4x3xf32>, %g: tensor<f32>) {
  // expected-error @+1 {{'mt.linear_vocab_cross_entropy_grad' op partials has type 'tensor<4x3xf32>', the fused linear layer gives 'tensor<4x2xf32>'}}
  %dx, %dw = mt.linear_vocab_cross_entropy_grad %x, %w, %l, %m, %p, %g reduction = mean chunk_rows = 2 transpose_weight : (tensor<4x8xf32>, tensor<16x8xf32>, tensor<4xi32>, tensor<4xf32>, tensor<4x3xf32>, tensor<f32>) -> (tensor<4x8xf32>, tensor<16x8xf32>)
  return
}

// -----

func.func @grad_loss_grad(%x: tensor<4x8xf32>, %w: tensor<16x8xf32>, %l: tensor<4xi32>, %m: tensor<4xf32>, %p: tensor<4x2xf32>, %g: tensor<4xf32>) {
  // expected-error @+1 {{'mt.linear_vocab_cross_entropy_grad' op loss_grad has type 'tensor<4xf32>', the fused linear layer gives 'tensor<f32>'}}
  %dx, %dw = mt.linear_vocab_cross_entropy_grad %x, %w, %l, %m, %p, %g reduction = sum chunk_rows = 2 transpose_weight : (tensor<4x8xf32>, tensor<16x8xf32>, tensor<4xi32>, tensor<4xf32>, tensor<4x2xf32>, tensor<4xf32>) -> (tensor<4x8xf32>, tensor<16x8xf32>)
  return
}

// -----

func.func @grad_weight_grad(%x: tensor<4x8xf32>, %w: tensor<16x8xf32>, %l: tensor<4xi32>, %m: tensor<4xf32>, %p: tensor<4x2xf32>, %g: tensor<f32>) {
  // expected-error @+1 {{'mt.linear_vocab_cross_entropy_grad' op weight_grad has type 'tensor<8x16xf32>', the fused linear layer gives 'tensor<16x8xf32>'}}
  %dx, %dw = mt.linear_vocab_cross_entropy_grad %x, %w, %l, %m, %p, %g reduction = mean chunk_rows = 2 transpose_weight : (tensor<4x8xf32>, tensor<16x8xf32>, tensor<4xi32>, tensor<4xf32>, tensor<4x2xf32>, tensor<f32>) -> (tensor<4x8xf32>, tensor<8x16xf32>)
  return
}

// -----

func.func @grad_labels(%x: tensor<4x8xf32>, %w: tensor<16x8xf32>, %l: tensor<3xi32>, %m: tensor<4xf32>, %p: tensor<4x2xf32>, %g: tensor<f32>) {
  // expected-error @+1 {{'mt.linear_vocab_cross_entropy_grad' op labels 'tensor<3xi32>' must have the logits' shape without its last (vocabulary) dimension; logits are 'tensor<4x16xf32>'}}
  %dx, %dw = mt.linear_vocab_cross_entropy_grad %x, %w, %l, %m, %p, %g reduction = mean chunk_rows = 2 transpose_weight : (tensor<4x8xf32>, tensor<16x8xf32>, tensor<3xi32>, tensor<4xf32>, tensor<4x2xf32>, tensor<f32>) -> (tensor<4x8xf32>, tensor<16x8xf32>)
  return
}
