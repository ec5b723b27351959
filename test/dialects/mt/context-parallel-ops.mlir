// RUN: megatron-opt %s | megatron-opt | FileCheck %s
// RUN: megatron-opt %s --mlir-print-op-generic | megatron-opt | FileCheck %s

// Round trip of ring attention's ops: a CP2 rank's queries (two chunks of 4
// positions, 8 query heads over 2 key/value heads) against one ring step's
// block and against the gathered keys, the merge, and the backward's delta
// and block gradients.

// CHECK-LABEL: func.func @ring_step
func.func @ring_step(%q: tensor<2x8x8x16xf32>, %k: tensor<2x8x2x16xf32>, %v: tensor<2x8x2x12xf32>, %o: tensor<2x8x8x12xf32>, %lse: tensor<2x8x8xf32>) -> (tensor<2x8x8x12xf32>, tensor<2x8x8xf32>) {
  // CHECK: %[[O:.+]], %[[L:.+]] = mt.attention_block %{{.+}}, %{{.+}}, %{{.+}} causal {context_axis = 1 : i64, context_size = 2 : i64, dropout_p = 1.000000e-01 : f64, key_step = 1 : i64, seed = 7 : i64} : (tensor<2x8x8x16xf32>, tensor<2x8x2x16xf32>, tensor<2x8x2x12xf32>) -> (tensor<2x8x8x12xf32>, tensor<2x8x8xf32>)
  %bo, %bl = mt.attention_block %q, %k, %v causal {context_axis = 1 : i64, context_size = 2 : i64, key_step = 1 : i64, dropout_p = 0.1 : f64, seed = 7 : i64} : (tensor<2x8x8x16xf32>, tensor<2x8x2x16xf32>, tensor<2x8x2x12xf32>) -> (tensor<2x8x8x12xf32>, tensor<2x8x8xf32>)
  // CHECK: mt.attention_merge %{{.+}}, %{{.+}}, %[[O]], %[[L]] : tensor<2x8x8x12xf32>, tensor<2x8x8xf32>
  %mo, %ml = mt.attention_merge %o, %lse, %bo, %bl : tensor<2x8x8x12xf32>, tensor<2x8x8xf32>
  return %mo, %ml : tensor<2x8x8x12xf32>, tensor<2x8x8xf32>
}

// CHECK-LABEL: func.func @gathered
func.func @gathered(%q: tensor<2x8x8x16xf32>, %k: tensor<2x16x2x16xf32>, %v: tensor<2x16x2x16xf32>) -> tensor<2x8x8x16xf32> {
  // CHECK: mt.attention_block %{{.+}}, %{{.+}}, %{{.+}} causal {context_axis = 0 : i64, context_size = 2 : i64} : (tensor<2x8x8x16xf32>, tensor<2x16x2x16xf32>, tensor<2x16x2x16xf32>) -> (tensor<2x8x8x16xf32>, tensor<2x8x8xf32>)
  %o, %l = mt.attention_block %q, %k, %v causal {context_axis = 0 : i64, context_size = 2 : i64} : (tensor<2x8x8x16xf32>, tensor<2x16x2x16xf32>, tensor<2x16x2x16xf32>) -> (tensor<2x8x8x16xf32>, tensor<2x8x8xf32>)
  return %o : tensor<2x8x8x16xf32>
}

// CHECK-LABEL: func.func @backward
func.func @backward(%do: tensor<2x8x8x12xf32>, %o: tensor<2x8x8x12xf32>, %q: tensor<2x8x8x16xf32>, %k: tensor<2x8x2x16xf32>, %v: tensor<2x8x2x12xf32>, %lse: tensor<2x8x8xf32>) -> (tensor<2x8x8x16xf32>, tensor<2x8x2x16xf32>, tensor<2x8x2x12xf32>) {
  // CHECK: %[[D:.+]] = mt.attention_delta %{{.+}}, %{{.+}} : tensor<2x8x8x12xf32> -> tensor<2x8x8xf32>
  %delta = mt.attention_delta %o, %do : tensor<2x8x8x12xf32> -> tensor<2x8x8xf32>
  // CHECK: mt.attention_block_grad %{{.+}}, %{{.+}}, %{{.+}}, %{{.+}}, %{{.+}}, %[[D]] causal {context_axis = 1 : i64, context_size = 2 : i64, key_step = 0 : i64, scale = 2.500000e-01 : f64} : (tensor<2x8x8x12xf32>, tensor<2x8x8x16xf32>, tensor<2x8x2x16xf32>, tensor<2x8x2x12xf32>, tensor<2x8x8xf32>, tensor<2x8x8xf32>) -> (tensor<2x8x8x16xf32>, tensor<2x8x2x16xf32>, tensor<2x8x2x12xf32>)
  %dq, %dk, %dv = mt.attention_block_grad %do, %q, %k, %v, %lse, %delta causal {context_axis = 1 : i64, context_size = 2 : i64, key_step = 0 : i64, scale = 0.25 : f64} : (tensor<2x8x8x12xf32>, tensor<2x8x8x16xf32>, tensor<2x8x2x16xf32>, tensor<2x8x2x12xf32>, tensor<2x8x8xf32>, tensor<2x8x8xf32>) -> (tensor<2x8x8x16xf32>, tensor<2x8x2x16xf32>, tensor<2x8x2x12xf32>)
  return %dq, %dk, %dv : tensor<2x8x8x16xf32>, tensor<2x8x2x16xf32>, tensor<2x8x2x12xf32>
}
