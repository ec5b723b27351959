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
//   in Large Transformer Models", Section 4.1 and Table 2), 16-bit
//   activations and 1-byte dropout masks, in units of s b h bytes per layer,
//   derived term by term as the paper derives GPT's 34 (layerTerms below):
//   the two norms' inputs 4; the QKV projection's input 2; Q 2 and K, V
//   2 g/a each (g key/value groups of a heads; rotary embeddings are applied
//   to Q and K and keep nothing else); the output projection's input 2; the
//   MLP's first linear's input 2; its activation's input and the second
//   linear's input 4 f/h for GeLU, 6 f/h for SwiGLU (the first linear makes
//   the gate and the up projection, 2 f, and the product, f, is the second
//   linear's input); a 1-byte dropout mask after attention and after the MLP
//   when hidden dropout is on, 2. GPT (g = a, f = 4h, dropout): 34;
//   Llama-2-70B (g/a = 1/8, f = 3.5h, SwiGLU, no dropout): 33.5. Unless
//   selective recomputation drops them, the attention core adds its softmax
//   output 2 a s^2 b, and with attention dropout its mask and output,
//   3 a s^2 b more. A layer under full recomputation keeps only its 16-bit
//   input, 2 s b h. Add the embedding's input, 8 s b, and its dropout mask,
//   s b h (with dropout), on the first stage, and the output layer's and the
//   loss's inputs (4 s b h (1 + V/h)) on the last. Tensor parallelism
//   divides Q, K, V, the projection's input, the MLP's inner terms, the
//   attention core and the output layer's terms by tp; sequence parallelism
//   divides the rest too (the norms', QKV and fc1 inputs, the masks, the
//   embedding's terms, a full recomputation's checkpoint): Korthikanti et
//   al.'s s b h (10 + 24/t + 5 a s/(h t)) and s b h (34 + 5 a s/h) / t for
//   GPT. Megatron-LM prints the activation figure only for selective
//   recomputation with sequence parallelism.
// - Pipelines: Megatron-LM's figure is the first stage's, which holds L/p
//   layers of p micro-batches under 1F1B (the embedding terms times p too),
//   and the interleaved schedule multiplies it by 1 + (p - 1) / (p v). Here
//   each pipeline rank r gets its own: its layers' and its stages' terms
//   times the micro-batches it keeps in flight, k_r = min(m, p - r) under
//   1F1B, m under GPipe, and under interleaving the chunks of its warm-up
//   plus one, min(v m, 2 (p - r - 1) + (v - 1) p + 1) (v m when m = p), over
//   v (Megatron-LM's p (1 + (p - 1) / (p v)) on rank 0;
//   megatronForwardsInFlight). Full recomputation counts N per (virtual)
//   stage.
// - Context parallelism: each rank holds s/cp tokens of every sequence, so
//   every activation term counts s/cp for s (Megatron-LM divides its
//   activation figure by cp); the distributed optimizer shards over the
//   data x context ranks, 6 + 12/(dp cp) bytes per parameter.
// - Mixture of experts (docs/MoE.md): an MoE layer's MLP term is, as in
//   Megatron-LM's formula, (f_e/h) E m for E routed experts of width f_e
//   plus (f_s/h) m for a shared expert of width f_s; here the rank holds
//   E/ep of the experts (expert parallelism) and the router's E h whole.
//   Megatron-LM's activation formula has no MoE terms; derived here as the
//   dense ones: an MoE layer keeps, in place of the MLP's inner terms, the
//   router's fp32 logits and routing (4 E + 8 k)/h, the k permuted rows of
//   each token 2 k (whole on every tensor-parallel rank: the experts' column
//   shards read every token's rows), the experts' inner terms k 6 f_e/h
//   (4 for GeLU, over tp) and the shared expert's 6 f_s/h (over tp); the
//   all-to-all dispatcher sends a layer's k s b h rows there and back in the
//   forward and again in the backward pass, 4 all-to-alls of 2 k s b h
//   bytes per layer and micro-batch.
//
//===----------------------------------------------------------------------===//

