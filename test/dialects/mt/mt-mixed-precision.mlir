// RUN: megatron-opt %s -split-input-file -mt-mixed-precision | FileCheck %s

// A bf16 MLP block and its backward: activations and their gradients bf16,
// the master weight cast before each GEMM that reads it, the bias, the
// weight and bias gradients and what accumulate_gradient reads f32, the
// function's arguments and results as declared.
module attributes {mt.model = #mt.model<name = "m", num_layers = 1, hidden_size = 16, num_attention_heads = 2, num_query_groups = 2, ffn_hidden_size = 32, seq_length = 8, vocab_size = 64, padded_vocab_size = 64, micro_batch_size = 2, global_batch_size = 2, tensor_model_parallel_size = 1, pipeline_model_parallel_size = 1, data_parallel_size = 1, precision = "bf16">} {
  mt.parameter @w : tensor<16x16xf32> init = normal std = 2.000000e-02
  mt.parameter @b : tensor<16xf32> init = zeros
  mt.parameter @g : tensor<16xf32> init = ones
  // CHECK-LABEL: func.func @case
  func.func @case(%x: tensor<2x8x16xf32>) -> tensor<2x8x16xf32> {
    // CHECK: %[[W:.+]] = mt.get_parameter @w : tensor<16x16xf32>
    %w = mt.get_parameter @w : tensor<16x16xf32>
    %b = mt.get_parameter @b : tensor<16xf32>
    %g = mt.get_parameter @g : tensor<16xf32>
    // The norm reads the f32 argument and writes bf16.
    // CHECK: %[[N:.+]] = mt.layer_norm %{{.+}}, %{{.+}} epsilon = {{.+}} : (tensor<2x8x16xf32>, tensor<16xf32>) -> tensor<2x8x16xbf16>
    %n = mt.layer_norm %x, %g epsilon = 1.0e-05 : (tensor<2x8x16xf32>, tensor<16xf32>) -> tensor<2x8x16xf32>
    // CHECK: %[[W16:.+]] = mt.cast %[[W]] : tensor<16x16xf32> to tensor<16x16xbf16>
    // CHECK: %[[H:.+]] = mt.linear %[[N]], %[[W16]], %{{.+}} : (tensor<2x8x16xbf16>, tensor<16x16xbf16>, tensor<16xf32>) -> tensor<2x8x16xbf16>
    %h = mt.linear %n, %w, %b : (tensor<2x8x16xf32>, tensor<16x16xf32>, tensor<16xf32>) -> tensor<2x8x16xf32>
    // CHECK: %[[A:.+]] = mt.gelu %[[H]] approximate = tanh : tensor<2x8x16xbf16>
    %a = mt.gelu %h approximate = tanh : tensor<2x8x16xf32>
    // The gradient of the GeLU from a seed of the result's type: bf16 too.
    // CHECK: %[[DA:.+]] = mt.gelu_grad %[[A]], %[[H]] approximate = tanh : tensor<2x8x16xbf16>
    %da = mt.gelu_grad %a, %h approximate = tanh : tensor<2x8x16xf32>
    // The weight gradient reads bf16 operands and is f32; so is the bias's.
    // CHECK: %[[DW:.+]] = mt.linear_weight_grad %[[N]], %[[DA]] : (tensor<2x8x16xbf16>, tensor<2x8x16xbf16>) -> tensor<16x16xf32>
    %dw = mt.linear_weight_grad %n, %da : (tensor<2x8x16xf32>, tensor<2x8x16xf32>) -> tensor<16x16xf32>
    // CHECK: mt.accumulate_gradient @w, %[[DW]] : tensor<16x16xf32>
    mt.accumulate_gradient @w, %dw : tensor<16x16xf32>
    // A second GEMM reading the weight casts it again, next to itself.
    // CHECK: %[[W16B:.+]] = mt.cast %[[W]] : tensor<16x16xf32> to tensor<16x16xbf16>
    // CHECK: %[[DX:.+]] = mt.linear %[[DA]], %[[W16B]] transpose_weight : (tensor<2x8x16xbf16>, tensor<16x16xbf16>) -> tensor<2x8x16xf32>
    %dx = mt.linear %da, %w transpose_weight : (tensor<2x8x16xf32>, tensor<16x16xf32>) -> tensor<2x8x16xf32>
    // CHECK: return %[[DX]] : tensor<2x8x16xf32>
    return %dx : tensor<2x8x16xf32>
  }
}

