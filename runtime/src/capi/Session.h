// The object behind mtrt_session_t: one rank of a bundle in training, its
// batch and its counters, over a SessionBackend.
#ifndef MTRT_SRC_CAPI_SESSION_H
#define MTRT_SRC_CAPI_SESSION_H

#include "capi/SessionBackend.h"
#include "comm/RankContext.h"
#include "core/Bundle.h"
#include "mtrt/mtrt.h"
#include "train/LossScaler.h"

#include <map>
#include <memory>
#include <string>
#include <vector>

namespace mtrt::capi {

/// One rank of a bundle in training. The C functions in SessionApi.cpp
/// check pointers and struct sizes; everything else is checked here and
/// thrown as Error with the code the header documents.
///
/// Thread-safety: none (mtrt_session_t's rule).
class Session {
public:
  /// `options` has been completed with defaults. `world` (may be null) must
  /// outlive the session.
  Session(std::shared_ptr<const Bundle> bundle,
          const mtrt_session_options_t &options, comm::Communicator *world);
  ~Session();

  const Bundle &bundle() const { return *bundle_; }
  SessionBackend &backend() { return *backend_; }
  int64_t microBatch() const { return microBatch_; }
  int64_t seqLength() const { return seqLength_; }
  DType idType() const { return idType_; }

  void setBatch(const mtrt_tensor_t &tokens, const mtrt_tensor_t &labels,
                mtrt_batch_mode_t mode);
  double accumulate();
  mtrt_step_metrics_t apply();
  double evaluate();
  const mtrt_step_metrics_t &metrics() const { return metrics_; }

  size_t parameterCount() const { return bundle_->parameters().size(); }
  /// The index of parameter `name`; throws NOT_FOUND naming it and a few
  /// that exist.
  size_t parameterIndex(const std::string &name) const;
  /// Parameter i as the session stores it (data: the backend's memory).
  mtrt_tensor_t parameterView(size_t i);
  /// Copies parameter i to or from the caller's tensor, after checking its
  /// dtype, shape and memory.
  void copyParameter(size_t i, const mtrt_tensor_t &tensor, bool toCaller);

  void saveCheckpoint(const std::string &directory);
  void loadCheckpoint(const std::string &directory);

private:
  /// Where the next step reads its batch.
  struct Batch {
    BatchView view;
    bool set = false;
  };
  /// INVALID_ARGUMENT unless `tensor` lies in host memory or this session's
  /// device memory; returns whether it is device memory.
  bool checkMemory(const mtrt_tensor_t &tensor, const char *what) const;
  /// "bundle 'b''s pipeline schedule takes M micro-batches per optimizer
  /// step, and K are accumulated: ", the start of both count errors.
  std::string scheduleCount(const PipelineInfo &pipeline) const;

  std::shared_ptr<const Bundle> bundle_;
  std::unique_ptr<comm::RankContext> rank_;
  std::unique_ptr<SessionBackend> backend_;
  int64_t microBatch_ = 0, seqLength_ = 0;
  DType idType_ = DType::I32;
  std::map<std::string, size_t, std::less<>> parameterIndex_;

  Batch batch_;
  std::vector<int64_t> batchShape_;
  /// Copied host batches, in the bundle's id type.
  std::vector<uint8_t> tokens_, labels_;

  /// Optimizer steps taken; micro-batches run by train_step; the samples
  /// they consumed over all data ranks (keys dropout: mtrt.h,
  /// mtrt_session_accumulate); micro-batches accumulated since the last
  /// step and their losses' sum.
  int64_t iteration_ = 0;
  uint64_t seed_ = 0;
  train::OptimizerConfig optimizer_;
  uint64_t microStep_ = 0;
  uint64_t consumedSamples_ = 0;
  /// fp16 bundles: megatron-train --fp16's loss scaler, and the steps that
  /// skipped their update (AdamW and the schedule count the others).
  std::unique_ptr<train::LossScaler> lossScaler_;
  int64_t skipped_ = 0;
  int64_t accumulated_ = 0;
  double lossSum_ = 0;
  /// The reported losses of the micro-batches accumulated since the last
  /// step (summed), or of the schedule.
  train::ReportedLosses reportedSum_;
  /// Pipeline bundles: the micro-batches accumulated since the last step,
  /// which the schedule runs at apply (host memory, the bundle's id type).
  std::vector<std::vector<uint8_t>> pendingTokens_, pendingLabels_;
  mtrt_step_metrics_t metrics_{};
};

/// The DType behind an mtrt_dtype_t; INVALID_ARGUMENT naming `what` for
/// values outside the enum.
DType toDType(mtrt_dtype_t dtype, const char *what);
mtrt_dtype_t toCDType(DType dtype);
/// "[8, 128] i32 in host memory".
std::string describe(const mtrt_tensor_t &tensor);

} // namespace mtrt::capi

#endif // MTRT_SRC_CAPI_SESSION_H
