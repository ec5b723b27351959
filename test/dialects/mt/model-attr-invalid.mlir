// RUN: megatron-opt %s -split-input-file -verify-diagnostics

// The module attribute mt.model (#mt.model): its fields' limits, the same
// the runtime's manifest reader holds a model section to, and where it may
// appear.

// expected-error @+1 {{#mt.model: name is empty; give the model's name}}
module attributes {mt.model = #mt.model<name = "", num_layers = 2, hidden_size = 128, num_attention_heads = 4, num_query_groups = 4, ffn_hidden_size = 512, seq_length = 128, vocab_size = 256, padded_vocab_size = 256, micro_batch_size = 8, global_batch_size = 8, tensor_model_parallel_size = 1, pipeline_model_parallel_size = 1, data_parallel_size = 1, precision = "fp32">} {
}

// -----

// expected-error @+1 {{#mt.model: num_layers is -1; expected 0 or more}}
module attributes {mt.model = #mt.model<name = "m", num_layers = -1, hidden_size = 128, num_attention_heads = 4, num_query_groups = 4, ffn_hidden_size = 512, seq_length = 128, vocab_size = 256, padded_vocab_size = 256, micro_batch_size = 8, global_batch_size = 8, tensor_model_parallel_size = 1, pipeline_model_parallel_size = 1, data_parallel_size = 1, precision = "fp32">} {
}

// -----

// expected-error @+1 {{#mt.model: seq_length is 0; expected 1 or more}}
module attributes {mt.model = #mt.model<name = "m", num_layers = 2, hidden_size = 128, num_attention_heads = 4, num_query_groups = 4, ffn_hidden_size = 512, seq_length = 0, vocab_size = 256, padded_vocab_size = 256, micro_batch_size = 8, global_batch_size = 8, tensor_model_parallel_size = 1, pipeline_model_parallel_size = 1, data_parallel_size = 1, precision = "fp32">} {
}

// -----

// expected-error @+1 {{#mt.model: padded_vocab_size is 200; expected at least vocab_size (256)}}
module attributes {mt.model = #mt.model<name = "m", num_layers = 2, hidden_size = 128, num_attention_heads = 4, num_query_groups = 4, ffn_hidden_size = 512, seq_length = 128, vocab_size = 256, padded_vocab_size = 200, micro_batch_size = 8, global_batch_size = 8, tensor_model_parallel_size = 1, pipeline_model_parallel_size = 1, data_parallel_size = 1, precision = "fp32">} {
}

// -----

// expected-error @+1 {{#mt.model: global_batch_size is 12; expected a multiple of micro_batch_size * data_parallel_size (4 * 2)}}
module attributes {mt.model = #mt.model<name = "m", num_layers = 2, hidden_size = 128, num_attention_heads = 4, num_query_groups = 4, ffn_hidden_size = 512, seq_length = 128, vocab_size = 256, padded_vocab_size = 256, micro_batch_size = 4, global_batch_size = 12, tensor_model_parallel_size = 1, pipeline_model_parallel_size = 1, data_parallel_size = 2, precision = "fp32">} {
}

// -----

// expected-error @+1 {{#mt.model: precision is "fp8"; expected "fp32", "bf16" or "fp16"}}
module attributes {mt.model = #mt.model<name = "m", num_layers = 2, hidden_size = 128, num_attention_heads = 4, num_query_groups = 4, ffn_hidden_size = 512, seq_length = 128, vocab_size = 256, padded_vocab_size = 256, micro_batch_size = 8, global_batch_size = 8, tensor_model_parallel_size = 1, pipeline_model_parallel_size = 1, data_parallel_size = 1, precision = "fp8">} {
}

// -----

// expected-error @+1 {{'mt.model' must be a #mt.model<...> attribute, not "tiny-gpt"}}
module attributes {mt.model = "tiny-gpt"} {
}

// -----

module {
  // expected-error @+1 {{'mt.model' belongs on the builtin module, not on 'func.func'}}
  func.func @f() attributes {mt.model = #mt.model<name = "m", num_layers = 2, hidden_size = 128, num_attention_heads = 4, num_query_groups = 4, ffn_hidden_size = 512, seq_length = 128, vocab_size = 256, padded_vocab_size = 256, micro_batch_size = 8, global_batch_size = 8, tensor_model_parallel_size = 1, pipeline_model_parallel_size = 1, data_parallel_size = 1, precision = "fp32">} {
    return
  }
}
