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

#include <string>

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

struct CostModel {
  std::string deviceName;
  double launchUs = 0;
  double memoryBytesPerUs = 0;
  llvm::StringMap<double> gemmFlopsPerUs; // by element type: bf16, f16, f32
  double attentionForwardFlopsPerUs = 0, attentionBackwardFlopsPerUs = 0;
  int64_t gpusPerNode = 1;
  LinkCost nvlink, network;

  /// Reads the JSON text of a cost model; errors name the key and the file.
  static llvm::Expected<CostModel> parse(llvm::StringRef json,
                                         llvm::StringRef source);
  /// `path`'s cost model, or the built-in data/cost-model.json if empty.
  static llvm::Expected<CostModel> load(llvm::StringRef path);

  /// The predicted time of one op on one rank (0 for views and
  /// declarations).
  double opMicroseconds(Operation *op) const;
  /// The prediction for a shard collective (all_reduce, all_gather,
  /// reduce_scatter, all_to_all, shift), from its grid's shape and its axes.
  CollectiveCost collective(Operation *op) const;
};

} // namespace mlir::mt

#endif // MT_TRANSFORMS_COSTMODEL_H
