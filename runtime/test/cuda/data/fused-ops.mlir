// The generated kernels' test bundle (CudaFusedTest): every op a fused group
// may hold, over 4099 elements (1024 float4 groups and a tail of 3), with
// several results. Written by bench/make-device-dir.sh:
//   megatron-translate --mlir-to-bundle fused-ops.mlir -o fused-ops.mtb
func.func @fused_ops(%a: tensor<4099xf32>, %b: tensor<4099xf32>, %c: tensor<4099xf32>)
    -> (tensor<4099xf32>, tensor<4099xf32>, tensor<4099xf32>, tensor<4099xf32>) {
  // The hidden dropout and residual add, then a product: the host's bits.
  %r:2 = mt.fused (%a, %b, %c) : (tensor<4099xf32>, tensor<4099xf32>, tensor<4099xf32>) -> (tensor<4099xf32>, tensor<4099xf32>) {
  ^bb0(%x: tensor<4099xf32>, %y: tensor<4099xf32>, %z: tensor<4099xf32>):
    %d = mt.dropout %x p = 1.000000e-01 seed = 7 : tensor<4099xf32>
    %s = mt.add %y, %d : tensor<4099xf32>
    %m = mt.mul %s, %z : tensor<4099xf32>
    mt.yield %s, %m : tensor<4099xf32>, tensor<4099xf32>
  }
  // Two dropouts (two stream keys), p = 0 (a copy), SiLU and SwiGLU.
  %t:2 = mt.fused (%a, %c) : (tensor<4099xf32>, tensor<4099xf32>) -> (tensor<4099xf32>, tensor<4099xf32>) {
  ^bb0(%x: tensor<4099xf32>, %z: tensor<4099xf32>):
    %e = mt.dropout %x p = 5.000000e-01 seed = 3 : tensor<4099xf32>
    %f = mt.dropout %e p = 2.500000e-01 seed = 4 : tensor<4099xf32>
    %g = mt.dropout %z p = 0.000000e+00 seed = 5 : tensor<4099xf32>
    %h = mt.silu %f : tensor<4099xf32>
    %k = mt.swiglu %h, %g : tensor<4099xf32>
    mt.yield %f, %k : tensor<4099xf32>, tensor<4099xf32>
  }
  return %r#0, %r#1, %t#0, %t#1 : tensor<4099xf32>, tensor<4099xf32>, tensor<4099xf32>, tensor<4099xf32>
}
// The storage types of the generated kernels (CudaFusedTest, in a bf16
// bundle): fp32 inputs and outputs, the values between groups held in bf16.
// Its dropouts have p = 0: the test reads it as a version 7 bundle (whose
// values the runtime types), and the runtime refuses a version 7 kernel's
// dropout.
func.func @fused_chain(%a: tensor<4099xf32>, %b: tensor<4099xf32>, %c: tensor<4099xf32>)
    -> (tensor<4099xf32>, tensor<4099xf32>) {
  // fp32 operands; a bf16 result (%r#0) beside an fp32 one (an output).
  %r:2 = mt.fused (%a, %b, %c) : (tensor<4099xf32>, tensor<4099xf32>, tensor<4099xf32>) -> (tensor<4099xf32>, tensor<4099xf32>) {
  ^bb0(%x: tensor<4099xf32>, %y: tensor<4099xf32>, %z: tensor<4099xf32>):
    %d = mt.dropout %x p = 0.000000e+00 seed = 7 : tensor<4099xf32>
    %s = mt.add %y, %d : tensor<4099xf32>
    %m = mt.mul %s, %z : tensor<4099xf32>
    mt.yield %s, %m : tensor<4099xf32>, tensor<4099xf32>
  }
  // A bf16 and an fp32 operand; bf16 results.
  %t:2 = mt.fused (%r#0, %c) : (tensor<4099xf32>, tensor<4099xf32>) -> (tensor<4099xf32>, tensor<4099xf32>) {
  ^bb0(%x: tensor<4099xf32>, %z: tensor<4099xf32>):
    %e = mt.dropout %x p = 0.000000e+00 seed = 3 : tensor<4099xf32>
    %h = mt.silu %e : tensor<4099xf32>
    %k = mt.swiglu %h, %z : tensor<4099xf32>
    mt.yield %e, %k : tensor<4099xf32>, tensor<4099xf32>
  }
  // bf16 operands only; an fp32 result.
  %u = mt.fused (%t#0, %t#1) : (tensor<4099xf32>, tensor<4099xf32>) -> tensor<4099xf32> {
  ^bb0(%x: tensor<4099xf32>, %y: tensor<4099xf32>):
    %v = mt.add %x, %y : tensor<4099xf32>
    %w = mt.mul %v, %x : tensor<4099xf32>
    mt.yield %w : tensor<4099xf32>
  }
  return %r#1, %u : tensor<4099xf32>, tensor<4099xf32>
}
// Whole samples (CudaFusedTest.GeneratedKernelsOnWholeSamples): [6, 40, 24]
// holds 960 elements a sample, so each pair of groups of eight is four
// draws' positions of one sample (mapped and keyed once); [5, 3, 8] holds
// 24, so its pairs fall back to groups of eight of two draws each, and its
// 15 groups leave an odd one.
func.func @fused_rows(%a: tensor<6x40x24xf32>, %b: tensor<6x40x24xf32>, %c: tensor<5x3x8xf32>, %d: tensor<5x3x8xf32>)
    -> (tensor<6x40x24xf32>, tensor<5x3x8xf32>) {
  %r = mt.fused (%a, %b) : (tensor<6x40x24xf32>, tensor<6x40x24xf32>) -> tensor<6x40x24xf32> {
  ^bb0(%x: tensor<6x40x24xf32>, %y: tensor<6x40x24xf32>):
    %e = mt.dropout %x p = 1.000000e-01 seed = 7 : tensor<6x40x24xf32>
    %s = mt.add %y, %e : tensor<6x40x24xf32>
    mt.yield %s : tensor<6x40x24xf32>
  }
  %t = mt.fused (%c, %d) : (tensor<5x3x8xf32>, tensor<5x3x8xf32>) -> tensor<5x3x8xf32> {
  ^bb0(%x: tensor<5x3x8xf32>, %y: tensor<5x3x8xf32>):
    %e = mt.dropout %x p = 3.000000e-01 seed = 9 : tensor<5x3x8xf32>
    %s = mt.add %y, %e : tensor<5x3x8xf32>
    mt.yield %s : tensor<5x3x8xf32>
  }
  return %r, %t : tensor<6x40x24xf32>, tensor<5x3x8xf32>
}
