//===- megatron-compile.cpp - Model file in, model-level IR and reports out ===//
//
// Thin: flags in, library calls out. Every key of the model file is also a
// flag with Megatron-LM's name (`--tensor-model-parallel-size 2`), which
// overrides the file.
//
//===----------------------------------------------------------------------===//

#include "megatron/Frontend/CompileConfig.h"
#include "megatron/Frontend/ModelBuilder.h"
#include "megatron/InitAll.h"
#include "megatron/Memory/Memory.h"
#include "megatron/Pipelines/PipelinePlan.h"
#include "megatron/Pipelines/Pipelines.h"
#include "megatron/Planner/Planner.h"
#include "megatron/Target/Bundle.h"
#include "mt/IR/MtOps.h"
#include "mt/Transforms/CostModel.h"
#include "mt/Transforms/Passes.h"

#include "mlir/IR/AsmState.h"
#include "mlir/IR/Diagnostics.h"
#include "mlir/IR/DialectRegistry.h"
#include "mlir/IR/MLIRContext.h"
#include "mlir/IR/Verifier.h"
#include "mlir/Pass/PassManager.h"
#include "mlir/Support/FileUtilities.h"
#include "mlir/Transforms/Passes.h"
#include "llvm/Support/Endian.h"
#include "llvm/Support/CommandLine.h"
#include "llvm/Support/FormatVariadic.h"
#include "llvm/Support/InitLLVM.h"
#include "llvm/Support/JSON.h"
#include "llvm/Support/MemoryBuffer.h"
#include "llvm/Support/ToolOutputFile.h"
#include "llvm/Support/WithColor.h"

#include <memory>
#include <vector>

using namespace llvm;
using namespace megatron;

static cl::OptionCategory compileCategory("megatron-compile options");
static cl::OptionCategory modelCategory(
    "Model-file keys (each overrides the file; see models/README.md)");

static cl::opt<std::string> inputPath(cl::Positional, cl::Required,
                                      cl::desc("<model.yaml | config.json>"),
                                      cl::cat(compileCategory));
static cl::opt<std::string> outputPath(
    "o",
    cl::desc("Output file: the training bundle (model.mtb), or where --emit "
             "and --report print (default: standard output)"),
    cl::value_desc("file"), cl::cat(compileCategory));

enum class EmitKind { None, Mlir, Plan };
static cl::opt<EmitKind> emit(
    "emit", cl::desc("Print a stage of the compilation instead of a bundle"),
    cl::values(clEnumValN(EmitKind::Mlir, "mlir",
                          "the model-level (mt) IR: parameters, train_step, "
                          "eval_step and predict_step, the model in the "
                          "module attribute mt.model, each layer's ops "
                          "tagged mt.layer (docs/PassPipelines.md); with "
                          "--stop-after, the IR at a pipeline boundary"),
               clEnumValN(EmitKind::Plan, "plan",
                          "the bundle's manifest (JSON): parameters and each "
                          "function's instruction stream")),
    cl::init(EmitKind::None), cl::cat(compileCategory));

enum class ReportKind {
  None,
  Params,
  Collectives,
  Memory,
  Schedule,
  Overlap,
  Step
};
static cl::opt<ReportKind> report(
    "report", cl::desc("Print a table about the compiled model"),
    cl::values(clEnumValN(ReportKind::Params, "params",
                          "parameters: names, global shapes, counts, init"),
               clEnumValN(ReportKind::Collectives, "collectives",
                          "each step's collectives per rank and their bytes, "
                          "next to Megatron-LM's predicted volumes"),
               clEnumValN(ReportKind::Memory, "memory",
                          "per rank: parameters, gradients, optimizer state, "
                          "activations (peak and by layer), workspace, next "
                          "to Megatron-LM's theoretical memory"),
               clEnumValN(ReportKind::Schedule, "schedule",
                          "the pipeline layout, each rank's timeline, the "
                          "predicted bubble and stashed activations"),
               clEnumValN(ReportKind::Overlap, "overlap",
                          "per rank and step: each collective's predicted "
                          "time, the part hidden behind computation and "
                          "behind what, and the exposed total (implies "
                          "--overlap-collectives)"),
               clEnumValN(ReportKind::Step, "step",
                          "the planner's predicted step for this layout: "
                          "kernels, collectives, bubble, data-parallel "
                          "exposure, optimizer, MFU and memory "
                          "(docs/Planner.md; cluster flags as "
                          "--auto-parallel's)")),
    cl::init(ReportKind::None), cl::cat(compileCategory));

