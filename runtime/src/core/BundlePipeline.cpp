// Reads and checks a bundle's `pipeline` section (docs/BundleFormat.md,
// "Pipeline parallelism"): the stages' functions agree with each other and the
// schedule's steps are in range.
#include "core/BundleReader.h"

#include <algorithm>
#include <map>
#include <set>
#include <tuple>

namespace mtrt::bundle_detail {

namespace {

using Kind = PipelineStep::Kind;

bool isCompute(Kind kind) {
  return kind == Kind::Forward || kind == Kind::Backward;
}

std::string describeStep(const PipelineStep &step) {
  static const char *const kNames[] = {"forward",         "backward",
                                       "send_activation", "recv_activation",
                                       "send_gradient",   "recv_gradient"};
  std::string text = std::string(kNames[static_cast<int>(step.kind)]) +
                     " of stage " + std::to_string(step.stage) +
                     ", micro-batch " + std::to_string(step.microBatch);
  if (!isCompute(step.kind))
    text += " with rank " + std::to_string(step.peer);
  return text;
}

/// The message a send or recv carries: (activation?, sending stage,
/// micro-batch).
std::tuple<bool, int64_t, int64_t> messageOf(const PipelineStep &step) {
  switch (step.kind) {
  case Kind::SendActivation:
    return {true, step.stage, step.microBatch};
  case Kind::RecvActivation:
    return {true, step.stage - 1, step.microBatch};
  case Kind::SendGradient:
    return {false, step.stage, step.microBatch};
  default:
    return {false, step.stage + 1, step.microBatch};
  }
}

/// The compiler's proof (lib/Pipelines/PipelineSchedule.cpp), again: the
/// ranks run with asynchronous sends and blocking receives; every pass runs
/// once after its inputs arrived, every receive gets the message it expects
/// in per-pair order, and nothing waits forever. Returns the problem, or "".
std::string checkSchedule(const PipelineInfo &pipeline) {
  const int64_t p = pipeline.size;
  const int64_t last = p * pipeline.virtualStages - 1;
  auto at = [&](int64_t r, size_t i) {
    return "ranks[" + std::to_string(r) + "][" + std::to_string(i) + "] (" +
           describeStep(pipeline.ranks[r][i]) + ")";
  };
  std::vector<size_t> position(p, 0);
  std::vector<std::set<std::tuple<bool, int64_t, int64_t>>> computed(p),
      arrived(p);
  std::map<std::pair<int64_t, int64_t>,
           std::vector<std::tuple<bool, int64_t, int64_t>>>
      sent;
  std::map<std::pair<int64_t, int64_t>, size_t> taken;
  for (bool progress = true; progress;) {
    progress = false;
    for (int64_t r = 0; r < p; ++r) {
      const auto &steps = pipeline.ranks[r];
      for (; position[r] < steps.size(); ++position[r], progress = true) {
        size_t i = position[r];
        const PipelineStep &step = steps[i];
        bool forward = step.kind == Kind::Forward;
        if (step.kind == Kind::SendActivation ||
            step.kind == Kind::SendGradient) {
          int64_t to = step.kind == Kind::SendActivation ? step.stage + 1
                                                         : step.stage - 1;
          if (to < 0 || to > last || step.peer != to % p)
            return at(r, i) + " sends to a rank that does not run stage " +
                   std::to_string(to);
          if (!computed[r].count({step.kind == Kind::SendActivation,
                                  step.stage, step.microBatch}))
            return at(r, i) + " sends before the pass that computes it";
          sent[{r, step.peer}].push_back(messageOf(step));
          continue;
        }
        if (!isCompute(step.kind)) {
          auto message = messageOf(step);
          int64_t from = std::get<1>(message);
          if (from < 0 || from > last || step.peer != from % p)
            return at(r, i) + " receives from a rank that does not run stage " +
                   std::to_string(from);
          auto &queue = sent[{step.peer, r}];
          size_t &next = taken[{step.peer, r}];
          if (next >= queue.size())
            break;
          if (queue[next] != message)
            return at(r, i) + " would receive another message (message #" +
                   std::to_string(next) + " from rank " +
                   std::to_string(step.peer) + ")";
          ++next;
          arrived[r].insert(message);
          continue;
        }
        if (!computed[r].insert({forward, step.stage, step.microBatch}).second)
          return at(r, i) + " runs a second time";
        if (forward && step.stage > 0 &&
            !arrived[r].count({true, step.stage - 1, step.microBatch}))
          return at(r, i) + " runs before its input activation arrives";
        if (!forward && !computed[r].count({true, step.stage, step.microBatch}))
          return at(r, i) + " runs before its forward pass";
        if (!forward && step.stage < last &&
            !arrived[r].count({false, step.stage + 1, step.microBatch}))
          return at(r, i) + " runs before its output's gradient arrives";
      }
    }
  }
  for (int64_t r = 0; r < p; ++r)
    if (position[r] < pipeline.ranks[r].size())
      return at(r, position[r]) + " waits forever (the schedule deadlocks)";
  for (int64_t k = 0; k <= last; ++k)
    for (int64_t m = 0; m < pipeline.microBatches; ++m)
      for (bool forward : {true, false})
        if (!computed[k % p].count({forward, k, m}))
          return "rank " + std::to_string(k % p) + " never runs the " +
                 (forward ? "forward" : "backward") + " of stage " +
                 std::to_string(k) + ", micro-batch " + std::to_string(m);
  return "";
}

const std::pair<const char *, PipelineStep::Kind> kStepKinds[] = {
    {"forward", PipelineStep::Kind::Forward},
    {"backward", PipelineStep::Kind::Backward},
    {"send_activation", PipelineStep::Kind::SendActivation},
    {"recv_activation", PipelineStep::Kind::RecvActivation},
    {"send_gradient", PipelineStep::Kind::SendGradient},
    {"recv_gradient", PipelineStep::Kind::RecvGradient},
};

} // namespace

void ManifestReader::readPipeline(const Json &json, const std::string &path,
                                  Bundle &bundle) {
  expectObject(json, path);
  expectKnownKeys(json, path,
                  {"axis", "size", "virtual_stages", "micro_batches",
                   "schedule", "layout", "stages", "ranks",
                   "predicted_idle_fraction"},
                  "the pipeline section");
  PipelineInfo &out = bundle.pipeline_;
  // The partition's grid (dp x tp, or dp x cp x tp under context
  // parallelism) with the pipeline axis in front.
  if (grid_.size() != 3 && grid_.size() != 4)
    fail(path, "a pipeline section with grid " + shapeString(grid_),
         "a grid [pp, dp, tp], or [pp, dp, cp, tp] under context "
         "parallelism (the pipeline axis first)");
  out.axis = readInt(field(json, path, "axis"), member(path, "axis"), 0, 0);
  out.size = readInt(field(json, path, "size"), member(path, "size"), 2,
                     grid_[0]);
  if (out.size != grid_[0])
    fail(member(path, "size"), std::to_string(out.size),
         "the grid's pipeline axis size " + std::to_string(grid_[0]));
  out.virtualStages = readInt(field(json, path, "virtual_stages"),
                              member(path, "virtual_stages"), 1, 1 << 12);
  out.microBatches = readInt(field(json, path, "micro_batches"),
                             member(path, "micro_batches"), 1, 1 << 20);
  // For logs only, but closed like every enum of the schema, so that a new
  // schedule is a format change the reader knows of.
  auto readName = [&](const char *key,
                      std::initializer_list<const char *> names) {
    std::string at = member(path, key);
    std::string text = readString(field(json, path, key), at);
    std::string allowed;
    for (const char *name : names) {
      if (text == name)
        return text;
      allowed += std::string(allowed.empty() ? "" : ", ") + "\"" + name + "\"";
    }
    fail(at, "\"" + text + "\"", "one of " + allowed);
  };
  out.schedule = readName("schedule", {"gpipe", "1f1b", "interleaved"});
  out.layout = readName("layout", {"cost-balanced", "explicit", "even"});
  const int64_t stages = out.size * out.virtualStages;

  auto functionIndex = [&](const Json &name, const std::string &at) {
    std::string text = readString(name, at);
    for (size_t i = 0; i < bundle.functions_.size(); ++i)
      if (bundle.functions_[i].name == text)
        return i;
    fail(at, "\"" + text + "\"", "the name of one of the bundle's functions");
  };
  const Json &stageList = field(json, path, "stages");
  std::string stagesAt = member(path, "stages");
  expectArray(stageList, stagesAt);
  if (static_cast<int64_t>(stageList.size()) != stages)
    fail(stagesAt, std::to_string(stageList.size()) + " entries",
         std::to_string(stages) + " (size x virtual_stages)");
  for (size_t k = 0; k < stageList.size(); ++k) {
    std::string at = index(stagesAt, k);
    const Json &entry = stageList[k];
    expectObject(entry, at);
    expectKnownKeys(entry, at,
                    {"stage", "rank", "first_layer", "num_layers", "forward",
                     "backward", "eval", "predict", "aux_loss",
                     "reported_losses"},
                    "a pipeline stage");
    PipelineStageInfo stage;
    stage.stage = readInt(field(entry, at, "stage"), member(at, "stage"),
                          static_cast<int64_t>(k), static_cast<int64_t>(k));
    stage.rank = readInt(field(entry, at, "rank"), member(at, "rank"),
                         stage.stage % out.size, stage.stage % out.size);
    stage.firstLayer = readInt(field(entry, at, "first_layer"),
                               member(at, "first_layer"), 0);
    stage.numLayers =
        readInt(field(entry, at, "num_layers"), member(at, "num_layers"), 0);
    stage.forward = functionIndex(field(entry, at, "forward"),
                                  member(at, "forward"));
    stage.backward = functionIndex(field(entry, at, "backward"),
                                   member(at, "backward"));
    stage.eval = functionIndex(field(entry, at, "eval"), member(at, "eval"));
    if (const Json *predict = optionalField(entry, "predict"))
      stage.predict = functionIndex(*predict, member(at, "predict"));
    if (const Json *aux = optionalField(entry, "aux_loss"))
      stage.auxLoss = readBool(*aux, member(at, "aux_loss"));
    if (const Json *reported = optionalField(entry, "reported_losses"))
      readReportedLosses(*reported, member(at, "reported_losses"), stage);
    // The forward's results after its output (and its auxiliary losses)
    // are the backward's leading inputs (the stash), then the output's
    // gradient.
    const Function &forward = bundle.functions_[stage.forward];
    const Function &backward = bundle.functions_[stage.backward];
    const size_t leading = stage.leadingOutputs();
    if (stage.auxLoss && (forward.outputs.size() < 2 ||
                          !forward.values[forward.outputs[1]].shape.empty()))
      fail(member(at, "aux_loss"), "true",
           "a scalar output 1 of \"" + forward.name +
               "\" (the stage's auxiliary losses)");
    for (size_t i = 2; i < leading; ++i)
      if (forward.outputs.size() <= i ||
          forward.values[forward.outputs[i]].dtype != DType::F32 ||
          !forward.values[forward.outputs[i]].shape.empty())
        fail(index(member(at, "reported_losses"), i - 2),
             "\"" + stage.reportedLosses[i - 2] + "\"",
             "an f32 scalar output " + std::to_string(i) + " of \"" +
                 forward.name + "\"");
    if (forward.outputs.size() + 1 != backward.inputs.size() + leading)
      fail(member(at, "backward"),
           "\"" + backward.name + "\" with " +
               std::to_string(backward.inputs.size()) + " inputs",
           std::to_string(forward.outputs.size() + 1 - leading) +
               ": the stash of \"" + forward.name + "\" (its outputs after " +
               (leading == 1 ? std::string("the first")
                             : "the first " + std::to_string(leading)) +
               ") and the output's gradient");
    for (size_t i = 0; i + leading < forward.outputs.size() + 1; ++i) {
      const TensorType &sent =
          forward.values[forward.outputs[i == 0 ? 0 : i + leading - 1]];
      const TensorType &taken =
          backward.values[backward.inputs[i == 0 ? backward.inputs.size() - 1
                                                 : i - 1]];
      if (sent.shape != taken.shape || sent.dtype != taken.dtype)
        fail(member(at, "backward"),
             "input of type " + taken.str() + " in \"" + backward.name + "\"",
             sent.str() + ", as output " + std::to_string(i) + " of \"" +
                 forward.name + "\"");
    }
    size_t gradients = stage.stage > 0 ? 1 : 0;
    if (backward.outputs.size() != gradients)
      fail(member(at, "backward"),
           "\"" + backward.name + "\" with " +
               std::to_string(backward.outputs.size()) + " outputs",
           std::to_string(gradients) + " (the input activation's gradient)");
    out.stages.push_back(stage);
  }

  const Json &ranks = field(json, path, "ranks");
  std::string ranksAt = member(path, "ranks");
  expectArray(ranks, ranksAt);
  if (static_cast<int64_t>(ranks.size()) != out.size)
    fail(ranksAt, std::to_string(ranks.size()) + " lists",
         "one per pipeline rank (" + std::to_string(out.size) + ")");
  for (size_t r = 0; r < ranks.size(); ++r) {
    std::string rankAt = index(ranksAt, r);
    expectArray(ranks[r], rankAt);
    std::vector<PipelineStep> steps;
    for (size_t i = 0; i < ranks[r].size(); ++i) {
      std::string at = index(rankAt, i);
      const Json &entry = ranks[r][i];
      expectObject(entry, at);
      expectKnownKeys(entry, at, {"op", "stage", "micro_batch", "peer"},
                      "a pipeline step");
      std::string op = readString(field(entry, at, "op"), member(at, "op"));
      PipelineStep step;
      bool known = false;
      for (auto [name, kind] : kStepKinds)
        if (op == name) {
          step.kind = kind;
          known = true;
        }
      if (!known)
        fail(member(at, "op"), "\"" + op + "\"",
             "forward, backward, send_activation, recv_activation, "
             "send_gradient or recv_gradient");
      step.stage = readInt(field(entry, at, "stage"), member(at, "stage"), 0,
                           stages - 1);
      if (step.stage % out.size != static_cast<int64_t>(r))
        fail(member(at, "stage"), std::to_string(step.stage),
             "a stage of pipeline rank " + std::to_string(r));
      step.microBatch = readInt(field(entry, at, "micro_batch"),
                                member(at, "micro_batch"), 0,
                                out.microBatches - 1);
      bool compute = step.kind == PipelineStep::Kind::Forward ||
                     step.kind == PipelineStep::Kind::Backward;
      if (!compute)
        step.peer = readInt(field(entry, at, "peer"), member(at, "peer"), 0,
                            out.size - 1);
      steps.push_back(step);
    }
    out.ranks.push_back(std::move(steps));
  }
  std::string problem = checkSchedule(out);
  if (!problem.empty())
    fail(ranksAt, "a schedule where " + problem,
         "one that runs every pass once and cannot deadlock (recompile the "
         "bundle)");
  if (const Json *idle = optionalField(json, "predicted_idle_fraction")) {
    std::string at = member(path, "predicted_idle_fraction");
    expectArray(*idle, at);
    if (static_cast<int64_t>(idle->size()) != out.size)
      fail(at, std::to_string(idle->size()) + " entries",
           "one per pipeline rank (" + std::to_string(out.size) + ")");
    for (size_t r = 0; r < idle->size(); ++r)
      out.predictedIdleFraction.push_back(readNumber((*idle)[r], index(at, r)));
  }
  bundle.hasPipeline_ = true;
}

void ManifestReader::readReportedLosses(const Json &json,
                                        const std::string &path,
                                        PipelineStageInfo &stage) {
  if (version_ < 12)
    fail(path,
         "reported_losses in a version " + std::to_string(version_) +
             " manifest",
         "none before format version 12 (the version is wrong or the "
         "manifest was edited)");
  if (!stage.auxLoss)
    fail(path, "reported_losses without aux_loss",
         "aux_loss true: the reported losses follow the stage's auxiliary "
         "losses");
  expectArray(json, path);
  for (size_t i = 0; i < json.size(); ++i) {
    std::string at = index(path, i);
    std::string name = readString(json[i], at);
    if (std::find(std::begin(kLoggedMoeLosses), std::end(kLoggedMoeLosses),
                  name) == std::end(kLoggedMoeLosses))
      fail(at, "\"" + name + "\"",
           "load_balancing_loss, seq_load_balancing_loss or z_loss");
    if (std::find(stage.reportedLosses.begin(), stage.reportedLosses.end(),
                  name) != stage.reportedLosses.end())
      fail(at, "\"" + name + "\" twice", "distinct names");
    stage.reportedLosses.push_back(std::move(name));
  }
}

void ManifestReader::checkStageParameters(const Bundle &bundle) {
  const std::vector<Parameter> &parameters = bundle.parameters_;
  if (!bundle.hasPipeline_) {
    for (size_t p = 0; p < parameters.size(); ++p)
      if (parameters[p].pipelineRanks.size() > 1)
        fail(member(index("parameters", p), "pipeline_ranks"),
             "pipeline ranks in a bundle without a pipeline section",
             "pipeline_ranks only in a pipeline bundle");
    return;
  }
  const PipelineInfo &pipeline = bundle.pipeline_;
  for (size_t k = 0; k < pipeline.stages.size(); ++k) {
    const PipelineStageInfo &stage = pipeline.stages[k];
    std::string at = index("pipeline.stages", k);
    std::vector<std::pair<const char *, size_t>> functions = {
        {"forward", stage.forward},
        {"backward", stage.backward},
        {"eval", stage.eval}};
    if (stage.predict)
      functions.push_back({"predict", *stage.predict});
    for (auto [key, function] : functions) {
      const Function &f = bundle.functions_[function];
      for (size_t i = 0; i < f.instructions.size(); ++i) {
        const Instruction &inst = f.instructions[i];
        if (inst.op != Op::GetParameter && inst.op != Op::AccumulateGradient)
          continue;
        const Parameter &p = parameters[inst.attrs.parameter];
        if (p.heldOnPipelineRank(stage.rank))
          continue;
        std::string held;
        for (int64_t r : p.pipelineRanks)
          held += (held.empty() ? "" : ", ") + std::to_string(r);
        fail(member(at, key),
             "\"" + f.name + "\", whose instructions[" + std::to_string(i) +
                 "] (" + opName(inst.op) + ") uses parameter " +
                 std::to_string(inst.attrs.parameter) + " (" + p.name +
                 ") of pipeline ranks [" + held + "]",
             "stage functions that use only the parameters of their pipeline "
             "rank " + std::to_string(stage.rank) +
                 " (a parameter shared by several stages' ranks, like tied "
                 "embeddings, lists them all in pipeline_ranks; recompile the "
                 "bundle)");
      }
    }
  }
}

} // namespace mtrt::bundle_detail
