//===- MtInterfaces.td - Interfaces of the mt dialect ------*- tablegen -*-===//

#ifndef MT_INTERFACES_TD
#define MT_INTERFACES_TD

include "mlir/IR/OpBase.td"

def Mt_DifferentiableOpInterface : OpInterface<"DifferentiableOpInterface"> {
  let cppNamespace = "::mlir::mt";
  let description = [{
    An op with a reverse-mode derivative: its vector-Jacobian product (VJP)
    rule builds, from the gradients of its results, the gradients of its
    operands. `mt-differentiate` applies these rules in reverse program order;
    each op owns its one rule.
  }];
  let methods = [
    InterfaceMethod<[{
        Builds the gradients of the operands at the builder's insertion point.
        `resultGradients` has one value per result, null where a result has no
        gradient (it does not reach the loss). Appends exactly one value per
        operand to `operandGradients`, null for operands that have no
        gradient (token ids, labels).
      }],
      "::llvm::LogicalResult", "buildVJP",
      (ins "::mlir::OpBuilder &":$builder,
           "::mlir::ValueRange":$resultGradients,
           "::llvm::SmallVectorImpl<::mlir::Value> &":$operandGradients)>
  ];
}

#endif // MT_INTERFACES_TD
