//===- MemoryReport.cpp - `--report memory` beside Megatron-LM's formula --===//
//
// Megatron-LM estimates memory in megatron/training/theoretical_memory_usage.py
// from two results, which this file restates (derived here, not copied):
//
// - Weights and optimizer: 18 bytes per parameter under mixed precision
//   (16-bit weight 2, fp32 gradient 4, fp32 master weight 4, Adam's two fp32
//   moments 8); the distributed optimizer shards the last 12 over the
//   data-parallel ranks: 6 + 12/dp. Parameters per layer are
//   2h^2 [(1 + g/a) q/h + (f/h) m + 2/h] (attention projections with g
//   key/value groups of a heads and query width q, the MLP with f = ffn size
//   and m = 3/2 for SwiGLU, two norms), plus the final norm 2h and the
//   embedding table V h (twice when untied); biases and learned positions are
//   left out. The most loaded rank holds L/pp layers and the table, over tp.
// - Activations (Korthikanti et al. 2022, "Reducing Activation Recomputation
//   in Large Transformer Models", Table 2, generalized to any ffn size): one
//   layer saves s b h (18 + 4 f/h) bytes of 16-bit activations and 1-byte
//   dropout masks, and 5 a s^2 b more for the attention scores, softmax and
//   its dropout mask unless selective recomputation drops them; a layer
//   under full recomputation keeps only its 16-bit input, 2 s b h. Add the
//   embedding's input and dropout mask (8 s b + s b h) and the output layer's
//   and loss's inputs (4 s b h (1 + V/h)); with sequence parallelism
//   everything divides by tp. Megatron-LM prints the activation figure only
//   for selective recomputation with sequence parallelism.
//
//===----------------------------------------------------------------------===//

#include "megatron/Memory/Memory.h"

#include "llvm/Support/Format.h"
#include "llvm/Support/FormatVariadic.h"

using namespace mlir;
using namespace megatron;

namespace {

/// Megatron-LM's theoretical figures for `config` under `policy`, in bytes.
struct TheoreticalMemory {
  double parameters = 0;
  double bytesPerParameter = 0;
  double weightsAndOptimizer = 0;
  double activations = 0;
  double perLayer = 0;
};

TheoreticalMemory theoreticalMemory(const CompileConfig &config,
                                    const mt::RecomputePolicy &policy) {
  const ModelConfig &m = config.model;
  const ParallelConfig &p = config.parallel;
  const double h = double(m.hiddenSize), a = double(m.numAttentionHeads);
  const double g = double(m.queryGroups()), f = double(m.ffnSize());
  const double q = double(m.numAttentionHeads * m.headDim());
  const double L = double(m.numLayers), V = double(config.paddedVocabSize());
  const double s = double(m.seqLength), b = double(config.batch.microBatchSize);
  const double gated = m.activation == Activation::Swiglu ? 1.5 : 1.0;
  const double tp = double(p.tensorModelParallelSize);
  const double pp = double(p.pipelineModelParallelSize);
  const double dp = double(p.dataParallelSize);

  TheoreticalMemory t;
  double layers =
      2 * L * h * h * ((1 + g / a) * q / h + (f / h) * gated + 2 / h) + 2 * h;
  double embedding = V * h;
  t.parameters = (layers / pp + embedding) / tp;
  if (m.untieEmbeddingsAndOutputWeights && pp == 1)
    t.parameters += embedding / tp;
  t.bytesPerParameter = p.useDistributedOptimizer ? 6 + 12 / dp : 18;
  t.weightsAndOptimizer = t.parameters * t.bytesPerParameter;

  double selective = s * b * h * (18 + 4 * f / h);
  double scores = 5 * a * s * s * b;
  double checkpoint = 2 * s * b * h;
  double full = selective + scores;
  double layersOnStage = L / pp;
  switch (policy.granularity) {
  case mt::RecomputeGranularity::None:
    t.perLayer = full;
    t.activations = layersOnStage * full;
    break;
  case mt::RecomputeGranularity::Selective:
    t.perLayer = selective;
    t.activations = layersOnStage * selective;
    break;
  case mt::RecomputeGranularity::Full: {
    double n = std::min(double(policy.numLayers), layersOnStage);
    t.perLayer = checkpoint;
    if (policy.method == mt::RecomputeMethod::Block)
      t.activations = n * checkpoint + (layersOnStage - n) * full;
    else // one checkpoint per group, and one group's layers while it reruns
      t.activations = std::ceil(layersOnStage / n) * checkpoint + n * full;
    break;
  }
  }
  t.activations += 8 * s * b * pp + s * b * h * pp;
  if (pp == 1)
    t.activations += 4 * s * b * h * (1 + V / h);
  t.activations /= tp;
  t.perLayer /= tp;
  return t;
}

void row(llvm::raw_ostream &os, llvm::StringRef what, int64_t bytes,
         llvm::StringRef formula = "") {
  os << llvm::formatv("  {0,-34} {1,16} {2,12}  {3}\n", what, bytes,
                      formatBytes(double(bytes)), formula);
}

} // namespace

