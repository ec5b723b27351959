// RUN: megatron-opt %s -split-input-file -verify-diagnostics -mt-verify-collectives | FileCheck %s

// An SPMD step whose collectives run on every rank, and per-rank programs
// that issue the same collectives, pass unchanged.

shard.grid @grid(shape = 1x2)

// CHECK-LABEL: func.func @spmd
func.func @spmd(%x: tensor<4x8xf32>) -> tensor<8x8xf32> {
  // CHECK: shard.all_reduce
  %0 = shard.all_reduce %x on @grid grid_axes = [1] : tensor<4x8xf32> -> tensor<4x8xf32>
  // CHECK: shard.all_gather
  %1 = shard.all_gather %0 on @grid grid_axes = [1] gather_axis = 0 : tensor<4x8xf32> -> tensor<8x8xf32>
  return %1 : tensor<8x8xf32>
}

// CHECK-LABEL: func.func @step_rank0
func.func @step_rank0(%x: tensor<4x8xf32>) -> tensor<2x8xf32> attributes {mt.step = "step", mt.rank = 0 : i64} {
  %0 = shard.reduce_scatter %x on @grid grid_axes = [1] scatter_axis = 0 : tensor<4x8xf32> -> tensor<2x8xf32>
  return %0 : tensor<2x8xf32>
}
// CHECK-LABEL: func.func @step_rank1
func.func @step_rank1(%x: tensor<4x8xf32>) -> tensor<2x8xf32> attributes {mt.step = "step", mt.rank = 1 : i64} {
  %0 = shard.reduce_scatter %x on @grid grid_axes = [1] scatter_axis = 0 : tensor<4x8xf32> -> tensor<2x8xf32>
  return %0 : tensor<2x8xf32>
}

// -----

// A hand-written plan whose ranks disagree: rank 1 all-gathers where rank 0
// all-reduces.

shard.grid @grid(shape = 1x2)

func.func @step_rank0(%x: tensor<4x8xf32>) -> tensor<4x8xf32> attributes {mt.step = "step", mt.rank = 0 : i64} {
  // expected-note @+1 {{rank 0's collective}}
  %0 = shard.all_reduce %x on @grid grid_axes = [1] : tensor<4x8xf32> -> tensor<4x8xf32>
  return %0 : tensor<4x8xf32>
}
func.func @step_rank1(%x: tensor<2x8xf32>) -> tensor<4x8xf32> attributes {mt.step = "step", mt.rank = 1 : i64} {
  // expected-error @+1 {{mt-verify-collectives: collective 1 of step 'step' differs between rank 0 and rank 1: rank 0 issues shard.all_reduce {grid = @grid, grid_axes = array<i16: 1>, reduction = #shard<partial sum>} : (tensor<4x8xf32>) -> (tensor<4x8xf32>), rank 1 issues shard.all_gather {gather_axis = 0 : index, grid = @grid, grid_axes = array<i16: 1>} : (tensor<2x8xf32>) -> (tensor<4x8xf32>); the ranks would wait on each other forever}}
  %0 = shard.all_gather %x on @grid grid_axes = [1] gather_axis = 0 : tensor<2x8xf32> -> tensor<4x8xf32>
  return %0 : tensor<4x8xf32>
}

// -----

// Same operation, different groups: rank 1 reduces over the data axis.

shard.grid @grid(shape = 2x1)

func.func @step_rank0(%x: tensor<4xf32>) -> tensor<4xf32> attributes {mt.step = "step", mt.rank = 0 : i64} {
  // expected-note @+1 {{rank 0's collective}}
  %0 = shard.all_reduce %x on @grid grid_axes = [0] : tensor<4xf32> -> tensor<4xf32>
  return %0 : tensor<4xf32>
}
func.func @step_rank1(%x: tensor<4xf32>) -> tensor<4xf32> attributes {mt.step = "step", mt.rank = 1 : i64} {
  // expected-error @+1 {{mt-verify-collectives: collective 1 of step 'step' differs between rank 0 and rank 1: rank 0 issues shard.all_reduce {grid = @grid, grid_axes = array<i16: 0>, reduction = #shard<partial sum>} : (tensor<4xf32>) -> (tensor<4xf32>), rank 1 issues shard.all_reduce {grid = @grid, grid_axes = array<i16: 1>, reduction = #shard<partial sum>} : (tensor<4xf32>) -> (tensor<4xf32>); the ranks would wait on each other forever}}
  %0 = shard.all_reduce %x on @grid grid_axes = [1] : tensor<4xf32> -> tensor<4xf32>
  return %0 : tensor<4xf32>
}

// -----

// Rank 1 issues one collective fewer.

shard.grid @grid(shape = 1x2)

