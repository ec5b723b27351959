// Row-major float GEMMs through cuBLASLt: descriptors and the heuristic's
// algorithm chosen once per shape and cached.
#ifndef MTRT_SRC_CUDA_GEMM_H
#define MTRT_SRC_CUDA_GEMM_H

#include <cublasLt.h>
#include <cuda_bf16.h>
#include <cuda_runtime_api.h>

#include "host/kernels/Kernels.h"

#include <cstdint>
#include <map>
#include <string>
#include <tuple>
#include <vector>

namespace mtrt::cuda {

using host::GeluApproximation;

/// The operands of a bf16 product (Gemm::run), already rounded to bf16 by
/// the caller (batch * m * k and batch * k * n elements, the layouts of the
/// fp32 operands); both null for an fp32 product.
struct Bf16Operands {
  const __nv_bfloat16 *a = nullptr, *b = nullptr;
  bool enabled() const { return a && b; }
};

/// What a product does after the multiply (Gemm::run), besides the bias:
/// cuBLASLt's epilogues, or kernels after a plain product when cuBLASLt has
/// no algorithm with the epilogue for the shape, for an erf GeLU (its GELU
/// epilogues are the tanh approximation) and for any GeLU of a full-fp32
/// product (its fast tanh is not within the 1e-5 that fp32 bundles keep to
/// the host; bf16 and TF32 products use the epilogue). Batch 1 only.
struct GemmEpilogue {
  enum class Kind : uint8_t {
    None,
    /// aux = A B (+ bias); C = gelu(aux) (GELU_AUX, GELU_AUX_BIAS).
    GeluAux,
    /// C = gelu'(aux) * (A B); with `biasGrad`, also biasGrad = the sum of
    /// C's rows (DGELU, DGELU_BGRAD).
    GeluGrad,
    /// biasGrad [m] = the sum of op(A)'s columns (A stored [k, m], transA);
    /// cuBLASLt's BGRADB in its column-major view.
    BiasGradA,
    /// biasGrad [n] = the sum of B's rows (B stored [k, n], not transB);
    /// cuBLASLt's BGRADA.
    BiasGradB,
  };
  Kind kind = Kind::None;
  GeluApproximation approximation = GeluApproximation::Tanh;
  /// [m, n], like C: written by GeluAux, read by GeluGrad.
  float *aux = nullptr;
  float *biasGrad = nullptr;
  /// For the kernels' bias gradient when cuBLASLt cannot:
  /// columnSumScratchBytes(rows, length) bytes (kernels/Kernels.h).
  void *scratch = nullptr;
};

/// C[b] = op(A[b]) @ op(B[b]) (+ bias) (+ C[b] when accumulating) over
/// `batch` consecutive row-major matrices: op(A) [m, k] (A stored [m, k], or
/// [k, m] with transA), op(B) [k, n] (B stored [k, n], or [n, k] with
/// transB), C [m, n]; bias [n] is added to every row. Products accumulate in
/// fp32; with `tf32` the inputs are rounded to TF32 on the tensor cores
/// (CUBLAS_COMPUTE_32F_FAST_TF32), otherwise every multiply is a full fp32
/// one (CUBLAS_COMPUTE_32F), comparable with the host's GEMM.
///
/// Mixed precision (bundles compiled with precision bf16): the operands come
/// rounded to bf16 (Bf16Operands) and are multiplied on the tensor cores
/// with fp32 accumulation
/// (CUBLAS_COMPUTE_32F over CUDA_R_16BF inputs); C, the bias and the
/// accumulation stay fp32, as Megatron-LM's fp32 main gradients do.
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
           const float *bias, bool accumulate, Bf16Operands bf16 = {},
           const GemmEpilogue &epilogue = {});

  bool tf32() const { return tf32_; }

  /// The epilogues cuBLASLt had no algorithm for, one line per shape
  /// ("GELU_AUX_BIAS for cuBLASLt matmul of ..."): they ran as kernels.
  const std::vector<std::string> &epiloguesByKernel() const {
    return epiloguesByKernel_;
  }

private:
  /// (batch, m, n, k, transA, transB, cuBLASLt epilogue, accumulate,
  /// alignment of A, B and C in bytes, bf16 operands).
  using Key = std::tuple<int64_t, int64_t, int64_t, int64_t, bool, bool, int,
                         bool, int, int, int, bool>;
  struct Plan {
    cublasLtMatmulDesc_t desc = nullptr;
    cublasLtMatrixLayout_t a = nullptr, b = nullptr, c = nullptr;
    cublasLtMatmulAlgo_t algo{};
    /// cuBLASLt had no algorithm with the epilogue for this shape: the plan
    /// is the plain product and kernels do the epilogue's work after it.
    bool epilogueByKernel = false;
  };
  /// Builds the plan for `key` into `plan`; false when cuBLASLt has no
  /// algorithm for it. Throws Error for a failed call.
  bool tryPlan(const Key &key, Plan &plan);
  /// After a plain product: the bias and the epilogue's work by kernels.
  void finishByKernels(int64_t m, int64_t n, int64_t k, const float *a,
                       bool transA, const float *b, bool transB, float *c,
                       const float *bias, const GemmEpilogue &epilogue,
                       const std::string &what);
  const Plan &plan(const Key &key);

  cudaStream_t stream_;
  bool tf32_;
  cublasLtHandle_t handle_ = nullptr;
  void *workspace_ = nullptr;
  size_t workspaceBytes_ = 0;
  std::map<Key, Plan> plans_;
  std::vector<std::string> epiloguesByKernel_;
  /// Why the last tryPlan found no algorithm (the heuristic's status).
  std::string lastRefusal_;
};

} // namespace mtrt::cuda

#endif // MTRT_SRC_CUDA_GEMM_H
