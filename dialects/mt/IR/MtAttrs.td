//===- MtAttrs.td - Enums and attributes of the mt dialect -*- tablegen -*-===//

#ifndef MT_ATTRS_TD
#define MT_ATTRS_TD

include "MtBase.td"
include "mlir/IR/EnumAttr.td"

// Enums are stored as I32EnumAttr and written as bare keywords in op syntax.

def Mt_GeluApproximation : I32EnumAttr<"GeluApproximation",
    "how gelu evaluates the Gaussian CDF", [
      I32EnumAttrCase<"Erf", 0, "erf">,
      I32EnumAttrCase<"Tanh", 1, "tanh">
    ]> {
  let cppNamespace = "::mlir::mt";
}

def Mt_InitMethod : I32EnumAttr<"InitMethod",
    "how a parameter is initialized", [
      I32EnumAttrCase<"Normal", 0, "normal">,
      I32EnumAttrCase<"Zeros", 1, "zeros">,
      I32EnumAttrCase<"Ones", 2, "ones">
    ]> {
  let cppNamespace = "::mlir::mt";
}

def Mt_LossReduction : I32EnumAttr<"LossReduction",
    "how cross_entropy reduces per-token losses", [
      I32EnumAttrCase<"Mean", 0, "mean">,
      I32EnumAttrCase<"Sum", 1, "sum">,
      I32EnumAttrCase<"None", 2, "none">
    ]> {
  let cppNamespace = "::mlir::mt";
}

#endif // MT_ATTRS_TD
