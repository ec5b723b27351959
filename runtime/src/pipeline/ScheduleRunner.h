// Runs a pipeline bundle's static schedule on one rank, over the executors of
// one backend (host or CUDA): the schedule logic, written once.
#ifndef MTRT_SRC_PIPELINE_SCHEDULERUNNER_H
#define MTRT_SRC_PIPELINE_SCHEDULERUNNER_H

#include "comm/Communicator.h"
#include "comm/RankContext.h"
#include "core/Bundle.h"
#include "core/MicroBatchKey.h"
#include "host/HostTensor.h"

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <functional>
#include <iterator>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace mtrt::pipeline {

/// One rank of a pipeline bundle (docs/Pipeline.md). The rank runs the
/// virtual stages the schedule gives its pipeline coordinate, and exchanges
/// messages with the ranks that share its data-, context- and
/// tensor-parallel coordinates: sends are asynchronous, receives block, in
/// the schedule's order, which the compiler proved cannot deadlock. Under
/// context parallelism the source gives the rank's load-balanced chunks of
/// each sample (the trainer's readMicroBatch), to the first stage's tokens
/// and the last stage's labels alike. Gradients accumulate
/// into the backend's parameter store as the backward passes run; the
/// caller zeroes them and steps the optimizer.
///
/// A parameter held on several pipeline ranks (a table tied across the
/// first and last stage: Parameter::pipelineRanks) has a copy on each, and
/// at the schedule's end, after the last backward pass and before the
/// caller's data-parallel reduction and optimizer, its gradient is summed
/// over its embedding group: the ranks of those pipeline coordinates with
/// this rank's data- and tensor-parallel coordinates (Megatron-LM's
/// embedding group all-reduce). Both copies then take the same step.
///
/// Each micro-batch in flight on a stage holds a stash slot from its
/// forward to its backward: the smallest free one, the same every
/// iteration, so that a backend can keep the stash in place (the GPU's
/// backward reads the slot's buffers, its CUDA graph bound to them).
///
/// `Stages` is the backend: where the stage functions run and where the
/// activations, their gradients and the stash live. It provides
///   using Tensor = ...;   // a value of a stage, movable
///   using Executor = ...; // with const Function &function()
///   DType floatType() const;  // the messages' and the loss seed's type
///   // The rank's executors share one arena (the largest of theirs): the
///   // runner makes them all (forward, backward, eval of each of its
///   // stages) before the first run, runs one at a time, and keeps what
///   // crosses runs (activations, gradients, the stash) in Tensors.
///   // sharedArena false: an arena of its own (a predict function, made
///   // after the schedule's executors ran).
///   std::unique_ptr<Executor> executor(const std::string &function,
///                                      bool sharedArena = true);
///   size_t arenaBytes() const;  // the shared arena's size
///   host::TensorView view(const Tensor &);  // data: host or device memory
///   // A stage function's run (inputs: host or device views, read before
///   // the next run); `slot`: its micro-batch's stash slot; `readsStash`:
///   // a backward, whose inputs but the last are a forward's outputs but
///   // the first. May return before the values are computed (the GPU
///   // enqueues): a Tensor is ready for every later call on it.
///   std::vector<Tensor> run(Executor &, const std::vector<host::TensorView> &,
///                           const MicroBatchKey &, int64_t slot,
///                           bool readsStash);
///   double scalar(const Tensor &);  // a loss (waits for it)
///   Tensor receive(int worldPeer, const TensorType &, const comm::CallInfo &);
///   void send(int worldPeer, Tensor, const comm::CallInfo &);  // async
///   void sendsDone();  // every send so far has reached its receiver
///   // parameter's gradient = its sum over `group` (in place)
///   void allReduceGradient(comm::Communicator &group, size_t parameter,
///                          const comm::CallInfo &);
///   double takeComputeSeconds();  // runs' compute time since the last call
/// (PipelineRunner.h: the host's; cuda/PipelineStages.h: the GPU's.)
///
/// Thread-safety: the rank's thread only.
template <typename Stages> class ScheduleRunner {
public:
  using Tensor = typename Stages::Tensor;
  /// The rank's tokens and labels of micro-batch m of the current iteration
  /// (or evaluation), valid until the next call (host memory).
  using MicroBatchSource =
      std::function<std::pair<host::TensorView, host::TensorView>(int64_t)>;

  /// Prepares the executors of the rank's stages. Collective over the world
  /// (it makes the pipeline group and the embedding groups). Throws Error.
  ScheduleRunner(const Bundle &bundle, Stages stages, comm::RankContext &rank);

  /// Runs the schedule once: returns the sum of the micro-batches' losses
  /// (with every stage's MoE auxiliary losses; reportedLosses() then
  /// returns them apart), the same on every rank.
  /// Micro-batch m is {first.step + m, first.firstSample + m * globalBatch}:
  /// its masks are keyed on its samples (globalBatch: a micro-batch's samples
  /// over the data ranks).
  double train(const MicroBatchSource &source, const MicroBatchKey &first,
               uint64_t globalBatch);
  /// The stages' reported MoE losses of the last train(), each summed over
  /// its micro-batches and stages, the same on every rank: "aux_loss" (part
  /// of its loss), then any of kLoggedMoeLosses; empty
  /// without MoE auxiliary losses.
  const std::vector<std::pair<std::string, double>> &reportedLosses() const {
    return reported_;
  }
  /// Runs the eval functions over `microBatches` micro-batches, one after
  /// another through all stages; returns the sum of their losses on every
  /// rank.
  double evaluate(const MicroBatchSource &source, int64_t microBatches);

  /// Runs the window `tokens` (the first stage's input, host memory) through
  /// the predict functions of every stage (PipelineStageInfo::predict, made
  /// at the first call in arenas of their own, Stages::executor(name,
  /// /*sharedArena=*/false)), in stage order: returns the last stage's
  /// logits on the ranks of the last stage, nullopt on the others. A
  /// collective over the pipeline ranks. Throws Error (NOT_FOUND) for a
  /// bundle written before format version 11, whose stages have none.
  std::optional<Tensor> predict(const host::TensorView &tokens);

  /// fp16 loss scaling: the last stage's loss gradient from the next train()
  /// on, instead of 1.
  void setLossScale(double scale) { lossScale_ = scale; }

  /// Megatron-LM's --overlap-grad-reduce: from the next train() on, each
  /// stage's backward function of the iteration's last micro-batch calls
  /// `observer` with its name and each instruction's position once that
  /// instruction has run (the executor's setInstructionObserver), so that
  /// the gradient buckets complete there are reduced while the schedule
  /// goes on. nullptr: none.
  using InstructionObserver =
      std::function<void(const std::string &function, size_t position)>;
  void setLastBackwardObserver(InstructionObserver observer) {
    lastBackwardObserver_ = std::move(observer);
  }

  /// Megatron-LM's --overlap-param-gather: from the next train() on, called
  /// with each stage's forward function before its first micro-batch runs
  /// (so that the parameters it reads are gathered there, not before the
  /// schedule). nullptr: none.
  using FunctionHook = std::function<void(const Function &function)>;
  void setBeforeFirstForward(FunctionHook hook) {
    beforeFirstForward_ = std::move(hook);
  }

  /// The most bytes of stash this rank held at once (forward done, backward
  /// pending, over all its stages), over all train() calls so far.
  int64_t peakStashBytes() const { return peakStashBytes_; }

  /// The fraction of train()'s time this rank computed nothing, over all
  /// calls so far.
  double idleFraction() const {
    return wallSeconds_ > 0 ? 1 - computeSeconds_ / wallSeconds_ : 0;
  }
  /// Every pipeline rank's idleFraction(), on every rank (a collective over
  /// the world; data- and tensor-parallel replicas are averaged).
  std::vector<double> gatherIdleFractions();
  /// The log line of gatherIdleFractions() against the compiler's
  /// prediction (a collective over the world, as it).
  std::string describeIdleFractions();

  Stages &stages() { return stages_; }
  /// The rank's executors: each of its stages' forward, backward and eval.
  std::vector<const typename Stages::Executor *> executors() const {
    std::vector<const typename Stages::Executor *> all;
    for (const auto &[index, stage] : stageExecutors_)
      for (const auto *executor :
           {stage.forward.get(), stage.backward.get(), stage.eval.get()})
        all.push_back(executor);
    return all;
  }

protected:
  struct Stage {
    const PipelineStageInfo *info = nullptr;
    /// Per reported output of the forward (PipelineStageInfo::
    /// reportedOutputs), its index in reported_.
    std::vector<size_t> reportedAt;
    std::unique_ptr<typename Stages::Executor> forward, backward, eval;
    /// Made by the first predict().
    std::unique_ptr<typename Stages::Executor> predict;
  };
  /// The parameters held on one set of pipeline ranks (tied across stages),
  /// and the communicator of this rank's group of them (null when this
  /// rank's pipeline coordinate is not in the set).
  struct EmbeddingGroup {
    std::vector<int64_t> pipelineRanks;
    std::vector<size_t> parameters;
    std::unique_ptr<comm::Communicator> communicator;
  };
  using Key = std::pair<int64_t, int64_t>; // (stage, micro-batch)
  using Clock = std::chrono::steady_clock;

  static double since(Clock::time_point start) {
    return std::chrono::duration<double>(Clock::now() - start).count();
  }
  static std::string label(const char *what, int64_t stage,
                           int64_t microBatch) {
    return std::string(what) + " of stage " + std::to_string(stage) +
           ", micro-batch " + std::to_string(microBatch);
  }
  int peerWorldRank(int64_t pipelineRank) const;
  void makeEmbeddingGroups();
  /// Sums the tied parameters' gradients over their embedding groups.
  void reduceTiedGradients(uint64_t firstStep);
  /// The sum of losses_ and the reported aux_loss over the pipeline ranks
  /// (and reportedValues_'s sums into reported_).
  double lossOverRanks(const char *label);
  int64_t takeSlot(const Key &key);
  int64_t releaseSlot(const Key &key);
  int64_t bytesOf(const std::vector<Tensor> &tensors);

  // First: the tensors below return their memory to it.
  Stages stages_;
  const Bundle &bundle_;
  const PipelineInfo &pipeline_;
  comm::RankContext &rank_;
  comm::Communicator *pipelineGroup_ = nullptr;
  int64_t pipelineRank_ = 0;
  int64_t lastStage_ = 0;
  double lossScale_ = 1.0;
  InstructionObserver lastBackwardObserver_;
  FunctionHook beforeFirstForward_;
  std::map<int64_t, Stage> stageExecutors_;
  std::vector<EmbeddingGroup> embeddingGroups_;

  // Messages and stashes in flight during one schedule.
  std::map<Key, Tensor> inputs_, outputGradients_, outputs_, inputGradients_;
  std::map<Key, std::vector<Tensor>> stash_;
  /// The stash slot of each micro-batch in flight; per stage, which slots
  /// are taken.
  std::map<Key, int64_t> slotOf_;
  std::map<int64_t, std::vector<bool>> slotsTaken_;
  /// The last stage's language-model losses of this schedule (or its eval
  /// losses), read at its end.
  std::vector<Tensor> losses_;
  /// Per name of reported_ (the stages' reported losses in the order they
  /// first appear), this schedule's values, read at its end.
  std::vector<std::vector<Tensor>> reportedValues_;
  std::vector<std::pair<std::string, double>> reported_;

  double computeSeconds_ = 0, wallSeconds_ = 0;
  int64_t stashBytes_ = 0, peakStashBytes_ = 0;
};