#include "megatron/Memory/Memory.h"
#include "megatron/Pipelines/PipelinePlan.h"

#include "llvm/Support/Format.h"
#include "llvm/Support/FormatVariadic.h"

using namespace mlir;
using namespace megatron;

namespace {

/// Megatron-LM's theoretical figures for `config` under `policy`, in bytes.
struct TheoreticalMemory {
  double parameters = 0;
  /// Of the parameters: the rank's routed experts.
  double expertParameters = 0;
  /// Per MoE layer and micro-batch: the activations, and the bytes its
  /// all-to-alls move (forward and backward).
  double perMoeLayer = 0;
  double allToAllPerMoeLayer = 0;
  double moeLayers = 0;
  /// Of the activations: the MoE layers' permuted rows and experts' terms.
  double moeRows = 0;
  double bytesPerParameter = 0;
  double weightsAndOptimizer = 0;
  double activations = 0;
  double perLayer = 0;
  /// The formula's per-layer terms that this project does not keep, by
  /// name: the dropout masks (drawn again from the seed), the attention
  /// scores' a s^2 b terms (the fused attention keeps its logsumexp
  /// instead), and under selective recomputation the output projection's
  /// input (the recomputed attention core writes it again; Megatron-LM
  /// keeps it for the projection's weight gradient).
  llvm::SmallVector<std::pair<const char *, double>> notKept;
  /// Micro-batches whose activations the rank holds (1 without pipelines).
  double inFlight = 1;
};

/// What one rank runs of the model: its layers over `chunks` (virtual)
/// stages, whether it embeds (first) and has the output layer (last), and
/// the micro-batches its schedule keeps in flight.
struct RankShare {
  double layers = 0;
  /// Of `layers`, the MoE layers.
  double moeLayers = 0;
  double chunks = 1;
  bool first = true, last = true;
  double inFlight = 1;
};

/// One term of a layer's activations, in s b h bytes; `split`: tensor
/// parallelism splits it (over heads or the MLP's width) without sequence
/// parallelism too; `whole`: no layout splits it (an MoE layer's permuted
/// rows, which every tensor-parallel rank holds).
struct LayerTerm {
  const char *name;
  double sbh;
  bool split;
  bool whole = false;
};

/// Korthikanti et al.'s per-layer terms for `config`'s layer (the file
/// comment derives them).
llvm::SmallVector<LayerTerm> layerTerms(const ModelConfig &m) {
  const double h = double(m.hiddenSize), a = double(m.numAttentionHeads);
  const double g = double(m.queryGroups()), f = double(m.ffnSize());
  bool gated = m.activation == Activation::Swiglu;
  return {{"norm inputs", 4, false},
          {"QKV input", 2, false},
          {"Q", 2, true},
          {"K, V", 4 * g / a, true},
          {"projection input", 2, true},
          {"fc1 input", 2, false},
          {gated ? "SwiGLU input, fc2 input" : "GeLU input, fc2 input",
           (gated ? 6 : 4) * f / h, true},
          {"dropout masks", m.hiddenDropout > 0 ? 2.0 : 0.0, false}};
}

/// An MoE layer's terms: the dense layer's up to the MLP's input, then the
/// router's, the permuted rows' and the experts' (the file comment derives
/// them).
llvm::SmallVector<LayerTerm> moeLayerTerms(const CompileConfig &config) {
  const ModelConfig &m = config.model;
  const MoeConfig &moe = config.moe;
  const double h = double(m.hiddenSize), k = double(moe.routerTopk);
  const double e = double(moe.numExperts);
  const double expertWidth =
      double(moe.ffnHiddenSize ? moe.ffnHiddenSize : m.ffnSize());
  const double sharedWidth = double(moe.sharedExpertIntermediateSize);
  const bool gated = m.activation == Activation::Swiglu;
  const double inner = gated ? 6 : 4;
  llvm::SmallVector<LayerTerm> terms;
  // The dense MLP's inner terms are the experts' here.
  for (const LayerTerm &term : layerTerms(m))
    if (!llvm::StringRef(term.name).ends_with("fc2 input"))
      terms.push_back(term);
  terms.push_back(
      {"router logits, routing (fp32)", (4 * e + 8 * k) / h, false});
  terms.push_back({"permuted rows", 2 * k, false, /*whole=*/true});
  terms.push_back({gated ? "experts' SwiGLU input, fc2 input"
                         : "experts' GeLU input, fc2 input",
                   k * inner * expertWidth / h, true});
  if (sharedWidth > 0)
    terms.push_back(
        {"shared expert's inner terms", inner * sharedWidth / h, true});
  return terms;
}

/// The attention core's a s^2 b bytes, which selective recomputation drops.
int attentionScoreTerm(const ModelConfig &m) {
  return m.attentionDropout > 0 ? 5 : 2;
}

/// "s b h (4 norm inputs + ...) = 34.00 s b h".
std::string describeLayerTerms(llvm::ArrayRef<LayerTerm> terms) {
  std::string text = "s b h (";
  double sum = 0;
  for (const LayerTerm &term : terms) {
    text += llvm::formatv("{0}{1} {2}", sum > 0 ? " + " : "",
                          llvm::formatv("{0:F2}", term.sbh).str(), term.name)
                .str();
    sum += term.sbh;
  }
  return text + llvm::formatv(") = {0:F2} s b h", sum).str();
}

/// The per-layer figure beside a layer's row: the formula's, and the
/// formula's without the terms this project does not keep (naming them).
std::string perLayerText(const TheoreticalMemory &t, bool moe = false) {
  std::string text = moe ? formatBytes(t.perMoeLayer) + " per MoE layer"
                         : formatBytes(t.perLayer) + " per layer";
  if (t.notKept.empty())
    return text;
  double kept = moe ? t.perMoeLayer : t.perLayer;
  std::string names;
  for (auto [name, bytes] : t.notKept) {
    kept -= bytes;
    names += (names.empty() ? "" : ", ") + std::string(name);
  }
  return text + "; " + formatBytes(kept) + " without " + names;
}

TheoreticalMemory theoreticalMemory(const CompileConfig &config,
                                    const mt::RecomputePolicy &policy,
                                    const RankShare &share) {
  const ModelConfig &m = config.model;
  const ParallelConfig &p = config.parallel;
  const double h = double(m.hiddenSize), a = double(m.numAttentionHeads);
  const double g = double(m.queryGroups()), f = double(m.ffnSize());
  const double q = double(m.numAttentionHeads * m.headDim());
  const double V = double(config.paddedVocabSize());
  // Context parallelism gives each rank seq_length / cp tokens of every
  // sequence (Megatron-LM divides its activation terms by cp alike).
  const double s = double(m.seqLength) / double(p.contextParallelSize),
               b = double(config.batch.microBatchSize);
  const double gated = m.activation == Activation::Swiglu ? 1.5 : 1.0;
  const double tp = double(p.tensorModelParallelSize);
  // The distributed optimizer shards over the data x context ranks.
  const double dp = double(p.dataParallelSize * p.contextParallelSize);

  TheoreticalMemory t;
  const double denseLayers = share.layers - share.moeLayers;
  double attentionAndNorms = 2 * h * h * ((1 + g / a) * q / h + 2 / h);
  double mlp = 2 * h * h * (f / h) * gated;
  double embedding = V * h;
  t.parameters = share.layers * attentionAndNorms + denseLayers * mlp;
  // An MoE layer's experts, E/ep of them on the rank, and its shared
  // expert; the router's E h is whole on every tensor-parallel rank.
  const MoeConfig &moe = config.moe;
  double router = 0;
  if (moe.enabled()) {
    const double experts =
        double(moe.numExperts) / double(moe.expertModelParallelSize);
    const double expertWidth =
        double(moe.ffnHiddenSize ? moe.ffnHiddenSize : m.ffnSize());
    double routed = 2 * h * expertWidth * experts * gated;
    double shared = 2 * h * double(moe.sharedExpertIntermediateSize) * gated;
    t.expertParameters = share.moeLayers * routed / tp;
    t.parameters += share.moeLayers * (routed + shared);
    router = share.moeLayers * double(moe.numExperts) * h;
  }
  if (share.first)
    t.parameters += embedding;
  if (share.last) // the final norm, and the output layer's own table
    t.parameters +=
        2 * h + (m.untieEmbeddingsAndOutputWeights ? embedding : 0);
  t.parameters = t.parameters / tp + router;
  t.bytesPerParameter = p.useDistributedOptimizer ? 6 + 12 / dp : 18;
  t.weightsAndOptimizer = t.parameters * t.bytesPerParameter;

  // Per rank: tensor parallelism splits the attention heads and the MLP's
  // width; sequence parallelism splits the rest too (Korthikanti et al.'s
  // s b h (10 + 24/t + 5 a s / (h t)) for GPT without it, s b h (34 + 5 a s
  // / h) / t with it).
  const double replicated = p.sequenceParallel ? tp : 1;
  auto bytesOf = [&](llvm::ArrayRef<LayerTerm> terms) {
    double bytes = 0;
    for (const LayerTerm &term : terms)
      bytes += term.sbh * s * b * h /
               (term.whole   ? 1
                : term.split ? tp
                             : replicated);
    return bytes;
  };
  double selective = bytesOf(layerTerms(m));
  double selectiveMoe = moe.enabled() ? bytesOf(moeLayerTerms(config)) : 0;
  double scores = attentionScoreTerm(m) * a * s * s * b / tp;
  double checkpoint = 2 * s * b * h / replicated;
  double full = selective + scores, fullMoe = selectiveMoe + scores;
  // A layer's figure on average, for the recomputed groups of full
  // recomputation.
  double fullAverage =
      share.layers > 0
          ? (denseLayers * full + share.moeLayers * fullMoe) / share.layers
          : full;
  t.moeLayers = share.moeLayers;
  if (moe.enabled()) {
    llvm::SmallVector<LayerTerm> rows = llvm::filter_to_vector(
        moeLayerTerms(config), [](const LayerTerm &term) {
          llvm::StringRef name(term.name);
          return name.starts_with("permuted") || name.starts_with("experts'");
        });
    t.moeRows = share.moeLayers * bytesOf(rows);
  }
  if (moe.enabled() && moe.expertModelParallelSize > 1)
    t.allToAllPerMoeLayer = 4 * 2 * double(moe.routerTopk) * s * b * h;
  // One micro-batch's activations on the rank, and what a recomputed group
  // holds once while it reruns.
  double perMicroBatch = 0, rerun = 0;
  if (m.hiddenDropout > 0 &&
      policy.granularity != mt::RecomputeGranularity::Full)
    t.notKept.push_back({"the dropout masks", 2 * s * b * h / replicated});
  const double chunkLayers = share.layers / share.chunks;
  switch (policy.granularity) {
  case mt::RecomputeGranularity::None:
    t.perLayer = full;
    t.perMoeLayer = fullMoe;
    t.notKept.push_back({"the attention scores", scores});
    perMicroBatch = denseLayers * full + share.moeLayers * fullMoe;
    break;
  case mt::RecomputeGranularity::Selective:
    t.perLayer = selective;
    t.perMoeLayer = selectiveMoe;
    t.notKept.push_back({"the projection input", 2 * s * b * h / tp});
    perMicroBatch = denseLayers * selective + share.moeLayers * selectiveMoe;
    break;
  case mt::RecomputeGranularity::Full: {
    double n = std::min(double(policy.numLayers), chunkLayers);
    t.perLayer = t.perMoeLayer = checkpoint;
    if (policy.method == mt::RecomputeMethod::Block) {
      perMicroBatch =
          share.chunks * (n * checkpoint + (chunkLayers - n) * fullAverage);
    } else { // one checkpoint per group, and one group's layers while it reruns
      perMicroBatch = share.chunks * std::ceil(chunkLayers / n) * checkpoint;
      rerun = n * fullAverage;
    }
    break;
  }
  }
  if (share.first) // the embedding's input and dropout mask
    perMicroBatch +=
        (8 * s * b + (m.hiddenDropout > 0 ? s * b * h : 0)) / replicated;
  if (share.last) // the output layer's and the loss's inputs
    perMicroBatch += 4 * s * b * h * (1 + V / h) / tp;
  t.inFlight = share.inFlight;
  t.activations = perMicroBatch * share.inFlight + rerun;
  return t;
}

void row(llvm::raw_ostream &os, llvm::StringRef what, int64_t bytes,
         llvm::StringRef formula = "") {
  os << llvm::formatv("  {0,-34} {1,16} {2,12}  {3}\n", what, bytes,
                      formatBytes(double(bytes)), formula);
}

} // namespace

