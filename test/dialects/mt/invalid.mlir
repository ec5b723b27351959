// RUN: megatron-opt %s -split-input-file -verify-diagnostics

// Every diagnostic the mt dialect's verifiers can emit, one case each, with
// its full message.

// expected-error @+1 {{'mt.parameter' op init = normal needs a std, e.g. `std = 0.02`}}
mt.parameter @w : tensor<4x4xf32> init = normal

// -----

// expected-error @+1 {{'mt.parameter' op init = zeros takes no std, got std = 2.000000e-02}}
mt.parameter @b : tensor<4xf32> init = zeros std = 2.000000e-02

// -----

// expected-error @+1 {{'mt.parameter' op std must be positive, got -1.000000e+00}}
mt.parameter @w : tensor<4x4xf32> init = normal std = -1.0

// -----

// expected-error @+1 {{'mt.parameter' op expert_bias_update_rate must be a finite number > 0, got 0.000000e+00}}
mt.parameter @b : tensor<4xf32> init = zeros expert_bias_update_rate = 0.0

// -----

// expected-error @+1 {{'mt.parameter' op an expert bias (expert_bias_update_rate) is one value per expert, got 'tensor<4x4xf32>'}}
mt.parameter @b : tensor<4x4xf32> init = zeros expert_bias_update_rate = 1.0e-03

// -----

// expected-error @+1 {{'mt.parameter' op attribute 'type' failed to satisfy constraint: type attribute of statically shaped tensor of 16-bit float or bfloat16 type or 32-bit float or 64-bit float values}}
mt.parameter @w : tensor<?x4xf32> init = zeros

// -----

func.func @missing_parameter() -> tensor<4xf32> {
  // expected-error @+1 {{'mt.get_parameter' op @nowhere does not name an mt.parameter in scope}}
  %0 = mt.get_parameter @nowhere : tensor<4xf32>
  return %0 : tensor<4xf32>
}

// -----

mt.parameter @w : tensor<4x4xf32> init = zeros
func.func @parameter_type_mismatch() -> tensor<4x8xf32> {
  // expected-error @+1 {{'mt.get_parameter' op result type 'tensor<4x8xf32>' does not match the type of parameter @w, 'tensor<4x4xf32>'}}
  %0 = mt.get_parameter @w : tensor<4x8xf32>
  return %0 : tensor<4x8xf32>
}

// -----

func.func @embedding_table_rank(%t: tensor<64xf32>, %ids: tensor<2x8xi32>) {
  // expected-error @+1 {{'mt.embedding' op table must be rank 2 (vocabulary x hidden), got 'tensor<64xf32>'}}
  %0 = mt.embedding %t, %ids : (tensor<64xf32>, tensor<2x8xi32>) -> tensor<2x8x64xf32>
  return
}

// -----

func.func @embedding_result(%t: tensor<64x16xf32>, %ids: tensor<2x8xi32>) {
  // expected-error @+1 {{'mt.embedding' op result type 'tensor<2x8x64xf32>' does not match the expected 'tensor<2x8x16xf32>'}}
  %0 = mt.embedding %t, %ids : (tensor<64x16xf32>, tensor<2x8xi32>) -> tensor<2x8x64xf32>
  return
}

// -----

func.func @position_ids_rank() {
  // expected-error @+1 {{'mt.position_ids' op result must have a sequence dimension (rank >= 1), got 'tensor<i32>'}}
  %0 = mt.position_ids : tensor<i32>
  return
}

// -----

func.func @layer_norm_epsilon(%x: tensor<2x16xf32>, %w: tensor<16xf32>) {
  // expected-error @+1 {{'mt.layer_norm' op epsilon must be positive, got 0.000000e+00}}
  %0 = mt.layer_norm %x, %w epsilon = 0.0 : (tensor<2x16xf32>, tensor<16xf32>) -> tensor<2x16xf32>
  return
}

// -----

func.func @layer_norm_weight(%x: tensor<2x16xf32>, %w: tensor<8xf32>) {
  // expected-error @+1 {{'mt.layer_norm' op weight must be 'tensor<16xf32>' (the input's last dimension), got 'tensor<8xf32>'}}
  %0 = mt.layer_norm %x, %w epsilon = 1.0e-05 : (tensor<2x16xf32>, tensor<8xf32>) -> tensor<2x16xf32>
  return
}

// -----

