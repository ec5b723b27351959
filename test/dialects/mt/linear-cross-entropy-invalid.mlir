// RUN: megatron-opt %s -split-input-file -verify-diagnostics

// Every diagnostic of mt.linear_cross_entropy and mt.scale (MtFusedOps.td),
// one case each.

func.func @reduction_none(%x: tensor<4x8xf32>, %w: tensor<16x8xf32>, %l: tensor<4xi32>) {
  // expected-error @+1 {{'mt.linear_cross_entropy' op takes reduction mean or sum, not none: its gradients are computed for one scalar loss gradient (keep mt.linear and mt.cross_entropy for per-token losses)}}
  %loss, %dx, %dw = mt.linear_cross_entropy %x, %w, %l reduction = none chunk_rows = 2 transpose_weight : (tensor<4x8xf32>, tensor<16x8xf32>, tensor<4xi32>) -> (tensor<4xf32>, tensor<4x8xf32>, tensor<16x8xf32>)
  return
}

// -----

func.func @chunk_rows(%x: tensor<4x8xf32>, %w: tensor<16x8xf32>, %l: tensor<4xi32>) {
  // expected-error @+1 {{'mt.linear_cross_entropy' op chunk_rows is 0, expected at least 1 (tokens per chunk)}}
  %loss, %dx, %dw = mt.linear_cross_entropy %x, %w, %l reduction = mean chunk_rows = 0 transpose_weight : (tensor<4x8xf32>, tensor<16x8xf32>, tensor<4xi32>) -> (tensor<f32>, tensor<4x8xf32>, tensor<16x8xf32>)
  return
}

// -----

func.func @weight_grad(%x: tensor<4x8xf32>, %w: tensor<16x8xf32>, %l: tensor<4xi32>) {
  // expected-error @+1 {{'mt.linear_cross_entropy' op weight_grad has type 'tensor<8x16xf32>', the fused linear layer gives 'tensor<16x8xf32>'}}
  %loss, %dx, %dw = mt.linear_cross_entropy %x, %w, %l reduction = sum chunk_rows = 2 transpose_weight : (tensor<4x8xf32>, tensor<16x8xf32>, tensor<4xi32>) -> (tensor<f32>, tensor<4x8xf32>, tensor<8x16xf32>)
  return
}

// -----

func.func @weight_layout(%x: tensor<4x8xf32>, %w: tensor<16x8xf32>, %l: tensor<4xi32>) {
  // expected-error @+1 {{'mt.linear_cross_entropy' op input's last dimension (8) must equal the weight's input dimension (16)}}
  %loss, %dx, %dw = mt.linear_cross_entropy %x, %w, %l reduction = sum chunk_rows = 2 : (tensor<4x8xf32>, tensor<16x8xf32>, tensor<4xi32>) -> (tensor<f32>, tensor<4x8xf32>, tensor<16x8xf32>)
  return
}

// -----

func.func @scale_factor(%x: tensor<4x8xf32>, %s: tensor<1xf32>) {
  // expected-error @+1 {{'mt.scale' op factor has type 'tensor<1xf32>', expected a scalar tensor<f32>}}
  %y = mt.scale %x, %s : (tensor<4x8xf32>, tensor<1xf32>) -> tensor<4x8xf32>
  return
}

// -----

func.func @scale_result(%x: tensor<4x8xf32>, %s: tensor<f32>) {
  // expected-error @+1 {{'mt.scale' op result has type 'tensor<8x4xf32>', expected the input's shape 'tensor<4x8xf32>'}}
  %y = mt.scale %x, %s : (tensor<4x8xf32>, tensor<f32>) -> tensor<8x4xf32>
  return
}
