// RUN: megatron-opt %s -split-input-file -verify-diagnostics

// Every diagnostic of the FP8 ops and of #mt.fp8_recipe, one case each.

// expected-error @+1 {{'mt.fp8_meta' op format 'f16' is not an FP8 format; expected f8E4M3FN or f8E5M2}}
mt.fp8_meta @x : f16

// -----

func.func @scale_of_nothing() -> tensor<f32> {
  // expected-error @+1 {{'mt.fp8_scale' op refers to @missing, which is not an mt.fp8_meta of the module}}
  %s = mt.fp8_scale @missing : tensor<f32>
  return %s : tensor<f32>
}

// -----

func.func @current_scale_margin(%x: tensor<4x8xbf16>) -> tensor<f32> {
  // expected-error @+1 {{'mt.fp8_current_scale' op margin is 65; expected 0 to 64}}
  %s = mt.fp8_current_scale %x {format = f8E4M3FN, margin = 65 : i64} : tensor<4x8xbf16> -> tensor<f32>
  return %s : tensor<f32>
}

// -----

func.func @quantize_shape(%x: tensor<4x8xbf16>, %s: tensor<f32>) {
  // expected-error @+1 {{'mt.fp8_quantize' op result 'tensor<8x4xf8E4M3FN>' must have the input's shape, 'tensor<4x8xbf16>'}}
  %q, %a = mt.fp8_quantize %x, %s : (tensor<4x8xbf16>, tensor<f32>) -> (tensor<8x4xf8E4M3FN>, tensor<f32>)
  return
}

// -----

func.func @linear_bias(%x: tensor<4x8xf8E4M3FN>, %w: tensor<8x16xf8E4M3FN>, %s: tensor<f32>, %b: tensor<16xbf16>) {
  // expected-error @+1 {{'mt.fp8_linear' op bias 'tensor<16xbf16>' must be f32 (the kernels add it in f32)}}
  %y = mt.fp8_linear %x scale %s, %w scale %s, %b : (tensor<4x8xf8E4M3FN>, tensor<f32>, tensor<8x16xf8E4M3FN>, tensor<f32>, tensor<16xbf16>) -> tensor<4x16xbf16>
  return
}

// -----

func.func @linear_result_type(%x: tensor<4x8xf8E4M3FN>, %w: tensor<8x16xf8E4M3FN>, %s: tensor<f32>) {
  // expected-error @+1 {{'mt.fp8_linear' op result 'tensor<4x16xf16>' must be bf16 or f32 (the FP8 GEMM's outputs)}}
  %y = mt.fp8_linear %x scale %s, %w scale %s : (tensor<4x8xf8E4M3FN>, tensor<f32>, tensor<8x16xf8E4M3FN>, tensor<f32>) -> tensor<4x16xf16>
  return
}

// -----

func.func @linear_result_shape(%x: tensor<4x8xf8E4M3FN>, %w: tensor<8x16xf8E4M3FN>, %s: tensor<f32>) {
  // expected-error @+1 {{'mt.fp8_linear' op result 'tensor<4x8xbf16>' must have shape 'tensor<4x16xf32>''s}}
  %y = mt.fp8_linear %x scale %s, %w scale %s : (tensor<4x8xf8E4M3FN>, tensor<f32>, tensor<8x16xf8E4M3FN>, tensor<f32>) -> tensor<4x8xbf16>
  return
}

// -----

func.func @linear_inner_dimension(%x: tensor<4x8xf8E4M3FN>, %w: tensor<16x8xf8E4M3FN>, %s: tensor<f32>) {
  // expected-error @+1 {{'mt.fp8_linear' op input's last dimension (8) must equal the weight's input dimension (16)}}
  %y = mt.fp8_linear %x scale %s, %w scale %s : (tensor<4x8xf8E4M3FN>, tensor<f32>, tensor<16x8xf8E4M3FN>, tensor<f32>) -> tensor<4x8xbf16>
  return
}

// -----

