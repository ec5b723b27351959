// RUN: megatron-opt %s | FileCheck %s

// megatron-opt loads the dialects the compiler builds on: mt, shard, func,
// arith, tensor, linalg and scf all parse and print.

// CHECK: shard.grid @grid(shape = 2)
shard.grid @grid(shape = 2)

// CHECK-LABEL: func.func @all_dialects
func.func @all_dialects(%a: tensor<4x8xf32>, %b: tensor<8x4xf32>) -> tensor<4x4xf32> {
  %c0 = arith.constant 0.0 : f32
  %e = tensor.empty() : tensor<4x4xf32>
  // CHECK: linalg.fill
  %z = linalg.fill ins(%c0 : f32) outs(%e : tensor<4x4xf32>) -> tensor<4x4xf32>
  // CHECK: linalg.matmul
  %m = linalg.matmul ins(%a, %b : tensor<4x8xf32>, tensor<8x4xf32>) outs(%z : tensor<4x4xf32>) -> tensor<4x4xf32>
  %lb = arith.constant 0 : index
  %ub = arith.constant 2 : index
  %step = arith.constant 1 : index
  // CHECK: scf.for
  %r = scf.for %i = %lb to %ub step %step iter_args(%acc = %m) -> tensor<4x4xf32> {
    // CHECK: mt.add
    %s = mt.add %acc, %m : tensor<4x4xf32>
    scf.yield %s : tensor<4x4xf32>
  }
  return %r : tensor<4x4xf32>
}
