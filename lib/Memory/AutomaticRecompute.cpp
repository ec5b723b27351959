//===- AutomaticRecompute.cpp - The least recompute that fits a budget ----===//

#include "megatron/Memory/Memory.h"
#include "megatron/Pipelines/PipelinePlan.h"

#include "llvm/Support/FormatVariadic.h"

#include <optional>

using namespace mlir;
using namespace megatron;

mt::RecomputePolicy
megatron::recomputePolicyOf(const RecomputeConfig &recompute) {
  mt::RecomputePolicy policy;
  switch (recompute.granularity) {
  case RecomputeGranularity::None:
    policy.granularity = mt::RecomputeGranularity::None;
    break;
  case RecomputeGranularity::Selective:
    policy.granularity = mt::RecomputeGranularity::Selective;
    break;
  case RecomputeGranularity::Full:
    policy.granularity = mt::RecomputeGranularity::Full;
    break;
  }
  policy.method = recompute.method == "block" ? mt::RecomputeMethod::Block
                                              : mt::RecomputeMethod::Uniform;
  policy.numLayers = recompute.numLayers;
  return policy;
}

llvm::Expected<mt::RecomputePolicy> megatron::chooseRecomputePolicy(
    ModuleOp module, const CompileConfig &config, int64_t budgetBytes,
    const std::function<LogicalResult(ModuleOp, const mt::RecomputePolicy &)>
        &compile,
    const PipelinePlan *plan) {
  // The total of one candidate, or nullopt when it does not compile.
  std::optional<mt::RecomputePolicy> best;
  int64_t bestTotal = 0, bestRank = 0;
  auto evaluate =
      [&](const mt::RecomputePolicy &policy) -> llvm::Expected<int64_t> {
    OwningOpRef<ModuleOp> candidate = module.clone();
    if (failed(compile(*candidate, policy)))
      return llvm::createStringError(
          "--memory-budget: compiling with recompute " + policy.str() +
          " failed (see the diagnostics above)");
    // A pipeline's candidate fits when its fullest rank does: each rank
    // holds its stages' arenas and the stash of the micro-batches its
    // schedule keeps in flight.
    int64_t total = 0, rank = 0;
    if (plan) {
      PipelinePlan stashed = *plan;
      if (llvm::Error error = finishPipelinePlan(*candidate, stashed))
        return std::move(error);
      for (int64_t r = 0; r < stashed.schedule.pipelineSize; ++r) {
        int64_t bytes = estimateMemory(*candidate, config, &stashed, r)
                            .totalBytes();
        if (bytes > total) {
          total = bytes;
          rank = r;
        }
      }
    } else {
      total = estimateMemory(*candidate, config).totalBytes();
    }
    if (!best || total < bestTotal) {
      best = policy;
      bestTotal = total;
      bestRank = rank;
    }
    return total;
  };
  auto fits = [&](const mt::RecomputePolicy &policy) -> llvm::Expected<bool> {
    llvm::Expected<int64_t> total = evaluate(policy);
    if (!total)
      return total.takeError();
    return *total <= budgetBytes;
  };

  // From the least recompute to the most: none, selective, then the first N
  // layers (block), then every layer in groups (uniform; all of these redo
  // the whole forward pass, so the first that fits is as cheap as any).
  using mt::RecomputeGranularity;
  using mt::RecomputeMethod;
  for (RecomputeGranularity granularity :
       {RecomputeGranularity::None, RecomputeGranularity::Selective}) {
    mt::RecomputePolicy policy;
    policy.granularity = granularity;
    llvm::Expected<bool> ok = fits(policy);
    if (!ok)
      return ok.takeError();
    if (*ok)
      return policy;
  }
  // Block and uniform count layers per (virtual) stage under pipelines.
  int64_t layers = config.model.numLayers;
  if (plan) {
    layers = 0;
    for (const PipelineStage &stage : plan->layout.stages)
      layers = std::max(layers, stage.numLayers);
  }
  auto block = [](int64_t n) {
    mt::RecomputePolicy policy;
    policy.granularity = RecomputeGranularity::Full;
    policy.method = RecomputeMethod::Block;
    policy.numLayers = n;
    return policy;
  };
  // Recomputing more layers never raises the peak: search for the fewest.
  llvm::Expected<bool> allFit = fits(block(layers));
  if (!allFit)
    return allFit.takeError();
  if (*allFit) {
    int64_t low = 1, high = layers; // block(high) fits
    while (low < high) {
      int64_t middle = low + (high - low) / 2;
      llvm::Expected<bool> ok = fits(block(middle));
      if (!ok)
        return ok.takeError();
      if (*ok)
        high = middle;
      else
        low = middle + 1;
    }
    return block(high);
  }
  for (int64_t n = 2; n <= layers; ++n) {
    mt::RecomputePolicy policy = block(n);
    policy.method = RecomputeMethod::Uniform;
    llvm::Expected<bool> ok = fits(policy);
    if (!ok)
      return ok.takeError();
    if (*ok)
      return policy;
  }
  return llvm::createStringError(llvm::formatv(
      "--memory-budget: no recomputation fits {0} ({1} bytes) per rank; the "
      "least memory reached is {2} ({3} bytes{5}) with recompute {4}; raise "
      "the budget, shrink --micro-batch-size, or split the model over more "
      "ranks (--tensor-model-parallel-size{6})",
      formatBytes(double(budgetBytes)), budgetBytes,
      formatBytes(double(bestTotal)), bestTotal, best ? best->str() : "none",
      plan ? llvm::formatv(" on pipeline rank {0}", bestRank).str()
           : std::string(),
      plan ? ", --pipeline-model-parallel-size" : ""));
}
