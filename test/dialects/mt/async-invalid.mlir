// RUN: megatron-opt %s -split-input-file -verify-diagnostics

shard.grid @grid(shape = 2)

func.func @argument_type(%x: tensor<4xf32>) -> tensor<4xf32> {
  // expected-error@+1 {{'mt.collective_start' op needs one block argument of the operand's type 'tensor<4xf32>'}}
  %f = mt.collective_start %x : tensor<4xf32> -> !mt.future<tensor<4xf32>> {
  ^bb0(%a: tensor<8xf32>):
    mt.yield %a : tensor<8xf32>
  }
  %y = mt.collective_wait %f : !mt.future<tensor<4xf32>>
  return %y : tensor<4xf32>
}

// -----

shard.grid @grid(shape = 2)

func.func @not_a_collective(%x: tensor<4xf32>) -> tensor<4xf32> {
  // expected-error@+1 {{'mt.collective_start' op holds one shard.all_reduce, shard.all_gather or shard.reduce_scatter and the mt.yield of its result; found 1 op(s), the first 'mt.add'}}
  %f = mt.collective_start %x : tensor<4xf32> -> !mt.future<tensor<4xf32>> {
  ^bb0(%a: tensor<4xf32>):
    %s = mt.add %a, %a : tensor<4xf32>
    mt.yield %s : tensor<4xf32>
  }
  %y = mt.collective_wait %f : !mt.future<tensor<4xf32>>
  return %y : tensor<4xf32>
}

// -----

shard.grid @grid(shape = 2)

func.func @yields_argument(%x: tensor<4xf32>) -> tensor<4xf32> {
  // expected-error@+1 {{'mt.collective_start' op must yield the result of its 'shard.all_reduce'}}
  %f = mt.collective_start %x : tensor<4xf32> -> !mt.future<tensor<4xf32>> {
  ^bb0(%a: tensor<4xf32>):
    %r = shard.all_reduce %a on @grid grid_axes = [0] : tensor<4xf32> -> tensor<4xf32>
    mt.yield %a : tensor<4xf32>
  }
  %y = mt.collective_wait %f : !mt.future<tensor<4xf32>>
  return %y : tensor<4xf32>
}

// -----

shard.grid @grid(shape = 2)

func.func @future_type(%x: tensor<4xf32>) -> tensor<8xf32> {
  // expected-error@+1 {{'mt.collective_start' op returns '!mt.future<tensor<8xf32>>' for a collective whose result is 'tensor<4xf32>'}}
  %f = mt.collective_start %x : tensor<4xf32> -> !mt.future<tensor<8xf32>> {
  ^bb0(%a: tensor<4xf32>):
    %r = shard.all_reduce %a on @grid grid_axes = [0] : tensor<4xf32> -> tensor<4xf32>
    mt.yield %r : tensor<4xf32>
  }
  %y = mt.collective_wait %f : !mt.future<tensor<8xf32>>
  return %y : tensor<8xf32>
}

// -----

shard.grid @grid(shape = 2)

func.func @two_waits(%x: tensor<4xf32>) -> (tensor<4xf32>, tensor<4xf32>) {
  // expected-error@+1 {{'mt.collective_start' op needs exactly one mt.collective_wait on its future; it has 2 use(s)}}
  %f = mt.collective_start %x : tensor<4xf32> -> !mt.future<tensor<4xf32>> {
  ^bb0(%a: tensor<4xf32>):
    %r = shard.all_reduce %a on @grid grid_axes = [0] : tensor<4xf32> -> tensor<4xf32>
    mt.yield %r : tensor<4xf32>
  }
  %y = mt.collective_wait %f : !mt.future<tensor<4xf32>>
  %z = mt.collective_wait %f : !mt.future<tensor<4xf32>>
  return %y, %z : tensor<4xf32>, tensor<4xf32>
}
