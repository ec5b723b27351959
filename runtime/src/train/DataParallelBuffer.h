// One rank's contiguous gradient buffer: the data-parallel gradient reduction
// once per iteration, and the distributed optimizer's parameter gather.
#ifndef MTRT_SRC_TRAIN_DATAPARALLELBUFFER_H
#define MTRT_SRC_TRAIN_DATAPARALLELBUFFER_H

#include "core/Bundle.h"
#include "host/HostTensor.h"

#include <cstdint>
#include <map>
#include <memory>
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

namespace mtrt::train {

/// Where a rank's range of the gradient buffer meets one parameter.
struct BufferPiece {
  size_t parameter = 0;
  /// Elements from the start of the rank's range.
  int64_t shardOffset = 0;
  /// Elements from the start of the parameter's (flattened) shard.
  int64_t parameterOffset = 0;
  int64_t count = 0;
};

/// The distributed optimizer's shard of `bundle`'s gradient buffer for the
/// rank at `coordinates`, and the pieces of the parameters it holds (a
/// pipeline rank, those of its stages) in it, in the buffer's order. The
/// shard is group rank r's 1/group of the buffer, [r * size / group,
/// (r + 1) * size / group): one segment; or with per-bucket shards
/// (GradientBuffer::bucketShards) its 1/group of every bucket, one segment
/// per bucket, joined in bucket order. Without the distributed optimizer,
/// the whole buffer. The host's and the cuda backend's buffers share it.
struct BufferShard {
  /// Elements [begin, begin + size) of the buffer are elements
  /// [shardOffset, shardOffset + size) of the shard.
  struct Segment {
    int64_t begin = 0, size = 0, shardOffset = 0;
  };
  int64_t size = 0;
  std::vector<Segment> segments;
  std::vector<BufferPiece> pieces;
};
BufferShard bufferShard(const Bundle &bundle,
                        const std::vector<int64_t> &coordinates);

/// The buckets of `layout` holding a parameter that `function` reads
/// (get_parameter), in bucket order: a pipeline stage's forward function
/// gathers those before its first micro-batch (--overlap-param-gather).
std::vector<size_t> bucketsReadBy(const GradientBuffer &layout,
                                  const Function &function);

/// --overlap-param-gather's bookkeeping, shared by the host's and the cuda
/// backend's buffers: which buckets' parameter gathers the last optimizer
/// step deferred, and which of them are due where. Each take* returns the
/// pending buckets due there, in bucket order, and clears them.
class DeferredGathers {
public:
  /// Empty for a buffer without per-bucket shards.
  DeferredGathers() = default;
  explicit DeferredGathers(const GradientBuffer &layout) : layout_(&layout) {
    pending_.assign(layout.buckets.size(), false);
  }
  /// Every bucket's gather is deferred.
  void deferAll() { pending_.assign(pending_.size(), true); }
  bool any() const;
  /// Due before instruction `position` of `function` (gatherBefore).
  std::vector<size_t> takeBeforeInstruction(const std::string &function,
                                            size_t position);
  /// Read by `function` (a pipeline stage's forward function).
  std::vector<size_t> takeReadBy(const Function &function);
  std::vector<size_t> takeAll();

private:
  std::vector<size_t> take(const std::vector<bool> &due);

  const GradientBuffer *layout_ = nullptr;
  std::vector<bool> pending_;
  /// bucketsReadBy of each function asked about, as a mask.
  std::map<const Function *, std::vector<bool>> readBy_;
};

/// The bundle's gradient_buffer (docs/BundleFormat.md) on one rank, as
/// Megatron-LM's DistributedDataParallel keeps it: the parameters' (shards')
/// gradients flattened into one buffer in the compiler's layout, reduced over
/// the data-parallel group by the bundle's reduce_gradients once per
/// iteration, after the micro-batches have accumulated.
///
/// With the distributed optimizer, reduce_gradients reduce-scatters: this
/// rank receives the summed gradients of its shard of the buffer
/// (shardSegments()), which pieces() maps onto parameters; gatherParameters()
/// then all-gathers every rank's updated shard through the bundle's
/// gather_parameters, or with per-bucket shards bucket by bucket (with
/// --overlap-param-gather, deferred to the next step: beforeInstruction).
///
/// Thread-safety: none; the rank's thread drives it.
class DataParallelBuffer {
public:
  using Piece = BufferPiece;

  /// `bundle` has a gradient buffer; everything must outlive this.
  DataParallelBuffer(const Bundle &bundle, host::ParameterStore &parameters,
                     host::ThreadPool &pool, comm::RankContext &rank);
  ~DataParallelBuffer();

