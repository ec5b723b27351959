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

// -----

// A step without mt.layer attributes (not from the front end): nothing to
// segment by, so refused rather than left unrecomputed. Locations do not
// count, even when they name a layer.
mt.parameter @w : tensor<8x16xf32> init = normal std = 2.000000e-02
// expected-error @+1 {{has no op with a layer attribute (mt.layer = #mt.layer<i>), which recomputation segments by; the front end (megatron-compile --emit mlir) tags each layer's ops}}
func.func @train_step(%x: tensor<2x8xf32>, %labels: tensor<2xi32>) -> tensor<f32> {
  %w = mt.get_parameter @w : tensor<8x16xf32>
  %y = mt.linear %x, %w : (tensor<2x8xf32>, tensor<8x16xf32>) -> tensor<2x16xf32> loc("layers.0")
  %loss = mt.cross_entropy %y, %labels reduction = mean : (tensor<2x16xf32>, tensor<2xi32>) -> tensor<f32>
  return %loss : tensor<f32>
}
