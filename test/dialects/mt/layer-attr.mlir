// RUN: megatron-opt %s | megatron-opt | FileCheck %s
// RUN: megatron-opt %s --mlir-print-op-generic | megatron-opt | FileCheck %s

// The op attribute mt.layer round-trips, with and without core_attention,
// and below the module's num_layers.

module attributes {mt.model = #mt.model<name = "m", num_layers = 2, hidden_size = 128, num_attention_heads = 4, num_query_groups = 4, ffn_hidden_size = 512, seq_length = 128, vocab_size = 256, padded_vocab_size = 256, micro_batch_size = 8, global_batch_size = 8, tensor_model_parallel_size = 1, pipeline_model_parallel_size = 1, data_parallel_size = 1, precision = "fp32">} {
  // CHECK-LABEL: func.func @tagged
  // CHECK: mt.add %{{.+}}, %{{.+}} {mt.layer = #mt.layer<0>} : tensor<4xf32>
  // CHECK: mt.add %{{.+}}, %{{.+}} {mt.layer = #mt.layer<1, core_attention>} : tensor<4xf32>
  func.func @tagged(%x: tensor<4xf32>) -> tensor<4xf32> {
    %y = mt.add %x, %x {mt.layer = #mt.layer<0>} : tensor<4xf32>
    %z = mt.add %y, %y {mt.layer = #mt.layer<1, core_attention>} : tensor<4xf32>
    return %z : tensor<4xf32>
  }
}
