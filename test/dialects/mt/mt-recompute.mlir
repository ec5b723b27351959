// RUN: megatron-opt %s -mt-differentiate -mt-recompute=granularity=none | %drop-layers | FileCheck %s --check-prefix=NONE
// RUN: megatron-opt %s -mt-differentiate -mt-recompute=granularity=selective | %drop-layers | FileCheck %s --check-prefix=SELECTIVE
// RUN: megatron-opt %s -mt-differentiate '-mt-recompute=granularity=full method=uniform num-layers=1' | %drop-layers | FileCheck %s --check-prefix=UNIFORM1
// RUN: megatron-opt %s -mt-differentiate '-mt-recompute=granularity=full method=uniform num-layers=2' | %drop-layers | FileCheck %s --check-prefix=UNIFORM2
// RUN: megatron-opt %s -mt-differentiate '-mt-recompute=granularity=full method=block num-layers=1' | %drop-layers | FileCheck %s --check-prefix=BLOCK1
// RUN: megatron-opt %s -mt-differentiate -mt-recompute=granularity=selective | FileCheck %s --check-prefix=LAYERS

// Two toy layers (projection, attention core, GeLU, projection, residual
// add) tagged with mt.layer as the front end tags them. Each policy's clones
// go right before the first backward op that reads what they recompute, and
// the backward pass reads the clones instead of the saved activations.

mt.parameter @w0 : tensor<8x8xf32> init = normal std = 2.000000e-02
mt.parameter @v0 : tensor<8x8xf32> init = normal std = 2.000000e-02
mt.parameter @w1 : tensor<8x8xf32> init = normal std = 2.000000e-02
mt.parameter @v1 : tensor<8x8xf32> init = normal std = 2.000000e-02
mt.parameter @head : tensor<8x16xf32> init = normal std = 2.000000e-02

// The clones keep their layer, and the backward ops are in the layer of the
// op they differentiate.
// LAYERS-LABEL: func.func @train_step
// LAYERS: mt.attention_grad {{.+}} {mt.layer = #mt.layer<1, core_attention>}
// LAYERS: mt.attention {{.+}} causal {mt.layer = #mt.layer<0, core_attention>, mt.recomputed}
// LAYERS-NEXT: mt.reshape {{.+}} {mt.layer = #mt.layer<0, core_attention>, mt.recomputed}
// LAYERS-NEXT: mt.gelu_grad {{.+}} {mt.layer = #mt.layer<0>}

// NONE-LABEL: func.func @train_step
// NONE-NOT: mt.recomputed

// Selective: each layer's attention and the reshape of its output, rerun
// from the saved q (which attention_grad reads anyway) before the output
// projection's backward (here the GeLU's) reads it.
// SELECTIVE-LABEL: func.func @train_step
// SELECTIVE: %[[Q0:.+]] = mt.reshape %{{.+}} : tensor<2x4x8xf32> -> tensor<2x4x2x4xf32>
// SELECTIVE: %[[Q1:.+]] = mt.reshape %{{.+}} : tensor<2x4x8xf32> -> tensor<2x4x2x4xf32>
// SELECTIVE: mt.cross_entropy_grad
// SELECTIVE: %[[C1:.+]] = mt.attention %[[Q1]], %[[Q1]], %[[Q1]] causal {mt.recomputed}
// SELECTIVE-NEXT: %[[R1C:.+]] = mt.reshape %[[C1]] {mt.recomputed}
// SELECTIVE-NEXT: mt.gelu_grad %{{.+}}, %[[R1C]]
// SELECTIVE: mt.attention_grad %{{.+}}, %[[Q1]], %[[Q1]], %[[Q1]]
// SELECTIVE: mt.attention %[[Q0]], %[[Q0]], %[[Q0]] causal {mt.recomputed}
// SELECTIVE-NEXT: mt.reshape %{{.+}} {mt.recomputed}
// SELECTIVE-NEXT: mt.gelu_grad
// SELECTIVE-NOT: mt.recomputed
// SELECTIVE: return

// Full, uniform, one layer per group: each layer reruns from its input (the
// residual stream, a checkpoint) at the start of its backward; the layer's
// output (the residual add) is the next checkpoint, not rerun.
// UNIFORM1-LABEL: func.func @train_step
// UNIFORM1: %[[H0:.+]] = mt.add %arg0, %{{.+}} : tensor<2x4x8xf32>
// UNIFORM1: mt.cross_entropy_grad
// UNIFORM1: %[[A1:.+]] = mt.linear %[[H0]], %{{.+}} {mt.recomputed}
// UNIFORM1-NEXT: mt.reshape %[[A1]] {mt.recomputed}
// UNIFORM1-NEXT: mt.attention {{.+}} {mt.recomputed}
// UNIFORM1-NEXT: mt.reshape {{.+}} {mt.recomputed}
// UNIFORM1-NEXT: %[[G1:.+]] = mt.gelu {{.+}} {mt.recomputed}
// UNIFORM1-NEXT: mt.linear_weight_grad %[[G1]]
// UNIFORM1-NOT: mt.add {{.+}} {mt.recomputed}
// UNIFORM1: mt.linear %arg0, %{{.+}} {mt.recomputed}
// UNIFORM1-COUNT-4: {mt.recomputed}
// UNIFORM1-NOT: mt.recomputed
// UNIFORM1: return

