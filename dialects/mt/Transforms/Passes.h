//===- Passes.h - Passes over the mt dialect --------------------*- C++ -*-===//

#ifndef MT_TRANSFORMS_PASSES_H
#define MT_TRANSFORMS_PASSES_H

#include "mt/IR/MtDialect.h"

#include "mlir/Dialect/Func/IR/FuncOps.h"
#include "mlir/Dialect/Shard/IR/ShardDialect.h"
#include "mlir/IR/BuiltinOps.h"
#include "mlir/Pass/Pass.h"

namespace mlir::mt {

#define GEN_PASS_DECL
#include "mt/Transforms/Passes.h.inc"

#define GEN_PASS_REGISTRATION
#include "mt/Transforms/Passes.h.inc"

/// Writes the parameter table of `module` (see mt-print-parameter-table).
void printParameterTable(ModuleOp module, llvm::raw_ostream &os);

/// Writes the collectives of each function of a partitioned `module` (see
/// mt-print-collectives).
void printCollectives(ModuleOp module, llvm::raw_ostream &os);

struct CostModel;
/// Writes each collective's predicted time, the part hidden behind
/// computation and what hides it, per function of a scheduled `module` (see
/// mt-print-overlap).
void printOverlap(ModuleOp module, const CostModel &model,
                  llvm::raw_ostream &os);

/// The discardable unit attribute mt-differentiate puts on the fill of 1
/// that seeds the backward pass (the loss's gradient); the bundle writes it
/// as fill's `loss_seed`, and fp16 training multiplies that fill by the loss
/// scale.
inline constexpr llvm::StringLiteral kLossSeedAttrName = "mt.loss_seed";

/// The `mt.name` of a pipeline stage's second result: the sum of its MoE
/// layers' auxiliary losses, which the runtime adds to the micro-batch's
/// loss and whose gradient is 1 (docs/Pipeline.md, "Mixture of experts").
/// The model builder names the result so.
inline constexpr llvm::StringLiteral kAuxLossResultName = "aux_loss";

/// Megatron-LM's logged values of the MoE losses, in the order a step
/// reports them: the load-balancing loss (`seq_load_balancing_loss` for
/// the sequence-level one), then the z-loss.
inline constexpr llvm::StringLiteral kLoggedMoeLossNames[] = {
    "load_balancing_loss", "seq_load_balancing_loss", "z_loss"};

/// The results a pipeline stage (or train_step) reports after its output:
/// `aux_loss`, then any of kLoggedMoeLossNames (the logged values of the
/// stage's MoE layers, which nothing differentiates). Their names, from
/// result 1 on; empty without MoE auxiliary losses.
inline SmallVector<StringRef> reportedLossResults(func::FuncOp function) {
  SmallVector<StringRef> names;
  for (unsigned i = 1, e = function.getNumResults(); i < e; ++i) {
    auto name = function.getResultAttrOfType<StringAttr>(i, "mt.name");
    StringRef text = name ? name.getValue() : StringRef();
    bool reported = i == 1 ? text == kAuxLossResultName
                           : llvm::is_contained(kLoggedMoeLossNames, text);
    if (!reported)
      break;
    names.push_back(text);
  }
  return names;
}

/// The `mt.name` of the last pipeline stage's predict_step_stage<k> result:
/// the logits [b, s, v], which keep the whole sequence under sequence
/// parallelism (a stage's other rank-3 results are the residual stream,
/// exchanged as its sequence shard). The model builder names the result so.
inline constexpr llvm::StringLiteral kLogitsResultName = "logits";

/// The discardable i64 attribute mt-annotate-shardings puts on mt.attention
/// and mt.attention_grad under context parallelism: the grid axis whose
/// sequence split holds the load-balanced chunks (docs/Parallelism.md,
/// "Context parallelism"), which the attention's partition turns into
/// mt.attention_block over the gathered keys and values.
inline constexpr llvm::StringLiteral kContextAxisAttrName = "mt.context_axis";
/// On the grid (mt-annotate-shardings): the expert-parallel axis where
/// expert parallelism splits part of the data-parallel ranks (the grid
/// edp x ep x tp, docs/MoE.md).
inline constexpr llvm::StringLiteral kExpertAxisAttrName = "mt.expert_axis";
/// On a partitioned mt.position_ids with mt.context_axis: the size of that
/// axis; the bundle writes both as position_ids' context_axis and
/// context_size.
inline constexpr llvm::StringLiteral kContextSizeAttrName = "mt.context_size";
/// With it, the exchange of keys and values (Megatron-LM's --cp-comm-type):
/// "p2p" (the ring of shard.shift, also when absent) or "all_gather".
inline constexpr llvm::StringLiteral kContextExchangeAttrName =
    "mt.cp_comm_type";

/// The discardable unit attribute on the all-gathers mt-regather-in-backward
/// clones into the backward pass; it keeps CSE from merging them back.
inline constexpr llvm::StringLiteral kRegatheredAttrName = "mt.regathered";

/// The discardable `[j, chunks]` attribute mt-decompose-collective-matmuls
/// puts on chunk j of a tensor-parallel all-gather or reduce-scatter it
/// decomposed (--tp-comm-overlap); --report overlap names the chunks by it.
inline constexpr llvm::StringLiteral kCollectiveChunkAttrName = "mt.chunk";
/// The discardable unit attribute on the mt.split and mt.concat ops that
/// slice and join those chunks: copies the decomposition adds, which
/// --report overlap counts apart.
inline constexpr llvm::StringLiteral kChunkCopyAttrName = "mt.chunk_copy";
/// The discardable integer attribute on each GEMM chunk of those
/// decompositions (mt.linear, mt.linear_gelu, mt.linear_gelu_grad): the rows
/// of the GEMM it is a chunk of. The bundle writes it as the instruction's
/// `whole_rows`; the CUDA backend runs the chunk with the whole's cuBLASLt
/// algorithm, so that each row is summed as in the whole (docs/Parallelism.md,
/// "Same bits on the GPU").
inline constexpr llvm::StringLiteral kWholeRowsAttrName = "mt.whole_rows";

/// Appends the reverse-mode backward pass of `function` (one block) before
/// its return: `seeds[i]` is the gradient of its result i (a value defined
/// before the return, such as a fill of 1 or an argument). Every parameter
/// read on the way ends with one `mt.accumulate_gradient`, in declaration
/// order. Returns the gradient reaching each of `inputs` (null where none
/// does). Used by mt-differentiate and mt-differentiate-pipeline-stages.
FailureOr<SmallVector<Value>> appendBackwardPass(func::FuncOp function,
                                                 ArrayRef<Value> seeds,
                                                 ArrayRef<Value> inputs);

} // namespace mlir::mt

#endif // MT_TRANSFORMS_PASSES_H
