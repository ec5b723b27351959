// Megatron-LM's training loop for one rank on one GPU.
#ifndef MTRT_SRC_CUDA_TRAINER_H
#define MTRT_SRC_CUDA_TRAINER_H

#include "core/Bundle.h"
#include "cuda/Context.h"
#include "train/Trainer.h"
#include "train/TrainingLoop.h"

#include <iosfwd>
#include <memory>
#include <string>
#include <utility>
#include <vector>

namespace mtrt::comm {
class RankContext;
} // namespace mtrt::comm

namespace mtrt::cuda {

class DataParallelBuffer;
class DistributedOptimizer;
class Executor;
class GradientUnscaler;
class Optimizer;
class ParameterStore;
class PipelineRunner;
class SharedArena;

/// train::Trainer's loop with the step on the GPU: the same options, data
/// order, micro-batches, optimizer semantics and logs, so that the same seed
/// gives the host's losses to rounding.
///
/// It is built on a host train::Trainer, which supplies what does not depend
/// on the backend: every option and bundle check, the learning-rate
/// schedule, the loss scaler of --fp16 (whose unscale and overflow check run
/// on the device, GradientUnscaler; the step itself computes in float32 or,
/// for bf16 bundles, bf16: fp16 GEMM operands are not implemented), the seeded initial parameters (initialized on the CPU and
/// uploaded, so both backends start from the same bits) and greedy sampling
/// (on the CPU, after the trained parameters are copied back).
///
/// Checkpoints (--save, --load; docs/Checkpoints.md) go through the host
/// trainer too (cuda/TrainerCheckpoint.cpp): the device's parameters and
/// AdamW moments are copied into its store and saved by the same code in
/// the same format, and a loaded checkpoint is uploaded (the bf16 copies
/// rounded again), so either backend resumes the other's checkpoints.
///
/// Thread-safety: none.
class Trainer {
public:
  /// Throws Error as train::Trainer does, or UNAVAILABLE without a GPU.
  ///
  /// With `rank` (prepared or not), trains one rank of a grid of tensor,
  /// context and data parallelism: the host trainer initializes the rank's
  /// shards and picks its samples (a context rank's two chunks of each), the executors run its collectives through the
  /// rank's communicators, the gradient norm is the world's. With a
  /// gradient_buffer, the gradients are reduced over the data-parallel
  /// ranks once per iteration on the device (DataParallel.h), and with the
  /// distributed optimizer AdamW steps the rank's shard of them. A pipeline
  /// bundle runs its schedule (PipelineRunner, cuda/PipelineStages.h) with
  /// its stages' activations on the device.
  Trainer(const Bundle &bundle, std::string corpus, std::string corpusName,
          const train::TrainerOptions &options,
          const ContextOptions &device = {},
          comm::RankContext *rank = nullptr);
  ~Trainer();

  /// Runs options.trainIters iterations (then an evaluation, if enabled),
  /// writing Megatron-LM-style lines to `out`.
  void train(std::ostream &out);

  /// The mean eval_step loss over evalIters global batches of the
  /// validation split, as train::Trainer::evaluate.
  double evaluate();

  /// `prompt` continued as train::Trainer::sample does (with several ranks,
  /// a collective), from the current parameters, on the device:
  /// predict_step, or a pipeline's predict stages, each in an arena of its
  /// own made at the first call. Per token, only the V logits it is drawn
  /// from are copied to the host.
  std::string sample(const std::string &prompt, int64_t tokens,
                     const train::SamplingOptions &sampling = {});