static cl::opt<bool> overlapCollectives(
    "overlap-collectives",
    cl::desc("Split each collective into a start and a wait and place them "
             "by the cost model so that computation hides them "
             "(megatron-overlap-pipeline; default off; the runtime still "
             "runs each collective where it starts, docs/Parallelism.md)"),
    cl::init(false), cl::cat(compileCategory));
static cl::opt<std::string> costModelPath(
    "cost-model",
    cl::desc("The cost model (JSON) of --overlap-collectives and --report "
             "overlap (default: data/cost-model.json, built in)"),
    cl::value_desc("file"), cl::cat(compileCategory));

static cl::opt<bool> fuseKernels(
    "fuse-kernels",
    cl::desc("Group elementwise chains (dropout + residual add, ...) into "
             "generated CUDA kernels, compiled with nvrtc into the bundle "
             "for the cuda backend (mt-fuse-elementwise; the host runs the "
             "groups' ops one by one); compilations are kept in "
             "MEGATRON_KERNEL_CACHE (default ~/.cache/megatron/"
             "fused-kernels; 'off': none)"),
    cl::init(false), cl::cat(compileCategory));

static cl::opt<std::string> pipelineSchedule(
    "pipeline-schedule",
    cl::desc("Pipeline schedule: gpipe, 1f1b, or interleaved (default: "
             "interleaved with virtual stages, 1f1b otherwise)"),
    cl::value_desc("kind"), cl::cat(compileCategory));
static cl::opt<std::string> pipelineScheduleFile(
    "pipeline-schedule-file",
    cl::desc("A hand-written per-rank schedule (JSON, the bundle's "
             "pipeline.ranks form) to use instead of the generated one; it "
             "is verified like any other"),
    cl::value_desc("file"), cl::cat(compileCategory));
static cl::opt<std::string> scheduleSvg(
    "schedule-svg",
    cl::desc("With --report schedule: also draw the predicted timeline as "
             "an SVG picture into this file"),
    cl::value_desc("file"), cl::cat(compileCategory));

static cl::opt<std::string> memoryBudget(
    "memory-budget",
    cl::desc("Pick the least activation recomputation whose per-rank total "
             "fits this many bytes (suffixes KiB, MiB, GiB, TiB; KB, MB, GB, "
             "TB); replaces the model file's recompute_granularity"),
    cl::value_desc("bytes"), cl::cat(compileCategory));

static cl::opt<bool> fuseGemmEpilogues(
    "fuse-gemm-epilogues",
    cl::desc("Fuse bias gradients into the linear layers' weight-gradient "
             "GEMMs, and the GeLU's gradient and the first MLP layer's bias "
             "gradient into the second layer's data-gradient GEMM, and an "
             "add of a linear layer's result (a residual connection without "
             "dropout, summed data gradients) into its GEMM as cuBLASLt's C "
             "(mt-fuse-gemm-epilogues; default on; "
             "--fuse-gemm-epilogues=false keeps them separate ops)"),
    cl::init(true), cl::cat(compileCategory));

static cl::opt<bool> fuseLinearCrossEntropy(
    "fuse-linear-cross-entropy",
    cl::desc("Compute the output layer, its cross-entropy and their "
             "gradients in chunks of tokens, never holding the whole "
             "vocabulary's logits, nor under tensor parallelism a "
             "vocabulary block's (mt-fuse-linear-cross-entropy; off by "
             "default; both backends run it; docs/Memory.md)"),
    cl::init(false), cl::cat(compileCategory));
static cl::opt<int64_t> linearCrossEntropyChunkRows(
    "linear-cross-entropy-chunk-rows",
    cl::desc("With --fuse-linear-cross-entropy: tokens per chunk (default "
             "0: the fewest even chunks whose logits, bf16 under --bf16, "
             "fit in 1 GiB)"),
    cl::init(0), cl::cat(compileCategory));

static cl::OptionCategory
    planCategory("Automatic layout (--auto-parallel; docs/Planner.md)");
static cl::opt<bool> autoParallel(
    "auto-parallel",
    cl::desc("Choose the layout (tensor, pipeline and virtual stages, data, "
             "sequence, context and expert parallelism, the distributed "
             "optimizer, recomputation, micro-batch) for --num-gpus GPUs: "
             "prints the fastest layouts that fit, with their flags; with "
             "-o, writes the best one's bundle"),
    cl::init(false), cl::cat(planCategory));
static cl::opt<int64_t> numGpus("num-gpus",
                                cl::desc("GPUs to plan for (--auto-parallel)"),
                                cl::init(0), cl::cat(planCategory));
