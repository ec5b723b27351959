// RUN: megatron-translate --mlir-to-bundle %s -o %t.mtb
// RUN: %python %S/check-bundle-header.py %t.mtb --attrs attention_block --attrs attention_block_grad --attrs shift | FileCheck %s
// RUN: mtrt-run %t.mtb --check-cuda-plan | FileCheck %s --check-prefix=READ

// Ring attention's instructions (docs/BundleFormat.md, "Context
// parallelism") as the writer writes them, for a CP2 rank: its own block
// (key_step 0), the next ring step's (keys and values passed on by
// shard.shift, the bundle's shift) and the gathered keys (no key_step),
// merged, then the backward's delta and block gradients; dropout_p and
// seed written out.
// The runtime's reader takes the bundle (the shapes, the context axis
// against the grid, the ring step).

// CHECK: grid [2]
// CHECK-NEXT: ring: {{.*}}, 4 collectives
// CHECK-NEXT: attention_block {"causal": true, "context_axis": 0, "context_size": 2, "dropout_p": 0.1, "key_step": 0, "seed": 7}
// CHECK-NEXT: shift {"grid_axes": [0], "offset": 1, "shift_axis": 0}
// CHECK-NEXT: shift {"grid_axes": [0], "offset": 1, "shift_axis": 0}
// CHECK-NEXT: attention_block {"causal": true, "context_axis": 0, "context_size": 2, "dropout_p": 0.1, "key_step": 1, "seed": 7}
// CHECK-NEXT: attention_block {"causal": true, "context_axis": 0, "context_size": 2, "dropout_p": 0, "seed": 0}
// CHECK-NEXT: attention_block_grad {"causal": true, "context_axis": 0, "context_size": 2, "dropout_p": 0.1, "key_step": 0, "seed": 7}

// READ: ring: the plan covers the CUDA backend

shard.grid @grid(shape = 2)

func.func @ring(%q: tensor<1x4x2x8xf32>, %k: tensor<1x4x1x8xf32>, %v: tensor<1x4x1x8xf32>, %do: tensor<1x4x2x8xf32>) -> (tensor<1x4x2x8xf32>, tensor<1x4x2x8xf32>) {
  %o0, %l0 = mt.attention_block %q, %k, %v causal {context_axis = 0 : i64, context_size = 2 : i64, key_step = 0 : i64, dropout_p = 0.1 : f64, seed = 7 : i64} : (tensor<1x4x2x8xf32>, tensor<1x4x1x8xf32>, tensor<1x4x1x8xf32>) -> (tensor<1x4x2x8xf32>, tensor<1x2x4xf32>)
  %k1 = shard.shift %k on @grid grid_axes = [0] shift_axis = 0 offset = 1 rotate : tensor<1x4x1x8xf32> -> tensor<1x4x1x8xf32>
  %v1 = shard.shift %v on @grid grid_axes = [0] shift_axis = 0 offset = 1 rotate : tensor<1x4x1x8xf32> -> tensor<1x4x1x8xf32>
  %o2, %l2 = mt.attention_block %q, %k1, %v1 causal {context_axis = 0 : i64, context_size = 2 : i64, key_step = 1 : i64, dropout_p = 0.1 : f64, seed = 7 : i64} : (tensor<1x4x2x8xf32>, tensor<1x4x1x8xf32>, tensor<1x4x1x8xf32>) -> (tensor<1x4x2x8xf32>, tensor<1x2x4xf32>)
  %oa, %la = mt.attention_merge %o0, %l0, %o2, %l2 : tensor<1x4x2x8xf32>, tensor<1x2x4xf32>
  %kg = shard.all_gather %k on @grid grid_axes = [0] gather_axis = 1 : tensor<1x4x1x8xf32> -> tensor<1x8x1x8xf32>
  %vg = shard.all_gather %v on @grid grid_axes = [0] gather_axis = 1 : tensor<1x4x1x8xf32> -> tensor<1x8x1x8xf32>
  %o1, %l1 = mt.attention_block %q, %kg, %vg causal {context_axis = 0 : i64, context_size = 2 : i64} : (tensor<1x4x2x8xf32>, tensor<1x8x1x8xf32>, tensor<1x8x1x8xf32>) -> (tensor<1x4x2x8xf32>, tensor<1x2x4xf32>)
  %o, %l = mt.attention_merge %oa, %la, %o1, %l1 : tensor<1x4x2x8xf32>, tensor<1x2x4xf32>
  %delta = mt.attention_delta %o, %do : tensor<1x4x2x8xf32> -> tensor<1x2x4xf32>
  %dq, %dk, %dv = mt.attention_block_grad %do, %q, %k, %v, %l, %delta causal {context_axis = 0 : i64, context_size = 2 : i64, key_step = 0 : i64, dropout_p = 0.1 : f64, seed = 7 : i64} : (tensor<1x4x2x8xf32>, tensor<1x4x2x8xf32>, tensor<1x4x1x8xf32>, tensor<1x4x1x8xf32>, tensor<1x2x4xf32>, tensor<1x2x4xf32>) -> (tensor<1x4x2x8xf32>, tensor<1x4x1x8xf32>, tensor<1x4x1x8xf32>)
  return %o, %dq : tensor<1x4x2x8xf32>, tensor<1x4x2x8xf32>
}