/// ", ep N" in a report's layout under expert parallelism.
static std::string expertText(const CompileConfig &config) {
  int64_t ep = config.moe.expertModelParallelSize;
  return ep > 1 ? llvm::formatv(", ep {0}", ep).str() : std::string();
}

/// The first MoE layer (numLayers when there is none).
static int64_t firstMoeLayer(const CompileConfig &config) {
  int64_t layer = 0;
  while (layer < config.model.numLayers && !config.moe.isMoeLayer(layer))
    ++layer;
  return layer;
}

/// ", cp N (ring)" in a report's layout under context parallelism.
static std::string contextText(const ParallelConfig &p) {
  if (p.contextParallelSize == 1)
    return "";
  return llvm::formatv(", cp {0} ({1})", p.contextParallelSize,
                       p.cpCommType == CpCommType::AllGather ? "all_gather"
                                                             : "p2p")
      .str();
}

/// " (N tokens a context rank)" after the sequence under context
/// parallelism: what every activation term counts.
static std::string sequenceShareText(const CompileConfig &config) {
  int64_t cp = config.parallel.contextParallelSize;
  if (cp == 1)
    return "";
  return llvm::formatv(" ({0} tokens a context rank)",
                       config.model.seqLength / cp)
      .str();
}

static const char *precisionName(const CompileConfig &config) {
  return config.precision == Precision::FP32   ? "fp32"
         : config.precision == Precision::BF16 ? "bf16"
                                               : "fp16";
}