static cl::opt<std::string> clusterPath(
    "cluster",
    cl::desc("A cluster file (JSON: num_gpus, gpus_per_node, memory_per_gpu, "
             "peak_tflops, memory_bandwidth_GBps, intra_node and inter_node "
             "bus_bandwidth_GBps and latency_us); the flags below override "
             "it"),
    cl::value_desc("file"), cl::cat(planCategory));
static cl::opt<int64_t> gpusPerNode("gpus-per-node",
                                    cl::desc("GPUs a node (default 8)"),
                                    cl::init(0), cl::cat(planCategory));
static cl::opt<std::string>
    gpuMemory("gpu-memory",
              cl::desc("Memory a GPU (default 141GB, the H200's)"),
              cl::value_desc("bytes"), cl::cat(planCategory));
static cl::opt<double> peakTflops(
    "peak-tflops",
    cl::desc("Dense bf16 TFLOP/s a GPU (default 989, the H200's): the MFU's "
             "denominator; kernel times scale by it"),
    cl::init(0), cl::cat(planCategory));
static cl::opt<double> gpuMemoryBandwidth(
    "gpu-memory-bandwidth",
    cl::desc("HBM GB/s a GPU (default 4800); memory-bound times scale by it"),
    cl::init(0), cl::cat(planCategory));
static cl::opt<double> intraNodeBandwidth(
    "intra-node-bandwidth",
    cl::desc("NCCL bus bandwidth within a node, GB/s (default 360, NVLink)"),
    cl::init(0), cl::cat(planCategory));
static cl::opt<double> intraNodeLatency(
    "intra-node-latency",
    cl::desc("A collective's latency within a node, us (default 8)"),
    cl::init(0), cl::cat(planCategory));
static cl::opt<double> interNodeBandwidth(
    "inter-node-bandwidth",
    cl::desc("NCCL bus bandwidth between nodes, GB/s a GPU (default 45: "
             "400 Gb/s at 90%)"),
    cl::init(0), cl::cat(planCategory));
static cl::opt<double> interNodeLatency(
    "inter-node-latency",
    cl::desc("A collective's latency between nodes, us (default 25)"),
    cl::init(0), cl::cat(planCategory));
static cl::opt<std::string> calibrationPath(
    "calibration",
    cl::desc("Kernel times measured on the GPU that the planner predicts "
             "with (JSON written by bench/make-calibration.py; default: "
             "data/calibration-h200.json, built in; 'none': the cost "
             "model's throughputs alone)"),
    cl::value_desc("file"), cl::cat(planCategory));
static cl::opt<int64_t> planTop("plan-top",
                                cl::desc("Layouts --auto-parallel prints "
                                         "(default 5)"),
                                cl::init(5), cl::cat(planCategory));

/// The cluster of --auto-parallel: the file's, then the flags given.
static Expected<ClusterSpec> clusterFromFlags() {
  ClusterSpec cluster;
  if (!clusterPath.empty()) {
    auto buffer = MemoryBuffer::getFile(clusterPath);
    if (!buffer)
      return createStringError("--cluster: cannot read '" + clusterPath +
                               "': " + buffer.getError().message());
    Expected<ClusterSpec> parsed =
        ClusterSpec::parse((*buffer)->getBuffer(), clusterPath);
    if (!parsed)
      return parsed.takeError();
    cluster = *parsed;
  }
  auto positive = [](auto &flag, auto &out, const char *name) -> Error {
    if (!flag.getNumOccurrences())
      return Error::success();
    if (!(flag > 0))
      return createStringError(formatv("--{0} is {1}; expected a number "
                                       "above 0",
                                       name, flag.getValue()));
    out = flag;
    return Error::success();
  };
  double intraBandwidth = cluster.intraNode.bytesPerUs / 1e3,
         interBandwidth = cluster.interNode.bytesPerUs / 1e3;
  if (Error error = positive(numGpus, cluster.numGpus, "num-gpus"))
    return std::move(error);
  if (Error error = positive(gpusPerNode, cluster.gpusPerNode, "gpus-per-node"))
    return std::move(error);
  if (Error error = positive(peakTflops, cluster.peakTflops, "peak-tflops"))
    return std::move(error);
  if (Error error = positive(gpuMemoryBandwidth, cluster.memoryBandwidthGBps,
                             "gpu-memory-bandwidth"))
    return std::move(error);
  if (Error error =
          positive(intraNodeBandwidth, intraBandwidth, "intra-node-bandwidth"))
    return std::move(error);
  if (Error error = positive(intraNodeLatency, cluster.intraNode.latencyUs,
                             "intra-node-latency"))
    return std::move(error);
  if (Error error =
          positive(interNodeBandwidth, interBandwidth, "inter-node-bandwidth"))
    return std::move(error);
  if (Error error = positive(interNodeLatency, cluster.interNode.latencyUs,
                             "inter-node-latency"))
    return std::move(error);
  cluster.intraNode.bytesPerUs = intraBandwidth * 1e3;
  cluster.interNode.bytesPerUs = interBandwidth * 1e3;
  if (gpuMemory.getNumOccurrences()) {
    Expected<int64_t> bytes = parseByteSize(gpuMemory);
    if (!bytes)
      return createStringError("--gpu-memory: " + toString(bytes.takeError()));
    cluster.memoryBytes = *bytes;
  }
  return cluster;
}