template <typename Stages>
ScheduleRunner<Stages>::ScheduleRunner(const Bundle &bundle, Stages stages,
                                       comm::RankContext &rank)
    : stages_(std::move(stages)), bundle_(bundle),
      pipeline_(*bundle.pipeline()), rank_(rank) {
  pipelineRank_ = rank.coordinates()[pipeline_.axis];
  lastStage_ = static_cast<int64_t>(pipeline_.stages.size()) - 1;
  pipelineGroup_ = &rank.group({pipeline_.axis});
  const auto &functions = bundle.functions();
  for (const PipelineStageInfo &info : pipeline_.stages) {
    if (info.rank != pipelineRank_)
      continue;
    Stage &stage = stageExecutors_[info.stage];
    stage.info = &info;
    stage.forward = stages_.executor(functions[info.forward].name);
    stage.backward = stages_.executor(functions[info.backward].name);
    stage.eval = stages_.executor(functions[info.eval].name);
  }
  // Every rank sums the same reported losses (all stages' names, in the
  // order they first appear: aux_loss first).
  for (const PipelineStageInfo &info : pipeline_.stages)
    for (const std::string &name : info.reportedOutputs()) {
      auto at = std::find_if(reported_.begin(), reported_.end(),
                             [&](const auto &r) { return r.first == name; });
      if (at == reported_.end())
        at = reported_.insert(at, {name, 0.0});
      auto stage = stageExecutors_.find(info.stage);
      if (stage != stageExecutors_.end())
        stage->second.reportedAt.push_back(
            static_cast<size_t>(at - reported_.begin()));
    }
  reportedValues_.resize(reported_.size());
  makeEmbeddingGroups();
}

