//===- MtMoeOps.td - The mixture-of-experts layer's ops -----*- tablegen -*-===//
//
// Megatron-LM's MoE layer (docs/MoE.md) as a few ops over a flat batch of
// tokens: the router's top-k and its two auxiliary losses, the permutation
// of token copies into expert order and back, and the experts' grouped
// linear layers. The router's own linear layer, the experts' activations and
// the shared expert are the ordinary mt.linear, mt.swiglu and mt.gelu.
//
// The routing is a pair `probs [T, K]`, `indices [T, K]` (i32): token t's
// k-th expert and its weight, -1 and 0 where capacity dropped it. The
// permuted rows are the kept (token, slot) pairs in expert order, and in
// token order within an expert, followed by zero rows up to T * K: group e
// is the rows from the count of kept pairs of experts below e, as many as
// its own. Every op that reads permuted rows derives the groups from the
// indices, so shapes stay static whatever is dropped.
//
//===----------------------------------------------------------------------===//

#ifndef MT_MOE_OPS_TD
#define MT_MOE_OPS_TD

def Mt_MoeRouteOp : Mt_Op<"moe_route", [VJP, Pure]> {
  let summary = "the router's top-k experts and their weights, with optional capacity dropping";
  let description = [{
    From router logits `[T, E]` (tokens x experts), each token's `topk`
    experts, the highest logits first (ties: the lower expert), and their
    weights, as Megatron-LM's `topk_softmax_with_capacity`:
    - `softmax` with `normalize`: the softmax over the k chosen logits
      (Megatron-LM's default; Mixtral's and Qwen3-MoE's normalized top-k);
    - `softmax` without it: the chosen entries of the softmax over all E
      (`--moe-router-pre-softmax`);
    - `sigmoid`: each chosen logit's sigmoid, divided by their sum
      (+ 1e-20) with `normalize`.

    With `num_groups` and `group_topk` the routing is group-limited, as
    Megatron-LM's `group_limited_topk` (`--moe-router-num-groups`,
    `--moe-router-group-topk`; DeepSeek's device- and node-limited
    routing): the E experts form `num_groups` groups of consecutive
    experts, each group's score is the sum of its `topk / group_topk`
    highest scores (the logits for `softmax` with `normalize`, else the
    softmax over all E or the sigmoids), the `group_topk` highest groups
    are kept (ties: the lower group), and the top-k is taken among their
    experts only.

    With `expert_bias` (`[E]`, f32; sigmoid scores only) the top-k, and the
    groups' scores, are taken over each sigmoid plus its expert's bias, as
    Megatron-LM's aux-loss-free balancing (`--moe-router-enable-expert-bias`,
    DeepSeek-V3's `e_score_correction_bias`); the weights are the chosen
    experts' sigmoids without it, and the bias has no gradient.

    With `capacity_factor` each expert keeps at most
    `C = ceil(T * topk / E * capacity_factor)` tokens: those with the
    highest weights (`drop_policy = probs`, the default; ties: the earlier
    token) or the first in token order (`position`). A dropped slot has
    index -1 and weight 0 (after normalization, as Megatron-LM's). Without
    it routing is dropless.

    ```mlir
    %probs, %indices = mt.moe_route %logits topk = 2 score = softmax normalize
        : (tensor<512x8xf32>) -> (tensor<512x2xf32>, tensor<512x2xi32>)
    %p, %i = mt.moe_route %logits topk = 2 score = softmax normalize
        capacity_factor = 1.000000e+00 drop_policy = position
        : (tensor<512x8xf32>) -> (tensor<512x2xf32>, tensor<512x2xi32>)
    %p, %i = mt.moe_route %logits topk = 4 score = sigmoid normalize
        groups = 4 group_topk = 2
        : (tensor<512x16xf32>) -> (tensor<512x4xf32>, tensor<512x4xi32>)
    %p, %i = mt.moe_route %logits bias %expert_bias topk = 4
        score = sigmoid normalize
        : (tensor<512x16xf32>, tensor<16xf32>)
        -> (tensor<512x4xf32>, tensor<512x4xi32>)
    ```
  }];
  let arguments = (ins Mt_FloatTensor:$logits,
                       Optional<Mt_FloatTensor>:$expert_bias, I64Attr:$topk,
                       Mt_MoeScoreFunction:$score_function,
                       UnitAttr:$normalize,
                       OptionalAttr<I64Attr>:$num_groups,
                       OptionalAttr<I64Attr>:$group_topk,
                       OptionalAttr<F64Attr>:$capacity_factor,
                       OptionalAttr<Mt_MoeDropPolicy>:$drop_policy);
  let results = (outs Mt_FloatTensor:$probs,
                      RankedTensorOf<[I32]>:$indices);
  let assemblyFormat = [{
    $logits (`bias` $expert_bias^)? `topk` `=` $topk `score` `=` $score_function
    (`normalize` $normalize^)?
    (`groups` `=` $num_groups^ `group_topk` `=` $group_topk)?
    (`capacity_factor` `=` $capacity_factor^)?
    (`drop_policy` `=` $drop_policy^)? attr-dict `:`
    functional-type(operands, results)
  }];
  let hasVerifier = 1;
}

def Mt_MoeAuxLossOp : Mt_Op<"moe_aux_loss", [VJP, Pure]> {
  let summary = "the switch load-balancing loss of one MoE layer";
  let description = [{
    Megatron-LM's `switch_load_balancing_loss_func` (the `aux_loss`
    load-balancing type) over router logits `[T, E]`:
    `coeff * E / (topk * T * T) * sum_e f_e * P_e`, where `f_e` counts the
    tokens whose top-k (before any capacity dropping) holds expert e and
    `P_e` sums expert e's score over the tokens: the softmax over all
    experts, or for `sigmoid` the sigmoids divided by their sum (+ 1e-20).
    `f_e` is a count and has no gradient. The result is an f32 scalar.

    With `per_sequence = S` the tokens are T / S sequences of S
    consecutive rows, and the loss is the mean over the sequences of each
    one's loss over its S tokens (the formula with S for T): Megatron-LM's
    `sequence_load_balancing_loss_func` (the `seq_aux_loss` type;
    DeepSeek-V2's sequence-wise balance loss).

    ```mlir
    %aux = mt.moe_aux_loss %logits topk = 2 score = softmax coeff = 1.000000e-02
        : (tensor<512x8xf32>) -> tensor<f32>
    %seq = mt.moe_aux_loss %logits topk = 2 score = softmax coeff = 1.000000e-02
        per_sequence = 128 : (tensor<512x8xf32>) -> tensor<f32>
    ```
  }];
  let arguments = (ins Mt_FloatTensor:$logits, I64Attr:$topk,
                       Mt_MoeScoreFunction:$score_function, F64Attr:$coeff,
                       OptionalAttr<I64Attr>:$sequence_length);
  let results = (outs RankedTensorOf<[F32]>:$result);
  let assemblyFormat = [{
    $logits `topk` `=` $topk `score` `=` $score_function `coeff` `=` $coeff
    (`per_sequence` `=` $sequence_length^)?
    attr-dict `:` functional-type(operands, results)
  }];
  let hasVerifier = 1;
}

def Mt_MoeZLossOp : Mt_Op<"moe_z_loss", [VJP, Pure]> {
  let summary = "the router z-loss of one MoE layer";
  let description = [{
    `coeff / T * sum_t logsumexp(logits[t])^2` over router logits `[T, E]`
    (ST-MoE's z-loss, Megatron-LM's `z_loss_func`), an f32 scalar.

    ```mlir
    %z = mt.moe_z_loss %logits coeff = 1.000000e-03
        : (tensor<512x8xf32>) -> tensor<f32>
    ```
  }];
  let arguments = (ins Mt_FloatTensor:$logits, F64Attr:$coeff);
  let results = (outs RankedTensorOf<[F32]>:$result);
  let assemblyFormat = [{
    $logits `coeff` `=` $coeff attr-dict `:` functional-type(operands, results)
  }];
  let hasVerifier = 1;
}

def Mt_MoePermuteOp : Mt_Op<"moe_permute", [VJP, Pure]> {
  let summary = "copies each token to its experts' rows, in expert order";
  let description = [{
    `input [T, H]` and routing indices `[T, K]` give `[T * K, H]`: row
    `pos(t, k)` (see the file's header: expert order, token order within an
    expert, zero rows after the kept pairs) is token t, times `probs[t, k]`
    when the optional weights `[T, K]` are given. The transpose of
    `mt.moe_unpermute` with the same operands.

    ```mlir
    %rows = mt.moe_permute %x, %indices
        : (tensor<512x128xf32>, tensor<512x2xi32>) -> tensor<1024x128xf32>
    ```
  }];
  let arguments = (ins Mt_FloatTensor:$input, RankedTensorOf<[I32]>:$indices,
                       Optional<Mt_FloatTensor>:$probs);
  let results = (outs Mt_FloatTensor:$result);
  let assemblyFormat = [{
    $input `,` $indices (`,` $probs^)? attr-dict `:`
    functional-type(operands, results)
  }];
  let hasVerifier = 1;
}

def Mt_MoeUnpermuteOp : Mt_Op<"moe_unpermute", [VJP, Pure]> {
  let summary = "sums each token's expert rows back, weighted by the router";
  let description = [{
    `rows [T * K, H]` in `mt.moe_permute`'s order and indices `[T, K]` give
    `[T, H]`: `y[t] = sum_k probs[t, k] * rows[pos(t, k)]` over the kept
    slots (weight 1 without the optional `probs`). The transpose of
    `mt.moe_permute`.

    ```mlir
    %y = mt.moe_unpermute %rows, %indices, %probs
        : (tensor<1024x128xf32>, tensor<512x2xi32>, tensor<512x2xf32>) -> tensor<512x128xf32>
    ```
  }];
  let arguments = (ins Mt_FloatTensor:$rows, RankedTensorOf<[I32]>:$indices,
                       Optional<Mt_FloatTensor>:$probs);
  let results = (outs Mt_FloatTensor:$result);
  let assemblyFormat = [{
    $rows `,` $indices (`,` $probs^)? attr-dict `:`
    functional-type(operands, results)
  }];
  let hasVerifier = 1;
}

def Mt_MoeGroupedLinearOp : Mt_Op<"moe_grouped_linear", [VJP, Pure]> {
  let summary = "each expert's linear layer over its group of permuted rows";
  let description = [{
    `input [T * K, in]` in `mt.moe_permute`'s order, a weight per expert
    `[E, in, out]` (`[E, out, in]` with `transpose_weight`, torch.nn.Linear's
    layout stacked) and the routing indices `[T, K]` give `[T * K, out]`:
    group e's rows times expert e's weight, zero rows after the kept pairs.
    Megatron-LM's grouped GEMM; the experts have no bias (as its
    GroupedMLP). An index of E or more is an error at run time.

    ```mlir
    %h = mt.moe_grouped_linear %rows, %w1, %indices transpose_weight
        : (tensor<1024x128xf32>, tensor<8x352x128xf32>, tensor<512x2xi32>) -> tensor<1024x352xf32>
    ```
  }];
  let arguments = (ins Mt_FloatTensor:$input, Mt_FloatTensor:$weight,
                       RankedTensorOf<[I32]>:$indices,
                       UnitAttr:$transpose_weight);
  let results = (outs Mt_FloatTensor:$result);
  let assemblyFormat = [{
    $input `,` $weight `,` $indices (`transpose_weight` $transpose_weight^)?
    attr-dict `:` functional-type(operands, results)
  }];
  let hasVerifier = 1;
}

