//===- MtGradOps.td - Backward and state ops of the mt dialect -*- tablegen -*-===//
//
// The ops that reverse-mode differentiation emits: the backward kernels of the
// forward ops whose VJP is not itself a forward op, a constant fill, and the
// sink that accumulates a parameter's gradient.
//
//===----------------------------------------------------------------------===//

#ifndef MT_GRAD_OPS_TD
#define MT_GRAD_OPS_TD

def Mt_FillOp : Mt_Op<"fill", [Pure]> {
  let summary = "a tensor with every element set to one value";
  let description = [{
    Seeds differentiation (the loss's gradient is 1) and stands for the zero
    gradient of a value that does not reach the loss.

    ```mlir
    %one = mt.fill 1.000000e+00 : tensor<f32>
    ```
  }];
  let arguments = (ins F64Attr:$value);
  let results = (outs Mt_FloatTensor:$result);
  let assemblyFormat = "$value attr-dict `:` type($result)";
}

def Mt_EmbeddingGradOp : Mt_Op<"embedding_grad", [Pure]> {
  let summary = "the embedding table's gradient: rows of the output gradient summed by id";
  let description = [{
    `result[v] = sum of output_grad[i] over the positions i with ids[i] = v`,
    zero for ids that do not occur. The output gradient has the ids' shape with
    the hidden size appended; the result is the table's type.

    With `vocab_shard_axes` (see `mt.embedding`) the result is the rank's
    block of the vocabulary; ids outside it contribute nothing.

    ```mlir
    %dwte = mt.embedding_grad %dh, %tokens
        : (tensor<8x1024x768xf32>, tensor<8x1024xi32>) -> tensor<50304x768xf32>
    ```
  }];
  let arguments = (ins Mt_FloatTensor:$output_grad, Mt_IndexTensor:$ids,
                       OptionalAttr<DenseI64ArrayAttr>:$vocab_shard_axes);
  let results = (outs Mt_FloatTensor:$result);
  let assemblyFormat = [{
    $output_grad `,` $ids attr-dict `:` functional-type(operands, results)
  }];
  let hasVerifier = 1;
}

def Mt_LayerNormGradOp : Mt_Op<"layer_norm_grad", [Pure]> {
  let summary = "gradients of layer_norm's input, weight and (optional) bias";
  let description = [{
    Given the output gradient and layer_norm's input and weight (statistics
    are recomputed), yields the gradients of the input, the weight and, when
    requested by a third result, the bias.

    ```mlir
    %dx, %dw, %db = mt.layer_norm_grad %dy, %x, %w epsilon = 1.000000e-05
        : (tensor<8x1024x768xf32>, tensor<8x1024x768xf32>, tensor<768xf32>)
        -> (tensor<8x1024x768xf32>, tensor<768xf32>, tensor<768xf32>)
    ```
  }];
  let arguments = (ins Mt_FloatTensor:$output_grad, Mt_FloatTensor:$input,
                       Mt_FloatTensor:$weight, F64Attr:$epsilon);
  let results = (outs Mt_FloatTensor:$input_grad,
                      Mt_FloatTensor:$weight_grad,
                      Optional<Mt_FloatTensor>:$bias_grad);
  let assemblyFormat = [{
    $output_grad `,` $input `,` $weight `epsilon` `=` $epsilon attr-dict `:`
    functional-type(operands, results)
  }];
  let hasVerifier = 1;
}

def Mt_RmsNormGradOp : Mt_Op<"rms_norm_grad", [Pure]> {
  let summary = "gradients of rms_norm's input and weight";
  let description = [{
    ```mlir
    %dx, %dw = mt.rms_norm_grad %dy, %x, %w epsilon = 1.000000e-06
        : (tensor<4x512x256xf32>, tensor<4x512x256xf32>, tensor<256xf32>)
        -> (tensor<4x512x256xf32>, tensor<256xf32>)
    ```
  }];
  let arguments = (ins Mt_FloatTensor:$output_grad, Mt_FloatTensor:$input,
                       Mt_FloatTensor:$weight, F64Attr:$epsilon);
  let results = (outs Mt_FloatTensor:$input_grad,
                      Mt_FloatTensor:$weight_grad);
  let assemblyFormat = [{
    $output_grad `,` $input `,` $weight `epsilon` `=` $epsilon attr-dict `:`
    functional-type(operands, results)
  }];
  let hasVerifier = 1;
}

