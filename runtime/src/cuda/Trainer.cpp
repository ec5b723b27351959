// The GPU training loop: data, micro-batches on the CUDA executor, the device
// optimizer, evaluation, logs.
#include "cuda/Trainer.h"

#include "comm/RankContext.h"
#include "cuda/CudaCheck.h"
#include "cuda/DataParallel.h"
#include "cuda/Executor.h"
#include "cuda/GradientUnscaler.h"
#include "cuda/Optimizer.h"
#include "cuda/ParameterStore.h"
#include "cuda/PipelineStages.h"
#include "cuda/SharedArena.h"
#include "data/SampleSource.h"
#include "host/ParameterStore.h"
#include "train/Optimizer.h"
#include "train/TrainingLog.h"
#include "train/TrainingLoop.h"

#include <cuda_profiler_api.h>

#include <ostream>
#include <sstream>

namespace mtrt::cuda {

Trainer::Trainer(const Bundle &bundle, std::string corpus,
                 std::string corpusName, const train::TrainerOptions &options,
                 const ContextOptions &device, comm::RankContext *rank)
    : bundle_(bundle), options_(options), corpusName_(corpusName),
      logs_(!rank || rank->rank() == 0), rank_(rank) {
  if (options.floatType != DType::F32)
    throw Error(MTRT_STATUS_UNIMPLEMENTED,
                "the cuda backend trains in f32 only");
  // The device first: without one, fail before the host's work.
  context_ = std::make_unique<Context>(device);
  // Every check, the schedule and the seeded initialization.
  host_ = std::make_unique<train::Trainer>(bundle, std::move(corpus),
                                           corpusName, options, rank);
  // The distributed optimizer keeps AdamW's moments for its shard only.
  bool distributed = rank && bundle.hasGradientBuffer() &&
                     bundle.gradientBuffer().distributedOptimizer;
  // A pipeline bundle runs its schedule (the host trainer checked that it
  // has a rank); its first stage reads the tokens.
  const Function *train =
      bundle.pipeline()
          ? &bundle.functions()[bundle.pipeline()->stages.front().forward]
          : bundle.findFunction("train_step");
  // One micro-batch per iteration: the gradients are the train step's
  // results, kept in its arena until the optimizer has read them
  // (docs/Memory.md, "Gradients in the arena").
  gradientsInArena_ = host_->microBatchesPerIteration() == 1 &&
                      !bundle.pipeline() && !bundle.hasGradientBuffer() &&
                      !host_->lossScaler() &&
                      ParameterStore::gradientsFitArena(bundle, *train);
  parameters_ = std::make_unique<ParameterStore>(
      bundle, *context_, !distributed,
      gradientsInArena_ ? ParameterStore::GradientStorage::Arena
                        : ParameterStore::GradientStorage::Store);
  parameters_->upload(host_->parameters());

  idType_ = train->values[train->inputs[0]].dtype;
  // The step's tokens are the rank's chunks of each sample.
  contextParallel_ =
      train->values[train->inputs[0]].shape.back() != host_->seqLength();
  // The host trainer's samples: the same data, splits and order.
  trainData_ = &host_->trainData();
  validData_ = host_->validData();
  if (bundle.pipeline()) {
    pipeline_ = std::make_unique<PipelineRunner>(bundle, *parameters_, *rank);
  } else {
    // train_step and eval_step never run at once: one arena, as large as
    // the larger of theirs (docs/Memory.md). An evaluation comes after an
    // optimizer step, which has read the gradients by then.
    arena_ = std::make_unique<SharedArena>(
        "the arena of train_step and eval_step of bundle '" + bundle.name() +
        "'");
    trainStep_ =
        std::make_unique<Executor>(bundle, "train_step", *parameters_, rank,
                                   Executor::Bf16Boundary{}, arena_.get());
    if (host_->canEvaluate())
      evalStep_ =
          std::make_unique<Executor>(bundle, "eval_step", *parameters_, rank,
                                     Executor::Bf16Boundary{}, arena_.get());
    trainStep_->bindArena();
    if (evalStep_)
      evalStep_->bindArena();
    if (gradientsInArena_)
      parameters_->bindGradients(trainStep_->gradientSlots());
  }
  int64_t seq = host_->seqLength();

  train::OptimizerConfig config;
  config.schedule = host_->schedule();
  config.weightDecay = options_.weightDecay;
  config.beta1 = options_.adamBeta1;
  config.beta2 = options_.adamBeta2;
  config.eps = options_.adamEps;
  config.clipGrad = options_.clipGrad;
  if (rank && bundle.hasGradientBuffer())
    gradientBuffer_ =
        std::make_unique<DataParallelBuffer>(bundle, *parameters_, *rank);
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
        *parameters_, *gradientBuffer_, config, *rank);
  else
    optimizer_ = std::make_unique<Optimizer>(*parameters_, config, rank);
  if (host_->lossScaler() && !distributed)
    unscaler_ = std::make_unique<GradientUnscaler>(*parameters_, rank);
  size_t tokens = static_cast<size_t>(host_->microBatchSize() * seq);
  tokens_.resize(tokens);
  labels_.resize(tokens);
}

