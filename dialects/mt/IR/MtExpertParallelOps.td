//===- MtExpertParallelOps.td - Expert parallelism's dispatch -*- tablegen -*-===//
//
// Expert parallelism (docs/MoE.md, "Expert parallelism"): N ranks of an
// expert axis hold E / N experts each, rank d experts [d E/N, (d+1) E/N).
// A rank's permuted rows (its tokens' kept (token, slot) pairs in expert
// order, mt.moe_permute) are therefore in destination order. These ops lay
// them out for shard.all_to_all, whose blocks are equal: block d of `N` is
// what goes to rank d, the rank's rows for d's experts followed by zero rows
// up to T * K (as many as a rank can send). The partition of the grouped
// linear layers makes them; nothing differentiates them.
//
//===----------------------------------------------------------------------===//

#ifndef MT_EXPERT_PARALLEL_OPS_TD
#define MT_EXPERT_PARALLEL_OPS_TD

def Mt_MoeDispatchRowsOp : Mt_Op<"moe_dispatch_rows", [Pure]> {
  let summary = "lays permuted rows out in one block per expert-parallel rank";
  let description = [{
    `rows [T * K, H]` (the permuted rows of routing `indices [T, K]` over
    `num_experts` experts) give `[expert_ranks * T * K, H]`: block d holds
    the rows of experts `[d E/N, (d+1) E/N)` in order, then zero rows.

    ```mlir
    %send = mt.moe_dispatch_rows %rows, %indices num_experts = 4
        expert_ranks = 2
        : (tensor<64x32xf32>, tensor<32x2xi32>) -> tensor<128x32xf32>
    ```
  }];
  let arguments = (ins Mt_FloatTensor:$rows, RankedTensorOf<[I32]>:$indices,
                       I64Attr:$num_experts, I64Attr:$expert_ranks);
  let results = (outs Mt_FloatTensor:$result);
  let assemblyFormat = [{
    $rows `,` $indices `num_experts` `=` $num_experts `expert_ranks` `=`
    $expert_ranks attr-dict `:` functional-type(operands, results)
  }];
  let hasVerifier = 1;
}

def Mt_MoeDispatchExpertsOp : Mt_Op<"moe_dispatch_experts", [Pure]> {
  let summary = "each dispatched row's expert on its destination rank";
  let description = [{
    Routing `indices [T, K]` give `[expert_ranks * T * K, 1]` (i32), in the
    layout of `mt.moe_dispatch_rows`: each row's expert less its
    destination's first expert (`e - d E/N`), -1 for the zero rows. Sent
    ahead of the rows (shard.all_to_all), they tell the destination how
    many rows each of its experts receives from each rank and where, and
    serve as routing indices (one slot per received row) for
    `mt.moe_permute` and the grouped linear layers over the received rows.

    ```mlir
    %experts = mt.moe_dispatch_experts %indices num_experts = 4
        expert_ranks = 2 : (tensor<32x2xi32>) -> tensor<128x1xi32>
    ```
  }];
  let arguments = (ins RankedTensorOf<[I32]>:$indices, I64Attr:$num_experts,
                       I64Attr:$expert_ranks);
  let results = (outs RankedTensorOf<[I32]>:$result);
  let assemblyFormat = [{
    $indices `num_experts` `=` $num_experts `expert_ranks` `=` $expert_ranks
    attr-dict `:` functional-type(operands, results)
  }];
  let hasVerifier = 1;
}

def Mt_MoeCombineRowsOp : Mt_Op<"moe_combine_rows", [Pure]> {
  let summary = "the inverse of mt.moe_dispatch_rows";
  let description = [{
    `blocks [expert_ranks * T * K, H]` in the layout of
    `mt.moe_dispatch_rows` for routing `indices [T, K]` give the permuted
    rows `[T * K, H]` back: the kept rows from their blocks, zero rows
    after them.

    ```mlir
    %rows = mt.moe_combine_rows %back, %indices num_experts = 4
        expert_ranks = 2
        : (tensor<128x32xf32>, tensor<32x2xi32>) -> tensor<64x32xf32>
    ```
  }];
  let arguments = (ins Mt_FloatTensor:$blocks, RankedTensorOf<[I32]>:$indices,
                       I64Attr:$num_experts, I64Attr:$expert_ranks);
  let results = (outs Mt_FloatTensor:$result);
  let assemblyFormat = [{
    $blocks `,` $indices `num_experts` `=` $num_experts `expert_ranks` `=`
    $expert_ranks attr-dict `:` functional-type(operands, results)
  }];
  let hasVerifier = 1;
}

#endif // MT_EXPERT_PARALLEL_OPS_TD