template <typename Stages>
void ScheduleRunner<Stages>::makeEmbeddingGroups() {
  const std::vector<Parameter> &parameters = bundle_.parameters();
  for (size_t p = 0; p < parameters.size(); ++p) {
    const std::vector<int64_t> &ranks = parameters[p].pipelineRanks;
    if (ranks.size() < 2)
      continue;
    auto found = std::find_if(
        embeddingGroups_.begin(), embeddingGroups_.end(),
        [&](const EmbeddingGroup &g) { return g.pipelineRanks == ranks; });
    if (found == embeddingGroups_.end()) {
      embeddingGroups_.push_back({ranks, {}, nullptr});
      found = std::prev(embeddingGroups_.end());
    }
    found->parameters.push_back(p);
  }
  // One group per data- and tensor-parallel replica: its color is the world
  // rank of the replica's pipeline rank 0.
  for (EmbeddingGroup &group : embeddingGroups_) {
    bool member = std::find(group.pipelineRanks.begin(),
                            group.pipelineRanks.end(),
                            pipelineRank_) != group.pipelineRanks.end();
    group.communicator = rank_.world().split(
        member ? peerWorldRank(0) : comm::Communicator::kNoColor,
        static_cast<int>(pipelineRank_), "embedding",
        comm::CallInfo{"the pipeline's embedding groups", -1});
  }
}