  const std::vector<train::IterationRecord> &history() const {
    return history_;
  }
  ParameterStore &parameters() { return *parameters_; }
  Context &context() { return *context_; }
  /// The host trainer this one is built on; its parameter store holds the
  /// initial values until copyParametersToHost().
  train::Trainer &host() { return *host_; }
  /// Copies the device's parameters (values, gradients, moments) into the
  /// host trainer's store, or the other way round (after the host store was
  /// changed, e.g. by loading weights).
  void copyParametersToHost();
  void uploadParametersFromHost();

private:
  /// Position `position`'s V logits of `logits` (device memory, [.., V] of
  /// `type`, batch row 0 first) on the host, after the context's stream.
  std::vector<double> copyLogitsRow(DType type, const void *logits,
                                    int64_t position, int64_t vocab);
  /// The first sample of micro-batch `microBatch` of an iteration (or an
  /// evaluation) on this rank, from the iteration's first: data rank d
  /// reads rows [d * b, (d + 1) * b) of each global micro-batch of b * dp
  /// samples, as the host trainer.
  int64_t sampleOffset(int64_t microBatch) const;
  /// The tokens and labels of the micro-batch at sample `first` (host
  /// memory, valid until the next call).
  std::pair<host::TensorView, host::TensorView>
  readMicroBatch(data::SampleSource &data, int64_t first);
  /// --load, before the loop: restores the newest checkpoint of the
  /// directory (through the host trainer) onto the device; checks that
  /// --save would overwrite nothing. Returns where the loop starts.
  train::LoopStart resume(train::TrainingLog &log);
  /// --save: the state after `iteration`, which consumed `consumed` samples.
  void saveCheckpoint(int64_t iteration, int64_t consumed,
                      train::TrainingLog &log);
  /// Runs `executor` on the micro-batch of `data` at sample `first` (the
  /// rank's rows of the global micro-batch `key`).
  /// With `reported`, adds train_step's reported losses to it.
  double runMicroBatch(Executor &executor, data::SampleSource &data,
                       int64_t first, const MicroBatchKey &key,
                       train::ReportedLosses *reported = nullptr);

  const Bundle &bundle_;
  train::TrainerOptions options_;
  std::string corpusName_;
  /// Whether this rank writes the logs (rank 0, or the only one).
  bool logs_ = true;
  std::unique_ptr<train::Trainer> host_;
  std::unique_ptr<Context> context_;
  std::unique_ptr<ParameterStore> parameters_;
  /// Whether the gradients live in train_step's arena
  /// (ParameterStore::GradientStorage::Arena): one micro-batch per
  /// iteration, one rank's step without a data-parallel gradient buffer,
  /// no pipeline, no loss scaling.
  bool gradientsInArena_ = false;
  /// The one arena of train_step and eval_step (declared before them: it
  /// outlives them).
  std::unique_ptr<SharedArena> arena_;
  std::unique_ptr<Executor> trainStep_, evalStep_;
  /// sample()'s, made at its first call.
  std::unique_ptr<Executor> predictStep_;
  comm::RankContext *rank_ = nullptr;
  /// Pipeline bundles: runs the schedule instead of train_step.
  std::unique_ptr<PipelineRunner> pipeline_;
  std::unique_ptr<Optimizer> optimizer_;
  /// With a gradient_buffer: the data-parallel reduction; with the
  /// distributed optimizer, that optimizer instead of optimizer_.
  std::unique_ptr<DataParallelBuffer> gradientBuffer_;
  std::unique_ptr<DistributedOptimizer> distributedOptimizer_;
  /// --fp16: the device side of the host trainer's loss scaler.
  std::unique_ptr<GradientUnscaler> unscaler_;
  int64_t skippedIterations_ = 0;
  /// The host trainer's (validData_ null without evaluation).
  data::SampleSource *trainData_ = nullptr, *validData_ = nullptr;
  std::vector<train::IterationRecord> history_;
  std::vector<int32_t> tokens_, labels_;
  std::vector<int64_t> tokens64_, labels64_;
  DType idType_ = DType::I32;
  /// Context parallelism: the step reads the rank's chunks of each sample
  /// (train::Trainer::readMicroBatch).
  bool contextParallel_ = false;
  uint64_t microStep_ = 0;
};

} // namespace mtrt::cuda

#endif // MTRT_SRC_CUDA_TRAINER_H
