// RUN: megatron-opt %s '-mt-recompute=granularity=full num-layers=0' -verify-diagnostics

// Full recomputation needs a positive number of layers per group.
// expected-error @+1 {{'func.func' op cannot be recomputed with num-layers 0; give a positive number of layers}}
func.func @train_step(%loss: tensor<f32>) -> tensor<f32> {
  return %loss : tensor<f32>
}
