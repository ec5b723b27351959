//===- MtContextParallelOps.td - Ring attention's blocks -*- tablegen -*-===//
//
// The pieces mt.attention partitions into under context parallelism
// (docs/Parallelism.md, "Context parallelism"): a block of a rank's queries
// against one rank's keys and values, the online softmax's merge, and the
// backward's per-block gradients.
//
//===----------------------------------------------------------------------===//

#ifndef MT_CONTEXT_PARALLEL_OPS_TD
#define MT_CONTEXT_PARALLEL_OPS_TD

// What every block op carries: the attention's own attributes and where its
// queries and keys sit in the load-balanced global sequence.
def Mt_AttentionBlockAttrs {
  dag attrs = (ins UnitAttr:$causal, OptionalAttr<F64Attr>:$scale,
                   DefaultValuedAttr<F64Attr, "0.0">:$dropout_p,
                   DefaultValuedAttr<I64Attr, "0">:$seed,
                   I64Attr:$context_axis, I64Attr:$context_size,
                   OptionalAttr<I64Attr>:$key_step);
}

def Mt_AttentionBlockOp : Mt_Op<"attention_block", [Pure]> {
  let summary = "one block of ring attention: the rank's queries against one rank's keys and values";
  let description = [{
    The attention of `mt.attention` over one block of keys, returning the
    block's output and the logsumexp of its scaled scores `[batch, heads,
    sequence]` (f32), which `mt.attention_merge` combines. The sequence is
    split over `context_size` ranks of grid axis `context_axis` with causal
    load balancing: rank `r` holds chunks `r` and `2 context_size - 1 - r` of
    `2 context_size` equal chunks, so the query sequence is the rank's two
    chunks. With `key_step = s` the keys are rank `(r - s) mod
    context_size`'s (a ring, `--cp-comm-type p2p`: `s` is the step); without
    it they are every rank's, gathered in rank order (`all_gather`). The
    causal mask compares global positions, and the dropout mask keys each
    probability on its global query and key positions, so the blocks merge
    into `mt.attention`'s result. A row that sees no key of the block gets
    output 0 and logsumexp `-inf`.

    ```mlir
    %o, %lse = mt.attention_block %q, %k, %v causal
        {context_axis = 1 : i64, context_size = 2 : i64, key_step = 1 : i64}
        : (tensor<4x256x8x32xf32>, tensor<4x256x2x32xf32>, tensor<4x256x2x32xf32>)
        -> (tensor<4x256x8x32xf32>, tensor<4x8x256xf32>)
    ```
  }];
  let arguments = !con((ins Mt_FloatTensor:$query, Mt_FloatTensor:$key,
                            Mt_FloatTensor:$value),
                       Mt_AttentionBlockAttrs.attrs);
  let results = (outs Mt_FloatTensor:$result,
                      RankedTensorOf<[F32]>:$logsumexp);
  let assemblyFormat = [{
    $query `,` $key `,` $value (`causal` $causal^)? attr-dict `:`
    functional-type(operands, results)
  }];
  let hasVerifier = 1;
}

def Mt_AttentionMergeOp : Mt_Op<"attention_merge",
    [Pure, AllTypesMatch<["output", "block_output", "result"]>,
     AllTypesMatch<["logsumexp", "block_logsumexp", "result_logsumexp"]>]> {
  let summary = "the online softmax's merge of an attention block into the running result";
  let description = [{
    `lse' = log(exp(lse) + exp(block_lse))` and
    `out' = exp(lse - lse') out + exp(block_lse - lse') block_out` per row:
    two partial attentions over disjoint keys become the attention over
    both. A block row with logsumexp `-inf` (no visible key) leaves the
    row as it was. `output` is `[batch, sequence, heads, value_dim]`,
    `logsumexp` `[batch, heads, sequence]`.

    ```mlir
    %o2, %lse2 = mt.attention_merge %o, %lse, %ob, %lseb
        : tensor<4x256x8x32xf32>, tensor<4x8x256xf32>
    ```
  }];
  let arguments = (ins Mt_FloatTensor:$output,
                       RankedTensorOf<[F32]>:$logsumexp,
                       Mt_FloatTensor:$block_output,
                       RankedTensorOf<[F32]>:$block_logsumexp);
  let results = (outs Mt_FloatTensor:$result,
                      RankedTensorOf<[F32]>:$result_logsumexp);
  let assemblyFormat = [{
    $output `,` $logsumexp `,` $block_output `,` $block_logsumexp attr-dict
    `:` type($output) `,` type($logsumexp)
  }];
  let hasVerifier = 1;
}

def Mt_AttentionDeltaOp : Mt_Op<"attention_delta",
    [Pure, AllTypesMatch<["output", "output_grad"]>]> {
  let summary = "the attention backward's row term, sum of output times its gradient";
  let description = [{
    `delta[b, h, i] = sum_e output[b, i, h, e] * output_grad[b, i, h, e]`,
    the `rowsum(P dP)` of the softmax's backward, the same for every block
    of a row, so that `mt.attention_block_grad` needs only its block.

    ```mlir
    %delta = mt.attention_delta %o, %do
        : tensor<4x256x8x32xf32> -> tensor<4x8x256xf32>
    ```
  }];
  let arguments = (ins Mt_FloatTensor:$output, Mt_FloatTensor:$output_grad);
  let results = (outs RankedTensorOf<[F32]>:$result);
  let assemblyFormat = [{
    $output `,` $output_grad attr-dict `:` type($output) `->` type($result)
  }];
  let hasVerifier = 1;
}

def Mt_AttentionBlockGradOp : Mt_Op<"attention_block_grad", [Pure]> {
  let summary = "one block's share of the attention core's query, key and value gradients";
  let description = [{
    The block of `mt.attention_block` with the same attributes, backward:
    from the row's whole logsumexp (the merged one) and `delta`, the
    block's probabilities are the global softmax's, and the results are
    the block's terms of the query gradient and its keys' and values'
    gradients (summed over the blocks, and over the ranks whose queries
    saw them, they are `mt.attention_grad`'s).

    ```mlir
    %dq, %dk, %dv = mt.attention_block_grad %do, %q, %k, %v, %lse, %delta causal
        {context_axis = 1 : i64, context_size = 2 : i64, key_step = 0 : i64}
        : (tensor<4x256x8x32xf32>, tensor<4x256x8x32xf32>, tensor<4x256x2x32xf32>,
           tensor<4x256x2x32xf32>, tensor<4x8x256xf32>, tensor<4x8x256xf32>)
        -> (tensor<4x256x8x32xf32>, tensor<4x256x2x32xf32>, tensor<4x256x2x32xf32>)
    ```
  }];
  let arguments = !con((ins Mt_FloatTensor:$output_grad, Mt_FloatTensor:$query,
                            Mt_FloatTensor:$key, Mt_FloatTensor:$value,
                            RankedTensorOf<[F32]>:$logsumexp,
                            RankedTensorOf<[F32]>:$delta),
                       Mt_AttentionBlockAttrs.attrs);
  let results = (outs Mt_FloatTensor:$query_grad, Mt_FloatTensor:$key_grad,
                      Mt_FloatTensor:$value_grad);
  let assemblyFormat = [{
    $output_grad `,` $query `,` $key `,` $value `,` $logsumexp `,` $delta
    (`causal` $causal^)? attr-dict `:` functional-type(operands, results)
  }];
  let hasVerifier = 1;
}

#endif // MT_CONTEXT_PARALLEL_OPS_TD