Trainer::~Trainer() = default;

int64_t Trainer::sampleOffset(int64_t microBatch) const {
  return (microBatch * host_->dataParallelSize() + host_->dataRank()) *
         host_->microBatchSize();
}

std::pair<host::TensorView, host::TensorView>
Trainer::readMicroBatch(data::SampleSource &data, int64_t first) {
  // Context parallelism: the rank's two load-balanced chunks of each sample
  // (Megatron-LM's get_batch_on_this_cp_rank), read as the host trainer
  // reads them.
  if (contextParallel_)
    return host_->readMicroBatch(data, first);
  int64_t batch = host_->microBatchSize(), seq = host_->seqLength();
  for (int64_t b = 0; b < batch; ++b)
    data.read(first + b, tokens_.data() + b * seq, labels_.data() + b * seq);
  host_->checkTokenIds(tokens_, labels_, first);
  std::vector<int64_t> shape = {batch, seq};
  std::vector<host::TensorView> inputs = {{idType_, shape, tokens_.data()},
                                          {idType_, shape, labels_.data()}};
  if (idType_ == DType::I64) {
    tokens64_.assign(tokens_.begin(), tokens_.end());
    labels64_.assign(labels_.begin(), labels_.end());
    inputs[0].data = tokens64_.data();
    inputs[1].data = labels64_.data();
  }
  return {inputs[0], inputs[1]};
}

double Trainer::runMicroBatch(Executor &executor, data::SampleSource &data,
                              int64_t first, const MicroBatchKey &key,
                              train::ReportedLosses *reported) {
  auto [tokens, labels] = readMicroBatch(data, first);
  std::vector<host::Tensor> outputs = executor.run({tokens, labels}, key);
  if (reported)
    train::addReportedLosses(executor.function(), outputs, *reported);
  return static_cast<double>(outputs[0].data<float>()[0]);
}

