// RUN: megatron-opt %s -split-input-file '-mt-plan-gradient-reduction=context-axis=1' -verify-diagnostics

// Under context parallelism a gradient summed over the data axis only
// would be summed again over the context ranks by the combined buffer.

shard.grid @grid(shape = 2x2x1)
mt.parameter @a : tensor<4xf32> init = zeros

// expected-error @+1 {{the gradient of @a is not summed over both the data-parallel and the context-parallel grid axes (axes 0 and 1, 2 x 2 ranks); every gradient of a context-parallel step must end in one shard.all_reduce over both (its rows are split over them), as shard-partition leaves them}}
func.func @train_step(%da: tensor<4xf32>) -> (tensor<4xf32> {mt.gradient = @a}) {
  %r = shard.all_reduce %da on @grid grid_axes = [0] : tensor<4xf32> -> tensor<4xf32>
  return %r : tensor<4xf32>
}
