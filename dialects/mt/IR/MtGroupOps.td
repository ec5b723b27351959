//===- MtGroupOps.td - Groups of ops run as one generated kernel -*- tablegen -*-===//

#ifndef MT_GROUP_OPS_TD
#define MT_GROUP_OPS_TD

def Mt_FusedOp : Mt_Op<"fused", [IsolatedFromAbove, RecursiveMemoryEffects,
                                 SingleBlock]> {
  let summary = "ops that run as one generated kernel";
  let description = [{
    A group of elementwise ops (`mt-fuse-elementwise`) that a device backend
    runs as one kernel: each thread reads element `i` of every operand,
    computes the ops in order in registers and writes element `i` of every
    result. The block's arguments are the operands; `mt.yield` names the
    body values that leave the group (the results), in order. Values
    computed inside and not yielded never reach memory.

    The body's ops are ordinary `mt` ops with their own semantics, so a
    backend without the kernel (the host) runs them one after another and
    gets the same bits. Every operand and result has one static shape and
    one element type.

    ```mlir
    %r = mt.fused (%x, %res) : (tensor<8x128x128xf32>, tensor<8x128x128xf32>) -> tensor<8x128x128xf32> {
    ^bb0(%a: tensor<8x128x128xf32>, %b: tensor<8x128x128xf32>):
      %d = mt.dropout %a p = 1.000000e-01 seed = 2 : tensor<8x128x128xf32>
      %s = mt.add %b, %d : tensor<8x128x128xf32>
      mt.yield %s : tensor<8x128x128xf32>
    }
    ```
  }];
  let arguments = (ins Variadic<Mt_FloatTensor>:$inputs);
  let results = (outs Variadic<Mt_FloatTensor>:$outputs);
  let regions = (region SizedRegion<1>:$body);
  let assemblyFormat = [{
    `(` $inputs `)` attr-dict `:` functional-type($inputs, $outputs) $body
  }];
  let hasVerifier = 1;
}

def Mt_YieldOp : Mt_Op<"yield", [Pure, Terminator,
                                 ParentOneOf<["FusedOp", "CollectiveStartOp"]>]> {
  let summary = "the values that leave an mt.fused group or an mt.collective_start";
  let arguments = (ins Variadic<AnyRankedTensor>:$values);
  let assemblyFormat = "attr-dict ($values^ `:` type($values))?";
}

#endif // MT_GROUP_OPS_TD
