// RUN: rm -f %t.mtb
// RUN: not megatron-translate --mlir-to-bundle %s -o %t.mtb 2>&1 | FileCheck %s
// RUN: test ! -e %t.mtb

// The bundle's instructions are mt ops and shard's collectives: any other op
// is refused, naming it and where it is, and no file is written.

func.func @identity(%x: tensor<4xf32>) -> tensor<4xf32> {
  return %x : tensor<4xf32>
}

func.func @train_step(%x: tensor<4xf32>) -> tensor<4xf32> {
  // CHECK: mlir-to-bundle-invalid.mlir:[[@LINE+1]]:8: error: cannot be written to a bundle: the bundle's instructions are mt ops and the shard collectives; lower or remove this op first
  %y = func.call @identity(%x) : (tensor<4xf32>) -> tensor<4xf32>
  return %y : tensor<4xf32>
}