func.func @layer_norm_bias(%x: tensor<2x16xf32>, %w: tensor<16xf32>, %b: tensor<2x16xf32>) {
  // expected-error @+1 {{'mt.layer_norm' op bias must be 'tensor<16xf32>' (the input's last dimension), got 'tensor<2x16xf32>'}}
  %0 = mt.layer_norm %x, %w, %b epsilon = 1.0e-05 : (tensor<2x16xf32>, tensor<16xf32>, tensor<2x16xf32>) -> tensor<2x16xf32>
  return
}

// -----

func.func @layer_norm_scalar(%x: tensor<f32>, %w: tensor<1xf32>) {
  // expected-error @+1 {{'mt.layer_norm' op input must have rank >= 1, got 'tensor<f32>'}}
  %0 = mt.layer_norm %x, %w epsilon = 1.0e-05 : (tensor<f32>, tensor<1xf32>) -> tensor<f32>
  return
}

// -----

func.func @rms_norm_element_types(%x: tensor<2x16xbf16>, %w: tensor<16xf64>) {
  // expected-error @+1 {{'mt.rms_norm' op input and weight must share one element type (or mix f32 with bf16 or f16), got 'bf16' and 'f64'}}
  %0 = mt.rms_norm %x, %w epsilon = 1.0e-06 : (tensor<2x16xbf16>, tensor<16xf64>) -> tensor<2x16xbf16>
  return
}

// -----

func.func @linear_scalar_input(%x: tensor<f32>, %w: tensor<1x4xf32>) {
  // expected-error @+1 {{'mt.linear' op input must have rank >= 1, got 'tensor<f32>'}}
  %0 = mt.linear %x, %w : (tensor<f32>, tensor<1x4xf32>) -> tensor<4xf32>
  return
}

// -----

func.func @linear_weight_rank(%x: tensor<2x16xf32>, %w: tensor<16xf32>) {
  // expected-error @+1 {{'mt.linear' op weight must be rank 2 (in x out), got 'tensor<16xf32>'}}
  %0 = mt.linear %x, %w : (tensor<2x16xf32>, tensor<16xf32>) -> tensor<2x16xf32>
  return
}

// -----

func.func @linear_transposed_weight_rank(%x: tensor<2x16xf32>, %w: tensor<16xf32>) {
  // expected-error @+1 {{'mt.linear' op weight must be rank 2 (out x in), got 'tensor<16xf32>'}}
  %0 = mt.linear %x, %w transpose_weight : (tensor<2x16xf32>, tensor<16xf32>) -> tensor<2x16xf32>
  return
}

// -----

func.func @linear_contraction(%x: tensor<2x16xf32>, %w: tensor<32x48xf32>) {
  // expected-error @+1 {{'mt.linear' op input's last dimension (16) must equal the weight's input dimension (32) of 'tensor<32x48xf32>' (in x out)}}
  %0 = mt.linear %x, %w : (tensor<2x16xf32>, tensor<32x48xf32>) -> tensor<2x48xf32>
  return
}

// -----

func.func @linear_contraction_transposed(%x: tensor<2x16xf32>, %w: tensor<16x48xf32>) {
  // expected-error @+1 {{'mt.linear' op input's last dimension (16) must equal the weight's input dimension (48) of 'tensor<16x48xf32>' (transposed, out x in)}}
  %0 = mt.linear %x, %w transpose_weight : (tensor<2x16xf32>, tensor<16x48xf32>) -> tensor<2x16xf32>
  return
}

// -----

func.func @linear_bias(%x: tensor<2x16xf32>, %w: tensor<16x48xf32>, %b: tensor<16xf32>) {
  // expected-error @+1 {{'mt.linear' op bias must be 'tensor<48xf32>' (the output dimension), got 'tensor<16xf32>'}}
  %0 = mt.linear %x, %w, %b : (tensor<2x16xf32>, tensor<16x48xf32>, tensor<16xf32>) -> tensor<2x48xf32>
  return
}

// -----

func.func @linear_element_types(%x: tensor<2x16xbf16>, %w: tensor<16x48xbf16>, %b: tensor<48xf16>) {
  // expected-error @+1 {{'mt.linear' op input and bias must share one element type (or mix f32 with bf16 or f16), got 'bf16' and 'f16'}}
  %0 = mt.linear %x, %w, %b : (tensor<2x16xbf16>, tensor<16x48xbf16>, tensor<48xf16>) -> tensor<2x48xbf16>
  return
}

// -----

