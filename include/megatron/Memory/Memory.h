//===- Memory.h - Per-rank memory: estimate, report, automatic recompute -*- C++ -*-===//
//
// What one rank of a compiled training step holds: parameters, gradients,
// optimizer state, the activation arena of the bundle's memory plan
// (mt/Transforms/MemoryPlan.h) and workspace; the `--report memory` table with
// Megatron-LM's theoretical figures beside it; and the automatic choice of
// the least recomputation that fits a memory budget. docs/Memory.md says how
// the pieces fit.
//
//===----------------------------------------------------------------------===//

#ifndef MEGATRON_MEMORY_MEMORY_H
#define MEGATRON_MEMORY_MEMORY_H

#include "megatron/Frontend/CompileConfig.h"
#include "mt/Transforms/Recompute.h"

#include "mlir/IR/BuiltinOps.h"
#include "llvm/ADT/SmallVector.h"
#include "llvm/Support/Error.h"
#include "llvm/Support/raw_ostream.h"

#include <algorithm>
#include <cstdint>
#include <functional>

namespace megatron {

struct PipelinePlan;

/// What a CUDA process holds besides its own buffers (the CUDA context, the
/// loaded kernels, cuBLASLt's handles), which nothing here can derive:
/// measured on the H200 (driver 580, CUDA 13) as tiny-gpt's peak in
/// nvidia-smi minus its reported total (bench/NOTES.md, "Memory").
inline constexpr int64_t kMeasuredCudaContextBytes = int64_t(535) << 20;

/// One rank's memory for a module that went through the compile pipelines.
struct MemoryEstimate {
  int64_t parameterElements = 0;
  int64_t parameterBytes = 0;
  /// Under bf16: the persistent bf16 copies of the parameters GEMMs read
  /// (runtime/src/cuda/ParameterStore.h), 2 bytes per element.
  int64_t bf16ParameterElements = 0;
  int64_t bf16ParameterBytes = 0;
  /// fp32 gradients the runtime holds besides the arena: none when they
  /// live in train_step's arena (`gradientsInArena`: one micro-batch per
  /// iteration on one rank's step without a data-parallel gradient buffer
  /// or loss scaling; the CUDA trainer's rule, docs/Memory.md), where the
  /// plan already keeps them from their kernel to the step's end.
  int64_t gradientBytes = 0;
  bool gradientsInArena = false;
  /// AdamW's two fp32 moments, divided by the data-parallel size under the
  /// distributed optimizer. The fp32 weights are the master copy.
  int64_t optimizerBytes = 0;
  /// train_step's arena (the plan's peak: values and side buffers), the
  /// instruction where it peaks and the instruction count.
  int64_t activationBytes = 0;
  /// Of the arena at its peak: the side buffers (kernel state saved for a
  /// gradient, kernel scratch, cuBLASLt's workspace in a GEMM's block;
  /// before format version 8, bf16 GEMM operand copies).
  int64_t peakSideBufferBytes = 0;
  int64_t peakInstruction = 0;
  int64_t numInstructions = 0;
  /// Results that take an operand's block in place.
  int64_t inPlaceResults = 0;
  /// eval_step's arena. The CUDA trainer runs train_step and eval_step in
  /// one arena, as large as the larger of theirs (totalBytes).
  int64_t evalArenaBytes = 0;
  /// Saved for the backward pass (live when the loss is computed), by layer;
  /// `savedOtherBytes` for values outside the layers (embeddings, the head).
  llvm::SmallVector<int64_t> savedBytesByLayer;
  int64_t savedOtherBytes = 0;
  /// Ops cloned by recomputation, and the FLOPs they redo per micro-batch.
  int64_t recomputedOps = 0;
  double recomputedFlops = 0;

  /// Mixture of experts (docs/MoE.md): the rank's routed-expert elements
  /// (of parameterElements: E / ep experts of each MoE layer, their
  /// expert-tensor-parallel shard), the bytes saved for the backward pass
  /// by the MoE layers' row values (permuted, dispatched and expert rows,
  /// of savedBytesByLayer), and the all-to-all results of one micro-batch
  /// under expert parallelism: their count, total and largest.
  int64_t expertParameterElements = 0;
  int64_t savedMoeRowBytes = 0;
  int64_t allToAlls = 0;
  int64_t allToAllBytes = 0;
  int64_t largestAllToAllBytes = 0;

  /// Pipelines: the pipeline rank (-1 without) and its virtual stages.
  /// activationBytes is then `arenaBytes`, the arena the rank's stage
  /// functions (forward, backward, eval) share, the largest of theirs
  /// (which also holds eval: evalArenaBytes stays 0), plus
  /// `stashBytes`, the most stash the schedule keeps on the rank at once,
  /// with at most `microBatchesInFlight` micro-batches (counted per stage)
  /// forward done and backward pending; the saved bytes by layer are one
  /// micro-batch's stash.
  int64_t pipelineRank = -1;
  llvm::SmallVector<int64_t> stages;
  int64_t arenaBytes = 0;
  int64_t stashBytes = 0;
  int64_t microBatchesInFlight = 1;

  int64_t totalBytes() const {
    return parameterBytes + bf16ParameterBytes + gradientBytes +
           optimizerBytes + std::max(activationBytes, evalArenaBytes);
  }
};

/// One rank's estimate; with `plan` (a pipeline module, the plan completed
/// by finishPipelinePlan) pipeline rank `pipelineRank`'s.
MemoryEstimate estimateMemory(mlir::ModuleOp module,
                              const CompileConfig &config,
                              const PipelinePlan *plan = nullptr,
                              int64_t pipelineRank = 0);

/// Prints `--report memory`: the estimate per rank (with `plan`, per
/// pipeline rank), by layer, and Megatron-LM's theoretical figures for the
/// same configuration.
void printMemoryReport(mlir::ModuleOp module, const CompileConfig &config,
                       const mlir::mt::RecomputePolicy &policy,
                       llvm::raw_ostream &os,
                       const PipelinePlan *plan = nullptr);

/// "80GiB", "512 MiB", "1.5GB", "1000000": bytes. Errors name the text and
/// the accepted forms.
llvm::Expected<int64_t> parseByteSize(llvm::StringRef text);

/// The model file's recomputation keys as mt-recompute's policy.
mlir::mt::RecomputePolicy recomputePolicyOf(const RecomputeConfig &recompute);

/// Compiles the model-level `module` (a clone per candidate) under each
/// recomputation policy, from the least recompute (none, selective, full
/// block 1..L) to full uniform, and returns the first whose estimated total
/// fits `budgetBytes` on every rank. `compile` runs the pipelines
/// megatron-compile runs. With `plan` (layout and schedule set), the layers
/// count per stage and each pipeline rank's total counts the micro-batches
/// its schedule keeps in flight. Fails naming the best total it reached
/// (the largest rank's), with its policy, and the budget.
llvm::Expected<mlir::mt::RecomputePolicy> chooseRecomputePolicy(
    mlir::ModuleOp module, const CompileConfig &config, int64_t budgetBytes,
    const std::function<mlir::LogicalResult(
        mlir::ModuleOp, const mlir::mt::RecomputePolicy &)> &compile,
    const PipelinePlan *plan = nullptr);

/// "1.50 GiB", "312.00 MiB", "512 B".
std::string formatBytes(double bytes);

} // namespace megatron

#endif // MEGATRON_MEMORY_MEMORY_H
