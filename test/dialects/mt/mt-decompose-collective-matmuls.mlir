// RUN: megatron-opt %s -split-input-file -mt-decompose-collective-matmuls=chunks=2 | FileCheck %s

shard.grid @grid(shape = 1x2)

// A sequence-parallel all-gather before a column-parallel GEMM: the rank's
// 2 samples split in 2 chunks of whole samples, each gathered alone (chunk
// j holds sample j's rows of every rank, in order), the GEMM run per
// gathered chunk; its results are joined along the samples, and so is the
// gathered tensor for the weight gradient, which sums over the rows and is
// not cut. Every slice and join is a block of its whole (only dimensions
// of 1 before the axis), which the memory plan makes a view. The chunks'
// collectives carry mt.chunk, the splits and concats that slice and join
// them mt.chunk_copy (for --report overlap and the memory plan's views),
// and the GEMM chunks mt.whole_rows, the rows of the GEMM they were cut
// from (the CUDA backend runs them with its algorithm).
// CHECK-LABEL: func.func @gather_gemm
// CHECK-SAME: (%[[X:.+]]: tensor<2x4x8xf32>, %[[W:.+]]: tensor<8x16xf32>, %[[B:.+]]: tensor<16xf32>, %[[DY:.+]]: tensor<2x8x16xf32>)
// CHECK-NOT: shard.all_gather %[[X]]
// CHECK: %[[X0:.+]]:2 = mt.split %[[X]] axis = 0 {mt.chunk_copy, mt.layer_note} : tensor<2x4x8xf32> -> tensor<1x4x8xf32>, tensor<1x4x8xf32>
// CHECK-NEXT: %[[G0:.+]] = shard.all_gather %[[X0]]#0 on @grid grid_axes = [1] gather_axis = 1 {mt.chunk = array<i64: 0, 2>, mt.layer_note} : tensor<1x4x8xf32> -> tensor<1x8x8xf32>
// CHECK-NEXT: %[[G1:.+]] = shard.all_gather %[[X0]]#1 on @grid grid_axes = [1] gather_axis = 1 {mt.chunk = array<i64: 1, 2>, mt.layer_note} : tensor<1x4x8xf32> -> tensor<1x8x8xf32>
// CHECK-NEXT: %[[Y0:.+]] = mt.linear %[[G0]], %[[W]], %[[B]] {mt.whole_rows = 16 : i64} : (tensor<1x8x8xf32>, tensor<8x16xf32>, tensor<16xf32>) -> tensor<1x8x16xf32>
// CHECK-NEXT: %[[Y1:.+]] = mt.linear %[[G1]], %[[W]], %[[B]] {mt.whole_rows = 16 : i64} : (tensor<1x8x8xf32>, tensor<8x16xf32>, tensor<16xf32>) -> tensor<1x8x16xf32>
// CHECK-NEXT: %[[Y:.+]] = mt.concat %[[Y0]], %[[Y1]] axis = 0 {mt.chunk_copy} : tensor<1x8x16xf32>, tensor<1x8x16xf32> -> tensor<2x8x16xf32>
// CHECK-NEXT: %[[G:.+]] = mt.concat %[[G0]], %[[G1]] axis = 0 {mt.chunk_copy} : tensor<1x8x8xf32>, tensor<1x8x8xf32> -> tensor<2x8x8xf32>
// CHECK-NEXT: %[[DW:.+]] = mt.linear_weight_grad %[[G]], %[[DY]]
// CHECK-NEXT: return %[[Y]], %[[DW]]
func.func @gather_gemm(%x: tensor<2x4x8xf32>, %w: tensor<8x16xf32>, %b: tensor<16xf32>, %dy: tensor<2x8x16xf32>) -> (tensor<2x8x16xf32>, tensor<8x16xf32>) {
  %g = shard.all_gather %x on @grid grid_axes = [1] gather_axis = 1 {mt.layer_note} : tensor<2x4x8xf32> -> tensor<2x8x8xf32>
  %y = mt.linear %g, %w, %b : (tensor<2x8x8xf32>, tensor<8x16xf32>, tensor<16xf32>) -> tensor<2x8x16xf32>
  %dw = mt.linear_weight_grad %g, %dy : (tensor<2x8x8xf32>, tensor<2x8x16xf32>) -> tensor<8x16xf32>
  return %y, %dw : tensor<2x8x16xf32>, tensor<8x16xf32>
}

