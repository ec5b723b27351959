// One GPU as the CUDA backend uses it: the device, a stream, cuBLASLt, and
// the fault word kernels report bad ids through.
#ifndef MTRT_SRC_CUDA_CONTEXT_H
#define MTRT_SRC_CUDA_CONTEXT_H

#include "cuda/Fp8Gemm.h"
#include "cuda/Gemm.h"

#include <cuda_runtime_api.h>

#include <cstdint>
#include <memory>
#include <string>

namespace mtrt::cuda {

class CudnnAttention;

struct ContextOptions {
  /// The CUDA device index.
  int device = 0;
  /// GEMMs with TF32 inputs (faster, about 1e-3 relative error) instead of
  /// full fp32 multiplies (comparable with the host backend).
  bool tf32 = false;
  /// Synchronize after every instruction, so that a kernel that faults is
  /// named by the error instead of the next synchronizing call (slow; for
  /// debugging).
  bool syncEachInstruction = false;
  /// Time every instruction with CUDA events; executors then report the
  /// time per op (Executor::profile).
  bool profile = false;
  /// With profile: also each instruction's time, by op and operand and
  /// result types, as `calibration:` lines (Executor::profile; the
  /// planner's calibration, docs/Planner.md).
  bool profileInstructions = false;
  /// Time cuBLASLt's proposed algorithms at a GEMM's first run and keep the
  /// fastest (Gemm); off: the heuristic's first, deterministic.
  bool gemmTuning = true;
  /// Mixed precision: activations whose producer and readers all take bf16
  /// are held in bf16 (Executor::planBf16Values); off: every floating value
  /// in fp32, rounded to bf16 copies by the GEMMs that read it.
  bool bf16Values = true;
  /// Replay each function's instructions as one CUDA graph: captured at its
  /// second run (the first tunes the GEMMs and loads the kernels), then
  /// launched at once each run (Executor::run, StepGraph). Ignored while
  /// profiling or synchronizing after each instruction, and by functions
  /// with instructions that run on the host (multi-rank ones).
  bool cudaGraphs = true;
  /// Flash attention's backward sums dq in a fixed order (bit-identical
  /// runs); off: at head dimension 128 dq is summed by fp32 reductions in
  /// the dk/dv kernel, faster, the last bits varying between runs.
  bool deterministicAttention = false;
  /// Attention without dropout through cuDNN's fused attention where cuDNN
  /// takes the shapes (cuda/CudnnAttention.h: about twice the own kernels'
  /// speed on the H200); off (MTRT_CUDA_CUDNN_ATTENTION=0 in
  /// megatron-train): the own flash kernels everywhere.
  bool cudnnAttention = true;
  /// Attention's forward and backward, where cuDNN does not run them
  /// (dropout, ...), on the Hopper kernels (kernels/HopperAttention.h:
  /// wgmma and TMA; the forward 1.4-2.3x the own one on the H200) where
  /// they take the call (the backward: not the deterministic one); off
  /// (MTRT_CUDA_HOPPER_ATTENTION=0 in megatron-train): the own kernels.
  bool hopperAttention = true;
  /// In-process ranks sharing this GPU run their all-reduces, all-gathers,
  /// reduce-scatters and broadcasts as kernels reading each other's buffers
  /// (cuda::PeerGroup: asynchronous, and with CUDA_MODULE_LOADING=EAGER
  /// captured in CUDA graphs) instead of staging them through the host
  /// (off: MTRT_PEER_COLLECTIVES=0 in megatron-train). The executor waits
  /// for each graph with barriers before queueing more work on its
  /// stream, which kept the pipeline evaluations from stalling on the H200
  /// (bench/NOTES.md, session 22; docs/Parallelism.md, "In-process ranks
  /// on one GPU").
  bool peerCollectives = true;
  /// A step function whose collectives go through NCCL is captured in a
  /// CUDA graph like a one-rank one (NcclCommunicator captures its calls);
  /// off: it runs without one (MTRT_CUDA_NCCL_GRAPHS=1 in megatron-train
  /// turns it on). Off by default until several GPUs have run it.
  bool ncclGraphs = false;
  /// The training iteration (counted from 1) that cudaProfilerStart and
  /// cudaProfilerStop bracket, its optimizer step included, for a profiler
  /// started with collection off (`ncu --profile-from-start off`): one
  /// steady step's kernels, without the first iteration's GEMM tuning.
  /// 0: none (MTRT_CUDA_PROFILER_ITERATION=N in megatron-train).
  int64_t profilerIteration = 0;
};

/// Device memory owned by one pointer; freed at destruction.
class DeviceBuffer {
public:
  DeviceBuffer() = default;
  /// Throws Error (RESOURCE_EXHAUSTED when the device is out of memory)
  /// naming `what`.
  DeviceBuffer(size_t bytes, const std::string &what);
  ~DeviceBuffer();
  DeviceBuffer(DeviceBuffer &&other) noexcept;
  DeviceBuffer &operator=(DeviceBuffer &&other) noexcept;
  DeviceBuffer(const DeviceBuffer &) = delete;
  DeviceBuffer &operator=(const DeviceBuffer &) = delete;