/// The planner's cost model: --cost-model's figures with the calibration's
/// measured kernel times.
static Expected<mlir::mt::CostModel> plannerCostModel(raw_ostream &os) {
  Expected<mlir::mt::CostModel> model =
      mlir::mt::CostModel::load(costModelPath);
  if (!model)
    return createStringError("--cost-model: " + toString(model.takeError()));
  if (calibrationPath == "none") {
    os << "kernel times: the cost model's throughputs (--calibration none)\n";
    return model;
  }
  if (calibrationPath.empty() && !mlir::mt::Calibration::hasBuiltin()) {
    os << "kernel times: the cost model's throughputs (no calibration was "
          "built in)\n";
    return model;
  }
  Expected<mlir::mt::Calibration> calibration =
      mlir::mt::Calibration::load(calibrationPath);
  if (!calibration)
    return createStringError("--calibration: " +
                             toString(calibration.takeError()));
  os << formatv("kernel times: measured on the {0} ({1} kernels, {2})\n",
                calibration->deviceName, calibration->microseconds.size(),
                calibrationPath.empty()
                    ? std::string("data/calibration-h200.json")
                    : calibrationPath.getValue());
  model->calibration =
      std::make_shared<mlir::mt::Calibration>(std::move(*calibration));
  return model;
}

/// The pass options of the flags, for the planner's compiles.
static CompileFlags compileFlags() {
  CompileFlags flags;
  flags.gemmEpilogues = fuseGemmEpilogues;
  flags.elementwiseKernels = fuseKernels;
  flags.linearCrossEntropy = fuseLinearCrossEntropy;
  flags.linearCrossEntropyChunkRows = linearCrossEntropyChunkRows;
  return flags;
}

static cl::opt<bool> stripDebugInfo(
    "strip-debuginfo",
    cl::desc("Drop the front end's locations (\"layers.<i>\", ...) before "
             "the pipelines: they are debug information, so the bundle, the "
             "IR and the reports stay the same (a check; "
             "test/Pipelines/strip-debuginfo.test)"),
    cl::init(false), cl::cat(compileCategory));

static int fail(const Twine &message) {
  WithColor::error(errs(), "megatron-compile") << message << "\n";
  return 1;
}

/// Hugging Face counts a config.json's parameters with the vocabulary as
/// given; the table's total pads it as Megatron-LM does. A user comparing
/// with the model card needs the first, memory planning the second.
static void printHuggingFaceCount(const CompileConfig &config,
                                  mlir::ModuleOp module, raw_ostream &os) {
  int64_t total = 0;
  for (mlir::mt::ParameterOp parameter :
       module.getOps<mlir::mt::ParameterOp>())
    total += parameter.getTensorType().getNumElements();
  const ModelConfig &m = config.model;
  int64_t padded = config.paddedVocabSize();
  int64_t tables = m.untieEmbeddingsAndOutputWeights ? 2 : 1;
  int64_t unpadded = total - (padded - m.vocabSize) * m.hiddenSize * tables;
  os << formatv("Hugging Face's count: {0} parameters ({1:F2}M), the "
                "vocabulary of {2} unpadded\n",
                unpadded, unpadded / 1e6, m.vocabSize);
  os << formatv("padded count: {0} parameters ({1:F2}M), the vocabulary padded "
                "to {2} (a multiple of make_vocab_size_divisible_by {3} x "
                "tensor_model_parallel_size {4})\n",
                total, total / 1e6, padded,
                m.makeVocabSizeDivisibleBy,
                config.parallel.tensorModelParallelSize);
}

