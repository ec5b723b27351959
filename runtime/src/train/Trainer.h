// Megatron-LM's training loop for one rank on the host backend.
#ifndef MTRT_SRC_TRAIN_TRAINER_H
#define MTRT_SRC_TRAIN_TRAINER_H

#include "core/Bundle.h"
#include "core/MicroBatchKey.h"
#include "data/BlendedGptDataset.h"
#include "data/Tokenizer.h"
#include "host/HostTensor.h"
#include "host/kernels/Kernels.h"
#include "train/Checkpoint.h"
#include "train/LossScaler.h"
#include "train/Optimizer.h"
#include "train/TokenSampler.h"
#include "train/TrainingLog.h"

#include <cstddef>
#include <cstdint>
#include <iosfwd>
#include <memory>
#include <optional>
#include <string>
#include <vector>

namespace mtrt::host {
class Executor;
class ParameterStore;
class ThreadPool;
} // namespace mtrt::host

namespace mtrt::comm {
class RankContext;
} // namespace mtrt::comm

namespace mtrt::pipeline {
class PipelineRunner;
} // namespace mtrt::pipeline

namespace mtrt::train {

class DataParallelBuffer;
class DistributedOptimizer;
class Optimizer;
class TrainingLog;
struct LoopStart;

/// Everything megatron-train's flags set; defaults are Megatron-LM's unless
/// noted.
struct TrainerOptions {
  int64_t trainIters = 0;
  /// 0: the bundle's global_batch_size.
  int64_t globalBatchSize = 0;
  /// 0: the bundle's; otherwise it must equal it (it is compiled in).
  int64_t microBatchSize = 0;
  /// Indexed datasets to train on (--data-path's prefixes and weights),
  /// sampled as Megatron-LM's GPTDataset; empty: the text corpus given to
  /// the trainer, tokenized by `tokenizer`.
  std::vector<data::BlendEntry> dataBlend;
  /// Tokenizes a text corpus and the sample prompt.
  data::TokenizerOptions tokenizer;
  std::string split = "969,30,1";
  uint64_t seed = 1234;

  double lr = 0;
  double minLr = 0;
  host::LrDecayStyle lrDecayStyle = host::LrDecayStyle::Linear;
  /// 0: trainIters.
  int64_t lrDecayIters = 0;
  int64_t lrWarmupIters = 0;
  /// Used instead of lrWarmupIters when set: a fraction of lrDecayIters.
  std::optional<double> lrWarmupFraction;
  double lrWarmupInit = 0;

  double weightDecay = 0.01;
  double adamBeta1 = 0.9;
  double adamBeta2 = 0.95; // GPT practice; Megatron-LM's default is 0.999
  double adamEps = 1e-8;
  double clipGrad = 1.0;

  int64_t logInterval = 100;
  /// 0 disables evaluation.
  int64_t evalInterval = 1000;
  int64_t evalIters = 100;
  /// A JSON object per line: each iteration's metrics and each evaluation.
  std::string logJsonl;
  /// Progress bar on stderr: only when stderr is a terminal, unless off.
  bool progressBar = true;

  /// --save: the directory checkpoints are saved to (docs/Checkpoints.md);
  /// empty: none.
  std::string save;
  /// --save-interval: iterations between checkpoints; 0: only at the end.
  int64_t saveInterval = 0;
  /// --load: the directory to resume from, if it holds a checkpoint; empty:
  /// start from the seeded initialization.
  std::string load;

  /// --fp16: the loss's gradient seed is multiplied by the loss scale, the
  /// gradients by its inverse before clipping, and an iteration with an inf
  /// or nan gradient element on any rank skips its optimizer step; unset:
  /// no loss scaling.
  std::optional<LossScalerOptions> lossScaling;

