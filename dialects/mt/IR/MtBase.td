//===- MtBase.td - The mt dialect and its shared type constraints -*- tablegen -*-===//

#ifndef MT_BASE_TD
#define MT_BASE_TD

include "mlir/IR/OpBase.td"
include "mlir/IR/AttrTypeBase.td"

def Mt_Dialect : Dialect {
  let name = "mt";
  let cppNamespace = "::mlir::mt";
  let summary = "Transformer model-level ops at Megatron-module granularity";
  let description = [{
    The `mt` dialect describes a transformer's training and evaluation steps at
    the granularity of Megatron-LM's modules: embeddings, norms, linear layers,
    the attention core, activations, dropout and the loss. Every value is a
    ranked tensor with its *global* shape: parallelism is expressed later as
    shardings over these ops, never by changing the model description.

    Parameters are module-level symbols (`mt.parameter`) read inside functions
    with `mt.get_parameter`, so that differentiation, sharding and the
    optimizer can find every trainable tensor by name.

    A module says what it trains in the attribute `mt.model`
    (`#mt.model<...>`, below), which the bundle writer records. Each op of a
    transformer layer says which layer it belongs to in the attribute
    `mt.layer` (`#mt.layer<...>`, below), which recomputation and the
    memory report read; locations are debug information only.
  }];
  let useDefaultAttributePrinterParser = 1;
  let useDefaultTypePrinterParser = 1;
  let hasOperationAttrVerify = 1;
  let hasRegionArgAttrVerify = 1;
  let hasRegionResultAttrVerify = 1;
}

class Mt_Op<string mnemonic, list<Trait> traits = []>
    : Op<Mt_Dialect, mnemonic, traits>;

// Floating-point tensors the model computes in; integer tensors hold token
// ids and labels.
def Mt_FloatTensor : StaticShapeTensorOf<[F16, BF16, F32, F64]>;
def Mt_IndexTensor : StaticShapeTensorOf<[I32, I64]>;

#endif // MT_BASE_TD
