//===- Search.cpp - Every layout, predicted, the fastest compiled whole ---===//
//
// Enumerates the layouts of the cluster's GPUs that the compiler accepts,
// predicts each one's step from its layers' profile (LayerProfile.cpp), the
// links and the pipeline schedule's simulation, drops those whose predicted
// memory is over the GPU's, and compiles the fastest whole, in order, until
// `top` of them fit by the bundle's own memory plan.
//
//===----------------------------------------------------------------------===//

#include "PlannerInternal.h"

#include "megatron/Frontend/ModelBuilder.h"
#include "megatron/Memory/Memory.h"
#include "mt/IR/MtOps.h"

#include "llvm/ADT/StringMap.h"
#include "llvm/Support/FormatVariadic.h"
#include "llvm/Support/Parallel.h"
#include "llvm/Support/ThreadPool.h"
#include "llvm/Support/Threading.h"

#include <algorithm>
#include <map>
#include <optional>
#include <set>
#include <tuple>

using namespace mlir;
using namespace megatron;
using namespace megatron::planner;

namespace {

/// The profile's key: what changes a layer's program, and the micro-batch
/// compiled (1 or 2; larger ones are extrapolated from those).
using ProfileKey =
    std::tuple<int64_t, bool, bool, int64_t, int64_t, int, int64_t>;

ProfileKey profileKey(const Layout &l, int64_t microBatch) {
  return {l.tp,
          l.sequenceParallel,
          l.tpCommOverlap,
          l.cp,
          l.ep,
          static_cast<int>(l.recompute),
          microBatch};
}

std::vector<int64_t> divisorsOf(int64_t n) {
  std::vector<int64_t> out;
  for (int64_t d = 1; d <= n; ++d)
    if (n % d == 0)
      out.push_back(d);
  return out;
}

std::vector<int64_t> powersOfTwoUpTo(int64_t n) {
  std::vector<int64_t> out;
  for (int64_t d = 1; d <= n; d *= 2)
    out.push_back(d);
  return out;
}

/// A link's time for `bytes` moved `factor` times over it.
double linkSeconds(const mt::LinkCost &link, double bytes, double factor) {
  return (link.latencyUs + factor * bytes / link.bytesPerUs) * 1e-6;
}

class Planner {
public:
  Planner(MLIRContext &context, const CompileConfig &base,
          const ClusterSpec &cluster, const mt::CostModel &costModel,
          const PlannerOptions &options)
      : context(context), base(base), cluster(cluster),
        costModel(clusterCostModel(costModel, cluster)),
        rawCostModel(costModel), options(options) {}

  llvm::Expected<PlanResult> run();
  llvm::Expected<Prediction> predictOne(const Layout &layout);

private:
  llvm::Error prepare();
  std::vector<Layout> enumerate() const;
  std::optional<StepProfile> profile(const Layout &layout);
  const StepProfile *compiledProfile(const Layout &layout, int64_t microBatch);
  /// Compiles the profiles `layouts` need on every core, each worker in an
  /// MLIRContext of its own; compiledProfile then finds them.
  void compileProfiles(const std::vector<Layout> &layouts);
  std::optional<Prediction> predict(const Layout &layout,
                                    const StepProfile &profile) const;
  int64_t predictMemory(const Layout &layout, const StepProfile &profile,
                        int64_t layers) const;
  /// The fullest rank's bytes by the whole model's compile; -1 when it
  /// does not compile (the reason in `error`).
  int64_t exactMemory(const Layout &layout, std::string &error);
  void refuse(const std::string &reason);

  MLIRContext &context;
  const CompileConfig &base;
  const ClusterSpec &cluster;
  mt::CostModel costModel;
  const mt::CostModel &rawCostModel;
  PlannerOptions options;
  PlanResult result;
  int64_t period = 1;
  std::map<ProfileKey, std::optional<StepProfile>> profiles;
  /// compileProfiles' failures, refused where the search first meets them
  /// (so that the report is the same as compiling them one by one).
  std::map<ProfileKey, std::string> profileErrors;
  llvm::StringMap<bool> refusalSeen;
  /// DESIGN.md's MFU numerator: 6 N + 12 L h s FLOPs a token, N the
  /// parameters without the position embeddings (the active ones of a
  /// mixture of experts).
  double flopsPerToken = 0;
};

} // namespace

