//===- PipelinePlan.h - A pipeline-parallel program's schedule -*- C++ -*-===//
//
// Ties the stage layout, the split stage functions of a module and the
// per-rank schedule together: checks the schedule against the functions,
// prints `--report schedule`, and writes the bundle's `pipeline` section.
//
//===----------------------------------------------------------------------===//

#ifndef MEGATRON_PIPELINES_PIPELINEPLAN_H
#define MEGATRON_PIPELINES_PIPELINEPLAN_H

#include "megatron/Frontend/ModelBuilder.h"
#include "megatron/Pipelines/PipelineLayout.h"
#include "megatron/Pipelines/PipelineSchedule.h"

#include "mlir/IR/BuiltinOps.h"

namespace megatron {

struct PipelinePlan {
  PipelineLayout layout;
  PipelineSchedule schedule;
  /// Per virtual stage: the activation types it exchanges, and the bytes
  /// its forward pass stashes for its backward pass per micro-batch.
  std::vector<StageSignature> signatures;
  std::vector<int64_t> stashBytes;
  /// Per virtual stage: the names of its forward's reported MoE losses
  /// after its output (mt::reportedLossResults): none, or `aux_loss` (the
  /// bundle's `aux_loss`) then any of `load_balancing_loss` and `z_loss`
  /// (its `reported_losses`).
  std::vector<std::vector<std::string>> reportedLosses;

  /// Stage layers for buildModelModule.
  std::vector<StageLayers> stageLayers() const;
  /// The bundle's `pipeline` section (docs/BundleFormat.md).
  llvm::json::Object toJSON() const;
  /// `--report schedule`: the layout, each rank's timeline, the predicted
  /// bubble (from the cost model and for uniform stages, beside the classic
  /// formula) and each rank's stashed activations.
  void printReport(llvm::raw_ostream &os) const;
  /// The predicted timeline for the cost model's stage times.
  ScheduleTimeline predict() const;
  /// The most stash bytes pipeline rank `rank` holds at once: its steps in
  /// order, each forward adding its stage's stash, each backward freeing it
  /// (as the runtime keeps them).
  int64_t peakStashBytes(int64_t rank) const;
  /// The virtual stages pipeline rank `rank` runs, in order.
  std::vector<int64_t> stagesOf(int64_t rank) const;
};

/// Micro-batches per iteration: global / (micro-batch size x data parallel).
int64_t microBatchesPerIteration(const CompileConfig &config);

/// Completes `plan` (layout and schedule set) from `module`, whose
/// train_step_stage<k>_forward/_backward and eval_step_stage<k> functions
/// the stage split left, and verifies the schedule against them.
llvm::Error finishPipelinePlan(mlir::ModuleOp module, PipelinePlan &plan);

} // namespace megatron

#endif // MEGATRON_PIPELINES_PIPELINEPLAN_H
