// RUN: megatron-opt %s -mt-combine-all-reduces | FileCheck %s

// A sum of all-reduced partials becomes one all-reduce of the summed
// partials, also along a chain; all-reduces that something else reads, or
// that differ in axes, stay.

shard.grid @grid(shape = 2x2)

// CHECK-LABEL: func.func @chain
func.func @chain(%a: tensor<4xf32>, %b: tensor<4xf32>, %c: tensor<4xf32>) -> tensor<4xf32> {
  // CHECK: %[[AB:.+]] = mt.add %{{.+}}, %{{.+}} : tensor<4xf32>
  // CHECK: %[[ABC:.+]] = mt.add %[[AB]], %{{.+}} : tensor<4xf32>
  // CHECK: %[[R:.+]] = shard.all_reduce %[[ABC]] on @grid grid_axes = [1]
  // CHECK-NOT: shard.all_reduce
  // CHECK: return %[[R]]
  %ra = shard.all_reduce %a on @grid grid_axes = [1] : tensor<4xf32> -> tensor<4xf32>
  %rb = shard.all_reduce %b on @grid grid_axes = [1] : tensor<4xf32> -> tensor<4xf32>
  %rc = shard.all_reduce %c on @grid grid_axes = [1] : tensor<4xf32> -> tensor<4xf32>
  %s = mt.add %ra, %rb : tensor<4xf32>
  %t = mt.add %s, %rc : tensor<4xf32>
  return %t : tensor<4xf32>
}

// CHECK-LABEL: func.func @kept
func.func @kept(%a: tensor<4xf32>, %b: tensor<4xf32>) -> (tensor<4xf32>, tensor<4xf32>) {
  // CHECK-COUNT-2: shard.all_reduce
  // CHECK: mt.add
  %ra = shard.all_reduce %a on @grid grid_axes = [1] : tensor<4xf32> -> tensor<4xf32>
  %rb = shard.all_reduce %b on @grid grid_axes = [0] : tensor<4xf32> -> tensor<4xf32>
  %s = mt.add %ra, %rb : tensor<4xf32>
  return %s, %ra : tensor<4xf32>, tensor<4xf32>
}

// The combined ops stay in the layer of the add they replace.
// CHECK-LABEL: func.func @layer
func.func @layer(%a: tensor<4xf32>, %b: tensor<4xf32>) -> tensor<4xf32> {
  // CHECK: %[[S:.+]] = mt.add %{{.+}}, %{{.+}} {mt.layer = #mt.layer<1>} : tensor<4xf32>
  // CHECK: shard.all_reduce %[[S]] on @grid grid_axes = [1] {mt.layer = #mt.layer<1>}
  %ra = shard.all_reduce %a on @grid grid_axes = [1] {mt.layer = #mt.layer<1>} : tensor<4xf32> -> tensor<4xf32>
  %rb = shard.all_reduce %b on @grid grid_axes = [1] {mt.layer = #mt.layer<1>} : tensor<4xf32> -> tensor<4xf32>
  %s = mt.add %ra, %rb {mt.layer = #mt.layer<1>} : tensor<4xf32>
  return %s : tensor<4xf32>
}