void Planner::refuse(const std::string &reason) {
  ++result.refused;
  // Group refusals by their message's first words (the key they name).
  llvm::StringRef text(reason);
  llvm::StringRef head = text.take_until([](char c) { return c == ':'; });
  if (head.size() == text.size())
    head = text.take_front(60);
  if (!refusalSeen.insert({head, true}).second)
    return;
  result.refusals.push_back(reason);
}

std::vector<Layout> Planner::enumerate() const {
  const ModelConfig &m = base.model;
  int64_t n = cluster.numGpus;
  int64_t global = base.batch.globalBatchSize;
  std::vector<Layout> out;
  std::vector<RecomputeGranularity> policies = {RecomputeGranularity::None,
                                                RecomputeGranularity::Selective,
                                                RecomputeGranularity::Full};
  int64_t groups = m.numLayers / period;
  for (int64_t tp : powersOfTwoUpTo(std::min(n, cluster.gpusPerNode))) {
    // Without sequence parallelism; with it; with it and --tp-comm-overlap.
    for (auto [sp, overlap] : {std::pair(false, false), std::pair(true, false),
                               std::pair(true, true)}) {
      if (sp && tp == 1)
        continue;
      // Context parallelism for long sequences: chunks of 2 cp pieces of
      // at least 128 tokens each.
      for (int64_t cp : powersOfTwoUpTo(
               std::min(n / tp, std::max<int64_t>(1, m.seqLength / 256)))) {
        for (int64_t pp : divisorsOf(groups)) {
          if (n % (tp * cp * pp) != 0)
            continue;
          int64_t dp = n / (tp * cp * pp);
          std::vector<int64_t> eps = {1};
          if (base.moe.enabled())
            eps = divisorsOf(base.moe.numExperts);
          for (int64_t ep : eps) {
            if ((dp * cp) % ep != 0)
              continue;
            std::vector<int64_t> vps = {1};
            if (pp > 1)
              for (int64_t v = 2; v <= 8; ++v)
                if (groups % (pp * v) == 0)
                  vps.push_back(v);
            for (int64_t vp : vps) {
              for (int64_t mb : powersOfTwoUpTo(global / dp)) {
                if (global % (mb * dp) != 0)
                  continue;
                int64_t micro = global / (mb * dp);
                if (vp > 1 && micro % pp != 0)
                  continue;
                for (bool distributed : {false, true}) {
                  if (distributed && dp == 1)
                    continue;
                  for (RecomputeGranularity policy : policies) {
                    Layout l;
                    l.tp = tp;
                    l.sequenceParallel = sp;
                    l.tpCommOverlap = overlap;
                    l.cp = cp;
                    l.pp = pp;
                    l.vp = vp;
                    l.dp = dp;
                    l.ep = ep;
                    l.microBatch = mb;
                    l.distributedOptimizer = distributed;
                    l.recompute = policy;
                    out.push_back(l);
                  }
                }
              }
            }
          }
        }
      }
    }
  }
  return out;
}

void Planner::compileProfiles(const std::vector<Layout> &layouts) {
  std::vector<std::pair<ProfileKey, Layout>> needed;
  std::set<ProfileKey> seen;
  for (const Layout &layout : layouts) {
    CompileConfig config = base;
    layout.applyTo(config);
    if (llvm::Error invalid = validateCompileConfig(config)) {
      llvm::consumeError(std::move(invalid));
      continue;
    }
    for (int64_t microBatch : profiledMicroBatches(layout)) {
      ProfileKey key = profileKey(layout, microBatch);
      if (profiles.count(key) || !seen.insert(key).second)
        continue;
      Layout compiled = layout;
      compiled.microBatch = microBatch;
      needed.emplace_back(key, compiled);
    }
  }
  std::vector<std::optional<StepProfile>> compiled(needed.size());
  std::vector<std::string> errors(needed.size());
  llvm::DefaultThreadPool pool(llvm::hardware_concurrency());
  unsigned workers = pool.getMaxConcurrency();
  const DialectRegistry &registry = context.getDialectRegistry();
  for (unsigned worker = 0; worker < workers; ++worker)
    pool.async([&, worker] {
      MLIRContext local(registry, MLIRContext::Threading::DISABLED);
      for (size_t i = worker; i < needed.size(); i += workers) {
        StepProfile p;
        if (profileLayers(local, base, options.compile, needed[i].second,
                          period, rawCostModel, cluster, p, errors[i]))
          compiled[i] = p;
      }
    });
  pool.wait();
  for (size_t i = 0; i < needed.size(); ++i) {
    profiles[needed[i].first] = compiled[i];
    if (!compiled[i])
      profileErrors[needed[i].first] = errors[i];
  }
  result.layerCompiles += 2 * static_cast<int64_t>(needed.size());
}

