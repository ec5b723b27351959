// Runs one function of a bundle on the CPU with the host reference kernels.
#ifndef MTRT_SRC_HOST_EXECUTOR_H
#define MTRT_SRC_HOST_EXECUTOR_H

#include "core/Bundle.h"
#include "core/MicroBatchKey.h"
#include "host/HostTensor.h"

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

namespace mtrt {
class ValueTrace;
} // namespace mtrt

namespace mtrt::comm {
class RankContext;
} // namespace mtrt::comm

namespace mtrt::host {

class ParameterStore;
class ThreadPool;

/// One arena for executors that never run at the same time (a pipeline
/// rank's stage functions, which its schedule runs one after another): as
/// large as the largest of theirs, not their sum. Executors reserve their
/// bytes when they are made; the arena is allocated at the first run. What
/// one run leaves in it is the next run's garbage: executors copy their
/// outputs out and read their inputs where the caller keeps them.
///
/// Thread-safety: the thread of its executors only.
class SharedArena {
public:
  /// Room for `bytes` more. Throws Error (FAILED_PRECONDITION) after the
  /// arena was allocated, if it is smaller.
  void reserve(size_t bytes);
  /// The arena (allocated at the first call).
  void *data();
  size_t bytes() const { return bytes_; }

private:
  Buffer buffer_;
  size_t bytes_ = 0;
};

/// Executes a function's instruction stream in order, one kernel call per
/// instruction (kernels parallelize internally over the ThreadPool).
///
/// Values live in one arena at the offsets of the bundle's memory plan
/// (docs/BundleFormat.md, "Memory plan"; validated when the bundle was read),
/// scaled by 2 when the store computes in f64, which keeps blocks disjoint.
/// Bundles without a plan get the old scheme: values are allocated when an
/// instruction defines them and returned to a free list, keyed by size, at
/// the instruction that lists them in `free`. Either way, after the first
/// run, runs allocate nothing; kernel scratch comes from the free list. Every floating value is stored
/// in the ParameterStore's float type (f32, or f64 for gradient checks),
/// whatever f32/f64 the bundle declares; bf16 and f16 are rejected. Ids are
/// stored as declared (i32 or i64). get_parameter binds a view of the
/// store's value (no copy); accumulate_gradient adds into its gradient.
///
/// Shapes were checked when the bundle was loaded; at run time the executor
/// checks only what data can break: token ids and labels outside the
/// vocabulary (OUT_OF_RANGE, naming the function, the instruction, the id and
/// the vocabulary size).
///
/// Bundles for several ranks (a manifest `grid`): each rank runs its own
/// executor, given the rank's RankContext; collectives go to the
/// communicator of their group, all_slice copies the rank's block without
/// communication. Without a RankContext, only collectives over groups of one
/// rank are allowed (they copy).
///
/// Thread-safety: one run at a time per executor. Executors of one store may
/// not run concurrently either (they share gradient buffers).
class Executor {
public:
  /// Prepares `bundle`'s function `functionName`. The bundle, the store and
  /// the pool must outlive the executor. Throws Error: NOT_FOUND when the
  /// bundle has no such function (naming the ones it has), UNIMPLEMENTED for
  /// f16 values (bf16 ones are stored in the float type and rounded where
  /// they are written), INVALID_ARGUMENT if the store is another bundle's or
  /// `rank`'s grid is not the bundle's, FAILED_PRECONDITION for a collective
  /// over several ranks without a `rank` (which must outlive the executor).
  /// With `sharedArena` (which must outlive it), the function's values live
  /// in that arena instead of one of its own.
  Executor(const Bundle &bundle, std::string_view functionName,
           ParameterStore &parameters, ThreadPool &pool,
           comm::RankContext *rank = nullptr,
           SharedArena *sharedArena = nullptr);
  ~Executor();
  Executor(const Executor &) = delete;
  Executor &operator=(const Executor &) = delete;

  const Function &function() const { return *function_; }
  /// The storage type of value `v`: the store's float type, I32 or I64.
  DType storageType(int64_t v) const;

  /// Runs the function once on `inputs` (one per function input, of its
  /// declared shape and storage type) and returns copies of its outputs.
  /// `key` says which micro-batch it is: its first sample keys the dropout
  /// masks (core/Random.h), its step names the collectives. Throws Error:
  /// INVALID_ARGUMENT for inputs of the wrong count, shape or type;
  /// OUT_OF_RANGE for ids outside the vocabulary.
  std::vector<Tensor> run(const std::vector<TensorView> &inputs,
                          const MicroBatchKey &key);

  /// fp16 loss scaling: from the next run on, the backward pass's seed (the
  /// fill marked `loss_seed`, the loss's gradient) is its value times
  /// `scale`. Powers of two keep the gradients exact multiples of the fp32
  /// ones.
  void setLossScale(double scale) { lossScale_ = scale; }

  /// Called with each instruction's position once it has run, until set
  /// to nullptr: the last micro-batch's gradient buckets start there
  /// (DataParallelBuffer::afterInstruction).
  void setInstructionObserver(std::function<void(size_t)> observer) {
    observer_ = std::move(observer);
  }

  /// The most bytes of values (and kernel scratch) live at once, over all
  /// runs so far; with a memory plan, the arena's size plus the scratch.
  size_t peakBytes() const { return peakBytes_; }
  /// The arena's bytes when the executor runs in the bundle's memory plan
  /// (what it needs of a shared arena), else 0.
  size_t arenaBytes() const { return arenaBytes_; }

private:
  struct Slot {
    void *data = nullptr;
    Buffer owned; // empty for inputs and parameter views
  };

  void *allocate(int64_t value);
  char *arenaData();
  void release(int64_t value);
  Buffer takeBuffer(size_t bytes);
  void giveBuffer(Buffer buffer);
  std::string where(size_t position) const;

  template <typename T>
  void execute(size_t position, const Instruction &inst,
               const MicroBatchKey &key);
  template <typename T>
  void collective(size_t position, const Instruction &inst, uint64_t step);
  /// all_to_all (expert parallelism's dispatch): block d of the operand to
  /// rank d of the group, block s of the result from rank s, for the float
  /// rows (T) and the i32 routing alike.
  template <typename T>
  void allToAll(size_t position, const Instruction &inst, uint64_t step);
  /// Rounds the results `inst` declares bf16 to nearest even, in place:
  /// the host stores them in its float type, at the values bf16 holds
  /// (mixed precision, docs/MixedPrecision.md).
  void roundBf16Results(const Instruction &inst);
  /// Appends each floating result of `inst` to the value trace.
  void traceResults(ValueTrace &trace, size_t position,
                    const Instruction &inst) const;

  const Bundle &bundle_;
  const Function *function_ = nullptr;
  ParameterStore &parameters_;
  ThreadPool &pool_;
  comm::RankContext *rank_ = nullptr;
  DType floatType_;
  double lossScale_ = 1.0;
  std::function<void(size_t)> observer_;

  std::vector<Slot> slots_;
  /// The memory plan's arena (its own, or the shared one) and its offsets'
  /// scale: the float type's size over the smallest declared float size (2
  /// for f64 storage of f32 values, 4 for f64 storage of bf16 ones).
  Buffer arena_;
  SharedArena *sharedArena_ = nullptr;
  size_t arenaBytes_ = 0;
  size_t arenaScale_ = 1;
  std::multimap<size_t, Buffer> spare_;
  size_t liveBytes_ = 0;
  size_t peakBytes_ = 0;

  friend class ScratchBuffer;
};

} // namespace mtrt::host

#endif // MTRT_SRC_HOST_EXECUTOR_H
