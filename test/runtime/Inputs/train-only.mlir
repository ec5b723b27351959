// A bundle with a train_step over [2, 4] tokens and no eval_step.
mt.parameter @t : tensor<256x8xf32> init = normal std = 1.000000e+00
func.func @train_step(%tokens: tensor<2x4xi32>, %labels: tensor<2x4xi32>) -> tensor<f32> {
  %t = mt.get_parameter @t : tensor<256x8xf32>
  %h = mt.embedding %t, %tokens : (tensor<256x8xf32>, tensor<2x4xi32>) -> tensor<2x4x8xf32>
  %loss = mt.cross_entropy %h, %labels reduction = mean : (tensor<2x4x8xf32>, tensor<2x4xi32>) -> tensor<f32>
  return %loss : tensor<f32>
}
