// The runtime-owned parameters of a bundle on one GPU: values, gradients and
// AdamW's moments, each kind in one flat device array.
#ifndef MTRT_SRC_CUDA_PARAMETERSTORE_H
#define MTRT_SRC_CUDA_PARAMETERSTORE_H

#include "core/Bundle.h"
#include "cuda/Context.h"
#include "host/HostTensor.h"

#include <cuda_bf16.h>

#include <cstdint>
#include <vector>

namespace mtrt::host {
class ParameterStore;
} // namespace mtrt::host

namespace mtrt::cuda {

/// The device twin of host::ParameterStore, in f32. Parameter i's value,
/// gradient and moments live at the same offset of four flat arrays (two
/// without the optimizer state: the distributed optimizer, DataParallel.h,
/// keeps the moments of its shard of the gradient buffer); every
/// parameter starts on a 256-byte boundary and the padding between them is
/// zero (so sums over a whole flat array, like the gradient norm, see only
/// the parameters). Everything starts at zero.
///
/// Gradients in the arena (GradientStorage::Arena, docs/Memory.md): when an
/// iteration runs train_step once, each parameter's gradient is the train
/// step's own result, which its arena keeps from the weight-gradient kernel
/// to the end of the step, and the next step overwrites. The store then
/// holds no gradient array (the flat arrays are values and moments): the
/// executor binds each gradient to its slot (bindGradients), the optimizer
/// reads them there, and no gradient memory is live during the forward
/// pass, where the step peaks. As PyTorch frees .grad between steps.
///
/// Mixed precision (a bundle compiled with precision bf16): each parameter
/// that a GEMM of the bundle reads straight from get_parameter
/// (gemmReadParameters) also has a persistent bf16 copy of its value, on a
/// 256-byte boundary of one more flat array. GEMMs take it as their bf16
/// operand (Executor::bf16Operands); everything that changes the master
/// writes it too: initialize, upload, and the optimizer's AdamW kernel in
/// the same pass as the fp32 update. Whoever writes a value some other way
/// calls refreshBf16Copies.
///
/// Thread-safety: none; one trainer (or test) drives it.
class ParameterStore {
public:
  /// Where the gradients live: in the store's flat array, or in the train
  /// step's arena (bound by bindGradients).
  enum class GradientStorage { Store, Arena };

  /// Throws Error: UNIMPLEMENTED for bf16/f16 parameters (the cuda backend
  /// computes in f32 for now), or the failed allocation's error.
  /// Without `optimizerState`, expAvg and expAvgSq are null and hold no
  /// memory.
  ParameterStore(const Bundle &bundle, Context &context,
                 bool optimizerState = true,
                 GradientStorage gradients = GradientStorage::Store);

  size_t size() const { return infos_.size(); }
  const Parameter &info(size_t i) const { return *infos_[i]; }
  /// The sum of the parameters' element counts.
  int64_t numElements() const { return numElements_; }
  Context &context() const { return context_; }

  float *value(size_t i) const { return at(kValue, i); }
  /// Null in GradientStorage::Arena before bindGradients.
  float *gradient(size_t i) const {
    if (gradientsInArena_)
      return boundGradients_.empty() ? nullptr : boundGradients_[i];
    return at(kGradient, i);
  }
  float *expAvg(size_t i) const {
    return hasOptimizerState() ? at(kExpAvg, i) : nullptr;
  }
  float *expAvgSq(size_t i) const {
    return hasOptimizerState() ? at(kExpAvgSq, i) : nullptr;
  }
  /// Whether expAvg and expAvgSq hold every parameter's moments.
  bool hasOptimizerState() const { return optimizerState_; }
  /// Whether the gradients live in the train step's arena
  /// (GradientStorage::Arena) rather than in the store.
  bool gradientsInArena() const { return gradientsInArena_; }
  /// GradientStorage::Arena: parameter i's gradient is `slots[i]` (device
  /// memory of count(i) floats that its owner keeps). Throws Error
  /// (FAILED_PRECONDITION) for a store that holds its gradients, or
  /// INVALID_ARGUMENT for a slot count other than size().
  void bindGradients(std::vector<float *> slots);
  /// Whether `train` (a bundle's train_step) lets the gradients live in its
  /// arena: it ends with exactly one accumulate_gradient per parameter, of
  /// an f32 value (declared so in a typed bundle) with the parameter's
  /// local element count. The trainer adds the other conditions (one
  /// micro-batch per iteration, no data-parallel gradient buffer, no
  /// pipeline, no loss scaling); docs/Memory.md states them.
  static bool gradientsFitArena(const Bundle &bundle, const Function &train);
  /// Parameter i's persistent bf16 copy, or null when it has none.
  __nv_bfloat16 *bf16Value(size_t i) const {
    return bf16Offsets_[i] < 0 ? nullptr
                               : bf16_.as<__nv_bfloat16>() + bf16Offsets_[i];
  }
  /// Element offset of parameter i in the flat arrays (value(i) -
  /// value(0)), and of its bf16 copy in the bf16 array (-1: none).
  int64_t offset(size_t i) const { return offsets_[i]; }
  int64_t bf16Offset(size_t i) const { return bf16Offsets_[i]; }
  __nv_bfloat16 *bf16Values() const { return bf16_.as<__nv_bfloat16>(); }
  /// The elements of all bf16 copies (padding included).
  int64_t bf16Elements() const { return bf16Flat_; }
  /// Rounds every bf16 copy from its fp32 master (enqueued on the stream).
  void refreshBf16Copies();
  /// Rounds parameter i's bf16 copy, if it has one.
  void refreshBf16Copy(size_t i);
  /// Whether [data, data + bytes) overlaps the fp32 values (a caller's
  /// write there must be followed by refreshBf16Copies).
  bool overlapsValues(const void *data, size_t bytes) const;

