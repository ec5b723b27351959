//===- MtFp8Ops.td - FP8 GEMMs and their scaling state -*- tablegen -*-===//
//
// Kept apart from MtOps.td, as mt.cast is: only the FP8 pass
// (`mt-fp8-gemms`) and the backends that run FP8 include MtFp8Ops.h.
// docs/MixedPrecision.md, "FP8", says how the pieces fit.
//
//===----------------------------------------------------------------------===//

#ifndef MT_FP8_OPS_TD
#define MT_FP8_OPS_TD

include "MtBase.td"
include "mlir/IR/SymbolInterfaces.td"
include "mlir/Interfaces/SideEffectInterfaces.td"

// Tensors of FP8 codes: Hopper's E4M3 (no infinities, NaN only at 0x7F)
// and E5M2.
def Mt_Fp8Tensor : StaticShapeTensorOf<[F8E4M3FN, F8E5M2]>;
// A scale or an amax: one f32.
def Mt_ScalarF32 : 0DTensorOf<[F32]>;

def Mt_Fp8MetaOp : Mt_Op<"fp8_meta", [Symbol]> {
  let summary = "one tensor's delayed-scaling state: its format, scale and amax history";
  let description = [{
    Declares, at module level, the scaling state of one GEMM operand under
    delayed scaling (`#mt.fp8_recipe` with `scaling = "delayed"`): the FP8
    format its values are cast to, the scale the casts multiply by, and the
    history of the amaxes (largest magnitudes) it was cast with. The runtime
    keeps the state, as it keeps parameters: the scale starts at 1 and the
    history at zeros, checkpoints save both, and `mt.fp8_update` advances
    them. `mt.fp8_scale` reads the scale inside a function.

    ```mlir
    mt.fp8_meta @transformer.h.0.attn.c_attn.weight.fp8_input : f8E4M3FN
    ```
  }];
  let arguments = (ins SymbolNameAttr:$sym_name, TypeAttr:$format);
  let assemblyFormat = "$sym_name `:` $format attr-dict";
  let hasVerifier = 1;
}

def Mt_Fp8ScaleOp : Mt_Op<"fp8_scale",
    [DeclareOpInterfaceMethods<SymbolUserOpInterface>, MemoryEffects<[MemRead]>]> {
  let summary = "reads the current scale of an mt.fp8_meta";
  let description = [{
    The scale the casts of this step multiply by: computed by the last
    `mt.fp8_update` of the meta (1 before any).

    ```mlir
    %s = mt.fp8_scale @transformer.h.0.attn.c_attn.weight.fp8_input : tensor<f32>
    ```
  }];
  let arguments = (ins FlatSymbolRefAttr:$meta);
  let results = (outs Mt_ScalarF32:$result);
  let assemblyFormat = "$meta attr-dict `:` type($result)";
}

def Mt_Fp8CurrentScaleOp : Mt_Op<"fp8_current_scale", [Pure]> {
  let summary = "current scaling: a scale from the tensor's own amax";
  let description = [{
    `max_finite(format) / amax(input) / 2^margin` in f32, where `amax` is the
    largest magnitude of `input` (`--fp8-recipe tensorwise`); 1 when the
    amax is 0 or not finite, and the largest float when the quotient
    overflows.

    ```mlir
    %s = mt.fp8_current_scale %x {format = f8E4M3FN, margin = 0 : i64}
        : tensor<8x128x128xbf16> -> tensor<f32>
    ```
  }];
  let arguments = (ins Mt_FloatTensor:$input, TypeAttr:$format,
                       DefaultValuedAttr<I64Attr, "0">:$margin);
  let results = (outs Mt_ScalarF32:$result);
  let assemblyFormat = "$input attr-dict `:` type($input) `->` type($result)";
  let hasVerifier = 1;
}

def Mt_Fp8QuantizeOp : Mt_Op<"fp8_quantize", [Pure]> {
  let summary = "casts a tensor to FP8 codes with a scale, and measures its amax";
  let description = [{
    Element `i` of the result is `input[i] * scale` rounded to the nearest
    value of the result's FP8 type (ties to even) and saturated to its
    largest finite magnitude (NaN stays NaN); `amax` is the largest
    magnitude of `input` before scaling (NaN if any element is NaN), which
    delayed scaling records with `mt.fp8_update`.

    ```mlir
    %xq, %amax = mt.fp8_quantize %x, %s
        : (tensor<8x128x128xbf16>, tensor<f32>) -> (tensor<8x128x128xf8E4M3FN>, tensor<f32>)
    ```
  }];
  let arguments = (ins Mt_FloatTensor:$input, Mt_ScalarF32:$scale);
  let results = (outs Mt_Fp8Tensor:$result, Mt_ScalarF32:$amax);
  let assemblyFormat = [{
    $input `,` $scale attr-dict `:` functional-type(operands, results)
  }];
  let hasVerifier = 1;
}

