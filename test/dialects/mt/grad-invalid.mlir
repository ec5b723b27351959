// RUN: megatron-opt %s -split-input-file -verify-diagnostics

// Every diagnostic of the backward and state ops, one case each.

func.func @embedding_grad_shape(%dy: tensor<2x4x16xf32>, %ids: tensor<2x8xi32>) {
  // expected-error @+1 {{'mt.embedding_grad' op output_grad 'tensor<2x4x16xf32>' must have the ids' shape 'tensor<2x8xi32>' plus a hidden dimension}}
  %0 = mt.embedding_grad %dy, %ids : (tensor<2x4x16xf32>, tensor<2x8xi32>) -> tensor<64x16xf32>
  return
}

// -----

func.func @embedding_grad_result(%dy: tensor<2x8x16xf32>, %ids: tensor<2x8xi32>) {
  // expected-error @+1 {{'mt.embedding_grad' op result 'tensor<64x8xf32>' must be a vocabulary x 16 table of 'f32'}}
  %0 = mt.embedding_grad %dy, %ids : (tensor<2x8x16xf32>, tensor<2x8xi32>) -> tensor<64x8xf32>
  return
}

// -----

func.func @layer_norm_grad_types(%dy: tensor<2x8x16xf32>, %x: tensor<2x8x16xf32>, %w: tensor<16xf32>) {
  // expected-error @+1 {{'mt.layer_norm_grad' op weight_grad type 'tensor<8xf32>' does not match the expected 'tensor<16xf32>'}}
  %0:2 = mt.layer_norm_grad %dy, %x, %w epsilon = 1.000000e-05 : (tensor<2x8x16xf32>, tensor<2x8x16xf32>, tensor<16xf32>) -> (tensor<2x8x16xf32>, tensor<8xf32>)
  return
}

// -----

func.func @rms_norm_grad_output(%dy: tensor<2x8x8xf32>, %x: tensor<2x8x16xf32>, %w: tensor<16xf32>) {
  // expected-error @+1 {{'mt.rms_norm_grad' op output_grad type 'tensor<2x8x8xf32>' does not match the expected 'tensor<2x8x16xf32>'}}
  %0:2 = mt.rms_norm_grad %dy, %x, %w epsilon = 1.000000e-06 : (tensor<2x8x8xf32>, tensor<2x8x16xf32>, tensor<16xf32>) -> (tensor<2x8x16xf32>, tensor<16xf32>)
  return
}

// -----

func.func @linear_weight_grad_rows(%x: tensor<2x8x16xf32>, %dy: tensor<2x4x16xf32>) {
  // expected-error @+1 {{'mt.linear_weight_grad' op input 'tensor<2x8x16xf32>' and output_grad 'tensor<2x4x16xf32>' must agree on every dimension but the last}}
  %0 = mt.linear_weight_grad %x, %dy : (tensor<2x8x16xf32>, tensor<2x4x16xf32>) -> tensor<16x16xf32>
  return
}

// -----

func.func @linear_weight_grad_layout(%x: tensor<2x8x16xf32>, %dy: tensor<2x8x48xf32>) {
  // expected-error @+1 {{'mt.linear_weight_grad' op result type 'tensor<16x48xf32>' does not match the expected 'tensor<48x16xf32>'}}
  %0 = mt.linear_weight_grad %x, %dy transpose_weight : (tensor<2x8x16xf32>, tensor<2x8x48xf32>) -> tensor<16x48xf32>
  return
}

// -----

func.func @bias_grad_scalar(%dy: tensor<f32>) {
  // expected-error @+1 {{'mt.bias_grad' op output_grad must have rank >= 1, got 'tensor<f32>'}}
  %0 = mt.bias_grad %dy : tensor<f32> -> tensor<1xf32>
  return
}

// -----

func.func @bias_grad_result(%dy: tensor<2x8x16xf32>) {
  // expected-error @+1 {{'mt.bias_grad' op result type 'tensor<8xf32>' does not match the expected 'tensor<16xf32>'}}
  %0 = mt.bias_grad %dy : tensor<2x8x16xf32> -> tensor<8xf32>
  return
}

// -----