  /// The parameters that some GEMM of `bundle` (linear, linear_gelu,
  /// linear_gelu_grad, linear_add, matmul, the weight-gradient GEMMs) reads as
  /// operand A or B straight from a get_parameter, in any function: those with
  /// a bf16 copy under mixed precision. The compiler's memory plan
  /// (dialects/mt/Transforms/SideBuffers.cpp) and report (lib/Memory) apply
  /// the same rule.
  static std::vector<bool> gemmReadParameters(const Bundle &bundle);
  /// Elements of this rank's shard (the whole tensor in a one-rank bundle).
  int64_t count(size_t i) const { return infos_[i]->localType.numElements; }

  /// Every gradient, padding included, as one array of flatElements();
  /// null in GradientStorage::Arena.
  float *gradients() const {
    return gradientsInArena_ ? nullptr : buffer_.as<float>() + flat_;
  }
  int64_t flatElements() const { return flat_; }

  /// Sets every value as the manifest says, on the device, with the host's
  /// formulas (host::ParameterStore::initialize; a normal may differ from
  /// the host's in the last bit where the device's double log or cos does);
  /// zeroes gradients and moments; rounds the bf16 copies.
  void initialize(uint64_t seed);
  /// Zeroes the store's gradients (nothing in GradientStorage::Arena: each
  /// step writes them whole).
  void zeroGradients();

  /// Copies values, gradients and moments from / to a host store of the same
  /// bundle in f32 (upload then rounds the bf16 copies); the moments only
  /// when both stores hold them. In GradientStorage::Arena, upload leaves
  /// the gradients (each step's results) and download copies them from
  /// their slots once bound (zeros before). Throws Error (INVALID_ARGUMENT) for
  /// another bundle or float type. In a pipeline bundle, only the parameters
  /// the host store holds (its pipeline rank's; host::ParameterStore::holds)
  /// move; the others stay zero here (allocated but never read: the rank
  /// runs only its stages' functions).
  void upload(const host::ParameterStore &from);
  void download(host::ParameterStore &to) const;

  /// FP8 training's delayed-scaling state (a bundle with an `fp8` section,
  /// core/Fp8State.h): per meta its scale and amax history (newest first),
  /// device floats that fp8_scale reads and fp8_update advances. initialize
  /// sets the scales to 1 and the histories to 0; upload and download move
  /// them with the host store's (so checkpoints hold them).
  bool hasFp8() const { return fp8Metas_ > 0; }
  float *fp8Scale(size_t meta) const { return fp8_.as<float>() + meta; }
  float *fp8History(size_t meta) const {
    return fp8_.as<float>() + fp8Metas_ + meta * fp8HistoryLength_;
  }
  int64_t fp8HistoryLength() const { return fp8HistoryLength_; }

  /// Parameter i's value or gradient, copied to the host.
  host::Tensor valueToHost(size_t i) const;
  host::Tensor gradientToHost(size_t i) const;

private:
  /// What the flat arrays hold, in this order; kGradient is absent in
  /// GradientStorage::Arena, the moments without the optimizer state.
  enum Kind { kValue, kGradient, kExpAvg, kExpAvgSq };
  /// Whether the store holds flat array `kind`.
  bool holdsKind(int kind) const {
    return (kind != kGradient || !gradientsInArena_) &&
           (kind < kExpAvg || optimizerState_);
  }
  float *at(int kind, size_t i) const {
    int array = kind - (gradientsInArena_ && kind > kGradient ? 1 : 0);
    return buffer_.as<float>() + array * flat_ + offsets_[i];
  }
  host::Tensor toHost(const float *data, size_t i) const;
  void resetFp8();
  void checkPeer(const host::ParameterStore &other, const char *what) const;

  Context &context_;
  std::vector<const Parameter *> infos_;
  std::vector<int64_t> offsets_;
  int64_t flat_ = 0;
  int64_t numElements_ = 0;
  bool optimizerState_ = true;
  bool gradientsInArena_ = false;
  /// The flat arrays buffer_ holds (holdsKind).
  int arrays_ = 4;
  DeviceBuffer buffer_;
  std::vector<float *> boundGradients_;
  std::vector<int64_t> bf16Offsets_;
  int64_t bf16Flat_ = 0;
  DeviceBuffer bf16_;
  /// The metas' scales, then their histories (meta-major).
  size_t fp8Metas_ = 0;
  int64_t fp8HistoryLength_ = 0;
  DeviceBuffer fp8_;
};

} // namespace mtrt::cuda

#endif // MTRT_SRC_CUDA_PARAMETERSTORE_H
