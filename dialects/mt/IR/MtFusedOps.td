//===- MtFusedOps.td - GEMMs fused with their epilogues ----*- tablegen -*-===//
//
// The ops `mt-fuse-gemm-epilogues` forms after differentiation: a linear layer
// together with the elementwise work around it that cuBLASLt does in the
// GEMM's epilogue (the tanh GeLU, its gradient, bias gradients, and an add of
// the result to another tensor through the product's C operand). Each is
// defined as the sequence of unfused ops it replaces, and the host backend
// computes exactly that sequence.
//
//===----------------------------------------------------------------------===//

#ifndef MT_FUSED_OPS_TD
#define MT_FUSED_OPS_TD

def Mt_LinearGeluOp : Mt_Op<"linear_gelu", [Pure]> {
  let summary = "gelu of a linear layer, also yielding the pre-activation";
  let description = [{
    `pre_activation = mt.linear(input, weight[, bias])` and
    `output = mt.gelu(pre_activation)`: the two ops fused into one GEMM whose
    epilogue adds the bias and applies the GeLU (cuBLASLt's
    `CUBLASLT_EPILOGUE_GELU_AUX_BIAS`, whose auxiliary output is the
    pre-activation that `mt.linear_gelu_grad` reads in the backward pass).

    ```mlir
    %y, %h = mt.linear_gelu %x, %w, %b approximate = tanh
        : (tensor<8x1024x768xf32>, tensor<768x3072xf32>, tensor<3072xf32>)
        -> (tensor<8x1024x3072xf32>, tensor<8x1024x3072xf32>)
    ```
  }];
  let arguments = (ins Mt_FloatTensor:$input, Mt_FloatTensor:$weight,
                       Optional<Mt_FloatTensor>:$bias,
                       Mt_GeluApproximation:$approximate,
                       UnitAttr:$transpose_weight);
  let results = (outs Mt_FloatTensor:$output,
                      Mt_FloatTensor:$pre_activation);
  let assemblyFormat = [{
    $input `,` $weight (`,` $bias^)? `approximate` `=` $approximate
    (`transpose_weight` $transpose_weight^)? attr-dict `:`
    functional-type(operands, results)
  }];
  let hasVerifier = 1;
}

def Mt_LinearGeluGradOp : Mt_Op<"linear_gelu_grad", [Pure]> {
  let summary = "gelu_grad of a linear layer's output, and its bias gradient";
  let description = [{
    `input_grad = mt.gelu_grad(mt.linear(output_grad, weight), pre_activation)`
    (the linear without a bias, `transpose_weight` as on `mt.linear`) and,
    with a second result, `bias_grad = mt.bias_grad(input_grad)`: in the
    backward pass of `linear -> gelu -> linear`, the data gradient of the
    second linear layer with the GeLU gradient (and the first layer's bias
    gradient). The cuda backend runs the GEMM into `input_grad` and then one
    kernel that applies the GeLU gradient in place and sums the bias
    gradient's columns as it writes them.

    ```mlir
    %dh, %db = mt.linear_gelu_grad %dy, %w, %h approximate = tanh
        : (tensor<8x1024x768xf32>, tensor<3072x768xf32>, tensor<8x1024x3072xf32>)
        -> (tensor<8x1024x3072xf32>, tensor<3072xf32>)
    ```
  }];
  let arguments = (ins Mt_FloatTensor:$output_grad, Mt_FloatTensor:$weight,
                       Mt_FloatTensor:$pre_activation,
                       Mt_GeluApproximation:$approximate,
                       UnitAttr:$transpose_weight);
  let results = (outs Mt_FloatTensor:$input_grad,
                      Optional<Mt_FloatTensor>:$bias_grad);
  let assemblyFormat = [{
    $output_grad `,` $weight `,` $pre_activation `approximate` `=`
    $approximate (`transpose_weight` $transpose_weight^)? attr-dict `:`
    functional-type(operands, results)
  }];
  let hasVerifier = 1;
}

