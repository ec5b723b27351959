// RUN: megatron-opt %s | megatron-opt | FileCheck %s
// RUN: megatron-opt %s --mlir-print-op-generic | megatron-opt | FileCheck %s

// Round trip of every mt op in its custom form; the second RUN line goes
// through the generic form and back.

// CHECK: mt.parameter @transformer.wte.weight : tensor<64x16xf32> init = normal std = 2.000000e-02
mt.parameter @transformer.wte.weight : tensor<64x16xf32> init = normal std = 2.000000e-02
// CHECK: mt.parameter @transformer.ln_f.weight : tensor<16xf32> init = ones
mt.parameter @transformer.ln_f.weight : tensor<16xf32> init = ones
// CHECK: mt.parameter @transformer.ln_f.bias : tensor<16xf32> init = zeros
mt.parameter @transformer.ln_f.bias : tensor<16xf32> init = zeros
// CHECK: mt.parameter @model.layers.0.mlp.gate.e_score_correction_bias : tensor<8xf32> init = zeros expert_bias_update_rate = 1.000000e-03
mt.parameter @model.layers.0.mlp.gate.e_score_correction_bias : tensor<8xf32> init = zeros expert_bias_update_rate = 1.0e-03

// CHECK-LABEL: func.func @get_parameter
func.func @get_parameter() -> tensor<64x16xf32> {
  // CHECK: mt.get_parameter @transformer.wte.weight : tensor<64x16xf32>
  %0 = mt.get_parameter @transformer.wte.weight : tensor<64x16xf32>
  return %0 : tensor<64x16xf32>
}

// CHECK-LABEL: func.func @embedding_and_positions
func.func @embedding_and_positions(%table: tensor<64x16xbf16>, %ids: tensor<2x8xi32>) -> (tensor<2x8x16xbf16>, tensor<2x8xi64>) {
  // CHECK: mt.embedding %{{.+}}, %{{.+}} : (tensor<64x16xbf16>, tensor<2x8xi32>) -> tensor<2x8x16xbf16>
  %0 = mt.embedding %table, %ids : (tensor<64x16xbf16>, tensor<2x8xi32>) -> tensor<2x8x16xbf16>
  // CHECK: mt.position_ids : tensor<2x8xi64>
  %1 = mt.position_ids : tensor<2x8xi64>
  return %0, %1 : tensor<2x8x16xbf16>, tensor<2x8xi64>
}

// CHECK-LABEL: func.func @norms
func.func @norms(%x: tensor<2x8x16xf32>, %w: tensor<16xf32>, %b: tensor<16xf32>) -> (tensor<2x8x16xf32>, tensor<2x8x16xf32>, tensor<2x8x16xf32>) {
  // CHECK: mt.layer_norm %{{.+}}, %{{.+}}, %{{.+}} epsilon = 1.000000e-05 : (tensor<2x8x16xf32>, tensor<16xf32>, tensor<16xf32>) -> tensor<2x8x16xf32>
  %0 = mt.layer_norm %x, %w, %b epsilon = 1.000000e-05 : (tensor<2x8x16xf32>, tensor<16xf32>, tensor<16xf32>) -> tensor<2x8x16xf32>
  // CHECK: mt.layer_norm %{{.+}}, %{{.+}} epsilon = 1.000000e-05 : (tensor<2x8x16xf32>, tensor<16xf32>) -> tensor<2x8x16xf32>
  %1 = mt.layer_norm %x, %w epsilon = 1.000000e-05 : (tensor<2x8x16xf32>, tensor<16xf32>) -> tensor<2x8x16xf32>
  // CHECK: mt.rms_norm %{{.+}}, %{{.+}} epsilon = 9.9999999999999995E-7 : (tensor<2x8x16xf32>, tensor<16xf32>) -> tensor<2x8x16xf32>
  %2 = mt.rms_norm %x, %w epsilon = 1.0e-06 : (tensor<2x8x16xf32>, tensor<16xf32>) -> tensor<2x8x16xf32>
  return %0, %1, %2 : tensor<2x8x16xf32>, tensor<2x8x16xf32>, tensor<2x8x16xf32>
}