const StepProfile *Planner::compiledProfile(const Layout &layout,
                                            int64_t microBatch) {
  ProfileKey key = profileKey(layout, microBatch);
  if (auto error = profileErrors.find(key); error != profileErrors.end()) {
    refuse(error->second);
    profileErrors.erase(error);
  }
  auto [it, inserted] = profiles.try_emplace(key);
  if (inserted) {
    Layout compiled = layout;
    compiled.microBatch = microBatch;
    StepProfile p;
    std::string error;
    result.layerCompiles += 2;
    if (profileLayers(context, base, options.compile, compiled, period,
                      rawCostModel, cluster, p, error))
      it->second = p;
    else
      refuse(error);
  }
  return it->second ? &*it->second : nullptr;
}

std::optional<StepProfile> Planner::profile(const Layout &layout) {
  std::vector<int64_t> points = profiledMicroBatches(layout);
  const StepProfile *one = compiledProfile(layout, points.front());
  if (!one || points.size() == 1)
    return one ? std::optional<StepProfile>(*one) : std::nullopt;
  const StepProfile *two = compiledProfile(layout, points.back());
  if (!two)
    return std::nullopt;
  return profileForMicroBatch(*one, *two, points.front(), layout.microBatch);
}

int64_t Planner::predictMemory(const Layout &l, const StepProfile &p,
                               int64_t layers) const {
  // Pipeline rank 0: its layers, the embeddings (and, under tied weights or
  // one stage, the output layer: the profile's rest is counted whole), and
  // the stash of the forward passes its schedule keeps in flight.
  int64_t micro = base.batch.globalBatchSize / (l.microBatch * l.dp);
  int64_t perChunk = layers / l.vp;
  int64_t optimizer = p.layerOptimizerBytes * layers + p.otherOptimizerBytes;
  int64_t state = p.layerStateBytes * layers + p.otherStateBytes;
  if (l.distributedOptimizer)
    state -= optimizer - optimizer / l.dp;
  int64_t arena = p.arenaOneLayer + p.arenaPerLayer * (perChunk - 1);
  if (l.pp > 1) {
    ScheduleKind kind =
        l.vp > 1 ? ScheduleKind::Interleaved : ScheduleKind::OneFOneB;
    int64_t inFlight = megatronForwardsInFlight(kind, l.pp, l.vp, micro, 0);
    arena += (inFlight - 1) * perChunk * p.stashPerLayer;
  }
  return state + arena + kMeasuredCudaContextBytes;
}