func.func @step_rank0(%x: tensor<4xf32>) -> tensor<4xf32> attributes {mt.step = "step", mt.rank = 0 : i64} {
  %0 = shard.all_reduce %x on @grid grid_axes = [1] : tensor<4xf32> -> tensor<4xf32>
  %1 = shard.all_reduce %0 on @grid grid_axes = [1] : tensor<4xf32> -> tensor<4xf32>
  return %1 : tensor<4xf32>
}
// expected-error @+1 {{mt-verify-collectives: rank 1 issues 1 collectives in step 'step' but rank 0 issues 2; the ranks would wait on each other forever}}
func.func @step_rank1(%x: tensor<4xf32>) -> tensor<4xf32> attributes {mt.step = "step", mt.rank = 1 : i64} {
  %0 = shard.all_reduce %x on @grid grid_axes = [1] : tensor<4xf32> -> tensor<4xf32>
  return %0 : tensor<4xf32>
}

// -----

// A step without a program for every rank of the grid.

shard.grid @grid(shape = 1x2)

// expected-error @+1 {{mt-verify-collectives: step 'step' has programs for 1 of the grid's 2 ranks (none for rank 1); a rank without the step never joins its collectives}}
func.func @step_rank0(%x: tensor<4xf32>) -> tensor<4xf32> attributes {mt.step = "step", mt.rank = 0 : i64} {
  return %x : tensor<4xf32>
}

// -----

shard.grid @grid(shape = 1x2)

// expected-error @+1 {{mt-verify-collectives: step_b is the program of rank 2, outside the grid's 2 ranks}}
func.func @step_b(%x: tensor<4xf32>) -> tensor<4xf32> attributes {mt.step = "step", mt.rank = 2 : i64} {
  return %x : tensor<4xf32>
}

// -----

shard.grid @grid(shape = 1x2)

func.func @step_a(%x: tensor<4xf32>) -> tensor<4xf32> attributes {mt.step = "step", mt.rank = 0 : i64} {
  return %x : tensor<4xf32>
}
// expected-error @+1 {{mt-verify-collectives: step_b and step_a are both rank 0's program of step 'step'}}
func.func @step_b(%x: tensor<4xf32>) -> tensor<4xf32> attributes {mt.step = "step", mt.rank = 0 : i64} {
  return %x : tensor<4xf32>
}

// -----

shard.grid @grid(shape = 1x2)

// expected-error @+1 {{mt-verify-collectives: step_a has mt.step = "step" but no integer mt.rank; give each rank's program its rank}}
func.func @step_a(%x: tensor<4xf32>) -> tensor<4xf32> attributes {mt.step = "step"} {
  return %x : tensor<4xf32>
}

// -----

// SPMD: an all-reduce that only tensor rank 0 issues would hang rank 1.

shard.grid @grid(shape = 1x2)

func.func @rank_dependent(%x: tensor<4xf32>) -> tensor<4xf32> {
  %idx = shard.process_linear_index on @grid : index
  %c0 = arith.constant 0 : index
  %first = arith.cmpi eq, %idx, %c0 : index
  // expected-note @+1 {{the rank-dependent control flow}}
  %r = scf.if %first -> tensor<4xf32> {
    // expected-error @+1 {{mt-verify-collectives: shard.all_reduce runs under scf.if, whose operands depend on the rank: ranks that skip it leave the others of its group waiting; issue collectives on every rank (select the data instead of the call)}}
    %0 = shard.all_reduce %x on @grid grid_axes = [1] : tensor<4xf32> -> tensor<4xf32>
    scf.yield %0 : tensor<4xf32>
  } else {
    scf.yield %x : tensor<4xf32>
  }
  return %r : tensor<4xf32>
}

// -----

// SPMD, unstructured: a branch on the rank may skip the gather's block.

shard.grid @grid(shape = 1x2)

func.func @rank_branch(%x: tensor<2xf32>, %y: tensor<4xf32>) -> tensor<4xf32> {
  %idx = shard.process_linear_index on @grid : index
  %c0 = arith.constant 0 : index
  %first = arith.cmpi eq, %idx, %c0 : index
  // expected-note @+1 {{the branch on the rank}}
  cf.cond_br %first, ^gather, ^done(%y : tensor<4xf32>)
^gather:
  // expected-error @+1 {{mt-verify-collectives: shard.all_gather is in a block that a branch on the rank may skip: ranks that skip it leave the others of its group waiting; issue collectives on every rank}}
  %0 = shard.all_gather %x on @grid grid_axes = [1] gather_axis = 0 : tensor<2xf32> -> tensor<4xf32>
  cf.br ^done(%0 : tensor<4xf32>)
^done(%r: tensor<4xf32>):
  return %r : tensor<4xf32>
}

// -----

// SPMD: a dynamic shape could differ between ranks.

shard.grid @grid(shape = 1x2)

func.func @dynamic(%x: tensor<?xf32>) -> tensor<?xf32> {
  // expected-error @+1 {{mt-verify-collectives: shard.all_reduce has the dynamic type 'tensor<?xf32>': ranks could disagree on its size and hang; collectives need static shapes}}
  %0 = shard.all_reduce %x on @grid grid_axes = [1] : tensor<?xf32> -> tensor<?xf32>
  return %0 : tensor<?xf32>
}