  /// 0: std::thread::hardware_concurrency().
  unsigned threads = 0;
  /// F64 runs every floating value in double (gradient checks).
  DType floatType = DType::F32;
};

/// Why Trainer::sample cannot run on `bundle`'s ranks (empty when it can):
/// a pipeline bundle written before format version 11 has no predict
/// functions in its stages.
std::string samplingRefusal(const Bundle &bundle);

/// The Predictor shapes of a pipeline bundle's predict stages (the first
/// stage's tokens, the last stage's logits), the tokens of `tokenType`,
/// without `run`. The bundle passes samplingRefusal().
Predictor pipelinePredictorShapes(const Bundle &bundle, DType tokenType);

/// What one iteration did.
struct IterationRecord {
  int64_t iteration = 0;
  /// The mean over micro-batches of train_step's loss (what it minimizes:
  /// the language-model loss plus any MoE auxiliary losses).
  double loss = 0;
  /// The means over micro-batches of train_step's reported losses; empty
  /// for a bundle without them. The language-model loss (Megatron-LM's "lm
  /// loss") is `loss` less "aux_loss".
  ReportedLosses reportedLosses;
  double learningRate = 0;
  /// NaN when the step was skipped.
  double gradNorm = 0;
  /// fp16: the loss scale after this iteration's update (what Megatron-LM
  /// logs), and whether the iteration skipped its optimizer step (an inf or
  /// nan gradient element on some rank). 0 and false without loss scaling.
  double lossScale = 0;
  bool skipped = false;
  double seconds = 0;
  double tokensPerSecond = 0;
};

/// Trains a bundle on a tokenized text or on indexed datasets: seeded
/// initialization of every parameter, Megatron-LM's sampling of the data, micro-batches with
/// gradient accumulation, clipping, AdamW and the LR schedule, periodic
/// evaluation, and Megatron-LM-style logs.
///
/// Bundles compiled for several ranks (a grid) run one Trainer per rank,
/// each given its RankContext: every rank reads the same samples in the same
/// order, data rank d (grid axis 0) takes rows [d * b, (d + 1) * b) of each
/// global micro-batch of b * dp samples, and steps its parameter shards.
/// Only rank 0 writes logs. The loss is the bundle's (the same on every
/// rank).
///
/// Determinism: the same bundle, corpus, options and seed give bit-identical
/// losses and parameters, whatever the thread count (the kernels'
/// guarantee).
///
/// Thread-safety: none.
class Trainer {
public:
  /// Checks everything before any work: throws Error (INVALID_ARGUMENT,
  /// UNIMPLEMENTED, NOT_FOUND) naming the flag or bundle field and the fix.
  /// `corpusName` is what messages call the text. `rank` (which must
  /// outlive the trainer) is required for a bundle of several ranks;
  /// constructing the trainer then is a collective over its world.
  Trainer(const Bundle &bundle, std::string corpus, std::string corpusName,
          const TrainerOptions &options, comm::RankContext *rank = nullptr);
  ~Trainer();

  /// Runs options.trainIters iterations (then an evaluation, if enabled),
  /// writing Megatron-LM-style lines to `out`.
  void train(std::ostream &out);

  /// The mean eval_step loss over evalIters global batches of the
  /// validation split, always from its first samples, in order.
  double evaluate();

  /// `prompt` continued by `tokens` tokens with predict_step, drawn as
  /// `sampling` says (TokenSampler), decoded. With several ranks it is a
  /// collective: every rank calls it and runs its predict_step on its part
  /// (SamplingRanks), and every rank returns the same text. Throws
  /// UNIMPLEMENTED where samplingRefusal() says why.
  std::string sample(const std::string &prompt, int64_t tokens,
                     const SamplingOptions &sampling = {});
  /// sample() through another backend's predict_step (the GPU's,
  /// cuda::Trainer::sample): this rank's part of the window through
  /// `predictor`, the draws and the decoding as sample()'s.
  std::string sampleWith(Predictor predictor, const std::string &prompt,
                         int64_t tokens, const SamplingOptions &sampling);

  /// Whether the bundle and the corpus allow evaluate() (an eval_step and a
  /// validation split of at least one sample).
  bool canEvaluate() const { return validData_ != nullptr; }

  const std::vector<IterationRecord> &history() const { return history_; }
  /// The samples train() and evaluate() read; validData() is null when
  /// there is no evaluation.
  data::SampleSource &trainData() { return *trainData_; }
  data::SampleSource *validData() { return validData_.get(); }
  /// Throws Error (INVALID_ARGUMENT) naming the sample when an id of a
  /// micro-batch read from `firstSample` is outside the model's vocabulary
  /// (data tokenized for another model), before the embedding reads it.
  void checkTokenIds(const std::vector<int32_t> &tokens,
                     const std::vector<int32_t> &labels,
                     int64_t firstSample) const;
  host::ParameterStore &parameters() { return *parameters_; }
  const std::string &corpus() const { return corpus_; }
  int64_t microBatchSize() const { return microBatch_; }
  int64_t seqLength() const { return seqLength_; }
  int64_t microBatchesPerIteration() const { return microBatches_; }
  int64_t globalBatchSize() const { return globalBatch_; }
  /// This rank's position along the data-parallel axis, and that axis'
  /// size: micro-batch m of an iteration that starts at sample `consumed`
  /// is samples consumed + (m * dataParallelSize() + dataRank()) *
  /// microBatchSize() onwards.
  int64_t dataRank() const { return dataRank_; }
  int64_t dataParallelSize() const { return dataParallel_; }
  const host::LrSchedule &schedule() const;
  /// The bytes of AdamW's moments this rank holds: all of its parameters'
  /// (shards'), or with the distributed optimizer its 1/dp range of the
  /// gradient buffer.
  size_t optimizerStateBytes() const;