// CHECK-LABEL: func.func @linear_and_matmul
func.func @linear_and_matmul(%x: tensor<2x8x16xf32>, %w: tensor<16x48xf32>, %b: tensor<48xf32>, %wt: tensor<64x16xf32>, %q: tensor<2x4x8x4xf32>, %k: tensor<2x4x8x4xf32>) -> (tensor<2x8x48xf32>, tensor<2x8x64xf32>, tensor<2x4x8x8xf32>, tensor<2x4x4x4xf32>) {
  // CHECK: mt.linear %{{.+}}, %{{.+}}, %{{.+}} : (tensor<2x8x16xf32>, tensor<16x48xf32>, tensor<48xf32>) -> tensor<2x8x48xf32>
  %0 = mt.linear %x, %w, %b : (tensor<2x8x16xf32>, tensor<16x48xf32>, tensor<48xf32>) -> tensor<2x8x48xf32>
  // CHECK: mt.linear %{{.+}}, %{{.+}} transpose_weight : (tensor<2x8x16xf32>, tensor<64x16xf32>) -> tensor<2x8x64xf32>
  %1 = mt.linear %x, %wt transpose_weight : (tensor<2x8x16xf32>, tensor<64x16xf32>) -> tensor<2x8x64xf32>
  // CHECK: mt.bias_add %{{.+}}, %{{.+}} : (tensor<2x8x48xf32>, tensor<48xf32>) -> tensor<2x8x48xf32>
  %4 = mt.bias_add %0, %b : (tensor<2x8x48xf32>, tensor<48xf32>) -> tensor<2x8x48xf32>
  // CHECK: mt.matmul %{{.+}}, %{{.+}} transpose_rhs : (tensor<2x4x8x4xf32>, tensor<2x4x8x4xf32>) -> tensor<2x4x8x8xf32>
  %2 = mt.matmul %q, %k transpose_rhs : (tensor<2x4x8x4xf32>, tensor<2x4x8x4xf32>) -> tensor<2x4x8x8xf32>
  // CHECK: mt.matmul %{{.+}}, %{{.+}} transpose_lhs : (tensor<2x4x8x4xf32>, tensor<2x4x8x4xf32>) -> tensor<2x4x4x4xf32>
  %3 = mt.matmul %q, %k transpose_lhs : (tensor<2x4x8x4xf32>, tensor<2x4x8x4xf32>) -> tensor<2x4x4x4xf32>
  return %0, %1, %2, %3 : tensor<2x8x48xf32>, tensor<2x8x64xf32>, tensor<2x4x8x8xf32>, tensor<2x4x4x4xf32>
}

// CHECK-LABEL: func.func @attention
func.func @attention(%q: tensor<2x8x4x8xf32>, %k: tensor<2x8x2x8xf32>, %v: tensor<2x8x2x8xf32>) -> (tensor<2x8x4x8xf32>, tensor<2x8x4x8xf32>, tensor<2x8x4x8xf32>) {
  // CHECK: mt.attention %{{.+}}, %{{.+}}, %{{.+}} causal : (tensor<2x8x4x8xf32>, tensor<2x8x2x8xf32>, tensor<2x8x2x8xf32>) -> tensor<2x8x4x8xf32>
  %0 = mt.attention %q, %k, %v causal : (tensor<2x8x4x8xf32>, tensor<2x8x2x8xf32>, tensor<2x8x2x8xf32>) -> tensor<2x8x4x8xf32>
  // CHECK: mt.attention %{{.+}}, %{{.+}}, %{{.+}} causal {dropout_p = 1.000000e-01 : f64, scale = 1.250000e-01 : f64, seed = 7 : i64}
  %1 = mt.attention %q, %k, %v causal {scale = 0.125 : f64, dropout_p = 0.1 : f64, seed = 7 : i64} : (tensor<2x8x4x8xf32>, tensor<2x8x2x8xf32>, tensor<2x8x2x8xf32>) -> tensor<2x8x4x8xf32>
  // CHECK: mt.attention %{{.+}}, %{{.+}}, %{{.+}} : (
  %2 = mt.attention %q, %k, %v : (tensor<2x8x4x8xf32>, tensor<2x8x2x8xf32>, tensor<2x8x2x8xf32>) -> tensor<2x8x4x8xf32>
  return %0, %1, %2 : tensor<2x8x4x8xf32>, tensor<2x8x4x8xf32>, tensor<2x8x4x8xf32>
}

