// RUN: megatron-opt %s -split-input-file -mt-plan-gradient-reduction -verify-diagnostics

// Steps mt-plan-gradient-reduction cannot plan are rejected.

// A data-parallel gradient that nothing sums over the data axis would be
// reduced by no one.

shard.grid @grid(shape = 2x1)
mt.parameter @a : tensor<4xf32> init = zeros

// expected-error @+1 {{the gradient of @a is not summed over the data-parallel grid axis (axis 0 of size 2); every gradient of a data-parallel step must end in one shard.all_reduce over it, as shard-partition leaves them}}
func.func @train_step(%da: tensor<4xf32>) -> (tensor<4xf32> {mt.gradient = @a}) {
  %r = shard.all_reduce %da on @grid grid_axes = [1] : tensor<4xf32> -> tensor<4xf32>
  return %r : tensor<4xf32>
}

// -----

// expected-error @+1 {{no function @train_step to plan the gradient reduction of; name the training step with train-function=}}
module {
  shard.grid @grid(shape = 2x1)
}

// -----

shard.grid @grid(shape = 2x1)
mt.parameter @a : tensor<4xf32> init = zeros
mt.parameter @b : tensor<4xf64> init = zeros

// expected-error @+1 {{the gradient of @a is 'f32' but earlier ones are 'f64'; one gradient buffer holds one element type}}
func.func @train_step(%da: tensor<4xf32>, %db: tensor<4xf64>)
    -> (tensor<4xf32> {mt.gradient = @a}, tensor<4xf64> {mt.gradient = @b}) {
  %ra = shard.all_reduce %da on @grid grid_axes = [0] : tensor<4xf32> -> tensor<4xf32>
  %rb = shard.all_reduce %db on @grid grid_axes = [0] : tensor<4xf64> -> tensor<4xf64>
  return %ra, %rb : tensor<4xf32>, tensor<4xf64>
}