func.func @linear_result(%x: tensor<2x16xf32>, %w: tensor<16x48xf32>) {
  // expected-error @+1 {{'mt.linear' op result type 'tensor<2x16xf32>' does not match the expected 'tensor<2x48xf32>'}}
  %0 = mt.linear %x, %w : (tensor<2x16xf32>, tensor<16x48xf32>) -> tensor<2x16xf32>
  return
}

// -----

func.func @bias_add_shape(%x: tensor<2x16xf32>, %b: tensor<8xf32>) {
  // expected-error @+1 {{'mt.bias_add' op bias must be 'tensor<16xf32>' (the input's last dimension), got 'tensor<8xf32>'}}
  %0 = mt.bias_add %x, %b : (tensor<2x16xf32>, tensor<8xf32>) -> tensor<2x16xf32>
  return
}

// -----

func.func @matmul_rank(%a: tensor<4xf32>, %b: tensor<4x4xf32>) {
  // expected-error @+1 {{'mt.matmul' op operands must have one rank >= 2, got 'tensor<4xf32>' and 'tensor<4x4xf32>'}}
  %0 = mt.matmul %a, %b : (tensor<4xf32>, tensor<4x4xf32>) -> tensor<4xf32>
  return
}

// -----

func.func @matmul_batch(%a: tensor<2x4x8xf32>, %b: tensor<3x8x4xf32>) {
  // expected-error @+1 {{'mt.matmul' op batch dimensions differ: 'tensor<2x4x8xf32>' and 'tensor<3x8x4xf32>'}}
  %0 = mt.matmul %a, %b : (tensor<2x4x8xf32>, tensor<3x8x4xf32>) -> tensor<2x4x4xf32>
  return
}

// -----

func.func @matmul_contraction(%a: tensor<4x8xf32>, %b: tensor<4x8xf32>) {
  // expected-error @+1 {{'mt.matmul' op contraction dimensions differ: lhs has 8, rhs has 4 (after transpose_lhs=0, transpose_rhs=0)}}
  %0 = mt.matmul %a, %b : (tensor<4x8xf32>, tensor<4x8xf32>) -> tensor<4x8xf32>
  return
}

// -----

func.func @matmul_element_types(%a: tensor<4x8xf32>, %b: tensor<8x4xf64>) {
  // expected-error @+1 {{'mt.matmul' op lhs and rhs must share one element type (or mix f32 with bf16 or f16), got 'f32' and 'f64'}}
  %0 = mt.matmul %a, %b : (tensor<4x8xf32>, tensor<8x4xf64>) -> tensor<4x4xf32>
  return
}

// -----

func.func @attention_rank(%q: tensor<2x8x32xf32>, %k: tensor<2x8x4x8xf32>, %v: tensor<2x8x4x8xf32>) {
  // expected-error @+1 {{'mt.attention' op query must be rank 4 (batch x sequence x heads x head_dim), got 'tensor<2x8x32xf32>'}}
  %0 = mt.attention %q, %k, %v : (tensor<2x8x32xf32>, tensor<2x8x4x8xf32>, tensor<2x8x4x8xf32>) -> tensor<2x8x4x8xf32>
  return
}

// -----

func.func @attention_key_value(%q: tensor<2x8x4x8xf32>, %k: tensor<2x8x4x8xf32>, %v: tensor<2x6x4x8xf32>) {
  // expected-error @+1 {{'mt.attention' op key and value must agree on batch, sequence and heads, got 'tensor<2x8x4x8xf32>' and 'tensor<2x6x4x8xf32>'}}
  %0 = mt.attention %q, %k, %v : (tensor<2x8x4x8xf32>, tensor<2x8x4x8xf32>, tensor<2x6x4x8xf32>) -> tensor<2x8x4x8xf32>
  return
}

// -----

func.func @attention_batch(%q: tensor<3x8x4x8xf32>, %k: tensor<2x8x4x8xf32>, %v: tensor<2x8x4x8xf32>) {
  // expected-error @+1 {{'mt.attention' op query batch (3) must equal key batch (2)}}
  %0 = mt.attention %q, %k, %v : (tensor<3x8x4x8xf32>, tensor<2x8x4x8xf32>, tensor<2x8x4x8xf32>) -> tensor<3x8x4x8xf32>
  return
}

// -----

func.func @attention_head_dim(%q: tensor<2x8x4x16xf32>, %k: tensor<2x8x4x8xf32>, %v: tensor<2x8x4x8xf32>) {
  // expected-error @+1 {{'mt.attention' op query head_dim (16) must equal key head_dim (8)}}
  %0 = mt.attention %q, %k, %v : (tensor<2x8x4x16xf32>, tensor<2x8x4x8xf32>, tensor<2x8x4x8xf32>) -> tensor<2x8x4x8xf32>
  return
}

