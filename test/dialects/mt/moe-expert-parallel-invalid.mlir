// RUN: megatron-opt %s -split-input-file -verify-diagnostics

// Every diagnostic of expert parallelism's dispatch ops.

func.func @experts_not_divisible(%i: tensor<6x2xi32>) {
  // expected-error @+1 {{'mt.moe_dispatch_experts' op num_experts 5 must be a positive multiple of expert_ranks 2}}
  %e = mt.moe_dispatch_experts %i num_experts = 5 expert_ranks = 2 : (tensor<6x2xi32>) -> tensor<24x1xi32>
  return
}

// -----

func.func @indices_rank(%i: tensor<12xi32>) {
  // expected-error @+1 {{'mt.moe_dispatch_experts' op indices must be [tokens, topk], got rank 1}}
  %e = mt.moe_dispatch_experts %i num_experts = 4 expert_ranks = 2 : (tensor<12xi32>) -> tensor<24x1xi32>
  return
}

// -----

func.func @rows_not_permuted(%r: tensor<10x8xf32>, %i: tensor<6x2xi32>) {
  // expected-error @+1 {{'mt.moe_dispatch_rows' op the permuted rows must be [tokens * topk = 12, hidden], got 'tensor<10x8xf32>'}}
  %b = mt.moe_dispatch_rows %r, %i num_experts = 4 expert_ranks = 2 : (tensor<10x8xf32>, tensor<6x2xi32>) -> tensor<24x8xf32>
  return
}

// -----

func.func @blocks_shape(%r: tensor<12x8xf32>, %i: tensor<6x2xi32>) {
  // expected-error @+1 {{'mt.moe_dispatch_rows' op the dispatched blocks must be [expert_ranks * tokens * topk = 24, 8], got 'tensor<12x8xf32>'}}
  %b = mt.moe_dispatch_rows %r, %i num_experts = 4 expert_ranks = 2 : (tensor<12x8xf32>, tensor<6x2xi32>) -> tensor<12x8xf32>
  return
}

// -----

func.func @combine_blocks(%b: tensor<20x8xf32>, %i: tensor<6x2xi32>) {
  // expected-error @+1 {{'mt.moe_combine_rows' op the dispatched blocks must be [expert_ranks * tokens * topk = 24, 8], got 'tensor<20x8xf32>'}}
  %r = mt.moe_combine_rows %b, %i num_experts = 4 expert_ranks = 2 : (tensor<20x8xf32>, tensor<6x2xi32>) -> tensor<12x8xf32>
  return
}

// -----

func.func @experts_width(%i: tensor<6x2xi32>) {
  // expected-error @+1 {{'mt.moe_dispatch_experts' op the dispatched blocks must be [expert_ranks * tokens * topk = 24, 1], got 'tensor<24x2xi32>'}}
  %e = mt.moe_dispatch_experts %i num_experts = 4 expert_ranks = 2 : (tensor<6x2xi32>) -> tensor<24x2xi32>
  return
}

// -----

func.func @element_types(%r: tensor<12x8xf32>, %i: tensor<6x2xi32>) {
  // expected-error @+1 {{'mt.moe_dispatch_rows' op rows and blocks must have one element type}}
  %b = mt.moe_dispatch_rows %r, %i num_experts = 4 expert_ranks = 2 : (tensor<12x8xf32>, tensor<6x2xi32>) -> tensor<24x8xf64>
  return
}