func.func @weight_grad_rows(%x: tensor<4x8xf8E4M3FN>, %dy: tensor<2x16xf8E5M2>, %s: tensor<f32>) {
  // expected-error @+1 {{'mt.fp8_linear_weight_grad' op input 'tensor<4x8xf8E4M3FN>' and output gradient 'tensor<2x16xf8E5M2>' must agree in every dimension but the last}}
  %dw = mt.fp8_linear_weight_grad %x scale %s, %dy scale %s : (tensor<4x8xf8E4M3FN>, tensor<f32>, tensor<2x16xf8E5M2>, tensor<f32>) -> tensor<8x16xf32>
  return
}

// -----

func.func @weight_grad_layout(%x: tensor<4x8xf8E4M3FN>, %dy: tensor<4x16xf8E5M2>, %s: tensor<f32>) {
  // expected-error @+1 {{'mt.fp8_linear_weight_grad' op result 'tensor<8x16xf32>' must be out x in: 16x8}}
  %dw = mt.fp8_linear_weight_grad %x scale %s, %dy scale %s transpose_weight : (tensor<4x8xf8E4M3FN>, tensor<f32>, tensor<4x16xf8E5M2>, tensor<f32>) -> tensor<8x16xf32>
  return
}

// -----

func.func @update_of_nothing(%a: tensor<f32>) {
  // expected-error @+1 {{'mt.fp8_update' op refers to @missing, which is not an mt.fp8_meta of the module}}
  mt.fp8_update @missing, %a : tensor<f32>
  return
}

// -----

// expected-error @+1 {{#mt.fp8_recipe: format is "e5m2"; expected "e4m3" or "hybrid"}}
module attributes {mt.fp8 = #mt.fp8_recipe<format = "e5m2", scaling = "delayed", amax_history_len = 1, amax_compute_algo = "max", margin = 0, bf16_layers_at_start = 0, bf16_layers_at_end = 0>} {
}

// -----

// expected-error @+1 {{#mt.fp8_recipe: scaling is "blockwise"; expected "delayed" or "tensorwise"}}
module attributes {mt.fp8 = #mt.fp8_recipe<format = "e4m3", scaling = "blockwise", amax_history_len = 1, amax_compute_algo = "max", margin = 0, bf16_layers_at_start = 0, bf16_layers_at_end = 0>} {
}

// -----

// expected-error @+1 {{#mt.fp8_recipe: amax_history_len is 0; expected 1 or more}}
module attributes {mt.fp8 = #mt.fp8_recipe<format = "e4m3", scaling = "delayed", amax_history_len = 0, amax_compute_algo = "max", margin = 0, bf16_layers_at_start = 0, bf16_layers_at_end = 0>} {
}

// -----

// expected-error @+1 {{#mt.fp8_recipe: amax_compute_algo is "mean"; expected "max" or "most_recent"}}
module attributes {mt.fp8 = #mt.fp8_recipe<format = "e4m3", scaling = "delayed", amax_history_len = 1, amax_compute_algo = "mean", margin = 0, bf16_layers_at_start = 0, bf16_layers_at_end = 0>} {
}

// -----

// expected-error @+1 {{#mt.fp8_recipe: margin is -1; expected 0 to 64}}
module attributes {mt.fp8 = #mt.fp8_recipe<format = "e4m3", scaling = "delayed", amax_history_len = 1, amax_compute_algo = "max", margin = -1, bf16_layers_at_start = 0, bf16_layers_at_end = 0>} {
}

// -----

// expected-error @+1 {{#mt.fp8_recipe: bf16 layers at the start and end are -1 and 0; expected 0 or more}}
module attributes {mt.fp8 = #mt.fp8_recipe<format = "e4m3", scaling = "delayed", amax_history_len = 1, amax_compute_algo = "max", margin = 0, bf16_layers_at_start = -1, bf16_layers_at_end = 0>} {
}

// -----

// expected-error @+1 {{'mt.fp8' must be a #mt.fp8_recipe<...> attribute, not 3 : i64}}
module attributes {mt.fp8 = 3} {
}

// -----

module {
  // expected-error @+1 {{'mt.fp8' belongs on the builtin module, not on 'func.func'}}
  func.func @f() attributes {mt.fp8 = #mt.fp8_recipe<format = "e4m3", scaling = "delayed", amax_history_len = 1, amax_compute_algo = "max", margin = 0, bf16_layers_at_start = 0, bf16_layers_at_end = 0>} {
    return
  }
}
