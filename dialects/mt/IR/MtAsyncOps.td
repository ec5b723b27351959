//===- MtAsyncOps.td - Collectives split into a start and a wait -*- tablegen -*-===//

#ifndef MT_ASYNC_OPS_TD
#define MT_ASYNC_OPS_TD

def Mt_FutureType : TypeDef<Mt_Dialect, "Future"> {
  let mnemonic = "future";
  let summary = "the result of a collective that has started and not yet finished";
  let description = [{
    What `mt.collective_start` returns: a tensor that a collective is still
    writing. Only `mt.collective_wait` reads it; the wait returns the
    tensor, which ops read as any other value.

    ```mlir
    !mt.future<tensor<8x128x768xf32>>
    ```
  }];
  let parameters = (ins "::mlir::RankedTensorType":$valueType);
  let assemblyFormat = "`<` $valueType `>`";
}

def Mt_CollectiveStartOp
    : Mt_Op<"collective_start", [IsolatedFromAbove, SingleBlock,
                                 RecursiveMemoryEffects]> {
  let summary = "starts a shard collective, which finishes at its mt.collective_wait";
  let description = [{
    The first half of a collective split by `mt-split-collectives`: the body
    holds one `shard.all_reduce`, `shard.all_gather` or
    `shard.reduce_scatter` over the block's argument (the operand), and
    `mt.yield` returns its result. The collective may run from here until
    the one `mt.collective_wait` on the future (the verifier holds it to
    one use; the passes keep it in the start's block) while the ops between
    compute: its operand is read, and its result written,
    until the wait (the memory plan keeps both buffers from the start to
    the wait).

    ```mlir
    %f = mt.collective_start %x : tensor<8x128x768xf32> -> !mt.future<tensor<8x128x768xf32>> {
    ^bb0(%a: tensor<8x128x768xf32>):
      %r = shard.all_reduce %a on @grid grid_axes = [1] : tensor<8x128x768xf32> -> tensor<8x128x768xf32>
      mt.yield %r : tensor<8x128x768xf32>
    }
    %y = mt.collective_wait %f : !mt.future<tensor<8x128x768xf32>>
    ```
  }];
  let arguments = (ins AnyRankedTensor:$input);
  let results = (outs Mt_FutureType:$future);
  let regions = (region SizedRegion<1>:$body);
  let assemblyFormat = [{
    $input attr-dict `:` type($input) `->` qualified(type($future)) $body
  }];
  let extraClassDeclaration = [{
    /// The shard collective in the body.
    ::mlir::Operation *getCollective() {
      return &getBody().front().front();
    }
    /// The one wait on the future (the verifier holds it to one).
    CollectiveWaitOp getWait();
  }];
  let hasVerifier = 1;
}

def Mt_CollectiveWaitOp
    : Mt_Op<"collective_wait", [
        TypesMatchWith<"the result is the future's tensor", "future", "result",
                       "::llvm::cast<::mlir::mt::FutureType>($_self).getValueType()">]> {
  let summary = "waits for a started collective and returns its result";
  let description = [{
    The second half of a split collective (`mt.collective_start`): after it,
    the collective's result is complete and its operand may be overwritten.

    ```mlir
    %y = mt.collective_wait %f : !mt.future<tensor<8x128x768xf32>>
    ```
  }];
  let arguments = (ins Mt_FutureType:$future);
  let results = (outs AnyRankedTensor:$result);
  let assemblyFormat = "$future attr-dict `:` qualified(type($future))";
}

#endif // MT_ASYNC_OPS_TD
