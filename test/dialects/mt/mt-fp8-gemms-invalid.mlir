// RUN: megatron-opt %s -split-input-file -mt-fp8-gemms -verify-diagnostics

// mt-fp8-gemms refuses what it cannot make FP8: a module not typed bf16,
// and pipeline stages whose backward cannot read the scales its forward
// cast with: a forward without its backward, a backward with fewer
// arguments than its forward's stash and its seed, and a backward that
// casts with an activation's meta its forward never cast with.

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

// -----

module attributes {mt.fp8 = #mt.fp8_recipe<format = "hybrid", scaling = "delayed", amax_history_len = 1, amax_compute_algo = "max", margin = 0, bf16_layers_at_start = 0, bf16_layers_at_end = 0>, mt.model = #mt.model<name = "m", num_layers = 1, hidden_size = 8, num_attention_heads = 1, num_query_groups = 1, ffn_hidden_size = 32, seq_length = 4, vocab_size = 16, padded_vocab_size = 16, micro_batch_size = 1, global_batch_size = 1, tensor_model_parallel_size = 1, pipeline_model_parallel_size = 2, data_parallel_size = 1, precision = "bf16">} {
  func.func @train_step_stage0_forward(%x: tensor<1x4x8xbf16>) -> (tensor<1x4x8xbf16>, tensor<1x4x8xbf16> {mt.name = "stash"}) attributes {mt.pipeline_stage = 0 : i64} {
    return %x, %x : tensor<1x4x8xbf16>, tensor<1x4x8xbf16>
  }
  // expected-error @+1 {{takes 1 arguments, but its forward stashes 1 values, which with its seed need 2}}
  func.func @train_step_stage0_backward(%s: tensor<1x4x8xbf16> {mt.name = "stash"}) -> tensor<1x4x8xbf16> attributes {mt.pipeline_stage = 0 : i64} {
    return %s : tensor<1x4x8xbf16>
  }
}

// -----

module attributes {mt.fp8 = #mt.fp8_recipe<format = "hybrid", scaling = "delayed", amax_history_len = 1, amax_compute_algo = "max", margin = 0, bf16_layers_at_start = 0, bf16_layers_at_end = 0>, mt.model = #mt.model<name = "m", num_layers = 1, hidden_size = 8, num_attention_heads = 1, num_query_groups = 1, ffn_hidden_size = 32, seq_length = 4, vocab_size = 16, padded_vocab_size = 16, micro_batch_size = 1, global_batch_size = 1, tensor_model_parallel_size = 1, pipeline_model_parallel_size = 2, data_parallel_size = 1, precision = "bf16">} {
  mt.parameter @w : tensor<8x8xf32> init = zeros
  func.func @train_step_stage0_forward(%x: tensor<1x4x8xbf16>) -> (tensor<1x4x8xbf16>, tensor<1x4x8xbf16> {mt.name = "stash"}) attributes {mt.pipeline_stage = 0 : i64} {
    return %x, %x : tensor<1x4x8xbf16>, tensor<1x4x8xbf16>
  }
  // expected-error @+1 {{the FP8 meta 'w.fp8_input' is cast with in this backward function but not in its forward, so no scale of the micro-batch's forward pass is stashed for it}}
  func.func @train_step_stage0_backward(%s: tensor<1x4x8xbf16> {mt.name = "stash"}, %seed: tensor<1x4x8xbf16> {mt.name = "output_gradient"}) -> tensor<1x4x8xbf16> attributes {mt.pipeline_stage = 0 : i64} {
    %w = mt.get_parameter @w : tensor<8x8xf32>
    %wb = mt.cast %w : tensor<8x8xf32> to tensor<8x8xbf16>
    %y = mt.linear %s, %wb {mt.layer = #mt.layer<0>} : (tensor<1x4x8xbf16>, tensor<8x8xbf16>) -> tensor<1x4x8xbf16>
    return %y : tensor<1x4x8xbf16>
  }
}