// -----

func.func @attention_groups(%q: tensor<2x8x6x8xf32>, %k: tensor<2x8x4x8xf32>, %v: tensor<2x8x4x8xf32>) {
  // expected-error @+1 {{'mt.attention' op query heads (6) must be a multiple of key/value heads (4) for grouped-query attention}}
  %0 = mt.attention %q, %k, %v : (tensor<2x8x6x8xf32>, tensor<2x8x4x8xf32>, tensor<2x8x4x8xf32>) -> tensor<2x8x6x8xf32>
  return
}

// -----

func.func @attention_causal_lengths(%q: tensor<2x4x4x8xf32>, %k: tensor<2x8x4x8xf32>, %v: tensor<2x8x4x8xf32>) {
  // expected-error @+1 {{'mt.attention' op causal attention needs equal query and key sequence lengths, got 4 and 8}}
  %0 = mt.attention %q, %k, %v causal : (tensor<2x4x4x8xf32>, tensor<2x8x4x8xf32>, tensor<2x8x4x8xf32>) -> tensor<2x4x4x8xf32>
  return
}

// -----

func.func @attention_element_types(%q: tensor<2x8x4x8xbf16>, %k: tensor<2x8x4x8xf64>, %v: tensor<2x8x4x8xf64>) {
  // expected-error @+1 {{'mt.attention' op query and key must share one element type (or mix f32 with bf16 or f16), got 'bf16' and 'f64'}}
  %0 = mt.attention %q, %k, %v : (tensor<2x8x4x8xbf16>, tensor<2x8x4x8xf64>, tensor<2x8x4x8xf64>) -> tensor<2x8x4x8xbf16>
  return
}

// -----

func.func @attention_scale(%q: tensor<2x8x4x8xf32>) {
  // expected-error @+1 {{'mt.attention' op scale must be positive, got -1.000000e+00}}
  %0 = mt.attention %q, %q, %q causal {scale = -1.0 : f64} : (tensor<2x8x4x8xf32>, tensor<2x8x4x8xf32>, tensor<2x8x4x8xf32>) -> tensor<2x8x4x8xf32>
  return
}

// -----

func.func @attention_dropout(%q: tensor<2x8x4x8xf32>) {
  // expected-error @+1 {{'mt.attention' op dropout_p must be in [0, 1), got 1.000000e+00}}
  %0 = mt.attention %q, %q, %q causal {dropout_p = 1.0 : f64} : (tensor<2x8x4x8xf32>, tensor<2x8x4x8xf32>, tensor<2x8x4x8xf32>) -> tensor<2x8x4x8xf32>
  return
}

// -----

func.func @rope_rank(%x: tensor<8x4x8xf32>) {
  // expected-error @+1 {{'mt.rope' op input must be rank 4 (batch x sequence x heads x head_dim), got 'tensor<8x4x8xf32>'}}
  %0 = mt.rope %x base = 1.0e+04 : tensor<8x4x8xf32>
  return
}

// -----

func.func @rope_base(%x: tensor<2x8x4x8xf32>) {
  // expected-error @+1 {{'mt.rope' op base must be positive, got 0.000000e+00}}
  %0 = mt.rope %x base = 0.0 : tensor<2x8x4x8xf32>
  return
}

// -----

func.func @rope_odd_head_dim(%x: tensor<2x8x4x7xf32>) {
  // expected-error @+1 {{'mt.rope' op rotary_dim (7) must be even and in (0, head_dim = 7]}}
  %0 = mt.rope %x base = 1.0e+04 : tensor<2x8x4x7xf32>
  return
}

// -----

func.func @rope_rotary_dim(%x: tensor<2x8x4x8xf32>) {
  // expected-error @+1 {{'mt.rope' op rotary_dim (16) must be even and in (0, head_dim = 8]}}
  %0 = mt.rope %x base = 1.0e+04 {rotary_dim = 16 : i64} : tensor<2x8x4x8xf32>
  return
}

// -----

func.func @rope_scaling_factor(%x: tensor<2x8x4x8xf32>) {
  // expected-error @+1 {{'mt.rope' op scaling factors must be finite and positive, got 0.000000e+00}}
  %0 = mt.rope %x base = 1.0e+04 {scaling_factor = 0.0 : f64} : tensor<2x8x4x8xf32>
  return
}

