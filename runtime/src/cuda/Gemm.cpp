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

bool usesAux(cublasLtEpilogue_t epilogue) {
  return epilogue == CUBLASLT_EPILOGUE_GELU_AUX ||
         epilogue == CUBLASLT_EPILOGUE_GELU_AUX_BIAS ||
         epilogue == CUBLASLT_EPILOGUE_DGELU ||
         epilogue == CUBLASLT_EPILOGUE_DGELU_BGRAD;
}

const char *epilogueName(cublasLtEpilogue_t epilogue) {
  switch (epilogue) {
  case CUBLASLT_EPILOGUE_BIAS:
    return "BIAS";
  case CUBLASLT_EPILOGUE_GELU_AUX:
    return "GELU_AUX";
  case CUBLASLT_EPILOGUE_GELU_AUX_BIAS:
    return "GELU_AUX_BIAS";
  case CUBLASLT_EPILOGUE_DGELU:
    return "DGELU";
  case CUBLASLT_EPILOGUE_DGELU_BGRAD:
    return "DGELU_BGRAD";
  case CUBLASLT_EPILOGUE_BGRADA:
    return "BGRADA";
  case CUBLASLT_EPILOGUE_BGRADB:
    return "BGRADB";
  default:
    return "DEFAULT";
  }
}

/// The cuBLASLt epilogue for `epilogue` (and a bias), in cuBLAS's
/// column-major view where its A is our B: DEFAULT when kernels do it (an
/// erf GeLU, or any GeLU without `geluEpilogue`).
cublasLtEpilogue_t cublasEpilogue(const GemmEpilogue &epilogue, bool bias,
                                  bool geluEpilogue) {
  using Kind = GemmEpilogue::Kind;
  bool tanh = geluEpilogue && epilogue.approximation == GeluApproximation::Tanh;
  switch (epilogue.kind) {
  case Kind::None:
    return bias ? CUBLASLT_EPILOGUE_BIAS : CUBLASLT_EPILOGUE_DEFAULT;
  case Kind::GeluAux:
    if (!tanh)
      return CUBLASLT_EPILOGUE_DEFAULT;
    return bias ? CUBLASLT_EPILOGUE_GELU_AUX_BIAS : CUBLASLT_EPILOGUE_GELU_AUX;
  case Kind::GeluGrad:
    if (!tanh)
      return CUBLASLT_EPILOGUE_DEFAULT;
    return epilogue.biasGrad ? CUBLASLT_EPILOGUE_DGELU_BGRAD
                             : CUBLASLT_EPILOGUE_DGELU;
  case Kind::BiasGradA:
    return CUBLASLT_EPILOGUE_BGRADB;
  case Kind::BiasGradB:
    return CUBLASLT_EPILOGUE_BGRADA;
  }
  return CUBLASLT_EPILOGUE_DEFAULT;
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
  auto [batch, m, n, k, transA, transB, epilogueCode, accumulate, alignA,
        alignB, alignC, bf16] = key;
  (void)accumulate;
  auto epilogue = static_cast<cublasLtEpilogue_t>(epilogueCode);
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
    MTRT_CUBLAS_CHECK(
        cublasLtMatmulDescSetAttribute(p.desc, CUBLASLT_MATMUL_DESC_EPILOGUE,
                                       &epilogue, sizeof(epilogue)),
        what);
    if (epilogue != CUBLASLT_EPILOGUE_DEFAULT &&
        epilogue != CUBLASLT_EPILOGUE_GELU_AUX &&
        epilogue != CUBLASLT_EPILOGUE_DGELU) {
      // The bias, or the bias gradient written through the bias pointer.
      cudaDataType_t biasType = CUDA_R_32F;
      MTRT_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(
                            p.desc, CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE,
                            &biasType, sizeof(biasType)),
                        what);
    }
    if (usesAux(epilogue)) {
      // The auxiliary matrix is laid out as C (column-major n x m); its
      // type is C's (fp32), cuBLASLt's default.
      int64_t auxLd = n;
      MTRT_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(
                            p.desc, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD,
                            &auxLd, sizeof(auxLd)),
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
    // No algorithm; with an epilogue, any refusal of the heuristic (an
    // auxiliary matrix's leading dimension it does not take, say) leaves
    // the epilogue to kernels.
    bool refused = status != CUBLAS_STATUS_SUCCESS &&
                   epilogue != CUBLASLT_EPILOGUE_DEFAULT &&
                   epilogue != CUBLASLT_EPILOGUE_BIAS;
    if (status == CUBLAS_STATUS_NOT_SUPPORTED || refused ||
        (status == CUBLAS_STATUS_SUCCESS && found == 0)) {
      lastRefusal_ = status == CUBLAS_STATUS_SUCCESS
                         ? "no algorithm"
                         : cublasLtGetStatusName(status);
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
    std::string refusal = lastRefusal_;
    auto epilogue = static_cast<cublasLtEpilogue_t>(std::get<6>(key));
    Key plain = key;
    std::get<6>(plain) = CUBLASLT_EPILOGUE_DEFAULT;
    auto [batch, m, n, k, transA, transB, code, accumulate, alignA, alignB,
          alignC, bf16] = key;
    (void)code;
    (void)accumulate;
    (void)bf16;
    std::string what = shapeText(batch, m, n, k, transA, transB);
    if (epilogue == CUBLASLT_EPILOGUE_DEFAULT || !tryPlan(plain, p))
      throw Error(MTRT_STATUS_UNIMPLEMENTED,
                  what +
                      ": cuBLASLt has no algorithm for this shape (operand "
                      "alignments " +
                      std::to_string(alignA) + ", " + std::to_string(alignB) +
                      ", " + std::to_string(alignC) + " bytes)");
    p.epilogueByKernel = true;
    epiloguesByKernel_.push_back(std::string(epilogueName(epilogue)) + " for " +
                                 what + " (" + refusal + ")");
  }
  return plans_.emplace(key, p).first->second;
}

