// RUN: megatron-opt %s | megatron-opt | FileCheck %s
// RUN: megatron-opt %s --mlir-print-op-generic | megatron-opt | FileCheck %s

// Round trip of the backward and state ops that mt-differentiate emits.

mt.parameter @w : tensor<16x48xf32> init = normal std = 2.000000e-02

// CHECK-LABEL: func.func @grads
func.func @grads(%dy: tensor<2x8x16xf32>, %x: tensor<2x8x16xf32>, %w: tensor<16xf32>, %ids: tensor<2x8xi32>) {
  // CHECK: mt.fill 1.000000e+00 : tensor<f32>
  %one = mt.fill 1.000000e+00 : tensor<f32>
  // CHECK: mt.embedding_grad %{{.+}}, %{{.+}} : (tensor<2x8x16xf32>, tensor<2x8xi32>) -> tensor<64x16xf32>
  %0 = mt.embedding_grad %dy, %ids : (tensor<2x8x16xf32>, tensor<2x8xi32>) -> tensor<64x16xf32>
  // CHECK: mt.layer_norm_grad %{{.+}}, %{{.+}}, %{{.+}} epsilon = 1.000000e-05 : (tensor<2x8x16xf32>, tensor<2x8x16xf32>, tensor<16xf32>) -> (tensor<2x8x16xf32>, tensor<16xf32>, tensor<16xf32>)
  %1:3 = mt.layer_norm_grad %dy, %x, %w epsilon = 1.000000e-05 : (tensor<2x8x16xf32>, tensor<2x8x16xf32>, tensor<16xf32>) -> (tensor<2x8x16xf32>, tensor<16xf32>, tensor<16xf32>)
  // CHECK: mt.layer_norm_grad %{{.+}}, %{{.+}}, %{{.+}} epsilon = 1.000000e-05 : (tensor<2x8x16xf32>, tensor<2x8x16xf32>, tensor<16xf32>) -> (tensor<2x8x16xf32>, tensor<16xf32>)
  %2:2 = mt.layer_norm_grad %dy, %x, %w epsilon = 1.000000e-05 : (tensor<2x8x16xf32>, tensor<2x8x16xf32>, tensor<16xf32>) -> (tensor<2x8x16xf32>, tensor<16xf32>)
  // CHECK: mt.rms_norm_grad %{{.+}}, %{{.+}}, %{{.+}} epsilon = 9.9999999999999995E-7
  %3:2 = mt.rms_norm_grad %dy, %x, %w epsilon = 1.000000e-06 : (tensor<2x8x16xf32>, tensor<2x8x16xf32>, tensor<16xf32>) -> (tensor<2x8x16xf32>, tensor<16xf32>)
  // CHECK: mt.linear_weight_grad %{{.+}}, %{{.+}} : (tensor<2x8x16xf32>, tensor<2x8x16xf32>) -> tensor<16x16xf32>
  %4 = mt.linear_weight_grad %x, %dy : (tensor<2x8x16xf32>, tensor<2x8x16xf32>) -> tensor<16x16xf32>
  // CHECK: mt.linear_weight_grad %{{.+}}, %{{.+}} transpose_weight : (tensor<2x8x16xf32>, tensor<2x8x16xf32>) -> tensor<16x16xf32>
  %5 = mt.linear_weight_grad %x, %dy transpose_weight : (tensor<2x8x16xf32>, tensor<2x8x16xf32>) -> tensor<16x16xf32>
  // CHECK: mt.bias_grad %{{.+}} : tensor<2x8x16xf32> -> tensor<16xf32>
  %6 = mt.bias_grad %dy : tensor<2x8x16xf32> -> tensor<16xf32>
  // CHECK: mt.gelu_grad %{{.+}}, %{{.+}} approximate = erf : tensor<2x8x16xf32>
  %7 = mt.gelu_grad %dy, %x approximate = erf : tensor<2x8x16xf32>
  // CHECK: mt.silu_grad %{{.+}}, %{{.+}} : tensor<2x8x16xf32>
  %8 = mt.silu_grad %dy, %x : tensor<2x8x16xf32>
  // CHECK: mt.swiglu_grad %{{.+}}, %{{.+}}, %{{.+}} : tensor<2x8x16xf32>
  %9:2 = mt.swiglu_grad %dy, %x, %x : tensor<2x8x16xf32>
  // CHECK: mt.softmax_grad %{{.+}}, %{{.+}} axis = -1 : tensor<2x8x16xf32>
  %10 = mt.softmax_grad %dy, %x axis = -1 : tensor<2x8x16xf32>
  return
}

