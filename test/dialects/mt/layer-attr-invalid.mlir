// RUN: megatron-opt %s -split-input-file -verify-diagnostics

// The op attribute mt.layer (#mt.layer): a layer from 0 to the module's
// num_layers minus one, on the ops of a function only.

func.func @negative(%x: tensor<4xf32>) -> tensor<4xf32> {
  // expected-error @+1 {{#mt.layer: the layer is -1; expected 0 or more}}
  %y = mt.add %x, %x {mt.layer = #mt.layer<-1>} : tensor<4xf32>
  return %y : tensor<4xf32>
}

// -----

// A layer past the model's: num_layers 2 has layers 0 and 1.
module attributes {mt.model = #mt.model<name = "m", num_layers = 2, hidden_size = 128, num_attention_heads = 4, num_query_groups = 4, ffn_hidden_size = 512, seq_length = 128, vocab_size = 256, padded_vocab_size = 256, micro_batch_size = 8, global_batch_size = 8, tensor_model_parallel_size = 1, pipeline_model_parallel_size = 1, data_parallel_size = 1, precision = "fp32">} {
  func.func @past_the_model(%x: tensor<4xf32>) -> tensor<4xf32> {
    // expected-error @+1 {{'mt.layer' names layer 2, but the module's mt.model has num_layers 2 (layers 0 to 1)}}
    %y = mt.add %x, %x {mt.layer = #mt.layer<2, core_attention>} : tensor<4xf32>
    return %y : tensor<4xf32>
  }
}

// -----

func.func @not_a_layer(%x: tensor<4xf32>) -> tensor<4xf32> {
  // expected-error @+1 {{'mt.layer' must be a #mt.layer<...> attribute, not 3 : i64}}
  %y = mt.add %x, %x {mt.layer = 3} : tensor<4xf32>
  return %y : tensor<4xf32>
}

// -----

// expected-error @+1 {{'mt.layer' belongs on the ops of a layer, not on 'func.func'}}
func.func @on_a_function(%x: tensor<4xf32>) -> tensor<4xf32> attributes {mt.layer = #mt.layer<0>} {
  return %x : tensor<4xf32>
}

// -----

// expected-error @+1 {{'mt.layer' belongs on the ops of a layer, not on 'builtin.module'}}
module attributes {mt.layer = #mt.layer<0>} {
}

// -----

// expected-error @+1 {{'mt.layer' belongs on ops, not on argument 0 of 'func.func'}}
func.func @on_an_argument(%x: tensor<4xf32> {mt.layer = #mt.layer<0>}) -> tensor<4xf32> {
  return %x : tensor<4xf32>
}

// -----

// expected-error @+1 {{'mt.layer' belongs on ops, not on result 0 of 'func.func'}}
func.func @on_a_result(%x: tensor<4xf32>) -> (tensor<4xf32> {mt.layer = #mt.layer<0>}) {
  return %x : tensor<4xf32>
}

// -----

func.func @bad_keyword(%x: tensor<4xf32>) -> tensor<4xf32> {
  // expected-error @+1 {{expected 'core_attention'}}
  %y = mt.add %x, %x {mt.layer = #mt.layer<0, attention>} : tensor<4xf32>
  return %y : tensor<4xf32>
}
