// Data parallelism on the GPU: the bundle's gradient buffer in device memory,
// its reduction and gather run by the CUDA executor, and Megatron-LM's
// distributed optimizer (AdamW state sharded over the data-parallel ranks).
#ifndef MTRT_SRC_CUDA_DATAPARALLEL_H
#define MTRT_SRC_CUDA_DATAPARALLEL_H

#include "core/Bundle.h"
#include "cuda/Context.h"
#include "cuda/GradientUnscaler.h"
#include "train/DataParallelBuffer.h"
#include "train/Optimizer.h"

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace mtrt::comm {
class RankContext;
} // namespace mtrt::comm

namespace mtrt::train {
class DistributedOptimizer;
} // namespace mtrt::train

namespace mtrt::cuda {

class Executor;
class ParameterStore;

/// train::DataParallelBuffer on the device: the parameters' (shards')
/// gradients packed into one device buffer in the compiler's layout
/// (docs/BundleFormat.md, "Gradient reduction"; the padding stays zero),
/// reduced over the data-parallel group by the bundle's reduce_gradients
/// on a cuda::Executor (its collectives are the executor's multi-rank
/// instructions), once per iteration after the micro-batches.
///
/// Without the distributed optimizer the all-reduced buffer is unpacked
/// into the store's gradients (every data-parallel rank then holds the
/// sum; cuda::Optimizer counts each replica once in the norm). With it,
/// reduce_gradients reduce-scatters and shard() is the rank's range of the
/// summed buffer (train::bufferShard: one range, or its part of every
/// bucket); gatherParameters() packs the rank's updated shard of the
/// values, all-gathers it with gather_parameters (or bucket by bucket) and
/// writes every parameter and its bf16 copy.
///
/// Packing and unpacking are device-to-device copies on the context's
/// stream; the reduced buffer is the executor's output, read in place in
/// its arena (Executor::run's keepOutputs).
///
/// Thread-safety: none; the rank's thread drives it.
class DataParallelBuffer {
public:
  /// `bundle` has a gradient buffer; everything must outlive this.
  DataParallelBuffer(const Bundle &bundle, ParameterStore &parameters,
                     comm::RankContext &rank);
  ~DataParallelBuffer();

  bool distributed() const { return layout_.distributedOptimizer; }
  /// The grid axes of the group that shares the buffer.
  const std::vector<int64_t> &gridAxes() const { return layout_.gridAxes; }
  /// Whether parameter `i`'s gradient is in the buffer (as
  /// train::DataParallelBuffer::contains: expert parallelism's experts are
  /// not).
  bool contains(size_t i) const {
    for (int64_t p : layout_.parameters)
      if (p == static_cast<int64_t>(i))
        return true;
    return false;
  }
  /// The rank's range of the buffer (the whole buffer when not
  /// distributed) and the parameters' pieces in it.
  const train::BufferShard &shard() const { return shard_; }

  /// Packs the store's gradients and runs reduce_gradients: the sum goes
  /// back into the store's gradients, or with the distributed optimizer
  /// into reduced().
  void reduceGradients();
  /// Whether the buffer is reduced in buckets (--overlap-grad-reduce).
  bool bucketed() const { return !layout_.buckets.empty(); }
  /// As train::DataParallelBuffer::afterInstruction: in the last
  /// micro-batch, enqueues the reduction of each bucket whose gradients
  /// instruction `position` of `function` completes, behind the step's
  /// work so far; its collective runs on the communication stream beside
  /// the rest of the step (Executor::setDeferredCollectiveJoin).
  /// reduceGradients reduces the others, joins them all and takes the
  /// results.
  void afterInstruction(const std::string &function, size_t position);
  /// The summed gradients of the rank's range (device memory, shard().size
  /// elements), after reduceGradients and until the next one.
  float *reduced() const { return reduced_; }

  /// Packs the rank's shard of the store's values, runs gather_parameters,
  /// and writes every parameter (and its bf16 copy) from the gathered
  /// buffer; with per-bucket shards bucket by bucket, and with `deferred`
  /// and the bundle's overlap_param_gather not yet (as
  /// train::DataParallelBuffer::gatherParameters).
  void gatherParameters(bool deferred = false);
  /// As train::DataParallelBuffer's. gatherParameters starts every
  /// bucket's gather at once on the communication stream; these join
  /// each (and write its parameters) before instruction `position` of
  /// `function`, before a stage's forward function, or all that are left,
  /// so that the gathers run beside the work before their first reader.
  void beforeInstruction(const std::string &function, size_t position);
  void beforeFunction(const Function &function);
  void finishParameterGather();
  bool parameterGatherPending() const { return deferred_.any(); }

private:
  /// Copies the store's gradients (or values) that lie in [begin, end) of
  /// the buffer to `out` (standing for element `begin`).
  void pack(bool values, int64_t begin, int64_t end, float *out);
  /// Writes the gradients (or values) of the parameters that start in
  /// [begin, end) of the buffer from `from` (standing for element `begin`).
  void unpack(const float *from, bool values, int64_t begin, int64_t end);
  /// Packs bucket `b`'s gradients and starts their reduction on the
  /// communication stream (the compute stream goes on).
  void reduceBucket(size_t b);
  /// Joins bucket `b`'s reduction and copies its result: in place in
  /// buffer_, or with per-bucket shards into the rank's part of
  /// shardGradients_.
  void joinBucket(size_t b);
  /// Joins bucket `b`'s gather (started by gatherParameters on the
  /// communication stream) and writes its parameters and their bf16
  /// copies.
  void gatherBucket(size_t b);