def Mt_LinearAddOp : Mt_Op<"linear_add", [Pure]> {
  let summary = "a linear layer plus a tensor of its result's type";
  let description = [{
    `result = mt.add(mt.linear(input, weight[, bias]), addend)`: a residual
    connection's sum (or one data gradient added to another) in the GEMM
    that writes the linear layer. The cuda backend runs it as one cuBLASLt
    product with beta = 1 and the addend as C (D = A B + bias + C, rounded
    once into the result); the host backend computes the two ops it stands
    for.

    ```mlir
    %y = mt.linear_add %x, %w, %residual, %b
        : (tensor<8x1024x768xf32>, tensor<768x768xf32>,
           tensor<8x1024x768xf32>, tensor<768xf32>) -> tensor<8x1024x768xf32>
    ```
  }];
  let arguments = (ins Mt_FloatTensor:$input, Mt_FloatTensor:$weight,
                       Mt_FloatTensor:$addend,
                       Optional<Mt_FloatTensor>:$bias,
                       UnitAttr:$transpose_weight);
  let results = (outs Mt_FloatTensor:$result);
  let assemblyFormat = [{
    $input `,` $weight `,` $addend (`,` $bias^)?
    (`transpose_weight` $transpose_weight^)? attr-dict `:`
    functional-type(operands, results)
  }];
  let hasVerifier = 1;
}

def Mt_LinearWeightBiasGradOp : Mt_Op<"linear_weight_bias_grad", [Pure]> {
  let summary = "a linear layer's weight and bias gradients from one GEMM";
  let description = [{
    `weight_grad = mt.linear_weight_grad(input, output_grad)` and
    `bias_grad = mt.bias_grad(output_grad)`: the bias gradient is the
    weight-gradient GEMM's reduction of `output_grad` over the rows, done in
    its epilogue (cuBLASLt's `CUBLASLT_EPILOGUE_BGRADA` or `BGRADB`).

    ```mlir
    %dw, %db = mt.linear_weight_bias_grad %x, %dy
        : (tensor<8x1024x768xf32>, tensor<8x1024x2304xf32>)
        -> (tensor<768x2304xf32>, tensor<2304xf32>)
    ```
  }];
  let arguments = (ins Mt_FloatTensor:$input, Mt_FloatTensor:$output_grad,
                       UnitAttr:$transpose_weight);
  let results = (outs Mt_FloatTensor:$weight_grad, Mt_FloatTensor:$bias_grad);
  let assemblyFormat = [{
    $input `,` $output_grad (`transpose_weight` $transpose_weight^)? attr-dict
    `:` functional-type(operands, results)
  }];
  let hasVerifier = 1;
}

def Mt_LinearCrossEntropyOp : Mt_Op<"linear_cross_entropy", [Pure]> {
  let summary = "the output layer and its cross-entropy, with their gradients, in chunks of tokens";
  let description = [{
    `loss = mt.cross_entropy(mt.linear(input, weight), labels)` together with
    `input_grad` and `weight_grad`, the gradients of `loss` for a loss
    gradient of one: the tokens are processed `chunk_rows` at a time, so
    only one chunk's `chunk_rows x vocabulary` logits exist at once (a
    scratch block of the memory plan), never the whole vocabulary's logits
    and their gradient. Per chunk: the logits' GEMM, each row's maximum, sum
    of exponentials and target logit (the loss), the chunk's logit gradient
    `softmax - onehot(label)` (divided by the labelled tokens' count for
    `mean`) in place of the logits, then the two gradient GEMMs:
    `input_grad` rows of the chunk, and `weight_grad` accumulated over the
    chunks. The gradients are linear in the loss gradient, so the backward
    pass scales them by the actual seed (`mt.scale`) and no GEMM is
    repeated. `reduction` is `mean` or `sum`; `transpose_weight` reads a
    `vocabulary x hidden` weight (a tied embedding table or `lm_head`). The
    pass `mt-fuse-linear-cross-entropy` forms it.

    ```mlir
    %loss, %dx, %dw = mt.linear_cross_entropy %h, %wte, %labels reduction = mean
        chunk_rows = 2048 transpose_weight
        : (tensor<8x1024x768xf32>, tensor<50304x768xf32>, tensor<8x1024xi32>)
        -> (tensor<f32>, tensor<8x1024x768xf32>, tensor<50304x768xf32>)
    ```
  }];
  let arguments = (ins Mt_FloatTensor:$input, Mt_FloatTensor:$weight,
                       Mt_IndexTensor:$labels,
                       Mt_LossReduction:$reduction,
                       DefaultValuedAttr<I64Attr, "-100">:$ignore_index,
                       I64Attr:$chunk_rows,
                       UnitAttr:$transpose_weight);
  let results = (outs RankedTensorOf<[F32]>:$loss, Mt_FloatTensor:$input_grad,
                      Mt_FloatTensor:$weight_grad);
  let assemblyFormat = [{
    $input `,` $weight `,` $labels `reduction` `=` $reduction
    `chunk_rows` `=` $chunk_rows (`transpose_weight` $transpose_weight^)?
    attr-dict `:` functional-type(operands, results)
  }];
  let hasVerifier = 1;
}