// -----

func.func @rope_llama3_incomplete(%x: tensor<2x8x4x8xf32>) {
  // expected-error @+1 {{'mt.rope' op llama3 scaling needs scaling_factor, low_freq_factor, high_freq_factor and original_max_positions together}}
  %0 = mt.rope %x base = 1.0e+04 {scaling_factor = 8.0 : f64, low_freq_factor = 1.0 : f64} : tensor<2x8x4x8xf32>
  return
}

// -----

func.func @rope_llama3_inverted(%x: tensor<2x8x4x8xf32>) {
  // expected-error @+1 {{'mt.rope' op llama3 scaling needs high_freq_factor (1.000000e+00) above low_freq_factor (4.000000e+00) and a positive original_max_positions (8192)}}
  %0 = mt.rope %x base = 1.0e+04 {scaling_factor = 8.0 : f64, low_freq_factor = 4.0 : f64, high_freq_factor = 1.0 : f64, original_max_positions = 8192 : i64} : tensor<2x8x4x8xf32>
  return
}

// -----

func.func @rope_yarn_incomplete(%x: tensor<2x8x4x8xf32>) {
  // expected-error @+1 {{'mt.rope' op yarn scaling needs scaling_factor, original_max_positions, beta_fast and beta_slow together, without llama3's low_freq_factor and high_freq_factor}}
  %0 = mt.rope %x base = 1.0e+04 {scaling_factor = 4.0 : f64, beta_fast = 32.0 : f64, beta_slow = 1.0 : f64} : tensor<2x8x4x8xf32>
  return
}

// -----

func.func @rope_yarn_inverted(%x: tensor<2x8x4x8xf32>) {
  // expected-error @+1 {{'mt.rope' op yarn scaling needs beta_fast (1.000000e+00) above beta_slow (3.200000e+01) and a positive original_max_positions (4096)}}
  %0 = mt.rope %x base = 1.0e+04 {scaling_factor = 4.0 : f64, original_max_positions = 4096 : i64, beta_fast = 1.0 : f64, beta_slow = 32.0 : f64} : tensor<2x8x4x8xf32>
  return
}

// -----

func.func @rope_attention_factor(%x: tensor<2x8x4x8xf32>) {
  // expected-error @+1 {{'mt.rope' op beta_fast, beta_slow and attention_factor must be finite and positive, got -1.000000e+00}}
  %0 = mt.rope %x base = 1.0e+04 {attention_factor = -1.0 : f64} : tensor<2x8x4x8xf32>
  return
}

// -----

func.func @rope_truncate_alone(%x: tensor<2x8x4x8xf32>) {
  // expected-error @+1 {{'mt.rope' op truncate belongs to yarn scaling; it needs beta_fast and beta_slow}}
  %0 = mt.rope %x base = 1.0e+04 {truncate = false} : tensor<2x8x4x8xf32>
  return
}

// -----

func.func @dropout_p(%x: tensor<2x8xf32>) {
  // expected-error @+1 {{'mt.dropout' op p must be in [0, 1), got -1.000000e-01}}
  %0 = mt.dropout %x p = -0.1 seed = 0 : tensor<2x8xf32>
  return
}

// -----

func.func @add_types(%x: tensor<2x8xf32>, %y: tensor<2x4xf32>) {
  // expected-error @+1 {{'mt.add' op failed to verify that all of {lhs, rhs, result} have same type}}
  %0 = "mt.add"(%x, %y) : (tensor<2x8xf32>, tensor<2x4xf32>) -> tensor<2x8xf32>
  return
}

// -----

func.func @softmax_axis(%x: tensor<2x8xf32>) {
  // expected-error @+1 {{'mt.softmax' op axis 2 is out of range for rank 2; expected a value in [-2, 2)}}
  %0 = mt.softmax %x axis = 2 : tensor<2x8xf32>
  return
}

// -----

func.func @cross_entropy_labels(%logits: tensor<2x8x64xf32>, %labels: tensor<2x4xi32>) {
  // expected-error @+1 {{'mt.cross_entropy' op labels 'tensor<2x4xi32>' must have the logits' shape without its last (vocabulary) dimension; logits are 'tensor<2x8x64xf32>'}}
  %0 = mt.cross_entropy %logits, %labels reduction = mean : (tensor<2x8x64xf32>, tensor<2x4xi32>) -> tensor<f32>
  return
}

// -----

