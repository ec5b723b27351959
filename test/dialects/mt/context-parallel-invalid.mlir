// RUN: megatron-opt %s -split-input-file -verify-diagnostics

// Every diagnostic of ring attention's ops, one case each.

func.func @key_step_out_of_ring(%q: tensor<1x4x2x8xf32>, %k: tensor<1x4x2x8xf32>) {
  // expected-error @+1 {{'mt.attention_block' op key_step 2 must name a ring step in [0, context_size = 2)}}
  %o, %l = mt.attention_block %q, %k, %k causal {context_axis = 0 : i64, context_size = 2 : i64, key_step = 2 : i64} : (tensor<1x4x2x8xf32>, tensor<1x4x2x8xf32>, tensor<1x4x2x8xf32>) -> (tensor<1x4x2x8xf32>, tensor<1x2x4xf32>)
  return
}

// -----

func.func @no_context_group(%q: tensor<1x4x2x8xf32>, %k: tensor<1x4x2x8xf32>) {
  // expected-error @+1 {{'mt.attention_block' op context_axis must be a grid axis (>= 0) and context_size a positive number of ranks, got 0 and 0}}
  %o, %l = mt.attention_block %q, %k, %k causal {context_axis = 0 : i64, context_size = 0 : i64, key_step = 0 : i64} : (tensor<1x4x2x8xf32>, tensor<1x4x2x8xf32>, tensor<1x4x2x8xf32>) -> (tensor<1x4x2x8xf32>, tensor<1x2x4xf32>)
  return
}

// -----

func.func @odd_query_sequence(%q: tensor<1x3x2x8xf32>, %k: tensor<1x3x2x8xf32>) {
  // expected-error @+1 {{'mt.attention_block' op query sequence 3 must be even: a rank holds two equal chunks of the sequence}}
  %o, %l = mt.attention_block %q, %k, %k causal {context_axis = 0 : i64, context_size = 2 : i64, key_step = 0 : i64} : (tensor<1x3x2x8xf32>, tensor<1x3x2x8xf32>, tensor<1x3x2x8xf32>) -> (tensor<1x3x2x8xf32>, tensor<1x2x3xf32>)
  return
}

// -----

func.func @ring_block_length(%q: tensor<1x4x2x8xf32>, %k: tensor<1x8x2x8xf32>) {
  // expected-error @+1 {{'mt.attention_block' op key sequence 8 must be the query sequence (one rank's block), 4}}
  %o, %l = mt.attention_block %q, %k, %k causal {context_axis = 0 : i64, context_size = 2 : i64, key_step = 1 : i64} : (tensor<1x4x2x8xf32>, tensor<1x8x2x8xf32>, tensor<1x8x2x8xf32>) -> (tensor<1x4x2x8xf32>, tensor<1x2x4xf32>)
  return
}

// -----

func.func @gathered_block_length(%q: tensor<1x4x2x8xf32>, %k: tensor<1x4x2x8xf32>) {
  // expected-error @+1 {{'mt.attention_block' op key sequence 4 must be context_size times the query sequence (every rank's block, gathered), 16}}
  %o, %l = mt.attention_block %q, %k, %k causal {context_axis = 0 : i64, context_size = 4 : i64} : (tensor<1x4x2x8xf32>, tensor<1x4x2x8xf32>, tensor<1x4x2x8xf32>) -> (tensor<1x4x2x8xf32>, tensor<1x2x4xf32>)
  return
}

// -----

func.func @block_scale(%q: tensor<1x4x2x8xf32>) {
  // expected-error @+1 {{'mt.attention_block' op scale must be positive, got 0.000000e+00}}
  %o, %l = mt.attention_block %q, %q, %q {context_axis = 0 : i64, context_size = 2 : i64, key_step = 0 : i64, scale = 0.0 : f64} : (tensor<1x4x2x8xf32>, tensor<1x4x2x8xf32>, tensor<1x4x2x8xf32>) -> (tensor<1x4x2x8xf32>, tensor<1x2x4xf32>)
  return
}

// -----

func.func @block_dropout(%q: tensor<1x4x2x8xf32>) {
  // expected-error @+1 {{'mt.attention_block' op dropout_p must be in [0, 1), got 1.000000e+00}}
  %o, %l = mt.attention_block %q, %q, %q {context_axis = 0 : i64, context_size = 2 : i64, key_step = 0 : i64, dropout_p = 1.0 : f64} : (tensor<1x4x2x8xf32>, tensor<1x4x2x8xf32>, tensor<1x4x2x8xf32>) -> (tensor<1x4x2x8xf32>, tensor<1x2x4xf32>)
  return
}

