//===- Passes.td - Passes over the mt dialect --------------*- tablegen -*-===//

#ifndef MT_TRANSFORMS_PASSES_TD
#define MT_TRANSFORMS_PASSES_TD

include "mlir/Pass/PassBase.td"

def PrintParameterTablePass
    : Pass<"mt-print-parameter-table", "::mlir::ModuleOp"> {
  let summary = "prints the model's parameters: names, global shapes, counts, init";
  let description = [{
    Prints one row per `mt.parameter` of the module, in declaration order:
    its name, global shape, element type, element count, initialization and
    whether AdamW decays it (Megatron-LM's rule: biases and rank-1 tensors,
    such as norm weights, are not decayed), then the total count. The IR is
    left unchanged.

    ```
    name                   shape     dtype  count  init              decay
    transformer.wte.weight 512x128   f32    65536  normal(std=0.02)  yes
    ...
    total: 2 parameters, 65664 elements (0.07M)
    ```
  }];
  let statistics = [
    Statistic<"numParameters", "parameters", "Number of parameters declared">,
    Statistic<"numElements", "elements", "Number of trainable elements">
  ];
  let dependentDialects = ["::mlir::mt::MtDialect"];
}

#endif // MT_TRANSFORMS_PASSES_TD