/// The rows from the parameters to "weights and optimizer".
static void printWeights(llvm::raw_ostream &os, const MemoryEstimate &e,
                         const TheoreticalMemory &t,
                         const CompileConfig &config) {
  os << llvm::formatv("  {0,-34} {1,16} {2,12}  {3}\n", "", "bytes", "",
                      "Megatron-LM's formula");
  row(os,
      llvm::formatv("parameters ({0}, fp32)", e.parameterElements).str(),
      e.parameterBytes,
      llvm::formatv("{0:F0} parameters", t.parameters).str());
  if (config.moe.enabled()) {
    const MoeConfig &moe = config.moe;
    row(os,
        llvm::formatv("  of which routed experts ({0})",
                      e.expertParameterElements)
            .str(),
        e.expertParameterElements * 4,
        llvm::formatv(
            "{0:F0}: {1} of {2} experts a layer{3}", t.expertParameters,
            moe.numExperts / moe.expertModelParallelSize, moe.numExperts,
            moe.expertModelParallelSize > 1 ? " (expert parallel)" : "")
            .str());
  }
  if (config.precision == Precision::BF16)
    row(os,
        llvm::formatv("bf16 weight copies ({0})", e.bf16ParameterElements)
            .str(),
        e.bf16ParameterBytes, "the GEMMs' bf16 operands, kept by the optimizer");
  if (e.gradientsInArena)
    row(os, "gradients (fp32, in the arena)", e.gradientBytes,
        "one micro-batch per iteration: the step's results, until AdamW");
  else
    row(os, "gradients (fp32)", e.gradientBytes);
  row(os, "optimizer state (Adam moments)", e.optimizerBytes);
  if (config.moe.enabled()) {
    // The distributed optimizer shards the experts' moments with the rest,
    // but under expert parallelism (out of the buffer) keeps them whole.
    int64_t shards = config.parallel.useDistributedOptimizer &&
                             config.moe.expertModelParallelSize == 1
                         ? config.parallel.dataParallelSize *
                               config.parallel.contextParallelSize
                         : 1;
    row(os, "  experts' gradients, moments",
        (e.gradientsInArena ? 0 : e.expertParameterElements * 4) +
            (e.expertParameterElements * 8 + shards - 1) / shards,
        e.gradientsInArena ? "the moments (the gradients in the arena)"
                           : "fp32 gradients and Adam's two moments");
  }
  int64_t weights = e.parameterBytes + e.bf16ParameterBytes + e.gradientBytes +
                    e.optimizerBytes;
  row(os, "weights and optimizer", weights,
      llvm::formatv("{0} ({1:F2} B/parameter)",
                    formatBytes(t.weightsAndOptimizer), t.bytesPerParameter)
          .str());
}