  bool distributed() const { return layout_.distributedOptimizer; }
  /// The grid axes of the group that shares the buffer.
  const std::vector<int64_t> &gridAxes() const { return layout_.gridAxes; }
  /// Whether parameter `i`'s gradient is in the buffer (expert
  /// parallelism's experts are not: their gradients are whole on the
  /// rank's expert-parallel group).
  bool contains(size_t i) const {
    for (int64_t p : layout_.parameters)
      if (p == static_cast<int64_t>(i))
        return true;
    return false;
  }

  /// Packs the store's gradients, runs reduce_gradients. Without the
  /// distributed optimizer the sum goes back into the store's gradients;
  /// with it, into shard(). With gradient buckets, reduces those the last
  /// micro-batch has not started (afterInstruction) instead, and takes the
  /// result from them.
  void reduceGradients();

  /// Whether the buffer is reduced in buckets (--overlap-grad-reduce).
  bool bucketed() const { return !layout_.buckets.empty(); }
  /// In the last micro-batch of an iteration: instruction `position` of
  /// `function` has run; starts the reduction of every bucket whose
  /// gradients are then complete (GradientBucket::readyAfter). On the host
  /// the reduction runs at once; the step then goes on.
  void afterInstruction(const std::string &function, size_t position);
  /// The log line of the buckets: how many, and how many the last
  /// reduceGradients() found started inside the step.
  std::string describeBuckets() const;

  /// The parts of the buffer the distributed optimizer's shard holds.
  const std::vector<BufferShard::Segment> &shardSegments() const {
    return shard_.segments;
  }
  int64_t shardSize() const { return shard_.size; }
  const std::vector<Piece> &pieces() const { return shard_.pieces; }
  /// The summed gradients of the rank's range (after reduceGradients).
  host::Tensor &shard() { return reduced_; }

  /// Packs the rank's shard of the store's values, runs gather_parameters,
  /// and writes every parameter from the gathered buffer. With
  /// `deferred` and the bundle's overlap_param_gather, only packs: each
  /// bucket is gathered by beforeInstruction in the next step's first
  /// micro-batch, or by finishParameterGather.
  void gatherParameters(bool deferred = false);
  /// Whether gatherParameters(true) defers (--overlap-param-gather).
  bool overlapsParameterGather() const { return layout_.overlapParamGather; }
  /// In the first micro-batch after a deferred gather: instruction
  /// `position` of `function` is next; gathers each bucket whose
  /// parameters it reads first (GradientBucket::gatherBefore).
  void beforeInstruction(const std::string &function, size_t position);
  /// A pipeline stage's forward function is about to run its first
  /// micro-batch after a deferred gather: gathers the buckets of the
  /// parameters it reads (bucketsReadBy).
  void beforeFunction(const Function &function);
  /// Gathers every bucket still deferred, in order (before anything else
  /// reads the parameters: the rest of the step, evaluation, checkpoints).
  void finishParameterGather();
  /// Whether a deferred gather is pending.
  bool parameterGatherPending() const { return deferred_.any(); }

private:
  template <typename T>
  void pack(bool values, int64_t begin, int64_t end, T *out);
  template <typename T> void unpack(const host::Tensor &from, bool values);
  template <typename T>
  void unpackValues(const T *from, int64_t begin, int64_t end);
  /// Packs bucket `b`'s gradients and reduces them: in place in buffer_,
  /// or with per-bucket shards into the rank's segment of reduced_.
  void reduceBucket(size_t b);
  /// Gathers bucket `b`'s parameters from buffer_ (packed by
  /// gatherParameters) and writes them.
  void gatherBucket(size_t b);

  const GradientBuffer &layout_;
  host::ParameterStore &parameters_;
  host::ThreadPool &pool_;
  std::unique_ptr<host::Executor> reduce_, gather_;
  /// One executor per bucket, and which have run this iteration.
  std::vector<std::unique_ptr<host::Executor>> buckets_;
  std::vector<bool> bucketDone_;
  /// Per-bucket shards: one gather executor per bucket, and the gathers
  /// the last optimizer step deferred.
  std::vector<std::unique_ptr<host::Executor>> bucketGathers_;
  DeferredGathers deferred_;
  /// Buckets started by afterInstruction this iteration, and in the last.
  int64_t startedInStep_ = 0, lastStartedInStep_ = 0;
  BufferShard shard_;
  /// The buffer (gradients packed for the reduction); the rank's shard of
  /// the summed gradients; its updated values, packed for the gather.
  host::Tensor buffer_, reduced_, packedValues_;
};

} // namespace mtrt::train

#endif // MTRT_SRC_TRAIN_DATAPARALLELBUFFER_H