std::optional<Prediction> Planner::predict(const Layout &l,
                                           const StepProfile &p) const {
  Prediction out;
  out.layout = l;
  int64_t groups = base.model.numLayers / period;
  int64_t micro = base.batch.globalBatchSize / (l.microBatch * l.dp);
  int64_t stages = l.pp * l.vp;
  int64_t perStage = groups / stages;
  // A pipeline stage's send of its activation (bf16 under bf16, sequence
  // split over tp under sequence parallelism), forward and backward.
  double sendSeconds = 0;
  if (l.pp > 1) {
    double elementBytes = base.precision == Precision::FP32 ? 4.0 : 2.0;
    double bytes = double(l.microBatch) * base.model.seqLength / l.cp *
                   base.model.hiddenSize * elementBytes /
                   (l.sequenceParallel ? l.tp : 1);
    bool crossesNodes = l.tp * l.cp * l.dp * 2 > cluster.gpusPerNode;
    sendSeconds = linkSeconds(
        crossesNodes ? cluster.interNode : cluster.intraNode, bytes, 1.0);
  }
  // Per virtual stage: its kernels and in-line communication for one
  // micro-batch, forward and backward (the simulation's forward is a third).
  std::vector<double> stageCompute(stages), stageCommunication(stages);
  for (int64_t s = 0; s < stages; ++s) {
    double compute = perStage * p.layerCompute;
    double comm = perStage * p.layerCommunication + 3 * sendSeconds * 1e6;
    if (s == 0)
      compute += p.firstCompute;
    if (s == stages - 1) {
      compute += p.lastCompute;
      comm += p.otherCommunication;
    }
    stageCompute[s] = compute * 1e-6;
    stageCommunication[s] = comm * 1e-6;
  }
  double busiestCompute = 0, busiestComm = 0, makespan = 0;
  for (int64_t r = 0; r < l.pp; ++r) {
    double compute = 0, comm = 0;
    for (int64_t s = r; s < stages; s += l.pp) {
      compute += stageCompute[s];
      comm += stageCommunication[s];
    }
    if (compute + comm > busiestCompute + busiestComm) {
      busiestCompute = compute;
      busiestComm = comm;
    }
  }
  busiestCompute *= micro;
  busiestComm *= micro;
  if (l.pp > 1) {
    ScheduleKind kind =
        l.vp > 1 ? ScheduleKind::Interleaved : ScheduleKind::OneFOneB;
    llvm::Expected<PipelineSchedule> schedule =
        buildPipelineSchedule(kind, l.pp, l.vp, micro);
    if (!schedule) {
      llvm::consumeError(schedule.takeError());
      return std::nullopt;
    }
    std::vector<double> forward(stages);
    for (int64_t s = 0; s < stages; ++s)
      forward[s] = (stageCompute[s] + stageCommunication[s]) / 3.0;
    makespan = simulatePipelineSchedule(*schedule, forward).makespan;
  } else {
    makespan = busiestCompute + busiestComm;
  }
  out.compute = busiestCompute;
  out.layerCommunication = busiestComm;
  out.bubble = std::max(0.0, makespan - busiestCompute - busiestComm);

  // Pipeline rank 0's parameters (the most: the embeddings and its layers).
  int64_t layersOfRank = perStage * l.vp * period;
  double parameters =
      double(p.layerParameters) * perStage * l.vp + p.otherParameters;
  if (l.dp > 1) {
    // Data-parallel groups stride over tp x cp ranks; they leave the node
    // when they span more of it.
    bool crossesNodes = l.tp * l.cp * l.dp > cluster.gpusPerNode;
    const mt::LinkCost &link =
        crossesNodes ? cluster.interNode : cluster.intraNode;
    double n = double(l.dp), gradientBytes = 4.0 * parameters;
    double reduce = 0, gather = 0;
    if (l.distributedOptimizer) {
      reduce = linkSeconds(link, gradientBytes, (n - 1) / n);
      gather = linkSeconds(link, gradientBytes, (n - 1) / n);
    } else {
      reduce = linkSeconds(link, gradientBytes, 2 * (n - 1) / n);
    }
    // --overlap-grad-reduce: the buckets reduce during the last
    // micro-batch's backward pass, except the last bucket; with the
    // distributed optimizer, --overlap-param-gather gathers them during the
    // next step's first forward pass, except the first bucket it reads.
    // Both give the bits of the step without them (docs/Parallelism.md),
    // so the layouts take them whenever data parallelism does.
    double microStep = (busiestCompute + busiestComm) / micro;
    double bucketShare = std::min(1.0, double(base.parallel.bucketElements()) /
                                           std::max(1.0, parameters));
    out.exposedDataParallel =
        std::max(reduce * bucketShare, reduce - 2.0 / 3.0 * microStep) +
        std::max(gather * bucketShare, gather - 1.0 / 3.0 * microStep);
  }
  // AdamW reads and writes each owned parameter's weight, gradient and two
  // moments (and writes its bf16 copy): about 30 bytes.
  double owned = l.distributedOptimizer ? parameters / l.dp : parameters;
  out.optimizer = 30.0 * owned / costModel.memoryBytesPerUs * 1e-6;
  out.step = makespan + out.exposedDataParallel + out.optimizer;
  double tokens = double(base.batch.globalBatchSize) * base.model.seqLength;
  out.mfu = flopsPerToken * tokens /
            (out.step * cluster.peakTflops * 1e12 * cluster.numGpus);
  out.memoryBytes = predictMemory(l, p, layersOfRank / period);
  return out;
}

