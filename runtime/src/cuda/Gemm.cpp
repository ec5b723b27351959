// cuBLASLt plans for row-major products: the column-major view C^T = B^T A^T.
#include "cuda/Gemm.h"

#include "core/OpScratch.h"
#include "cuda/CudaCheck.h"
#include "cuda/kernels/Kernels.h"

#include <algorithm>
#include <cstdio>
#include <string>

namespace mtrt::cuda {

namespace {

constexpr size_t kWorkspaceBytes = size_t(scratch::kGemmWorkspaceBytes);

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

/// Where a bf16 result's bias vector (n bf16) goes: past the bf16 C in C's
/// fp32-sized buffer, 256-byte aligned.
size_t bf16VectorOffset(int64_t m, int64_t n) {
  size_t used = sizeof(__nv_bfloat16) * static_cast<size_t>(m * n);
  return (used + 255) / 256 * 256;
}

bool bf16VectorFits(int64_t m, int64_t n) {
  return bf16VectorOffset(m, n) +
             sizeof(__nv_bfloat16) * static_cast<size_t>(n) <=
         sizeof(float) * static_cast<size_t>(m * n);
}

std::string shapeText(int64_t batch, int64_t m, int64_t n, int64_t k,
                      bool transA, bool transB) {
  return "cuBLASLt matmul of " + std::to_string(batch) + " x [" +
         std::to_string(m) + " x " + std::to_string(k) + "] @ [" +
         std::to_string(k) + " x " + std::to_string(n) + "]" +
         (transA ? " (A transposed)" : "") + (transB ? " (B transposed)" : "");
}

} // namespace

Gemm::Gemm(cudaStream_t stream, bool tf32, bool tuning)
    : stream_(stream), tf32_(tf32), tuning_(tuning) {
  MTRT_CUBLAS_CHECK(cublasLtCreate(&handle_), "creating the cuBLASLt handle");
  MTRT_CUDA_CHECK(cudaEventCreate(&start_), "creating the GEMM tuning events");
  MTRT_CUDA_CHECK(cudaEventCreate(&stop_), "creating the GEMM tuning events");
  workspaceBytes_ = kWorkspaceBytes;
}

void *Gemm::ownWorkspace() {
  if (!workspace_)
    MTRT_CUDA_CHECK(cudaMalloc(&workspace_, kWorkspaceBytes),
                    "allocating the cuBLASLt workspace (the bundle's memory "
                    "plan leaves it out of its GEMMs' side buffers)");
  return workspace_;
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
  if (start_)
    cudaEventDestroy(start_);
  if (stop_)
    cudaEventDestroy(stop_);
  if (handle_)
    cublasLtDestroy(handle_);
}

// Row-major C [m, n] is column-major C^T [n, m] = op(B)^T op(A)^T: cuBLAS's
// first operand is our B, its second our A, and its (M, N, K) is (n, m, k).
bool Gemm::tryPlan(const Key &key, Plan &p) {
  auto [batch, m, n, k, transA, transB, epilogueCode, accumulate, alignA,
        alignB, alignC, bf16, bf16Result, algorithmRows] = key;
  (void)accumulate;
  (void)algorithmRows;
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
      // The bias, or the bias gradient written through the bias pointer:
      // fp32, or D's type for a bf16 result (cuBLASLt's rule outside FP8).
      cudaDataType_t biasType = bf16Result ? CUDA_R_16BF : CUDA_R_32F;
      MTRT_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(
                            p.desc, CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE,
                            &biasType, sizeof(biasType)),
                        what);
    }
    if (usesAux(epilogue)) {
      // The auxiliary matrix is laid out as C (column-major n x m); its
      // type is D's (fp32, or bf16 for a bf16 result), cuBLASLt's default.
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
    layout(p.c, bf16Result ? CUDA_R_16BF : CUDA_R_32F, n, m, m * n);

    cublasLtMatmulPreference_t preference = nullptr;
    MTRT_CUBLAS_CHECK(cublasLtMatmulPreferenceCreate(&preference), what);
    uint64_t workspace = workspaceBytes_;
    uint32_t alignments[3] = {static_cast<uint32_t>(alignB),
                              static_cast<uint32_t>(alignA),
                              static_cast<uint32_t>(alignC)};
    // A split-K algorithm may add its partial products in the output type
    // (INPLACE, OUTPUT_TYPE): for a bf16 result that rounds each partial
    // sum to bf16, where the host's emulation (docs/MixedPrecision.md)
    // rounds the fp32 sum once. Bf16 results take only partial sums kept
    // in the compute type (fp32).
    uint32_t reductions = bf16Result ? CUBLASLT_REDUCTION_SCHEME_COMPUTE_TYPE
                                     : CUBLASLT_REDUCTION_SCHEME_MASK;
    cublasLtMatmulPreferenceAttributes_t attributes[6] = {
        CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES,
        CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES,
        CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES,
        CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES,
        CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES,
        CUBLASLT_MATMUL_PREF_REDUCTION_SCHEME_MASK};
    const void *values[6] = {&workspace,     &alignments[0], &alignments[1],
                             &alignments[2], &alignments[2], &reductions};
    size_t sizes[6] = {sizeof(workspace), sizeof(uint32_t), sizeof(uint32_t),
                       sizeof(uint32_t),  sizeof(uint32_t), sizeof(uint32_t)};
    cublasStatus_t status = CUBLAS_STATUS_SUCCESS;
    for (int i = 0; i < 6 && status == CUBLAS_STATUS_SUCCESS; ++i)
      status = cublasLtMatmulPreferenceSetAttribute(preference, attributes[i],
                                                    values[i], sizes[i]);
    cublasLtMatmulHeuristicResult_t results[kTuningCandidates] = {};
    int found = 0;
    if (status == CUBLAS_STATUS_SUCCESS)
      status = cublasLtMatmulAlgoGetHeuristic(
          handle_, p.desc, p.b, p.a, p.c, p.c, preference,
          tuning_ ? kTuningCandidates : 1, results, &found);
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
    p.algo = results[0].algo;
    for (int i = 1; i < found; ++i)
      if (results[i].state == CUBLAS_STATUS_SUCCESS &&
          results[i].workspaceSize <= workspaceBytes_)
        p.candidates.push_back(results[i].algo);
    return true;
  } catch (...) {
    destroy();
    throw;
  }
}

