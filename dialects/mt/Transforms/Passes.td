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

def RecomputePass : Pass<"mt-recompute", "::mlir::ModuleOp"> {
  let summary = "recomputes activations in the backward pass (Megatron-LM's policies)";
  let description = [{
    Runs after `mt-differentiate`. The forward ops a policy recomputes are
    cloned into the backward pass right before their first backward use, and
    the backward pass reads the clones, so the activations the originals
    produced die at their last forward use. Layers are found by the ops'
    attribute `mt.layer`, `#mt.layer<i>` and `#mt.layer<i, core_attention>`,
    which the front end sets (locations play no part). A segment's results that
    forward ops of other segments read (a layer's output, the next layer's
    input) are its checkpoints: they are kept, not recomputed.

    - `granularity=selective` (Megatron-LM's default): each layer's core
      attention (the attention op and the reshape of its output).
    - `granularity=full method=uniform num-layers=N`: every layer, in groups
      of N consecutive layers; only each group's input is kept.
    - `granularity=full method=block num-layers=N`: the first N layers, each
      from its own input.

    Layers count from the function's first layer, so with `stages=true`
    (every differentiated pipeline stage `<function>_stage<k>` instead of
    `<function>`) the policy applies per (virtual) stage, as Megatron-LM's
    `--recompute-num-layers` does: block recomputes the first N layers of
    each stage, uniform groups N layers within each stage. A stage's input
    activation is the first layer's checkpoint.

    Clones carry the unit attribute `mt.recomputed` (it keeps CSE from merging
    them back). Dropout masks depend on the seed, the step and the position
    only, so a recomputed op gives the bits of the original.

    ```mlir
    %y = mt.gelu %x approximate = tanh loc("layers.0")
    ... // forward
    %dx = mt.gelu_grad %dy, %x ...
    %w = mt.linear_weight_grad %y, %dz ...
    // with granularity=full becomes, in the backward pass:
    %y1 = mt.gelu %x approximate = tanh {mt.recomputed}
    %w = mt.linear_weight_grad %y1, %dz ...
    ```
  }];
  let options = [
    Option<"functionName", "function", "std::string", "\"train_step\"",
           "The differentiated function">,
    Option<"granularity", "granularity", "std::string", "\"none\"",
           "none, selective or full (Megatron-LM's --recompute-granularity)">,
    Option<"method", "method", "std::string", "\"uniform\"",
           "uniform or block (--recompute-method), for full">,
    Option<"numLayers", "num-layers", "int64_t", "1",
           "Layers per group (uniform) or recomputed layers (block)">,
    Option<"stages", "stages", "bool", "false",
           "Recompute each differentiated pipeline stage <function>_stage<k> "
           "(layers counted per stage) instead of <function>">
  ];
  let statistics = [
    Statistic<"numRecomputed", "recomputed", "Number of cloned forward ops">
  ];
  let dependentDialects = ["::mlir::mt::MtDialect"];
}

def ParametersToArgumentsPass
    : Pass<"mt-parameters-to-arguments", "::mlir::ModuleOp"> {
  let summary = "turns a step's parameter reads into arguments and its gradients into results";
  let description = [{
    Upstream `shard-partition` partitions function arguments and results, so
    before sharding, each step function reads its parameters as arguments and
    returns its gradients as results: every parameter the function reads (in
    declaration order) becomes a trailing argument with the attribute
    `mt.parameter = @name`, its `mt.get_parameter` ops are replaced by it, and
    every `mt.accumulate_gradient` becomes a trailing result with the
    attribute `mt.gradient = @name`. The parameter declarations stay: they
    hold the global shapes and the initialization.

    ```mlir
    func.func @train_step(%x: ..., %labels: ...) -> tensor<f32> {
      %w = mt.get_parameter @w : tensor<8x16xf32>
      ...
      mt.accumulate_gradient @w, %dw : tensor<8x16xf32>
      return %loss : tensor<f32>
    }
    // becomes
    func.func @train_step(%x: ..., %labels: ...,
                          %w: tensor<8x16xf32> {mt.parameter = @w})
        -> (tensor<f32>, tensor<8x16xf32> {mt.gradient = @w})
    ```
  }];
  let dependentDialects = ["::mlir::mt::MtDialect"];
}

def AnnotateShardingsPass : Pass<"mt-annotate-shardings", "::mlir::ModuleOp"> {
  let summary = "places Megatron-LM's tensor- and data-parallel shardings on a step's arguments";
  let description = [{
    Runs after `mt-parameters-to-arguments`. Creates the device grid
    `shard.grid @grid(shape = <data-parallel> x <tensor-parallel>)` (Megatron-LM's
    rank order: tensor-parallel ranks adjacent) and annotates each step
    function's arguments and results with `shard.shard`, by the parameter's
    role in Megatron-LM's layout:

    - column-parallel weights and their biases (`q_proj`, `k_proj`, `v_proj`,
      `gate_proj`, `up_proj`, GPT-2's `mlp.c_fc`): split along the output
      dimension over the tensor-parallel axis;
    - row-parallel weights (`o_proj`, `down_proj`, GPT-2's `attn.c_proj` and
      `mlp.c_proj`): split along the input dimension;
    - everything else (embeddings, norms, row-parallel biases): replicated;
    - token and label batches, and per-token results such as logits: split
      along the batch over the data-parallel axis; a gradient result is
      sharded as its parameter; scalars (the loss) are replicated;
    - under sequence parallelism, a pipeline stage's (`mt.pipeline_stage`)
      `[b, s, h]` arguments and results (the input activation, the output's
      gradient, the output activation, the input's gradient): split along
      the sequence over the tensor-parallel axis too, the shard the stages
      exchange;
    - under context parallelism (`context-parallel-size` above 1) the grid is
      `<data> x <context> x <tensor>`, and token and label batches, per-token
      results, a stage's activations and `mt.position_ids` are split along
      the sequence over the context axis (before the tensor axis under
      sequence parallelism). The runtime feeds context rank `i` its
      load-balanced chunks `i` and `2N-1-i`, so the IR's split is a plain
      block split; a sequence not divisible by `2N` (`2N x tp` under
      sequence parallelism) is refused.

    Each `mt.parameter` gets `mt.split_axes`, the grid axes splitting each of
    its dimensions, which the bundle records (partitioning leaves only local
    shapes in the functions).

    `sharding-propagation` and `shard-partition` then turn the function into
    per-rank code with the collectives Megatron-LM issues.
  }];
  let options = [
    Option<"tensorParallelSize", "tensor-parallel-size", "int64_t", "1",
           "Ranks of the tensor-parallel grid axis">,
    Option<"dataParallelSize", "data-parallel-size", "int64_t", "1",
           "Ranks of the data-parallel grid axis">,
    Option<"sequenceParallel", "sequence-parallel", "bool", "false",
           "Megatron-LM's sequence parallelism: the residual stream (every "
           "norm's input, the residual adds' operands) split along the "
           "sequence over the tensor-parallel axis">,
    Option<"contextParallelSize", "context-parallel-size", "int64_t", "1",
           "Ranks of the context-parallel grid axis (Megatron-LM's "
           "--context-parallel-size): above 1 the grid is data x context x "
           "tensor and every token batch and activation is split along the "
           "sequence over it">,
    Option<"cpCommType", "cp-comm-type", "std::string", "\"p2p\"",
           "How attention exchanges keys and values over the context axis "
           "(Megatron-LM's --cp-comm-type): p2p (a ring of shard.shift) or "
           "all_gather">,
    Option<"expertParallelSize", "expert-parallel-size", "int64_t", "1",
           "Megatron-LM's --expert-model-parallel-size: above 1 the routed "
           "experts' weights ([E, ...], `.mlp.experts.`) are split by "
           "experts over the data axis where it equals data-parallel-size, "
           "else over an expert axis: the grid is then (data-parallel-size "
           "/ N) x N x tensor, the tokens split over both first axes">
  ];
  let dependentDialects = ["::mlir::mt::MtDialect", "::mlir::shard::ShardDialect"];
}

def LayerReshardingsPass : Pass<"mt-layer-reshardings"> {
  let summary = "gives the collectives shard-partition inserts the layer of what they reshard";
  let description = [{
    Runs right after upstream `shard-partition`. The partitioned ops of a
    layer keep its `mt.layer` (the mt ops' sharding models build them in
    their op's layer), but the reshardings that `shard-partition` inserts
    between two ops (`shard.all_gather`, `shard.all_slice`,
    `shard.all_reduce`, ...) are built by upstream code and carry no
    attribute. Each untagged op of the shard dialect gets the layer of the
    op that defines its first operand (without `core_attention`: a
    resharding is not part of the attention core), in program order, so a
    chain of reshardings takes the layer of the value it starts from. The
    memory report counts what such an op saves for the backward pass in
    that layer.

    ```mlir
    %h = mt.layer_norm %x, ... {mt.layer = #mt.layer<0>} : ...
    %g = shard.all_gather %h on @grid grid_axes = [1] gather_axis = 1 : ...
    // becomes
    %g = shard.all_gather %h on @grid grid_axes = [1] gather_axis = 1
        {mt.layer = #mt.layer<0>} : ...
    ```
  }];
  let statistics = [
    Statistic<"numTagged", "tagged", "Number of reshardings given a layer">
  ];
  let dependentDialects = ["::mlir::mt::MtDialect", "::mlir::shard::ShardDialect"];
}

def CombineAllReducesPass : Pass<"mt-combine-all-reduces"> {
  let summary = "sums partial values before one all-reduce instead of after several";
  let description = [{
    `mt.add(shard.all_reduce(a), shard.all_reduce(b))` over the same grid axes
    becomes `shard.all_reduce(mt.add(a, b))` when nothing else reads the two
    all-reduces, and the same for two reduce-scatters along one axis. After partitioning, the input gradient of a tensor-parallel
    block sums one partial product per column-parallel projection (q, k and v;
    gate and up); this leaves one all-reduce per block, as Megatron-LM issues.
    `shard.all_slice(shard.all_reduce(x))` over the same axes becomes
    `shard.reduce_scatter(x)`: under sequence parallelism, the summed input
    gradient of a column-parallel block that each rank keeps a sequence
    shard of.

    ```mlir
    %a = shard.all_reduce %x on @grid grid_axes = [1] : ...
    %b = shard.all_reduce %y on @grid grid_axes = [1] : ...
    %s = mt.add %a, %b : ...
    // becomes
    %p = mt.add %x, %y : ...
    %s = shard.all_reduce %p on @grid grid_axes = [1] : ...
    ```
  }];
  let statistics = [
    Statistic<"numCombined", "combined", "Number of all-reduces removed">
  ];
  let dependentDialects = ["::mlir::mt::MtDialect", "::mlir::shard::ShardDialect"];
}

def PlanGradientReductionPass
    : Pass<"mt-plan-gradient-reduction", "::mlir::ModuleOp"> {
  let summary = "moves the data-parallel gradient reduction out of the training step, once per iteration";
  let description = [{
    Runs after `shard-partition` (the end of `megatron-partition-pipeline`).
    Partitioning leaves every weight gradient of the training step summed by
    a `shard.all_reduce` over the data-parallel grid axis, so it would run
    once per micro-batch. Megatron-LM accumulates the micro-batches' local
    gradients into one contiguous buffer and reduces the buffer once per
    iteration, before clipping and the optimizer. This pass does the same:

    - in the training step, each gradient result's data-axis all-reduce is
      removed (an all-reduce over [0, 1] keeps its tensor-parallel part), so
      the step accumulates the rank's local gradients;
    - `func.func @reduce_gradients(tensor<P>) -> tensor<P>` all-reduces the
      buffer over the data axis. Its attribute `mt.gradient_buffer` lists the
      parameters in buffer order: Megatron-LM's, the reverse of their
      declaration, each the rank's (tensor-parallel) shard, flattened, at the
      element offsets of `mt.buffer_offsets`;
    - with `distributed-optimizer`: `@reduce_gradients` reduce-scatters the
      buffer instead (`tensor<P> -> tensor<P/dp>`; P padded to a multiple of
      lcm(dp, 128) as Megatron-LM's distributed optimizer pads its buffer),
      and `func.func @gather_parameters(tensor<P/dp>) -> tensor<P>`
      all-gathers the updated parameter shards in the same layout
      (attribute `mt.parameter_buffer`).

    With pipeline parallelism the module holds the stages of the training
    step, `train_step_stage<k>` (functions with `mt.pipeline_stage`), not
    `train_step`. Every stage's data-axis reductions are deferred, and each
    pipeline rank (stage k runs on rank k % `pipeline-size`) gets a buffer
    of its own: `@reduce_gradients_pp<r>` (and `@gather_parameters_pp<r>`)
    with the attribute `mt.pipeline_rank = r`, holding the gradients of the
    rank's stages (its virtual-stage chunks in order, each chunk's
    parameters in reverse declaration order, as Megatron-LM's per-chunk
    buffers lie), so each pipeline rank reduces once per iteration over
    its data-parallel group, after its last backward pass.

    With `bucket-size` > 0 (Megatron-LM's `--overlap-grad-reduce`), each
    buffer is also cut into buckets: from its start (the last parameters),
    a bucket closes at the first parameter boundary where it holds at least
    `bucket-size` elements, and at the end of each pipeline chunk; the last
    bucket holds the padding. Bucket `i` of a buffer is reduced by
    `@reduce_gradients_bucket<i>` (`_pp<r>` under pipelines;
    `tensor<n> -> tensor<n>`, an all-reduce over the data axis), marked
    `mt.bucket_of` (the buffer's reduce function) and `mt.bucket_offset`.
    The runtime starts each bucket's reduction once its gradients are
    complete in the last micro-batch (docs/Parallelism.md, "Gradient
    buckets"). Under the distributed optimizer the shards are per bucket,
    as Megatron-LM's: each bucket is padded to a multiple of lcm(dp, 128),
    reduce-scattered by its function (`tensor<n> -> tensor<n/dp>`) and
    gathered by `@gather_parameters_bucket<i>` (`tensor<n/dp> -> tensor<n>`,
    named by the reduce function's `mt.bucket_gather`); a rank's shard is
    its `1/dp` of every bucket in bucket order, and `@reduce_gradients`
    and `@gather_parameters` split, reduce-scatter (all-gather) and join
    bucket by bucket. With `overlap-param-gather` the gathers are marked
    `mt.overlap_param_gather`: the runtime runs each before the first use
    of its parameters in the next step.

    With `context-axis` (context parallelism), a weight gradient sums the
    rows of every data and context rank: the step's reductions over both
    axes leave it, and the buffer is reduced (or reduce-scattered, the
    optimizer sharded) over both, Megatron-LM's combined data x context
    group (`intra_dp_cp`). An axis of one rank is left out, as partitioning
    leaves it out of its reductions.

    The runtime runs these functions once per iteration (docs/Parallelism.md).
    Without a grid, or with one data (and context) rank and no distributed
    optimizer, the module is unchanged.

    ```mlir
    %dw = mt.linear_weight_grad %x, %dy : ...
    %r = shard.all_reduce %dw on @grid grid_axes = [0] : ...
    return %loss, %r
    // becomes
    return %loss, %dw
    func.func @reduce_gradients(%g: tensor<4160xf32>) -> tensor<4160xf32>
        attributes {mt.buffer_offsets = array<i64: 0, 4096>,
                    mt.gradient_buffer = [@w2, @w1]} {
      %0 = shard.all_reduce %g on @grid grid_axes = [0] : ...
      return %0 : tensor<4160xf32>
    }
    ```
  }];
  let options = [
    Option<"distributedOptimizer", "distributed-optimizer", "bool", "false",
           "Reduce-scatter the gradients and all-gather the parameters "
           "(Megatron-LM's --use-distributed-optimizer)">,
    Option<"trainFunction", "train-function", "std::string",
           "\"train_step\"", "The training step whose gradients are reduced">,
    Option<"pipelineSize", "pipeline-size", "int64_t", "0",
           "Pipeline ranks: stage k's gradients join rank k % size's buffer "
           "(needed when the module holds pipeline stages)">,
    Option<"bucketSize", "bucket-size", "int64_t", "0",
           "Megatron-LM's --overlap-grad-reduce with --ddp-bucket-size: split "
           "each buffer into buckets of at least this many elements (the "
           "last may be smaller), each reduced by a function of its own "
           "during the last micro-batch's backward pass; 0: one reduction "
           "of the whole buffer after it">,
    Option<"overlapParamGather", "overlap-param-gather", "bool", "false",
           "Megatron-LM's --overlap-param-gather (needs distributed-optimizer "
           "and bucket-size > 0): mark each bucket's parameter gather "
           "(mt.overlap_param_gather) to run before the first use of its "
           "parameters in the next step instead of after the optimizer">,
    Option<"contextAxis", "context-axis", "int64_t", "-1",
           "The grid axis of the context-parallel ranks (1 in "
           "mt-annotate-shardings' dp x cp x tp grid), whose reduction the "
           "buffer takes over with the data axis's (Megatron-LM's data x "
           "context group); -1: none">
  ];
  let dependentDialects = ["::mlir::mt::MtDialect", "::mlir::shard::ShardDialect",
                           "::mlir::func::FuncDialect"];
}

def PrintCollectivesPass : Pass<"mt-print-collectives", "::mlir::ModuleOp"> {
  let summary = "prints each step's collectives, their bytes per rank, and Megatron-LM's prediction";
  let description = [{
    For partitioned IR (after `megatron-partition-pipeline`): one row per
    collective of each function, in program order, with its grid axes, the
    rank's operand shape and element type and the bytes it sends into the
    collective; then per function the bytes on the tensor-parallel and the
    data-parallel axes, next to the volumes Megatron-LM's analysis predicts
    for a decoder: four all-reduces of a `[b, s, h]` activation per layer and
    training step (two forward, two backward) on the tensor axis, and the
    gradients of the rank's parameters on the data axis. The IR is left
    unchanged.
  }];
  let dependentDialects = ["::mlir::mt::MtDialect", "::mlir::shard::ShardDialect"];
}

def DifferentiatePipelineStagesPass
    : Pass<"mt-differentiate-pipeline-stages", "::mlir::ModuleOp"> {
  let summary = "appends the backward pass to each pipeline stage of a step";
  let description = [{
    For each function marked `mt.pipeline_stage` whose name starts with
    `prefix` (the model builder's `train_step_stage<k>`): adds a trailing
    argument with the gradient of its result (`mt.name = "output_gradient"`,
    or `"loss_gradient"` for the last stage's scalar loss, which the runtime
    sets to 1), appends the backward pass (the same VJP rules and
    `mt.accumulate_gradient`s as mt-differentiate), and, when the stage's
    input is an activation rather than the tokens, returns its gradient as
    the second result (`mt.name = "input_gradient"`), which the schedule
    sends to the stage before.

    ```mlir
    func.func @train_step_stage1(%h: tensor<8x128x64xf32>) -> tensor<8x128x64xf32>
    // becomes
    func.func @train_step_stage1(%h: tensor<8x128x64xf32>,
        %dout: tensor<8x128x64xf32> {mt.name = "output_gradient"})
        -> (tensor<8x128x64xf32>, tensor<8x128x64xf32> {mt.name = "input_gradient"})
    ```
  }];
  let options = [
    Option<"prefix", "prefix", "std::string", "\"train_step\"",
           "Stages whose function names start with this are differentiated">
  ];
  let statistics = [
    Statistic<"numStages", "stages", "Number of stages differentiated">
  ];
  let dependentDialects = ["::mlir::mt::MtDialect"];
}

def SplitForwardBackwardPass
    : Pass<"mt-split-forward-backward", "::mlir::ModuleOp"> {
  let summary = "splits each differentiated pipeline stage into forward and backward functions";
  let description = [{
    A pipeline schedule runs a stage's forward pass of a micro-batch long
    before its backward pass, so each differentiated stage `@s` (after
    mt-differentiate-pipeline-stages, and after partitioning when there is
    tensor or data parallelism) becomes `@s_forward` and `@s_backward`.
    The backward pass is every op that depends on the output's gradient, and
    every op whose results only the backward pass reads. The forward values
    it reads are the stash: the forward function returns them after its
    output (`mt.name = "stash"`), the backward function takes them, in the
    same order, before the output's gradient. Parameters are not stashed
    (each function reads its own), nor values made from nothing (parameter
    views, fills), which the backward function makes again.

    ```
    @s_forward(input, [labels], parameters...) -> (output, stash...)
    @s_backward(stash..., output_gradient, parameters...)
        -> ([input_gradient], gradients...)
    ```
  }];
  let statistics = [
    Statistic<"numStashed", "stashed", "Number of values stashed for the backward pass">
  ];
  let dependentDialects = ["::mlir::mt::MtDialect"];
}

def RegatherInBackwardPass
    : Pass<"mt-regather-in-backward", "::mlir::ModuleOp"> {
  let summary = "keeps sequence shards for the backward pass and all-gathers them there again";
  let description = [{
    Runs on partitioned differentiated steps (a pipeline stage with its
    `output_gradient` or `loss_gradient` argument, or a step whose backward
    pass starts at the fill marked `mt.loss_seed`), before
    mt-split-forward-backward. Under sequence parallelism each
    column-parallel linear reads its input all-gathered along the sequence,
    and its weight gradient reads that gathered `[b, s, h]` tensor in the
    backward pass. As Megatron-LM does, the backward pass instead reads a
    clone of the forward all-gather, placed right before its first backward
    reader, so that what lives from the forward to the backward pass (and
    what a pipeline stage stashes) is the `[b, s/t, h]` shard: t times less
    memory for one more all-gather per column-parallel layer. A gather copies,
    so the results are bit-identical. Clones carry the unit attribute
    `mt.regathered` (it keeps CSE from merging them back).

    ```mlir
    %g = shard.all_gather %x on @grid grid_axes = [1] gather_axis = 1
    %y = mt.linear %g, %w transpose_weight
    ... // backward
    %dw = mt.linear_weight_grad %g, %dy transpose_weight
    // becomes
    %g = shard.all_gather %x on @grid grid_axes = [1] gather_axis = 1
    %y = mt.linear %g, %w transpose_weight
    ...
    %g1 = shard.all_gather %x on @grid grid_axes = [1] gather_axis = 1 {mt.regathered}
    %dw = mt.linear_weight_grad %g1, %dy transpose_weight
    ```
  }];
  let statistics = [
    Statistic<"numRegathered", "regathered", "Number of all-gathers repeated in the backward pass">
  ];
  let dependentDialects = ["::mlir::mt::MtDialect", "::mlir::shard::ShardDialect"];
}

def VerifyCollectivesPass : Pass<"mt-verify-collectives", "::mlir::ModuleOp"> {
  let summary = "proves that every rank issues the same collectives in the same order";
  let description = [{
    A collective completes only when every rank of its group calls it with
    the same operation, group (grid axes), shape and element type; a rank
    that skips one, or calls another, leaves the others waiting forever.
    This pass rejects, with a diagnostic, any plan where that could happen:

    - SPMD functions (one program for every rank, what
      `megatron-partition-pipeline` writes): a collective under control flow
      that depends on the rank (`scf.if`, loops or branches on a value
      derived from `shard.process_multi_index`, `process_linear_index` or
      `neighbors_linear_indices`), or with a dynamic shape.
    - Per-rank functions (`mt.step = "train_step"`, `mt.rank = N`): the
      programs of one step must cover the grid's ranks once each and issue
      the same sequence of collectives, compared pairwise (operation, grid,
      grid axes, attributes such as the reduction or gather axis, operand
      and result types).

    ```mlir
    // rejected: rank 1 of a 1x2 grid gathers, rank 0 all-reduces
    func.func @step_rank0(...) attributes {mt.step = "step", mt.rank = 0} {
      %0 = shard.all_reduce %x on @grid grid_axes = [1] : ...
    }
    func.func @step_rank1(...) attributes {mt.step = "step", mt.rank = 1} {
      %0 = shard.all_gather %x on @grid grid_axes = [1] gather_axis = 0 : ...
    }
    ```

    The IR is left unchanged; the pass runs at the end of
    `megatron-partition-pipeline`.
  }];
  let statistics = [
    Statistic<"numChecked", "checked", "Number of collectives checked">
  ];
  let dependentDialects = ["::mlir::shard::ShardDialect"];
}

def FuseColumnSumsPass : Pass<"mt-fuse-column-sums", "::mlir::ModuleOp"> {
  let summary = "moves bias gradients into the generated kernels that write their operands";
  let description = [{
    Runs after the precision pipeline, on the typed IR the bundle is written
    from, when the elementwise kernels are on (`megatron-compile
    --fuse-kernels`: mt-fuse-elementwise marks the module
    `mt.elementwise_kernels`). A bias gradient whose operand an `mt.fused` group
    writes (the dropout gradient at dropout > 0), or a lone elementwise op
    (the residual gradient at dropout 0), becomes a column sum of that group's
    kernel: an `mt.bias_grad` inside the group, its result a result of the
    group. The kernel sums the columns as it writes them, so the bias
    gradient costs no pass of its own and no cuBLASLt BGRAD epilogue (20-37%
    of the weight-gradient GEMM on the H200: bench/NOTES.md, session 24).

    - `mt.linear_weight_bias_grad %x, %dy` becomes `mt.linear_weight_grad`
      and the group's column sum of `%dy`;
    - an `mt.bias_grad %dy` (FP8 leaves them, `mt-fp8-gemms`) joins the same
      way;
    - a lone elementwise op that writes `%dy` (the residual gradient's
      `mt.add` at dropout 0, a dropout gradient) becomes a group of that op
      and the sum.

    Only where `%dy` is also read outside (it stays a result the kernel
    stores, which a backend that cannot sum in the kernel sums afterwards),
    in the same block, and the group keeps within 8 results.

    ```mlir
    %dy = mt.add %a, %b : tensor<8x128x128xbf16>
    %dw, %db = mt.linear_weight_bias_grad %x, %dy : ...
    // becomes
    %dy, %db = mt.fused (%a, %b) : (...) -> (tensor<8x128x128xbf16>, tensor<128xf32>) {
    ^bb0(%u: tensor<8x128x128xbf16>, %v: tensor<8x128x128xbf16>):
      %s = mt.add %u, %v : tensor<8x128x128xbf16>
      %c = mt.bias_grad %s : tensor<8x128x128xbf16> -> tensor<128xf32>
      mt.yield %s, %c : tensor<8x128x128xbf16>, tensor<128xf32>
    }
    %dw = mt.linear_weight_grad %x, %dy : ...
    ```
  }];
  let statistics = [
    Statistic<"numSums", "column-sums", "bias gradients moved into kernels">
  ];
  let dependentDialects = ["::mlir::mt::MtDialect"];
}

def FuseElementwisePass : Pass<"mt-fuse-elementwise", "::mlir::ModuleOp"> {
  let summary = "groups chains of elementwise ops into mt.fused kernels";
  let description = [{
    Walks each function's ops in order and grows groups of elementwise ops
    (`add`, `mul`, `dropout` without `mt.split_axes`, `silu`, `swiglu`:
    `mt::isFusibleElementwiseOp`) along their operands. An op joins the group
    that defines one of its operands when

    - it has the group's type (one static shape and element type: no
      broadcasts, every thread reads and writes element `i` only), and
    - every use of the group's values outside the group comes after it (the
      group becomes one op at the position of its last op), and
    - the group stays within 8 operands and 8 results.

    Each group of two ops or more becomes one `mt.fused` op whose body is the
    original ops. A value computed in the group and used outside it is a
    result of the group: it is written once, never recomputed. Nothing else
    is stored. GEMMs, norms, collectives and GeLU (kept for the GEMM
    epilogues) are never inside a group, so this pass runs last, on the IR
    the bundle is written from. The bundle writer emits one CUDA kernel per
    group (docs/BundleFormat.md, "Fused kernels").

    ```mlir
    %d = mt.dropout %x p = 1.000000e-01 seed = 2 : tensor<8x128x128xf32>
    %r = mt.add %res, %d : tensor<8x128x128xf32>
    // becomes
    %r = mt.fused (%x, %res) : (tensor<8x128x128xf32>, tensor<8x128x128xf32>) -> tensor<8x128x128xf32> {
    ^bb0(%a: tensor<8x128x128xf32>, %b: tensor<8x128x128xf32>):
      %d = mt.dropout %a p = 1.000000e-01 seed = 2 : tensor<8x128x128xf32>
      %r = mt.add %b, %d : tensor<8x128x128xf32>
      mt.yield %r : tensor<8x128x128xf32>
    }
    ```
  }];
  let statistics = [
    Statistic<"numGroups", "groups", "Number of mt.fused groups made">,
    Statistic<"numFusedOps", "fused-ops", "Number of ops moved into groups">
  ];
  let dependentDialects = ["::mlir::mt::MtDialect"];
}

def FuseLinearCrossEntropyPass
    : Pass<"mt-fuse-linear-cross-entropy", "::mlir::ModuleOp"> {
  let summary = "the output layer's linear, cross-entropy and their gradients "
                "as one chunked op";
  let description = [{
    Runs on the per-rank IR, first in the fusion pipeline. In each function,
    rewrites the output layer of a training step:

    ```mlir
    %logits = mt.linear %h, %w transpose_weight
    %loss = mt.cross_entropy %logits, %labels reduction = mean
    %dlogits = mt.cross_entropy_grad %seed, %logits, %labels reduction = mean
    %dh = mt.linear %dlogits, %w
    %dw = mt.linear_weight_grad %h, %dlogits transpose_weight
    ```

    into `mt.linear_cross_entropy` (MtFusedOps.td), placed where the logits
    were computed, and two `mt.scale`s by the seed where the gradient was:

    ```mlir
    %loss, %dh1, %dw1 = mt.linear_cross_entropy %h, %w, %labels reduction = mean
        chunk_rows = 1280 transpose_weight
    %dh = mt.scale %dh1, %seed
    %dw = mt.scale %dw1, %seed
    ```

    The whole-vocabulary logits and their gradient are gone: the fused op
    holds one chunk's logits at a time, in a scratch block of the memory
    plan (docs/Memory.md, "The loss without whole-vocabulary logits"). No
    GEMM is added: the gradients are computed in the forward pass for a
    loss gradient of one, and scaled by the seed in the backward pass. Tied
    (the embedding table) and untied (`lm_head`) weights are alike here.

    Only this exact shape is rewritten: the logits used by one cross_entropy
    and its cross_entropy_grad, that gradient read only by the data and
    weight gradients of the same linear (no bias), reduction mean or sum.
    Evaluation (no gradient) and per-token losses keep the unfused ops.

    Under tensor parallelism the output layer holds a block of the
    vocabulary and its loss is the vocabulary-parallel one: the logits'
    readers `mt.vocab_max`, `mt.vocab_partials` and (training)
    `mt.vocab_cross_entropy_grad`, with all-reduces over the vocabulary's
    grid axes between them. The gradient needs the whole vocabulary's
    maximum and sums, known only after those all-reduces, so each reader
    becomes a chunked op of its own where it stands, recomputing the
    chunk's logits from the linear's input and weight:

    ```mlir
    %m0 = mt.linear_vocab_max %h, %w chunk_rows = 1280 transpose_weight
    %m = shard.all_reduce %m0 on @grid grid_axes = [1] reduction = max
    %p0 = mt.linear_vocab_partials %h, %w, %labels, %m chunk_rows = 1280
        transpose_weight {vocab_shard_axes = array<i64: 1>}
    %p = shard.all_reduce %p0 on @grid grid_axes = [1]
    %loss = mt.vocab_cross_entropy %p, %labels reduction = mean
    %dh0, %dw = mt.linear_vocab_cross_entropy_grad %h, %w, %labels, %m, %p,
        %seed reduction = mean chunk_rows = 1280 transpose_weight
        {vocab_shard_axes = array<i64: 1>}
    %dh = shard.all_reduce %dh0 on @grid grid_axes = [1]
    ```

    The collectives are untouched (they were verified before the fusion
    pipeline). The logits' GEMM runs three times instead of once: the
    price of never holding the block's logits. Evaluation's vocabulary
    loss (no gradient) is rewritten too. Under sequence parallelism the
    gradient op reads the input mt-regather-in-backward gathered again.
    On a pipeline's last stage the statistics ops run in the forward
    function and the gradient op in the backward, reading the stashed
    input (or its stashed shard, gathered again) and the backward's read
    of the same parameter; the logits' stash is dropped from both.

    A pipeline's last stage, split into a forward and a backward function
    (mt-split-forward-backward), is matched across the two: the linear and
    cross_entropy in the forward, which stashes the logits (and the labels
    and the linear's input), and cross_entropy_grad and the two gradient
    GEMMs in the backward, reading the stash and the same parameter. The
    fused op runs in the forward, which stashes the two gradients for a
    loss gradient of one instead (dx in the logits' place, dW right after
    it); the backward scales them by its seed. Stashes the backward no
    longer reads (the labels, the linear's input) are dropped from both
    functions.

    `chunk-rows` sets the tokens per chunk; 0 derives it from `chunk-bytes`:
    all the rows when their logits fit in `chunk-bytes`, else the fewest
    chunks whose logits fit, made even (the rows over the chunk count,
    rounded up to a multiple of 64 when the most rows that fit are more
    than 64: never past `chunk-bytes`). The default 1 GiB: on the H200 the
    fused loss ran 10-12% faster than in chunks of 256 MiB at gpt2-124m,
    gpt-1.3b and llama-1.5b (bench/NOTES.md, session 20). The logits are bf16 under
    `precision = "bf16"` (`mt-mixed-precision` types the op's input bf16,
    and the chunk's logits have its type), else f32.
  }];
  let dependentDialects = ["::mlir::mt::MtDialect"];
  let options = [
    Option<"chunkRows", "chunk-rows", "int64_t", "0",
           "Tokens per chunk (0: from chunk-bytes)">,
    Option<"chunkBytes", "chunk-bytes", "int64_t", "1073741824",
           "The most bytes of one chunk's logits (default 1 GiB)">,
  ];
  let statistics = [
    Statistic<"numFused", "fused-losses",
              "Output layers fused with their cross-entropy">,
  ];
}

def FuseGemmEpiloguesPass : Pass<"mt-fuse-gemm-epilogues", "::mlir::ModuleOp"> {
  let summary = "fuses the GeLU's gradient and bias gradients (and optionally the tanh GeLU) into GEMMs";
  let description = [{
    Runs last, on the per-rank IR the bundle is written from. Rewrites, in
    every function:

    - `mt.gelu approximate = tanh` of an `mt.linear` into `mt.linear_gelu`,
      whose second result (the pre-activation) replaces the linear's result
      everywhere (the backward pass's `mt.gelu_grad` reads it);
    - `mt.gelu_grad` whose output gradient is an `mt.linear` without bias
      used only there (the next layer's data gradient) into
      `mt.linear_gelu_grad`, taking in an `mt.bias_grad` of its result as the
      second result (not under FP8, `mt.fp8` on the module: mt-fp8-gemms
      casts the linear's operands, and leaves fused GEMMs in bf16; nor where
      the output gradient is all-gathered, under sequence parallelism:
      --tp-comm-overlap cuts that linear into chunks, which need no slices
      of the pre-activation);
    - an `mt.bias_grad` of the output gradient of an `mt.linear_weight_grad`
      into `mt.linear_weight_bias_grad`;
    - last, an `mt.add` of an `mt.linear` used only there into
      `mt.linear_add` (with `linear-adds`, the default; not under FP8): the
      residual connections after the attention's and the MLP's output
      layers without dropout, and one data gradient added to another (a
      Llama's q, k and v projections, its gate and up projections). Of two
      linears, the later one takes the sum.

    Each fused op means exactly the ops it replaces. The cuda backend runs
    `mt.linear_gelu` and `mt.linear_weight_bias_grad` as one cuBLASLt GEMM
    with the epilogue (GELU_AUX_BIAS, BGRADA/BGRADB), and
    `mt.linear_add` as one GEMM whose C is the addend (beta = 1: no add
    kernel, which reads both tensors and writes a third), and
    `mt.linear_gelu_grad` as a plain GEMM into its result followed by a
    GeLU-gradient kernel that sums the bias gradient's columns as it writes
    them: the bias gradient of the MLP's first layer, the widest, costs no
    pass of its own and no epilogue (BGRAD costs 20-35% of the weight
    gradient's GEMM; bench/NOTES.md, session 25).

    The forward rewrite runs only with `gelu-epilogues=true`, and for the
    tanh GeLU only (cuBLASLt's GELU epilogues evaluate the tanh
    approximation): on the H200 with cuBLASLt 13, GELU_AUX_BIAS runs at
    160-270 TFLOP/s where the plain GEMM runs at 700 (gpt2-124m's MLP: 0.57
    ms against 0.22), far more than the separate GeLU kernel costs
    (bench/NOTES.md).

    ```mlir
    %h = mt.linear %x, %w, %b : ...
    %y = mt.gelu %h approximate = tanh : ...
    // becomes
    %y, %h = mt.linear_gelu %x, %w, %b approximate = tanh : ...
    ```
  }];
  let options = [
    Option<"geluEpilogues", "gelu-epilogues", "bool", "false",
           "also fuse the forward tanh GeLU into its GEMM's epilogue">,
    Option<"linearAdds", "linear-adds", "bool", "true",
           "fuse an add of a linear layer's result into its GEMM">
  ];
  let statistics = [
    Statistic<"numLinearGelu", "linear-gelu", "linear + gelu fused">,
    Statistic<"numLinearGeluGrad", "linear-gelu-grad",
              "linear data gradients + gelu_grad fused">,
    Statistic<"numBiasGrad", "bias-grad",
              "bias_grad fused into a GEMM's epilogue">,
    Statistic<"numLinearAdd", "linear-add", "linear + add fused">
  ];
  let dependentDialects = ["::mlir::mt::MtDialect"];
}

def DecomposeCollectiveMatmulsPass
    : Pass<"mt-decompose-collective-matmuls", "::mlir::ModuleOp"> {
  let summary = "cuts the all-gather before a GEMM and the reduce-scatter after one into chunks pipelined against chunks of the GEMM";
  let description = [{
    Megatron-LM's `--tp-comm-overlap` (collective-matmul decomposition, as
    async tensor parallelism does), on per-rank IR under tensor and sequence
    parallelism; runs before `mt-split-collectives`.

    - A `shard.all_gather` along a row dimension (not the last) read by
      GEMMs (`mt.linear`, `mt.linear_gelu` whose input it is): the rank's
      rows are split into `chunks` chunks, each gathered alone (chunk j of
      the whole is every rank's chunk j), and each GEMM runs once per
      gathered chunk; its results, and the gathered tensor where another op
      reads it, are put back together (`mt.concat`).
    - A `shard.reduce_scatter` along a row dimension of rows made by GEMMs
      (`mt.linear`, `mt.linear_add` whose addend is such rows or a leaf,
      and `mt.add` or `mt.cast` of such rows, each read once):
      per chunk j, every rank's chunk j of the rows is computed from slices
      of the GEMMs' inputs and reduce-scattered alone; the rank's chunks are
      joined.

    The chunks are whole samples (the first dimension, before the
    collective's) where the first dimension has a divisor of 2 or more up
    to `chunks`: each is then a contiguous block of every tensor it is cut
    from or joined into, so that the memory plan makes those slices and
    joins views (`mt.chunk_copy` along axis 0, findViewGroups). Otherwise
    (one sample) they are rows of the collective's dimension, the largest
    divisor up to `chunks`, and chunk j of the whole interleaves the ranks'
    rows (slices and joins through `mt.reshape`, copies). A GEMM computes
    each row alone and a reduce-scatter sums each element alone, so every
    value is the undecomposed program's, bit for bit on the host. A
    collective whose rows do not divide either way is left whole, and so is
    one whose slices and joins would copy more than `max-copy-ratio` times
    its whole tensor (the vocabulary-parallel output layer: its logits are
    many times wider than its gathered input). Each chunk's collective
    carries `mt.chunk = [j, chunks]`.

    ```mlir
    %g = shard.all_gather %x on @grid grid_axes = [1] gather_axis = 1 : tensor<2x8x16xf32> -> tensor<2x16x16xf32>
    %y = mt.linear %g, %w : (tensor<2x16x16xf32>, tensor<16x32xf32>) -> tensor<2x16x32xf32>
    // with chunks=2 becomes
    %x0, %x1 = mt.split %x axis = 0 : tensor<2x8x16xf32> -> tensor<1x8x16xf32>, tensor<1x8x16xf32>
    %g0 = shard.all_gather %x0 on @grid grid_axes = [1] gather_axis = 1 {mt.chunk = array<i64: 0, 2>} : tensor<1x8x16xf32> -> tensor<1x16x16xf32>
    %g1 = shard.all_gather %x1 on @grid grid_axes = [1] gather_axis = 1 {mt.chunk = array<i64: 1, 2>} : tensor<1x8x16xf32> -> tensor<1x16x16xf32>
    %y0 = mt.linear %g0, %w : (tensor<1x16x16xf32>, tensor<16x32xf32>) -> tensor<1x16x32xf32>
    %y1 = mt.linear %g1, %w : (tensor<1x16x16xf32>, tensor<16x32xf32>) -> tensor<1x16x32xf32>
    %y = mt.concat %y0, %y1 axis = 0 : tensor<1x16x32xf32>, tensor<1x16x32xf32> -> tensor<2x16x32xf32>
    ```
  }];
  let options = [
    Option<"chunks", "chunks", "int64_t", "4",
           "the most chunks per collective (Megatron-LM's num_splits)">,
    Option<"maxCopyRatio", "max-copy-ratio", "double", "8.0",
           "the most bytes the slices and joins may copy, as a multiple of the collective's whole tensor">
  ];
  let statistics = [
    Statistic<"numGathers", "gathers", "all-gathers decomposed into chunks">,
    Statistic<"numScatters", "scatters", "reduce-scatters decomposed into chunks">,
    Statistic<"numGemmChunks", "gemms", "GEMMs run in chunks">
  ];
  let dependentDialects = ["::mlir::mt::MtDialect", "::mlir::shard::ShardDialect"];
}

def SplitCollectivesPass : Pass<"mt-split-collectives", "::mlir::ModuleOp"> {
  let summary = "splits each collective into an mt.collective_start and an mt.collective_wait";
  let description = [{
    Each `shard.all_reduce`, `shard.all_gather` and `shard.reduce_scatter`
    in a function's body becomes an `mt.collective_start` holding it and an
    `mt.collective_wait` right after, which returns its result: the program
    computes the same values, and `mt-schedule-collectives` may now move the
    start up and the wait down. Collectives inside other ops' regions and
    other shard ops (`shard.all_slice`, which communicates nothing) stay as
    they are.

    ```mlir
    %y = shard.all_reduce %x on @grid grid_axes = [1] : tensor<4x8xf32> -> tensor<4x8xf32>
    // becomes
    %f = mt.collective_start %x : tensor<4x8xf32> -> !mt.future<tensor<4x8xf32>> {
    ^bb0(%a: tensor<4x8xf32>):
      %r = shard.all_reduce %a on @grid grid_axes = [1] : tensor<4x8xf32> -> tensor<4x8xf32>
      mt.yield %r : tensor<4x8xf32>
    }
    %y = mt.collective_wait %f : !mt.future<tensor<4x8xf32>>
    ```
  }];
  let statistics = [
    Statistic<"numSplit", "split", "collectives split into a start and a wait">
  ];
  let dependentDialects = ["::mlir::mt::MtDialect", "::mlir::shard::ShardDialect"];
}

def ScheduleCollectivesPass
    : Pass<"mt-schedule-collectives", "::mlir::ModuleOp"> {
  let summary = "moves collective starts up and waits down until the cost model says they are hidden";
  let description = [{
    Runs after `mt-split-collectives`. In each function, every
    `mt.collective_start` moves up, past ops it does not depend on, until
    the predicted time of the ops it passes covers the collective's
    predicted time (docs/Parallelism.md, "Overlapped communication"); then
    every `mt.collective_wait` moves down, before the first op that reads
    its result, until the ops between start and wait cover it. No further:
    a start moved up early keeps its result buffer longer, so the cost model
    bounds the memory the overlap costs.

    Starts keep their order among themselves and never pass another
    collective, so every rank still issues the same collectives in the same
    order (what `mt-verify-collectives` proved); waits keep their order too.
    Each start gets `mt.predicted_us`, the collective's predicted time.

    The cost model (`cost-model`, a JSON file; default: the repository's
    data/cost-model.json, built in) holds the measured H200 throughputs of
    GEMMs, attention and memory-bound kernels, and NCCL's bus bandwidth and
    latency over NVLink (groups within a node) and over the network between
    nodes.
  }];
  let options = [
    Option<"costModel", "cost-model", "std::string", "\"\"",
           "the cost model's JSON file (default: data/cost-model.json, built in)">
  ];
  let statistics = [
    Statistic<"numScheduled", "scheduled", "collective starts and waits placed">
  ];
  let dependentDialects = ["::mlir::mt::MtDialect", "::mlir::shard::ShardDialect"];
}

def PrintOverlapPass : Pass<"mt-print-overlap", "::mlir::ModuleOp"> {
  let summary = "prints each collective's predicted time, how much of it is hidden and behind what";
  let description = [{
    For IR after `mt-schedule-collectives`: per function (a step, or a
    pipeline stage's half of one, which every rank of its grid runs), one
    row per collective in issue order with its kind, grid axes, group size,
    link, bytes per rank, predicted time, the part hidden behind the
    computation between its start and its wait, and the ops that hide it;
    then the exposed total. Collectives that are not split are fully
    exposed. What `megatron-compile --report overlap` prints. The IR is left
    unchanged.
  }];
  let options = [
    Option<"costModel", "cost-model", "std::string", "\"\"",
           "the cost model's JSON file (default: data/cost-model.json, built in)">
  ];
  let dependentDialects = ["::mlir::mt::MtDialect", "::mlir::shard::ShardDialect"];
}

#endif // MT_TRANSFORMS_PASSES_TD
