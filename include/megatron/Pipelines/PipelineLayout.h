//===- PipelineLayout.h - Layers to pipeline stages by a cost model -*- C++ -*-===//

#ifndef MEGATRON_PIPELINES_PIPELINELAYOUT_H
#define MEGATRON_PIPELINES_PIPELINELAYOUT_H

#include "megatron/Frontend/CompileConfig.h"

#include "llvm/Support/raw_ostream.h"

#include <cstdint>
#include <string>
#include <vector>

namespace megatron {

/// The cost of one piece of the model for one micro-batch, per pipeline rank
/// (the whole micro-batch of the data-parallel group, before tensor
/// parallelism divides it): forward FLOPs, and bytes moved (parameters read
/// plus activations written).
struct PieceCost {
  double flops = 0;
  double bytes = 0;
  /// Predicted forward seconds on the reference device: FLOPs at its peak
  /// plus bytes at its memory bandwidth (a roofline sum).
  double seconds() const;
};

/// The per-layer costs the partition balances; embedding and loss are
/// charged to the first and the last stage.
struct ModelCosts {
  PieceCost embedding, layer, head;
};
ModelCosts estimateModelCosts(const CompileConfig &config);

/// One virtual pipeline stage (a model chunk): Megatron-LM's interleaving puts
/// virtual stage k on pipeline rank k % p as that rank's chunk k / p.
struct PipelineStage {
  int64_t index = 0, rank = 0, chunk = 0;
  int64_t firstLayer = 0, numLayers = 0;
  bool first = false, last = false;
  PieceCost cost;
};

struct PipelineLayout {
  int64_t pipelineSize = 1;
  /// Virtual stages per pipeline rank (1 without interleaving).
  int64_t virtualSize = 1;
  /// "cost-balanced", "explicit" (first/last layer counts), "even"
  /// (interleaved: every virtual stage gets the same layers).
  std::string method;
  /// p * v stages in model order.
  std::vector<PipelineStage> stages;
  ModelCosts costs;

  void print(llvm::raw_ostream &os) const;
};

/// The layout of a validated configuration with pipeline_model_parallel_size
/// > 1. Without explicit first/last layer counts and without interleaving,
/// contiguous layer ranges minimize the slowest stage's predicted time
/// (ties: the most even split).
PipelineLayout planPipelineLayout(const CompileConfig &config);

} // namespace megatron

#endif // MEGATRON_PIPELINES_PIPELINELAYOUT_H
