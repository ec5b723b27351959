// FP8 matrix products through cuBLASLt (issue 26): the linear layer's
// y = x w^T with x and w in E4M3 or E5M2 (core/Fp8.h), their dequantizing
// scales as device scalars, fp32 accumulation and a bf16 or fp32 result.
#ifndef MTRT_SRC_CUDA_FP8GEMM_H
#define MTRT_SRC_CUDA_FP8GEMM_H

#include "core/Fp8.h"

#include <cublasLt.h>
#include <cuda_bf16.h>
#include <cuda_runtime_api.h>

#include <cstdint>
#include <map>
#include <string>
#include <tuple>
#include <vector>

namespace mtrt::cuda {

/// y [m, n] (row-major bf16 or fp32) = scaleX * scaleW * (x [m, k] @
/// w [n, k]^T) (+ bias [n]), x and w row-major FP8 codes: both operands
/// k-contiguous, the one layout cuBLASLt's FP8 products take ("TN" in its
/// column-major terms), which is a linear layer's weight [out, in] as
/// stored. scaleX and scaleW are device floats (the inverse of the scales
/// the casts multiplied by); the products of the codes' values are summed
/// in fp32 and rounded once to the result's type. Fast accumulation (the
/// tensor cores' own, less precise sums, promoted to fp32 less often) is
/// what Transformer Engine uses for the forward products only; a bias (bf16,
/// cuBLASLt's bias type for a bf16 result) is added in the epilogue before
/// the rounding. E5M2 x E5M2 is refused
/// (cuBLASLt has no such product), as are k, m or n not multiples of 16 and
/// operands or scales not 16-byte aligned (a scale 4 bytes past a boundary made
/// cuBLASLt refuse every algorithm), each naming the value. Plans are built
/// at the first product of a shape and cached. With `tuning` (Gemm's rule),
/// the heuristic's proposals are timed at that first product, on its own
/// buffers (unless the stream is being captured), and the fastest is kept;
/// without it, the heuristic's first that runs (deterministic).
///
/// Thread-safety: one caller at a time.
class Fp8Gemm {
public:
  /// Throws Error naming the failed call.
  explicit Fp8Gemm(cudaStream_t stream, bool tuning = true);
  ~Fp8Gemm();
  Fp8Gemm(const Fp8Gemm &) = delete;
  Fp8Gemm &operator=(const Fp8Gemm &) = delete;

  /// Enqueues the product on the stream and returns true. Throws Error
  /// (INVALID_ARGUMENT for a shape, format pair or alignment cuBLASLt's FP8
  /// products refuse, UNIMPLEMENTED when it has no algorithm, INTERNAL for a
  /// failed call). With a bias (y bf16 only), returns false, enqueuing
  /// nothing, when cuBLASLt has no algorithm for the bias epilogue: the
  /// caller adds the bias itself (decided at the shape's first product, so
  /// the same later, inside a captured graph).
  bool run(int64_t m, int64_t n, int64_t k, const uint8_t *x,
           fp8::Format xFormat, const float *scaleX, const uint8_t *w,
           fp8::Format wFormat, const float *scaleW, void *y, bool yBf16,
           const __nv_bfloat16 *bias = nullptr, bool fastAccumulation = false);

  /// At least `bytes` of device memory (256-byte aligned) for the caller's
  /// operands of one product (the executor's transposed codes, inverse
  /// scales and fp32 sums): the contents are the caller's until its next
  /// call. A larger request allocates a new buffer and keeps the old one
  /// until destruction (a captured CUDA graph may still address it); no
  /// request may grow it while a graph is being captured, so the executor
  /// reserves its functions' largest need when it is built.
  void *staging(size_t bytes);

private:
  /// m, n, k, the formats of x and w, whether y is bf16, whether a bias is
  /// added in the epilogue, and fast accumulation.
  using Key = std::tuple<int64_t, int64_t, int64_t, int, int, bool, bool, bool>;
  struct Plan {
    cublasLtMatmulDesc_t desc = nullptr;
    cublasLtMatrixLayout_t a = nullptr, b = nullptr, d = nullptr;
    /// The heuristic's proposals, best first (the fastest first once
    /// timed); run() drops those the library then refuses for the call
    /// (CUBLAS_STATUS_NOT_SUPPORTED).
    std::vector<cublasLtMatmulAlgo_t> algos;
    bool timed = false;
  };
  /// Orders p.algos by their time on this call's buffers (launch runs one).
  template <typename Launch>
  void tune(Plan &p, const std::string &what, Launch &&launch);
  /// The key's plan; nullptr for a bias epilogue cuBLASLt has no algorithm
  /// for (it throws for every other key without one).
  Plan *plan(const Key &key, const float *scaleX, const float *scaleW,
             const std::string &what);

  cudaStream_t stream_;
  bool tuning_;
  cudaEvent_t start_ = nullptr, stop_ = nullptr;
  cublasLtHandle_t handle_ = nullptr;
  void *workspace_ = nullptr;
  void *staging_ = nullptr;
  size_t stagingBytes_ = 0;
  std::vector<void *> retiredStaging_;
  std::map<Key, Plan> plans_;
};

} // namespace mtrt::cuda

#endif // MTRT_SRC_CUDA_FP8GEMM_H