  void *data() const { return data_; }
  template <typename T> T *as() const { return static_cast<T *>(data_); }
  size_t size() const { return size_; }

private:
  void *data_ = nullptr;
  size_t size_ = 0;
};

/// Everything on one device runs on one stream, in order, so device memory
/// can be reused as soon as the host has enqueued its last use.
///
/// Thread-safety: one thread drives a context and everything made from it.
class Context {
public:
  /// Selects the device and creates the stream and cuBLASLt. Throws Error:
  /// UNAVAILABLE when there is no such device (naming the device count),
  /// or the failed call's error.
  explicit Context(const ContextOptions &options = {});
  ~Context();
  Context(const Context &) = delete;
  Context &operator=(const Context &) = delete;

  /// CUDA devices present: 0, not an error, without a GPU or driver.
  static int deviceCount();

  const ContextOptions &options() const { return options_; }
  int device() const { return options_.device; }
  cudaStream_t stream() const { return stream_; }
  /// The stream where the collectives of this device's executors run
  /// beside the computation (made at the first call): one per context, not
  /// one per executor, so that in-process ranks sharing the GPU use few
  /// streams (two each), each in a hardware work queue of its own
  /// (CUDA_DEVICE_MAX_CONNECTIONS, 32 at most). An executor forks onto it
  /// after the compute stream's work and joins it back before its run
  /// ends, so executors that run one after another can share it.
  cudaStream_t communicationStream();
  Gemm &gemm() { return *gemm_; }
  /// The FP8 GEMMs (Fp8Gemm.h), made at the first call.
  Fp8Gemm &fp8Gemm();
  /// cuDNN's fused attention on this device, made at the first call; null
  /// when ContextOptions::cudnnAttention is off or cuDNN cannot be used
  /// (cudnnAttentionMissing() says why).
  CudnnAttention *cudnnAttention();
  const std::string &cudnnAttentionMissing() const { return cudnnMissing_; }
  /// "NVIDIA H200 (device 0, compute capability 9.0, 132 SMs, 139.8 GiB)".
  const std::string &description() const { return description_; }

  /// The fault word (device memory): 0, or the tag of the first kernel that
  /// met an id outside its table since the last resetFault().
  unsigned *fault() const { return fault_.as<unsigned>(); }
  void resetFault();
  /// Synchronizes and returns the fault word.
  unsigned readFault();

  /// Waits for the stream; a failure names `what`.
  void synchronize(const std::string &what);

private:
  ContextOptions options_;
  cudaStream_t stream_ = nullptr;
  cudaStream_t commStream_ = nullptr;
  std::unique_ptr<Gemm> gemm_;
  std::unique_ptr<Fp8Gemm> fp8Gemm_;
  std::unique_ptr<CudnnAttention> cudnn_;
  bool cudnnTried_ = false;
  std::string cudnnMissing_;
  DeviceBuffer fault_;
  std::string description_;
};

} // namespace mtrt::cuda

#endif // MTRT_SRC_CUDA_CONTEXT_H