/// The MoE layers' rows of the activations: their permuted rows saved for
/// the backward pass, and one micro-batch's all-to-all buffers.
static void printMoeActivations(llvm::raw_ostream &os, const MemoryEstimate &e,
                                const TheoreticalMemory &t,
                                const CompileConfig &config) {
  if (!config.moe.enabled())
    return;
  row(os, "  of which MoE rows saved", e.savedMoeRowBytes,
      llvm::formatv("{0} (permuted rows, experts' terms of {1:F0} MoE "
                    "layer{2})",
                    formatBytes(t.moeRows), t.moeLayers,
                    t.moeLayers == 1 ? "" : "s")
          .str());
  if (config.moe.expertModelParallelSize == 1)
    return;
  row(os, llvm::formatv("  all-to-all results ({0})", e.allToAlls).str(),
      e.allToAllBytes,
      llvm::formatv("a micro-batch, largest {0}; Megatron-LM's dispatcher {1} "
                    "(4 x 2 k s b h a layer)",
                    formatBytes(double(e.largestAllToAllBytes)),
                    formatBytes(t.moeLayers * t.allToAllPerMoeLayer))
          .str());
}

/// The rows from the side buffers to the total.
static void printTotals(llvm::raw_ostream &os, const MemoryEstimate &e,
                        const TheoreticalMemory &t) {
  row(os, "  of which side buffers at the peak", e.peakSideBufferBytes,
      "saved kernel state, scratch, cuBLASLt's workspace");
  row(os, "total", e.totalBytes(),
      formatBytes(t.weightsAndOptimizer + t.activations));
  row(os, "  with the CUDA context", e.totalBytes() + kMeasuredCudaContextBytes,
      formatBytes(double(kMeasuredCudaContextBytes)) +
          " measured on the H200: nvidia-smi's figure");
}

