//===- MtCastOps.td - Element type conversions of mixed precision -*- tablegen -*-===//
//
// Kept apart from MtOps.td: only the passes and backends that meet mixed
// precision include MtCastOp.h.
//
//===----------------------------------------------------------------------===//

#ifndef MT_CAST_OPS_TD
#define MT_CAST_OPS_TD

include "MtBase.td"
include "mlir/Interfaces/SideEffectInterfaces.td"

def Mt_CastOp : Mt_Op<"cast", [Pure, SameOperandsAndResultShape]> {
  let summary = "converts a tensor to another floating-point element type";
  let description = [{
    Element `i` of the result is element `i` of the input in the result's
    element type: a narrower type (bf16, f16) rounds to nearest even, a
    wider one is exact. `mt-mixed-precision` makes these where an f32 value
    (a master weight, an activation kept in f32) feeds a GEMM, whose
    operands are bf16. The element types differ and are f32 and a 16-bit
    type: the mixes the mt ops accept.

    ```mlir
    %w16 = mt.cast %w : tensor<768x2304xf32> to tensor<768x2304xbf16>
    ```
  }];
  let arguments = (ins Mt_FloatTensor:$input);
  let results = (outs Mt_FloatTensor:$result);
  let assemblyFormat = "$input attr-dict `:` type($input) `to` type($result)";
  let hasVerifier = 1;
}

#endif // MT_CAST_OPS_TD