func.func @attention_grad_types(%do: tensor<2x8x4x8xf32>, %q: tensor<2x8x4x8xf32>, %kv: tensor<2x8x2x8xf32>) {
  // expected-error @+1 {{'mt.attention_grad' op key_grad type 'tensor<2x8x4x8xf32>' does not match the expected 'tensor<2x8x2x8xf32>'}}
  %0:3 = mt.attention_grad %do, %q, %kv, %kv causal : (tensor<2x8x4x8xf32>, tensor<2x8x4x8xf32>, tensor<2x8x2x8xf32>, tensor<2x8x2x8xf32>) -> (tensor<2x8x4x8xf32>, tensor<2x8x4x8xf32>, tensor<2x8x2x8xf32>)
  return
}

// -----

func.func @softmax_grad_axis(%dy: tensor<2x8xf32>) {
  // expected-error @+1 {{'mt.softmax_grad' op axis -3 is out of range for rank 2; expected a value in [-2, 2)}}
  %0 = mt.softmax_grad %dy, %dy axis = -3 : tensor<2x8xf32>
  return
}

// -----

func.func @cross_entropy_grad_loss(%dloss: tensor<2x8xf32>, %logits: tensor<2x8x64xf32>, %labels: tensor<2x8xi32>) {
  // expected-error @+1 {{'mt.cross_entropy_grad' op loss_grad type 'tensor<2x8xf32>' does not match the expected 'tensor<f32>'}}
  %0 = mt.cross_entropy_grad %dloss, %logits, %labels reduction = mean : (tensor<2x8xf32>, tensor<2x8x64xf32>, tensor<2x8xi32>) -> tensor<2x8x64xf32>
  return
}

// -----

func.func @accumulate_unknown(%g: tensor<4xf32>) {
  // expected-error @+1 {{'mt.accumulate_gradient' op @nowhere does not name an mt.parameter in scope}}
  mt.accumulate_gradient @nowhere, %g : tensor<4xf32>
  return
}

// -----

mt.parameter @w : tensor<4x4xf32> init = zeros
func.func @accumulate_type(%g: tensor<4xf32>) {
  // expected-error @+1 {{'mt.accumulate_gradient' op gradient type 'tensor<4xf32>' does not match the expected 'tensor<4x4xf32>'}}
  mt.accumulate_gradient @w, %g : tensor<4xf32>
  return
}

// -----

func.func @vocab_max_scalar(%logits: tensor<f32>) {
  // expected-error @+1 {{'mt.vocab_max' op logits need a vocabulary dimension, got 'tensor<f32>'}}
  %m = mt.vocab_max %logits : (tensor<f32>) -> tensor<f32>
  return
}

// -----

func.func @vocab_max_shape(%logits: tensor<2x8x32xf32>) {
  // expected-error @+1 {{'mt.vocab_max' op result type 'tensor<2x32xf32>' does not match the expected 'tensor<2x8xf32>'}}
  %m = mt.vocab_max %logits : (tensor<2x8x32xf32>) -> tensor<2x32xf32>
  return
}

// -----

func.func @vocab_partials_max(%logits: tensor<2x8x32xf32>, %labels: tensor<2x8xi32>, %m: tensor<2xf32>) {
  // expected-error @+1 {{'mt.vocab_partials' op max type 'tensor<2xf32>' does not match the expected 'tensor<2x8xf32>'}}
  %p = mt.vocab_partials %logits, %labels, %m : (tensor<2x8x32xf32>, tensor<2x8xi32>, tensor<2xf32>) -> tensor<2x8x2xf32>
  return
}

// -----

func.func @vocab_cross_entropy_partials(%p: tensor<2x8x3xf32>, %labels: tensor<2x8xi32>) {
  // expected-error @+1 {{'mt.vocab_cross_entropy' op partials must be [rows..., 2] (sum of exponentials, target logit), got 'tensor<2x8x3xf32>'}}
  %l = mt.vocab_cross_entropy %p, %labels reduction = mean : (tensor<2x8x3xf32>, tensor<2x8xi32>) -> tensor<f32>
  return
}

// -----

func.func @vocab_cross_entropy_grad_partials(%dloss: tensor<f32>, %logits: tensor<2x8x32xf32>, %labels: tensor<2x8xi32>, %m: tensor<2x8xf32>, %p: tensor<2x8xf32>) {
  // expected-error @+1 {{'mt.vocab_cross_entropy_grad' op partials type 'tensor<2x8xf32>' does not match the expected 'tensor<2x8x2xf32>'}}
  %g = mt.vocab_cross_entropy_grad %dloss, %logits, %labels, %m, %p reduction = mean : (tensor<f32>, tensor<2x8x32xf32>, tensor<2x8xi32>, tensor<2x8xf32>, tensor<2x8xf32>) -> tensor<2x8x32xf32>
  return
}