Gemm::Plan &Gemm::plan(const Key &key) {
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
          alignC, bf16, bf16Result, algorithmRows] = key;
    (void)code;
    (void)algorithmRows;
    (void)accumulate;
    (void)bf16;
    std::string what = shapeText(batch, m, n, k, transA, transB);
    // A bf16 result has no kernels after it: the caller asked
    // hasBf16ResultAlgorithm first, so this is a bug, not a fallback.
    if (bf16Result)
      throw Error(MTRT_STATUS_INTERNAL,
                  what + ": cuBLASLt has no algorithm with the " +
                      epilogueName(epilogue) + " epilogue and a bf16 result (" +
                      refusal + ")");
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

Gemm::Plan &Gemm::chunkPlan(const Key &key) {
  auto found = plans_.find(key);
  if (found != plans_.end())
    return found->second;
  Key own = key, whole = key;
  std::get<13>(own) = 0;
  std::get<13>(whole) = 0;
  std::get<1>(whole) = std::get<13>(key);
  auto [batch, m, n, k, transA, transB, code, accumulate, alignA, alignB,
        alignC, bf16, bf16Result, wholeRows] = key;
  (void)code;
  (void)accumulate;
  (void)alignA;
  (void)alignB;
  (void)alignC;
  (void)bf16;
  (void)bf16Result;
  std::string what = shapeText(batch, m, n, k, transA, transB) +
                     ", a chunk of " + std::to_string(wholeRows) + " rows";
  auto unshared = [&](const std::string &why) -> Plan & {
    algorithmsNotShared_.push_back(what + ": " + why);
    Key alone = key;
    std::get<13>(alone) = 0;
    return plan(alone);
  };
  const Plan *wholePlan = nullptr;
  try {
    wholePlan = &plan(whole);
  } catch (const Error &e) {
    return unshared(std::string("the whole has no algorithm (") + e.what() +
                    ")");
  }
  // The whole's epilogue: where kernels do it after the whole's plain
  // product, they do it after the chunk's.
  if (wholePlan->epilogueByKernel)
    std::get<6>(own) = CUBLASLT_EPILOGUE_DEFAULT;
  cublasLtMatmulAlgo_t algo = wholePlan->algo;
  bool byKernel = wholePlan->epilogueByKernel;
  Plan p;
  if (!tryPlan(own, p))
    return unshared("cuBLASLt has no algorithm for the chunk's epilogue");
  p.candidates.clear();
  p.epilogueByKernel = byKernel;
  cublasLtMatmulHeuristicResult_t checked{};
  cublasStatus_t status = cublasLtMatmulAlgoCheck(handle_, p.desc, p.b, p.a,
                                                  p.c, p.c, &algo, &checked);
  if (status == CUBLAS_STATUS_SUCCESS &&
      checked.workspaceSize <= workspaceBytes_)
    p.algo = algo;
  else
    algorithmsNotShared_.push_back(
        what + ": cuBLASLt refuses the whole's algorithm for it (" +
        (status == CUBLAS_STATUS_SUCCESS ? std::string("its workspace")
                                         : cublasLtGetStatusName(status)) +
        ")");
  return plans_.emplace(key, p).first->second;
}

