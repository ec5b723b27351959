// The runtime-owned parameters of a bundle: values, gradients and AdamW's
// moments.
#ifndef MTRT_SRC_HOST_PARAMETERSTORE_H
#define MTRT_SRC_HOST_PARAMETERSTORE_H

#include "core/Bundle.h"
#include "core/Fp8State.h"
#include "host/HostTensor.h"

#include <cstdint>
#include <optional>
#include <vector>

namespace mtrt::host {

class ThreadPool;

/// Holds, for every entry of a bundle's parameter table (by parameter
/// index), its value, its gradient buffer and AdamW's first and second
/// moments, each of the rank's shard shape (the global shape for parameters
/// without split_axes, and for bundles without a grid), stored in one
/// floating type (F32, or F64 for gradient checks). Everything starts at
/// zero.
///
/// Executors bind get_parameter to `value` and accumulate_gradient to
/// `gradient`; the optimizer reads gradients and updates values and moments.
///
/// Thread-safety: none; one trainer (or test) drives it.
class ParameterStore {
public:
  /// Throws Error: INVALID_ARGUMENT if floatType is not F32 or F64,
  /// UNIMPLEMENTED for bf16/f16 parameters (the host backend computes in
  /// f32 or f64).
  /// `coordinates`: the rank's position in the bundle's grid, which picks
  /// its shards (empty: rank 0). Without `optimizerState`, AdamW's moments
  /// are empty: the distributed optimizer holds them for the rank's part of
  /// the gradient buffer only.
  ParameterStore(const Bundle &bundle, DType floatType = DType::F32,
                 std::vector<int64_t> coordinates = {},
                 bool optimizerState = true);

  size_t size() const { return entries_.size(); }
  const Parameter &info(size_t i) const { return *entries_[i].info; }
  DType floatType() const { return floatType_; }
  /// The rank's grid coordinates; empty without a grid.
  const std::vector<int64_t> &coordinates() const { return coordinates_; }
  /// The offset of parameter i's shard in the global tensor, per dimension.
  std::vector<int64_t> shardOffsets(size_t i) const;
  /// Whether this rank holds parameter i: always, but in a pipeline bundle,
  /// where only the pipeline ranks that run its stages do (one, or for a
  /// table tied across stages its embedding group; the others have empty
  /// tensors for it).
  bool holds(size_t i) const {
    return coordinates_.empty() ||
           entries_[i].info->heldOnPipelineRank(coordinates_[0]);
  }
  /// The sum of the parameters' (shards') element counts.
  int64_t numElements() const { return numElements_; }

  /// Whether expAvg and expAvgSq hold the moments of every parameter.
  bool hasOptimizerState() const { return optimizerState_; }
  /// The bytes of AdamW's moments the store holds.
  size_t optimizerStateBytes() const;

  Tensor &value(size_t i) { return entries_[i].value; }
  Tensor &gradient(size_t i) { return entries_[i].gradient; }
  Tensor &expAvg(size_t i) { return entries_[i].expAvg; }
  Tensor &expAvgSq(size_t i) { return entries_[i].expAvgSq; }
  const Tensor &value(size_t i) const { return entries_[i].value; }
  const Tensor &gradient(size_t i) const { return entries_[i].gradient; }

  /// Sets every value as the manifest says: normal (N(0, std^2) from the
  /// counter-based generator keyed on (seed, parameter index, element
  /// index in the global tensor, whatever the shard), as Megatron-LM's
  /// init_method_normal), zeros or ones. Also
  /// zeroes gradients and moments.
  void initialize(ThreadPool &pool, uint64_t seed);

  /// Zeroes every gradient buffer (before an iteration's micro-batches).
  void zeroGradients(ThreadPool &pool);

  /// Whether the bundle trains GEMMs in FP8 with delayed scaling' state
  /// (an fp8 section); fp8() is that state, which fp8_scale reads and
  /// fp8_update advances. initialize() resets it (scales 1, histories 0).
  bool hasFp8() const { return fp8_.has_value(); }
  Fp8State &fp8() { return *fp8_; }
  const Fp8State &fp8() const { return *fp8_; }

private:
  struct Entry {
    const Parameter *info = nullptr;
    Tensor value, gradient, expAvg, expAvgSq;
  };
  std::vector<Entry> entries_;
  DType floatType_;
  std::vector<int64_t> gridShape_, coordinates_;
  int64_t numElements_ = 0;
  bool optimizerState_ = true;
  std::optional<Fp8State> fp8_;
};

} // namespace mtrt::host

#endif // MTRT_SRC_HOST_PARAMETERSTORE_H