// -----

shard.grid @grid(shape = 1x2)

// A micro-batch of one sample: the rank's 4 rows split in 2 chunks along
// the sequence, each gathered alone ([rank 0's chunk j, rank 1's chunk j]),
// the GEMM run per gathered chunk; its result is put back in rank order
// (rank g's chunk j at rows g * 4 + j * 2) by copies, and so is the
// gathered tensor for the weight gradient.
// CHECK-LABEL: func.func @gather_gemm_one_sample
// CHECK-SAME: (%[[X:.+]]: tensor<1x4x8xf32>, %[[W:.+]]: tensor<8x16xf32>, %[[B:.+]]: tensor<16xf32>, %[[DY:.+]]: tensor<1x8x16xf32>)
// CHECK: %[[X0:.+]]:2 = mt.split %[[X]] axis = 1 {mt.chunk_copy} : tensor<1x4x8xf32> -> tensor<1x2x8xf32>, tensor<1x2x8xf32>
// CHECK-NEXT: %[[G0:.+]] = shard.all_gather %[[X0]]#0 on @grid grid_axes = [1] gather_axis = 1 {mt.chunk = array<i64: 0, 2>} : tensor<1x2x8xf32> -> tensor<1x4x8xf32>
// CHECK-NEXT: %[[G1:.+]] = shard.all_gather %[[X0]]#1 on @grid grid_axes = [1] gather_axis = 1 {mt.chunk = array<i64: 1, 2>} : tensor<1x2x8xf32> -> tensor<1x4x8xf32>
// CHECK-NEXT: %[[Y0:.+]] = mt.linear %[[G0]], %[[W]], %[[B]] {mt.whole_rows = 8 : i64} : (tensor<1x4x8xf32>, tensor<8x16xf32>, tensor<16xf32>) -> tensor<1x4x16xf32>
// CHECK-NEXT: %[[Y1:.+]] = mt.linear %[[G1]], %[[W]], %[[B]] {mt.whole_rows = 8 : i64} : (tensor<1x4x8xf32>, tensor<8x16xf32>, tensor<16xf32>) -> tensor<1x4x16xf32>
// CHECK-NEXT: %[[R0:.+]] = mt.reshape %[[Y0]] : tensor<1x4x16xf32> -> tensor<1x2x32xf32>
// CHECK-NEXT: %[[R1:.+]] = mt.reshape %[[Y1]] : tensor<1x4x16xf32> -> tensor<1x2x32xf32>
// CHECK-NEXT: %[[C:.+]] = mt.concat %[[R0]], %[[R1]] axis = 2 {mt.chunk_copy} : tensor<1x2x32xf32>, tensor<1x2x32xf32> -> tensor<1x2x64xf32>
// CHECK-NEXT: %[[Y:.+]] = mt.reshape %[[C]] : tensor<1x2x64xf32> -> tensor<1x8x16xf32>
// CHECK-NEXT: %[[S0:.+]] = mt.reshape %[[G0]] : tensor<1x4x8xf32> -> tensor<1x2x16xf32>
// CHECK-NEXT: %[[S1:.+]] = mt.reshape %[[G1]] : tensor<1x4x8xf32> -> tensor<1x2x16xf32>
// CHECK-NEXT: %[[SC:.+]] = mt.concat %[[S0]], %[[S1]] axis = 2 {mt.chunk_copy} : tensor<1x2x16xf32>, tensor<1x2x16xf32> -> tensor<1x2x32xf32>
// CHECK-NEXT: %[[G:.+]] = mt.reshape %[[SC]] : tensor<1x2x32xf32> -> tensor<1x8x8xf32>
// CHECK-NEXT: %[[DW:.+]] = mt.linear_weight_grad %[[G]], %[[DY]]
// CHECK-NEXT: return %[[Y]], %[[DW]]
func.func @gather_gemm_one_sample(%x: tensor<1x4x8xf32>, %w: tensor<8x16xf32>, %b: tensor<16xf32>, %dy: tensor<1x8x16xf32>) -> (tensor<1x8x16xf32>, tensor<8x16xf32>) {
  %g = shard.all_gather %x on @grid grid_axes = [1] gather_axis = 1 : tensor<1x4x8xf32> -> tensor<1x8x8xf32>
  %y = mt.linear %g, %w, %b : (tensor<1x8x8xf32>, tensor<8x16xf32>, tensor<16xf32>) -> tensor<1x8x16xf32>
  %dw = mt.linear_weight_grad %g, %dy : (tensor<1x8x8xf32>, tensor<1x8x16xf32>) -> tensor<8x16xf32>
  return %y, %dw : tensor<1x8x16xf32>, tensor<8x16xf32>
}

