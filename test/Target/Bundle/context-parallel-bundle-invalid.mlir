// RUN: rm -f %t.mtb
// RUN: not megatron-translate --mlir-to-bundle %s -o %t.mtb 2>&1 | FileCheck %s
// RUN: test ! -e %t.mtb

// The bundle's shift is a rotation (docs/BundleFormat.md, "Context
// parallelism"): a shard.shift without `rotate` leaves the ranks at the end
// of the axis without a source, so it is refused, naming the fix, and no
// file is written.

shard.grid @grid(shape = 2)

func.func @train_step(%k: tensor<1x4x1x8xf32>) -> tensor<1x4x1x8xf32> {
  // CHECK: context-parallel-bundle-invalid.mlir:[[@LINE+1]]:9: error: cannot be written to a bundle: a shard.shift without `rotate` has no bundle form (the ranks without a source would read undefined values); add `rotate`
  %k1 = shard.shift %k on @grid grid_axes = [0] shift_axis = 0 offset = 1 : tensor<1x4x1x8xf32> -> tensor<1x4x1x8xf32>
  return %k1 : tensor<1x4x1x8xf32>
}