// Full, uniform, two layers per group: both layers rerun from the step's
// input, including layer 0's output, which is inside the group.
// UNIFORM2-LABEL: func.func @train_step
// UNIFORM2: mt.cross_entropy_grad
// UNIFORM2: mt.linear %arg0, %{{.+}} {mt.recomputed}
// UNIFORM2-COUNT-5: {mt.recomputed}
// UNIFORM2-NEXT: mt.add %arg0, %{{.+}} {mt.recomputed}
// UNIFORM2-COUNT-5: {mt.recomputed}
// UNIFORM2-NOT: mt.recomputed
// UNIFORM2: return

// Full, block, one layer: only layer 0 reruns; layer 1 keeps its
// activations.
// BLOCK1-LABEL: func.func @train_step
// BLOCK1: mt.cross_entropy_grad
// BLOCK1-NOT: mt.recomputed
// BLOCK1: mt.attention_grad
// BLOCK1: mt.linear %arg0, %{{.+}} {mt.recomputed}
// BLOCK1-COUNT-4: {mt.recomputed}
// BLOCK1-NOT: mt.recomputed
// BLOCK1: return
func.func @train_step(%x: tensor<2x4x8xf32>, %labels: tensor<2x4xi32>) -> tensor<f32> {
  %w0 = mt.get_parameter @w0 : tensor<8x8xf32>
  %a0 = mt.linear %x, %w0 {mt.layer = #mt.layer<0>} : (tensor<2x4x8xf32>, tensor<8x8xf32>) -> tensor<2x4x8xf32>
  %q0 = mt.reshape %a0 {mt.layer = #mt.layer<0>} : tensor<2x4x8xf32> -> tensor<2x4x2x4xf32>
  %c0 = mt.attention %q0, %q0, %q0 causal {mt.layer = #mt.layer<0, core_attention>} : (tensor<2x4x2x4xf32>, tensor<2x4x2x4xf32>, tensor<2x4x2x4xf32>) -> tensor<2x4x2x4xf32>
  %r0 = mt.reshape %c0 {mt.layer = #mt.layer<0, core_attention>} : tensor<2x4x2x4xf32> -> tensor<2x4x8xf32>
  %g0 = mt.gelu %r0 approximate = tanh {mt.layer = #mt.layer<0>} : tensor<2x4x8xf32>
  %v0 = mt.get_parameter @v0 : tensor<8x8xf32>
  %o0 = mt.linear %g0, %v0 {mt.layer = #mt.layer<0>} : (tensor<2x4x8xf32>, tensor<8x8xf32>) -> tensor<2x4x8xf32>
  %h0 = mt.add %x, %o0 {mt.layer = #mt.layer<0>} : tensor<2x4x8xf32>
  %w1 = mt.get_parameter @w1 : tensor<8x8xf32>
  %a1 = mt.linear %h0, %w1 {mt.layer = #mt.layer<1>} : (tensor<2x4x8xf32>, tensor<8x8xf32>) -> tensor<2x4x8xf32>
  %q1 = mt.reshape %a1 {mt.layer = #mt.layer<1>} : tensor<2x4x8xf32> -> tensor<2x4x2x4xf32>
  %c1 = mt.attention %q1, %q1, %q1 causal {mt.layer = #mt.layer<1, core_attention>} : (tensor<2x4x2x4xf32>, tensor<2x4x2x4xf32>, tensor<2x4x2x4xf32>) -> tensor<2x4x2x4xf32>
  %r1 = mt.reshape %c1 {mt.layer = #mt.layer<1, core_attention>} : tensor<2x4x2x4xf32> -> tensor<2x4x8xf32>
  %g1 = mt.gelu %r1 approximate = tanh {mt.layer = #mt.layer<1>} : tensor<2x4x8xf32>
  %v1 = mt.get_parameter @v1 : tensor<8x8xf32>
  %o1 = mt.linear %g1, %v1 {mt.layer = #mt.layer<1>} : (tensor<2x4x8xf32>, tensor<8x8xf32>) -> tensor<2x4x8xf32>
  %h1 = mt.add %h0, %o1 {mt.layer = #mt.layer<1>} : tensor<2x4x8xf32>
  %head = mt.get_parameter @head : tensor<8x16xf32>
  %y = mt.linear %h1, %head : (tensor<2x4x8xf32>, tensor<8x16xf32>) -> tensor<2x4x16xf32>
  %loss = mt.cross_entropy %y, %labels reduction = mean : (tensor<2x4x16xf32>, tensor<2x4xi32>) -> tensor<f32>
  return %loss : tensor<f32>
}