// CHECK-LABEL: func.func @attention_and_loss
func.func @attention_and_loss(%do: tensor<2x8x4x8xf32>, %q: tensor<2x8x4x8xf32>, %kv: tensor<2x8x2x8xf32>, %logits: tensor<2x8x64xf32>, %labels: tensor<2x8xi32>, %dloss: tensor<f32>) {
  // CHECK: mt.attention_grad %{{.+}}, %{{.+}}, %{{.+}}, %{{.+}} causal {dropout_p = 1.000000e-01 : f64, seed = 5 : i64}
  %0:3 = mt.attention_grad %do, %q, %kv, %kv causal {dropout_p = 0.1 : f64, seed = 5 : i64} : (tensor<2x8x4x8xf32>, tensor<2x8x4x8xf32>, tensor<2x8x2x8xf32>, tensor<2x8x2x8xf32>) -> (tensor<2x8x4x8xf32>, tensor<2x8x2x8xf32>, tensor<2x8x2x8xf32>)
  // CHECK: mt.cross_entropy_grad %{{.+}}, %{{.+}}, %{{.+}} reduction = mean : (tensor<f32>, tensor<2x8x64xf32>, tensor<2x8xi32>) -> tensor<2x8x64xf32>
  %1 = mt.cross_entropy_grad %dloss, %logits, %labels reduction = mean : (tensor<f32>, tensor<2x8x64xf32>, tensor<2x8xi32>) -> tensor<2x8x64xf32>
  return
}

// CHECK-LABEL: func.func @accumulate
func.func @accumulate(%g: tensor<16x48xf32>) {
  // CHECK: mt.accumulate_gradient @w, %{{.+}} : tensor<16x48xf32>
  mt.accumulate_gradient @w, %g : tensor<16x48xf32>
  return
}

// The vocabulary-parallel cross-entropy's pieces (shard-partition writes
// them for vocabulary-split logits) and the vocabulary-split embedding.
// CHECK-LABEL: func.func @vocabulary_parallel
func.func @vocabulary_parallel(%logits: tensor<2x8x32xf32>, %labels: tensor<2x8xi32>, %dloss: tensor<f32>, %table: tensor<32x16xf32>, %dh: tensor<2x8x16xf32>) {
  // CHECK: %[[M:.+]] = mt.vocab_max %{{.+}} : (tensor<2x8x32xf32>) -> tensor<2x8xf32>
  %m = mt.vocab_max %logits : (tensor<2x8x32xf32>) -> tensor<2x8xf32>
  // CHECK: %[[P:.+]] = mt.vocab_partials %{{.+}}, %{{.+}}, %[[M]] {vocab_shard_axes = array<i64: 1>} : (tensor<2x8x32xf32>, tensor<2x8xi32>, tensor<2x8xf32>) -> tensor<2x8x2xf32>
  %p = mt.vocab_partials %logits, %labels, %m {vocab_shard_axes = array<i64: 1>} : (tensor<2x8x32xf32>, tensor<2x8xi32>, tensor<2x8xf32>) -> tensor<2x8x2xf32>
  // CHECK: mt.vocab_cross_entropy %[[P]], %{{.+}} reduction = none : (tensor<2x8x2xf32>, tensor<2x8xi32>) -> tensor<2x8xf32>
  %l = mt.vocab_cross_entropy %p, %labels reduction = none : (tensor<2x8x2xf32>, tensor<2x8xi32>) -> tensor<2x8xf32>
  // CHECK: mt.vocab_cross_entropy_grad %{{.+}}, %{{.+}}, %{{.+}}, %[[M]], %[[P]] reduction = mean {ignore_index = 0 : i64, vocab_shard_axes = array<i64: 1>} : (tensor<f32>, tensor<2x8x32xf32>, tensor<2x8xi32>, tensor<2x8xf32>, tensor<2x8x2xf32>) -> tensor<2x8x32xf32>
  %g = mt.vocab_cross_entropy_grad %dloss, %logits, %labels, %m, %p reduction = mean {ignore_index = 0 : i64, vocab_shard_axes = array<i64: 1>} : (tensor<f32>, tensor<2x8x32xf32>, tensor<2x8xi32>, tensor<2x8xf32>, tensor<2x8x2xf32>) -> tensor<2x8x32xf32>
  // CHECK: mt.embedding %{{.+}}, %{{.+}} {vocab_shard_axes = array<i64: 1>} : (tensor<32x16xf32>, tensor<2x8xi32>) -> tensor<2x8x16xf32>
  %h = mt.embedding %table, %labels {vocab_shard_axes = array<i64: 1>} : (tensor<32x16xf32>, tensor<2x8xi32>) -> tensor<2x8x16xf32>
  // CHECK: mt.embedding_grad %{{.+}}, %{{.+}} {vocab_shard_axes = array<i64: 1>} : (tensor<2x8x16xf32>, tensor<2x8xi32>) -> tensor<32x16xf32>
  %dt = mt.embedding_grad %dh, %labels {vocab_shard_axes = array<i64: 1>} : (tensor<2x8x16xf32>, tensor<2x8xi32>) -> tensor<32x16xf32>
  return
}