def Mt_Fp8LinearOp : Mt_Op<"fp8_linear", [Pure]> {
  let summary = "mt.linear on FP8 operands, with their scales";
  let description = [{
    `y = (x @ W) / (input_scale * weight_scale) + b`, as `mt.linear` with
    FP8 codes for `x` and `W` (the tensor cores' FP8 product, summed in
    f32) and the scales they were quantized with: the product of the codes
    is divided by both scales, then the f32 bias (if any) is added and the
    result rounded once to its type (bf16). `transpose_weight` as
    `mt.linear`'s. The forward pass reads E4M3 operands; the data gradient
    (`dx = dy @ W^T`) reads `dy` in E5M2 under the hybrid format.

    ```mlir
    %y = mt.fp8_linear %xq scale %sx, %wq scale %sw, %b
        : (tensor<8x128x128xf8E4M3FN>, tensor<f32>, tensor<128x384xf8E4M3FN>,
           tensor<f32>, tensor<384xf32>) -> tensor<8x128x384xbf16>
    ```
  }];
  let arguments = (ins Mt_Fp8Tensor:$input, Mt_ScalarF32:$input_scale,
                       Mt_Fp8Tensor:$weight, Mt_ScalarF32:$weight_scale,
                       Optional<Mt_FloatTensor>:$bias,
                       UnitAttr:$transpose_weight);
  let results = (outs Mt_FloatTensor:$result);
  let assemblyFormat = [{
    $input `scale` $input_scale `,` $weight `scale` $weight_scale
    (`,` $bias^)? (`transpose_weight` $transpose_weight^)?
    attr-dict `:` functional-type(operands, results)
  }];
  let hasVerifier = 1;
}

def Mt_Fp8LinearWeightGradOp : Mt_Op<"fp8_linear_weight_grad", [Pure]> {
  let summary = "mt.linear_weight_grad on FP8 operands, with their scales";
  let description = [{
    `dW = (x^T @ dy) / (input_scale * output_grad_scale)` over all leading
    dimensions, laid out as `mt.linear_weight_grad`'s (`in x out`, or
    `out x in` with `transpose_weight`), in f32: the weight gradient stays
    f32 for accumulation.

    ```mlir
    %dw = mt.fp8_linear_weight_grad %xq scale %sx, %dyq scale %sdy
        : (tensor<8x128x128xf8E4M3FN>, tensor<f32>, tensor<8x128x384xf8E5M2>,
           tensor<f32>) -> tensor<128x384xf32>
    ```
  }];
  let arguments = (ins Mt_Fp8Tensor:$input, Mt_ScalarF32:$input_scale,
                       Mt_Fp8Tensor:$output_grad,
                       Mt_ScalarF32:$output_grad_scale,
                       UnitAttr:$transpose_weight);
  let results = (outs RankedTensorOf<[F32]>:$result);
  let assemblyFormat = [{
    $input `scale` $input_scale `,` $output_grad `scale` $output_grad_scale
    (`transpose_weight` $transpose_weight^)? attr-dict `:`
    functional-type(operands, results)
  }];
  let hasVerifier = 1;
}

def Mt_Fp8UpdateOp : Mt_Op<"fp8_update",
    [DeclareOpInterfaceMethods<SymbolUserOpInterface>, MemoryEffects<[MemWrite]>]> {
  let summary = "records an amax in an mt.fp8_meta and computes its next scale";
  let description = [{
    Delayed scaling's step: `amax` becomes the newest of the meta's history
    (the oldest drops out), and the scale the next casts use becomes
    `max_finite(format) / a / 2^margin`, where `a` is the newest amax or the
    history's largest (`#mt.fp8_recipe`'s `amax_compute_algo`); the scale is
    kept when `a` is 0 or not finite. A training step updates each meta it
    cast with once, at its end, after the amaxes were reduced (max) over the
    ranks that share the tensor, as Megatron-LM's amax reduction group does.

    ```mlir
    mt.fp8_update @transformer.h.0.attn.c_attn.weight.fp8_input, %amax : tensor<f32>
    ```
  }];
  let arguments = (ins FlatSymbolRefAttr:$meta, Mt_ScalarF32:$amax);
  let assemblyFormat = "$meta `,` $amax attr-dict `:` type($amax)";
}

#endif // MT_FP8_OPS_TD
