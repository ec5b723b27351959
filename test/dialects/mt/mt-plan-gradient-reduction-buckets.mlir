// RUN: megatron-opt %s -split-input-file \
// RUN:   '-mt-plan-gradient-reduction=bucket-size=10 pipeline-size=2' \
// RUN:   | FileCheck %s
// RUN: megatron-opt %s -split-input-file \
// RUN:   '-mt-plan-gradient-reduction=bucket-size=10 pipeline-size=2 distributed-optimizer=true' \
// RUN:   | FileCheck %s --check-prefix=DIST
// RUN: megatron-opt %s -split-input-file \
// RUN:   '-mt-plan-gradient-reduction=bucket-size=10 pipeline-size=2 distributed-optimizer=true overlap-param-gather=true' \
// RUN:   | FileCheck %s --check-prefix=GATHER

// Megatron-LM's --overlap-grad-reduce with --ddp-bucket-size 10: the
// buffer holds d (8), c (4), b (8), a (4) in reverse declaration order; a
// bucket closes at the first parameter boundary where it holds at least
// 10 elements: [d, c] (12), [b, a] (12). Each bucket's function all-reduces
// its slice, and the whole buffer's functions stay.
//
// Under the distributed optimizer the shards are per bucket (Megatron-LM's):
// each bucket is padded to lcm(2, 128) = 128 elements (b starts at 128),
// reduce-scattered by its function and gathered by its
// gather_parameters_bucket<i>; a rank's shard is its 64 elements of each
// bucket, and the whole buffer's functions split, reduce-scatter
// (all-gather) and join bucket by bucket. With overlap-param-gather the
// bucket gathers are marked for the runtime to run before the next step's
// first use.

shard.grid @grid(shape = 2x1)
mt.parameter @a : tensor<4xf32> init = zeros
mt.parameter @b : tensor<8xf32> init = zeros
mt.parameter @c : tensor<4xf32> init = zeros
mt.parameter @d : tensor<2x4xf32> init = zeros

func.func @train_step(%da: tensor<4xf32>, %db: tensor<8xf32>, %dc: tensor<4xf32>, %dd: tensor<2x4xf32>)
    -> (tensor<4xf32> {mt.gradient = @a}, tensor<8xf32> {mt.gradient = @b},
        tensor<4xf32> {mt.gradient = @c}, tensor<2x4xf32> {mt.gradient = @d}) {
  %ra = shard.all_reduce %da on @grid grid_axes = [0] : tensor<4xf32> -> tensor<4xf32>
  %rb = shard.all_reduce %db on @grid grid_axes = [0] : tensor<8xf32> -> tensor<8xf32>
  %rc = shard.all_reduce %dc on @grid grid_axes = [0] : tensor<4xf32> -> tensor<4xf32>
  %rd = shard.all_reduce %dd on @grid grid_axes = [0] : tensor<2x4xf32> -> tensor<2x4xf32>
  return %ra, %rb, %rc, %rd : tensor<4xf32>, tensor<8xf32>, tensor<4xf32>, tensor<2x4xf32>
}
// CHECK-LABEL: func.func @reduce_gradients_bucket0
// CHECK-SAME: (%[[B0:.+]]: tensor<12xf32>) -> tensor<12xf32>
// CHECK-SAME: mt.bucket_of = @reduce_gradients, mt.bucket_offset = 0 : i64, mt.gradient_bucket = [@d, @c]
// CHECK-NEXT: %[[R0:.+]] = shard.all_reduce %[[B0]] on @grid grid_axes = [0] : tensor<12xf32> -> tensor<12xf32>
// CHECK-NEXT: return %[[R0]]
// CHECK-LABEL: func.func @reduce_gradients_bucket1
// CHECK-SAME: (%{{.+}}: tensor<12xf32>) -> tensor<12xf32>
// CHECK-SAME: mt.bucket_of = @reduce_gradients, mt.bucket_offset = 12 : i64, mt.gradient_bucket = [@b, @a]
// CHECK-LABEL: func.func @reduce_gradients(
// CHECK-SAME: tensor<24xf32>) -> tensor<24xf32>