// -----

shard.grid @grid(shape = 1x2)

// The row-parallel layer's gathered output gradient read by its data
// gradient fused with GeLU's: the pre-activation is cut like the gathered
// rows (whole samples); the bias gradient, a sum over every row, is taken
// from the whole input gradient after (what the fused op computes).
// CHECK-LABEL: func.func @gather_gelu_grad
// CHECK-SAME: (%[[DY:.+]]: tensor<2x4x8xf32>, %[[W:.+]]: tensor<16x8xf32>, %[[H:.+]]: tensor<2x8x16xf32>)
// CHECK: %[[D:.+]]:2 = mt.split %[[DY]] axis = 0
// CHECK-NEXT: %[[G0:.+]] = shard.all_gather %[[D]]#0 {{.+}} {mt.chunk = array<i64: 0, 2>}
// CHECK-NEXT: %[[G1:.+]] = shard.all_gather %[[D]]#1 {{.+}} {mt.chunk = array<i64: 1, 2>}
// CHECK-NEXT: %[[HS:.+]]:2 = mt.split %[[H]] axis = 0 {mt.chunk_copy} : tensor<2x8x16xf32> -> tensor<1x8x16xf32>, tensor<1x8x16xf32>
// CHECK-NEXT: %[[DH0:.+]] = mt.linear_gelu_grad %[[G0]], %[[W]], %[[HS]]#0 approximate = tanh transpose_weight {mt.whole_rows = 16 : i64} : (tensor<1x8x8xf32>, tensor<16x8xf32>, tensor<1x8x16xf32>) -> tensor<1x8x16xf32>
// CHECK-NEXT: %[[DH1:.+]] = mt.linear_gelu_grad %[[G1]], %[[W]], %[[HS]]#1 approximate = tanh transpose_weight
// CHECK-NEXT: %[[DH:.+]] = mt.concat %[[DH0]], %[[DH1]] axis = 0 {mt.chunk_copy} : tensor<1x8x16xf32>, tensor<1x8x16xf32> -> tensor<2x8x16xf32>
// CHECK-NEXT: %[[DB:.+]] = mt.bias_grad %[[DH]] : tensor<2x8x16xf32> -> tensor<16xf32>
// CHECK-NEXT: return %[[DH]], %[[DB]]
func.func @gather_gelu_grad(%dy: tensor<2x4x8xf32>, %w: tensor<16x8xf32>, %h: tensor<2x8x16xf32>) -> (tensor<2x8x16xf32>, tensor<16xf32>) {
  %g = shard.all_gather %dy on @grid grid_axes = [1] gather_axis = 1 : tensor<2x4x8xf32> -> tensor<2x8x8xf32>
  %dh, %db = mt.linear_gelu_grad %g, %w, %h approximate = tanh transpose_weight : (tensor<2x8x8xf32>, tensor<16x8xf32>, tensor<2x8x16xf32>) -> (tensor<2x8x16xf32>, tensor<16xf32>)
  return %dh, %db : tensor<2x8x16xf32>, tensor<16xf32>
}

// -----

shard.grid @grid(shape = 1x2)

