//===- MtOps.td - Operations of the mt dialect -------------*- tablegen -*-===//

#ifndef MT_OPS_TD
#define MT_OPS_TD

include "MtBase.td"
include "MtAttrs.td"
include "MtInterfaces.td"
include "mlir/IR/SymbolInterfaces.td"
include "mlir/Interfaces/SideEffectInterfaces.td"

// Shorthand for the forward ops that implement their VJP rule.
defvar VJP = DeclareOpInterfaceMethods<Mt_DifferentiableOpInterface>;

//===----------------------------------------------------------------------===//
// Parameters
//===----------------------------------------------------------------------===//

def Mt_ParameterOp : Mt_Op<"parameter", [Symbol]> {
  let summary = "declares a trainable parameter with its global shape and init";
  let description = [{
    Declares a trainable tensor, by name, with its global (unsharded) shape and
    how it is initialized. Names follow Hugging Face's GPT-2 and Llama naming so
    that weights can be exchanged with other frameworks.

    `init = normal` draws from N(0, std^2) and needs `std`; `zeros` and `ones`
    take no `std`. Scaled initializations (Megatron-LM's output-layer init)
    are expressed by the std the front end computes.

    With `expert_bias_update_rate = r` the parameter is an MoE router's
    expert bias (`[E]`, Megatron-LM's aux-loss-free balancing,
    `--moe-router-enable-expert-bias`): the optimizer does not train it.
    What a training step accumulates into its gradient is the number of
    tokens routed to each expert (`mt.moe_tokens_per_expert`), and after
    each iteration the runtime adds `r * sign(mean - count)` to each entry
    (Megatron-LM's `get_updated_expert_bias`); it is outside the gradient
    norm and saved with the other parameters.

    ```mlir
    mt.parameter @transformer.wte.weight : tensor<50304x768xf32> init = normal std = 2.000000e-02
    mt.parameter @transformer.ln_f.bias : tensor<768xf32> init = zeros
    mt.parameter @model.layers.0.mlp.gate.e_score_correction_bias : tensor<8xf32> init = zeros expert_bias_update_rate = 1.000000e-03
    ```
  }];
  let arguments = (ins SymbolNameAttr:$sym_name,
                       TypeAttrOf<Mt_FloatTensor>:$type,
                       Mt_InitMethod:$init,
                       OptionalAttr<F64Attr>:$std,
                       OptionalAttr<F64Attr>:$expert_bias_update_rate);
  let assemblyFormat = [{
    $sym_name `:` $type `init` `=` $init (`std` `=` $std^)?
    (`expert_bias_update_rate` `=` $expert_bias_update_rate^)? attr-dict
  }];
  let hasVerifier = 1;
  let extraClassDeclaration = [{
    ::mlir::RankedTensorType getTensorType() {
      return ::llvm::cast<::mlir::RankedTensorType>(getType());
    }
  }];
}

def Mt_GetParameterOp : Mt_Op<"get_parameter",
    [Pure, DeclareOpInterfaceMethods<SymbolUserOpInterface>]> {
  let summary = "reads the current value of a parameter inside a function";
  let description = [{
    Yields the value of the `mt.parameter` named by `name`. The result type
    must be the parameter's declared type.

    ```mlir
    %wte = mt.get_parameter @transformer.wte.weight : tensor<50304x768xf32>
    ```
  }];
  let arguments = (ins FlatSymbolRefAttr:$name);
  let results = (outs Mt_FloatTensor:$result);
  let assemblyFormat = "$name attr-dict `:` type($result)";
}

//===----------------------------------------------------------------------===//
// Embeddings and positions
//===----------------------------------------------------------------------===//

def Mt_EmbeddingOp : Mt_Op<"embedding", [VJP, Pure]> {
  let summary = "looks up rows of an embedding table";
  let description = [{
    Gathers `table[ids]`: the table is `vocabulary x hidden`; the result has the
    ids' shape with the hidden size appended. Ids outside the table are an
    error at run time.

    `vocab_shard_axes` (set by shard-partition, Megatron-LM's
    vocabulary-parallel embedding) says the table is this rank's block of
    the vocabulary: rows `[i * V, (i + 1) * V)` for the rank's index `i`
    along those grid axes of a `V`-row table. Ids outside the block give
    zero rows; an all-reduce over the same axes completes the lookup.

    ```mlir
    %h = mt.embedding %wte, %tokens
        : (tensor<50304x768xf32>, tensor<8x1024xi32>) -> tensor<8x1024x768xf32>
    ```
  }];
  let arguments = (ins Mt_FloatTensor:$table, Mt_IndexTensor:$ids,
                       OptionalAttr<DenseI64ArrayAttr>:$vocab_shard_axes);
  let results = (outs Mt_FloatTensor:$result);
  let assemblyFormat = [{
    $table `,` $ids attr-dict `:` functional-type(operands, results)
  }];
  let hasVerifier = 1;
}

def Mt_PositionIdsOp : Mt_Op<"position_ids", [Pure]> {
  let summary = "the position of each token along the sequence";
  let description = [{
    Produces an integer tensor whose every element is its own index along the
    last dimension (the sequence): for `tensor<BxSxi32>`, `result[b, s] = s`.
    Used with `mt.embedding` for learned absolute position embeddings.

    ```mlir
    %pos = mt.position_ids : tensor<8x1024xi32>
    ```
  }];
  let results = (outs Mt_IndexTensor:$result);
  let assemblyFormat = "attr-dict `:` type($result)";
  let hasVerifier = 1;
}

//===----------------------------------------------------------------------===//
// Normalization
//===----------------------------------------------------------------------===//

def Mt_LayerNormOp : Mt_Op<"layer_norm", [VJP, Pure]> {
  let summary = "layer normalization over the last dimension";
  let description = [{
    `(x - mean(x)) / sqrt(var(x) + epsilon) * weight + bias`, with mean and
    (biased) variance over the last dimension. Weight and the optional bias are
    rank 1 and as long as the last dimension. The result has the input's type.

    ```mlir
    %y = mt.layer_norm %x, %w, %b epsilon = 1.000000e-05
        : (tensor<8x1024x768xf32>, tensor<768xf32>, tensor<768xf32>) -> tensor<8x1024x768xf32>
    ```
  }];
  let arguments = (ins Mt_FloatTensor:$input, Mt_FloatTensor:$weight,
                       Optional<Mt_FloatTensor>:$bias, F64Attr:$epsilon);
  let results = (outs Mt_FloatTensor:$result);
  let assemblyFormat = [{
    $input `,` $weight (`,` $bias^)? `epsilon` `=` $epsilon attr-dict `:`
    functional-type(operands, results)
  }];
  let hasVerifier = 1;
}

def Mt_RmsNormOp : Mt_Op<"rms_norm", [VJP, Pure]> {
  let summary = "root-mean-square normalization over the last dimension";
  let description = [{
    `x / sqrt(mean(x^2) + epsilon) * weight` over the last dimension, as in
    Llama. The weight is rank 1 and as long as the last dimension.

    ```mlir
    %y = mt.rms_norm %x, %w epsilon = 1.000000e-06
        : (tensor<4x512x256xf32>, tensor<256xf32>) -> tensor<4x512x256xf32>
    ```
  }];
  let arguments = (ins Mt_FloatTensor:$input, Mt_FloatTensor:$weight,
                       F64Attr:$epsilon);
  let results = (outs Mt_FloatTensor:$result);
  let assemblyFormat = [{
    $input `,` $weight `epsilon` `=` $epsilon attr-dict `:`
    functional-type(operands, results)
  }];
  let hasVerifier = 1;
}

//===----------------------------------------------------------------------===//
// Linear algebra
//===----------------------------------------------------------------------===//

def Mt_LinearOp : Mt_Op<"linear", [VJP, Pure]> {
  let summary = "an affine layer: input times weight plus an optional bias";
  let description = [{
    `y = x @ W + b` over the last dimension of `x`. The weight is `in x out`
    (Hugging Face GPT-2's Conv1D layout); with `transpose_weight` it is
    `out x in` (torch.nn.Linear, Megatron-LM and Llama's layout, and a tied
    output layer reading the `vocabulary x hidden` embedding table). The bias,
    when present, is rank 1 and as long as the output dimension.

    ```mlir
    %qkv = mt.linear %x, %w, %b
        : (tensor<8x1024x768xf32>, tensor<768x2304xf32>, tensor<2304xf32>) -> tensor<8x1024x2304xf32>
    %logits = mt.linear %h, %wte transpose_weight
        : (tensor<8x1024x768xf32>, tensor<50304x768xf32>) -> tensor<8x1024x50304xf32>
    ```
  }];
  let arguments = (ins Mt_FloatTensor:$input, Mt_FloatTensor:$weight,
                       Optional<Mt_FloatTensor>:$bias,
                       UnitAttr:$transpose_weight);
  let results = (outs Mt_FloatTensor:$result);
  let assemblyFormat = [{
    $input `,` $weight (`,` $bias^)? (`transpose_weight` $transpose_weight^)?
    attr-dict `:` functional-type(operands, results)
  }];
  let hasVerifier = 1;
}

def Mt_BiasAddOp : Mt_Op<"bias_add", [VJP, Pure,
    AllTypesMatch<["input", "result"]>]> {
  let summary = "adds a bias along the last dimension";
  let description = [{
    `y[..., n] = x[..., n] + bias[n]`. Tensor parallelism splits a row-parallel
    `mt.linear` into a local product, an all-reduce and this op, so that the
    bias is added once, after the reduction, as Megatron-LM's RowParallelLinear
    does.

    ```mlir
    %y = mt.bias_add %x, %b : (tensor<8x1024x768xf32>, tensor<768xf32>) -> tensor<8x1024x768xf32>
    ```
  }];
  let arguments = (ins Mt_FloatTensor:$input, Mt_FloatTensor:$bias);
  let results = (outs Mt_FloatTensor:$result);
  let assemblyFormat = [{
    $input `,` $bias attr-dict `:` functional-type(operands, results)
  }];
  let hasVerifier = 1;
}

def Mt_MatmulOp : Mt_Op<"matmul", [VJP, Pure]> {
  let summary = "batched matrix product over the last two dimensions";
  let description = [{
    Multiplies the trailing matrices of two tensors of equal rank (at least 2);
    the leading (batch) dimensions must be equal. `transpose_lhs` and
    `transpose_rhs` swap the last two dimensions of an operand first.

    ```mlir
    %s = mt.matmul %q, %k transpose_rhs
        : (tensor<8x12x1024x64xf32>, tensor<8x12x1024x64xf32>) -> tensor<8x12x1024x1024xf32>
    ```
  }];
  let arguments = (ins Mt_FloatTensor:$lhs, Mt_FloatTensor:$rhs,
                       UnitAttr:$transpose_lhs, UnitAttr:$transpose_rhs);
  let results = (outs Mt_FloatTensor:$result);
  let assemblyFormat = [{
    $lhs `,` $rhs (`transpose_lhs` $transpose_lhs^)?
    (`transpose_rhs` $transpose_rhs^)? attr-dict `:`
    functional-type(operands, results)
  }];
  let hasVerifier = 1;
}

//===----------------------------------------------------------------------===//
// Attention
//===----------------------------------------------------------------------===//

def Mt_AttentionOp : Mt_Op<"attention", [VJP, Pure]> {
  let summary = "the scaled dot-product attention core, with grouped-query heads";
  let description = [{
    `softmax(scale * Q K^T + mask) V` per head, in the `batch x sequence x
    heads x head_dim` layout. Query heads are split into groups that share one
    key/value head: the query head count must be a multiple of the key/value
    head count (equal for multi-head attention, 1 for multi-query attention).
    `causal` masks keys after the query position and needs equal query and key
    lengths. `scale` defaults to `1/sqrt(head_dim)`. `dropout_p` drops
    attention probabilities with the stream `seed`; the mask is a function of
    the seed, the training step and the element's global position only.

    ```mlir
    %o = mt.attention %q, %k, %v causal
        : (tensor<4x512x8x32xf32>, tensor<4x512x2x32xf32>, tensor<4x512x2x32xf32>) -> tensor<4x512x8x32xf32>
    ```
  }];
  let arguments = (ins Mt_FloatTensor:$query, Mt_FloatTensor:$key,
                       Mt_FloatTensor:$value, UnitAttr:$causal,
                       OptionalAttr<F64Attr>:$scale,
                       DefaultValuedAttr<F64Attr, "0.0">:$dropout_p,
                       DefaultValuedAttr<I64Attr, "0">:$seed);
  let results = (outs Mt_FloatTensor:$result);
  let assemblyFormat = [{
    $query `,` $key `,` $value (`causal` $causal^)? attr-dict `:`
    functional-type(operands, results)
  }];
  let hasVerifier = 1;
}

def Mt_RopeOp : Mt_Op<"rope", [VJP, Pure, AllTypesMatch<["input", "result"]>]> {
  let summary = "rotary position embedding";
  let description = [{
    Rotates pairs of features of each head by an angle proportional to the
    token's position, in the rotate-half form of GPT-NeoX, Llama and
    Megatron-LM. The input is `batch x sequence x heads x head_dim`; the first
    `rotary_dim` features (all of them by default; even) are rotated with
    frequencies `base^(-2i/rotary_dim)`, the rest pass through. `inverse`
    rotates by the negative angle: it undoes the rotation and is its VJP.

    Hugging Face's RoPE scalings rescale the inverse frequencies f:
    `scaling_factor` alone divides every one ("linear"); with
    `low_freq_factor`, `high_freq_factor` and `original_max_positions` it is
    Llama 3.1's "llama3": by wavelength w = 2 pi / f, w < original / high
    keeps f, w > original / low gives f / factor, and between them, with
    s = (original / w - low) / (high - low), (1 - s) f / factor + s f.
    The three llama3 attributes come together, with high above low.

    YaRN ("yarn"): with `beta_fast` and `beta_slow` (rotations), pairs whose
    dimension lies below d(beta_fast) keep f, those above d(beta_slow) get
    f / factor, and a linear ramp blends them between, where
    d(r) = rotary_dim ln(original / (2 pi r)) / (2 ln base), floored and
    ceiled unless `truncate` is false, clamped to [0, rotary_dim - 1], as
    transformers' _compute_yarn_parameters. `attention_factor` multiplies the
    rotated result (cos and sin alike, YaRN's mscale); any scaling may carry
    it, and `inverse` multiplies by it too, as the transpose of a scaled
    rotation.

    ```mlir
    %q2 = mt.rope %q base = 1.000000e+04 : tensor<4x512x8x32xf32>
    %q3 = mt.rope %q base = 5.000000e+05 {scaling_factor = 8.0 : f64,
        low_freq_factor = 1.0 : f64, high_freq_factor = 4.0 : f64,
        original_max_positions = 8192 : i64} : tensor<4x512x8x32xf32>
    %q4 = mt.rope %q base = 1.000000e+04 {scaling_factor = 4.0 : f64,
        original_max_positions = 4096 : i64, beta_fast = 32.0 : f64,
        beta_slow = 1.0 : f64, attention_factor = 1.1386 : f64}
        : tensor<4x512x8x32xf32>
    ```
  }];
  let arguments = (ins Mt_FloatTensor:$input, F64Attr:$base,
                       OptionalAttr<I64Attr>:$rotary_dim, UnitAttr:$inverse,
                       OptionalAttr<F64Attr>:$scaling_factor,
                       OptionalAttr<F64Attr>:$low_freq_factor,
                       OptionalAttr<F64Attr>:$high_freq_factor,
                       OptionalAttr<I64Attr>:$original_max_positions,
                       OptionalAttr<F64Attr>:$beta_fast,
                       OptionalAttr<F64Attr>:$beta_slow,
                       OptionalAttr<BoolAttr>:$truncate,
                       OptionalAttr<F64Attr>:$attention_factor);
  let results = (outs Mt_FloatTensor:$result);
  let assemblyFormat = [{
    $input `base` `=` $base (`inverse` $inverse^)? attr-dict `:` type($input)
  }];
  let hasVerifier = 1;
}

//===----------------------------------------------------------------------===//
// Activations, dropout and elementwise arithmetic
//===----------------------------------------------------------------------===//

def Mt_GeluOp : Mt_Op<"gelu", [VJP, Pure, AllTypesMatch<["input", "result"]>]> {
  let summary = "Gaussian error linear unit";
  let description = [{
    `x * Phi(x)` with Phi evaluated exactly (`erf`) or with the tanh
    approximation (`tanh`, GPT-2's `gelu_new` and Megatron-LM's default).

    ```mlir
    %y = mt.gelu %x approximate = tanh : tensor<8x1024x3072xf32>
    ```
  }];
  let arguments = (ins Mt_FloatTensor:$input,
                       Mt_GeluApproximation:$approximate);
  let results = (outs Mt_FloatTensor:$result);
  let assemblyFormat = [{
    $input `approximate` `=` $approximate attr-dict `:` type($input)
  }];
}

def Mt_SiluOp : Mt_Op<"silu", [VJP, Pure, AllTypesMatch<["input", "result"]>]> {
  let summary = "sigmoid linear unit, x * sigmoid(x)";
  let description = [{
    ```mlir
    %y = mt.silu %x : tensor<4x512x688xf32>
    ```
  }];
  let arguments = (ins Mt_FloatTensor:$input);
  let results = (outs Mt_FloatTensor:$result);
  let assemblyFormat = "$input attr-dict `:` type($input)";
}

def Mt_SwigluOp : Mt_Op<"swiglu",
    [VJP, Pure, AllTypesMatch<["gate", "up", "result"]>]> {
  let summary = "the SwiGLU gate: silu(gate) * up";
  let description = [{
    The gated activation of Llama's MLP. Gate and up projections are separate
    operands (Hugging Face's gate_proj and up_proj) so that each can be
    sharded column-parallel on its own.

    ```mlir
    %y = mt.swiglu %gate, %up : tensor<4x512x688xf32>
    ```
  }];
  let arguments = (ins Mt_FloatTensor:$gate, Mt_FloatTensor:$up);
  let results = (outs Mt_FloatTensor:$result);
  let assemblyFormat = "$gate `,` $up attr-dict `:` type($result)";
}

def Mt_DropoutOp : Mt_Op<"dropout", [VJP, Pure, AllTypesMatch<["input", "result"]>]> {
  let summary = "inverted dropout with a seeded, layout-independent mask";
  let description = [{
    Zeroes each element with probability `p` and scales the rest by
    `1/(1-p)`. The mask is a function of `seed` (one stream per dropout site),
    the training step and the element's global position only, so it does not
    change with the parallel layout. `p` is in [0, 1).

    ```mlir
    %y = mt.dropout %x p = 1.000000e-01 seed = 3 : tensor<8x1024x768xf32>
    ```
  }];
  let arguments = (ins Mt_FloatTensor:$input, F64Attr:$p, I64Attr:$seed);
  let results = (outs Mt_FloatTensor:$result);
  let assemblyFormat = [{
    $input `p` `=` $p `seed` `=` $seed attr-dict `:` type($input)
  }];
  let hasVerifier = 1;
}

def Mt_AddOp : Mt_Op<"add", [VJP, Pure, Commutative,
    AllTypesMatch<["lhs", "rhs", "result"]>]> {
  let summary = "elementwise sum of two tensors of one type";
  let description = [{
    ```mlir
    %r = mt.add %x, %attn_out : tensor<8x1024x768xf32>
    ```
  }];
  let arguments = (ins Mt_FloatTensor:$lhs, Mt_FloatTensor:$rhs);
  let results = (outs Mt_FloatTensor:$result);
  let assemblyFormat = "$lhs `,` $rhs attr-dict `:` type($result)";
}

def Mt_MulOp : Mt_Op<"mul", [VJP, Pure, Commutative,
    AllTypesMatch<["lhs", "rhs", "result"]>]> {
  let summary = "elementwise product of two tensors of one type";
  let description = [{
    ```mlir
    %r = mt.mul %a, %b : tensor<4x512x688xf32>
    ```
  }];
  let arguments = (ins Mt_FloatTensor:$lhs, Mt_FloatTensor:$rhs);
  let results = (outs Mt_FloatTensor:$result);
  let assemblyFormat = "$lhs `,` $rhs attr-dict `:` type($result)";
}

def Mt_SoftmaxOp : Mt_Op<"softmax", [VJP, Pure, AllTypesMatch<["input", "result"]>]> {
  let summary = "softmax along one axis";
  let description = [{
    `exp(x - max(x)) / sum(exp(x - max(x)))` along `axis`; negative axes count
    from the end.

    ```mlir
    %p = mt.softmax %s axis = -1 : tensor<8x12x1024x1024xf32>
    ```
  }];
  let arguments = (ins Mt_FloatTensor:$input, I64Attr:$axis);
  let results = (outs Mt_FloatTensor:$result);
  let assemblyFormat = "$input `axis` `=` $axis attr-dict `:` type($input)";
  let hasVerifier = 1;
}

//===----------------------------------------------------------------------===//
// Loss
//===----------------------------------------------------------------------===//

def Mt_CrossEntropyOp : Mt_Op<"cross_entropy", [VJP, Pure]> {
  let summary = "softmax cross-entropy of logits against integer labels";
  let description = [{
    Per token, `logsumexp(logits) - logits[label]` over the last (vocabulary)
    dimension, computed in f32 whatever the logits' type. Tokens whose label
    equals `ignore_index` (default -100, as in PyTorch) contribute nothing.
    `mean` divides the sum by the number of tokens not ignored and yields a
    scalar; `sum` yields the scalar sum; `none` yields one loss per token.

    ```mlir
    %loss = mt.cross_entropy %logits, %labels reduction = mean
        : (tensor<8x1024x50304xf32>, tensor<8x1024xi32>) -> tensor<f32>
    ```
  }];
  let arguments = (ins Mt_FloatTensor:$logits, Mt_IndexTensor:$labels,
                       Mt_LossReduction:$reduction,
                       DefaultValuedAttr<I64Attr, "-100">:$ignore_index);
  let results = (outs RankedTensorOf<[F32]>:$result);
  let assemblyFormat = [{
    $logits `,` $labels `reduction` `=` $reduction attr-dict `:`
    functional-type(operands, results)
  }];
  let hasVerifier = 1;
}

//===----------------------------------------------------------------------===//
// Shape manipulation
//===----------------------------------------------------------------------===//

def Mt_ReshapeOp : Mt_Op<"reshape", [VJP, Pure]> {
  let summary = "reinterprets a tensor's elements under a new shape";
  let description = [{
    Row-major reshape; the element count and type are kept.

    ```mlir
    %heads = mt.reshape %q : tensor<8x1024x768xf32> -> tensor<8x1024x12x64xf32>
    ```
  }];
  let arguments = (ins Mt_FloatTensor:$input);
  let results = (outs Mt_FloatTensor:$result);
  let assemblyFormat = "$input attr-dict `:` type($input) `->` type($result)";
  let hasVerifier = 1;
}

def Mt_TransposeOp : Mt_Op<"transpose", [VJP, Pure]> {
  let summary = "permutes a tensor's dimensions";
  let description = [{
    Result dimension `i` is input dimension `permutation[i]`.

    ```mlir
    %t = mt.transpose %x permutation = [0, 2, 1, 3]
        : tensor<8x1024x12x64xf32> -> tensor<8x12x1024x64xf32>
    ```
  }];
  let arguments = (ins Mt_FloatTensor:$input, DenseI64ArrayAttr:$permutation);
  let results = (outs Mt_FloatTensor:$result);
  let assemblyFormat = [{
    $input `permutation` `=` $permutation attr-dict `:` type($input) `->`
    type($result)
  }];
  let hasVerifier = 1;
}

def Mt_SplitOp : Mt_Op<"split", [VJP, Pure]> {
  let summary = "splits a tensor into consecutive pieces along one axis";
  let description = [{
    The pieces' sizes along `axis` are their result types' and must add up to
    the input's; every other dimension is kept. Splits fused QKV projections,
    also with grouped-query attention's unequal sizes.

    ```mlir
    %q, %k, %v = mt.split %qkv axis = 2
        : tensor<4x512x384xf32> -> tensor<4x512x256xf32>, tensor<4x512x64xf32>, tensor<4x512x64xf32>
    ```
  }];
  let arguments = (ins Mt_FloatTensor:$input, I64Attr:$axis);
  let results = (outs Variadic<Mt_FloatTensor>:$results);
  let assemblyFormat = [{
    $input `axis` `=` $axis attr-dict `:` type($input) `->` type($results)
  }];
  let hasVerifier = 1;
}

def Mt_ConcatOp : Mt_Op<"concat", [VJP, Pure]> {
  let summary = "joins tensors along one axis";
  let description = [{
    Inputs share their rank, element type and every dimension but `axis`; the
    result's `axis` dimension is the sum of theirs.

    ```mlir
    %kv = mt.concat %k, %v axis = 2
        : tensor<4x512x64xf32>, tensor<4x512x64xf32> -> tensor<4x512x128xf32>
    ```
  }];
  let arguments = (ins Variadic<Mt_FloatTensor>:$inputs, I64Attr:$axis);
  let results = (outs Mt_FloatTensor:$result);
  let assemblyFormat = [{
    $inputs `axis` `=` $axis attr-dict `:` type($inputs) `->` type($result)
  }];
  let hasVerifier = 1;
}

//===----------------------------------------------------------------------===//
// Vocabulary-parallel cross-entropy (written by shard-partition)
//===----------------------------------------------------------------------===//

// Megatron-LM's vocabulary-parallel cross-entropy: each tensor-parallel rank
// holds a block of the vocabulary's logits; the row maximum, the sum of
// exponentials and the target logit are all-reduced over the tensor axis,
// so no rank ever holds whole logits. `mt.cross_entropy` and its gradient
// partition into these ops and `shard.all_reduce`s.

def Mt_VocabMaxOp : Mt_Op<"vocab_max", [Pure]> {
  let summary = "each row's largest logit";
  let description = [{
    The maximum over the last (vocabulary) dimension, in f32; an all-reduce
    with `max` makes it the maximum over the whole vocabulary.

    ```mlir
    %m = mt.vocab_max %logits : (tensor<8x1024x25152xf32>) -> tensor<8x1024xf32>
    ```
  }];
  let arguments = (ins Mt_FloatTensor:$logits);
  let results = (outs RankedTensorOf<[F32]>:$result);
  let assemblyFormat = [{
    $logits attr-dict `:` functional-type(operands, results)
  }];
  let hasVerifier = 1;
}

def Mt_VocabPartialsOp : Mt_Op<"vocab_partials", [Pure]> {
  let summary = "each row's sum of exponentials and target logit over a vocabulary block";
  let description = [{
    Given logits, labels and each row's maximum `m` (over the whole
    vocabulary), yields `[rows..., 2]`: `sum(exp(logits - m))` over the
    rank's block, and `logits[label] - m` if the label falls in the block
    (zero otherwise: an ignored label falls in no block). The block
    starts at `i * V` for the rank's index `i` along `vocab_shard_axes` and
    `V` the logits' last dimension (at 0 without the attribute). An
    all-reduce with `sum` gives the whole vocabulary's values.

    ```mlir
    %p = mt.vocab_partials %logits, %labels, %m {vocab_shard_axes = array<i64: 1>}
        : (tensor<8x1024x25152xf32>, tensor<8x1024xi32>, tensor<8x1024xf32>) -> tensor<8x1024x2xf32>
    ```
  }];
  let arguments = (ins Mt_FloatTensor:$logits, Mt_IndexTensor:$labels,
                       RankedTensorOf<[F32]>:$max,
                       OptionalAttr<DenseI64ArrayAttr>:$vocab_shard_axes);
  let results = (outs RankedTensorOf<[F32]>:$result);
  let assemblyFormat = [{
    $logits `,` $labels `,` $max attr-dict `:` functional-type(operands, results)
  }];
  let hasVerifier = 1;
}

def Mt_VocabCrossEntropyOp : Mt_Op<"vocab_cross_entropy", [Pure]> {
  let summary = "cross-entropy from the whole vocabulary's partials";
  let description = [{
    Per row, `log(sum_exp) - target` from `mt.vocab_partials`' all-reduced
    `[rows..., 2]`, reduced as `mt.cross_entropy` does (`mean` over the rows
    whose label is not `ignore_index`, `sum`, or `none`).

    ```mlir
    %loss = mt.vocab_cross_entropy %p, %labels reduction = mean
        : (tensor<8x1024x2xf32>, tensor<8x1024xi32>) -> tensor<f32>
    ```
  }];
  let arguments = (ins RankedTensorOf<[F32]>:$partials, Mt_IndexTensor:$labels,
                       Mt_LossReduction:$reduction,
                       DefaultValuedAttr<I64Attr, "-100">:$ignore_index);
  let results = (outs RankedTensorOf<[F32]>:$result);
  let assemblyFormat = [{
    $partials `,` $labels `reduction` `=` $reduction attr-dict `:`
    functional-type(operands, results)
  }];
  let hasVerifier = 1;
}

def Mt_VocabCrossEntropyGradOp : Mt_Op<"vocab_cross_entropy_grad", [Pure]> {
  let summary = "the gradient of a vocabulary block's logits";
  let description = [{
    `(exp(logits - m) / sum_exp - onehot(label)) * loss_grad` on the rank's
    vocabulary block (see `mt.vocab_partials`), divided by the number of
    rows not ignored for `mean`, zero on ignored rows: `mt.cross_entropy_grad`
    restricted to the block, from the whole vocabulary's maximum and
    partials.

    ```mlir
    %dlogits = mt.vocab_cross_entropy_grad %dloss, %logits, %labels, %m, %p reduction = mean
        : (tensor<f32>, tensor<8x1024x25152xf32>, tensor<8x1024xi32>, tensor<8x1024xf32>, tensor<8x1024x2xf32>) -> tensor<8x1024x25152xf32>
    ```
  }];
  let arguments = (ins RankedTensorOf<[F32]>:$loss_grad,
                       Mt_FloatTensor:$logits, Mt_IndexTensor:$labels,
                       RankedTensorOf<[F32]>:$max,
                       RankedTensorOf<[F32]>:$partials,
                       Mt_LossReduction:$reduction,
                       DefaultValuedAttr<I64Attr, "-100">:$ignore_index,
                       OptionalAttr<DenseI64ArrayAttr>:$vocab_shard_axes);
  let results = (outs Mt_FloatTensor:$result);
  let assemblyFormat = [{
    $loss_grad `,` $logits `,` $labels `,` $max `,` $partials
    `reduction` `=` $reduction attr-dict `:` functional-type(operands, results)
  }];
  let hasVerifier = 1;
}

include "MtGradOps.td"
include "MtFusedOps.td"
include "MtGroupOps.td"
include "MtAsyncOps.td"
include "MtContextParallelOps.td"
include "MtMoeOps.td"
include "MtExpertParallelOps.td"

#endif // MT_OPS_TD
