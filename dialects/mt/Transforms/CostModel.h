//===- CostModel.h - Predicted times of ops and collectives -----*- C++ -*-===//
//
// The figures of data/cost-model.json (docs/Parallelism.md, "Overlapped
// communication"): what mt-schedule-collectives and --report overlap
// predict an op or a collective takes on one rank.
//
//===----------------------------------------------------------------------===//

#ifndef MT_TRANSFORMS_COSTMODEL_H
#define MT_TRANSFORMS_COSTMODEL_H

#include "mlir/IR/Operation.h"
#include "llvm/ADT/StringMap.h"
#include "llvm/Support/Error.h"

#include <algorithm>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace mlir::mt {

struct LinkCost {
  /// NCCL's bus bandwidth (nccl-tests' busbw), bytes per microsecond.
  double bytesPerUs = 0;
  double latencyUs = 0;
};

/// One collective's prediction.
struct CollectiveCost {
  llvm::StringRef kind;      // all_reduce, all_gather, reduce_scatter,
                             // all_to_all or shift
  int64_t groupSize = 1;     // ranks in the collective
  int64_t bytes = 0;         // the rank's payload (the larger side)
  bool network = false;      // between nodes (else NVLink)
  double us = 0;
};

/// Kernel times measured on a GPU (data/calibration-h200.json, written by
/// bench/make-calibration.py from megatron-train's
/// MTRT_CUDA_PROFILE_INSTRUCTIONS=1 lines; docs/Planner.md): an op whose
/// name and operand and result types were measured takes the measured
/// time; another GEMM or attention op takes its FLOPs at the throughput of
/// the measured one of the same op and element type nearest in FLOPs, and
/// another op its bytes at the bandwidth measured for its kind.
struct Calibration {
  std::string deviceName;
  /// "linear 8x2048x2048xbf16,2048x6144xbf16 -> 8x2048x6144xbf16": us.
  llvm::StringMap<double> microseconds;
  struct Rate {
    double flops = 0, us = 0;
  };
  /// By "op element-type" (e.g. "linear bf16"): each measured GEMM or
  /// attention instruction's FLOPs and time, in FLOPs order.
  llvm::StringMap<std::vector<Rate>> flopRates;
  /// By op name: the measured instructions' bytes and time, summed.
  llvm::StringMap<Rate> byteRates;

  static llvm::Expected<Calibration> parse(llvm::StringRef json,
                                           llvm::StringRef source);
  /// `path`'s calibration, or the built-in data/calibration-h200.json if
  /// empty.
  static llvm::Expected<Calibration> load(llvm::StringRef path);
  /// Whether the compiler was built with a data/calibration-h200.json.
  static bool hasBuiltin();
};

struct CostModel {
  std::string deviceName;
  double launchUs = 0;
  double memoryBytesPerUs = 0;
  llvm::StringMap<double> gemmFlopsPerUs; // by element type: bf16, f16, f32
  double attentionForwardFlopsPerUs = 0, attentionBackwardFlopsPerUs = 0;
  int64_t gpusPerNode = 1;
  LinkCost nvlink, network;
  /// Measured kernel times, when given (the planner's); scaled by
  /// `calibrationScale` (the planned GPU's peak over the measured one's).
  std::shared_ptr<const Calibration> calibration;
  double calibrationScale = 1.0;

  /// Reads the JSON text of a cost model; errors name the key and the file.
  static llvm::Expected<CostModel> parse(llvm::StringRef json,
                                         llvm::StringRef source);
  /// `path`'s cost model, or the built-in data/cost-model.json if empty.
  static llvm::Expected<CostModel> load(llvm::StringRef path);

  /// The predicted time of one op on one rank (0 for views and
  /// declarations).
  double opMicroseconds(Operation *op) const;
  /// The runtime's addition of `gradient`, a train step's result, into its
  /// fp32 sum over micro-batches: nothing for a weight gradient whose GEMM
  /// accumulates into the sum itself (gradient accumulation fusion, as the
  /// CUDA executor plans it: an fp32 result of linear_weight_grad or
  /// linear_weight_bias_grad read only by the return), else one kernel that
  /// reads the gradient.
  double gradientAccumulationMicroseconds(Value gradient) const;
  /// The calibration's time for `op` (of `bytes` operands and results), or
  /// nothing when it measured nothing like it.
  std::optional<double> calibratedMicroseconds(Operation *op,
                                               double bytes) const;
  /// The prediction for a shard collective (all_reduce, all_gather,
  /// reduce_scatter, all_to_all, shift), from its grid's shape and its axes.
  CollectiveCost collective(Operation *op) const;
};

/// One rank's run as --report overlap and the planner simulate it: one
/// compute stream, and one communication stream that runs collectives in
/// the order they are issued. A collective in line with the kernels is
/// issued and waited for at once; a split one (mt.collective_start) is
/// waited for where its mt.collective_wait is.
struct CommunicationTimeline {
  /// The compute stream's clock, in microseconds.
  double now = 0;
  double computeUs = 0;
  /// Communication the compute stream waited for, and all of it.
  double exposedUs = 0, communicationUs = 0;

  /// Starts a collective of `us` once the compute stream is at `now` and
  /// the communication stream is free; returns its [begin, end).
  std::pair<double, double> issue(double us) {
    double begin = std::max(now, communicationFree);
    communicationFree = begin + us;
    communicationUs += us;
    return {begin, communicationFree};
  }
  /// The compute stream waits for a collective that ends at `end`; returns
  /// the time it waited.
  double wait(double end) {
    double exposed = std::max(0.0, end - now);
    exposedUs += exposed;
    now = std::max(now, end);
    return exposed;
  }
  void compute(double us) {
    now += us;
    computeUs += us;
  }

private:
  double communicationFree = 0;
};

} // namespace mlir::mt

#endif // MT_TRANSFORMS_COSTMODEL_H