/// The line that names the formula's per-layer terms.
static void printLayerTerms(llvm::raw_ostream &os, const CompileConfig &config,
                            const mt::RecomputePolicy &policy) {
  os << "Megatron-LM's activations per layer and micro-batch (Korthikanti et "
        "al. 2022, 16-bit, "
     << (config.parallel.sequenceParallel ||
                 config.parallel.tensorModelParallelSize == 1
             ? "over tp"
             : "Q, K, V, projection input, MLP inner terms and attention "
               "core over tp")
     << "): " << describeLayerTerms(layerTerms(config.model));
  if (policy.granularity == mt::RecomputeGranularity::None)
    os << llvm::formatv(" + {0} a s^2 b (attention core)",
                        attentionScoreTerm(config.model));
  else if (policy.granularity == mt::RecomputeGranularity::Selective)
    os << "; the attention core's a s^2 b terms are recomputed";
  if (config.moe.enabled())
    os << "; an MoE layer's (derived here: Megatron-LM's formula has none) "
       << describeLayerTerms(moeLayerTerms(config));
  os << "\n";
}

/// `--report memory` of a pipeline module: a table per pipeline rank.
static void printPipelineMemoryReport(ModuleOp module,
                                      const CompileConfig &config,
                                      const mt::RecomputePolicy &policy,
                                      const PipelinePlan &plan,
                                      llvm::raw_ostream &os) {
  const ParallelConfig &p = config.parallel;
  const PipelineSchedule &schedule = plan.schedule;
  const int64_t v = schedule.virtualSize;
  os << "memory per pipeline rank: " << config.model.name << ", recompute "
     << policy.str() << " (layers counted per stage), " << p.worldSize()
     << " rank(s) (tp " << p.tensorModelParallelSize << ", pp "
     << p.pipelineModelParallelSize << ", dp " << p.dataParallelSize
     << contextText(p) << expertText(config) << "), micro-batch "
     << config.batch.microBatchSize << ", sequence " << config.model.seqLength
     << sequenceShareText(config) << ", precision " << precisionName(config)
     << ", schedule " << scheduleKindName(schedule.kind) << " over "
     << schedule.microBatches << " micro-batches"
     << (v > 1 ? llvm::formatv(", {0} virtual stages per rank", v).str()
               : std::string())
     << "\n";
  printLayerTerms(os, config, policy);
  os << "a rank's stage functions (forward, backward, eval) run one at a "
        "time in one arena, the largest of theirs; a micro-batch's stash "
        "(what the backward pass reads of the forward's values) is held "
        "from its forward to its backward\n";
  const int64_t lastStage = schedule.numStages() - 1;
  for (int64_t r = 0; r < schedule.pipelineSize; ++r) {
    MemoryEstimate e = estimateMemory(module, config, &plan, r);
    RankShare share;
    share.layers = 0;
    share.chunks = double(v);
    share.first = share.last = false;
    std::string stages;
    for (int64_t k : e.stages) {
      const PipelineStage &stage = plan.layout.stages[k];
      share.layers += double(stage.numLayers);
      for (int64_t layer = stage.firstLayer;
           layer < stage.firstLayer + stage.numLayers; ++layer)
        share.moeLayers += config.moe.isMoeLayer(layer) ? 1 : 0;
      share.first |= k == 0;
      share.last |= k == lastStage;
      stages += llvm::formatv("{0}{1} (layers {2}-{3})",
                              stages.empty() ? "" : ", ", k, stage.firstLayer,
                              stage.firstLayer + stage.numLayers - 1)
                    .str();
    }
    share.inFlight =
        double(megatronForwardsInFlight(schedule.kind, schedule.pipelineSize,
                                        v, schedule.microBatches, r)) /
        double(v);
    TheoreticalMemory t = theoreticalMemory(config, policy, share);
    os << llvm::formatv("\npipeline rank {0}: stage{1} {2}; at most {3} "
                        "stage forward pass{4} in flight (Megatron-LM's "
                        "count: {5:F2} micro-batches x {6} stage{7})\n",
                        r, e.stages.size() > 1 ? "s" : "", stages,
                        e.microBatchesInFlight,
                        e.microBatchesInFlight == 1 ? "" : "es", t.inFlight,
                        v, v > 1 ? "s" : "");
    printWeights(os, e, t, config);
    row(os, "arena (shared by its stages)", e.arenaBytes,
        "the largest of its stage functions'");
    row(os, "stash (most held at once)", e.stashBytes,
        llvm::formatv("{0} stage forward pass{1}' stash at most",
                      e.microBatchesInFlight,
                      e.microBatchesInFlight == 1 ? "" : "es")
            .str());
    row(os, "activations (arena + stash)", e.activationBytes,
        llvm::formatv("{0} (16-bit; layers x {1:F2} micro-batches in "
                      "flight)",
                      formatBytes(t.activations), t.inFlight)
            .str());
    printMoeActivations(os, e, t, config);
    printTotals(os, e, t);
    os << "stashed per micro-batch, by layer:\n";
    for (int64_t k : e.stages) {
      const PipelineStage &stage = plan.layout.stages[k];
      for (int64_t layer = stage.firstLayer;
           layer < stage.firstLayer + stage.numLayers; ++layer)
        row(os, llvm::formatv("layer {0}", layer).str(),
            e.savedBytesByLayer[layer],
            layer == plan.layout.stages[e.stages.front()].firstLayer
                ? perLayerText(t, config.moe.isMoeLayer(layer))
                : "");
    }
    row(os, "stage inputs, embeddings, output layer", e.savedOtherBytes);
    os << llvm::formatv("recomputed: {0} ops, {1:F2} GFLOP per micro-batch; "
                        "{2} instructions, {3} results computed in place\n",
                        e.recomputedOps, e.recomputedFlops / 1e9,
                        e.numInstructions, e.inPlaceResults);
  }
}