template <typename Stages>
void ScheduleRunner<Stages>::reduceTiedGradients(uint64_t firstStep) {
  for (EmbeddingGroup &group : embeddingGroups_) {
    if (!group.communicator)
      continue;
    for (size_t p : group.parameters)
      stages_.allReduceGradient(
          *group.communicator, p,
          comm::CallInfo{"the gradient of " + bundle_.parameters()[p].name +
                             " over the embedding group",
                         static_cast<int64_t>(firstStep)});
  }
}

template <typename Stages>
int ScheduleRunner<Stages>::peerWorldRank(int64_t pipelineRank) const {
  std::vector<int64_t> coordinates = rank_.coordinates();
  coordinates[pipeline_.axis] = pipelineRank;
  int64_t linear = 0;
  for (size_t a = 0; a < coordinates.size(); ++a)
    linear = linear * rank_.gridShape()[a] + coordinates[a];
  return static_cast<int>(linear);
}

template <typename Stages>
double ScheduleRunner<Stages>::lossOverRanks(const char *label) {
  // The loss is on the last stage's rank; every rank reports it. Reading it
  // is where the host waits for the rank's work.
  // The loss, then each reported loss (aux_loss first, part of the loss).
  std::vector<double> sums(1 + reported_.size(), 0.0);
  for (const Tensor &micro : losses_)
    sums[0] += stages_.scalar(micro);
  for (size_t i = 0; i < reportedValues_.size(); ++i) {
    for (const Tensor &micro : reportedValues_[i])
      sums[1 + i] += stages_.scalar(micro);
    reportedValues_[i].clear();
  }
  losses_.clear();
  pipelineGroup_->allReduce<double>(sums.data(), sums.data(), sums.size(),
                                    comm::ReduceOp::Sum,
                                    comm::CallInfo{label, -1});
  for (size_t i = 0; i < reported_.size(); ++i)
    reported_[i].second = sums[1 + i];
  // aux_loss, the first name (a stage reports only after it), joins the
  // loss.
  double loss = sums[0] + (reported_.empty() ? 0.0 : reported_[0].second);
  // Every rank has passed its sends' receivers by now.
  stages_.sendsDone();
  return loss;
}