/// A mixture of experts runs each token through its top-k experts only:
/// the active count takes of every expert tensor ([E, ...], named
/// `*.mlp.experts.*`) topk of its E experts, as Megatron-LM and the model
/// cards count active parameters (docs/MoE.md).
static void printMoeActiveCount(const CompileConfig &config,
                                mlir::ModuleOp module, raw_ostream &os) {
  const MoeConfig &moe = config.moe;
  int64_t total = 0, experts = 0;
  for (mlir::mt::ParameterOp parameter :
       module.getOps<mlir::mt::ParameterOp>()) {
    int64_t count = parameter.getTensorType().getNumElements();
    total += count;
    if (parameter.getSymName().contains(".mlp.experts."))
      experts += count;
  }
  int64_t inactive = experts / moe.numExperts * (moe.numExperts - moe.routerTopk);
  int64_t active = total - inactive;
  os << formatv("experts: {0} of the {1} parameters are routed experts; "
                "each token runs {2} of {3}\n",
                experts, total, moe.routerTopk, moe.numExperts);
  os << formatv("active: {0} parameters per token ({1:F2}M) of {2} "
                "({3:F2}M)\n",
                active, active / 1e6, total, total / 1e6);
  // Megatron-LM's expert-parallel ranks are data-parallel ranks: the
  // experts split over ep of them, each expert whole on an
  // expert-data-parallel group of the rest.
  if (int64_t ep = moe.expertModelParallelSize; ep > 1) {
    int64_t ranks =
        config.parallel.dataParallelSize * config.parallel.contextParallelSize;
    int64_t perRank = total - experts + experts / ep;
    os << formatv("expert parallel: {0} expert{1} on each of {2} "
                  "expert-parallel ranks, {3} parameters a rank ({4} of them "
                  "experts; tensor parallelism splits them further); "
                  "expert-data-parallel groups of {5} rank(s)\n",
                  moe.numExperts / ep, moe.numExperts / ep == 1 ? "" : "s", ep,
                  perRank, experts / ep, ranks / ep);
  }
}

