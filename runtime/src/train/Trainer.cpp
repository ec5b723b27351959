// The training loop: checks, initialization, micro-batches, optimizer steps,
// evaluation, sampling.
#include "train/Trainer.h"
#include "train/TrainingLoop.h"

#include "comm/RankContext.h"
#include "host/Executor.h"
#include "host/ParameterStore.h"
#include "host/ThreadPool.h"
#include "pipeline/PipelineRunner.h"
#include "train/ByteTokenizer.h"
#include "train/DataParallelBuffer.h"
#include "train/DistributedOptimizer.h"
#include "train/GptDataset.h"
#include "train/TokenSampler.h"
#include "train/Optimizer.h"
#include "train/TrainingLog.h"

#include <algorithm>
#include <cmath>
#include <ostream>
#include <sstream>

namespace mtrt::train {

namespace {

[[noreturn]] void invalid(const std::string &message) {
  throw Error(MTRT_STATUS_INVALID_ARGUMENT, message);
}

std::string str(double value) {
  std::ostringstream s;
  s << value;
  return s.str();
}

/// The checks Megatron-LM's argument parser and OptimizerParamScheduler
/// make, as messages that name the flag.
host::LrSchedule makeSchedule(const TrainerOptions &o) {
  if (o.trainIters < 1)
    invalid("--train-iters: found " + std::to_string(o.trainIters) +
            ", expected an integer >= 1");
  if (!(o.lr >= 0) || !std::isfinite(o.lr))
    invalid("--lr: found " + str(o.lr) +
            ", expected a learning rate >= 0 "
            "(e.g. --lr 6e-4)");
  if (!(o.minLr >= 0) || o.minLr > o.lr)
    invalid("--min-lr: found " + str(o.minLr) +
            ", expected a rate in [0, --lr] = [0, " + str(o.lr) + "]");
  if (!(o.lrWarmupInit >= 0) || o.lrWarmupInit > o.lr)
    invalid("--lr-warmup-init: found " + str(o.lrWarmupInit) +
            ", expected a rate in [0, --lr]");
  host::LrSchedule s;
  s.maxLr = o.lr;
  s.minLr = o.minLr;
  s.warmupInitLr = o.lrWarmupInit;
  s.style = o.lrDecayStyle;
  s.decayIters = o.lrDecayIters ? o.lrDecayIters : o.trainIters;
  if (s.decayIters < 1)
    invalid("--lr-decay-iters: found " + std::to_string(o.lrDecayIters) +
            ", expected an integer >= 1 (default: --train-iters)");
  if (o.lrWarmupFraction) {
    if (o.lrWarmupIters != 0)
      invalid("--lr-warmup-fraction and --lr-warmup-iters are both set; "
              "give only one");
    if (!(*o.lrWarmupFraction >= 0 && *o.lrWarmupFraction < 1))
      invalid("--lr-warmup-fraction: found " + str(*o.lrWarmupFraction) +
              ", expected a fraction of --lr-decay-iters in [0, 1)");
    s.warmupIters = static_cast<int64_t>(*o.lrWarmupFraction *
                                         static_cast<double>(s.decayIters));
  } else {
    s.warmupIters = o.lrWarmupIters;
  }
  if (s.warmupIters < 0 || s.warmupIters >= s.decayIters)
    invalid("--lr-warmup-iters: found " + std::to_string(s.warmupIters) +
            " warmup iterations, expected fewer than --lr-decay-iters (" +
            std::to_string(s.decayIters) + ") and >= 0");
  return s;
}

void checkOptions(const TrainerOptions &o) {
  auto positive = [](const char *flag, int64_t value) {
    if (value < 1)
      invalid(std::string(flag) + ": found " + std::to_string(value) +
              ", expected an integer >= 1");
  };
  positive("--log-interval", o.logInterval);
  if (o.evalInterval < 0)
    invalid("--eval-interval: found " + std::to_string(o.evalInterval) +
            ", expected an integer >= 0 (0 disables evaluation)");
  if (o.evalIters < 0)
    invalid("--eval-iters: found " + std::to_string(o.evalIters) +
            ", expected an integer >= 0");
  if (!(o.weightDecay >= 0))
    invalid("--weight-decay: found " + str(o.weightDecay) +
            ", expected a coefficient >= 0");
  for (auto [flag, beta] :
       {std::pair<const char *, double>{"--adam-beta1", o.adamBeta1},
        {"--adam-beta2", o.adamBeta2}})
    if (!(beta >= 0 && beta < 1))
      invalid(std::string(flag) + ": found " + str(beta) +
              ", expected a value in [0, 1)");
  if (!(o.adamEps > 0))
    invalid("--adam-eps: found " + str(o.adamEps) + ", expected a value > 0");
  if (!(o.clipGrad >= 0))
    invalid("--clip-grad: found " + str(o.clipGrad) +
            ", expected a norm >= 0 (0 disables clipping)");
}

} // namespace

Trainer::Trainer(const Bundle &bundle, std::string corpus,
                 std::string corpusName, const TrainerOptions &options,
                 comm::RankContext *rank)
    : bundle_(bundle), options_(options), rank_(rank),
      corpus_(std::move(corpus)), corpusName_(std::move(corpusName)) {
  checkOptions(options_);
  OptimizerConfig &optimizer = optimizerConfig_;
  optimizer.schedule = makeSchedule(options_);
  optimizer.weightDecay = options_.weightDecay;
  optimizer.beta1 = options_.adamBeta1;
  optimizer.beta2 = options_.adamBeta2;
  optimizer.eps = options_.adamEps;
  optimizer.clipGrad = options_.clipGrad;

  if (!bundle.hasModel())
    invalid("bundle '" + bundle.name() +
            "' has no model section (it was translated from IR without the "
            "module attribute mt.model); compile the model with "
            "megatron-compile, or start from its --emit mlir, which carries "
            "the attribute (docs/PassPipelines.md)");
  const ModelConfig &model = bundle.model();
  if (bundle.rankCount() > 1 && !rank_)
    throw Error(MTRT_STATUS_UNIMPLEMENTED,
                "bundle '" + bundle.name() + "' is compiled for " +
                    std::to_string(bundle.rankCount()) + " ranks (grid " +
                    shapeString(bundle.gridShape()) +
                    "); run them with megatron-train --in-process-ranks");
  bool runsRanks = rank_ && bundle.hasGrid();
  if (runsRanks) {
    if (rank_->gridShape() != bundle.gridShape())
      invalid("bundle '" + bundle.name() + "': its grid is " +
              shapeString(bundle.gridShape()) + " but the rank's is " +
              shapeString(rank_->gridShape()));
    // A pipeline bundle's grid is [pp, dp, tp], the others' [dp, tp] (with
    // the context axis before the tensor axis under context parallelism;
    // under expert parallelism over part of the data-parallel ranks the
    // data axis is two, [edp, ep]).
    std::vector<int64_t> dataAxes =
        gridDataAxes(bundle.gridShape(), bundle.pipeline() != nullptr,
                     model.dataParallelSize);
    int64_t dataRanks = gridGroupSize(bundle.gridShape(), dataAxes);
    if (model.dataParallelSize > 1 && dataRanks != model.dataParallelSize)
      invalid("bundle '" + bundle.name() + "': model.data_parallel_size is " +
              std::to_string(model.dataParallelSize) + " but the grid " +
              shapeString(bundle.gridShape()) + " has " +
              std::to_string(dataRanks) + " data-parallel ranks; recompile it");
    dataParallel_ = model.dataParallelSize;
    dataRank_ =
        dataParallel_ > 1
            ? gridGroupIndex(bundle.gridShape(), rank_->coordinates(), dataAxes)
            : 0;
  }
  if (!runsRanks &&
      (model.tensorModelParallelSize != 1 ||
       model.pipelineModelParallelSize != 1 || model.dataParallelSize != 1))
    throw Error(MTRT_STATUS_UNIMPLEMENTED,
                "bundle '" + bundle.name() +
                    "' is compiled for tensor x "
                    "pipeline x data parallel sizes " +
                    std::to_string(model.tensorModelParallelSize) + " x " +
                    std::to_string(model.pipelineModelParallelSize) + " x " +
                    std::to_string(model.dataParallelSize) +
                    "; this trainer runs one rank: compile with all three "
                    "sizes 1");
  vocabSize_ = model.vocabSize;
  tokenizer_ = data::makeTokenizer(options_.tokenizer);
  // A text corpus never holds the end-of-document token; the vocabulary
  // needs every other id.
  int64_t textVocab = tokenizer_->vocabSize() -
                      (tokenizer_->eod() == tokenizer_->vocabSize() - 1);
  if (options_.dataBlend.empty() && model.vocabSize < textVocab)
    invalid("bundle '" + bundle.name() + "': model.vocab_size is " +
            std::to_string(model.vocabSize) + "; the " +
            tokenizer_->typeName() + " needs at least " +
            std::to_string(textVocab) +
            " tokens: compile the model with vocab_size " +
            std::to_string(textVocab) + " or more");
  // A pipeline bundle's first stage reads the tokens.
  const Function *train =
      bundle.pipeline()
          ? &bundle.functions()[bundle.pipeline()->stages.front().forward]
          : bundle.findFunction("train_step");
  if (!train)
    throw Error(MTRT_STATUS_NOT_FOUND,
                "bundle '" + bundle.name() +
                    "' has no train_step; compile "
                    "it with megatron-compile (which emits train_step)");
  const TensorType &tokens = train->values[train->inputs[0]];
  microBatch_ = tokens.shape[0];
  localSeq_ = tokens.shape[1];
  // Context parallelism: the bundle's context-parallel instructions name
  // the grid axis (context_axis) whose ranks split every sequence into
  // load-balanced chunks; the step's tokens are a rank's two chunks. A
  // pipeline's first and last stages read them through readMicroBatch, as
  // train_step does.
  for (const Function &function : bundle.functions())
    for (const Instruction &inst : function.instructions)
      if (inst.attrs.contextSize > 1) {
        if (contextSize_ > 1 && inst.attrs.contextSize != contextSize_)
          invalid("bundle '" + bundle.name() + "': its context-parallel "
                  "instructions name context_size " +
                  std::to_string(contextSize_) + " and " +
                  std::to_string(inst.attrs.contextSize) +
                  "; recompile it");
        contextSize_ = inst.attrs.contextSize;
        if (runsRanks)
          contextRank_ =
              rank_->coordinates()[static_cast<size_t>(inst.attrs.contextAxis)];
      }
  if (contextSize_ > 1 && !runsRanks)
    invalid("bundle '" + bundle.name() + "' is context-parallel over " +
            std::to_string(contextSize_) +
            " ranks; run it with megatron-train --in-process-ranks");
  seqLength_ = localSeq_ * contextSize_;
  if (options_.microBatchSize && options_.microBatchSize != microBatch_)
    invalid("--micro-batch-size: found " +
            std::to_string(options_.microBatchSize) + ", but bundle '" +
            bundle.name() + "' is compiled for micro-batches of " +
            std::to_string(microBatch_) +
            "; recompile it with megatron-compile --micro-batch-size " +
            std::to_string(options_.microBatchSize) + ", or drop the flag");
  idType_ = tokens.dtype;
  globalBatch_ = options_.globalBatchSize ? options_.globalBatchSize
                                          : model.globalBatchSize;
  int64_t perStep = microBatch_ * model.dataParallelSize;
  if (globalBatch_ < 1 || perStep < 1 || globalBatch_ % perStep != 0)
    invalid("--global-batch-size: found " + std::to_string(globalBatch_) +
            ", expected a positive multiple of micro-batch size x data "
            "parallel size = " +
            std::to_string(microBatch_) + " x " +
            std::to_string(model.dataParallelSize) +
            " (the micro-batch size is fixed when the bundle is compiled)");
  microBatches_ = globalBatch_ / perStep;
  if (bundle.pipeline() && microBatches_ != bundle.pipeline()->microBatches)
    invalid("--global-batch-size: found " + std::to_string(globalBatch_) +
            ", but bundle '" + bundle.name() + "''s pipeline schedule is " +
            "compiled for " + std::to_string(bundle.pipeline()->microBatches) +
            " micro-batches per iteration (global batch " +
            std::to_string(bundle.pipeline()->microBatches * perStep) +
            "); pass that, or recompile with the global batch size you want");

  bool wantEval = options_.evalInterval > 0 && options_.evalIters > 0;
  // Pipeline bundles evaluate through their schedule, others by eval_step.
  bool evaluates =
      wantEval && (bundle.pipeline() || bundle.findFunction("eval_step"));
  if (options_.dataBlend.empty()) {
    // A text corpus: tokenized whole, split by tokens as --split.
    auto stream = std::make_shared<std::vector<int32_t>>(
        tokenizer_->encode(corpus_));
    auto ranges = splitRanges(parseSplit(options_.split),
                              static_cast<int64_t>(stream->size()));
    trainData_ = std::make_unique<GptDataset>(
        stream, ranges[0].first, ranges[0].second, seqLength_, options_.seed,
        true,
        "the training split of '" + corpusName_ + "' (--split " +
            options_.split + ")");
    if (evaluates)
      validData_ = std::make_unique<GptDataset>(
          stream, ranges[1].first, ranges[1].second, seqLength_,
          options_.seed, false,
          "the validation split of '" + corpusName_ + "' (--split " +
              options_.split +
              "; or pass --eval-iters 0 to train without evaluation)");
  } else {
    // Indexed datasets, sampled as Megatron-LM's GPTDataset for the samples
    // the run reads (evaluations read the same first ones each time).
    auto parts = data::buildGptDatasets(
        options_.dataBlend, options_.split, seqLength_,
        {options_.trainIters * globalBatch_,
         evaluates ? options_.evalIters * globalBatch_ : 0, 0},
        options_.seed);
    trainData_ = std::move(parts[0]);
    validData_ = std::move(parts[1]);
    if (!trainData_)
      invalid("--split " + options_.split +
              " leaves nothing to train on; give the first part a share");
    if (evaluates && !validData_)
      invalid("--split " + options_.split +
              " has no validation part; give the second part a share, or "
              "pass --eval-iters 0 to train without evaluation");
  }
  pool_ = std::make_unique<host::ThreadPool>(options_.threads);
  // The distributed optimizer holds AdamW's moments for the rank's range of
  // the gradient buffer only, not in the store.
  bool distributed = runsRanks && bundle.hasGradientBuffer() &&
                     bundle.gradientBuffer().distributedOptimizer;
  parameters_ = std::make_unique<host::ParameterStore>(
      bundle, options_.floatType,
      runsRanks ? rank_->coordinates() : std::vector<int64_t>(), !distributed);
  if (!runsRanks)
    rank_ = nullptr;
  if (rank_)
    rank_->prepare(bundle);
  if (bundle.pipeline()) {
    if (!rank_)
      invalid("bundle '" + bundle.name() +
              "' is pipeline-parallel; run it with --in-process-ranks");
    pipeline_ = std::make_unique<pipeline::PipelineRunner>(
        bundle, *parameters_, *pool_, *rank_);
  } else {
    trainStep_ = std::make_unique<host::Executor>(bundle, "train_step",
                                                  *parameters_, *pool_, rank_);
  }
  if (evaluates && !bundle.pipeline()) {
    const Function *eval = bundle.findFunction("eval_step");
    const TensorType &evalTokens = eval->values[eval->inputs[0]];
    if (evalTokens.shape != tokens.shape || evalTokens.dtype != tokens.dtype)
      invalid("bundle '" + bundle.name() + "': eval_step's tokens are " +
              evalTokens.str() + " but train_step's are " + tokens.str() +
              "; recompile the bundle");
    evalStep_ = std::make_unique<host::Executor>(bundle, "eval_step",
                                                 *parameters_, *pool_, rank_);
  }
  if (rank_ && bundle.hasGradientBuffer())
    gradientBuffer_ = std::make_unique<DataParallelBuffer>(
        bundle, *parameters_, *pool_, *rank_);
  if (pipeline_ && gradientBuffer_ && gradientBuffer_->bucketed())
    pipeline_->setLastBackwardObserver(
        [this](const std::string &function, size_t position) {
          gradientBuffer_->afterInstruction(function, position);
        });
  // --overlap-param-gather: each stage's first forward pass gathers the
  // buckets it reads.
  if (pipeline_ && gradientBuffer_)
    pipeline_->setBeforeFirstForward([this](const Function &function) {
      gradientBuffer_->beforeFunction(function);
    });
  if (distributed)
    distributedOptimizer_ = std::make_unique<DistributedOptimizer>(
        *parameters_, *gradientBuffer_, *pool_, optimizer, *rank_);
  else
    optimizer_ =
        std::make_unique<Optimizer>(*parameters_, *pool_, optimizer, rank_);
  if (options_.lossScaling) {
    lossScaler_ = std::make_unique<LossScaler>(*options_.lossScaling);
    // Pipeline stages take the seed as an input; train_step makes it.
    bool seeded = bundle.pipeline() != nullptr;
    if (!seeded)
      for (const Instruction &inst : trainStep_->function().instructions)
        seeded |= inst.op == Op::Fill && inst.attrs.lossSeed;
    if (!seeded)
      invalid("--fp16: bundle '" + bundle.name() +
              "''s train_step has no fill marked loss_seed (the loss's "
              "gradient, which loss scaling multiplies; bundles before "
              "format version 5 lack it): recompile it with this "
              "megatron-compile");
  }
  tokens_.resize(static_cast<size_t>(microBatch_ * localSeq_));
  labels_.resize(tokens_.size());
  sampleTokens_.resize(static_cast<size_t>(seqLength_));
  sampleLabels_.resize(sampleTokens_.size());
  parameters_->initialize(*pool_, options_.seed);
}

Trainer::~Trainer() = default;

void Trainer::checkTokenIds(const std::vector<int32_t> &tokens,
                            const std::vector<int32_t> &labels,
                            int64_t firstSample) const {
  for (const std::vector<int32_t> *ids : {&tokens, &labels})
    for (size_t i = 0; i < ids->size(); ++i)
      if ((*ids)[i] < 0 || (*ids)[i] >= vocabSize_)
        invalid("--data-path '" + corpusName_ + "': sample " +
                std::to_string(firstSample +
                               static_cast<int64_t>(i) / localSeq_) +
                " holds token id " + std::to_string((*ids)[i]) +
                ", outside the model's vocabulary [0, " +
                std::to_string(vocabSize_) +
                ") (model.vocab_size): tokenize the data for this model, or "
                "compile the model with the tokenizer's vocabulary size");
}

const host::LrSchedule &Trainer::schedule() const {
  return optimizerConfig_.schedule;
}

size_t Trainer::optimizerStateBytes() const {
  return parameters_->optimizerStateBytes() +
         (distributedOptimizer_ ? distributedOptimizer_->stateBytes() : 0);
}

void Trainer::readSamples(data::SampleSource &data, int64_t first) {
  if (contextSize_ == 1) {
    for (int64_t b = 0; b < microBatch_; ++b)
      data.read(first + b, tokens_.data() + b * seqLength_,
                labels_.data() + b * seqLength_);
    return;
  }
  const int64_t chunk = seqLength_ / (2 * contextSize_);
  const int64_t chunks[2] = {contextRank_, 2 * contextSize_ - 1 - contextRank_};
  for (int64_t b = 0; b < microBatch_; ++b) {
    data.read(first + b, sampleTokens_.data(), sampleLabels_.data());
    for (int64_t half = 0; half < 2; ++half) {
      int64_t from = chunks[half] * chunk, to = b * localSeq_ + half * chunk;
      std::copy_n(sampleTokens_.data() + from, chunk, tokens_.data() + to);
      std::copy_n(sampleLabels_.data() + from, chunk, labels_.data() + to);
    }
  }
}

std::pair<host::TensorView, host::TensorView>
Trainer::readMicroBatch(data::SampleSource &data, int64_t first) {
  readSamples(data, first);
  checkTokenIds(tokens_, labels_, first);
  std::vector<int64_t> shape = {microBatch_, localSeq_};
  if (idType_ == DType::I64) {
    tokens64_.assign(tokens_.begin(), tokens_.end());
    labels64_.assign(labels_.begin(), labels_.end());
    return {{idType_, shape, tokens64_.data()},
            {idType_, shape, labels64_.data()}};
  }
  return {{idType_, shape, tokens_.data()}, {idType_, shape, labels_.data()}};
}

double Trainer::runMicroBatch(host::Executor &executor,
                              data::SampleSource &data, int64_t first,
                              const MicroBatchKey &key,
                              ReportedLosses *reported) {
  readSamples(data, first);
  checkTokenIds(tokens_, labels_, first);
  std::vector<int64_t> shape = {microBatch_, localSeq_};
  std::vector<host::TensorView> inputs = {{idType_, shape, tokens_.data()},
                                          {idType_, shape, labels_.data()}};
  std::vector<int64_t> tokens64, labels64;
  if (idType_ == DType::I64) {
    tokens64.assign(tokens_.begin(), tokens_.end());
    labels64.assign(labels_.begin(), labels_.end());
    inputs[0].data = tokens64.data();
    inputs[1].data = labels64.data();
  }
  std::vector<host::Tensor> outputs = executor.run(inputs, key);
  if (reported)
    addReportedLosses(executor.function(), outputs, *reported);
  const host::Tensor &loss = outputs[0];
  return loss.dtype == DType::F64 ? loss.data<double>()[0]
                                  : static_cast<double>(loss.data<float>()[0]);
}

void Trainer::train(std::ostream &out) {
  // Ranks other than 0 log nowhere.
  bool logs = !rank_ || rank_->rank() == 0;
  std::ostringstream discarded;
  TrainingLog log(logs ? out : discarded, logs ? options_.logJsonl : "",
                  logs && options_.progressBar, options_.trainIters,
                  options_.logInterval);
  const ModelConfig &model = bundle_.model();
  {
    std::ostringstream s;
    s << "training " << model.name << " (" << parameters_->numElements()
      << " parameters, " << parameters_->size() << " tensors"
      << (rank_ ? " on rank 0 of " + std::to_string(bundle_.rankCount()) +
                      ", grid " + shapeString(bundle_.gridShape())
                : std::string())
      << ") from '" << bundle_.name() << "' on '" << corpusName_
      << "': " << trainData_->samplesPerEpoch() << " samples of " << seqLength_
      << " tokens per epoch, global batch " << globalBatch_ << " = "
      << microBatches_ << " micro-batches of " << microBatch_ << ", "
      << pool_->size() << " threads, seed " << options_.seed << ", "
      << (distributedOptimizer_ ? "distributed optimizer" : "optimizer")
      << " state " << optimizerStateBytes() << " bytes"
      << (trainStep_ ? ", train_step arena " +
                           std::to_string(trainStep_->arenaBytes()) + " bytes"
                     : std::string(", pipeline schedule ") +
                           bundle_.pipeline()->schedule)
      << (rank_ ? " on rank 0" : "");
    log.line(s.str());
  }
  if (options_.evalInterval > 0 && options_.evalIters > 0 && !evalStep_ &&
      !pipeline_)
    log.line("note: the bundle has no eval_step; training without "
             "evaluation");

  if (lossScaler_)
    log.line("fp16: " + lossScaler_->describe() +
             "; the host computes in float32 (GEMM operands are not rounded "
             "to fp16), the loss scaling is Megatron-LM's");
  auto iterate = [&](int64_t iteration, int64_t consumed) {
    parameters_->zeroGradients(*pool_);
    if (lossScaler_) {
      if (pipeline_)
        pipeline_->setLossScale(lossScaler_->scale());
      else
        trainStep_->setLossScale(lossScaler_->scale());
    }
    double lossSum = 0;
    ReportedLosses reported;
    // Global micro-batch m holds samples globalFirst(m) onwards; this data
    // rank reads its rows, and the masks are keyed on the samples.
    auto globalFirst = [&](int64_t m) {
      return consumed + m * microBatch_ * dataParallel_;
    };
    if (pipeline_) {
      lossSum = pipeline_->train(
          [&](int64_t m) {
            return readMicroBatch(*trainData_,
                                  globalFirst(m) + dataRank_ * microBatch_);
          },
          {microStep_, static_cast<uint64_t>(consumed)},
          static_cast<uint64_t>(microBatch_ * dataParallel_));
      // The stages' reported losses (the lm loss is the loss less aux_loss).
      reported = pipeline_->reportedLosses();
      microStep_ += microBatches_;
      // --overlap-param-gather: buckets no stage's forward read.
      if (gradientBuffer_)
        gradientBuffer_->finishParameterGather();
    }
    for (int64_t m = 0; !pipeline_ && m < microBatches_; ++m) {
      // Megatron-LM's --overlap-grad-reduce: in the last micro-batch, each
      // gradient bucket is reduced once its gradients are complete.
      bool overlap = gradientBuffer_ && gradientBuffer_->bucketed() &&
                     m + 1 == microBatches_;
      // --overlap-param-gather: in the first micro-batch, each bucket of
      // the last step's parameters is gathered before its first use.
      bool gather = gradientBuffer_ && m == 0 &&
                    gradientBuffer_->parameterGatherPending();
      if (gather)
        gradientBuffer_->beforeInstruction("train_step", 0);
      if (overlap || gather)
        trainStep_->setInstructionObserver(
            [this, overlap, gather](size_t position) {
              if (gather)
                gradientBuffer_->beforeInstruction("train_step", position + 1);
              if (overlap)
                gradientBuffer_->afterInstruction("train_step", position);
            });
      lossSum += runMicroBatch(
          *trainStep_, *trainData_, globalFirst(m) + dataRank_ * microBatch_,
          {microStep_++, static_cast<uint64_t>(globalFirst(m))}, &reported);
      if (overlap || gather)
        trainStep_->setInstructionObserver(nullptr);
      if (gather) // buckets the step does not read
        gradientBuffer_->finishParameterGather();
    }
    // Megatron-LM's data-parallel reduction: once per iteration, after the
    // micro-batches, before clipping and the optimizer.
    if (gradientBuffer_)
      gradientBuffer_->reduceGradients();
    IterationResult result;
    result.loss = lossSum / static_cast<double>(microBatches_);
    result.reportedLosses = std::move(reported);
    meanOf(result.reportedLosses, microBatches_);
    if (lossScaler_) {
      // Megatron-LM's order: unscale and check every gradient element,
      // agree over all ranks, update the scale, skip on an overflow.
      double inverse = 1.0 / lossScaler_->scale();
      bool found = distributedOptimizer_
                       ? distributedOptimizer_->unscaleAndCheckFinite(
                             inverse, iteration)
                       : optimizer_->unscaleAndCheckFinite(inverse, iteration);
      if (skipOnOverflow(*lossScaler_, found, iteration, skippedIterations_,
                         optimizerConfig_.schedule, result))
        return result;
    }
    // The optimizer counts its updates: skipped iterations move neither the
    // schedule nor AdamW's step (Megatron-LM steps its scheduler only after
    // a successful update).
    int64_t update = iteration - skippedIterations_;
    double scale = 1.0 / static_cast<double>(microBatches_);
    // With --overlap-param-gather the updated parameters are gathered in
    // the next step (or by finishParameterGather, before anything else
    // reads them).
    result.step = distributedOptimizer_
                      ? distributedOptimizer_->step(update, scale,
                                                    /*deferGather=*/true)
                      : optimizer_->step(update, scale);
    return result;
  };
  auto finishGather = [this] {
    if (gradientBuffer_)
      gradientBuffer_->finishParameterGather();
  };
  std::function<double()> evaluation;
  if (evalStep_ || (pipeline_ && validData_))
    evaluation = [this, finishGather] {
      finishGather();
      return evaluate();
    };
  LoopStart start = prepareCheckpoints(log);
  std::function<void(int64_t, int64_t)> save;
  if (!options_.save.empty())
    save = [&](int64_t iteration, int64_t consumed) {
      finishGather();
      saveCheckpoint(iteration, consumed, log);
    };
  runTrainingLoop(options_, log, globalBatch_, globalBatch_ * seqLength_,
                  iterate, evaluation, history_, start, save);
  finishGather();
  if (gradientBuffer_ && gradientBuffer_->bucketed())
    log.line(gradientBuffer_->describeBuckets() + " (rank 0)");
  if (pipeline_) { // every rank takes part; rank 0 prints
    log.line(pipeline_->describeIdleFractions());
    log.line(pipeline_->describeMemory());
  }
}

double Trainer::evaluate() {
  if (pipeline_ && validData_) {
    int64_t batches = options_.evalIters * microBatches_;
    double sum = pipeline_->evaluate(
        [&](int64_t i) {
          return readMicroBatch(*validData_, i * microBatch_ * dataParallel_ +
                                                 dataRank_ * microBatch_);
        },
        batches);
    return sum / static_cast<double>(batches);
  }
  if (!evalStep_)
    throw Error(MTRT_STATUS_FAILED_PRECONDITION,
                "evaluation needs the bundle's eval_step, a validation split "
                "and --eval-iters > 0");
  int64_t batches = options_.evalIters * microBatches_;
  double sum = 0;
  for (int64_t i = 0; i < batches; ++i)
    sum += runMicroBatch(
        *evalStep_, *validData_,
        i * microBatch_ * dataParallel_ + dataRank_ * microBatch_, {});
  return sum / static_cast<double>(batches);
}

std::string samplingRefusal(const Bundle &bundle) {
  if (!bundle.pipeline())
    return "";
  for (const PipelineStageInfo &stage : bundle.pipeline()->stages)
    if (!stage.predict)
      return "sampling from bundle '" + bundle.name() +
             "': its pipeline stage " + std::to_string(stage.stage) +
             " has no predict function (the bundle was written before "
             "format version 11); recompile it with megatron-compile, or "
             "pass --sample-tokens 0";
  return "";
}

Predictor pipelinePredictorShapes(const Bundle &bundle, DType tokenType) {
  // The first stage takes the tokens, the last returns the logits.
  const std::vector<PipelineStageInfo> &stages = bundle.pipeline()->stages;
  const Function &first = bundle.functions()[*stages.front().predict];
  const Function &last = bundle.functions()[*stages.back().predict];
  Predictor predictor;
  predictor.tokenShape = first.values[first.inputs[0]].shape;
  predictor.tokenType = tokenType;
  predictor.vocab = last.values[last.outputs[0]].shape.back();
  return predictor;
}

std::string Trainer::sample(const std::string &prompt, int64_t tokens,
                            const SamplingOptions &sampling) {
  if (std::string refusal = samplingRefusal(bundle_); !refusal.empty())
    throw Error(MTRT_STATUS_UNIMPLEMENTED, refusal);
  Predictor predictor;
  if (pipeline_) {
    predictor = pipelinePredictorShapes(bundle_, idType_);
    int64_t vocab = predictor.vocab;
    predictor.run =
        [this, vocab](const host::TensorView &tokens,
                      int64_t position) -> std::optional<std::vector<double>> {
      std::optional<host::Tensor> logits = pipeline_->predict(tokens);
      if (!logits || position < 0)
        return std::nullopt;
      return logitsAsDoubles(logits->dtype,
                             static_cast<const char *>(logits->buffer.data()) +
                                 position * vocab * dtypeSize(logits->dtype),
                             vocab);
    };
  } else {
    if (!predictStep_) {
      if (!bundle_.findFunction("predict_step"))
        throw Error(MTRT_STATUS_NOT_FOUND,
                    "--sample-tokens needs the bundle's predict_step, and '" +
                        bundle_.name() +
                        "' has none; recompile it with megatron-compile, or "
                        "pass --sample-tokens 0");
      predictStep_ = std::make_unique<host::Executor>(
          bundle_, "predict_step", *parameters_, *pool_, rank_);
    }
    predictor = predictorOf(*predictStep_);
  }
  return sampleWith(std::move(predictor), prompt, tokens, sampling);
}

std::string Trainer::sampleWith(Predictor predictor, const std::string &prompt,
                                int64_t tokens,
                                const SamplingOptions &sampling) {
  // Every rank holds whole logits: a split vocabulary would be sampled from
  // one rank's part.
  if (predictor.vocab < vocabSize_)
    throw Error(MTRT_STATUS_UNIMPLEMENTED,
                "sampling from bundle '" + bundle_.name() +
                    "': its logits have " + std::to_string(predictor.vocab) +
                    " entries a position, fewer than the vocabulary's " +
                    std::to_string(vocabSize_) +
                    " (split over ranks); recompile it, or pass "
                    "--sample-tokens 0");
  TokenSampler sampler(std::move(predictor),
                       std::min(vocabSize_, tokenizer_->vocabSize()), sampling,
                       {rank_, contextSize_, contextRank_});
  return tokenizer_->decode(
      sampler.generate(tokenizer_->encode(prompt), tokens));
}

} // namespace mtrt::train
