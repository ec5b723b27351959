// RUN: megatron-opt %s -mt-print-collectives -o /dev/null | FileCheck %s

// Under context parallelism the grid is data x context x tensor: the ring's
// exchanges (shard.shift, here of a CP2 rank's keys and values) are counted
// as collectives on the context axis, with their bytes, apart from the
// tensor axis's (axis 2) and the data axis's.

// CHECK: grid 1 x 2 x 2 (data x context x tensor); bytes per rank and per call of each step
// CHECK-LABEL: ring:
// CHECK-NEXT: 1  shift          context      1x64x2x8xf32               4096
// CHECK-NEXT: 2  shift          context      1x64x2x8xf32               4096
// CHECK-NEXT: 3  all_reduce     tensor       1x64x16xf32                4096
// CHECK-NEXT: 4  all_gather     context      1x64x2x8xf32               4096
// CHECK-NEXT: context-parallel: 12288 bytes (the collectives over the context axis, the ring's shifts included)
// CHECK-NEXT: tensor-parallel: 4096 bytes

shard.grid @grid(shape = 1x2x2)

func.func @ring(%k: tensor<1x64x2x8xf32>, %v: tensor<1x64x2x8xf32>, %x: tensor<1x64x16xf32>) -> (tensor<1x64x2x8xf32>, tensor<1x64x2x8xf32>, tensor<1x64x16xf32>, tensor<1x128x2x8xf32>) {
  %k1 = shard.shift %k on @grid grid_axes = [1] shift_axis = 1 offset = 1 rotate : tensor<1x64x2x8xf32> -> tensor<1x64x2x8xf32>
  %v1 = shard.shift %v on @grid grid_axes = [1] shift_axis = 1 offset = 1 rotate : tensor<1x64x2x8xf32> -> tensor<1x64x2x8xf32>
  %s = shard.all_reduce %x on @grid grid_axes = [2] : tensor<1x64x16xf32> -> tensor<1x64x16xf32>
  %g = shard.all_gather %k on @grid grid_axes = [1] gather_axis = 1 : tensor<1x64x2x8xf32> -> tensor<1x128x2x8xf32>
  return %k1, %v1, %s, %g : tensor<1x64x2x8xf32>, tensor<1x64x2x8xf32>, tensor<1x64x16xf32>, tensor<1x128x2x8xf32>
}