// CHECK-LABEL: func.func @rope
func.func @rope(%x: tensor<2x8x4x8xf32>) -> (tensor<2x8x4x8xf32>, tensor<2x8x4x8xf32>) {
  // CHECK: mt.rope %{{.+}} base = 1.000000e+04 : tensor<2x8x4x8xf32>
  %0 = mt.rope %x base = 1.000000e+04 : tensor<2x8x4x8xf32>
  // CHECK: mt.rope %{{.+}} base = 5.000000e+05 {rotary_dim = 4 : i64} : tensor<2x8x4x8xf32>
  %1 = mt.rope %x base = 5.000000e+05 {rotary_dim = 4 : i64} : tensor<2x8x4x8xf32>
  return %0, %1 : tensor<2x8x4x8xf32>, tensor<2x8x4x8xf32>
}

// Hugging Face's linear and llama3 scalings.
// CHECK-LABEL: func.func @rope_scaled
func.func @rope_scaled(%x: tensor<2x8x4x8xf32>) -> (tensor<2x8x4x8xf32>, tensor<2x8x4x8xf32>) {
  // CHECK: mt.rope %{{.+}} base = 1.000000e+04 {scaling_factor = 2.000000e+00 : f64} : tensor<2x8x4x8xf32>
  %0 = mt.rope %x base = 1.000000e+04 {scaling_factor = 2.0 : f64} : tensor<2x8x4x8xf32>
  // CHECK: mt.rope %{{.+}} base = 5.000000e+05 inverse {high_freq_factor = 4.000000e+00 : f64, low_freq_factor = 1.000000e+00 : f64, original_max_positions = 8192 : i64, scaling_factor = 8.000000e+00 : f64} : tensor<2x8x4x8xf32>
  %1 = mt.rope %x base = 5.000000e+05 inverse {scaling_factor = 8.0 : f64, low_freq_factor = 1.0 : f64, high_freq_factor = 4.0 : f64, original_max_positions = 8192 : i64} : tensor<2x8x4x8xf32>
  return %0, %1 : tensor<2x8x4x8xf32>, tensor<2x8x4x8xf32>
}

// YaRN: the ramp's rotations, truncate and the attention factor.
// CHECK-LABEL: func.func @rope_yarn
func.func @rope_yarn(%x: tensor<2x8x4x8xf32>) -> tensor<2x8x4x8xf32> {
  // CHECK: mt.rope %{{.+}} base = 1.000000e+04 inverse {attention_factor = 1.100000e+00 : f64, beta_fast = 3.200000e+01 : f64, beta_slow = 1.000000e+00 : f64, original_max_positions = 4096 : i64, scaling_factor = 4.000000e+00 : f64, truncate = false} : tensor<2x8x4x8xf32>
  %0 = mt.rope %x base = 1.000000e+04 inverse {scaling_factor = 4.0 : f64, original_max_positions = 4096 : i64, beta_fast = 32.0 : f64, beta_slow = 1.0 : f64, truncate = false, attention_factor = 1.1 : f64} : tensor<2x8x4x8xf32>
  return %0 : tensor<2x8x4x8xf32>
}