int64_t Planner::exactMemory(const Layout &layout, std::string &error) {
  CompileConfig config = base;
  layout.applyTo(config);
  CompiledModel compiled;
  ++result.wholeCompiles;
  if (!compileModel(context, config, options.compile, compiled, error))
    return -1;
  int64_t fullest = 0;
  if (compiled.pipelined) {
    for (int64_t r = 0; r < compiled.plan.schedule.pipelineSize; ++r)
      fullest = std::max(
          fullest, estimateMemory(*compiled.module, config, &compiled.plan, r)
                       .totalBytes());
  } else {
    fullest = estimateMemory(*compiled.module, config).totalBytes();
  }
  return fullest + kMeasuredCudaContextBytes;
}

llvm::Error Planner::prepare() {
  const ModelConfig &m = base.model;
  if (base.batch.globalBatchSize <= 0)
    return llvm::createStringError(
        "--auto-parallel plans within the global batch: give "
        "--global-batch-size (or global_batch_size in the model file)");
  if (base.moe.enabled()) {
    if (!base.moe.layerPattern.empty())
      return llvm::createStringError(
          "--auto-parallel does not plan a moe_layer_freq list yet (its "
          "layers differ one by one); give moe_layer_freq as a number");
    period = std::max<int64_t>(1, base.moe.layerFreq);
    if (m.numLayers % period != 0)
      return llvm::createStringError(
          llvm::formatv("--auto-parallel: num_layers {0} is not a multiple of "
                        "moe_layer_freq {1}",
                        m.numLayers, period));
  }
  {
    // The model's FLOPs a token, from its parameters at one rank.
    CompileConfig whole = base;
    Layout{}.applyTo(whole);
    OwningOpRef<ModuleOp> module = buildModelModule(context, whole);
    double parameters = 0, experts = 0;
    for (mt::ParameterOp parameter : module->getOps<mt::ParameterOp>()) {
      double count = double(parameter.getTensorType().getNumElements());
      llvm::StringRef name = parameter.getSymName();
      if (name.contains("wpe") || name.contains("position_embeddings"))
        continue;
      parameters += count;
      if (name.contains(".mlp.experts."))
        experts += count;
    }
    if (base.moe.enabled())
      parameters -= experts / base.moe.numExperts *
                    (base.moe.numExperts - base.moe.routerTopk);
    flopsPerToken =
        6.0 * parameters + 12.0 * m.numLayers * m.hiddenSize * m.seqLength;
  }
  return llvm::Error::success();
}

llvm::Expected<Prediction> Planner::predictOne(const Layout &layout) {
  if (llvm::Error error = prepare())
    return std::move(error);
  CompileConfig config = base;
  layout.applyTo(config);
  if (llvm::Error invalid = validateCompileConfig(config))
    return std::move(invalid);
  std::string error;
  std::optional<StepProfile> p = profile(layout);
  if (!p)
    return llvm::createStringError(
        "--report step: the layout's layers do not compile: " +
        (result.refusals.empty() ? std::string("?") : result.refusals.front()));
  std::optional<Prediction> prediction = predict(layout, *p);
  if (!prediction)
    return llvm::createStringError(
        "--report step: the pipeline schedule does not apply");
  int64_t bytes = exactMemory(layout, error);
  if (bytes < 0)
    return llvm::createStringError("--report step: " + error);
  prediction->memoryBytes = bytes;
  prediction->memoryExact = true;
  return *prediction;
}

