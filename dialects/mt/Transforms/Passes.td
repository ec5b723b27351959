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

def DifferentiatePass : Pass<"mt-differentiate", "::mlir::ModuleOp"> {
  let summary = "reverse-mode autodiff: appends a step function's backward pass";
  let description = [{
    Differentiates the scalar loss that `function` returns with respect to
    every `mt.parameter` it reads. The backward pass is built in reverse
    program order from each op's VJP rule (`DifferentiableOpInterface`),
    before the return; gradients of values used several times are summed.
    Each parameter that reaches the loss ends with one
    `mt.accumulate_gradient`, which adds into the parameter's gradient buffer,
    so running the step once per micro-batch accumulates their gradients.

    ```mlir
    %w = mt.get_parameter @w : tensor<4x4xf32>
    %y = mt.linear %x, %w : (tensor<2x4xf32>, tensor<4x4xf32>) -> tensor<2x4xf32>
    ...
    // becomes, before the return:
    %dx = mt.linear %dy, %w transpose_weight : ...
    %dw = mt.linear_weight_grad %x, %dy : ...
    mt.accumulate_gradient @w, %dw : tensor<4x4xf32>
    ```
  }];
  let options = [
    Option<"functionName", "function", "std::string", "\"train_step\"",
           "The function whose returned loss is differentiated">
  ];
  let statistics = [
    Statistic<"numGradients", "gradients",
              "Number of parameters that receive a gradient">
  ];
  let dependentDialects = ["::mlir::mt::MtDialect"];
}

#endif // MT_TRANSFORMS_PASSES_TD