// -----

// An elementwise op holds its operands and result to one type: an add of a
// bf16 activation and the f32 argument stays f32, and so does the GeLU
// whose result it reads; a GEMM reading that f32 value casts it once for
// every GEMM that reads it.
module attributes {mt.model = #mt.model<name = "m", num_layers = 1, hidden_size = 16, num_attention_heads = 2, num_query_groups = 2, ffn_hidden_size = 32, seq_length = 8, vocab_size = 64, padded_vocab_size = 64, micro_batch_size = 2, global_batch_size = 2, tensor_model_parallel_size = 1, pipeline_model_parallel_size = 1, data_parallel_size = 1, precision = "bf16">} {
  // CHECK-LABEL: func.func @case
  func.func @case(%x: tensor<2x8x16xf32>, %w: tensor<16x16xf32>) -> tensor<2x8x16xf32> {
    // CHECK: %[[X16:.+]] = mt.cast %{{.+}} : tensor<2x8x16xf32> to tensor<2x8x16xbf16>
    // CHECK: %[[W16:.+]] = mt.cast %{{.+}} : tensor<16x16xf32> to tensor<16x16xbf16>
    // CHECK: %[[H:.+]] = mt.linear %[[X16]], %[[W16]] : (tensor<2x8x16xbf16>, tensor<16x16xbf16>) -> tensor<2x8x16xf32>
    %h = mt.linear %x, %w : (tensor<2x8x16xf32>, tensor<16x16xf32>) -> tensor<2x8x16xf32>
    // CHECK: mt.gelu %[[H]] approximate = tanh : tensor<2x8x16xf32>
    %a = mt.gelu %h approximate = tanh : tensor<2x8x16xf32>
    // CHECK: %[[S:.+]] = mt.add
    // CHECK-SAME: tensor<2x8x16xf32>
    %s = mt.add %a, %x : tensor<2x8x16xf32>
    // CHECK: %[[S16:.+]] = mt.cast %[[S]] : tensor<2x8x16xf32> to tensor<2x8x16xbf16>
    // CHECK: mt.linear %[[S16]], %{{.+}} : (tensor<2x8x16xbf16>, tensor<16x16xbf16>)
    // CHECK-NOT: mt.cast %[[S]]
    // CHECK: mt.linear %[[S16]], %{{.+}} : (tensor<2x8x16xbf16>, tensor<16x16xbf16>)
    %y = mt.linear %s, %w : (tensor<2x8x16xf32>, tensor<16x16xf32>) -> tensor<2x8x16xf32>
    %z = mt.linear %s, %w : (tensor<2x8x16xf32>, tensor<16x16xf32>) -> tensor<2x8x16xf32>
    %r = mt.add %y, %z : tensor<2x8x16xf32>
    return %r : tensor<2x8x16xf32>
  }
}

// -----

// Precision fp32 (and fp16): nothing changes.
module attributes {mt.model = #mt.model<name = "m", num_layers = 1, hidden_size = 16, num_attention_heads = 2, num_query_groups = 2, ffn_hidden_size = 32, seq_length = 8, vocab_size = 64, padded_vocab_size = 64, micro_batch_size = 2, global_batch_size = 2, tensor_model_parallel_size = 1, pipeline_model_parallel_size = 1, data_parallel_size = 1, precision = "fp16">} {
  // CHECK-LABEL: func.func @case
  func.func @case(%x: tensor<2x8x16xf32>, %w: tensor<16x16xf32>) -> tensor<2x8x16xf32> {
    // CHECK-NOT: mt.cast
    // CHECK: mt.linear %{{.+}}, %{{.+}} : (tensor<2x8x16xf32>, tensor<16x16xf32>) -> tensor<2x8x16xf32>
    %h = mt.linear %x, %w : (tensor<2x8x16xf32>, tensor<16x16xf32>) -> tensor<2x8x16xf32>
    %a = mt.gelu %h approximate = tanh : tensor<2x8x16xf32>
    return %a : tensor<2x8x16xf32>
  }
}