void Trainer::train(std::ostream &out) {
  // Ranks other than 0 log nowhere (as train::Trainer): one writer of
  // --log-jsonl.
  std::ostringstream discarded;
  train::TrainingLog log(logs_ ? out : discarded,
                         logs_ ? options_.logJsonl : "",
                         logs_ && options_.progressBar, options_.trainIters,
                         options_.logInterval);
  const ModelConfig &model = bundle_.model();
  int64_t globalBatch = host_->globalBatchSize();
  int64_t microBatches = host_->microBatchesPerIteration();
  int64_t microBatch = host_->microBatchSize();
  int64_t seq = host_->seqLength();
  {
    std::ostringstream s;
    s << "training " << model.name << " (" << parameters_->numElements()
      << " parameters, " << parameters_->size() << " tensors) from '"
      << bundle_.name() << "' on '" << corpusName_
      << "': " << trainData_->samplesPerEpoch() << " samples of " << seq
      << " tokens per epoch, global batch " << globalBatch << " = "
      << microBatches << " micro-batches of " << microBatch << ", on "
      << context_->description() << ", f32 GEMMs "
      << (context_->options().tf32 ? "with TF32" : "without TF32")
      << (trainStep_
              ? ", arena " + std::to_string(arena_->bytes() >> 20) + " MiB"
              : ", pipeline schedule " + bundle_.pipeline()->schedule)
      << ", seed " << options_.seed;
    s << (gradientsInArena_
              ? ", gradients in the arena"
              : ", gradients in a buffer of " +
                    std::to_string((parameters_->flatElements() * 4) >> 20) +
                    " MiB");
    if (gradientBuffer_)
      s << "; data-parallel gradient buffer of "
        << bundle_.gradientBuffer().size << " elements reduced on the device"
        << (distributedOptimizer_
                ? ", distributed optimizer (AdamW state " +
                      std::to_string(distributedOptimizer_->stateBytes() >>
                                     20) +
                      " MiB on this rank)"
                : std::string());
    log.line(s.str());
  }
  if (trainStep_ && !trainStep_->cudnnAttentionDeclined().empty())
    log.line("note: attention runs on the flash kernels where cuDNN "
             "declined (" + std::to_string(trainStep_->cudnnAttentionCount()) +
             " instructions through cuDNN); the first: " +
             trainStep_->cudnnAttentionDeclined());
  if (options_.evalInterval > 0 && options_.evalIters > 0 && !evalStep_ &&
      !pipeline_)
    log.line("note: the bundle has no eval_step; training without "
             "evaluation");
  train::LossScaler *scaler = host_->lossScaler();
  if (scaler)
    log.line("fp16: " + scaler->describe() +
             "; the step computes in float32 on the device (fp16 GEMM "
             "operands are not implemented), the loss scaling is "
             "Megatron-LM's");

  auto iterateOnce = [&](int64_t iteration, int64_t consumed) {
    parameters_->zeroGradients();
    if (scaler && pipeline_)
      pipeline_->setLossScale(scaler->scale());
    else if (scaler)
      trainStep_->setLossScale(scaler->scale());
    double lossSum = 0;
    train::ReportedLosses reported;
    // The masks are keyed on the samples: global micro-batch m starts at
    // consumed + m * (its samples over the data ranks).
    uint64_t globalBatch = static_cast<uint64_t>(host_->microBatchSize() *
                                                 host_->dataParallelSize());
    if (pipeline_) {
      lossSum = pipeline_->train(
          [&](int64_t m) {
            return readMicroBatch(*trainData_, consumed + sampleOffset(m));
          },
          {microStep_, static_cast<uint64_t>(consumed)}, globalBatch);
      // The stages' reported losses (the lm loss is the loss less aux_loss).
      reported = pipeline_->reportedLosses();
      microStep_ += static_cast<uint64_t>(microBatches);
      // --overlap-param-gather: buckets no stage's forward read.
      if (gradientBuffer_)
        gradientBuffer_->finishParameterGather();
    }
    for (int64_t m = 0; !pipeline_ && m < microBatches; ++m) {
      // --overlap-grad-reduce: the last micro-batch reduces each gradient
      // bucket once its gradients are complete (train::Trainer's rule).
      bool overlap = gradientBuffer_ && gradientBuffer_->bucketed() &&
                     m + 1 == microBatches;
      // --overlap-param-gather: the first micro-batch gathers each bucket
      // of the last step's parameters before their first use. A step that
      // replays a CUDA graph cannot stop inside it: its gathers are enqueued
      // before it (on the same stream), and the graph runs on.
      bool gather = gradientBuffer_ && m == 0 &&
                    gradientBuffer_->parameterGatherPending();
      if (gather && trainStep_->graphsEligible()) {
        gradientBuffer_->finishParameterGather();
        gather = false;
      }
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
          *trainStep_, *trainData_, consumed + sampleOffset(m),
          {microStep_++, static_cast<uint64_t>(consumed) +
                             static_cast<uint64_t>(m) * globalBatch},
          &reported);
      if (overlap || gather)
        trainStep_->setInstructionObserver(nullptr);
      if (gather) // buckets the step does not read
        gradientBuffer_->finishParameterGather();
    }
    // Megatron-LM's data-parallel reduction: once per iteration, after the
    // micro-batches, before the unscale, clipping and the optimizer.
    if (gradientBuffer_)
      gradientBuffer_->reduceGradients();
    train::IterationResult result;
    result.loss = lossSum / static_cast<double>(microBatches);
    result.reportedLosses = std::move(reported);
    train::meanOf(result.reportedLosses, microBatches);
    if (scaler) {
      // As train::Trainer: unscale, agree over the ranks, update, skip.
      double inverse = 1.0 / scaler->scale();
      bool found =
          distributedOptimizer_
              ? distributedOptimizer_->unscaleAndCheckFinite(inverse, iteration)
              : unscaler_->unscaleAndCheckFinite(inverse, iteration);
      if (train::skipOnOverflow(*scaler, found, iteration, skippedIterations_,
                                host_->schedule(), result))
        return result;
    }
    // The optimizer's update count (skipped iterations move neither the
    // schedule nor AdamW's step).
    int64_t update = iteration - skippedIterations_;
    double scale = 1.0 / static_cast<double>(microBatches);
    result.step = distributedOptimizer_
                      ? distributedOptimizer_->step(update, scale,
                                                    /*deferGather=*/true)
                      : optimizer_->step(update, scale);
    return result;
  };
  // ContextOptions::profilerIteration: the profiler sees that iteration only.
  auto iterate = [&](int64_t iteration, int64_t consumed) {
    bool profiled = iteration == context_->options().profilerIteration;
    if (profiled) {
      context_->synchronize("before the profiled iteration");
      MTRT_CUDA_CHECK(cudaProfilerStart(), "starting the profiler");
    }
    train::IterationResult result = iterateOnce(iteration, consumed);
    if (profiled) {
      context_->synchronize("after the profiled iteration");
      MTRT_CUDA_CHECK(cudaProfilerStop(), "stopping the profiler");
    }
    return result;
  };
  // Deferred parameter gathers finish before anything else reads the
  // parameters.
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
  train::LoopStart start = resume(log);
  std::function<void(int64_t, int64_t)> save;
  if (!options_.save.empty())
    save = [&](int64_t iteration, int64_t consumed) {
      finishGather();
      saveCheckpoint(iteration, consumed, log);
    };
  train::runTrainingLoop(options_, log, globalBatch, globalBatch * seq,
                         iterate, evaluation, history_, start, save);
  finishGather();
  if (pipeline_) { // every rank takes part; rank 0 prints
    log.line(pipeline_->describeIdleFractions());
    for (const Executor *executor : pipeline_->executors()) {
      out << executor->graphSummary();
      if (executor->mixedPrecision())
        out << executor->function().name << ": "
            << executor->bf16ValueCount() << " values held in bf16\n";
    }
  } else {
    out << trainStep_->profile() << trainStep_->graphSummary();
  }
}

