// The GPU trainer's checkpoints: the device's state goes through the host
// trainer's store and its checkpoint code (train/TrainerCheckpoint.cpp), so
// there is one format and one writer for both backends.
#include "cuda/Trainer.h"

#include "cuda/DataParallel.h"
#include "cuda/ParameterStore.h"
#include "train/TrainingLog.h"

namespace mtrt::cuda {

train::LoopStart Trainer::resume(train::TrainingLog &log) {
  // The host trainer finds, checks and loads the checkpoint into its store
  // (values and AdamW moments), restores the loss scaler (which this
  // trainer shares) and counts the skipped iterations.
  train::LoopStart start = host_->prepareCheckpoints(log);
  if (options_.load.empty() || host_->startIteration() == 0)
    return start;
  // The loaded state onto the device; upload rounds the bf16 copies again.
  parameters_->upload(host_->parameters());
  // The distributed optimizer's moments are its own, not the store's.
  if (distributedOptimizer_)
    distributedOptimizer_->upload(*host_->distributedOptimizer());
  skippedIterations_ = host_->skippedIterations();
  // The generator's position: the train_step micro-batches run before
  // (dropout keys on it), derived from the iteration as the host does.
  microStep_ = static_cast<uint64_t>(start.iteration *
                                     host_->microBatchesPerIteration());
  return start;
}

void Trainer::saveCheckpoint(int64_t iteration, int64_t consumed,
                             train::TrainingLog &log) {
  // Values and moments into the host store (one synchronization), and this
  // trainer's count of skipped iterations for the optimizer step it records.
  parameters_->download(host_->parameters());
  if (distributedOptimizer_)
    distributedOptimizer_->download(*host_->distributedOptimizer());
  host_->setSkippedIterations(skippedIterations_);
  host_->saveCheckpoint(iteration, consumed, log);
}

} // namespace mtrt::cuda