def Mt_LinearWeightGradOp : Mt_Op<"linear_weight_grad", [Pure]> {
  let summary = "the weight gradient of a linear layer";
  let description = [{
    `x^T @ output_grad` over all leading dimensions, laid out as the weight:
    `in x out`, or `out x in` with `transpose_weight`.

    ```mlir
    %dw = mt.linear_weight_grad %x, %dy
        : (tensor<8x1024x768xf32>, tensor<8x1024x2304xf32>) -> tensor<768x2304xf32>
    ```
  }];
  let arguments = (ins Mt_FloatTensor:$input, Mt_FloatTensor:$output_grad,
                       UnitAttr:$transpose_weight);
  let results = (outs Mt_FloatTensor:$result);
  let assemblyFormat = [{
    $input `,` $output_grad (`transpose_weight` $transpose_weight^)? attr-dict
    `:` functional-type(operands, results)
  }];
  let hasVerifier = 1;
}

def Mt_BiasGradOp : Mt_Op<"bias_grad", [Pure]> {
  let summary = "sums a gradient over every dimension but the last";
  let description = [{
    The gradient of a bias added along the last dimension.

    ```mlir
    %db = mt.bias_grad %dy : tensor<8x1024x2304xf32> -> tensor<2304xf32>
    ```
  }];
  let arguments = (ins Mt_FloatTensor:$output_grad);
  let results = (outs Mt_FloatTensor:$result);
  let assemblyFormat = [{
    $output_grad attr-dict `:` type($output_grad) `->` type($result)
  }];
  let hasVerifier = 1;
}

def Mt_AttentionGradOp : Mt_Op<"attention_grad", [Pure]> {
  let summary = "gradients of the attention core's query, key and value";
  let description = [{
    Takes the output gradient and the forward operands and attributes of an
    `mt.attention` (probabilities are recomputed, with the same dropout mask);
    yields gradients of the query, key and value, each of its operand's type.

    ```mlir
    %dq, %dk, %dv = mt.attention_grad %do, %q, %k, %v causal
        : (tensor<4x512x8x32xf32>, tensor<4x512x8x32xf32>, tensor<4x512x2x32xf32>, tensor<4x512x2x32xf32>)
        -> (tensor<4x512x8x32xf32>, tensor<4x512x2x32xf32>, tensor<4x512x2x32xf32>)
    ```
  }];
  let arguments = (ins Mt_FloatTensor:$output_grad, Mt_FloatTensor:$query,
                       Mt_FloatTensor:$key, Mt_FloatTensor:$value,
                       UnitAttr:$causal, OptionalAttr<F64Attr>:$scale,
                       DefaultValuedAttr<F64Attr, "0.0">:$dropout_p,
                       DefaultValuedAttr<I64Attr, "0">:$seed);
  let results = (outs Mt_FloatTensor:$query_grad, Mt_FloatTensor:$key_grad,
                      Mt_FloatTensor:$value_grad);
  let assemblyFormat = [{
    $output_grad `,` $query `,` $key `,` $value (`causal` $causal^)? attr-dict
    `:` functional-type(operands, results)
  }];
  let hasVerifier = 1;
}

def Mt_GeluGradOp : Mt_Op<"gelu_grad",
    [Pure, AllTypesMatch<["output_grad", "input", "result"]>]> {
  let summary = "the input gradient of gelu";
  let description = [{
    ```mlir
    %dx = mt.gelu_grad %dy, %x approximate = tanh : tensor<8x1024x3072xf32>
    ```
  }];
  let arguments = (ins Mt_FloatTensor:$output_grad, Mt_FloatTensor:$input,
                       Mt_GeluApproximation:$approximate);
  let results = (outs Mt_FloatTensor:$result);
  let assemblyFormat = [{
    $output_grad `,` $input `approximate` `=` $approximate attr-dict `:`
    type($result)
  }];
}