// DIST-LABEL: func.func @reduce_gradients_bucket0
// DIST-SAME: (%[[B0:.+]]: tensor<128xf32>) -> tensor<64xf32>
// DIST-SAME: mt.bucket_gather = @gather_parameters_bucket0, mt.bucket_of = @reduce_gradients, mt.bucket_offset = 0 : i64, mt.gradient_bucket = [@d, @c]
// DIST-NEXT: %[[S0:.+]] = shard.reduce_scatter %[[B0]] on @grid grid_axes = [0] scatter_axis = 0 : tensor<128xf32> -> tensor<64xf32>
// DIST-NEXT: return %[[S0]]
// DIST-LABEL: func.func @gather_parameters_bucket0
// DIST-SAME: (%[[P0:.+]]: tensor<64xf32>) -> tensor<128xf32>
// DIST-NOT: mt.overlap_param_gather
// DIST-NEXT: %[[G0:.+]] = shard.all_gather %[[P0]] on @grid grid_axes = [0] gather_axis = 0 : tensor<64xf32> -> tensor<128xf32>
// DIST-NEXT: return %[[G0]]
// DIST-LABEL: func.func @reduce_gradients_bucket1
// DIST-SAME: tensor<128xf32>) -> tensor<64xf32>
// DIST-SAME: mt.bucket_offset = 128 : i64, mt.gradient_bucket = [@b, @a]
// DIST-LABEL: func.func @gather_parameters_bucket1
// DIST-LABEL: func.func @reduce_gradients(
// DIST-SAME: %[[BUF:.+]]: tensor<256xf32>) -> tensor<128xf32>
// DIST-SAME: mt.buffer_offsets = array<i64: 0, 8, 128, 136>, mt.gradient_buffer = [@d, @c, @b, @a]
// DIST-NEXT: %[[PARTS:.+]]:2 = mt.split %[[BUF]] axis = 0 : tensor<256xf32> -> tensor<128xf32>, tensor<128xf32>
// DIST-NEXT: %[[R0:.+]] = shard.reduce_scatter %[[PARTS]]#0
// DIST-NEXT: %[[R1:.+]] = shard.reduce_scatter %[[PARTS]]#1
// DIST-NEXT: %[[JOINED:.+]] = mt.concat %[[R0]], %[[R1]] axis = 0 : tensor<64xf32>, tensor<64xf32> -> tensor<128xf32>
// DIST-NEXT: return %[[JOINED]]
// DIST-LABEL: func.func @gather_parameters(
// DIST-SAME: tensor<128xf32>) -> tensor<256xf32>
// DIST-NEXT: mt.split {{.+}} : tensor<128xf32> -> tensor<64xf32>, tensor<64xf32>
// DIST-NEXT: shard.all_gather
// DIST-NEXT: shard.all_gather
// DIST-NEXT: mt.concat {{.+}} : tensor<128xf32>, tensor<128xf32> -> tensor<256xf32>

// GATHER-LABEL: func.func @gather_parameters_bucket0
// GATHER-SAME: mt.overlap_param_gather
// GATHER-LABEL: func.func @gather_parameters_bucket1
// GATHER-SAME: mt.overlap_param_gather

// -----

// Pipelines: a bucket never spans two chunks (virtual stages) of a rank.
// Rank 0 holds stage 0's b (8) then stage 2's a (4): two buckets although
// the first holds fewer than 10 elements.

shard.grid @grid(shape = 2x1)
mt.parameter @a : tensor<4xf32> init = zeros
mt.parameter @b : tensor<8xf32> init = zeros

func.func @train_step_stage0(%db: tensor<8xf32>) -> (tensor<8xf32> {mt.gradient = @b})
    attributes {mt.pipeline_stage = 0 : i64} {
  %r = shard.all_reduce %db on @grid grid_axes = [0] : tensor<8xf32> -> tensor<8xf32>
  return %r : tensor<8xf32>
}
func.func @train_step_stage2(%da: tensor<4xf32>) -> (tensor<4xf32> {mt.gradient = @a})
    attributes {mt.pipeline_stage = 2 : i64} {
  %r = shard.all_reduce %da on @grid grid_axes = [0] : tensor<4xf32> -> tensor<4xf32>
  return %r : tensor<4xf32>
}
// CHECK-LABEL: func.func @reduce_gradients_bucket0_pp0
// CHECK-SAME: tensor<8xf32>) -> tensor<8xf32>
// CHECK-SAME: mt.bucket_of = @reduce_gradients_pp0, mt.bucket_offset = 0 : i64, mt.gradient_bucket = [@b], mt.pipeline_rank = 0 : i64
// CHECK-LABEL: func.func @reduce_gradients_bucket1_pp0
// CHECK-SAME: tensor<4xf32>) -> tensor<4xf32>
// CHECK-SAME: mt.bucket_offset = 8 : i64, mt.gradient_bucket = [@a]
// CHECK-LABEL: func.func @reduce_gradients_pp0(