// CHECK-LABEL: func.func @activations
func.func @activations(%x: tensor<2x8x32xf16>, %y: tensor<2x8x32xf16>) -> (tensor<2x8x32xf16>, tensor<2x8x32xf16>, tensor<2x8x32xf16>, tensor<2x8x32xf16>) {
  // CHECK: mt.gelu %{{.+}} approximate = tanh : tensor<2x8x32xf16>
  %0 = mt.gelu %x approximate = tanh : tensor<2x8x32xf16>
  // CHECK: mt.gelu %{{.+}} approximate = erf : tensor<2x8x32xf16>
  %1 = mt.gelu %x approximate = erf : tensor<2x8x32xf16>
  // CHECK: mt.silu %{{.+}} : tensor<2x8x32xf16>
  %2 = mt.silu %x : tensor<2x8x32xf16>
  // CHECK: mt.swiglu %{{.+}}, %{{.+}} : tensor<2x8x32xf16>
  %3 = mt.swiglu %x, %y : tensor<2x8x32xf16>
  return %0, %1, %2, %3 : tensor<2x8x32xf16>, tensor<2x8x32xf16>, tensor<2x8x32xf16>, tensor<2x8x32xf16>
}

// CHECK-LABEL: func.func @elementwise
func.func @elementwise(%x: tensor<2x8x16xf64>, %y: tensor<2x8x16xf64>) -> (tensor<2x8x16xf64>, tensor<2x8x16xf64>, tensor<2x8x16xf64>, tensor<2x8x16xf64>) {
  // CHECK: mt.dropout %{{.+}} p = 1.000000e-01 seed = 3 : tensor<2x8x16xf64>
  %0 = mt.dropout %x p = 1.000000e-01 seed = 3 : tensor<2x8x16xf64>
  // CHECK: mt.add %{{.+}}, %{{.+}} : tensor<2x8x16xf64>
  %1 = mt.add %x, %y : tensor<2x8x16xf64>
  // CHECK: mt.mul %{{.+}}, %{{.+}} : tensor<2x8x16xf64>
  %2 = mt.mul %x, %y : tensor<2x8x16xf64>
  // CHECK: mt.softmax %{{.+}} axis = -1 : tensor<2x8x16xf64>
  %3 = mt.softmax %x axis = -1 : tensor<2x8x16xf64>
  return %0, %1, %2, %3 : tensor<2x8x16xf64>, tensor<2x8x16xf64>, tensor<2x8x16xf64>, tensor<2x8x16xf64>
}

// CHECK-LABEL: func.func @cross_entropy
func.func @cross_entropy(%logits: tensor<2x8x64xbf16>, %labels: tensor<2x8xi32>) -> (tensor<f32>, tensor<f32>, tensor<2x8xf32>) {
  // CHECK: mt.cross_entropy %{{.+}}, %{{.+}} reduction = mean : (tensor<2x8x64xbf16>, tensor<2x8xi32>) -> tensor<f32>
  %0 = mt.cross_entropy %logits, %labels reduction = mean : (tensor<2x8x64xbf16>, tensor<2x8xi32>) -> tensor<f32>
  // CHECK: mt.cross_entropy %{{.+}}, %{{.+}} reduction = sum {ignore_index = 0 : i64}
  %1 = mt.cross_entropy %logits, %labels reduction = sum {ignore_index = 0 : i64} : (tensor<2x8x64xbf16>, tensor<2x8xi32>) -> tensor<f32>
  // CHECK: mt.cross_entropy %{{.+}}, %{{.+}} reduction = none : (tensor<2x8x64xbf16>, tensor<2x8xi32>) -> tensor<2x8xf32>
  %2 = mt.cross_entropy %logits, %labels reduction = none : (tensor<2x8x64xbf16>, tensor<2x8xi32>) -> tensor<2x8xf32>
  return %0, %1, %2 : tensor<f32>, tensor<f32>, tensor<2x8xf32>
}

