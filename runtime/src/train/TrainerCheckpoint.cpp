// The trainer's side of checkpoints: what it saves, and restoring it; the
// parts the C API's sessions share (train/Checkpoint.h).
#include "train/Trainer.h"

#include "comm/RankContext.h"
#include "host/ParameterStore.h"
#include "train/DataParallelBuffer.h"
#include "train/DistributedOptimizer.h"
#include "train/Optimizer.h"
#include "train/TrainingLog.h"
#include "train/TrainingLoop.h"
#include "train/Weights.h"

#include <filesystem>
#include <sstream>
#include <tuple>

namespace mtrt::train {

namespace {

const char *styleName(host::LrDecayStyle style) {
  switch (style) {
  case host::LrDecayStyle::Constant:
    return "constant";
  case host::LrDecayStyle::Linear:
    return "linear";
  case host::LrDecayStyle::Cosine:
    return "cosine";
  }
  return "?";
}

/// The flag that sets each optimizer hyper-parameter of the manifest.
const std::pair<const char *, const char *> kHyperParameterFlags[] = {
    {"lr", "--lr"},
    {"min_lr", "--min-lr"},
    {"lr_decay_style", "--lr-decay-style"},
    {"lr_decay_iters", "--lr-decay-iters (default --train-iters)"},
    {"lr_warmup_iters", "--lr-warmup-iters or --lr-warmup-fraction"},
    {"lr_warmup_init", "--lr-warmup-init"},
    {"weight_decay", "--weight-decay"},
    {"adam_beta1", "--adam-beta1"},
    {"adam_beta2", "--adam-beta2"},
    {"adam_eps", "--adam-eps"},
    {"clip_grad", "--clip-grad"},
};

std::string layoutText(const CheckpointState &s) {
  return "TP" + std::to_string(s.tensorModelParallelSize) + " PP" +
         std::to_string(s.pipelineModelParallelSize) + " DP" +
         std::to_string(s.dataParallelSize);
}

} // namespace

std::vector<CheckpointTensor>
storeCheckpointTensors(host::ParameterStore &store, bool severalRanks,
                       DistributedOptimizer *distributed,
                       DataParallelBuffer *buffer) {
  if (store.floatType() != DType::F32)
    throw Error(MTRT_STATUS_UNIMPLEMENTED,
                "checkpoints hold f32 tensors; this trainer computes in " +
                    std::string(dtypeName(store.floatType())));
  const std::vector<int64_t> &coordinates = store.coordinates();
  // One replica of each piece saves it: the rank at coordinate 0 of every
  // grid axis that splits neither the parameter nor, in `alsoSplitting`,
  // the piece (the distributed optimizer's data axes). A pipeline bundle's
  // axis 0 splits the parameters among their owners: a table tied across
  // stages is saved by its owner (pipeline_rank) only.
  auto saves = [&](const Parameter &p,
                   const std::vector<int64_t> &alsoSplitting) {
    for (size_t axis = 0; severalRanks && axis < coordinates.size(); ++axis) {
      if (axis == 0 && p.pipelineRank >= 0) {
        if (coordinates[0] != p.pipelineRank)
          return false;
        continue;
      }
      bool splits = false;
      for (const auto &axes : p.splitAxes)
        for (int64_t a : axes)
          splits |= a == static_cast<int64_t>(axis);
      for (int64_t a : alsoSplitting)
        splits |= a == static_cast<int64_t>(axis);
      if (!splits && coordinates[axis] != 0)
        return false;
    }
    return true;
  };
  // Every rank names every tensor; a piece the rank does not hold (another
  // pipeline rank's parameter, a moment outside its range of the gradient
  // buffer) is an empty flat range, which saves and loads nothing.
  auto empty = [](CheckpointTensor t) {
    t.slice.flat = std::make_pair(int64_t(0), int64_t(0));
    t.data = nullptr;
    t.save = false;
    return t;
  };
  std::vector<CheckpointTensor> tensors;
  std::vector<CheckpointTensor> shards(store.size());
  for (size_t i = 0; i < store.size(); ++i) {
    const Parameter &p = store.info(i);
    CheckpointTensor &t = shards[i];
    t.globalShape = p.type.shape;
    t.slice.offsets = store.shardOffsets(i);
    t.slice.shape = p.localType.shape;
    t.vocabularyRows = isVocabularyTable(p.name);
    t.save = saves(p, {});
    std::vector<std::pair<const char *, host::Tensor *>> kinds = {
        {"model/", &store.value(i)}};
    if (!distributed) {
      kinds.push_back({"optimizer/exp_avg/", &store.expAvg(i)});
      kinds.push_back({"optimizer/exp_avg_sq/", &store.expAvgSq(i)});
    }
    for (auto [prefix, tensor] : kinds) {
      CheckpointTensor piece = t;
      piece.name = prefix + p.name;
      piece.data = tensor->data<float>();
      tensors.push_back(store.holds(i) ? std::move(piece)
                                              : empty(std::move(piece)));
    }
  }
  // The distributed optimizer's moments: the rank's range of the gradient
  // buffer, in pieces that are flat ranges of the parameters' shards.
  if (distributed) {
    std::vector<DataParallelBuffer::Piece> pieces = buffer->pieces();
    std::vector<bool> held(store.size(), false);
    for (const DataParallelBuffer::Piece &piece : pieces)
      held[piece.parameter] = true;
    for (const DataParallelBuffer::Piece &piece : pieces) {
      const Parameter &p = store.info(piece.parameter);
      for (auto [prefix, tensor] :
           {std::pair<const char *, host::Tensor *>{
                "optimizer/exp_avg/", &distributed->expAvg()},
            {"optimizer/exp_avg_sq/", &distributed->expAvgSq()}}) {
        CheckpointTensor t = shards[piece.parameter];
        t.name = prefix + p.name;
        t.slice.flat = std::make_pair(piece.parameterOffset,
                                      piece.parameterOffset + piece.count);
        t.data = tensor->data<float>() + piece.shardOffset;
        t.save = piece.count > 0 && saves(p, buffer->gridAxes());
        tensors.push_back(std::move(t));
      }
    }
    // Parameters outside the buffer (expert parallelism's experts): their
    // moments whole on the rank, saved as the parameter is.
    const std::vector<size_t> &local = distributed->localParameters();
    for (size_t k = 0; k < local.size(); ++k) {
      size_t i = local[k];
      held[i] = true;
      for (auto [prefix, tensor] :
           {std::pair<const char *, host::Tensor *>{
                "optimizer/exp_avg/", &distributed->localExpAvg(k)},
            {"optimizer/exp_avg_sq/", &distributed->localExpAvgSq(k)}}) {
        CheckpointTensor t = shards[i];
        t.name = prefix + store.info(i).name;
        t.data = tensor->data<float>();
        tensors.push_back(std::move(t));
      }
    }
    for (size_t i = 0; i < held.size(); ++i)
      if (!held[i])
        for (const char *prefix : {"optimizer/exp_avg/", "optimizer/exp_avg_sq/"}) {
          CheckpointTensor t = empty(shards[i]);
          t.name = prefix + store.info(i).name;
          tensors.push_back(std::move(t));
        }
  }
  // FP8's delayed-scaling state, by meta name: "fp8/<meta>/scale" [1] and
  // "fp8/<meta>/amax_history" [amax_history_len]. The ranks that cast with
  // a meta hold the same state (the step's amaxes are all-reduced before
  // the updates), so one of them saves it: the rank at coordinate 0 of
  // every axis, but in a pipeline bundle the meta's pipeline rank on axis
  // 0. Every rank loads every meta whole: a checkpoint reshards to any
  // layout with the same metas.
  if (store.hasFp8()) {
    Fp8State &state = store.fp8();
    const Fp8Settings &settings = state.settings();
    int64_t length = state.historyLength();
    for (size_t meta = 0; meta < state.size(); ++meta) {
      bool first = true;
      int64_t pipelineRank = settings.metas[meta].pipelineRank;
      for (size_t axis = 0; severalRanks && axis < coordinates.size(); ++axis)
        first = first && coordinates[axis] ==
                             (axis == 0 && pipelineRank >= 0 ? pipelineRank
                                                             : 0);
      for (auto [suffix, data, count] :
           {std::tuple<const char *, float *, int64_t>{
                "/scale", state.mutableScales().data() + meta, 1},
            {"/amax_history",
             state.mutableHistories().data() + meta * size_t(length),
             length}}) {
        CheckpointTensor t;
        t.name = "fp8/" + settings.metas[meta].name + suffix;
        t.globalShape = {count};
        t.slice = wholeTensor(t.globalShape);
        t.data = data;
        t.save = first;
        tensors.push_back(std::move(t));
      }
    }
  }
  return tensors;
}


nlohmann::json optimizerState(const OptimizerConfig &config) {
  const host::LrSchedule &s = config.schedule;
  return {{"name", "adamw"},
          {"lr", s.maxLr},
          {"min_lr", s.minLr},
          {"lr_decay_style", styleName(s.style)},
          {"lr_decay_iters", s.decayIters},
          {"lr_warmup_iters", s.warmupIters},
          {"lr_warmup_init", s.warmupInitLr},
          {"weight_decay", config.weightDecay},
          {"adam_beta1", config.beta1},
          {"adam_beta2", config.beta2},
          {"adam_eps", config.eps},
          {"clip_grad", config.clipGrad}};
}

std::string optimizerDifferences(const nlohmann::json &saved,
                                 const nlohmann::json &current) {
  std::string differences;
  for (auto [key, flag] : kHyperParameterFlags) {
    const nlohmann::json *was = saved.contains(key) ? &saved[key] : nullptr;
    const nlohmann::json &now = current[key];
    if (!was || *was != now)
      differences += std::string(differences.empty() ? "" : "; ") + key +
                     " is " + (was ? was->dump() : "absent") +
                     " in the checkpoint and " + now.dump() + " here (" +
                     flag + ")";
  }
  return differences;
}

std::vector<CheckpointTensor> Trainer::checkpointTensors() {
  return storeCheckpointTensors(*parameters_, rank_ != nullptr,
                                distributedOptimizer_.get(),
                                gradientBuffer_.get());
}

CheckpointState Trainer::checkpointState(int64_t iteration,
                                         int64_t consumed) const {
  const ModelConfig &model = bundle_.model();
  CheckpointState state;
  state.iteration = iteration;
  state.consumedSamples = consumed;
  state.seed = options_.seed;
  state.microStep = static_cast<uint64_t>(iteration * microBatches_);
  state.optimizerStep = iteration - skippedIterations_;
  state.optimizer = optimizerState(optimizerConfig_);
  state.lossScale = lossScaler_ ? lossScaler_->state()
                                : nlohmann::json{{"kind", "none"},
                                                 {"scale", 1.0}};
  state.dataPath = corpusName_;
  state.split = options_.split;
  state.globalBatchSize = globalBatch_;
  state.microBatchesPerIteration = microBatches_;
  state.tensorModelParallelSize = model.tensorModelParallelSize;
  state.pipelineModelParallelSize = model.pipelineModelParallelSize;
  state.dataParallelSize = model.dataParallelSize;
  state.distributedOptimizer = distributedOptimizer_ != nullptr;
  state.grid = bundle_.gridShape();
  recordBundle(state, bundle_);
  return state;
}

void Trainer::checkSaveDirectory() const {
  namespace fs = std::filesystem;
  std::error_code ec;
  // The multiples of --save-interval after the start, and the last.
  std::vector<int64_t> saved;
  if (options_.saveInterval > 0)
    for (int64_t i = (startIteration_ / options_.saveInterval + 1) *
                     options_.saveInterval;
         i < options_.trainIters; i += options_.saveInterval)
      saved.push_back(i);
  if (options_.trainIters > startIteration_)
    saved.push_back(options_.trainIters);
  for (int64_t i : saved) {
    std::string dir =
        (fs::path(options_.save) / iterationDirectoryName(i)).string();
    if (fs::exists(dir, ec))
      throw Error(MTRT_STATUS_ALREADY_EXISTS,
                  "--save: '" + dir + "' already exists and this run would "
                  "save iteration " + std::to_string(i) +
                  " there; an existing checkpoint is never overwritten: "
                  "resume from it with --load " + options_.save +
                  ", move it away, or pass another --save directory");
  }
}

LoopStart Trainer::prepareCheckpoints(TrainingLog &log) {
  if (!options_.load.empty())
    loadCheckpoint(options_.load, log);
  if (!options_.save.empty())
    checkSaveDirectory();
  if (startIteration_ >= options_.trainIters)
    log.line("the checkpoint is at iteration " +
             std::to_string(startIteration_) + ", --train-iters is " +
             std::to_string(options_.trainIters) + ": nothing to train");
  return LoopStart{startIteration_, startConsumed_};
}

void Trainer::saveCheckpoint(int64_t iteration, int64_t consumed,
                             TrainingLog &log) {
  std::vector<CheckpointTensor> tensors = checkpointTensors();
  CheckpointState state = checkpointState(iteration, consumed);
  log.line("saving checkpoint at iteration " + std::to_string(iteration) +
           " to " + options_.save);
  std::string dir = train::saveCheckpoint(options_.save, state, tensors,
                                          rank_ ? &rank_->world() : nullptr);
  log.line("  successfully saved checkpoint from iteration " +
           std::to_string(iteration) + " to " + dir + " [ " +
           layoutText(state) + " ]");
}

void Trainer::loadCheckpoint(const std::string &dir, TrainingLog &log) {
  std::vector<std::string> notes;
  std::optional<std::string> found = train::findLatestCheckpoint(dir, notes);
  for (const std::string &note : notes)
    log.line(note);
  if (!found) {
    log.line("WARNING: could not find a checkpoint in --load " + dir +
             "; training from the seeded initialization");
    return;
  }
  log.line("loading checkpoint from " + *found);
  CheckpointManifest manifest = readCheckpointManifest(*found);
  const CheckpointState &saved = manifest.state;
  CheckpointState current = checkpointState(saved.iteration, 0);
  std::string where = "--load: checkpoint '" + *found + "'";
  bool continues = !startsRun(saved);
  if (continues && saved.seed != current.seed)
    throw Error(MTRT_STATUS_INVALID_ARGUMENT,
                where + " was trained with --seed " +
                    std::to_string(saved.seed) + ", this run has --seed " +
                    std::to_string(current.seed) +
                    " (the seed fixes the data order and dropout); pass "
                    "--seed " + std::to_string(saved.seed) + " to resume");
  std::string differences =
      continues ? optimizerDifferences(saved.optimizer, current.optimizer) : "";
  if (!differences.empty())
    throw Error(MTRT_STATUS_INVALID_ARGUMENT,
                where + ": the optimizer's hyper-parameters differ: " +
                    differences +
                    "; pass the checkpoint's values to resume its schedule");
  if (saved.bundleSha256 != current.bundleSha256)
    log.line("note: the checkpoint was saved from bundle '" +
             saved.bundleName + "' (" + layoutText(saved) +
             "); resharding it for '" + current.bundleName + "' (" +
             layoutText(current) + ")");

  std::vector<CheckpointTensor> tensors = checkpointTensors();
  bool leader = !rank_ || rank_->rank() == 0;
  loadCheckpointTensors(manifest, tensors, leader);
  if (saved.optimizerStep < 0 || saved.optimizerStep > saved.iteration)
    throw Error(MTRT_STATUS_DATA_LOSS,
                where + ": optimizer_step is " +
                    std::to_string(saved.optimizerStep) +
                    ", expected the updates of its " +
                    std::to_string(saved.iteration) +
                    " iterations (0 to the iteration)");
  // fp16 iterations that skipped their update: the schedule and AdamW
  // continue from the checkpoint's update count.
  skippedIterations_ = saved.iteration - saved.optimizerStep;
  if (lossScaler_)
    log.line("  loss scaling resumes with " +
             lossScaler_->restore(saved.lossScale));
  startIteration_ = saved.iteration;
  startConsumed_ = saved.consumedSamples;
  // The generator's position follows from the iteration in this layout.
  microStep_ = static_cast<uint64_t>(saved.iteration * microBatches_);
  log.line("  successfully loaded checkpoint from " + *found + " [ " +
           layoutText(saved) + " ] at iteration " +
           std::to_string(saved.iteration));
}

} // namespace mtrt::train
