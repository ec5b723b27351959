//===- PipelineLayout.cpp - Layers to pipeline stages by a cost model ------===//

#include "megatron/Pipelines/PipelineLayout.h"

#include "llvm/Support/Format.h"

#include <algorithm>
#include <cmath>
#include <limits>

using namespace megatron;

/// The reference device of the cost model (DESIGN.md): an H200's dense bf16
/// peak and its HBM bandwidth. Only ratios matter for the partition.
static constexpr double kPeakFlops = 989e12, kBandwidth = 4.8e12;

double PieceCost::seconds() const {
  return flops / kPeakFlops + bytes / kBandwidth;
}

ModelCosts megatron::estimateModelCosts(const CompileConfig &config) {
  const ModelConfig &m = config.model;
  double b = static_cast<double>(config.batch.microBatchSize *
                                 config.parallel.dataParallelSize);
  double s = m.seqLength, h = m.hiddenSize, v = config.paddedVocabSize();
  double q = m.numAttentionHeads * m.headDim();
  double kv = m.queryGroups() * m.headDim();
  double f = m.ffnSize();
  double tokens = b * s;
  bool swiglu = m.activation == Activation::Swiglu;
  double element = config.precision == Precision::FP32 ? 4 : 2;
  ModelCosts costs;
  // Embedding: a gather of one row per token.
  costs.embedding.flops = tokens * h;
  costs.embedding.bytes = 2 * tokens * h * element;
  // Layer: projections, the causal attention core (half of QK^T and AV),
  // the MLP; its weights read once, its activations written once.
  double weights = h * (q + 2 * kv) + q * h + (swiglu ? 3 : 2) * h * f;
  costs.layer.flops = 2 * tokens * weights + 2 * b * s * s * q;
  costs.layer.bytes =
      (weights + tokens * (4 * h + q + 2 * kv + (swiglu ? 3 : 2) * f)) *
      element;
  // Head: the final norm, the output projection and the cross-entropy.
  costs.head.flops = 2 * tokens * h * v + 5 * tokens * v;
  costs.head.bytes = (v * h + 2 * tokens * v + tokens * h) * element;
  return costs;
}

static PieceCost sum(const ModelCosts &costs, int64_t layers, bool first,
                     bool last) {
  PieceCost cost;
  cost.flops = layers * costs.layer.flops +
               (first ? costs.embedding.flops : 0) +
               (last ? costs.head.flops : 0);
  cost.bytes = layers * costs.layer.bytes +
               (first ? costs.embedding.bytes : 0) +
               (last ? costs.head.bytes : 0);
  return cost;
}

/// Contiguous layer counts for p stages (each at least one layer) that
/// minimize the slowest stage's time; among equals, the smallest spread.
static std::vector<int64_t> balance(const ModelCosts &costs, int64_t layers,
                                    int64_t p) {
  const double inf = std::numeric_limits<double>::infinity();
  // best[k][n]: the slowest of stages k.. over the last n layers.
  std::vector<std::vector<double>> best(p + 1,
                                        std::vector<double>(layers + 1, inf));
  std::vector<std::vector<int64_t>> take(p + 1,
                                         std::vector<int64_t>(layers + 1, 0));
  best[p][0] = 0;
  for (int64_t k = p - 1; k >= 0; --k)
    for (int64_t n = 1; n <= layers; ++n)
      for (int64_t here = 1; here <= n; ++here) {
        double rest = best[k + 1][n - here];
        if (rest == inf)
          continue;
        double time = std::max(
            rest, sum(costs, here, k == 0, k == p - 1).seconds());
        // Prefer, among equal bottlenecks, the count nearest the even one.
        double even = static_cast<double>(n) / (p - k);
        bool better = time < best[k][n] * (1 - 1e-12) ||
                      (time <= best[k][n] * (1 + 1e-12) &&
                       std::abs(here - even) <
                           std::abs(take[k][n] - even));
        if (better) {
          best[k][n] = time;
          take[k][n] = here;
        }
      }
  std::vector<int64_t> counts;
  for (int64_t k = 0, n = layers; k < p; n -= counts.back(), ++k)
    counts.push_back(take[k][n]);
  return counts;
}

PipelineLayout megatron::planPipelineLayout(const CompileConfig &config) {
  const ParallelConfig &parallel = config.parallel;
  PipelineLayout layout;
  layout.pipelineSize = parallel.pipelineModelParallelSize;
  layout.virtualSize = config.virtualStagesPerRank();
  layout.costs = estimateModelCosts(config);
  const int64_t p = layout.pipelineSize, v = layout.virtualSize;
  const int64_t layers = config.model.numLayers;
  std::vector<int64_t> counts;
  if (v > 1) {
    layout.method = "even";
    counts.assign(p * v, layers / (p * v));
  } else if (parallel.decoderFirstPipelineNumLayers ||
             parallel.decoderLastPipelineNumLayers) {
    layout.method = "explicit";
    for (int64_t k = 0; k < p; ++k)
      counts.push_back(config.pipelineStageNumLayers(k));
  } else {
    layout.method = "cost-balanced";
    counts = balance(layout.costs, layers, p);
  }
  int64_t next = 0;
  for (int64_t k = 0; k < p * v; ++k) {
    PipelineStage stage;
    stage.index = k;
    stage.rank = k % p;
    stage.chunk = k / p;
    stage.firstLayer = next;
    stage.numLayers = counts[k];
    stage.first = k == 0;
    stage.last = k == p * v - 1;
    stage.cost = sum(layout.costs, stage.numLayers, stage.first, stage.last);
    next += counts[k];
    layout.stages.push_back(stage);
  }
  return layout;
}

void PipelineLayout::print(llvm::raw_ostream &os) const {
  os << "pipeline layout: " << pipelineSize << " stages";
  if (virtualSize > 1)
    os << " x " << virtualSize << " virtual stages per rank";
  os << " (" << method << ")\n";
  os << llvm::format("%-7s %-5s %-6s %-12s %-12s %-12s %s\n", "stage", "rank",
                     "chunk", "layers", "GFLOP/mb", "MB moved", "predicted ms");
  for (const PipelineStage &stage : stages) {
    std::string range =
        stage.numLayers == 1
            ? std::to_string(stage.firstLayer)
            : std::to_string(stage.firstLayer) + "-" +
                  std::to_string(stage.firstLayer + stage.numLayers - 1);
    if (stage.first)
      range = "emb+" + range;
    if (stage.last)
      range += "+loss";
    os << llvm::format("%-7lld %-5lld %-6lld %-12s %-12.3f %-12.3f %.4f\n",
                       (long long)stage.index, (long long)stage.rank,
                       (long long)stage.chunk, range.c_str(),
                       stage.cost.flops / 1e9, stage.cost.bytes / 1e6,
                       stage.cost.seconds() * 1e3);
  }
}
