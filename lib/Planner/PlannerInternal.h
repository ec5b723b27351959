//===- PlannerInternal.h - The planner's pieces, between its files -*- C++
//-*-===//

#ifndef MEGATRON_PLANNER_PLANNERINTERNAL_H
#define MEGATRON_PLANNER_PLANNERINTERNAL_H

#include "megatron/Pipelines/PipelinePlan.h"
#include "megatron/Planner/Planner.h"

#include "mlir/IR/BuiltinOps.h"
#include "mlir/IR/OwningOpRef.h"

#include <string>

namespace megatron::planner {

/// A model compiled as megatron-compile compiles it (up to the precision
/// pipeline's end), with its pipeline plan completed when it has stages.
struct CompiledModel {
  mlir::OwningOpRef<mlir::ModuleOp> module;
  PipelinePlan plan;
  bool pipelined = false;
};

/// Compiles `config` (validated by the caller). On failure returns false
/// with the diagnostics' first error in `error`.
bool compileModel(mlir::MLIRContext &context, const CompileConfig &config,
                  const CompileFlags &flags, CompiledModel &out,
                  std::string &error);

/// What one micro-batch of a layout costs, split into a transformer layer
/// (the difference of a two- and a one-layer compile of the same shapes and
/// layout) and the rest (embeddings on the first stage; final norm, output
/// layer and loss on the last). Times in microseconds, per rank.
struct StepProfile {
  double layerCompute = 0, firstCompute = 0, lastCompute = 0;
  /// Collectives in line with the kernels (tensor and context parallel,
  /// expert all-to-all, vocabulary-parallel loss).
  double layerCommunication = 0, otherCommunication = 0;
  /// Per rank: fp32 parameter elements, and the bytes a rank holds for
  /// them without the distributed optimizer (weights, bf16 copies,
  /// gradients, Adam's moments).
  int64_t layerParameters = 0, otherParameters = 0;
  int64_t layerStateBytes = 0, otherStateBytes = 0;
  /// Adam's moments within the state bytes (the distributed optimizer
  /// divides them by the data-parallel size).
  int64_t layerOptimizerBytes = 0, otherOptimizerBytes = 0;
  /// train_step's arena for one layer, and what each further layer adds;
  /// one layer's stash (held per micro-batch in flight under pipelines).
  int64_t arenaOneLayer = 0, arenaPerLayer = 0, stashPerLayer = 0;
};

/// The profile of `layout`'s layers on one micro-batch: compiles `base`
/// with one and with two layers (`period` layers each, for models whose
/// MoE layers repeat every `period`), no pipeline, and the data-parallel
/// ranks the expert-parallel split needs.
bool profileLayers(mlir::MLIRContext &context, const CompileConfig &base,
                   const CompileFlags &flags, const Layout &layout,
                   int64_t period, const mlir::mt::CostModel &costModel,
                   const ClusterSpec &cluster, StepProfile &out,
                   std::string &error);

/// The micro-batches whose profiles predict a layout's: 1 and 2 to
/// extrapolate from; its own alone for 1, and under --tp-comm-overlap,
/// whose chunks depend on the micro-batch (whole samples where it divides,
/// up to 4 of them; the sequence, with copies, where it does not).
std::vector<int64_t> profiledMicroBatches(const Layout &layout);

/// A micro-batch of `microBatch` sequences from the profiles of micro-batch
/// `first` and `first + 1`: every figure grows linearly with the
/// micro-batch (the GEMMs' rows, the activations); the launch costs and the
/// parameters do not.
StepProfile profileForMicroBatch(const StepProfile &one, const StepProfile &two,
                                 int64_t first, int64_t microBatch);

/// The cost model with the cluster's GPU: kernel throughputs scaled by its
/// peak, memory-bound times by its bandwidth, links and node size its own.
mlir::mt::CostModel clusterCostModel(const mlir::mt::CostModel &base,
                                     const ClusterSpec &cluster);

} // namespace megatron::planner

#endif // MEGATRON_PLANNER_PLANNERINTERNAL_H