// A reduce-scatter of the sum of two row-parallel GEMMs (the input gradient
// of two column-parallel projections), one sample: per chunk j, every
// rank's chunk j of the rows (rows g * 4 + j * 2 of each GEMM's input, as
// [1, 2, 2 * 2 * 8] split along the last) is multiplied, summed and reduce-scattered alone;
// the rank's two chunks are joined. The GEMMs and the add are gone.
// CHECK-LABEL: func.func @scatter_gemms
// CHECK-SAME: (%[[A:.+]]: tensor<1x8x8xf32>, %[[B:.+]]: tensor<1x8x8xf32>, %[[W:.+]]: tensor<16x8xf32>, %[[V:.+]]: tensor<16x8xf32>)
// CHECK: %[[AR:.+]] = mt.reshape %[[A]] : tensor<1x8x8xf32> -> tensor<1x2x32xf32>
// CHECK-NEXT: %[[AS:.+]]:2 = mt.split %[[AR]] axis = 2 {mt.chunk_copy} : tensor<1x2x32xf32> -> tensor<1x2x16xf32>, tensor<1x2x16xf32>
// CHECK-NEXT: %[[A0:.+]] = mt.reshape %[[AS]]#0 : tensor<1x2x16xf32> -> tensor<1x4x8xf32>
// CHECK-NEXT: %[[A1:.+]] = mt.reshape %[[AS]]#1 : tensor<1x2x16xf32> -> tensor<1x4x8xf32>
// CHECK: %[[B0:.+]] = mt.reshape %{{.+}}#0 : tensor<1x2x16xf32> -> tensor<1x4x8xf32>
// CHECK-NEXT: %[[B1:.+]] = mt.reshape %{{.+}}#1 : tensor<1x2x16xf32> -> tensor<1x4x8xf32>
// CHECK-NEXT: %[[P0:.+]] = mt.linear %[[A0]], %[[W]] transpose_weight {mt.whole_rows = 8 : i64} : (tensor<1x4x8xf32>, tensor<16x8xf32>) -> tensor<1x4x16xf32>
// CHECK-NEXT: %[[Q0:.+]] = mt.linear %[[B0]], %[[V]] transpose_weight {mt.whole_rows = 8 : i64} : (tensor<1x4x8xf32>, tensor<16x8xf32>) -> tensor<1x4x16xf32>
// CHECK-NEXT: %[[S0:.+]] = mt.add %[[P0]], %[[Q0]] : tensor<1x4x16xf32>
// CHECK-NEXT: %[[R0:.+]] = shard.reduce_scatter %[[S0]] on @grid grid_axes = [1] scatter_axis = 1 {mt.chunk = array<i64: 0, 2>} : tensor<1x4x16xf32> -> tensor<1x2x16xf32>
// CHECK-NEXT: %[[P1:.+]] = mt.linear %[[A1]], %[[W]] transpose_weight
// CHECK-NEXT: %[[Q1:.+]] = mt.linear %[[B1]], %[[V]] transpose_weight
// CHECK-NEXT: %[[S1:.+]] = mt.add %[[P1]], %[[Q1]] : tensor<1x4x16xf32>
// CHECK-NEXT: %[[R1:.+]] = shard.reduce_scatter %[[S1]] on @grid grid_axes = [1] scatter_axis = 1 {mt.chunk = array<i64: 1, 2>} : tensor<1x4x16xf32> -> tensor<1x2x16xf32>
// CHECK-NEXT: %[[R:.+]] = mt.concat %[[R0]], %[[R1]] axis = 1 {mt.chunk_copy} : tensor<1x2x16xf32>, tensor<1x2x16xf32> -> tensor<1x4x16xf32>
// CHECK-NEXT: return %[[R]]
// CHECK-NOT: mt.linear
func.func @scatter_gemms(%a: tensor<1x8x8xf32>, %b: tensor<1x8x8xf32>, %w: tensor<16x8xf32>, %v: tensor<16x8xf32>) -> tensor<1x4x16xf32> {
  %p = mt.linear %a, %w transpose_weight : (tensor<1x8x8xf32>, tensor<16x8xf32>) -> tensor<1x8x16xf32>
  %q = mt.linear %b, %v transpose_weight : (tensor<1x8x8xf32>, tensor<16x8xf32>) -> tensor<1x8x16xf32>
  %s = mt.add %p, %q : tensor<1x8x16xf32>
  %r = shard.reduce_scatter %s on @grid grid_axes = [1] scatter_axis = 1 : tensor<1x8x16xf32> -> tensor<1x4x16xf32>
  return %r : tensor<1x4x16xf32>
}

// -----

shard.grid @grid(shape = 1x2)