void Gemm::finishByKernels(int64_t m, int64_t n, int64_t k, const float *a,
                           bool transA, const float *b, bool transB, float *c,
                           const float *bias, const GemmEpilogue &epilogue,
                           const std::string &what) {
  using Kind = GemmEpilogue::Kind;
  switch (epilogue.kind) {
  case Kind::None:
    if (bias)
      MTRT_CUDA_CHECK_LAUNCH(addBiasRows(stream_, m, n, bias, c), what);
    break;
  case Kind::GeluAux: // the product is in aux
    if (bias)
      MTRT_CUDA_CHECK_LAUNCH(addBiasRows(stream_, m, n, bias, epilogue.aux),
                             what);
    MTRT_CUDA_CHECK_LAUNCH(
        geluForward(stream_, m * n, epilogue.aux, c, epilogue.approximation),
        what);
    break;
  case Kind::GeluGrad:
    MTRT_CUDA_CHECK_LAUNCH(geluBackward(stream_, m * n, epilogue.aux, c, c,
                                        epilogue.approximation),
                           what);
    if (epilogue.biasGrad)
      MTRT_CUDA_CHECK_LAUNCH(
          biasGrad(stream_, m, n, c, epilogue.biasGrad, epilogue.scratch),
          what);
    break;
  case Kind::BiasGradA:
    if (!transA)
      throw Error(MTRT_STATUS_INTERNAL,
                  what + ": the bias gradient of A needs A stored [k, m]");
    MTRT_CUDA_CHECK_LAUNCH(
        biasGrad(stream_, k, m, a, epilogue.biasGrad, epilogue.scratch), what);
    break;
  case Kind::BiasGradB:
    if (transB)
      throw Error(MTRT_STATUS_INTERNAL,
                  what + ": the bias gradient of B needs B stored [k, n]");
    MTRT_CUDA_CHECK_LAUNCH(
        biasGrad(stream_, k, n, b, epilogue.biasGrad, epilogue.scratch), what);
    break;
  }
}

void Gemm::run(int64_t batch, int64_t m, int64_t n, int64_t k, const float *a,
               bool transA, const float *b, bool transB, float *c,
               const float *bias, bool accumulate, Bf16Operands operands,
               const GemmEpilogue &epilogue) {
  using Kind = GemmEpilogue::Kind;
  if (batch <= 0 || m <= 0 || n <= 0)
    return;
  std::string what = shapeText(batch, m, n, k, transA, transB);
  if (epilogue.kind != Kind::None && (batch != 1 || accumulate))
    throw Error(MTRT_STATUS_INTERNAL,
                what + ": epilogues are for single, non-accumulating products");
  if (k == 0) {
    // cuBLASLt rejects k = 0: the product is zero, then the epilogue.
    float *product = epilogue.kind == Kind::GeluAux ? epilogue.aux : c;
    if (!accumulate)
      MTRT_CUDA_CHECK(
          cudaMemsetAsync(product, 0,
                          sizeof(float) * static_cast<size_t>(batch * m * n),
                          stream_),
          what);
    finishByKernels(batch * m, n, k, a, transA, b, transB, c, bias, epilogue,
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
  // Full fp32 products are the host's to 1e-5; cuBLASLt's GeLU (a fast tanh)
  // is not: there the GeLU and its gradient run as the kernels (the host's
  // formula). Bias gradients (fp32 sums) stay in the epilogue.
  cublasLtEpilogue_t wanted =
      cublasEpilogue(epilogue, bias != nullptr, /*geluEpilogue=*/bf16 || tf32_);
  Key key{batch,
          m,
          n,
          k,
          transA,
          transB,
          static_cast<int>(wanted),
          accumulate,
          alignmentOf(first, batch, m * k, operandBytes),
          alignmentOf(second, batch, k * n, operandBytes),
          alignmentOf(c, batch, m * n, sizeof(float)),
          bf16};
  const Plan &p = plan(key);
  // An erf GeLU has no cuBLASLt epilogue: kernels, as after a fallback.
  bool byKernel = p.epilogueByKernel || (epilogue.kind != Kind::None &&
                                         wanted == CUBLASLT_EPILOGUE_DEFAULT);
  if (!byKernel) {
    const void *biasPointer = bias;
    if (epilogue.kind == Kind::GeluGrad || epilogue.kind == Kind::BiasGradA ||
        epilogue.kind == Kind::BiasGradB)
      biasPointer = epilogue.biasGrad;
    if (biasPointer)
      MTRT_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(
                            p.desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER,
                            &biasPointer, sizeof(biasPointer)),
                        what);
    if (usesAux(wanted)) {
      void *aux = epilogue.aux;
      MTRT_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(
                            p.desc, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER,
                            &aux, sizeof(aux)),
                        what);
    }
  }
  // A plain product followed by the GeLU's kernel goes to aux first.
  float *product =
      byKernel && epilogue.kind == Kind::GeluAux ? epilogue.aux : c;
  float alpha = 1.0f, beta = accumulate ? 1.0f : 0.0f;
  MTRT_CUBLAS_CHECK(cublasLtMatmul(handle_, p.desc, &alpha, second, p.b, first,
                                   p.a, &beta, product, p.c, product, p.c,
                                   &p.algo, workspace_, workspaceBytes_,
                                   stream_),
                    what);
  if (byKernel)
    finishByKernels(batch * m, n, k, a, transA, b, transB, c, bias, epilogue,
                    what);
}

} // namespace mtrt::cuda