//===----------------------------------------------------------------------===//
// Backward ops
//===----------------------------------------------------------------------===//

def Mt_MoeRouteGradOp : Mt_Op<"moe_route_grad", [Pure]> {
  let summary = "the router logits' gradient from the routing weights' gradient";
  let description = [{
    The VJP of `mt.moe_route` with the same `topk`, `score_function`,
    `normalize`, groups and expert bias: the top-k is recomputed from the
    logits (and the bias), and the weights of slots the forward dropped
    (index -1) pass no gradient.

    ```mlir
    %dlogits = mt.moe_route_grad %dprobs, %logits, %indices topk = 2 score = softmax normalize
        : (tensor<512x2xf32>, tensor<512x8xf32>, tensor<512x2xi32>) -> tensor<512x8xf32>
    ```
  }];
  let arguments = (ins Mt_FloatTensor:$probs_grad, Mt_FloatTensor:$logits,
                       RankedTensorOf<[I32]>:$indices,
                       Optional<Mt_FloatTensor>:$expert_bias, I64Attr:$topk,
                       Mt_MoeScoreFunction:$score_function,
                       UnitAttr:$normalize,
                       OptionalAttr<I64Attr>:$num_groups,
                       OptionalAttr<I64Attr>:$group_topk);
  let results = (outs Mt_FloatTensor:$result);
  let assemblyFormat = [{
    $probs_grad `,` $logits `,` $indices (`bias` $expert_bias^)? `topk` `=`
    $topk `score` `=`
    $score_function (`normalize` $normalize^)?
    (`groups` `=` $num_groups^ `group_topk` `=` $group_topk)? attr-dict `:`
    functional-type(operands, results)
  }];
  let hasVerifier = 1;
}