template <typename Launch>
void Gemm::tune(Plan &p, const std::string &what, Launch &&launch) {
  std::vector<cublasLtMatmulAlgo_t> candidates;
  candidates.push_back(p.algo);
  candidates.insert(candidates.end(), p.candidates.begin(), p.candidates.end());
  p.candidates.clear();
  constexpr int kRuns = 3;
  float best = -1, first = -1;
  size_t chosen = 0;
  for (size_t i = 0; i < candidates.size(); ++i) {
    // A candidate the library then refuses for these buffers is skipped;
    // the heuristic's first must run (its failure is the caller's error).
    if (launch(candidates[i]) != CUBLAS_STATUS_SUCCESS) {
      if (i == 0)
        MTRT_CUBLAS_CHECK(launch(candidates[i]), what);
      continue;
    }
    MTRT_CUDA_CHECK(cudaEventRecord(start_, stream_), what);
    for (int run = 0; run < kRuns; ++run)
      MTRT_CUBLAS_CHECK(launch(candidates[i]), what);
    MTRT_CUDA_CHECK(cudaEventRecord(stop_, stream_), what);
    MTRT_CUDA_CHECK(cudaEventSynchronize(stop_), what);
    float ms = 0;
    MTRT_CUDA_CHECK(cudaEventElapsedTime(&ms, start_, stop_), what);
    if (i == 0)
      first = ms;
    if (best < 0 || ms < best) {
      best = ms;
      chosen = i;
    }
  }
  p.algo = candidates[chosen];
  char line[96];
  std::snprintf(line, sizeof(line),
                ": candidate %zu of %zu, %.3f ms (the heuristic's first "
                "%.3f ms)",
                chosen + 1, candidates.size(), best / kRuns, first / kRuns);
  tuningChoices_.push_back(what + line);
}