def Mt_SiluGradOp : Mt_Op<"silu_grad",
    [Pure, AllTypesMatch<["output_grad", "input", "result"]>]> {
  let summary = "the input gradient of silu";
  let description = [{
    ```mlir
    %dx = mt.silu_grad %dy, %x : tensor<4x512x688xf32>
    ```
  }];
  let arguments = (ins Mt_FloatTensor:$output_grad, Mt_FloatTensor:$input);
  let results = (outs Mt_FloatTensor:$result);
  let assemblyFormat = "$output_grad `,` $input attr-dict `:` type($result)";
}

def Mt_SwigluGradOp : Mt_Op<"swiglu_grad", [Pure,
    AllTypesMatch<["output_grad", "gate", "up", "gate_grad", "up_grad"]>]> {
  let summary = "gradients of swiglu's gate and up operands";
  let description = [{
    ```mlir
    %dgate, %dup = mt.swiglu_grad %dy, %gate, %up : tensor<4x512x688xf32>
    ```
  }];
  let arguments = (ins Mt_FloatTensor:$output_grad, Mt_FloatTensor:$gate,
                       Mt_FloatTensor:$up);
  let results = (outs Mt_FloatTensor:$gate_grad, Mt_FloatTensor:$up_grad);
  let assemblyFormat = [{
    $output_grad `,` $gate `,` $up attr-dict `:` type($output_grad)
  }];
}

def Mt_SoftmaxGradOp : Mt_Op<"softmax_grad",
    [Pure, AllTypesMatch<["output_grad", "output", "result"]>]> {
  let summary = "the input gradient of softmax, from its output";
  let description = [{
    `output * (output_grad - sum(output_grad * output))` along `axis`.

    ```mlir
    %dx = mt.softmax_grad %dy, %y axis = -1 : tensor<8x12x1024x1024xf32>
    ```
  }];
  let arguments = (ins Mt_FloatTensor:$output_grad, Mt_FloatTensor:$output,
                       I64Attr:$axis);
  let results = (outs Mt_FloatTensor:$result);
  let assemblyFormat = [{
    $output_grad `,` $output `axis` `=` $axis attr-dict `:` type($result)
  }];
  let hasVerifier = 1;
}

def Mt_CrossEntropyGradOp : Mt_Op<"cross_entropy_grad", [Pure]> {
  let summary = "the logits' gradient of cross_entropy";
  let description = [{
    Given the loss's gradient (a scalar for `mean` and `sum`, one per token for
    `none`), the logits and the labels of an `mt.cross_entropy`, yields
    `(softmax(logits) - onehot(label)) * loss_grad`, divided by the number of
    tokens not ignored for `mean`, and zero on ignored tokens.

    ```mlir
    %dlogits = mt.cross_entropy_grad %dloss, %logits, %labels reduction = mean
        : (tensor<f32>, tensor<8x1024x50304xf32>, tensor<8x1024xi32>) -> tensor<8x1024x50304xf32>
    ```
  }];
  let arguments = (ins RankedTensorOf<[F32]>:$loss_grad,
                       Mt_FloatTensor:$logits, Mt_IndexTensor:$labels,
                       Mt_LossReduction:$reduction,
                       DefaultValuedAttr<I64Attr, "-100">:$ignore_index);
  let results = (outs Mt_FloatTensor:$result);
  let assemblyFormat = [{
    $loss_grad `,` $logits `,` $labels `reduction` `=` $reduction attr-dict
    `:` functional-type(operands, results)
  }];
  let hasVerifier = 1;
}

def Mt_AccumulateGradientOp : Mt_Op<"accumulate_gradient",
    [DeclareOpInterfaceMethods<SymbolUserOpInterface>,
     MemoryEffects<[MemWrite]>]> {
  let summary = "adds a gradient into a parameter's gradient buffer";
  let description = [{
    Each parameter has a gradient buffer, zeroed at the start of a training
    step; every micro-batch's `train_step` adds its gradient into it, so
    gradients accumulate over micro-batches. The gradient has the parameter's
    type.

    ```mlir
    mt.accumulate_gradient @transformer.wte.weight, %dwte : tensor<50304x768xf32>
    ```
  }];
  let arguments = (ins FlatSymbolRefAttr:$parameter, Mt_FloatTensor:$gradient);
  let assemblyFormat = [{
    $parameter `,` $gradient attr-dict `:` type($gradient)
  }];
}

#endif // MT_GRAD_OPS_TD
