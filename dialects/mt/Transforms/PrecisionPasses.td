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

#endif // MT_PRECISION_PASSES_TD
