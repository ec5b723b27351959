// RUN: megatron-opt %s -split-input-file -mt-fp8-gemms -verify-diagnostics

// mt-fp8-gemms refuses what it cannot make FP8: a module not typed bf16,
// and a pipeline stage's forward without its backward (whose casts read the
// scales the forward stashes).

// expected-error @+1 {{'mt.fp8' needs a module of precision bf16 (FP8 GEMMs inside bf16 training); this one is fp32}}
module attributes {mt.fp8 = #mt.fp8_recipe<format = "hybrid", scaling = "delayed", amax_history_len = 1, amax_compute_algo = "max", margin = 0, bf16_layers_at_start = 0, bf16_layers_at_end = 0>, mt.model = #mt.model<name = "m", num_layers = 1, hidden_size = 8, num_attention_heads = 1, num_query_groups = 1, ffn_hidden_size = 32, seq_length = 4, vocab_size = 16, padded_vocab_size = 16, micro_batch_size = 1, global_batch_size = 1, tensor_model_parallel_size = 1, pipeline_model_parallel_size = 1, data_parallel_size = 1, precision = "fp32">} {
}

// -----

module attributes {mt.fp8 = #mt.fp8_recipe<format = "hybrid", scaling = "delayed", amax_history_len = 1, amax_compute_algo = "max", margin = 0, bf16_layers_at_start = 0, bf16_layers_at_end = 0>, mt.model = #mt.model<name = "m", num_layers = 1, hidden_size = 8, num_attention_heads = 1, num_query_groups = 1, ffn_hidden_size = 32, seq_length = 4, vocab_size = 16, padded_vocab_size = 16, micro_batch_size = 1, global_batch_size = 1, tensor_model_parallel_size = 1, pipeline_model_parallel_size = 2, data_parallel_size = 1, precision = "bf16">} {
  // expected-error @+1 {{pipeline stage 0 has a forward function but no backward}}
  func.func @train_step_stage0_forward(%x: tensor<1x4x8xbf16>) -> tensor<1x4x8xbf16> attributes {mt.pipeline_stage = 0 : i64} {
    return %x : tensor<1x4x8xbf16>
  }
}
