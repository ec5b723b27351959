// RUN: megatron-opt %s -split-input-file -mt-recompute=granularity=selective -verify-diagnostics

// A module without the function to recompute.
// expected-error @+1 {{mt-recompute: no function named 'train_step'; pass function=<name>}}
module {
  func.func @other() {
    return
  }
}

// -----

// A step function with several blocks.
// expected-error @+1 {{'func.func' op must have one block to be recomputed, it has 2}}
func.func @train_step(%loss: tensor<f32>) -> tensor<f32> {
  cf.br ^next
^next:
  return %loss : tensor<f32>
}

// -----

// The loss is an argument: there is no forward pass to recompute.
// expected-error @+1 {{'func.func' op must return a loss computed in its body to be recomputed (run mt-differentiate first)}}
func.func @train_step(%loss: tensor<f32>) -> tensor<f32> {
  return %loss : tensor<f32>
}
