// RUN: megatron-opt %s -split-input-file -verify-diagnostics

// Every diagnostic of the fused GEMM ops (MtFusedOps.td), one case each.

func.func @linear_gelu_pre_activation(%x: tensor<4x8xf32>, %w: tensor<8x16xf32>) {
  // expected-error @+1 {{'mt.linear_gelu' op pre_activation has type 'tensor<4x8xf32>', the fused linear layer gives 'tensor<4x16xf32>'}}
  %y, %h = mt.linear_gelu %x, %w approximate = tanh : (tensor<4x8xf32>, tensor<8x16xf32>) -> (tensor<4x16xf32>, tensor<4x8xf32>)
  return
}

// -----

func.func @linear_gelu_weight(%x: tensor<4x8xf32>, %w: tensor<16x8xf32>) {
  // expected-error @+1 {{'mt.linear_gelu' op input's last dimension (8) must equal the weight's input dimension (16)}}
  %y, %h = mt.linear_gelu %x, %w approximate = tanh : (tensor<4x8xf32>, tensor<16x8xf32>) -> (tensor<4x8xf32>, tensor<4x8xf32>)
  return
}

// -----

func.func @linear_gelu_grad_bias(%dy: tensor<4x16xf32>, %w: tensor<8x16xf32>, %h: tensor<4x8xf32>) {
  // expected-error @+1 {{'mt.linear_gelu_grad' op bias_grad has type 'tensor<16xf32>', the fused linear layer gives 'tensor<8xf32>'}}
  %dh, %db = mt.linear_gelu_grad %dy, %w, %h approximate = tanh transpose_weight : (tensor<4x16xf32>, tensor<8x16xf32>, tensor<4x8xf32>) -> (tensor<4x8xf32>, tensor<16xf32>)
  return
}

// -----

func.func @linear_weight_bias_grad_rows(%x: tensor<4x8xf32>, %dy: tensor<2x16xf32>) {
  // expected-error @+1 {{'mt.linear_weight_bias_grad' op input 'tensor<4x8xf32>' and output_grad 'tensor<2x16xf32>' must agree on every dimension but the last (fused weight gradient)}}
  %dw, %db = mt.linear_weight_bias_grad %x, %dy : (tensor<4x8xf32>, tensor<2x16xf32>) -> (tensor<8x16xf32>, tensor<16xf32>)
  return
}

// -----

func.func @linear_add_addend_shape(%x: tensor<4x8xf32>, %w: tensor<8x16xf32>, %r: tensor<4x8xf32>) {
  // expected-error @+1 {{'mt.linear_add' op addend has type 'tensor<4x8xf32>', the fused linear layer gives 'tensor<4x16xf32>'}}
  %y = mt.linear_add %x, %w, %r : (tensor<4x8xf32>, tensor<8x16xf32>, tensor<4x8xf32>) -> tensor<4x16xf32>
  return
}

// -----

func.func @linear_add_addend_type(%x: tensor<4x8xbf16>, %w: tensor<8x16xbf16>, %r: tensor<4x16xf32>) {
  // expected-error @+1 {{'mt.linear_add' op addend has type 'tensor<4x16xf32>', the result 'tensor<4x16xbf16>' (an add of one type)}}
  %y = mt.linear_add %x, %w, %r : (tensor<4x8xbf16>, tensor<8x16xbf16>, tensor<4x16xf32>) -> tensor<4x16xbf16>
  return
}
