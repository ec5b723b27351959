// An attention whose output an elementwise op reads last, before the
// gradient (held-attention-output.test): the op may not compute in place
// of the output, which the plan holds for the gradient.
module attributes {mt.model = #mt.model<name = "m", num_layers = 1, hidden_size = 64, num_attention_heads = 2, num_query_groups = 2, ffn_hidden_size = 256, seq_length = 64, vocab_size = 256, padded_vocab_size = 256, micro_batch_size = 2, global_batch_size = 2, tensor_model_parallel_size = 1, pipeline_model_parallel_size = 1, data_parallel_size = 1, precision = "bf16">} {
  func.func @held_output(%q: tensor<2x64x2x32xbf16>, %k: tensor<2x64x2x32xbf16>, %v: tensor<2x64x2x32xbf16>, %dy: tensor<2x64x2x32xbf16>) -> (tensor<2x64x2x32xbf16>, tensor<2x64x2x32xbf16>, tensor<2x64x2x32xbf16>, tensor<2x64x2x32xbf16>) {
    %o = mt.attention %q, %k, %v causal : (tensor<2x64x2x32xbf16>, tensor<2x64x2x32xbf16>, tensor<2x64x2x32xbf16>) -> tensor<2x64x2x32xbf16>
    %s = mt.mul %o, %dy : tensor<2x64x2x32xbf16>
    %t = mt.add %s, %q : tensor<2x64x2x32xbf16>
    %g:3 = mt.attention_grad %t, %q, %k, %v causal : (tensor<2x64x2x32xbf16>, tensor<2x64x2x32xbf16>, tensor<2x64x2x32xbf16>, tensor<2x64x2x32xbf16>) -> (tensor<2x64x2x32xbf16>, tensor<2x64x2x32xbf16>, tensor<2x64x2x32xbf16>)
    return %t, %g#0, %g#1, %g#2 : tensor<2x64x2x32xbf16>, tensor<2x64x2x32xbf16>, tensor<2x64x2x32xbf16>, tensor<2x64x2x32xbf16>
  }
}
