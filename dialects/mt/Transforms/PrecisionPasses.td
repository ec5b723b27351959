//===- PrecisionPasses.td - Mixed precision over the mt dialect -*- tablegen -*-===//

#ifndef MT_PRECISION_PASSES_TD
#define MT_PRECISION_PASSES_TD

include "mlir/Pass/PassBase.td"

def MixedPrecisionPass : Pass<"mt-mixed-precision", "::mlir::ModuleOp"> {
  let summary = "types the program in bf16 where it stores bf16 (precision bf16)";
  let description = [{
    Reads the precision from the module's `#mt.model`; with `"bf16"` it
    rewrites every function so that its types say what a backend stores
    (docs/MixedPrecision.md), as Megatron-LM's default `--bf16` keeps:

    - activations and their gradients in bf16, where the op that writes a
      value and every op that reads it take bf16 (the kernels' table,
      `mt/Transforms/PrecisionRules.h`), and every value that must share
      its type with it (an elementwise op's operands and result, a
      collective's, a reshape's) can too;
    - GEMM operands in bf16: an f32 operand (a master weight, an activation
      kept in f32) gets an explicit `mt.cast`;
    - master weights (parameters, function arguments), weight and bias
      gradients, everything gradient accumulation and the optimizer read,
      function results, softmax and norm statistics, the loss and the
      logsumexps in f32.

    It runs last, after differentiation, partitioning, pipeline stages and
    fusion: every op exists by then, so nothing made later can meet a bf16
    gradient. Values that enter or leave an `mt.fused` group stay f32 (the
    group's kernel computes in f32 and rounds only where it stores). With
    `"fp32"` or `"fp16"` (dynamic loss scaling, still the CUDA backend's
    decision) it changes nothing.

    ```mlir
    %w16 = mt.cast %w : tensor<64x192xf32> to tensor<64x192xbf16>
    %qkv = mt.linear %x, %w16, %b
        : (tensor<2x16x64xbf16>, tensor<64x192xbf16>, tensor<192xf32>) -> tensor<2x16x192xbf16>
    ```
  }];
  let statistics = [
    Statistic<"numBf16Values", "bf16-values", "Values typed bf16">,
    Statistic<"numCasts", "casts", "mt.cast ops made for GEMM operands">
  ];
}

def Fp8GemmsPass : Pass<"mt-fp8-gemms", "::mlir::ModuleOp"> {
  let summary = "runs the transformer layers' linear layers on FP8 operands (mt.fp8)";
  let description = [{
    With the module attribute `mt.fp8` (`#mt.fp8_recipe`, from
    `--fp8-format`), after `mt-mixed-precision` has typed the program in
    bf16 (docs/MixedPrecision.md, "FP8"), replaces each `mt.linear`,
    `mt.linear_weight_grad` and `mt.linear_weight_bias_grad` of a
    transformer layer (not one kept bf16 by `--first-last-layers-bf16`)
    whose operands are bf16 by `mt.fp8_linear` and
    `mt.fp8_linear_weight_grad` (plus `mt.bias_grad`) on FP8 codes:

    - each operand is quantized once per function (`mt.fp8_quantize`): a
      weight from its f32 master, an activation before its first GEMM,
      which the weight gradient reads again;
    - activations and weights are E4M3; output gradients (a linear's input
      derived from the loss seed) are E5M2 under `format = "hybrid"`;
    - delayed scaling gives each operand an `mt.fp8_meta` named after the
      weight's parameter (`<name>.fp8_input`, `.fp8_weight`, `.fp8_output_grad`), reads
      its scale with `mt.fp8_scale`, and ends `train_step` with one
      `mt.fp8_update` per meta, after a max all-reduce of the amaxes over
      the grid's axes (Megatron-LM's amax reduction group); tensorwise
      scaling computes each scale with `mt.fp8_current_scale`.

    Pipeline stages are refused (not implemented yet).

    ```mlir
    %s = mt.fp8_scale @h.0.attn.c_attn.weight.fp8_input : tensor<f32>
    %xq, %amax = mt.fp8_quantize %x, %s
        : (tensor<8x128x128xbf16>, tensor<f32>) -> (tensor<8x128x128xf8E4M3FN>, tensor<f32>)
    %y = mt.fp8_linear %xq scale %s, %wq scale %sw, %b
        : (tensor<8x128x128xf8E4M3FN>, tensor<f32>, tensor<128x384xf8E4M3FN>,
           tensor<f32>, tensor<384xf32>) -> tensor<8x128x384xbf16>
    ```
  }];
  let dependentDialects = ["::mlir::shard::ShardDialect"];
  let statistics = [
    Statistic<"numGemms", "gemms", "GEMMs made FP8">,
    Statistic<"numQuantizes", "quantizes", "mt.fp8_quantize ops made">,
    Statistic<"numMetas", "metas", "mt.fp8_meta states declared">
  ];
}

#endif // MT_PRECISION_PASSES_TD
