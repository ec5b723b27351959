// RUN: megatron-opt %s \
// RUN:   --pass-pipeline='builtin.module(func.func(sharding-propagation,shard-partition))' -o %t.mlir
// RUN: FileCheck %s < %t.mlir
// RUN: megatron-translate --mlir-to-bundle %t.mlir -o %t.mtb
// RUN: %python %S/check-bundle-header.py %t.mtb --attrs rope --attrs dropout | FileCheck %s --check-prefix=BUNDLE
// RUN: mtrt-run %t.mtb --check-cuda-plan | FileCheck %s --check-prefix=READ

// Context parallelism's rotary embedding and dropout (docs/Parallelism.md,
// "Context parallelism"): mt.rope and mt.dropout whose sequence is split
// over the axis mt-annotate-shardings marks (mt.context_axis, here axis 1
// of a dp x cp grid) hold a block of the load-balanced sequence; the
// partitioned ops carry their tile and the layout (context_axis,
// context_size), which the bundle writes on rope and dropout, as on
// position_ids, and the runtime's reader takes. (The numbers:
// MultiRankExecutorTest.RopeOfAContextParallelTileUsesGlobalPositions and
// DropoutOfAContextParallelTileIsTheOneRankMask; a split over another axis
// is refused: test/dialects/mt/sharding-partition-context.mlir.)

// CHECK-LABEL: func.func @layout
// CHECK: mt.rope %{{.+}} base = 1.000000e+04 {mt.context_axis = 1 : i64, mt.context_size = 2 : i64, mt.split_axes = [array<i16: 0>, array<i16: 1>, array<i16>, array<i16>]} : tensor<1x8x2x4xf32>
// CHECK: mt.rope %{{.+}} base = 1.000000e+04 inverse {mt.context_axis = 1 : i64, mt.context_size = 2 : i64, mt.split_axes = [array<i16: 0>, array<i16: 1>, array<i16>, array<i16>]} : tensor<1x8x2x4xf32>
// CHECK: mt.dropout %{{.+}} p = 1.000000e-01 seed = 3 {mt.context_axis = 1 : i64, mt.context_size = 2 : i64, mt.split_axes = [array<i16: 0>, array<i16: 1>, array<i16>, array<i16>]} : tensor<1x8x2x4xf32>

// BUNDLE: grid [2, 2]
// BUNDLE: rope {"base": 10000, "context_axis": 1, "context_size": 2, {{.*}}"split_axes": {{\[\[}}0], [1], [], []]}
// BUNDLE: rope {"base": 10000, "context_axis": 1, "context_size": 2, {{.*}}"inverse": true, {{.*}}"split_axes": {{\[\[}}0], [1], [], []]}
// BUNDLE: dropout {"context_axis": 1, "context_size": 2, "p": 0.1, "seed": 3, "split_axes": {{\[\[}}0], [1], [], []]}

// READ: layout: the plan covers the CUDA backend

shard.grid @grid(shape = 2x2)

func.func @layout(%x: tensor<2x16x2x4xf32>) -> tensor<2x16x2x4xf32> {
  %split = shard.sharding @grid split_axes = [[0], [1]] : !shard.sharding
  %xs = shard.shard %x to %split annotate_for_users : tensor<2x16x2x4xf32>
  %y = mt.rope %xs base = 1.000000e+04 {mt.context_axis = 1 : i64} : tensor<2x16x2x4xf32>
  %z = mt.rope %y base = 1.000000e+04 inverse {mt.context_axis = 1 : i64} : tensor<2x16x2x4xf32>
  %d = mt.dropout %z p = 1.000000e-01 seed = 3 {mt.context_axis = 1 : i64} : tensor<2x16x2x4xf32>
  %zs = shard.shard %d to %split : tensor<2x16x2x4xf32>
  return %zs : tensor<2x16x2x4xf32>
}

