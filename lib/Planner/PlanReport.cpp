//===- PlanReport.cpp - The --auto-parallel report ------------------------===//

#include "megatron/Memory/Memory.h"
#include "megatron/Planner/Planner.h"

#include "llvm/Support/FormatVariadic.h"

using namespace megatron;

static std::string describe(const Layout &l) {
  std::string text = llvm::formatv(
      "tp {0}{1}{2}, pp {3}", l.tp, l.sequenceParallel ? " + sp" : "",
      l.tpCommOverlap ? " (comm overlap)" : "", l.pp);
  if (l.vp > 1)
    text += llvm::formatv(" x {0} virtual", l.vp);
  text += llvm::formatv(", cp {0}, dp {1}", l.cp, l.dp);
  if (l.ep > 1)
    text += llvm::formatv(", ep {0}", l.ep);
  text += llvm::formatv(
      ", mb {0}, recompute {1}{2}", l.microBatch, l.recomputeName(),
      l.distributedOptimizer ? ", distributed optimizer" : "");
  return text;
}

void megatron::printPrediction(const CompileConfig &config,
                               const ClusterSpec &cluster, const Prediction &p,
                               llvm::raw_ostream &os) {
  os << llvm::formatv("predicted step: {0}, {1} GPUs, {2}\n", config.model.name,
                      p.layout.tp * p.layout.pp * p.layout.cp * p.layout.dp,
                      describe(p.layout));
  os << llvm::formatv(
      "  step {0:F2} ms = makespan {1:F2} ms (kernels {2:F2}, collectives "
      "and sends {3:F2}, bubble {4:F2}) + data-parallel exposed {5:F2} + "
      "optimizer {6:F2}\n",
      p.step * 1e3, (p.compute + p.layerCommunication + p.bubble) * 1e3,
      p.compute * 1e3, p.layerCommunication * 1e3, p.bubble * 1e3,
      p.exposedDataParallel * 1e3, p.optimizer * 1e3);
  os << llvm::formatv("  MFU {0:F1}%, memory {1} on the fullest rank (the "
                      "bundle's plan, with the CUDA context)\n",
                      p.mfu * 100, formatBytes(double(p.memoryBytes)));
}

void megatron::printPlan(const CompileConfig &base, const ClusterSpec &cluster,
                         const PlanResult &result, llvm::raw_ostream &os) {
  const ModelConfig &m = base.model;
  os << llvm::formatv("auto-parallel: {0}, global batch {1} x sequence {2}, "
                      "{3}\n",
                      m.name, base.batch.globalBatchSize, m.seqLength,
                      base.precision == Precision::FP32 ? "fp32" : "bf16");
  cluster.print(os);
  os << llvm::formatv(
      "searched {0} layouts: {1} refused by the compiler, {2} over the "
      "memory; {3} layer compiles, {4} whole-model compiles\n",
      result.layouts, result.refused, result.overMemory, result.layerCompiles,
      result.wholeCompiles);
  os << "\nthe fastest layouts that fit (memory: the bundle's plan on the "
        "fullest rank, with the CUDA context):\n";
  os << llvm::formatv("  {0,-3} {1,10} {2,6} {3,11} {4,9} {5,10} {6,10}  "
                      "{7}\n",
                      "#", "step ms", "MFU", "memory", "bubble", "comm ms",
                      "compute ms", "layout");
  int index = 1;
  for (const Prediction &p : result.best) {
    os << llvm::formatv(
        "  {0,-3} {1,10:F1} {2,5:F1}% {3,11} {4,8:F1}% {5,10:F1} {6,10:F1}  "
        "{7}\n",
        index++, p.step * 1e3, p.mfu * 100, formatBytes(double(p.memoryBytes)),
        p.step > 0 ? 100 * p.bubble / p.step : 0.0,
        (p.layerCommunication + p.exposedDataParallel) * 1e3,
        (p.compute + p.optimizer) * 1e3, describe(p.layout));
  }
  os << "\nflags of each (with the model file):\n";
  index = 1;
  for (const Prediction &p : result.best)
    os << llvm::formatv("  {0}: {1}\n", index++, p.layout.flags());

  if (!result.families.empty()) {
    os << "\nwhy the other families lost (their best layout against #1):\n";
    size_t shown = 0;
    for (const FamilyVerdict &f : result.families) {
      if (shown++ == 16) {
        os << llvm::formatv("  ... {0} more\n", result.families.size() - 16);
        break;
      }
      os << llvm::formatv("  {0,-18} {1,-14} {2}\n", f.family, f.reason,
                          f.detail);
    }
  }
  if (!result.refusals.empty()) {
    os << "\nrefused by the compiler (the first of each kind):\n";
    for (const std::string &reason : result.refusals) {
      llvm::StringRef line(reason);
      os << "  " << line.take_until([](char c) { return c == '\n'; }) << "\n";
    }
  }
}