def Mt_MoeAuxLossGradOp : Mt_Op<"moe_aux_loss_grad", [Pure]> {
  let summary = "the router logits' gradient of the load-balancing loss";
  let description = [{
    ```mlir
    %dlogits = mt.moe_aux_loss_grad %dloss, %logits topk = 2 score = softmax coeff = 1.000000e-02
        : (tensor<f32>, tensor<512x8xf32>) -> tensor<512x8xf32>
    ```
  }];
  let arguments = (ins RankedTensorOf<[F32]>:$loss_grad, Mt_FloatTensor:$logits,
                       I64Attr:$topk, Mt_MoeScoreFunction:$score_function,
                       F64Attr:$coeff, OptionalAttr<I64Attr>:$sequence_length);
  let results = (outs Mt_FloatTensor:$result);
  let assemblyFormat = [{
    $loss_grad `,` $logits `topk` `=` $topk `score` `=` $score_function
    `coeff` `=` $coeff (`per_sequence` `=` $sequence_length^)? attr-dict `:`
    functional-type(operands, results)
  }];
  let hasVerifier = 1;
}

def Mt_MoeZLossGradOp : Mt_Op<"moe_z_loss_grad", [Pure]> {
  let summary = "the router logits' gradient of the z-loss";
  let description = [{
    `loss_grad * coeff * 2 / T * logsumexp(logits[t]) * softmax(logits[t])`.

    ```mlir
    %dlogits = mt.moe_z_loss_grad %dloss, %logits coeff = 1.000000e-03
        : (tensor<f32>, tensor<512x8xf32>) -> tensor<512x8xf32>
    ```
  }];
  let arguments = (ins RankedTensorOf<[F32]>:$loss_grad, Mt_FloatTensor:$logits,
                       F64Attr:$coeff);
  let results = (outs Mt_FloatTensor:$result);
  let assemblyFormat = [{
    $loss_grad `,` $logits `coeff` `=` $coeff attr-dict `:`
    functional-type(operands, results)
  }];
  let hasVerifier = 1;
}