double Trainer::evaluate() {
  if (pipeline_ && validData_) {
    int64_t batches = options_.evalIters * host_->microBatchesPerIteration();
    double sum = pipeline_->evaluate(
        [&](int64_t i) {
          return readMicroBatch(*validData_, sampleOffset(i));
        },
        batches);
    return sum / static_cast<double>(batches);
  }
  if (!evalStep_)
    throw Error(MTRT_STATUS_FAILED_PRECONDITION,
                "evaluation needs the bundle's eval_step, a validation split "
                "and --eval-iters > 0");
  int64_t batches = options_.evalIters * host_->microBatchesPerIteration();
  double sum = 0;
  for (int64_t i = 0; i < batches; ++i)
    sum += runMicroBatch(*evalStep_, *validData_, sampleOffset(i), {});
  return sum / static_cast<double>(batches);
}

void Trainer::copyParametersToHost() {
  parameters_->download(host_->parameters());
}

void Trainer::uploadParametersFromHost() {
  parameters_->upload(host_->parameters());
}

std::string Trainer::sample(const std::string &prompt, int64_t tokens,
                            const train::SamplingOptions &sampling) {
  if (std::string refusal = train::samplingRefusal(bundle_); !refusal.empty())
    throw Error(MTRT_STATUS_UNIMPLEMENTED, refusal);
  if (!pipeline_ && !bundle_.findFunction("predict_step")) {
    // The host trainer refuses it, naming why.
    copyParametersToHost();
    return host_->sample(prompt, tokens, sampling);
  }
  // Only row 0's logits at the drawn position leave the device.
  train::Predictor predictor;
  if (pipeline_) {
    predictor = train::pipelinePredictorShapes(bundle_, idType_);
    int64_t vocab = predictor.vocab;
    predictor.run =
        [this, vocab](const host::TensorView &window,
                      int64_t position) -> std::optional<std::vector<double>> {
      std::optional<DeviceTensor> logits = pipeline_->predict(window);
      if (!logits || position < 0)
        return std::nullopt;
      return copyLogitsRow(logits->dtype(), logits->data(), position, vocab);
    };
  } else {
    if (!predictStep_)
      predictStep_ = std::make_unique<Executor>(bundle_, "predict_step",
                                                *parameters_, rank_);
    const Function &predict = *bundle_.findFunction("predict_step");
    predictor = train::predictorShapes(predict);
    int64_t vocab = predictor.vocab;
    DType type = predictStep_->storageType(predict.outputs[0]);
    predictor.run =
        [this, vocab,
         type](const host::TensorView &window,
               int64_t position) -> std::optional<std::vector<double>> {
      std::optional<std::vector<double>> row;
      // The sink runs before run() synchronizes, while the arena slot still
      // holds the logits.
      predictStep_->run({window}, {}, /*inputsOnDevice=*/false,
                        [&](size_t output, const void *data, size_t) {
                          if (output == 0 && position >= 0)
                            row = copyLogitsRow(type, data, position, vocab);
                        });
      return row;
    };
  }
  return host_->sampleWith(std::move(predictor), prompt, tokens, sampling);
}

std::vector<double> Trainer::copyLogitsRow(DType type, const void *logits,
                                           int64_t position, int64_t vocab) {
  size_t bytes = static_cast<size_t>(vocab) * dtypeSize(type);
  std::vector<char> row(bytes);
  MTRT_CUDA_CHECK(
      cudaMemcpyAsync(row.data(),
                      static_cast<const char *>(logits) + position * bytes,
                      bytes, cudaMemcpyDeviceToHost, context_->stream()),
      "sampling: copying position " + std::to_string(position) +
          "'s logits to the host");
  context_->synchronize("sampling: copying the logits to the host");
  return train::logitsAsDoubles(type, row.data(), vocab);
}

} // namespace mtrt::cuda
