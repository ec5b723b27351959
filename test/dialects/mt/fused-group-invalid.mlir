// RUN: megatron-opt %s -split-input-file -verify-diagnostics

func.func @block_arguments(%a: tensor<4xf32>) -> tensor<4xf32> {
  // expected-error @+1 {{has 2 block arguments for 1 operands; expected one per operand}}
  %r = mt.fused (%a) : (tensor<4xf32>) -> tensor<4xf32> {
  ^bb0(%x: tensor<4xf32>, %y: tensor<4xf32>):
    %s = mt.add %x, %y : tensor<4xf32>
    mt.yield %s : tensor<4xf32>
  }
  return %r : tensor<4xf32>
}

// -----

func.func @no_results(%a: tensor<4xf32>) {
  // expected-error @+1 {{has no results; a group writes at least one}}
  mt.fused (%a) : (tensor<4xf32>) -> () {
  ^bb0(%x: tensor<4xf32>):
    mt.yield
  }
  return
}

// -----

func.func @operand_type(%a: tensor<4xf32>, %b: tensor<8xf32>) -> tensor<4xf32> {
  // expected-error @+1 {{operand of type 'tensor<8xf32>' differs from its block argument or from the result type 'tensor<4xf32>'; every operand and result of a group has one type}}
  %r = mt.fused (%a, %b) : (tensor<4xf32>, tensor<8xf32>) -> tensor<4xf32> {
  ^bb0(%x: tensor<4xf32>, %y: tensor<8xf32>):
    mt.yield %x : tensor<4xf32>
  }
  return %r : tensor<4xf32>
}

// -----

func.func @result_types(%a: tensor<4xf32>) -> (tensor<4xf32>, tensor<4xf64>) {
  // expected-error @+1 {{yields 2 values whose types differ from its 2 results}}
  %r:2 = mt.fused (%a) : (tensor<4xf32>) -> (tensor<4xf32>, tensor<4xf64>) {
  ^bb0(%x: tensor<4xf32>):
    mt.yield %x, %x : tensor<4xf32>, tensor<4xf32>
  }
  return %r#0, %r#1 : tensor<4xf32>, tensor<4xf64>
}

// -----

func.func @yield_types(%a: tensor<4xf32>) -> tensor<4xf32> {
  // expected-error @+1 {{yields 2 values whose types differ from its 1 results}}
  %r = mt.fused (%a) : (tensor<4xf32>) -> tensor<4xf32> {
  ^bb0(%x: tensor<4xf32>):
    mt.yield %x, %x : tensor<4xf32>, tensor<4xf32>
  }
  return %r : tensor<4xf32>
}

// -----

func.func @not_elementwise(%a: tensor<4xf32>) -> tensor<4xf32> {
  // expected-error @+1 {{holds 'mt.gelu', which is not an elementwise op a fused kernel computes (add, mul, dropout without mt.split_axes, silu, swiglu) or a column sum of one (bias_grad)}}
  %r = mt.fused (%a) : (tensor<4xf32>) -> tensor<4xf32> {
  ^bb0(%x: tensor<4xf32>):
    %g = mt.gelu %x approximate = tanh : tensor<4xf32>
    mt.yield %g : tensor<4xf32>
  }
  return %r : tensor<4xf32>
}

// -----

func.func @sum_read_inside(%a: tensor<4x8xf32>) -> (tensor<4x8xf32>, tensor<8xf32>) {
  // expected-error@+1 {{'mt.fused' op reads a column sum ('mt.bias_grad') inside the group; it can only be yielded}}
  %r:2 = mt.fused(%a) : (tensor<4x8xf32>) -> (tensor<4x8xf32>, tensor<8xf32>) {
  ^bb0(%x: tensor<4x8xf32>):
    %s = mt.add %x, %x : tensor<4x8xf32>
    %c = mt.bias_grad %s : tensor<4x8xf32> -> tensor<8xf32>
    %d = mt.add %c, %c : tensor<8xf32>
    mt.yield %s, %c : tensor<4x8xf32>, tensor<8xf32>
  }
  return %r#0, %r#1 : tensor<4x8xf32>, tensor<8xf32>
}

// -----

func.func @only_sums(%a: tensor<4x8xf32>) -> tensor<8xf32> {
  // expected-error@+1 {{'mt.fused' op yields only column sums; a group writes at least one elementwise result}}
  %r = mt.fused(%a) : (tensor<4x8xf32>) -> tensor<8xf32> {
  ^bb0(%x: tensor<4x8xf32>):
    %s = mt.add %x, %x : tensor<4x8xf32>
    %c = mt.bias_grad %s : tensor<4x8xf32> -> tensor<8xf32>
    mt.yield %c : tensor<8xf32>
  }
  return %r : tensor<8xf32>
}
