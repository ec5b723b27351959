// RUN: rm -f %t.mtb
// RUN: not megatron-translate --mlir-to-bundle %s -o %t.mtb 2>&1 | FileCheck %s
// RUN: test ! -e %t.mtb

// A module whose mt.model names pipeline parallelism is refused: the
// pipeline plan (the bundle's pipeline section) comes from megatron-compile,
// not from the IR, and no file is written.

// CHECK: error: cannot be written to a bundle: its mt.model names pipeline_model_parallel_size 2, but no pipeline plan is given; pipeline bundles come from megatron-compile
module attributes {mt.model = #mt.model<name = "m", num_layers = 2, hidden_size = 8, num_attention_heads = 1, num_query_groups = 1, ffn_hidden_size = 32, seq_length = 2, vocab_size = 16, padded_vocab_size = 16, micro_batch_size = 2, global_batch_size = 2, tensor_model_parallel_size = 1, pipeline_model_parallel_size = 2, data_parallel_size = 1, precision = "fp32">} {
  mt.parameter @w : tensor<8x16xf32> init = normal std = 2.000000e-02
  func.func @train_step(%x: tensor<2x8xf32>, %labels: tensor<2xi32>) -> tensor<f32> {
    %w = mt.get_parameter @w : tensor<8x16xf32>
    %y = mt.linear %x, %w : (tensor<2x8xf32>, tensor<8x16xf32>) -> tensor<2x16xf32>
    %loss = mt.cross_entropy %y, %labels reduction = mean : (tensor<2x16xf32>, tensor<2xi32>) -> tensor<f32>
    return %loss : tensor<f32>
  }
}