def Mt_MoeTokensPerExpertOp : Mt_Op<"moe_tokens_per_expert", [Pure]> {
  let summary = "the number of tokens routed to each expert";
  let description = [{
    `result[e]` counts the entries of routing indices `[T, K]` equal to `e`
    (dropped slots, -1, count for none), as f32: the load that Megatron-LM's
    router adds to `local_tokens_per_expert` for the expert bias's update
    (aux-loss-free balancing). A training step accumulates it into the
    expert bias parameter's gradient (`mt.parameter`'s
    `expert_bias_update_rate`). It has no gradient.

    ```mlir
    %load = mt.moe_tokens_per_expert %indices
        : (tensor<512x2xi32>) -> tensor<8xf32>
    ```
  }];
  let arguments = (ins RankedTensorOf<[I32]>:$indices);
  let results = (outs RankedTensorOf<[F32]>:$result);
  let assemblyFormat = [{
    $indices attr-dict `:` functional-type(operands, results)
  }];
  let hasVerifier = 1;
}

def Mt_MoeProbsGradOp : Mt_Op<"moe_probs_grad", [Pure]> {
  let summary = "the routing weights' gradient of a weighted permutation";
  let description = [{
    `result[t, k] = dot(tokens[t], rows[pos(t, k)])` for the kept slots of
    indices `[T, K]`, 0 for dropped ones: the weights' gradient of
    `mt.moe_unpermute` (tokens: the output gradient, rows: its rows) and of
    `mt.moe_permute` (tokens: its input, rows: the output gradient).

    ```mlir
    %dprobs = mt.moe_probs_grad %dy, %rows, %indices
        : (tensor<512x128xf32>, tensor<1024x128xf32>, tensor<512x2xi32>) -> tensor<512x2xf32>
    ```
  }];
  let arguments = (ins Mt_FloatTensor:$tokens, Mt_FloatTensor:$rows,
                       RankedTensorOf<[I32]>:$indices);
  let results = (outs Mt_FloatTensor:$result);
  let assemblyFormat = [{
    $tokens `,` $rows `,` $indices attr-dict `:`
    functional-type(operands, results)
  }];
  let hasVerifier = 1;
}

def Mt_MoeGroupedLinearWeightGradOp : Mt_Op<"moe_grouped_linear_weight_grad",
    [Pure]> {
  let summary = "each expert's weight gradient over its group of rows";
  let description = [{
    Expert e's `input_e^T @ output_grad_e` over its group's rows, laid out
    as the weight: `[E, in, out]`, or `[E, out, in]` with
    `transpose_weight`; zero for an expert no token reached. E is the
    result's first dimension.

    ```mlir
    %dw = mt.moe_grouped_linear_weight_grad %rows, %dh, %indices transpose_weight
        : (tensor<1024x128xf32>, tensor<1024x352xf32>, tensor<512x2xi32>) -> tensor<8x352x128xf32>
    ```
  }];
  let arguments = (ins Mt_FloatTensor:$input, Mt_FloatTensor:$output_grad,
                       RankedTensorOf<[I32]>:$indices,
                       UnitAttr:$transpose_weight);
  let results = (outs Mt_FloatTensor:$result);
  let assemblyFormat = [{
    $input `,` $output_grad `,` $indices
    (`transpose_weight` $transpose_weight^)? attr-dict `:`
    functional-type(operands, results)
  }];
  let hasVerifier = 1;
}

#endif // MT_MOE_OPS_TD