template <typename Stages>
int64_t ScheduleRunner<Stages>::takeSlot(const Key &key) {
  std::vector<bool> &taken = slotsTaken_[key.first];
  size_t slot = 0;
  while (slot < taken.size() && taken[slot])
    ++slot;
  if (slot == taken.size())
    taken.push_back(false);
  taken[slot] = true;
  slotOf_[key] = static_cast<int64_t>(slot);
  return static_cast<int64_t>(slot);
}

template <typename Stages>
int64_t ScheduleRunner<Stages>::releaseSlot(const Key &key) {
  auto found = slotOf_.find(key);
  int64_t slot = found->second;
  slotsTaken_[key.first][static_cast<size_t>(slot)] = false;
  slotOf_.erase(found);
  return slot;
}

template <typename Stages>
int64_t ScheduleRunner<Stages>::bytesOf(const std::vector<Tensor> &tensors) {
  int64_t bytes = 0;
  for (const Tensor &tensor : tensors) {
    host::TensorView view = stages_.view(tensor);
    int64_t elements = 1;
    for (int64_t size : view.shape)
      elements *= size;
    bytes += elements * static_cast<int64_t>(dtypeSize(view.dtype));
  }
  return bytes;
}

template <typename Stages>
double ScheduleRunner<Stages>::train(const MicroBatchSource &source,
                                     const MicroBatchKey &first,
                                     uint64_t globalBatch) {
  Clock::time_point start = Clock::now();
  DType floatType = stages_.floatType();
  using Kind = PipelineStep::Kind;
  const std::vector<PipelineStep> &steps = pipeline_.ranks[pipelineRank_];
  for (const PipelineStep &step : steps) {
    Key key{step.stage, step.microBatch};
    Stage &stage = stageExecutors_.at(step.stage);
    const Function &forward = stage.forward->function();
    const Function &backward = stage.backward->function();
    uint64_t m = static_cast<uint64_t>(step.microBatch);
    MicroBatchKey microBatch{first.step + m,
                             first.firstSample + m * globalBatch};
    auto info = [&](const std::string &text) {
      return comm::CallInfo{text, static_cast<int64_t>(microBatch.step)};
    };
    switch (step.kind) {
    case Kind::RecvActivation:
      inputs_[key] = stages_.receive(
          peerWorldRank(step.peer), forward.values[forward.inputs[0]],
          info(label("activation", step.stage - 1, step.microBatch)));
      break;
    case Kind::RecvGradient:
      outputGradients_[key] = stages_.receive(
          peerWorldRank(step.peer), backward.values[backward.inputs.back()],
          info(label("gradient", step.stage + 1, step.microBatch)));
      break;
    case Kind::SendActivation: {
      auto found = outputs_.find(key);
      stages_.send(peerWorldRank(step.peer), std::move(found->second),
                   info(label("activation", step.stage, step.microBatch)));
      outputs_.erase(found);
      break;
    }
    case Kind::SendGradient: {
      auto found = inputGradients_.find(key);
      stages_.send(peerWorldRank(step.peer), std::move(found->second),
                   info(label("gradient", step.stage, step.microBatch)));
      inputGradients_.erase(found);
      break;
    }
    case Kind::Forward: {
      std::vector<host::TensorView> inputs;
      std::pair<host::TensorView, host::TensorView> batch;
      if (step.stage == 0 || step.stage == lastStage_)
        batch = source(step.microBatch);
      inputs.push_back(step.stage == 0 ? batch.first
                                       : stages_.view(inputs_.at(key)));
      if (step.stage == lastStage_)
        inputs.push_back(batch.second);
      if (beforeFirstForward_ && step.microBatch == 0)
        beforeFirstForward_(stage.forward->function());
      std::vector<Tensor> outputs =
          stages_.run(*stage.forward, inputs, microBatch, takeSlot(key),
                      /*readsStash=*/false);
      inputs_.erase(key);
      if (step.stage == lastStage_)
        losses_.push_back(std::move(outputs[0]));
      else
        outputs_[key] = std::move(outputs[0]);
      outputs.erase(outputs.begin());
      // A stage's MoE auxiliary losses join the micro-batch's loss, and
      // its reported losses are logged (summed over the pipeline ranks at
      // the schedule's end).
      for (size_t at : stage.reportedAt) {
        reportedValues_[at].push_back(std::move(outputs[0]));
        outputs.erase(outputs.begin());
      }
      stashBytes_ += bytesOf(outputs);
      peakStashBytes_ = std::max(peakStashBytes_, stashBytes_);
      stash_[key] = std::move(outputs);
      break;
    }
    case Kind::Backward: {
      std::vector<host::TensorView> inputs;
      for (const Tensor &stashed : stash_.at(key))
        inputs.push_back(stages_.view(stashed));
      // The last stage's loss gradient is 1 (times fp16's loss scale): the
      // optimizer divides the accumulated gradients by the micro-batches,
      // as Megatron-LM does.
      host::Tensor seed(floatType, {});
      if (floatType == DType::F64)
        seed.data<double>()[0] = lossScale_;
      else
        seed.data<float>()[0] = static_cast<float>(lossScale_);
      inputs.push_back(step.stage == lastStage_
                           ? host::TensorView{seed.dtype, seed.shape,
                                              seed.buffer.data()}
                           : stages_.view(outputGradients_.at(key)));
      bool observed = lastBackwardObserver_ &&
                      step.microBatch + 1 == pipeline_.microBatches;
      if (observed) {
        const std::string &name = stage.backward->function().name;
        stage.backward->setInstructionObserver([this, &name](size_t position) {
          lastBackwardObserver_(name, position);
        });
      }
      std::vector<Tensor> outputs =
          stages_.run(*stage.backward, inputs, microBatch, releaseSlot(key),
                      /*readsStash=*/true);
      if (observed)
        stage.backward->setInstructionObserver(nullptr);
      stashBytes_ -= bytesOf(stash_.at(key));
      stash_.erase(key);
      outputGradients_.erase(key);
      if (step.stage > 0)
        inputGradients_[key] = std::move(outputs[0]);
      break;
    }
    }
  }
  // Megatron-LM's embedding group all-reduce, after the last backward pass.
  reduceTiedGradients(first.step);
  double loss = lossOverRanks("pipeline loss");
  computeSeconds_ += stages_.takeComputeSeconds();
  wallSeconds_ += since(start);
  return loss;
}

