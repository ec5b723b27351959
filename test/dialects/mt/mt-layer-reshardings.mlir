// RUN: megatron-opt %s -mt-layer-reshardings | FileCheck %s

// The reshardings shard-partition inserts take the layer of the op whose
// value they reshard, without core_attention; a chain passes it along; a
// resharding of an argument (no op) or of an untagged op stays untagged,
// and a tagged one keeps its own.

shard.grid @grid(shape = 2)

// CHECK-LABEL: func.func @reshardings
func.func @reshardings(%x: tensor<4x8xf32>) -> (tensor<4x8xf32>, tensor<8x8xf32>, tensor<8x8xf32>, tensor<8x8xf32>) {
  // CHECK: %[[Y:.+]] = mt.add {{.+}} {mt.layer = #mt.layer<3, core_attention>}
  %y = mt.add %x, %x {mt.layer = #mt.layer<3, core_attention>} : tensor<4x8xf32>
  // CHECK-NEXT: %[[G:.+]] = shard.all_gather %[[Y]] on @grid grid_axes = [0] gather_axis = 0 {mt.layer = #mt.layer<3>}
  %g = shard.all_gather %y on @grid grid_axes = [0] gather_axis = 0 : tensor<4x8xf32> -> tensor<8x8xf32>
  // CHECK-NEXT: shard.all_slice %[[G]] on @grid grid_axes = [0] slice_axis = 0 {mt.layer = #mt.layer<3>}
  %s = shard.all_slice %g on @grid grid_axes = [0] slice_axis = 0 : tensor<8x8xf32> -> tensor<4x8xf32>
  // CHECK-NEXT: shard.all_gather %arg0 on @grid grid_axes = [0] gather_axis = 0 : tensor<4x8xf32> -> tensor<8x8xf32>
  %a = shard.all_gather %x on @grid grid_axes = [0] gather_axis = 0 : tensor<4x8xf32> -> tensor<8x8xf32>
  // CHECK-NEXT: %[[U:.+]] = mt.add %arg0, %arg0 : tensor<4x8xf32>
  %u = mt.add %x, %x : tensor<4x8xf32>
  // CHECK-NEXT: shard.all_gather %[[U]] on @grid grid_axes = [0] gather_axis = 0 : tensor<4x8xf32> -> tensor<8x8xf32>
  %b = shard.all_gather %u on @grid grid_axes = [0] gather_axis = 0 : tensor<4x8xf32> -> tensor<8x8xf32>
  // CHECK-NEXT: shard.all_gather %[[Y]] on @grid grid_axes = [0] gather_axis = 0 {mt.layer = #mt.layer<1>}
  %c = shard.all_gather %y on @grid grid_axes = [0] gather_axis = 0 {mt.layer = #mt.layer<1>} : tensor<4x8xf32> -> tensor<8x8xf32>
  return %s, %a, %b, %c : tensor<4x8xf32>, tensor<8x8xf32>, tensor<8x8xf32>, tensor<8x8xf32>
}