// The vocabulary-parallel output layer in chunks of tokens: the three ops
// stand for `mt.linear` followed by `mt.vocab_max`, `mt.vocab_partials` and
// `mt.vocab_cross_entropy_grad` with the gradient's two GEMMs, and recompute
// each chunk's logits of the rank's vocabulary block instead of keeping
// them. The all-reduces between them (max of the maxima, sum of the
// partials) stay the partitioned program's `shard.all_reduce`s.

def Mt_LinearVocabMaxOp : Mt_Op<"linear_vocab_max", [Pure]> {
  let summary = "each row's largest logit of a vocabulary block, in chunks of tokens";
  let description = [{
    `mt.vocab_max(mt.linear(input, weight))`: per chunk of `chunk_rows`
    tokens, the chunk's logits of the rank's vocabulary block in a scratch
    block (the input's type), then each row's maximum (f32). An all-reduce
    with `max` over the vocabulary's grid axes makes it the whole
    vocabulary's. `transpose_weight` reads a `vocabulary x hidden` weight.

    ```mlir
    %m = mt.linear_vocab_max %h, %wte chunk_rows = 512 transpose_weight
        : (tensor<8x1024x768xf32>, tensor<25152x768xf32>) -> tensor<8x1024xf32>
    ```
  }];
  let arguments = (ins Mt_FloatTensor:$input, Mt_FloatTensor:$weight,
                       I64Attr:$chunk_rows, UnitAttr:$transpose_weight);
  let results = (outs RankedTensorOf<[F32]>:$result);
  let assemblyFormat = [{
    $input `,` $weight `chunk_rows` `=` $chunk_rows
    (`transpose_weight` $transpose_weight^)? attr-dict `:`
    functional-type(operands, results)
  }];
  let hasVerifier = 1;
}

def Mt_LinearVocabPartialsOp : Mt_Op<"linear_vocab_partials", [Pure]> {
  let summary = "each row's sum of exponentials and target logit over a vocabulary block, in chunks of tokens";
  let description = [{
    `mt.vocab_partials(mt.linear(input, weight), labels, max)` with the
    logits recomputed `chunk_rows` tokens at a time: `[rows..., 2]`, the sum
    of `exp(logit - max)` over the block and `logit[label] - max` when the
    label falls in the block (else 0). `vocab_shard_axes` places the block
    as on `mt.vocab_partials`; `max` is the whole vocabulary's (the
    all-reduced `mt.linear_vocab_max`).

    ```mlir
    %p = mt.linear_vocab_partials %h, %wte, %labels, %m chunk_rows = 512
        transpose_weight {vocab_shard_axes = array<i64: 1>}
        : (tensor<8x1024x768xf32>, tensor<25152x768xf32>, tensor<8x1024xi32>,
           tensor<8x1024xf32>) -> tensor<8x1024x2xf32>
    ```
  }];
  let arguments = (ins Mt_FloatTensor:$input, Mt_FloatTensor:$weight,
                       Mt_IndexTensor:$labels, RankedTensorOf<[F32]>:$max,
                       I64Attr:$chunk_rows, UnitAttr:$transpose_weight,
                       OptionalAttr<DenseI64ArrayAttr>:$vocab_shard_axes);
  let results = (outs RankedTensorOf<[F32]>:$result);
  let assemblyFormat = [{
    $input `,` $weight `,` $labels `,` $max `chunk_rows` `=` $chunk_rows
    (`transpose_weight` $transpose_weight^)? attr-dict `:`
    functional-type(operands, results)
  }];
  let hasVerifier = 1;
}