template <typename Stages>
double ScheduleRunner<Stages>::evaluate(const MicroBatchSource &source,
                                        int64_t microBatches) {
  for (int64_t m = 0; m < microBatches; ++m) {
    Tensor activation;
    for (int64_t k = 0; k <= lastStage_; ++k) {
      auto found = stageExecutors_.find(k);
      if (found == stageExecutors_.end())
        continue;
      auto &eval = *found->second.eval;
      const Function &function = eval.function();
      int64_t previous = (k - 1) % pipeline_.size;
      int64_t next = (k + 1) % pipeline_.size;
      if (k > 0)
        activation = stages_.receive(
            peerWorldRank(previous), function.values[function.inputs[0]],
            comm::CallInfo{label("eval activation", k - 1, m), 0});
      std::pair<host::TensorView, host::TensorView> batch;
      if (k == 0 || k == lastStage_)
        batch = source(m);
      std::vector<host::TensorView> inputs = {
          k == 0 ? batch.first : stages_.view(activation)};
      if (k == lastStage_)
        inputs.push_back(batch.second);
      std::vector<Tensor> outputs =
          stages_.run(eval, inputs, {}, /*slot=*/0, /*readsStash=*/false);
      if (k == lastStage_)
        losses_.push_back(std::move(outputs[0]));
      else
        stages_.send(peerWorldRank(next), std::move(outputs[0]),
                     comm::CallInfo{label("eval activation", k, m), 0});
    }
  }
  double loss = lossOverRanks("pipeline eval loss");
  (void)stages_.takeComputeSeconds(); // not the training's
  return loss;
}