llvm::Expected<PlanResult> Planner::run() {
  if (llvm::Error error = prepare())
    return std::move(error);
  std::vector<Layout> layouts = enumerate();
  result.layouts = static_cast<int64_t>(layouts.size());
  compileProfiles(layouts);
  std::vector<Prediction> predicted;
  std::map<std::string, FamilyVerdict> families;
  auto family = [&](const Layout &l) -> FamilyVerdict & {
    FamilyVerdict &f = families[l.family()];
    f.family = l.family();
    return f;
  };
  // The least memory each family reached, for its verdict.
  std::map<std::string, Prediction> leastMemory;
  // The refusals in the layouts' order; then every prediction (a schedule
  // simulation each, most of the search's time) on every core.
  std::vector<std::optional<StepProfile>> layoutProfiles(layouts.size());
  for (auto [index, layout] : llvm::enumerate(layouts)) {
    CompileConfig config = base;
    layout.applyTo(config);
    if (llvm::Error invalid = validateCompileConfig(config)) {
      refuse(llvm::toString(std::move(invalid)));
      continue;
    }
    layoutProfiles[index] = profile(layout);
  }
  std::vector<std::optional<Prediction>> predictions(layouts.size());
  llvm::parallelFor(0, layouts.size(), [&](size_t index) {
    if (layoutProfiles[index])
      predictions[index] = predict(layouts[index], *layoutProfiles[index]);
  });
  for (auto [index, layout] : llvm::enumerate(layouts)) {
    std::optional<Prediction> &prediction = predictions[index];
    if (!prediction)
      continue;
    family(layout);
    auto least = leastMemory.find(layout.family());
    if (least == leastMemory.end() ||
        prediction->memoryBytes < least->second.memoryBytes)
      leastMemory[layout.family()] = *prediction;
    if (prediction->memoryBytes > cluster.memoryBytes) {
      ++result.overMemory;
      continue;
    }
    predicted.push_back(*prediction);
  }
  llvm::stable_sort(predicted, [](const Prediction &a, const Prediction &b) {
    return a.step < b.step;
  });

  // The fastest, compiled whole until `top` fit.
  for (Prediction &candidate : predicted) {
    if (static_cast<int64_t>(result.best.size()) >= options.top ||
        result.wholeCompiles >= options.maxWholeCompiles)
      break;
    std::string error;
    int64_t bytes = exactMemory(candidate.layout, error);
    if (bytes < 0) {
      refuse(error);
      candidate.memoryBytes = -1;
      continue;
    }
    candidate.memoryBytes = bytes;
    candidate.memoryExact = true;
    if (bytes > cluster.memoryBytes) {
      ++result.overMemory;
      continue;
    }
    result.best.push_back(candidate);
  }
  if (result.best.empty()) {
    const Prediction *least = nullptr;
    for (auto &[name, prediction] : leastMemory)
      if (!least || prediction.memoryBytes < least->memoryBytes)
        least = &prediction;
    if (!least)
      return llvm::createStringError(llvm::formatv(
          "--auto-parallel: the compiler accepts none of the {0} layouts of "
          "{1} GPUs for this model; the first refusal: {2}",
          result.layouts, cluster.numGpus,
          result.refusals.empty() ? std::string("none")
                                  : result.refusals.front()));
    return llvm::createStringError(llvm::formatv(
        "--auto-parallel: no layout of {0} GPUs fits {1} a GPU; the least "
        "memory predicted is {2} ({3}); give more GPUs (--num-gpus) or a "
        "smaller global batch",
        cluster.numGpus, formatBytes(double(cluster.memoryBytes)),
        formatBytes(double(least->memoryBytes)), least->layout.flags()));
  }

  // Each family's verdict against the pick: its fastest layout that fit
  // (predicted, or compiled whole when it was among the fastest).
  const Prediction &pick = result.best.front();
  for (const Prediction &candidate : predicted)
    if (candidate.memoryBytes >= 0 &&
        candidate.memoryBytes <= cluster.memoryBytes) {
      FamilyVerdict &f = family(candidate.layout);
      if (!f.fits || candidate.step < f.best.step) {
        f.fits = true;
        f.best = candidate;
      }
    }
  for (auto &[name, verdict] : families) {
    if (name == pick.layout.family())
      continue;
    if (!verdict.fits) {
      verdict.best = leastMemory[name];
      verdict.reason = "memory";
      verdict.detail =
          llvm::formatv("its least memory is {0} a GPU ({1}), over {2}",
                        formatBytes(double(verdict.best.memoryBytes)),
                        verdict.best.layout.flags(),
                        formatBytes(double(cluster.memoryBytes)));
    } else {
      const Prediction &b = verdict.best;
      double bubble = b.bubble - pick.bubble;
      double comm = (b.layerCommunication + b.exposedDataParallel) -
                    (pick.layerCommunication + pick.exposedDataParallel);
      double compute =
          (b.compute + b.optimizer) - (pick.compute + pick.optimizer);
      verdict.reason = bubble >= comm && bubble >= compute ? "bubble"
                       : comm >= compute                   ? "communication"
                                                           : "computation";
      verdict.detail = llvm::formatv(
          "{0:F1} ms slower: bubble {1:+F1} ms, communication {2:+F1} ms, "
          "computation {3:+F1} ms",
          (b.step - pick.step) * 1e3, bubble * 1e3, comm * 1e3, compute * 1e3);
    }
    result.families.push_back(verdict);
  }
  llvm::stable_sort(result.families,
                    [](const FamilyVerdict &a, const FamilyVerdict &b) {
                      if (a.fits != b.fits)
                        return a.fits;
                      return a.fits ? a.best.step < b.best.step
                                    : a.best.memoryBytes < b.best.memoryBytes;
                    });
  return std::move(result);
}