func.func @cross_entropy_result(%logits: tensor<2x8x64xf32>, %labels: tensor<2x8xi32>) {
  // expected-error @+1 {{'mt.cross_entropy' op result type 'tensor<2x8xf32>' does not match the expected 'tensor<f32>'}}
  %0 = mt.cross_entropy %logits, %labels reduction = mean : (tensor<2x8x64xf32>, tensor<2x8xi32>) -> tensor<2x8xf32>
  return
}

// -----

func.func @reshape_count(%x: tensor<2x8xf32>) {
  // expected-error @+1 {{'mt.reshape' op cannot reshape 'tensor<2x8xf32>' (16 elements) to 'tensor<3x5xf32>' (15 elements)}}
  %0 = mt.reshape %x : tensor<2x8xf32> -> tensor<3x5xf32>
  return
}

// -----

func.func @reshape_element_type(%x: tensor<2x8xf32>) {
  // expected-error @+1 {{'mt.reshape' op reshape keeps the element type, got 'f32' -> 'bf16'}}
  %0 = mt.reshape %x : tensor<2x8xf32> -> tensor<16xbf16>
  return
}

// -----

func.func @transpose_permutation(%x: tensor<2x3x4xf32>) {
  // expected-error @+1 {{'mt.transpose' op permutation [0, 0, 1] is not a permutation of [0, 3) for 'tensor<2x3x4xf32>'}}
  %0 = mt.transpose %x permutation = [0, 0, 1] : tensor<2x3x4xf32> -> tensor<2x2x3xf32>
  return
}

// -----

func.func @split_no_results(%x: tensor<2x8xf32>) {
  // expected-error @+1 {{'mt.split' op needs at least one result}}
  "mt.split"(%x) {axis = 1 : i64} : (tensor<2x8xf32>) -> ()
  return
}

// -----

func.func @split_axis(%x: tensor<2x8xf32>) {
  // expected-error @+1 {{'mt.split' op axis -3 is out of range for rank 2; expected a value in [-2, 2)}}
  %0, %1 = mt.split %x axis = -3 : tensor<2x8xf32> -> tensor<2x4xf32>, tensor<2x4xf32>
  return
}

// -----

func.func @split_other_dims(%x: tensor<2x8xf32>) {
  // expected-error @+1 {{'mt.split' op piece #1 'tensor<3x4xf32>' must match 'tensor<2x8xf32>' in element type, rank and every dimension but axis 1}}
  %0, %1 = mt.split %x axis = 1 : tensor<2x8xf32> -> tensor<2x4xf32>, tensor<3x4xf32>
  return
}

// -----

func.func @split_sizes(%x: tensor<2x8xf32>) {
  // expected-error @+1 {{'mt.split' op pieces add up to 6 along axis 1 but the input has 8}}
  %0, %1 = mt.split %x axis = 1 : tensor<2x8xf32> -> tensor<2x4xf32>, tensor<2x2xf32>
  return
}

// -----

func.func @concat_no_inputs() {
  // expected-error @+1 {{'mt.concat' op needs at least one input}}
  %0 = "mt.concat"() {axis = 0 : i64} : () -> tensor<2xf32>
  return
}

// -----

func.func @concat_result(%a: tensor<2x4xf32>, %b: tensor<2x4xf32>) {
  // expected-error @+1 {{'mt.concat' op result type 'tensor<2x4xf32>' does not match the expected 'tensor<2x8xf32>'}}
  %0 = mt.concat %a, %b axis = 1 : tensor<2x4xf32>, tensor<2x4xf32> -> tensor<2x4xf32>
  return
}

// -----

func.func @cast_to_itself(%x: tensor<2x16xf32>) {
  // expected-error @+1 {{'mt.cast' op converts 'f32' to itself; remove the cast}}
  %0 = mt.cast %x : tensor<2x16xf32> to tensor<2x16xf32>
  return
}

// -----

func.func @cast_f64(%x: tensor<2x16xf64>) {
  // expected-error @+1 {{'mt.cast' op converts 'f64' to 'bf16'; a cast joins f32 with bf16 or f16}}
  %0 = mt.cast %x : tensor<2x16xf64> to tensor<2x16xbf16>
  return
}

// -----

func.func @cast_shape(%x: tensor<2x16xf32>) {
  // expected-error @+1 {{'mt.cast' op requires the same shape for all operands and results}}
  %0 = mt.cast %x : tensor<2x16xf32> to tensor<2x8xbf16>
  return
}
