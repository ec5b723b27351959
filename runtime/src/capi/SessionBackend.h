// What a session needs from a backend: run a step, step the optimizer, and
// reach the parameters' memory.
#ifndef MTRT_SRC_CAPI_SESSIONBACKEND_H
#define MTRT_SRC_CAPI_SESSIONBACKEND_H

#include "core/Bundle.h"
#include "core/MicroBatchKey.h"
#include "host/HostTensor.h"
#include "mtrt/mtrt.h"
#include "train/Checkpoint.h"
#include "train/Optimizer.h"
#include "train/TrainingLog.h"

#include <cstdint>
#include <functional>
#include <memory>
#include <utility>
#include <vector>

namespace mtrt::comm {
class RankContext;
} // namespace mtrt::comm

namespace mtrt::host {
class ParameterStore;
} // namespace mtrt::host

namespace mtrt::capi {

/// A micro-batch as the executors take it: host memory, or device memory of
/// the session's device (`onDevice`).
struct BatchView {
  host::TensorView tokens, labels;
  bool onDevice = false;
};

/// One rank's parameters, executors and optimizer on one backend. The
/// session (capi/Session.h) does the argument checks and the bookkeeping;
/// a backend only computes and moves bytes.
///
/// Thread-safety: none (the session's).
class SessionBackend {
public:
  virtual ~SessionBackend() = default;

  virtual mtrt_backend_t backend() const = 0;
  virtual int device() const = 0;
  virtual bool hasEvalStep() const = 0;

  /// Runs train_step (`train`, accumulating gradients and adding its
  /// reported losses to `reported`) or eval_step on `batch`; returns its
  /// loss. `key`'s first sample keys the dropout masks. A pipeline bundle
  /// evaluates `batch` through all its stages; it trains only by
  /// runSchedule.
  virtual double run(bool train, const BatchView &batch,
                     const MicroBatchKey &key,
                     train::ReportedLosses &reported) = 0;
  /// Pipeline bundles: runs the schedule once over the step's micro-batches
  /// (host memory), accumulating this rank's gradients; returns the sum of
  /// their losses, and sets `reported` to the sums of their reported
  /// losses, the same on every rank (a collective). Micro-batch m is keyed
  /// {first.step + m, first.firstSample + m * globalBatch}
  /// (ScheduleRunner::train).
  virtual double runSchedule(const std::vector<BatchView> &batches,
                             const MicroBatchKey &first, uint64_t globalBatch,
                             train::ReportedLosses &reported) = 0;
  virtual void zeroGradients() = 0;
  /// fp16: the loss scale train_step's loss seed is multiplied by.
  virtual void setLossScale(double scale) = 0;
  /// The data-parallel gradient reduction, once per step before the
  /// unscale and the optimizer (nothing without a gradient buffer).
  virtual void reduceGradients() = 0;
  /// fp16: multiplies every gradient by `factor`; whether any element on
  /// any rank is inf or nan (a collective over the ranks).
  virtual bool unscaleAndCheckFinite(double factor, int64_t iteration) = 0;
  virtual train::OptimizerStepResult step(int64_t iteration,
                                          double gradScale) = 0;

  /// Parameter i's value in the backend's memory (f32).
  virtual void *value(size_t i) = 0;
  /// Copies `bytes` from `from` to `to`; each is in host memory or the
  /// session's device memory as its flag says. Waits for the copy.
  virtual void copy(void *to, bool toDevice, const void *from,
                    bool fromDevice, size_t bytes) = 0;
  /// Device memory of `bytes` owned by the backend for a copied device
  /// batch (slot 0: tokens, 1: labels); reused while large enough.
  virtual void *batchBuffer(int slot, size_t bytes) = 0;

  /// The parameters (values, gradients, moments) in a host store: the host
  /// backend's own; a device backend copies its state into a host mirror.
  virtual host::ParameterStore &hostParameters() = 0;
  /// After the host store was changed: a device backend uploads it.
  virtual void hostParametersChanged() = 0;

  /// This rank's checkpoint tensors (train::storeCheckpointTensors), with
  /// the distributed optimizer's moments gathered (a collective then).
  virtual std::vector<train::CheckpointTensor>
  checkpointTensors(bool severalRanks) = 0;
  /// After a load filled the tensors of checkpointTensors(): take them.
  virtual void checkpointLoaded() = 0;

  /// The CUDA stream everything runs on; nullptr on the host.
  virtual void *stream() = 0;
};

/// A pipeline schedule's source of micro-batch m's tokens and labels: the
/// step's batches (host memory), which must outlive it.
inline std::function<std::pair<host::TensorView, host::TensorView>(int64_t)>
scheduleSource(const std::vector<BatchView> &batches) {
  return [&batches](int64_t m) {
    const BatchView &batch = batches[static_cast<size_t>(m)];
    return std::pair(batch.tokens, batch.labels);
  };
}

struct SessionBackendOptions {
  int device = 0;
  int threads = 0;
  bool tf32 = false;
  uint64_t seed = 1234;
  train::OptimizerConfig optimizer;
};

/// The host backend; `rank` (may be null) must outlive it.
std::unique_ptr<SessionBackend>
createHostBackend(const Bundle &bundle, const SessionBackendOptions &options,
                  comm::RankContext *rank);

/// The CUDA backend of one rank; `rank` (may be null) must outlive it.
/// Throws Error UNAVAILABLE when the library was built without CUDA or the
/// device does not exist.
std::unique_ptr<SessionBackend>
createCudaBackend(const Bundle &bundle, const SessionBackendOptions &options,
                  comm::RankContext *rank);

} // namespace mtrt::capi

#endif // MTRT_SRC_CAPI_SESSIONBACKEND_H