bool Gemm::hasBf16ResultAlgorithm(int64_t m, int64_t n, int64_t k, bool transA,
                                  bool transB, GemmEpilogue::Kind kind,
                                  bool bias, bool biasGrad,
                                  bool vectorPastResult) {
  if (m <= 0 || n <= 0 || k <= 0 || (vectorPastResult && !bf16VectorFits(m, n)))
    return false;
  GemmEpilogue epilogue;
  epilogue.kind = kind;
  float unused = 0;
  epilogue.biasGrad = biasGrad ? &unused : nullptr;
  cublasLtEpilogue_t wanted = cublasEpilogue(epilogue, bias, true);
  if (kind != GemmEpilogue::Kind::None && wanted == CUBLASLT_EPILOGUE_DEFAULT)
    return false;
  Key key{1,     m,   n,   k,   transA, transB, static_cast<int>(wanted),
          false, 256, 256, 256, true,   true,   0};
  if (plans_.count(key))
    return true;
  Plan p;
  try {
    if (!tryPlan(key, p))
      return false;
  } catch (const Error &) {
    return false; // the heuristic refused the types outright: fp32 results
  }
  plans_.emplace(key, p);
  return true;
}

void Gemm::finishByKernels(int64_t m, int64_t n, int64_t k, const float *a,
                           bool transA, const float *b, bool transB, float *c,
                           const float *bias, Bf16Operands operands,
                           const GemmEpilogue &epilogue,
                           const std::string &what) {
  using Kind = GemmEpilogue::Kind;
  // The bias gradients sum an operand: bf16 when the product's are.
  bool bf16 = operands.enabled();
  NormRows lhs{bf16 ? static_cast<const void *>(operands.a) : a, bf16};
  NormRows rhs{bf16 ? static_cast<const void *>(operands.b) : b, bf16};
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
        biasGrad(stream_, k, m, lhs, epilogue.biasGrad, epilogue.scratch),
        what);
    break;
  case Kind::BiasGradB:
    if (transB)
      throw Error(MTRT_STATUS_INTERNAL,
                  what + ": the bias gradient of B needs B stored [k, n]");
    MTRT_CUDA_CHECK_LAUNCH(
        biasGrad(stream_, k, n, rhs, epilogue.biasGrad, epilogue.scratch),
        what);
    break;
  }
}