int main(int argc, char **argv) {
  InitLLVM initLLVM(argc, argv);

  // One flag per model-file key, named as Megatron-LM names its arguments.
  std::vector<std::unique_ptr<cl::opt<std::string>>> keyFlags;
  std::vector<std::string> flagNames;
  for (const ConfigKeyInfo &key : getConfigKeys()) {
    std::string flag = key.key.str();
    std::replace(flag.begin(), flag.end(), '_', '-');
    flagNames.push_back(flag);
  }
  // Boolean keys are switches, as in Megatron-LM (`--sequence-parallel`); a
  // value (`--sequence-parallel=false`) is still accepted.
  for (auto [key, flag] : llvm::zip(getConfigKeys(), flagNames))
    keyFlags.push_back(std::make_unique<cl::opt<std::string>>(
        StringRef(flag), cl::desc(key.help), cl::value_desc("value"),
        key.kind == ConfigValueKind::Boolean ? cl::ValueOptional
                                             : cl::ValueRequired,
        cl::cat(modelCategory)));

  // libLLVM.so registers code generation's hidden --stop-after
  // (TargetPassConfig), which this tool never runs; ours, made here rather
  // than as a global so that it registers after it, takes over the name.
  auto registered = cl::getRegisteredOptions();
  if (auto it = registered.find("stop-after"); it != registered.end())
    it->second->removeArgument();
  cl::opt<PipelineBoundary> stopAfter(
      "stop-after",
      cl::desc("With --emit mlir: run the pass pipelines up to this "
               "boundary and write the IR there; megatron-opt runs the rest "
               "(docs/PassPipelines.md)"),
      cl::values(clEnumValN(PipelineBoundary::Training, "training",
                            "after megatron-training-pipeline"),
                 clEnumValN(PipelineBoundary::Partition, "partition",
                            "after megatron-partition-pipeline (per-rank "
                            "IR; the training pipeline's where the layout "
                            "has one rank)"),
                 clEnumValN(PipelineBoundary::Fusion, "fusion",
                            "after megatron-fusion-pipeline"),
                 clEnumValN(PipelineBoundary::Precision, "precision",
                            "after megatron-precision-pipeline: the typed "
                            "IR the bundle is written from "
                            "(docs/MixedPrecision.md)")),
      cl::cat(compileCategory));

  // --mlir-print-debuginfo and the other printing flags, for --emit mlir.
  mlir::registerAsmPrinterCLOptions();
  cl::HideUnrelatedOptions({&compileCategory, &planCategory, &modelCategory});
  cl::ParseCommandLineOptions(
      argc, argv,
      "megatron-compile: compiles a model file (YAML, or a Hugging Face "
      "config.json) for training\n");

  const bool stops = stopAfter.getNumOccurrences() > 0;
  if (stops && (emit != EmitKind::Mlir || report != ReportKind::None))
    return fail("--stop-after writes the IR at a pipeline boundary: give it "
                "with --emit mlir and without --report");
  bool writesBundle = emit == EmitKind::None && report == ReportKind::None;
  // The cluster's flags describe the machines the planner plans for; read
  // by nothing else.
  if (!autoParallel && report != ReportKind::Step)
    for (cl::Option *flag : std::initializer_list<cl::Option *>{
             &numGpus, &clusterPath, &gpusPerNode, &gpuMemory, &peakTflops,
             &gpuMemoryBandwidth, &intraNodeBandwidth, &intraNodeLatency,
             &interNodeBandwidth, &interNodeLatency, &calibrationPath,
             &planTop})
      if (flag->getNumOccurrences())
        return fail("--" + flag->ArgStr +
                    " describes the planner's cluster "
                    "or output: give it with --auto-parallel or --report "
                    "step");
  if (autoParallel) {
    if (emit != EmitKind::None || report != ReportKind::None ||
        memoryBudget.getNumOccurrences())
      return fail("--auto-parallel prints its own report and chooses the "
                  "recomputation: give it without --emit, --report and "
                  "--memory-budget (with -o it writes the best layout's "
                  "bundle)");
    writesBundle = !outputPath.empty() && outputPath != "-";
  }
  if (writesBundle && (outputPath.empty() || outputPath == "-"))
    return fail("give the bundle's file name with -o (e.g. -o model.mtb), or "
                "print a stage with --emit mlir|plan or --report params");

  Expected<CompileConfig> config = loadCompileConfig(inputPath);
  if (!config)
    return fail(toString(config.takeError()));
  // Flags apply in the order given, so of two that set the same thing
  // (`--swiglu --activation gelu`) the later one wins.
  std::vector<cl::opt<std::string> *> givenFlags;
  for (const std::unique_ptr<cl::opt<std::string>> &flag : keyFlags)
    if (flag->getNumOccurrences())
      givenFlags.push_back(flag.get());
  llvm::sort(givenFlags, [](cl::opt<std::string> *a, cl::opt<std::string> *b) {
    return a->getPosition() < b->getPosition();
  });
  // The flag's own spelling makes the library name it in errors.
  for (cl::opt<std::string> *flag : givenFlags)
    if (Error error = applyOverride(*config, "--" + flag->ArgStr.str(), *flag))
      return fail(toString(std::move(error)));
  // Validation errors already start with the file:line:column or the flag.
  if (Error error = validateCompileConfig(*config))
    return fail(toString(std::move(error)));
  mlir::DialectRegistry registry;
  registerAllDialects(registry);
  mlir::MLIRContext context(registry);
  // A pass's warnings reach the user (errors keep MLIR's own printing).
  mlir::ScopedDiagnosticHandler warnings(&context, [](mlir::Diagnostic &d) {
    if (d.getSeverity() != mlir::DiagnosticSeverity::Warning)
      return mlir::failure();
    WithColor::warning(errs(), "megatron-compile") << d.str() << "\n";
    return mlir::success();
  });
  if (autoParallel) {
    Expected<ClusterSpec> cluster = clusterFromFlags();
    if (!cluster)
      return fail(toString(cluster.takeError()));
    Expected<mlir::mt::CostModel> costModel = plannerCostModel(outs());
    if (!costModel)
      return fail(toString(costModel.takeError()));
    PlannerOptions options;
    options.compile = compileFlags();
    options.top = std::max<int64_t>(1, planTop);
    Expected<PlanResult> plan =
        planLayouts(context, *config, *cluster, *costModel, options);
    if (!plan)
      return fail(toString(plan.takeError()));
    printPlan(*config, *cluster, *plan, outs());
    if (!writesBundle)
      return 0;
    plan->best.front().layout.applyTo(*config);
    outs() << "\nwriting #1's bundle to " << outputPath << "\n";
  }
  // --report step's text, printed with the other reports below.
  std::string stepReport;
  if (report == ReportKind::Step) {
    Expected<ClusterSpec> cluster = clusterFromFlags();
    if (!cluster)
      return fail(toString(cluster.takeError()));
    std::string header;
    raw_string_ostream headerStream(header);
    Expected<mlir::mt::CostModel> costModel = plannerCostModel(headerStream);
    if (!costModel)
      return fail(toString(costModel.takeError()));
    Expected<Prediction> prediction =
        predictLayout(context, *config, *cluster, *costModel, compileFlags());
    if (!prediction)
      return fail(toString(prediction.takeError()));
    raw_string_ostream step(stepReport);
    step << header;
    printPrediction(*config, *cluster, *prediction, step);
  }
  const ParallelConfig &parallel = config->parallel;
  const bool pipelined = parallel.pipelineModelParallelSize > 1;
  PipelinePlan plan;
  if (pipelined) {
    plan.layout = planPipelineLayout(*config);
    int64_t v = plan.layout.virtualSize;
    ScheduleKind kind =
        v > 1 ? ScheduleKind::Interleaved : ScheduleKind::OneFOneB;
    if (!pipelineSchedule.empty()) {
      std::optional<ScheduleKind> parsed = parseScheduleKind(pipelineSchedule);
      if (!parsed)
        return fail("--pipeline-schedule: unknown schedule '" +
                    pipelineSchedule + "'; expected gpipe, 1f1b or interleaved");
      kind = *parsed;
    }
    Expected<PipelineSchedule> schedule = buildPipelineSchedule(
        kind, plan.layout.pipelineSize, v, microBatchesPerIteration(*config));
    if (!schedule)
      return fail(toString(schedule.takeError()));
    plan.schedule = std::move(*schedule);
    if (!pipelineScheduleFile.empty()) {
      auto buffer = MemoryBuffer::getFile(pipelineScheduleFile);
      if (!buffer)
        return fail("--pipeline-schedule-file: cannot read '" +
                    pipelineScheduleFile + "': " + buffer.getError().message());
      Expected<json::Value> value = json::parse((*buffer)->getBuffer());
      if (!value)
        return fail("--pipeline-schedule-file '" + pipelineScheduleFile +
                    "': " + toString(value.takeError()));
      Expected<PipelineSchedule> custom = parsePipelineSchedule(
          *value, kind, plan.layout.pipelineSize, v,
          microBatchesPerIteration(*config));
      if (!custom)
        return fail("--pipeline-schedule-file '" + pipelineScheduleFile +
                    "': " + toString(custom.takeError()));
      plan.schedule = std::move(*custom);
    }
  }
  std::vector<StageLayers> stages =
      pipelined ? plan.stageLayers() : std::vector<StageLayers>();
  mlir::OwningOpRef<mlir::ModuleOp> module =
      buildModelModule(context, *config, stages);
  if (failed(mlir::verify(*module)))
    return fail("internal error: the model-level IR does not verify");
  if (stripDebugInfo) {
    mlir::PassManager strip(&context);
    strip.addPass(mlir::createStripDebugInfoPass());
    if (failed(strip.run(*module)))
      return fail("internal error: --strip-debuginfo failed");
  }

  std::string text;
  llvm::raw_string_ostream os(text);
  os << stepReport;
  if (report == ReportKind::Params) {
    mlir::mt::printParameterTable(*module, os);
    if (config->model.fromHuggingFace)
      printHuggingFaceCount(*config, *module, os);
    if (config->moe.enabled())
      printMoeActiveCount(*config, *module, os);
  }
  if (emit == EmitKind::Mlir && !stops) {
    module->print(os);
    os << "\n";
  }

  if (writesBundle || stops || emit == EmitKind::Plan ||
      report == ReportKind::Collectives || report == ReportKind::Memory ||
      report == ReportKind::Schedule || report == ReportKind::Overlap) {
    if (report == ReportKind::Schedule && !pipelined)
      return fail("--report schedule needs pipeline parallelism: set "
                  "--pipeline-model-parallel-size to 2 or more");
    // The pipelines, under one recomputation policy; --memory-budget runs
    // them once per candidate.
    auto compileUpTo = [&](mlir::ModuleOp target,
                           const mlir::mt::RecomputePolicy &policy,
                           PipelineBoundary boundary) {
      CompilePipelineOptions options;
      options.parallel = parallel;
      options.recompute = policy;
      options.expertParallelSize = config->moe.expertModelParallelSize;
      options.gemmEpilogues = fuseGemmEpilogues;
      options.elementwiseKernels = fuseKernels;
      options.linearCrossEntropy = fuseLinearCrossEntropy;
      options.linearCrossEntropyChunkRows = linearCrossEntropyChunkRows;
      options.overlapCollectives =
          overlapCollectives || report == ReportKind::Overlap;
      options.costModel = costModelPath;
      mlir::PassManager pm(&context);
      buildCompilePipeline(pm, options, boundary);
      return pm.run(target);
    };
    auto compile = [&](mlir::ModuleOp target,
                       const mlir::mt::RecomputePolicy &policy) {
      return compileUpTo(target, policy, PipelineBoundary::Precision);
    };
    mlir::mt::RecomputePolicy policy = recomputePolicyOf(config->recompute);
    if (memoryBudget.getNumOccurrences()) {
      auto origin = config->keyOrigins.find("recompute_granularity");
      if (origin != config->keyOrigins.end() &&
          StringRef(origin->second).starts_with("command line"))
        return fail("--memory-budget picks the recomputation policy; give "
                    "either it or --recompute-granularity, not both");
      Expected<int64_t> budget = parseByteSize(memoryBudget);
      if (!budget)
        return fail(toString(budget.takeError()));
      Expected<mlir::mt::RecomputePolicy> chosen =
          chooseRecomputePolicy(*module, *config, *budget, compile,
                                pipelined ? &plan : nullptr);
      if (!chosen)
        return fail(toString(chosen.takeError()));
      policy = *chosen;
      config->recompute.granularity =
          policy.granularity == mlir::mt::RecomputeGranularity::None
              ? RecomputeGranularity::None
          : policy.granularity == mlir::mt::RecomputeGranularity::Selective
              ? RecomputeGranularity::Selective
              : RecomputeGranularity::Full;
      config->recompute.method =
          policy.method == mlir::mt::RecomputeMethod::Block ? "block"
                                                            : "uniform";
      config->recompute.numLayers = policy.numLayers;
    }
    if (failed(compileUpTo(*module, policy,
                           stops ? stopAfter.getValue()
                                 : PipelineBoundary::Precision)))
      return fail("the training pipeline failed (see the diagnostics above)");
    if (stops) {
      module->print(os);
      os << "\n";
    }
    if (pipelined && !stops)
      if (Error error = finishPipelinePlan(*module, plan))
        return fail(toString(std::move(error)));
    json::Object pipelineSection;
    if (pipelined)
      pipelineSection = plan.toJSON();
    const json::Object *pipeline = pipelined ? &pipelineSection : nullptr;
    if (report == ReportKind::Collectives)
      mlir::mt::printCollectives(*module, os);
    if (report == ReportKind::Overlap) {
      Expected<mlir::mt::CostModel> costModel =
          mlir::mt::CostModel::load(costModelPath);
      if (!costModel)
        return fail("--cost-model: " + toString(costModel.takeError()));
      mlir::mt::printOverlap(*module, *costModel, os);
    }
    if (report == ReportKind::Memory)
      printMemoryReport(*module, *config, policy, os,
                        pipelined ? &plan : nullptr);
    if (report == ReportKind::Schedule) {
      plan.printReport(os);
      if (!scheduleSvg.empty()) {
        std::string errorMessage;
        std::unique_ptr<ToolOutputFile> svg =
            mlir::openOutputFile(scheduleSvg, &errorMessage);
        if (!svg)
          return fail("--schedule-svg: " + errorMessage);
        printScheduleSvg(plan.schedule, plan.predict(), svg->os());
        svg->keep();
      }
    }
    if (writesBundle)
      return failed(writeBundle(*module, outputPath, pipeline)) ? 1
                                                                          : 0;
    if (emit == EmitKind::Plan) {
      FailureOr<std::string> bundle =
          serializeBundle(*module, pipeline);
      if (failed(bundle))
        return 1;
      // The manifest follows the 64-byte header; print it indented.
      // The manifest follows the 64-byte header; its length is at offset
      // 16 (the payload, the fused kernels' binaries, comes after it).
      uint64_t manifestLength = llvm::support::endian::read64le(
          bundle->data() + 16);
      Expected<json::Value> manifest =
          json::parse(StringRef(*bundle).substr(64, manifestLength));
      if (!manifest)
        return fail("internal error: " + toString(manifest.takeError()));
      os << formatv("{0:2}", *manifest) << "\n";
    }
  }

  // Written only once everything succeeded, so a failure leaves no file.
  std::string errorMessage;
  std::unique_ptr<ToolOutputFile> output =
      mlir::openOutputFile(outputPath.empty() ? std::string("-") : outputPath.getValue(),
                           &errorMessage);
  if (!output)
    return fail(errorMessage);
  output->os() << text;
  output->keep();
  return 0;
}