// A reduce-scatter of a row-parallel GEMM's rows over two samples: per
// chunk j, sample j's rows are multiplied and reduce-scattered alone, and
// the rank's chunks are joined along the samples (views in the memory
// plan, no copies).
// CHECK-LABEL: func.func @scatter_samples
// CHECK-SAME: (%[[A:.+]]: tensor<2x8x8xf32>, %[[W:.+]]: tensor<16x8xf32>)
// CHECK: %[[AS:.+]]:2 = mt.split %[[A]] axis = 0 {mt.chunk_copy} : tensor<2x8x8xf32> -> tensor<1x8x8xf32>, tensor<1x8x8xf32>
// CHECK-NEXT: %[[P0:.+]] = mt.linear %[[AS]]#0, %[[W]] transpose_weight {mt.whole_rows = 16 : i64} : (tensor<1x8x8xf32>, tensor<16x8xf32>) -> tensor<1x8x16xf32>
// CHECK-NEXT: %[[R0:.+]] = shard.reduce_scatter %[[P0]] on @grid grid_axes = [1] scatter_axis = 1 {mt.chunk = array<i64: 0, 2>} : tensor<1x8x16xf32> -> tensor<1x4x16xf32>
// CHECK-NEXT: %[[P1:.+]] = mt.linear %[[AS]]#1, %[[W]] transpose_weight
// CHECK-NEXT: %[[R1:.+]] = shard.reduce_scatter %[[P1]] {{.+}} {mt.chunk = array<i64: 1, 2>}
// CHECK-NEXT: %[[R:.+]] = mt.concat %[[R0]], %[[R1]] axis = 0 {mt.chunk_copy} : tensor<1x4x16xf32>, tensor<1x4x16xf32> -> tensor<2x4x16xf32>
// CHECK-NEXT: return %[[R]]
func.func @scatter_samples(%a: tensor<2x8x8xf32>, %w: tensor<16x8xf32>) -> tensor<2x4x16xf32> {
  %p = mt.linear %a, %w transpose_weight : (tensor<2x8x8xf32>, tensor<16x8xf32>) -> tensor<2x8x16xf32>
  %r = shard.reduce_scatter %p on @grid grid_axes = [1] scatter_axis = 1 : tensor<2x8x16xf32> -> tensor<2x4x16xf32>
  return %r : tensor<2x4x16xf32>
}

// -----

shard.grid @grid(shape = 1x2)

// The same with the sum fused (mt.linear_add: the later GEMM takes the
// earlier's product as its addend): per chunk, both GEMMs on the chunk's
// rows, the addend the chunk of the first.
// CHECK-LABEL: func.func @scatter_linear_add
// CHECK-SAME: (%[[A:.+]]: tensor<2x8x8xf32>, %[[B:.+]]: tensor<2x8x8xf32>, %[[W:.+]]: tensor<16x8xf32>, %[[V:.+]]: tensor<16x8xf32>)
// CHECK-DAG: %[[AS:.+]]:2 = mt.split %[[A]] axis = 0 {mt.chunk_copy}
// CHECK-DAG: %[[BS:.+]]:2 = mt.split %[[B]] axis = 0 {mt.chunk_copy}
// CHECK: %[[P0:.+]] = mt.linear %[[AS]]#0, %[[W]] transpose_weight {mt.whole_rows = 16 : i64}
// CHECK-NEXT: %[[S0:.+]] = mt.linear_add %[[BS]]#0, %[[V]], %[[P0]] transpose_weight {mt.whole_rows = 16 : i64} : (tensor<1x8x8xf32>, tensor<16x8xf32>, tensor<1x8x16xf32>) -> tensor<1x8x16xf32>
// CHECK-NEXT: %[[R0:.+]] = shard.reduce_scatter %[[S0]] {{.+}} {mt.chunk = array<i64: 0, 2>}
// CHECK-NEXT: %[[P1:.+]] = mt.linear %[[AS]]#1, %[[W]] transpose_weight
// CHECK-NEXT: %[[S1:.+]] = mt.linear_add %[[BS]]#1, %[[V]], %[[P1]] transpose_weight
// CHECK-NEXT: %[[R1:.+]] = shard.reduce_scatter %[[S1]] {{.+}} {mt.chunk = array<i64: 1, 2>}
// CHECK-NEXT: %[[R:.+]] = mt.concat %[[R0]], %[[R1]] axis = 0 {mt.chunk_copy}
// CHECK-NEXT: return %[[R]]
func.func @scatter_linear_add(%a: tensor<2x8x8xf32>, %b: tensor<2x8x8xf32>, %w: tensor<16x8xf32>, %v: tensor<16x8xf32>) -> tensor<2x4x16xf32> {
  %p = mt.linear %a, %w transpose_weight : (tensor<2x8x8xf32>, tensor<16x8xf32>) -> tensor<2x8x16xf32>
  %s = mt.linear_add %b, %v, %p transpose_weight : (tensor<2x8x8xf32>, tensor<16x8xf32>, tensor<2x8x16xf32>) -> tensor<2x8x16xf32>
  %r = shard.reduce_scatter %s on @grid grid_axes = [1] scatter_axis = 1 : tensor<2x8x16xf32> -> tensor<2x4x16xf32>
  return %r : tensor<2x4x16xf32>
}

