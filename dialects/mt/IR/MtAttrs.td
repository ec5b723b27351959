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

def Mt_MoeScoreFunction : I32EnumAttr<"MoeScoreFunction",
    "how a mixture-of-experts router turns logits into scores", [
      I32EnumAttrCase<"Softmax", 0, "softmax">,
      I32EnumAttrCase<"Sigmoid", 1, "sigmoid">
    ]> {
  let cppNamespace = "::mlir::mt";
}

def Mt_MoeDropPolicy : I32EnumAttr<"MoeDropPolicy",
    "which tokens an expert over its capacity keeps", [
      I32EnumAttrCase<"Probs", 0, "probs">,
      I32EnumAttrCase<"Position", 1, "position">
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

class Mt_Attr<string name, string attrMnemonic, list<Trait> traits = []>
    : AttrDef<Mt_Dialect, name, traits> {
  let mnemonic = attrMnemonic;
}

def Mt_ModelAttr : Mt_Attr<"Model", "model"> {
  let summary = "The model, its batch, its parallel layout and its precision";
  let description = [{
    What a training program is for, beyond its ops: the module attribute
    `mt.model` of a model-level module (`megatron-compile --emit mlir` writes
    it) and of everything the pipelines make of it. The bundle writer records
    it as the manifest's `model` section (docs/BundleFormat.md), which
    megatron-train needs to feed and check batches; a module without it
    still translates, to a bundle without a model section (kernel-level
    tests), that megatron-train refuses.

    The fields are Megatron-LM's names:
    - `name`: the model's name, as the model file gives it;
    - `num_layers`, `hidden_size`, `num_attention_heads`,
      `num_query_groups` (equal to the heads without grouped-query
      attention), `ffn_hidden_size`: the transformer's shape;
    - `seq_length`: tokens per sample;
    - `vocab_size` (the tokenizer's) and `padded_vocab_size` (the
      embedding's rows, a multiple of `make_vocab_size_divisible_by` times
      the tensor-parallel size);
    - `micro_batch_size` (samples per rank and step), `global_batch_size`
      (samples per iteration, a multiple of the micro-batch times the
      data-parallel size);
    - `tensor_model_parallel_size`, `pipeline_model_parallel_size`,
      `data_parallel_size`: the layout the module is (or will be)
      partitioned for; the bundle writer checks them against the
      partitioned module's grid;
    - `precision`: `"fp32"`, `"bf16"` or `"fp16"`.

    Example:
    ```mlir
    module @"tiny-gpt" attributes {mt.model = #mt.model<name = "tiny-gpt",
        num_layers = 2, hidden_size = 128, num_attention_heads = 4,
        num_query_groups = 4, ffn_hidden_size = 512, seq_length = 128,
        vocab_size = 256, padded_vocab_size = 256, micro_batch_size = 8,
        global_batch_size = 8, tensor_model_parallel_size = 1,
        pipeline_model_parallel_size = 1, data_parallel_size = 1,
        precision = "fp32">} { ... }
    ```
  }];
  let parameters = (ins
    StringRefParameter<"the model's name">:$name,
    "int64_t":$num_layers,
    "int64_t":$hidden_size,
    "int64_t":$num_attention_heads,
    "int64_t":$num_query_groups,
    "int64_t":$ffn_hidden_size,
    "int64_t":$seq_length,
    "int64_t":$vocab_size,
    "int64_t":$padded_vocab_size,
    "int64_t":$micro_batch_size,
    "int64_t":$global_batch_size,
    "int64_t":$tensor_model_parallel_size,
    "int64_t":$pipeline_model_parallel_size,
    "int64_t":$data_parallel_size,
    StringRefParameter<"fp32, bf16 or fp16">:$precision
  );
  let assemblyFormat = "`<` struct(params) `>`";
  let genVerifyDecl = 1;
}

def Mt_Fp8RecipeAttr : Mt_Attr<"Fp8Recipe", "fp8_recipe"> {
  let summary = "How a module trains its transformer layers' GEMMs in FP8";
  let description = [{
    The module attribute `mt.fp8` of a module compiled with `--fp8-format`
    (docs/MixedPrecision.md, "FP8"), read by `mt-fp8-gemms` and recorded by
    the bundle writer. Megatron-LM's (Transformer Engine's) settings:
    - `format`: `"e4m3"` (every GEMM operand E4M3) or `"hybrid"` (E4M3
      forward, E5M2 for the output gradients the backward GEMMs read);
    - `scaling`: `"delayed"` (each tensor's scale from an amax history of
      earlier steps, kept in `mt.fp8_meta`s) or `"tensorwise"` (from the
      tensor's own amax, just before its cast);
    - `amax_history_len`, `amax_compute_algo` (`"max"` or `"most_recent"`):
      delayed scaling's history;
    - `margin`: scales are divided by 2^margin;
    - `bf16_layers_at_start`, `bf16_layers_at_end`: transformer layers
      whose GEMMs stay bf16 (`--first-last-layers-bf16`).

    ```mlir
    module attributes {mt.fp8 = #mt.fp8_recipe<format = "hybrid",
        scaling = "delayed", amax_history_len = 1024,
        amax_compute_algo = "max", margin = 0, bf16_layers_at_start = 0,
        bf16_layers_at_end = 0>} { ... }
    ```
  }];
  let parameters = (ins
    StringRefParameter<"e4m3 or hybrid">:$format,
    StringRefParameter<"delayed or tensorwise">:$scaling,
    "int64_t":$amax_history_len,
    StringRefParameter<"max or most_recent">:$amax_compute_algo,
    "int64_t":$margin,
    "int64_t":$bf16_layers_at_start,
    "int64_t":$bf16_layers_at_end
  );
  let assemblyFormat = "`<` struct(params) `>`";
  let genVerifyDecl = 1;
}

def Mt_LayerAttr : Mt_Attr<"Layer", "layer"> {
  let summary = "The transformer layer an op belongs to";
  let description = [{
    Which of the model's transformer layers an op computes, and whether it
    is part of the layer's core attention (Megatron-LM's `core_attention`
    module: the attention op and the reshape of its output). The front end
    sets it as the discardable attribute `mt.layer` on every op of a layer
    that reads a value (ops without operands, constants and parameter
    reads, belong to no layer, so that CSE may share them); the passes that
    make ops out of tagged ones (differentiation, partitioning, fusion,
    recomputation) give them the tag of the op they come from.

    Recomputation (`mt-recompute`) segments the forward pass by it: the
    selective policy recomputes the core attention of each layer, the full
    policy whole layers. The memory report sums saved activations per layer
    by the tag of the op that saves them. Locations are debug information
    only: stripping them (`--strip-debuginfo`) changes no bundle.

    The dialect's verifier holds it to: a `#mt.layer` value, on an op inside
    a function (not on a module or function), with a layer from 0 to the
    module's `#mt.model` `num_layers` minus one when the module has one.

    Example:
    ```mlir
    %y = mt.layer_norm %x, %w, %b epsilon = 1.000000e-05
        {mt.layer = #mt.layer<0>} : ...
    %a = mt.attention %q, %k, %v {mt.layer = #mt.layer<0, core_attention>}
        : ...
    ```
  }];
  let parameters = (ins
    "int64_t":$index,
    DefaultValuedParameter<"bool", "false",
                           "part of the layer's core attention">:$core_attention
  );
  let hasCustomAssemblyFormat = 1;
  let genVerifyDecl = 1;
}

#endif // MT_ATTRS_TD