void megatron::printMemoryReport(ModuleOp module, const CompileConfig &config,
                                 const mt::RecomputePolicy &policy,
                                 llvm::raw_ostream &os) {
  MemoryEstimate e = estimateMemory(module, config);
  TheoreticalMemory t = theoreticalMemory(config, policy);
  const ParallelConfig &p = config.parallel;
  const char *precision = config.precision == Precision::FP32   ? "fp32"
                          : config.precision == Precision::BF16 ? "bf16"
                                                                : "fp16";

  os << "memory per rank: " << config.model.name << ", recompute "
     << policy.str() << ", " << p.worldSize() << " rank(s) (tp "
     << p.tensorModelParallelSize << ", pp " << p.pipelineModelParallelSize
     << ", dp " << p.dataParallelSize
     << (p.useDistributedOptimizer ? ", distributed optimizer" : "")
     << "), micro-batch " << config.batch.microBatchSize << ", sequence "
     << config.model.seqLength << ", precision " << precision << "\n";
  os << llvm::formatv("  {0,-34} {1,16} {2,12}  {3}\n", "", "bytes", "",
                      "Megatron-LM's formula");
  row(os,
      llvm::formatv("parameters ({0}, fp32)", e.parameterElements).str(),
      e.parameterBytes,
      llvm::formatv("{0:F0} parameters", t.parameters).str());
  if (config.precision == Precision::BF16)
    row(os,
        llvm::formatv("bf16 weight copies ({0})", e.bf16ParameterElements)
            .str(),
        e.bf16ParameterBytes, "the GEMMs' bf16 operands, kept by the optimizer");
  row(os, "gradients (fp32)", e.gradientBytes);
  row(os, "optimizer state (Adam moments)", e.optimizerBytes);
  int64_t weights = e.parameterBytes + e.bf16ParameterBytes + e.gradientBytes +
                    e.optimizerBytes;
  row(os, "weights and optimizer", weights,
      llvm::formatv("{0} ({1:F2} B/parameter)",
                    formatBytes(t.weightsAndOptimizer), t.bytesPerParameter)
          .str());
  row(os, "activations (train_step arena peak)", e.activationBytes,
      formatBytes(t.activations) + " (16-bit activations)");
  row(os, "  of which side buffers at the peak", e.peakSideBufferBytes,
      "bf16 GEMM operands, saved kernel state, scratch");
  row(os, "workspace (cuBLASLt)", e.workspaceBytes);
  row(os, "total", e.totalBytes(),
      formatBytes(t.weightsAndOptimizer + t.activations));
  row(os, "  with the CUDA context", e.totalBytes() + kMeasuredCudaContextBytes,
      formatBytes(double(kMeasuredCudaContextBytes)) +
          " measured on the H200: nvidia-smi's figure");
  row(os, "eval_step arena (when evaluating)", e.evalArenaBytes);

  os << "saved for the backward pass, by layer (live when the loss is "
        "computed):\n";
  for (auto [layer, bytes] : llvm::enumerate(e.savedBytesByLayer))
    row(os, llvm::formatv("layer {0}", layer).str(), bytes,
        layer == 0 ? formatBytes(t.perLayer) + " per layer" : "");
  row(os, "embeddings and output layer", e.savedOtherBytes);
  os << llvm::formatv("recomputed: {0} ops, {1:F2} GFLOP per micro-batch; "
                      "the arena peaks at instruction {2} of {3}; {4} "
                      "results computed in place\n",
                      e.recomputedOps, e.recomputedFlops / 1e9,
                      e.peakInstruction, e.numInstructions, e.inPlaceResults);
}