void Gemm::run(int64_t batch, int64_t m, int64_t n, int64_t k, const float *a,
               bool transA, const float *b, bool transB, float *c,
               const float *bias, bool accumulate, Bf16Operands operands,
               const GemmEpilogue &epilogue, int64_t algorithmRows) {
  using Kind = GemmEpilogue::Kind;
  if (batch <= 0 || m <= 0 || n <= 0)
    return;
  std::string what = shapeText(batch, m, n, k, transA, transB);
  bool biasGradOnly =
      epilogue.kind == Kind::BiasGradA || epilogue.kind == Kind::BiasGradB;
  if (epilogue.kind != Kind::None &&
      (batch != 1 || (accumulate && !biasGradOnly)))
    throw Error(MTRT_STATUS_INTERNAL,
                what + ": epilogues are for single products, and only a bias "
                       "gradient's for accumulating ones");
  if (epilogue.addend) {
    if (epilogue.kind != Kind::None || batch != 1 || accumulate)
      throw Error(MTRT_STATUS_INTERNAL,
                  what + ": an addend is for a single product without "
                         "another epilogue, not accumulating");
    GemmEpilogue plain = epilogue;
    plain.addend = nullptr;
    if (epilogue.addend == c) { // in place: an accumulating product
      run(batch, m, n, k, a, transA, b, transB, c, bias, true, operands, plain,
          algorithmRows);
      return;
    }
    if (k == 0) { // the product is zero (and the bias): then the add
      run(batch, m, n, k, a, transA, b, transB, c, bias, false, operands, plain,
          algorithmRows);
      addAddend(m * n, epilogue.addend, c,
                operands.enabled() && operands.result, what);
      return;
    }
  }
  if (k == 0) {
    // cuBLASLt rejects k = 0: the product is zero, then the epilogue.
    float *product = epilogue.kind == Kind::GeluAux ? epilogue.aux : c;
    if (!accumulate)
      MTRT_CUDA_CHECK(
          cudaMemsetAsync(product, 0,
                          sizeof(float) * static_cast<size_t>(batch * m * n),
                          stream_),
          what);
    finishByKernels(batch * m, n, k, a, transA, b, transB, c, bias, operands,
                    epilogue, what);
    return;
  }
  bool bf16 = operands.enabled();
  bool bf16Result = bf16 && operands.result;
  // The bias (or bias gradient) vector in D's type; a plain product has
  // none (linear_cross_entropy's chunks).
  bool vector = bias || (epilogue.biasGrad && (epilogue.kind == Kind::GeluGrad ||
                                               biasGradOnly));
  if (operands.result &&
      (!bf16 || k == 0 || batch != 1 ||
       (vector && !epilogue.bf16Vector && !bf16VectorFits(m, n))))
    throw Error(MTRT_STATUS_INTERNAL,
                what + ": a bf16 result needs bf16 operands, k > 0, one "
                       "matrix and room for its bias vector");
  __nv_bfloat16 *bf16Vector = nullptr;
  if (bf16Result && vector)
    bf16Vector = static_cast<__nv_bfloat16 *>(
        epilogue.bf16Vector ? epilogue.bf16Vector
                            : reinterpret_cast<char *>(c) +
                                  bf16VectorOffset(m, n));
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
  Key key{
      batch,
      m,
      n,
      k,
      transA,
      transB,
      static_cast<int>(wanted),
      accumulate,
      alignmentOf(first, batch, m * k, operandBytes),
      alignmentOf(second, batch, k * n, operandBytes),
      std::min(alignmentOf(c, batch, m * n,
                           bf16Result ? sizeof(__nv_bfloat16) : sizeof(float)),
               epilogue.addend ? alignmentOf(epilogue.addend, batch, m * n,
                                             bf16Result ? sizeof(__nv_bfloat16)
                                                        : sizeof(float))
                               : 256),
      bf16,
      bf16Result,
      algorithmRows > m && batch == 1 ? algorithmRows : 0};
  Plan &p = std::get<13>(key) ? chunkPlan(key) : plan(key);
  // An erf GeLU has no cuBLASLt epilogue: kernels, as after a fallback.
  bool byKernel = p.epilogueByKernel || (epilogue.kind != Kind::None &&
                                         wanted == CUBLASLT_EPILOGUE_DEFAULT);
  if (byKernel && bf16Result)
    throw Error(MTRT_STATUS_INTERNAL,
                what + ": a bf16 result needs the epilogue in cuBLASLt");
  if (!byKernel) {
    const void *biasPointer = bias;
    if (epilogue.kind == Kind::GeluGrad || epilogue.kind == Kind::BiasGradA ||
        epilogue.kind == Kind::BiasGradB)
      biasPointer = epilogue.biasGrad;
    if (biasPointer && bf16Result) {
      if (biasPointer == bias)
        MTRT_CUDA_CHECK_LAUNCH(roundToBf16(stream_, n, bias, bf16Vector), what);
      biasPointer = bf16Vector;
    }
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
  float alpha = 1.0f, beta = accumulate || epilogue.addend ? 1.0f : 0.0f,
        zero = 0.0f;
  void *workspace = epilogue.workspace ? epilogue.workspace : ownWorkspace();
  // C: the product itself (beta = 0, or accumulating), or the addend.
  const void *cInput = epilogue.addend ? epilogue.addend : product;
  auto launch = [&](const cublasLtMatmulAlgo_t &algo) {
    return cublasLtMatmul(handle_, p.desc, &alpha, second, p.b, first, p.a,
                          &beta, cInput, p.c, product, p.c, &algo, workspace,
                          workspaceBytes_, stream_);
  };
  if (!p.candidates.empty()) {
    // Timed on this call's buffers: every candidate writes the same C (and
    // aux or bias gradient). An accumulating product would add up: it is
    // timed with beta = 0 into its scratch (same layout and alignment as
    // C), or keeps the first without one. A stream being captured cannot be
    // waited on: it keeps the first.
    cudaStreamCaptureStatus capture = cudaStreamCaptureStatusNone;
    MTRT_CUDA_CHECK(cudaStreamIsCapturing(stream_, &capture), what);
    float *scratch = epilogue.tuningScratch;
    bool scratchFits =
        scratch && !bf16Result && !byKernel &&
        alignmentOf(scratch, batch, m * n, sizeof(float)) >= std::get<10>(key);
    if (capture != cudaStreamCaptureStatusNone || epilogue.untuned ||
        (accumulate && !scratchFits))
      p.candidates.clear();
    else if (accumulate)
      tune(p, what + " " + epilogueName(wanted) + ", accumulating",
           [&](const cublasLtMatmulAlgo_t &algo) {
             return cublasLtMatmul(handle_, p.desc, &alpha, second, p.b, first,
                                   p.a, &zero, scratch, p.c, scratch, p.c,
                                   &algo, workspace, workspaceBytes_,
                                   stream_);
           });
    else
      tune(p,
           what + " " + epilogueName(wanted) + (bf16Result ? ", bf16 C" : ""),
           launch);
  }
  cublasStatus_t status =
      p.accumulateRefused || (epilogue.addend && p.addendRefused)
          ? CUBLAS_STATUS_NOT_SUPPORTED
          : launch(p.algo);
  if (status == CUBLAS_STATUS_NOT_SUPPORTED && epilogue.addend) {
    // cuBLASLt refused C apart from D: the product, then the add.
    if (!p.addendRefused)
      epiloguesByKernel_.push_back("an addend as C for " + what +
                                   ": the product, then an add kernel");
    p.addendRefused = true;
    GemmEpilogue plain = epilogue;
    plain.addend = nullptr;
    run(batch, m, n, k, a, transA, b, transB, c, bias, false, operands, plain,
        algorithmRows);
    addAddend(m * n, epilogue.addend, c, bf16Result, what);
    return;
  }
  if (status != CUBLAS_STATUS_SUCCESS && accumulate && biasGradOnly &&
      !byKernel && epilogue.tuningScratch) {
    // cuBLASLt refused beta = 1 with the bias-gradient epilogue: the
    // product (and the bias gradient) into the scratch, then added.
    if (!p.accumulateRefused)
      epiloguesByKernel_.push_back(std::string(epilogueName(wanted)) +
                                   " with beta = 1 for " + what +
                                   ": written, then added");
    p.accumulateRefused = true;
    GemmEpilogue written = epilogue;
    written.tuningScratch = nullptr;
    run(batch, m, n, k, a, transA, b, transB, epilogue.tuningScratch, bias,
        false, operands, written, algorithmRows);
    MTRT_CUDA_CHECK_LAUNCH(
        accumulateInto(stream_, m * n, epilogue.tuningScratch, c), what);
    return;
  }
  MTRT_CUBLAS_CHECK(status, what);
  if (bf16Result && !byKernel && epilogue.biasGrad &&
      epilogue.kind != Kind::None && epilogue.kind != Kind::GeluAux)
    MTRT_CUDA_CHECK_LAUNCH(widenBf16(stream_,
                                     epilogue.kind == Kind::BiasGradA ? m : n,
                                     bf16Vector, epilogue.biasGrad),
                           what);
  if (byKernel)
    finishByKernels(batch * m, n, k, a, transA, b, transB, c, bias, operands,
                    epilogue, what);
}

void Gemm::addAddend(int64_t count, const void *addend, float *c, bool bf16,
                     const std::string &what) {
  InElements sum = bf16 ? InElements(reinterpret_cast<__nv_bfloat16 *>(c))
                        : InElements(static_cast<const float *>(c));
  InElements other(addend, bf16);
  OutElements out =
      bf16 ? OutElements(reinterpret_cast<__nv_bfloat16 *>(c)) : OutElements(c);
  MTRT_CUDA_CHECK_LAUNCH(add(stream_, count, sum, other, out), what);
}

} // namespace mtrt::cuda
