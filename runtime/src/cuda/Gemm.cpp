// cuBLASLt plans for row-major products: the column-major view C^T = B^T A^T.
#include "cuda/Gemm.h"

#include "cuda/CudaCheck.h"
#include "cuda/kernels/Kernels.h"

#include <string>

namespace mtrt::cuda {

namespace {

constexpr size_t kWorkspaceBytes = size_t(32) << 20;

/// The largest power of two, at most 256, that divides the address and, for
/// batched products, the byte stride between matrices.
int alignmentOf(const void *pointer, int64_t batch, int64_t strideElements,
                size_t elementBytes) {
  auto address = reinterpret_cast<uintptr_t>(pointer);
  uint64_t bits = address | 256;
  if (batch > 1)
    bits |= static_cast<uint64_t>(strideElements) * elementBytes;
  return static_cast<int>(bits & (~bits + 1));
}

std::string shapeText(int64_t batch, int64_t m, int64_t n, int64_t k,
                      bool transA, bool transB) {
  return "cuBLASLt matmul of " + std::to_string(batch) + " x [" +
         std::to_string(m) + " x " + std::to_string(k) + "] @ [" +
         std::to_string(k) + " x " + std::to_string(n) + "]" +
         (transA ? " (A transposed)" : "") + (transB ? " (B transposed)" : "");
}

} // namespace

Gemm::Gemm(cudaStream_t stream, bool tf32) : stream_(stream), tf32_(tf32) {
  MTRT_CUBLAS_CHECK(cublasLtCreate(&handle_), "creating the cuBLASLt handle");
  MTRT_CUDA_CHECK(cudaMalloc(&workspace_, kWorkspaceBytes),
                  "allocating the cuBLASLt workspace");
  workspaceBytes_ = kWorkspaceBytes;
}

Gemm::~Gemm() {
  for (auto &[key, plan] : plans_) {
    cublasLtMatrixLayoutDestroy(plan.a);
    cublasLtMatrixLayoutDestroy(plan.b);
    cublasLtMatrixLayoutDestroy(plan.c);
    cublasLtMatmulDescDestroy(plan.desc);
  }
  if (workspace_)
    cudaFree(workspace_);
  if (handle_)
    cublasLtDestroy(handle_);
}

// Row-major C [m, n] is column-major C^T [n, m] = op(B)^T op(A)^T: cuBLAS's
// first operand is our B, its second our A, and its (M, N, K) is (n, m, k).
bool Gemm::tryPlan(const Key &key, Plan &p) {
  auto [batch, m, n, k, transA, transB, bias, accumulate, alignA, alignB,
        alignC, bf16] = key;
  (void)accumulate;
  std::string what = shapeText(batch, m, n, k, transA, transB);
  auto destroy = [&] {
    if (p.a)
      cublasLtMatrixLayoutDestroy(p.a);
    if (p.b)
      cublasLtMatrixLayoutDestroy(p.b);
    if (p.c)
      cublasLtMatrixLayoutDestroy(p.c);
    if (p.desc)
      cublasLtMatmulDescDestroy(p.desc);
    p = Plan();
  };
  try {
    cublasComputeType_t compute = tf32_ && !bf16 ? CUBLAS_COMPUTE_32F_FAST_TF32
                                                 : CUBLAS_COMPUTE_32F;
    MTRT_CUBLAS_CHECK(cublasLtMatmulDescCreate(&p.desc, compute, CUDA_R_32F),
                      what);
    cublasOperation_t opFirst = transB ? CUBLAS_OP_T : CUBLAS_OP_N;
    cublasOperation_t opSecond = transA ? CUBLAS_OP_T : CUBLAS_OP_N;
    MTRT_CUBLAS_CHECK(
        cublasLtMatmulDescSetAttribute(p.desc, CUBLASLT_MATMUL_DESC_TRANSA,
                                       &opFirst, sizeof(opFirst)),
        what);
    MTRT_CUBLAS_CHECK(
        cublasLtMatmulDescSetAttribute(p.desc, CUBLASLT_MATMUL_DESC_TRANSB,
                                       &opSecond, sizeof(opSecond)),
        what);
    cublasLtEpilogue_t epilogue =
        bias ? CUBLASLT_EPILOGUE_BIAS : CUBLASLT_EPILOGUE_DEFAULT;
    MTRT_CUBLAS_CHECK(
        cublasLtMatmulDescSetAttribute(p.desc, CUBLASLT_MATMUL_DESC_EPILOGUE,
                                       &epilogue, sizeof(epilogue)),
        what);
    if (bias) {
      cudaDataType_t biasType = CUDA_R_32F;
      MTRT_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(
                            p.desc, CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE,
                            &biasType, sizeof(biasType)),
                        what);
    }

    // Stored column-major shapes: our B is [k, n] row-major = (n, k)
    // col-major (or (k, n) when transposed); our A is (k, m) (or (m, k)); C
    // is (n, m).
    auto layout = [&](cublasLtMatrixLayout_t &out, cudaDataType_t type,
                      int64_t rows, int64_t cols, int64_t stride) {
      MTRT_CUBLAS_CHECK(
          cublasLtMatrixLayoutCreate(&out, type,
                                     static_cast<uint64_t>(rows),
                                     static_cast<uint64_t>(cols), rows),
          what);
      if (batch > 1) {
        int32_t count = static_cast<int32_t>(batch);
        MTRT_CUBLAS_CHECK(cublasLtMatrixLayoutSetAttribute(
                              out, CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT, &count,
                              sizeof(count)),
                          what);
        MTRT_CUBLAS_CHECK(cublasLtMatrixLayoutSetAttribute(
                              out, CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET,
                              &stride, sizeof(stride)),
                          what);
      }
    };
    cudaDataType_t operands = bf16 ? CUDA_R_16BF : CUDA_R_32F;
    layout(p.b, operands, transB ? k : n, transB ? n : k, k * n);
    layout(p.a, operands, transA ? m : k, transA ? k : m, m * k);
    layout(p.c, CUDA_R_32F, n, m, m * n);

    cublasLtMatmulPreference_t preference = nullptr;
    MTRT_CUBLAS_CHECK(cublasLtMatmulPreferenceCreate(&preference), what);
    uint64_t workspace = workspaceBytes_;
    uint32_t alignments[3] = {static_cast<uint32_t>(alignB),
                              static_cast<uint32_t>(alignA),
                              static_cast<uint32_t>(alignC)};
    cublasLtMatmulPreferenceAttributes_t attributes[5] = {
        CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES,
        CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES,
        CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES,
        CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES,
        CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES};
    const void *values[5] = {&workspace, &alignments[0], &alignments[1],
                             &alignments[2], &alignments[2]};
    size_t sizes[5] = {sizeof(workspace), sizeof(uint32_t), sizeof(uint32_t),
                       sizeof(uint32_t), sizeof(uint32_t)};
    cublasStatus_t status = CUBLAS_STATUS_SUCCESS;
    for (int i = 0; i < 5 && status == CUBLAS_STATUS_SUCCESS; ++i)
      status = cublasLtMatmulPreferenceSetAttribute(preference, attributes[i],
                                                    values[i], sizes[i]);
    cublasLtMatmulHeuristicResult_t result{};
    int found = 0;
    if (status == CUBLAS_STATUS_SUCCESS)
      status = cublasLtMatmulAlgoGetHeuristic(handle_, p.desc, p.b, p.a, p.c,
                                              p.c, preference, 1, &result,
                                              &found);
    cublasLtMatmulPreferenceDestroy(preference);
    if (status == CUBLAS_STATUS_NOT_SUPPORTED ||
        (status == CUBLAS_STATUS_SUCCESS && found == 0)) {
      destroy();
      return false;
    }
    if (status != CUBLAS_STATUS_SUCCESS)
      throwCublasError(status, "cublasLtMatmulAlgoGetHeuristic", what);
    p.algo = result.algo;
    return true;
  } catch (...) {
    destroy();
    throw;
  }
}