void megatron::printMemoryReport(ModuleOp module, const CompileConfig &config,
                                 const mt::RecomputePolicy &policy,
                                 llvm::raw_ostream &os,
                                 const PipelinePlan *plan) {
  if (plan)
    return printPipelineMemoryReport(module, config, policy, *plan, os);
  MemoryEstimate e = estimateMemory(module, config);
  RankShare share;
  share.layers = double(config.model.numLayers);
  for (int64_t layer = 0; layer < config.model.numLayers; ++layer)
    share.moeLayers += config.moe.isMoeLayer(layer) ? 1 : 0;
  TheoreticalMemory t = theoreticalMemory(config, policy, share);
  const ParallelConfig &p = config.parallel;

  os << "memory per rank: " << config.model.name << ", recompute "
     << policy.str() << ", " << p.worldSize() << " rank(s) (tp "
     << p.tensorModelParallelSize << ", pp " << p.pipelineModelParallelSize
     << ", dp " << p.dataParallelSize << contextText(p) << expertText(config)
     << (p.useDistributedOptimizer ? ", distributed optimizer" : "")
     << "), micro-batch " << config.batch.microBatchSize << ", sequence "
     << config.model.seqLength << sequenceShareText(config) << ", precision "
     << precisionName(config) << "\n";
  printLayerTerms(os, config, policy);
  printWeights(os, e, t, config);
  row(os, "activations (train_step arena peak)", e.activationBytes,
      formatBytes(t.activations) + " (16-bit activations)");
  printMoeActivations(os, e, t, config);
  printTotals(os, e, t);
  row(os, "eval_step arena (when evaluating)", e.evalArenaBytes,
      e.evalArenaBytes > e.activationBytes
          ? "shares train_step's, which it makes larger"
          : "within train_step's (one arena for both)");

  os << "saved for the backward pass, by layer (live when the loss is "
        "computed):\n";
  for (auto [layer, bytes] : llvm::enumerate(e.savedBytesByLayer))
    row(os, llvm::formatv("layer {0}", layer).str(), bytes,
        layer == 0 ||
                (config.moe.isMoeLayer(int64_t(layer)) &&
                 !config.moe.isMoeLayer(0) && layer == firstMoeLayer(config))
            ? perLayerText(t, config.moe.isMoeLayer(int64_t(layer)))
            : "");
  row(os, "embeddings and output layer", e.savedOtherBytes);
  os << llvm::formatv("recomputed: {0} ops, {1:F2} GFLOP per micro-batch; "
                      "the arena peaks at instruction {2} of {3}; {4} "
                      "results computed in place\n",
                      e.recomputedOps, e.recomputedFlops / 1e9,
                      e.peakInstruction, e.numInstructions, e.inPlaceResults);
}