// CHECK-LABEL: func.func @shapes
func.func @shapes(%x: tensor<2x8x48xf32>) -> (tensor<2x8x4x12xf32>, tensor<2x4x8x12xf32>, tensor<2x8x48xf32>) {
  // CHECK: mt.reshape %{{.+}} : tensor<2x8x48xf32> -> tensor<2x8x4x12xf32>
  %0 = mt.reshape %x : tensor<2x8x48xf32> -> tensor<2x8x4x12xf32>
  // CHECK: mt.transpose %{{.+}} permutation = [0, 2, 1, 3] : tensor<2x8x4x12xf32> -> tensor<2x4x8x12xf32>
  %1 = mt.transpose %0 permutation = [0, 2, 1, 3] : tensor<2x8x4x12xf32> -> tensor<2x4x8x12xf32>
  // CHECK: mt.split %{{.+}} axis = 2 : tensor<2x8x48xf32> -> tensor<2x8x32xf32>, tensor<2x8x8xf32>, tensor<2x8x8xf32>
  %q, %k, %v = mt.split %x axis = 2 : tensor<2x8x48xf32> -> tensor<2x8x32xf32>, tensor<2x8x8xf32>, tensor<2x8x8xf32>
  // CHECK: mt.concat %{{.+}}, %{{.+}}, %{{.+}} axis = -1 : tensor<2x8x32xf32>, tensor<2x8x8xf32>, tensor<2x8x8xf32> -> tensor<2x8x48xf32>
  %2 = mt.concat %q, %k, %v axis = -1 : tensor<2x8x32xf32>, tensor<2x8x8xf32>, tensor<2x8x8xf32> -> tensor<2x8x48xf32>
  return %0, %1, %2 : tensor<2x8x4x12xf32>, tensor<2x4x8x12xf32>, tensor<2x8x48xf32>
}

// Mixed precision (mt-mixed-precision): casts, and ops that mix f32 with
// bf16 (a bf16 GEMM with an f32 bias; a norm's bf16 input with its f32
// weight; a weight gradient's f32 result from bf16 operands).
// CHECK-LABEL: func.func @mixed_precision
func.func @mixed_precision(%x: tensor<2x16xbf16>, %w: tensor<16x48xf32>, %b: tensor<48xf32>, %g: tensor<16xf32>) -> (tensor<2x48xbf16>, tensor<2x16xbf16>, tensor<16x48xf32>, tensor<2x48xf32>) {
  // CHECK: mt.cast %{{.+}} : tensor<16x48xf32> to tensor<16x48xbf16>
  %w16 = mt.cast %w : tensor<16x48xf32> to tensor<16x48xbf16>
  // CHECK: mt.linear %{{.+}}, %{{.+}}, %{{.+}} : (tensor<2x16xbf16>, tensor<16x48xbf16>, tensor<48xf32>) -> tensor<2x48xbf16>
  %y = mt.linear %x, %w16, %b : (tensor<2x16xbf16>, tensor<16x48xbf16>, tensor<48xf32>) -> tensor<2x48xbf16>
  // CHECK: mt.rms_norm %{{.+}}, %{{.+}} epsilon = {{.+}} : (tensor<2x16xbf16>, tensor<16xf32>) -> tensor<2x16xbf16>
  %n = mt.rms_norm %x, %g epsilon = 1.0e-06 : (tensor<2x16xbf16>, tensor<16xf32>) -> tensor<2x16xbf16>
  // CHECK: mt.linear_weight_grad %{{.+}}, %{{.+}} : (tensor<2x16xbf16>, tensor<2x48xbf16>) -> tensor<16x48xf32>
  %dw = mt.linear_weight_grad %x, %y : (tensor<2x16xbf16>, tensor<2x48xbf16>) -> tensor<16x48xf32>
  // CHECK: mt.cast %{{.+}} : tensor<2x48xbf16> to tensor<2x48xf32>
  %y32 = mt.cast %y : tensor<2x48xbf16> to tensor<2x48xf32>
  return %y, %n, %dw, %y32 : tensor<2x48xbf16>, tensor<2x16xbf16>, tensor<16x48xf32>, tensor<2x48xf32>
}
