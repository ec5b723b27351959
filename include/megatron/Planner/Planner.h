//===- Planner.h - The compiler chooses the layout (--auto-parallel) -*- C++
//-*-===//
//
// `megatron-compile MODEL --auto-parallel --num-gpus N` searches the layouts
// Megatron-LM's users choose by hand (tensor, pipeline with virtual stages,
// data, sequence, context and expert parallelism, the distributed optimizer,
// the recomputation policy and the micro-batch) for the fastest that fits.
// Each layout's layers are compiled (a one- and a two-layer model of the
// same shapes and layout, whose difference is one layer's exact cost and
// memory), the step is predicted from the cost model's op times, the
// collectives' volumes over the cluster's links and the pipeline schedule's
// simulation, and the fastest layouts are compiled whole so that their
// memory is the bundle's exact plan, not an estimate. docs/Planner.md says
// how the pieces fit and what the model leaves out.
//
//===----------------------------------------------------------------------===//

#ifndef MEGATRON_PLANNER_PLANNER_H
#define MEGATRON_PLANNER_PLANNER_H

#include "megatron/Frontend/CompileConfig.h"
#include "mt/Transforms/CostModel.h"

#include "mlir/IR/MLIRContext.h"
#include "llvm/Support/Error.h"
#include "llvm/Support/raw_ostream.h"

#include <cstdint>
#include <string>
#include <vector>

namespace megatron {

/// The machines a plan is for. The defaults describe H200 nodes of 8 GPUs
/// with NVLink and a 400 Gb/s network per GPU.
struct ClusterSpec {
  int64_t numGpus = 0;
  int64_t gpusPerNode = 8;
  /// Memory a GPU offers (the H200's 141 GB).
  int64_t memoryBytes = int64_t(141) * 1000 * 1000 * 1000;
  /// Dense bf16 tensor-core peak, the MFU's denominator; the cost model's
  /// kernel throughputs scale by peakTflops / 989 (the H200's).
  double peakTflops = 989;
  /// HBM bandwidth; the cost model's memory-bound times scale by it.
  double memoryBandwidthGBps = 4800;
  /// NCCL bus bandwidths and small-message latencies, within a node and
  /// between nodes.
  mlir::mt::LinkCost intraNode{360e3, 8.0};
  mlir::mt::LinkCost interNode{45e3, 25.0};

  /// A cluster file (JSON, docs/Planner.md); keys it leaves out keep the
  /// defaults. Errors name the key, the value and the file.
  static llvm::Expected<ClusterSpec> parse(llvm::StringRef json,
                                           llvm::StringRef source);
  /// Every figure positive, and the GPU count a whole number of nodes when
  /// it spans several. Errors name the value and the fix.
  llvm::Error validate() const;
  void print(llvm::raw_ostream &os) const;
};

/// One candidate layout.
struct Layout {
  int64_t tp = 1, pp = 1, vp = 1, dp = 1, cp = 1, ep = 1;
  bool sequenceParallel = false;
  /// Megatron-LM's --tp-comm-overlap (with sequence parallelism only).
  bool tpCommOverlap = false;
  bool distributedOptimizer = false;
  RecomputeGranularity recompute = RecomputeGranularity::None;
  int64_t microBatch = 1;

  /// Sets the layout's keys in `config` (the model's and batch's stay).
  void applyTo(CompileConfig &config) const;
  /// The recompute_granularity value: none, selective or full.
  llvm::StringRef recomputeName() const;
  /// megatron-compile's flags that reproduce the layout.
  std::string flags() const;
  /// "tp2 pp4 cp1" and the like: the family rejected layouts are grouped by.
  std::string family() const;
};

/// The predicted step of one layout on the cluster, in seconds.
struct Prediction {
  Layout layout;
  double step = 0;
  /// Kernels on the busiest pipeline rank (recomputation included).
  double compute = 0;
  /// Tensor- and context-parallel collectives and pipeline sends, in line
  /// with the kernels.
  double layerCommunication = 0;
  /// The pipeline's idle time on its busiest rank.
  double bubble = 0;
  /// The data-parallel gradient reduction (and the distributed optimizer's
  /// gather) not hidden behind the last micro-batch's backward pass.
  double exposedDataParallel = 0;
  double optimizer = 0;
  double mfu = 0;
  /// The fullest rank's bytes (the CUDA context included); `memoryExact`
  /// once the layout was compiled whole.
  int64_t memoryBytes = 0;
  bool memoryExact = false;
};

/// Why a family of layouts (same tp, pp, cp, ep) lost to the pick.
struct FamilyVerdict {
  std::string family;
  /// Its fastest layout that fits, if any.
  bool fits = false;
  Prediction best;
  /// "memory", "bubble", "communication" or "computation", and the text.
  std::string reason;
  std::string detail;
};

struct PlanResult {
  /// Fastest first, every one compiled whole and within the memory.
  std::vector<Prediction> best;
  std::vector<FamilyVerdict> families;
  int64_t layouts = 0;       // combinations enumerated
  int64_t refused = 0;       // refused by the compiler's validation
  int64_t overMemory = 0;    // over the memory (predicted or exact)
  int64_t layerCompiles = 0; // one- and two-layer compiles
  int64_t wholeCompiles = 0; // whole-model compiles of the fastest
  /// The first refusal's text per reason, for the report.
  std::vector<std::string> refusals;
};

/// megatron-compile's pass options the layouts are compiled with (the
/// bundle's: --fuse-kernels, --fuse-linear-cross-entropy, ...).
struct CompileFlags {
  bool gemmEpilogues = true;
  bool elementwiseKernels = false;
  bool linearCrossEntropy = false;
  int64_t linearCrossEntropyChunkRows = 0;
};

struct PlannerOptions {
  CompileFlags compile;
  int64_t top = 5;
  /// Whole-model compiles allowed before the search gives up finding
  /// `top` layouts that fit.
  int64_t maxWholeCompiles = 40;
};

/// Searches `base`'s model (its shapes, precision and global batch; its
/// layout keys are ignored) on `cluster`. `costModel` gives the kernels'
/// and links' figures. Fails when no layout fits, naming the least memory
/// reached and the budget.
llvm::Expected<PlanResult> planLayouts(mlir::MLIRContext &context,
                                       const CompileConfig &base,
                                       const ClusterSpec &cluster,
                                       const mlir::mt::CostModel &costModel,
                                       const PlannerOptions &options = {});

/// The planner's prediction for `config`'s own layout (`--report step`):
/// its step, and its memory compiled whole. Fails when the compiler refuses
/// the layout or the planner cannot model it (block recomputation, uneven
/// pipeline stages).
llvm::Expected<Prediction> predictLayout(mlir::MLIRContext &context,
                                         const CompileConfig &config,
                                         const ClusterSpec &cluster,
                                         const mlir::mt::CostModel &costModel,
                                         const CompileFlags &flags = {});

/// Prints `--report step`.
void printPrediction(const CompileConfig &config, const ClusterSpec &cluster,
                     const Prediction &prediction, llvm::raw_ostream &os);

/// The `--auto-parallel` report: the cluster, the top layouts with their
/// predicted step, MFU, memory and flags, and why each other family lost.
void printPlan(const CompileConfig &base, const ClusterSpec &cluster,
               const PlanResult &result, llvm::raw_ostream &os);

} // namespace megatron

#endif // MEGATRON_PLANNER_PLANNER_H