  /// This rank's pieces of the checkpoint's tensors (parameters and AdamW's
  /// moments), pointing into the parameter store.
  std::vector<CheckpointTensor> checkpointTensors();
  /// What a checkpoint after `iteration` records besides tensors.
  CheckpointState checkpointState(int64_t iteration, int64_t consumed) const;
  /// Before the training loop: --load's checkpoint (loadCheckpoint), the
  /// check that --save would overwrite none, and where the loop starts.
  /// cuda::Trainer calls it too, then uploads the loaded state.
  LoopStart prepareCheckpoints(TrainingLog &log);
  /// --load: restores the newest checkpoint of `dir`, if it holds one, and
  /// continues from its iteration; writes Megatron-LM's lines to `log`.
  /// Throws Error naming the file or the option that does not match.
  void loadCheckpoint(const std::string &dir, TrainingLog &log);
  /// --save: saves the state after `iteration` (collectively over ranks).
  void saveCheckpoint(int64_t iteration, int64_t consumed, TrainingLog &log);
  /// The iterations completed before train() (those of a loaded checkpoint).
  int64_t startIteration() const { return startIteration_; }
  /// --fp16: the loss scaler (null without loss scaling).
  LossScaler *lossScaler() { return lossScaler_.get(); }
  /// Iterations that skipped their optimizer step (fp16 overflows), since
  /// the start of training (a checkpoint's included): the optimizer's
  /// update count is the iteration less these.
  int64_t skippedIterations() const { return skippedIterations_; }
  /// For a trainer that runs the iterations itself on this one
  /// (cuda::Trainer): its count, which checkpointState records.
  void setSkippedIterations(int64_t skipped) { skippedIterations_ = skipped; }
  /// The distributed optimizer (null without one): its moments are the
  /// checkpoints' for the rank's range of the gradient buffer.
  DistributedOptimizer *distributedOptimizer() {
    return distributedOptimizer_.get();
  }

  /// Reads microBatchSize() samples of `data` from `first` into the token
  /// and label buffers (under context parallelism the rank's two chunks of
  /// each: readSamples); the views are valid until the next read. The
  /// cuda::Trainer reads its micro-batches here too.
  std::pair<host::TensorView, host::TensorView>
  readMicroBatch(data::SampleSource &data, int64_t first);

private:
  /// Fails before training if an iteration this run would save exists.
  void checkSaveDirectory() const;
  /// Runs `executor` on the micro-batch of `data` at sample `first` (the
  /// rank's rows of the global micro-batch `key`).
  /// With `reported`, adds train_step's reported losses to it.
  double runMicroBatch(host::Executor &executor, data::SampleSource &data,
                       int64_t first, const MicroBatchKey &key,
                       ReportedLosses *reported = nullptr);
  /// Reads the micro-batch's samples from `first` into tokens_ and labels_:
  /// whole, or under context parallelism this rank's two load-balanced
  /// chunks of each (chunks r and 2 cp - 1 - r of 2 cp, Megatron-LM's
  /// get_batch_on_this_cp_rank).
  void readSamples(data::SampleSource &data, int64_t first);

  const Bundle &bundle_;
  TrainerOptions options_;
  comm::RankContext *rank_ = nullptr;
  /// This rank's position along the data-parallel axis, and that axis' size.
  int64_t dataRank_ = 0, dataParallel_ = 1;
  std::string corpus_;
  std::string corpusName_;
  /// seqLength_ is the model's (a sample's); localSeq_ the step's tokens'
  /// (seqLength_ / contextSize_ under context parallelism).
  int64_t microBatch_ = 0, seqLength_ = 0, microBatches_ = 0, globalBatch_ = 0;
  int64_t localSeq_ = 0;
  /// Context parallelism: the size of the grid's context axis (1 without)
  /// and this rank's position along it.
  int64_t contextSize_ = 1, contextRank_ = 0;
  std::vector<int32_t> sampleTokens_, sampleLabels_;
  DType idType_ = DType::I32;

  std::unique_ptr<host::ThreadPool> pool_;
  std::unique_ptr<host::ParameterStore> parameters_;
  std::unique_ptr<host::Executor> trainStep_, evalStep_, predictStep_;
  /// Pipeline bundles: runs the schedule instead of train_step.
  std::unique_ptr<pipeline::PipelineRunner> pipeline_;
  std::unique_ptr<data::SampleSource> trainData_, validData_;
  std::unique_ptr<data::Tokenizer> tokenizer_;
  /// Token ids must be below it (model.vocab_size).
  int64_t vocabSize_ = 0;
  OptimizerConfig optimizerConfig_;
  /// With a gradient_buffer: the data-parallel reduction once per iteration
  /// (a pipeline rank's, over its own stages' buffer).
  std::unique_ptr<DataParallelBuffer> gradientBuffer_;
  /// One of the two steps the optimizer: replicated, or distributed.
  std::unique_ptr<Optimizer> optimizer_;
  std::unique_ptr<DistributedOptimizer> distributedOptimizer_;
  std::unique_ptr<LossScaler> lossScaler_;
  int64_t skippedIterations_ = 0;
  std::vector<IterationRecord> history_;
  std::vector<int32_t> tokens_, labels_;
  std::vector<int64_t> tokens64_, labels64_;
  uint64_t microStep_ = 0;
  int64_t startIteration_ = 0, startConsumed_ = 0;
};

} // namespace mtrt::train

#endif // MTRT_SRC_TRAIN_TRAINER_H
