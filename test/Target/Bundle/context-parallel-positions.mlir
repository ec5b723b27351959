// RUN: megatron-opt %s --pass-pipeline='builtin.module(mt-annotate-shardings{context-parallel-size=2 data-parallel-size=2},func.func(sharding-propagation,shard-partition,canonicalize))' \
// RUN:   | megatron-translate --mlir-to-bundle -o %t.mtb
// RUN: %python %S/check-bundle-header.py %t.mtb --attrs position_ids | FileCheck %s
// RUN: mtrt-run %t.mtb --check-cuda-plan | FileCheck %s --check-prefix=READ

// Context parallelism's positions (docs/Parallelism.md, "Context
// parallelism"): mt-annotate-shardings splits mt.position_ids along the
// batch over the data axis and along the sequence over the context axis,
// and the partitioned op carries the layout, which the bundle writes as
// position_ids' context_axis and context_size, next to its tile; the
// runtime's reader takes it. (Its numbers, with sequence parallelism too:
// MultiRankExecutorTest.PositionIdsOfAContextParallelTileAreGlobal.)

// CHECK: grid [2, 2, 1]
// CHECK: step: {{.*}}, 0 collectives
// CHECK-NEXT: position_ids {"context_axis": 1, "context_size": 2, "split_axes": {{\[\[}}0], [1]]}

// READ: step: the plan covers the CUDA backend

func.func @step(%tokens: tensor<2x16xi32>) -> tensor<2x16xi32> {
  %positions = mt.position_ids : tensor<2x16xi32>
  return %positions : tensor<2x16xi32>
}