def Mt_LinearVocabCrossEntropyGradOp
    : Mt_Op<"linear_vocab_cross_entropy_grad", [Pure]> {
  let summary = "the vocabulary-parallel output layer's gradients, in chunks of tokens";
  let description = [{
    With `dlogits = mt.vocab_cross_entropy_grad(loss_grad, mt.linear(input,
    weight), labels, max, partials)` on the rank's vocabulary block:
    `input_grad = dlogits @ op(weight)^T` (the block's share, which the
    partitioned program sums over the vocabulary's ranks as it sums the
    unfused data gradient) and `weight_grad`, the block's weight gradient.
    Per chunk of `chunk_rows` tokens: the chunk's logits recomputed in a
    scratch block, their gradient in place, the chunk's rows of
    `input_grad` and its share of `weight_grad` (accumulated over the
    chunks in chunk order). `max` and `partials` are the whole vocabulary's
    (all-reduced); `reduction` is `mean` or `sum`.

    ```mlir
    %dx, %dw = mt.linear_vocab_cross_entropy_grad %h, %wte, %labels, %m, %p, %dloss
        reduction = mean chunk_rows = 512 transpose_weight
        {vocab_shard_axes = array<i64: 1>}
        : (tensor<8x1024x768xf32>, tensor<25152x768xf32>, tensor<8x1024xi32>,
           tensor<8x1024xf32>, tensor<8x1024x2xf32>, tensor<f32>)
        -> (tensor<8x1024x768xf32>, tensor<25152x768xf32>)
    ```
  }];
  let arguments = (ins Mt_FloatTensor:$input, Mt_FloatTensor:$weight,
                       Mt_IndexTensor:$labels, RankedTensorOf<[F32]>:$max,
                       RankedTensorOf<[F32]>:$partials,
                       RankedTensorOf<[F32]>:$loss_grad,
                       Mt_LossReduction:$reduction,
                       DefaultValuedAttr<I64Attr, "-100">:$ignore_index,
                       I64Attr:$chunk_rows, UnitAttr:$transpose_weight,
                       OptionalAttr<DenseI64ArrayAttr>:$vocab_shard_axes);
  let results = (outs Mt_FloatTensor:$input_grad,
                      Mt_FloatTensor:$weight_grad);
  let assemblyFormat = [{
    $input `,` $weight `,` $labels `,` $max `,` $partials `,` $loss_grad
    `reduction` `=` $reduction `chunk_rows` `=` $chunk_rows
    (`transpose_weight` $transpose_weight^)? attr-dict `:`
    functional-type(operands, results)
  }];
  let hasVerifier = 1;
}

def Mt_ScaleOp : Mt_Op<"scale", [VJP, Pure]> {
  let summary = "multiplies a tensor by a scalar tensor";
  let description = [{
    `result = input * factor` with `factor` an f32 scalar. The backward pass
    of `mt.linear_cross_entropy` multiplies the gradients computed for a
    loss gradient of one by the actual loss gradient (the seed, which fp16
    training scales), so that the fused op can run in the forward pass. The
    MoE router's top-k scaling factor multiplies the routing weights by it
    (its gradient: the output's gradient times the factor; the factor, a
    constant, gets none).

    ```mlir
    %dx = mt.scale %dx1, %dloss : (tensor<8x1024x768xf32>, tensor<f32>) -> tensor<8x1024x768xf32>
    ```
  }];
  let arguments = (ins Mt_FloatTensor:$input, RankedTensorOf<[F32]>:$factor);
  let results = (outs Mt_FloatTensor:$result);
  let assemblyFormat = [{
    $input `,` $factor attr-dict `:` functional-type(operands, results)
  }];
  let hasVerifier = 1;
}

#endif // MT_FUSED_OPS_TD
