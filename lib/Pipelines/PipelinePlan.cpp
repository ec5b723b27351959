//===- PipelinePlan.cpp - A pipeline-parallel program's schedule ----------===//

#include "megatron/Frontend/ModelBuilder.h"
#include "megatron/Pipelines/PipelinePlan.h"

#include "mt/Transforms/Passes.h"

#include "mlir/Dialect/Func/IR/FuncOps.h"
#include "mlir/IR/BuiltinTypes.h"
#include "llvm/Support/Format.h"

using namespace megatron;
using namespace mlir;
using llvm::json::Array;
using llvm::json::Object;

std::vector<StageLayers> PipelinePlan::stageLayers() const {
  std::vector<StageLayers> layers;
  for (const PipelineStage &stage : layout.stages)
    layers.push_back({stage.firstLayer, stage.numLayers});
  return layers;
}

int64_t megatron::microBatchesPerIteration(const CompileConfig &config) {
  return config.globalBatchSize() /
         (config.batch.microBatchSize * config.parallel.dataParallelSize);
}

static std::string typeText(Type type) {
  auto tensor = cast<RankedTensorType>(type);
  std::string text;
  llvm::raw_string_ostream os(text);
  for (int64_t size : tensor.getShape())
    os << size << "x";
  os << tensor.getElementType();
  return text;
}

static int64_t bytesOf(Type type) {
  auto tensor = cast<RankedTensorType>(type);
  return tensor.getNumElements() *
         static_cast<int64_t>(tensor.getElementTypeBitWidth() / 8);
}

static std::string stageFunction(int64_t stage, llvm::StringRef part) {
  return ("train_step_stage" + llvm::Twine(stage) + part).str();
}

llvm::Error megatron::finishPipelinePlan(ModuleOp module, PipelinePlan &plan) {
  auto fail = [](const llvm::Twine &message) {
    return llvm::createStringError(llvm::inconvertibleErrorCode(), message);
  };
  int64_t stages = plan.schedule.numStages();
  plan.signatures.assign(stages, {});
  plan.stashBytes.assign(stages, 0);
  plan.reportedLosses.assign(stages, {});
  for (int64_t k = 0; k < stages; ++k) {
    auto forward =
        module.lookupSymbol<func::FuncOp>(stageFunction(k, "_forward"));
    auto backward =
        module.lookupSymbol<func::FuncOp>(stageFunction(k, "_backward"));
    if (!forward || !backward)
      return fail("internal error: no forward and backward function for "
                  "pipeline stage " + llvm::Twine(k));
    if (k > 0)
      plan.signatures[k].input = typeText(forward.getArgumentTypes().front());
    if (k + 1 < stages)
      plan.signatures[k].output = typeText(forward.getResultTypes().front());
    for (StringRef name : mt::reportedLossResults(forward))
      plan.reportedLosses[k].push_back(name.str());
    for (Type stashed :
         forward.getResultTypes().drop_front(1 + plan.reportedLosses[k].size()))
      plan.stashBytes[k] += bytesOf(stashed);
  }
  return verifyPipelineSchedule(plan.schedule, plan.signatures);
}

llvm::json::Object PipelinePlan::toJSON() const {
  Object pipeline = *schedule.toJSON().getAsObject();
  pipeline["axis"] = 0;
  pipeline["size"] = schedule.pipelineSize;
  pipeline["layout"] = layout.method;
  Array stageEntries;
  for (const PipelineStage &stage : layout.stages) {
    Object entry{
        {"stage", stage.index},
        {"rank", stage.rank},
        {"first_layer", stage.firstLayer},
        {"num_layers", stage.numLayers},
        {"forward", stageFunction(stage.index, "_forward")},
        {"backward", stageFunction(stage.index, "_backward")},
        {"eval", ("eval_step_stage" + llvm::Twine(stage.index)).str()},
        {"predict", ("predict_step_stage" + llvm::Twine(stage.index)).str()}};
    if (static_cast<size_t>(stage.index) < reportedLosses.size() &&
        !reportedLosses[stage.index].empty()) {
      const std::vector<std::string> &names = reportedLosses[stage.index];
      entry["aux_loss"] = true;
      if (names.size() > 1)
        entry["reported_losses"] = llvm::json::Array(
            std::vector<std::string>(names.begin() + 1, names.end()));
    }
    stageEntries.push_back(std::move(entry));
  }
  pipeline["stages"] = std::move(stageEntries);
  pipeline["predicted_idle_fraction"] = Array(predict().idleFraction);
  return pipeline;
}

ScheduleTimeline PipelinePlan::predict() const {
  std::vector<double> seconds;
  for (const PipelineStage &stage : layout.stages)
    seconds.push_back(stage.cost.seconds());
  return simulatePipelineSchedule(schedule, seconds);
}

int64_t PipelinePlan::peakStashBytes(int64_t rank) const {
  int64_t held = 0, peak = 0;
  for (const ScheduleAction &a : schedule.ranks[rank]) {
    if (a.kind == ScheduleAction::Forward)
      peak = std::max(peak, held += stashBytes[a.stage]);
    else if (a.kind == ScheduleAction::Backward)
      held -= stashBytes[a.stage];
  }
  return peak;
}

std::vector<int64_t> PipelinePlan::stagesOf(int64_t rank) const {
  std::vector<int64_t> stages;
  for (int64_t k = 0; k < schedule.numStages(); ++k)
    if (schedule.rankOf(k) == rank)
      stages.push_back(k);
  return stages;
}

void PipelinePlan::printReport(llvm::raw_ostream &os) const {
  layout.print(os);
  const int64_t p = schedule.pipelineSize, v = schedule.virtualSize,
                m = schedule.microBatches;
  os << "\nschedule: " << scheduleKindName(schedule.kind) << ", " << p
     << " ranks, " << v << " virtual stage" << (v > 1 ? "s" : "")
     << " per rank, " << m
     << " micro-batches; verified: every send meets its recv, no deadlock\n";
  ScheduleTimeline timeline = predict();
  os << "timeline (cost model; F<micro-batch>"
     << (v > 1 ? ".<chunk>" : "") << " forward, B backward = 2 x forward, "
     << "'.' idle):\n";
  printScheduleText(schedule, timeline, os);

  std::vector<double> uniform(schedule.numStages(), 1.0);
  ScheduleTimeline even = simulatePipelineSchedule(schedule, uniform);
  os << "\npredicted idle fraction per rank (cost model):";
  for (double f : timeline.idleFraction)
    os << llvm::format(" %.4f", f);
  os << llvm::format("\npredicted bubble: %.4f (cost model), %.4f (uniform "
                     "stages); formula for uniform stages %.4f\n",
                     timeline.meanIdleFraction(), even.meanIdleFraction(),
                     analyticBubbleFraction(schedule.kind, p, v, m));

  os << "\nstashed activations (forward done, backward pending), per rank:\n";
  for (int64_t r = 0; r < p; ++r) {
    int64_t peak = peakStashBytes(r);
    os << llvm::format("rank %lld: at most %lld micro-batches in flight%s, "
                       "peak %.3f MB\n",
                       (long long)r, (long long)timeline.peakStashed[r],
                       v > 1 ? " (counted per chunk)" : "", peak / 1e6);
  }
}