template <typename Stages>
std::optional<typename ScheduleRunner<Stages>::Tensor>
ScheduleRunner<Stages>::predict(const host::TensorView &tokens) {
  std::optional<Tensor> logits;
  Tensor activation;
  for (int64_t k = 0; k <= lastStage_; ++k) {
    auto found = stageExecutors_.find(k);
    if (found == stageExecutors_.end())
      continue;
    Stage &stage = found->second;
    if (!stage.predict) {
      if (!stage.info->predict)
        throw Error(MTRT_STATUS_NOT_FOUND,
                    "bundle '" + bundle_.name() + "': pipeline stage " +
                        std::to_string(k) +
                        " has no predict function (the bundle was written "
                        "before format version 11); recompile it with "
                        "megatron-compile");
      stage.predict =
          stages_.executor(bundle_.functions()[*stage.info->predict].name,
                           /*sharedArena=*/false);
    }
    const Function &function = stage.predict->function();
    if (k > 0)
      activation = stages_.receive(
          peerWorldRank((k - 1) % pipeline_.size),
          function.values[function.inputs[0]],
          comm::CallInfo{label("predict activation", k - 1, 0), 0});
    std::vector<Tensor> outputs = stages_.run(
        *stage.predict, {k == 0 ? tokens : stages_.view(activation)}, {},
        /*slot=*/0, /*readsStash=*/false);
    if (k == lastStage_)
      logits = std::move(outputs[0]);
    else
      stages_.send(peerWorldRank((k + 1) % pipeline_.size),
                   std::move(outputs[0]),
                   comm::CallInfo{label("predict activation", k, 0), 0});
  }
  // The activations' sends are done and the fault word read (the GPU).
  stages_.sendsDone();
  (void)stages_.takeComputeSeconds(); // not the training's
  return logits;
}

template <typename Stages>
std::vector<double> ScheduleRunner<Stages>::gatherIdleFractions() {
  std::vector<double> fractions(static_cast<size_t>(pipeline_.size), 0.0);
  int64_t replicas = rank_.world().size() / pipeline_.size;
  fractions[pipelineRank_] = idleFraction() / static_cast<double>(replicas);
  rank_.world().allReduce<double>(fractions.data(), fractions.data(),
                                  pipeline_.size, comm::ReduceOp::Sum,
                                  comm::CallInfo{"pipeline idle fractions", -1});
  return fractions;
}

template <typename Stages>
std::string ScheduleRunner<Stages>::describeIdleFractions() {
  std::vector<double> measured = gatherIdleFractions();
  const std::vector<double> &predicted = pipeline_.predictedIdleFraction;
  std::string line = "pipeline " + pipeline_.schedule +
                     " idle fraction per pipeline rank, measured (predicted):";
  char number[32];
  for (size_t r = 0; r < measured.size(); ++r) {
    std::snprintf(number, sizeof(number), " %.3f", measured[r]);
    line += number;
    if (r < predicted.size()) {
      std::snprintf(number, sizeof(number), " (%.3f)", predicted[r]);
      line += number;
    }
  }
  return line;
}

} // namespace mtrt::pipeline

#endif // MTRT_SRC_PIPELINE_SCHEDULERUNNER_H