// -----

func.func @block_heads(%q: tensor<1x4x3x8xf32>, %k: tensor<1x4x2x8xf32>) {
  // expected-error @+1 {{'mt.attention_block' op query heads (3) must be a multiple of key/value heads (2) for grouped-query attention}}
  %o, %l = mt.attention_block %q, %k, %k {context_axis = 0 : i64, context_size = 2 : i64, key_step = 0 : i64} : (tensor<1x4x3x8xf32>, tensor<1x4x2x8xf32>, tensor<1x4x2x8xf32>) -> (tensor<1x4x3x8xf32>, tensor<1x3x4xf32>)
  return
}

// -----

func.func @block_logsumexp(%q: tensor<1x4x2x8xf32>) {
  // expected-error @+1 {{'mt.attention_block' op logsumexp type 'tensor<1x4x2xf32>' does not match the expected 'tensor<1x2x4xf32>'}}
  %o, %l = mt.attention_block %q, %q, %q {context_axis = 0 : i64, context_size = 2 : i64, key_step = 0 : i64} : (tensor<1x4x2x8xf32>, tensor<1x4x2x8xf32>, tensor<1x4x2x8xf32>) -> (tensor<1x4x2x8xf32>, tensor<1x4x2xf32>)
  return
}

// -----

func.func @merge_rows(%o: tensor<1x4x2x8xf32>, %l: tensor<1x4x2xf32>) {
  // expected-error @+1 {{'mt.attention_merge' op logsumexp type 'tensor<1x4x2xf32>' does not match the expected 'tensor<1x2x4xf32>'}}
  %mo, %ml = mt.attention_merge %o, %l, %o, %l : tensor<1x4x2x8xf32>, tensor<1x4x2xf32>
  return
}

// -----

func.func @merge_rank(%o: tensor<4x2x8xf32>, %l: tensor<1x4x2xf32>) {
  // expected-error @+1 {{'mt.attention_merge' op output must be rank 4 (batch x sequence x heads x value_dim), got 'tensor<4x2x8xf32>'}}
  %mo, %ml = mt.attention_merge %o, %l, %o, %l : tensor<4x2x8xf32>, tensor<1x4x2xf32>
  return
}

// -----

func.func @delta_rows(%o: tensor<1x4x2x8xf32>) {
  // expected-error @+1 {{'mt.attention_delta' op result type 'tensor<1x4x2xf32>' does not match the expected 'tensor<1x2x4xf32>'}}
  %d = mt.attention_delta %o, %o : tensor<1x4x2x8xf32> -> tensor<1x4x2xf32>
  return
}

// -----

func.func @block_grad_delta(%q: tensor<1x4x2x8xf32>, %l: tensor<1x2x4xf32>, %bad: tensor<1x2x8xf32>) {
  // expected-error @+1 {{'mt.attention_block_grad' op delta type 'tensor<1x2x8xf32>' does not match the expected 'tensor<1x2x4xf32>'}}
  %dq, %dk, %dv = mt.attention_block_grad %q, %q, %q, %q, %l, %bad causal {context_axis = 0 : i64, context_size = 2 : i64, key_step = 0 : i64} : (tensor<1x4x2x8xf32>, tensor<1x4x2x8xf32>, tensor<1x4x2x8xf32>, tensor<1x4x2x8xf32>, tensor<1x2x4xf32>, tensor<1x2x8xf32>) -> (tensor<1x4x2x8xf32>, tensor<1x4x2x8xf32>, tensor<1x4x2x8xf32>)
  return
}

// -----

func.func @block_grad_key(%q: tensor<1x4x2x8xf32>, %l: tensor<1x2x4xf32>, %dk: tensor<1x4x1x8xf32>) {
  // expected-error @+1 {{'mt.attention_block_grad' op key_grad type 'tensor<1x4x1x8xf32>' does not match the expected 'tensor<1x4x2x8xf32>'}}
  %dq, %dk2, %dv = mt.attention_block_grad %q, %q, %q, %q, %l, %l {context_axis = 0 : i64, context_size = 2 : i64, key_step = 0 : i64} : (tensor<1x4x2x8xf32>, tensor<1x4x2x8xf32>, tensor<1x4x2x8xf32>, tensor<1x4x2x8xf32>, tensor<1x2x4xf32>, tensor<1x2x4xf32>) -> (tensor<1x4x2x8xf32>, tensor<1x4x1x8xf32>, tensor<1x4x2x8xf32>)
  return
}
