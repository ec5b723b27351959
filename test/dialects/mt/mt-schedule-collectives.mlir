// RUN: megatron-opt %s -mt-split-collectives -mt-schedule-collectives | FileCheck %s
// RUN: megatron-opt %s -mt-split-collectives -mt-schedule-collectives -mt-print-overlap -o /dev/null | FileCheck %s --check-prefix=REPORT

// Built-in cost model (data/cost-model.json): a 4096^3 bf16 GEMM takes about
// 397 us; the all-reduce of 16 MiB over the 8 ranks of the tensor axis
// (NVLink) about 90 us, over the 2 ranks of the data axis, which are 8
// apart and so on two nodes (network), about 398 us.

shard.grid @grid(shape = 2x8)

// The start moves up past independent GEMMs only until they cover the
// collective: one GEMM is enough, so it stays below the first.
// CHECK-LABEL: func.func @start_up
func.func @start_up(%g: tensor<2048x2048xf32>, %x: tensor<4096x4096xbf16>, %w: tensor<4096x4096xbf16>) -> (tensor<2048x2048xf32>, tensor<4096x4096xbf16>) {
  // CHECK: %[[P:.+]] = mt.add
  // CHECK-NEXT: %[[A:.+]] = mt.matmul
  // CHECK-NEXT: %[[F:.+]] = mt.collective_start %[[P]]
  // CHECK-SAME: mt.predicted_us = 89.5{{[0-9]+}} : f64
  // CHECK: %[[B:.+]] = mt.matmul %[[A]]
  // CHECK-NEXT: %[[R:.+]] = mt.collective_wait %[[F]]
  // CHECK-NEXT: mt.matmul %[[B]]
  %p = mt.add %g, %g : tensor<2048x2048xf32>
  %a = mt.matmul %x, %w : (tensor<4096x4096xbf16>, tensor<4096x4096xbf16>) -> tensor<4096x4096xbf16>
  %b = mt.matmul %a, %w : (tensor<4096x4096xbf16>, tensor<4096x4096xbf16>) -> tensor<4096x4096xbf16>
  %r = shard.all_reduce %p on @grid grid_axes = [1] : tensor<2048x2048xf32> -> tensor<2048x2048xf32>
  %c = mt.matmul %b, %w : (tensor<4096x4096xbf16>, tensor<4096x4096xbf16>) -> tensor<4096x4096xbf16>
  %s = mt.add %r, %r : tensor<2048x2048xf32>
  return %s, %c : tensor<2048x2048xf32>, tensor<4096x4096xbf16>
}

// The operand is computed right before: the start stays, and the wait moves
// down past one GEMM over NVLink, past two (and no further than the first
// reader) over the network.
// CHECK-LABEL: func.func @wait_down
func.func @wait_down(%g: tensor<2048x2048xf32>, %x: tensor<4096x4096xbf16>, %w: tensor<4096x4096xbf16>) -> (tensor<2048x2048xf32>, tensor<2048x2048xf32>, tensor<4096x4096xbf16>) {
  // CHECK: %[[P:.+]] = mt.add
  // CHECK-NEXT: %[[F0:.+]] = mt.collective_start %[[P]]
  // CHECK: %[[F1:.+]] = mt.collective_start %[[P]]
  // CHECK-SAME: mt.predicted_us = 397.8{{[0-9]+}} : f64
  // CHECK: %[[C:.+]] = mt.matmul
  // CHECK-NEXT: mt.collective_wait %[[F0]]
  // CHECK-NEXT: %[[D:.+]] = mt.matmul %[[C]]
  // CHECK-NEXT: mt.collective_wait %[[F1]]
  // CHECK-NEXT: mt.matmul %[[D]]
  // CHECK-NEXT: mt.add
  %p = mt.add %g, %g : tensor<2048x2048xf32>
  %r = shard.all_reduce %p on @grid grid_axes = [1] : tensor<2048x2048xf32> -> tensor<2048x2048xf32>
  %n = shard.all_reduce %p on @grid grid_axes = [0] : tensor<2048x2048xf32> -> tensor<2048x2048xf32>
  %c = mt.matmul %x, %w : (tensor<4096x4096xbf16>, tensor<4096x4096xbf16>) -> tensor<4096x4096xbf16>
  %d = mt.matmul %c, %w : (tensor<4096x4096xbf16>, tensor<4096x4096xbf16>) -> tensor<4096x4096xbf16>
  %e = mt.matmul %d, %w : (tensor<4096x4096xbf16>, tensor<4096x4096xbf16>) -> tensor<4096x4096xbf16>
  %s = mt.add %r, %n : tensor<2048x2048xf32>
  return %s, %n, %e : tensor<2048x2048xf32>, tensor<2048x2048xf32>, tensor<4096x4096xbf16>
}

// Nothing to hide behind: the reader follows at once, and the report says
// the whole collective is exposed.
// CHECK-LABEL: func.func @exposed
func.func @exposed(%g: tensor<2048x2048xf32>) -> tensor<2048x2048xf32> {
  // CHECK: mt.add
  // CHECK-NEXT: mt.collective_start
  // CHECK: mt.collective_wait
  // CHECK-NEXT: mt.add
  %p = mt.add %g, %g : tensor<2048x2048xf32>
  %r = shard.all_reduce %p on @grid grid_axes = [1] : tensor<2048x2048xf32> -> tensor<2048x2048xf32>
  %s = mt.add %r, %r : tensor<2048x2048xf32>
  return %s : tensor<2048x2048xf32>
}

// REPORT: overlap: each collective's predicted time on one rank, the part hidden behind computation, and what hides it (cost model: NVIDIA H200; NVLink 360 GB/s, 8 us; network 45 GB/s, 25 us; 8 GPUs a node)
// REPORT-LABEL: start_up: grid 2x8 (16 ranks alike)
// REPORT-NEXT: #   collective      axes   ranks link           bytes predicted_us  hidden_us  exposed_us  behind (op us)
// REPORT-NEXT: 0   all_reduce      [1]        8 nvlink      16777216         89.6       89.6         0.0  matmul 89.6
// REPORT-NEXT: exposed communication: 0.0 us of 89.6 us (100% hidden)
// REPORT-LABEL: wait_down:
// REPORT-NEXT: #
// REPORT-NEXT: 0   all_reduce      [1]        8 nvlink      16777216         89.6       89.6         0.0  matmul 89.6
// REPORT-NEXT: 1   all_reduce      [0]        2 network     16777216        397.8      397.8         0.0  matmul 397.8
// REPORT-NEXT: exposed communication: 0.0 us of 487.4 us (100% hidden)
// REPORT-LABEL: exposed:
// REPORT-NEXT: #
// REPORT-NEXT: 0   all_reduce      [1]        8 nvlink      16777216         89.6        0.0        89.6  -
// REPORT-NEXT: exposed communication: 89.6 us of 89.6 us (0% hidden)