llvm::Expected<PlanResult> megatron::planLayouts(
    MLIRContext &context, const CompileConfig &base, const ClusterSpec &cluster,
    const mt::CostModel &costModel, const PlannerOptions &options) {
  if (llvm::Error invalid = cluster.validate())
    return std::move(invalid);
  Planner planner(context, base, cluster, costModel, options);
  return planner.run();
}

llvm::Expected<Prediction>
megatron::predictLayout(MLIRContext &context, const CompileConfig &config,
                        const ClusterSpec &cluster,
                        const mt::CostModel &costModel,
                        const CompileFlags &flags) {
  const ParallelConfig &p = config.parallel;
  if (config.recompute.granularity == RecomputeGranularity::Full &&
      (config.recompute.method != "uniform" || config.recompute.numLayers != 1))
    return llvm::createStringError(
        "--report step models full recomputation of every layer alone "
        "(recompute_method uniform, recompute_num_layers 1), not "
        "recompute_method " +
        config.recompute.method);
  if (p.decoderFirstPipelineNumLayers || p.decoderLastPipelineNumLayers ||
      p.numLayersPerVirtualPipelineStage)
    return llvm::createStringError(
        "--report step models even pipeline stages: remove "
        "decoder_first/last_pipeline_num_layers and "
        "num_layers_per_virtual_pipeline_stage");
  Layout layout;
  layout.tp = p.tensorModelParallelSize;
  layout.sequenceParallel = p.sequenceParallel;
  layout.tpCommOverlap = p.tpCommOverlap;
  layout.pp = p.pipelineModelParallelSize;
  layout.vp = std::max<int64_t>(1, p.virtualPipelineModelParallelSize);
  layout.cp = p.contextParallelSize;
  layout.dp = p.dataParallelSize;
  layout.ep = config.moe.expertModelParallelSize;
  layout.distributedOptimizer = p.useDistributedOptimizer;
  layout.recompute = config.recompute.granularity;
  layout.microBatch = config.batch.microBatchSize;
  ClusterSpec sized = cluster;
  sized.numGpus = p.worldSize();
  if (llvm::Error invalid = sized.validate())
    return std::move(invalid);
  CompileConfig base = config;
  base.batch.globalBatchSize = config.globalBatchSize();
  PlannerOptions options;
  options.compile = flags;
  Planner planner(context, base, sized, costModel, options);
  return planner.predictOne(layout);
}