const Gemm::Plan &Gemm::plan(const Key &key) {
  auto found = plans_.find(key);
  if (found != plans_.end())
    return found->second;
  Plan p;
  if (!tryPlan(key, p)) {
    bool bias = std::get<6>(key);
    Key plain = key;
    std::get<6>(plain) = false;
    if (!bias || !tryPlan(plain, p)) {
      auto [batch, m, n, k, transA, transB, b, accumulate, alignA, alignB,
            alignC, bf16] = key;
      (void)b;
      (void)accumulate;
      (void)bf16;
      throw Error(MTRT_STATUS_UNIMPLEMENTED,
                  shapeText(batch, m, n, k, transA, transB) +
                      ": cuBLASLt has no algorithm for this shape (operand "
                      "alignments " +
                      std::to_string(alignA) + ", " + std::to_string(alignB) +
                      ", " + std::to_string(alignC) + " bytes)");
    }
    p.biasByKernel = true;
  }
  return plans_.emplace(key, p).first->second;
}

void Gemm::run(int64_t batch, int64_t m, int64_t n, int64_t k, const float *a,
               bool transA, const float *b, bool transB, float *c,
               const float *bias, bool accumulate, Bf16Operands operands) {
  if (batch <= 0 || m <= 0 || n <= 0)
    return;
  if (k == 0) {
    // cuBLASLt rejects k = 0: the product is zero (plus the bias).
    std::string what = shapeText(batch, m, n, k, transA, transB);
    if (!accumulate)
      MTRT_CUDA_CHECK(
          cudaMemsetAsync(c, 0, sizeof(float) * static_cast<size_t>(batch * m * n),
                          stream_),
          what);
    if (bias)
      MTRT_CUDA_CHECK_LAUNCH(addBiasRows(stream_, batch * m, n, bias, c),
                             what);
    return;
  }
  bool bf16 = operands.enabled();
  const void *first = a, *second = b;
  if (bf16) {
    first = operands.a;
    second = operands.b;
  }
  size_t operandBytes = bf16 ? sizeof(__nv_bfloat16) : sizeof(float);
  Key key{batch,
          m,
          n,
          k,
          transA,
          transB,
          bias != nullptr,
          accumulate,
          alignmentOf(first, batch, m * k, operandBytes),
          alignmentOf(second, batch, k * n, operandBytes),
          alignmentOf(c, batch, m * n, sizeof(float)),
          bf16};
  const Plan &p = plan(key);
  if (bias && !p.biasByKernel) {
    MTRT_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(
                          p.desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &bias,
                          sizeof(bias)),
                      shapeText(batch, m, n, k, transA, transB));
  }
  float alpha = 1.0f, beta = accumulate ? 1.0f : 0.0f;
  MTRT_CUBLAS_CHECK(cublasLtMatmul(handle_, p.desc, &alpha, second, p.b,
                                   first, p.a,
                                   &beta, c, p.c, c, p.c, &p.algo, workspace_,
                                   workspaceBytes_, stream_),
                    shapeText(batch, m, n, k, transA, transB));
  if (bias && p.biasByKernel)
    MTRT_CUDA_CHECK_LAUNCH(addBiasRows(stream_, batch * m, n, bias, c),
                           shapeText(batch, m, n, k, transA, transB));
}

} // namespace mtrt::cuda