// -----

shard.grid @grid(shape = 1x2)

// Left whole: an all-gather along the contracted (last) dimension; one read
// by no GEMM; a reduce-scatter of rows no GEMM makes; a reduce-scatter
// whose GEMM's product is also read elsewhere (computing it twice would
// cost a GEMM); one sample of one row per rank, which do not divide; and an
// all-gather before a GEMM 16 times wider than its input (as the
// vocabulary-parallel logits are), whose join would copy (64 + 2048) / 128
// = 16.5 times the gathered bytes, more than max-copy-ratio's 8.
// CHECK-LABEL: func.func @left_whole
// CHECK-NOT: mt.chunk
// CHECK-NOT: mt.split
// CHECK: return
func.func @left_whole(%x: tensor<2x4x8xf32>, %w: tensor<16x16xf32>, %e: tensor<2x8x16xf32>, %one: tensor<1x1x16xf32>, %w2: tensor<16x16xf32>, %wide: tensor<8x128xf32>) -> (tensor<2x4x16xf32>, tensor<2x8x8xf32>, tensor<2x4x16xf32>, tensor<2x4x16xf32>, tensor<2x8x16xf32>, tensor<1x2x16xf32>, tensor<2x8x128xf32>) {
  %g = shard.all_gather %x on @grid grid_axes = [1] gather_axis = 2 : tensor<2x4x8xf32> -> tensor<2x4x16xf32>
  %y = mt.linear %g, %w : (tensor<2x4x16xf32>, tensor<16x16xf32>) -> tensor<2x4x16xf32>
  %h = shard.all_gather %x on @grid grid_axes = [1] gather_axis = 1 : tensor<2x4x8xf32> -> tensor<2x8x8xf32>
  %s = mt.add %e, %e : tensor<2x8x16xf32>
  %r = shard.reduce_scatter %s on @grid grid_axes = [1] scatter_axis = 1 : tensor<2x8x16xf32> -> tensor<2x4x16xf32>
  %p = mt.linear %e, %w2 : (tensor<2x8x16xf32>, tensor<16x16xf32>) -> tensor<2x8x16xf32>
  %q = shard.reduce_scatter %p on @grid grid_axes = [1] scatter_axis = 1 : tensor<2x8x16xf32> -> tensor<2x4x16xf32>
  %o = shard.all_gather %one on @grid grid_axes = [1] gather_axis = 1 : tensor<1x1x16xf32> -> tensor<1x2x16xf32>
  %z = mt.linear %o, %w2 : (tensor<1x2x16xf32>, tensor<16x16xf32>) -> tensor<1x2x16xf32>
  %u = shard.all_gather %x on @grid grid_axes = [1] gather_axis = 1 : tensor<2x4x8xf32> -> tensor<2x8x8xf32>
  %l = mt.linear %u, %wide : (tensor<2x8x8xf32>, tensor<8x128xf32>) -> tensor<2x8x128xf32>
  return %y, %h, %r, %q, %p, %z, %l : tensor<2x4x16xf32>, tensor<2x8x8xf32>, tensor<2x4x16xf32>, tensor<2x4x16xf32>, tensor<2x8x16xf32>, tensor<1x2x16xf32>, tensor<2x8x128xf32>
}
