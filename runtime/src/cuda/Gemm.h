// Row-major float GEMMs through cuBLASLt: descriptors and the heuristic's
// algorithm chosen once per shape and cached.
#ifndef MTRT_SRC_CUDA_GEMM_H
#define MTRT_SRC_CUDA_GEMM_H

#include <cublasLt.h>
#include <cuda_runtime_api.h>

#include <cstdint>
#include <map>
#include <tuple>

namespace mtrt::cuda {

/// C[b] = op(A[b]) @ op(B[b]) (+ bias) (+ C[b] when accumulating) over
/// `batch` consecutive row-major matrices: op(A) [m, k] (A stored [m, k], or
/// [k, m] with transA), op(B) [k, n] (B stored [k, n], or [n, k] with
/// transB), C [m, n]; bias [n] is added to every row. Products accumulate in
/// fp32; with `tf32` the inputs are rounded to TF32 on the tensor cores
/// (CUBLAS_COMPUTE_32F_FAST_TF32), otherwise every multiply is a full fp32
/// one (CUBLAS_COMPUTE_32F), comparable with the host's GEMM.
///
/// Thread-safety: one caller at a time (the cache is not locked).
class Gemm {
public:
  /// Creates the cuBLASLt handle and a workspace on the current device.
  /// Throws Error naming the failed call.
  Gemm(cudaStream_t stream, bool tf32);
  ~Gemm();
  Gemm(const Gemm &) = delete;
  Gemm &operator=(const Gemm &) = delete;

  /// Enqueues the product on the stream. Throws Error (UNIMPLEMENTED when
  /// cuBLASLt has no algorithm for the shape, INTERNAL for a failed call),
  /// naming the call and the shape; the caller adds where it was.
  void run(int64_t batch, int64_t m, int64_t n, int64_t k, const float *a,
           bool transA, const float *b, bool transB, float *c,
           const float *bias, bool accumulate);

  bool tf32() const { return tf32_; }

private:
  using Key = std::tuple<int64_t, int64_t, int64_t, int64_t, bool, bool, bool,
                         bool, int, int, int>;
  struct Plan {
    cublasLtMatmulDesc_t desc = nullptr;
    cublasLtMatrixLayout_t a = nullptr, b = nullptr, c = nullptr;
    cublasLtMatmulAlgo_t algo{};
    /// cuBLASLt had no algorithm with the bias epilogue for this shape: the
    /// plan is the plain product and a kernel adds the bias after it.
    bool biasByKernel = false;
  };
  /// Builds the plan for `key` into `plan`; false when cuBLASLt has no
  /// algorithm for it. Throws Error for a failed call.
  bool tryPlan(const Key &key, Plan &plan);
  const Plan &plan(const Key &key);

  cudaStream_t stream_;
  bool tf32_;
  cublasLtHandle_t handle_ = nullptr;
  void *workspace_ = nullptr;
  size_t workspaceBytes_ = 0;
  std::map<Key, Plan> plans_;
};

} // namespace mtrt::cuda

#endif // MTRT_SRC_CUDA_GEMM_H