  const GradientBuffer &layout_;
  ParameterStore &parameters_;
  std::unique_ptr<Executor> reduce_, gather_;
  /// One executor per bucket, and which have run this iteration.
  std::vector<std::unique_ptr<Executor>> buckets_;
  std::vector<bool> bucketDone_;
  /// Each bucket's result, in its executor's arena until its next run.
  std::vector<const void *> bucketOutputs_;
  /// Per-bucket shards: one gather executor per bucket, and which gathers
  /// are deferred.
  std::vector<std::unique_ptr<Executor>> bucketGathers_;
  train::DeferredGathers deferred_;
  /// Each gather's result, in its executor's arena until its next run.
  std::vector<const void *> gatherOutputs_;
  train::BufferShard shard_;
  DeviceBuffer buffer_, shardGradients_, packedValues_;
  float *reduced_ = nullptr;
};

/// train::DistributedOptimizer on the device, after
/// DataParallelBuffer::reduceGradients: AdamW's moments for the rank's range
/// of the gradient buffer only (device memory, a 1/dp share, padded), and
/// the step over just those elements:
///
///   norm = sqrt(sum over the world of each piece's squares of
///     gradScale * g), the tensor-parallel replicas of unsplit parameters
///     counted once (train::countsInNorm, the buffer's axes distinct),
///     summed exactly (train::ExactSquareSum: the host's norm, bit for bit);
///   one launch (adamwStepChunks over the pieces' chunks) scales and clips
///   the shard's gradients as it reads them, updates the rank's elements of the
///   values, their moments and bf16 copies; gather_parameters all-gathers every
///   rank's range.
///
/// The formulas are cuda::Optimizer's (the host's), element by element, so
/// parameters differ from the replicated optimizer's only through the
/// norm's summation. One synchronization per step (the norm).
///
/// Thread-safety: none; the rank's thread drives it.
class DistributedOptimizer {
public:
  /// Everything must outlive the optimizer; `buffer` is distributed.
  DistributedOptimizer(ParameterStore &parameters, DataParallelBuffer &buffer,
                       const train::OptimizerConfig &config,
                       comm::RankContext &rank);

  /// As cuda::Optimizer::step, after buffer.reduceGradients(); with
  /// `deferGather`, as train::DistributedOptimizer::step.
  train::OptimizerStepResult step(int64_t iteration, double gradScale,
                                  bool deferGather = false);
  /// fp16 loss scaling, before step(): the rank's shard of the reduced
  /// buffer (the shards cover every gradient element once) *= `factor`;
  /// whether any element on any rank is inf or nan (train::foundOnAnyRank).
  bool unscaleAndCheckFinite(double factor, int64_t iteration);

  /// The bytes of AdamW's moments this rank holds.
  size_t stateBytes() const { return moments_.size(); }
  /// Copies the moments to / from the host's distributed optimizer of the
  /// same rank (whose tensors checkpoints save and load). Throws Error
  /// (INVALID_ARGUMENT) when its shard has another size or type.
  void download(train::DistributedOptimizer &to) const;
  void upload(const train::DistributedOptimizer &from);

private:
  /// train::DistributedOptimizer::updateExpertBiases's rule on this
  /// rank's pieces of the expert biases (through the host).
  void updateExpertBiases(int64_t iteration, const std::string &what);
  bool hasExpertBias_ = false;
  /// The parameters this rank holds outside the buffer (expert
  /// parallelism's experts, whole on their expert-parallel group: as
  /// train::DistributedOptimizer's localParameters), in order; their
  /// gradients are the store's, their AdamW moments localMoments_ (expAvg
  /// of every one, then expAvgSq), stepped by the localChunks_ table.
  std::vector<size_t> local_;
  int64_t localElements_ = 0;
  DeviceBuffer localMoments_;
  DeviceBuffer localChunks_;
  int64_t localChunkCount_ = 0;
  /// Where the local chunks' gradBegin counts from: the lowest of their
  /// gradients (in the store's array or the train step's arena).
  float *localGradientBase_ = nullptr;
  ParameterStore &parameters_;
  DataParallelBuffer &buffer_;
  train::OptimizerConfig config_;
  comm::RankContext &rank_;
  /// expAvg then expAvgSq, shard().size elements each.
  DeviceBuffer moments_;
  DeviceBuffer chunks_;
  int64_t chunkCount_ = 0;
  /// The norm's histogram of squares (squareHistogram).
  DeviceBuffer squares_;
  /// fp16's unscale and overflow check over the shard.
  GradientUnscaler unscaler_;
};

} // namespace mtrt::cuda

#endif // MTRT_SRC_CUDA_DATAPARALLEL_H
