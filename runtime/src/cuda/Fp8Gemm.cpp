#include "cuda/Fp8Gemm.h"

#include "core/Error.h"
#include "cuda/CudaCheck.h"

#include <algorithm>
#include <string>
#include <utility>

namespace mtrt::cuda {

namespace {

/// cuBLASLt's workspace for the FP8 products (its heuristic asks for up to
/// 32 MiB on Hopper).
constexpr size_t kWorkspaceBytes = 32u << 20;

cudaDataType_t dataType(fp8::Format format) {
  return format == fp8::Format::E4M3 ? CUDA_R_8F_E4M3 : CUDA_R_8F_E5M2;
}

const char *formatName(fp8::Format format) {
  return format == fp8::Format::E4M3 ? "E4M3" : "E5M2";
}

} // namespace

Fp8Gemm::Fp8Gemm(cudaStream_t stream, bool tuning)
    : stream_(stream), tuning_(tuning) {
  MTRT_CUBLAS_CHECK(cublasLtCreate(&handle_), "creating the cuBLASLt handle");
  cudaError_t error = cudaMalloc(&workspace_, kWorkspaceBytes);
  if (error == cudaSuccess)
    error = cudaEventCreate(&start_);
  if (error == cudaSuccess)
    error = cudaEventCreate(&stop_);
  if (error != cudaSuccess) {
    if (start_)
      cudaEventDestroy(start_);
    cudaFree(workspace_);
    cublasLtDestroy(handle_);
    throwCudaError(error, "cudaMalloc / cudaEventCreate",
                   "the FP8 GEMMs' workspace and tuning events");
  }
}

Fp8Gemm::~Fp8Gemm() {
  for (auto &[key, p] : plans_) {
    if (!p.desc) // a bias epilogue without an algorithm
      continue;
    cublasLtMatrixLayoutDestroy(p.a);
    cublasLtMatrixLayoutDestroy(p.b);
    cublasLtMatrixLayoutDestroy(p.d);
    cublasLtMatmulDescDestroy(p.desc);
  }
  for (void *retired : retiredStaging_)
    cudaFree(retired);
  cudaFree(staging_);
  cudaFree(workspace_);
  cudaEventDestroy(start_);
  cudaEventDestroy(stop_);
  cublasLtDestroy(handle_);
}

template <typename Launch>
void Fp8Gemm::tune(Plan &p, const std::string &what, Launch &&launch) {
  p.timed = true;
  constexpr int kRuns = 3;
  std::vector<std::pair<float, cublasLtMatmulAlgo_t>> timed;
  for (const cublasLtMatmulAlgo_t &algo : p.algos) {
    // One run first (and the check that the library takes it here).
    if (launch(algo) != CUBLAS_STATUS_SUCCESS)
      continue;
    MTRT_CUDA_CHECK(cudaEventRecord(start_, stream_), what);
    for (int run = 0; run < kRuns; ++run)
      MTRT_CUBLAS_CHECK(launch(algo), what);
    MTRT_CUDA_CHECK(cudaEventRecord(stop_, stream_), what);
    MTRT_CUDA_CHECK(cudaEventSynchronize(stop_), what);
    float ms = 0;
    MTRT_CUDA_CHECK(cudaEventElapsedTime(&ms, start_, stop_), what);
    timed.emplace_back(ms, algo);
  }
  std::stable_sort(
      timed.begin(), timed.end(),
      [](const auto &a, const auto &b) { return a.first < b.first; });
  p.algos.clear();
  for (const auto &[ms, algo] : timed)
    p.algos.push_back(algo);
}

void *Fp8Gemm::staging(size_t bytes) {
  if (bytes <= stagingBytes_)
    return staging_;
  void *grown = nullptr;
  MTRT_CUDA_CHECK(cudaMalloc(&grown, bytes),
                  "allocating " + std::to_string(bytes) +
                      " bytes of staging for the FP8 GEMMs' operands");
  if (staging_)
    retiredStaging_.push_back(staging_);
  staging_ = grown;
  stagingBytes_ = bytes;
  return staging_;
}

Fp8Gemm::Plan *Fp8Gemm::plan(const Key &key, const float *scaleX,
                             const float *scaleW, const std::string &what) {
  auto found = plans_.find(key);
  if (found != plans_.end())
    return found->second.algos.empty() ? nullptr : &found->second;
  auto [m, n, k, xFormat, wFormat, yBf16, bias, fast] = key;
  Plan p;
  // Column-major: D [n, m] = op(A) op(B) with A = w ([k, n], transposed:
  // [n, k]) and B = x ([k, m]); D is y [m, n] row-major.
  MTRT_CUBLAS_CHECK(
      cublasLtMatmulDescCreate(&p.desc, CUBLAS_COMPUTE_32F, CUDA_R_32F), what);
  cublasOperation_t transposed = CUBLAS_OP_T, plain = CUBLAS_OP_N;
  MTRT_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(
                        p.desc, CUBLASLT_MATMUL_DESC_TRANSA, &transposed,
                        sizeof(transposed)),
                    what);
  MTRT_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(p.desc,
                                                   CUBLASLT_MATMUL_DESC_TRANSB,
                                                   &plain, sizeof(plain)),
                    what);
  // The scale pointers before the heuristic, as it may choose by them.
  MTRT_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(
                        p.desc, CUBLASLT_MATMUL_DESC_A_SCALE_POINTER, &scaleW,
                        sizeof(scaleW)),
                    what);
  MTRT_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(
                        p.desc, CUBLASLT_MATMUL_DESC_B_SCALE_POINTER, &scaleX,
                        sizeof(scaleX)),
                    what);
  int8_t fastAccumulation = fast ? 1 : 0;
  MTRT_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(
                        p.desc, CUBLASLT_MATMUL_DESC_FAST_ACCUM,
                        &fastAccumulation, sizeof(fastAccumulation)),
                    what);
  if (bias) {
    cublasLtEpilogue_t epilogue = CUBLASLT_EPILOGUE_BIAS;
    cudaDataType_t biasType = CUDA_R_16BF;
    MTRT_CUBLAS_CHECK(
        cublasLtMatmulDescSetAttribute(p.desc, CUBLASLT_MATMUL_DESC_EPILOGUE,
                                       &epilogue, sizeof(epilogue)),
        what);
    MTRT_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(
                          p.desc, CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE,
                          &biasType, sizeof(biasType)),
                      what);
  }
  auto wType = dataType(static_cast<fp8::Format>(wFormat));
  auto xType = dataType(static_cast<fp8::Format>(xFormat));
  MTRT_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&p.a, wType, k, n, k), what);
  MTRT_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&p.b, xType, k, m, k), what);
  MTRT_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(
                        &p.d, yBf16 ? CUDA_R_16BF : CUDA_R_32F, n, m, n),
                    what);
  cublasLtMatmulPreference_t preference = nullptr;
  MTRT_CUBLAS_CHECK(cublasLtMatmulPreferenceCreate(&preference), what);
  size_t workspace = kWorkspaceBytes;
  cublasStatus_t status = cublasLtMatmulPreferenceSetAttribute(
      preference, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &workspace,
      sizeof(workspace));
  // As many as Gemm times (its best was often past the first 8).
  constexpr int kCandidates = 32;
  cublasLtMatmulHeuristicResult_t results[kCandidates] = {};
  int count = 0;
  if (status == CUBLAS_STATUS_SUCCESS)
    status = cublasLtMatmulAlgoGetHeuristic(handle_, p.desc, p.a, p.b, p.d,
                                            p.d, preference, kCandidates,
                                            results, &count);
  for (int i = 0; i < count; ++i)
    if (results[i].state == CUBLAS_STATUS_SUCCESS &&
        results[i].workspaceSize <= kWorkspaceBytes)
      p.algos.push_back(results[i].algo);
  if (p.algos.empty())
    count = 0;
  cublasLtMatmulPreferenceDestroy(preference);
  if (status != CUBLAS_STATUS_SUCCESS || count == 0) {
    cublasLtMatrixLayoutDestroy(p.a);
    cublasLtMatrixLayoutDestroy(p.b);
    cublasLtMatrixLayoutDestroy(p.d);
    cublasLtMatmulDescDestroy(p.desc);
    if (status != CUBLAS_STATUS_SUCCESS &&
        status != CUBLAS_STATUS_NOT_SUPPORTED)
      throwCublasError(status, "cublasLtMatmulAlgoGetHeuristic", what);
    if (bias) { // remembered: the caller adds the bias from now on
      plans_.emplace(key, Plan{});
      return nullptr;
    }
    throw Error(MTRT_STATUS_UNIMPLEMENTED,
                what + ": cuBLASLt has no algorithm for it (" +
                    (status == CUBLAS_STATUS_SUCCESS
                         ? std::string("none proposed")
                         : cublasLtGetStatusName(status)) +
                    ")");
  }
  return &plans_.emplace(key, p).first->second;
}

bool Fp8Gemm::run(int64_t m, int64_t n, int64_t k, const uint8_t *x,
                  fp8::Format xFormat, const float *scaleX, const uint8_t *w,
                  fp8::Format wFormat, const float *scaleW, void *y, bool yBf16,
                  const __nv_bfloat16 *bias, bool fastAccumulation) {
  std::string what = "FP8 GEMM [" + std::to_string(m) + " x " +
                     std::to_string(k) + "] " + formatName(xFormat) + " @ [" +
                     std::to_string(n) + " x " + std::to_string(k) + "]^T " +
                     formatName(wFormat) + " -> " + (yBf16 ? "bf16" : "fp32") +
                     (bias ? " + bias" : "");
  if (m <= 0 || n <= 0 || k <= 0)
    return true;
  if (bias && !yBf16)
    throw Error(MTRT_STATUS_INVALID_ARGUMENT,
                what + ": a bias in the epilogue needs a bf16 result (its "
                       "bf16 type is cuBLASLt's for a bf16 result); add it "
                       "after an fp32 product");
  if (xFormat == fp8::Format::E5M2 && wFormat == fp8::Format::E5M2)
    throw Error(MTRT_STATUS_INVALID_ARGUMENT,
                what + ": both operands are E5M2, which cuBLASLt's FP8 "
                       "products do not take; cast one of them to E4M3");
  for (auto [name, value] :
       {std::pair<const char *, int64_t>{"m", m}, {"n", n}, {"k", k}})
    if (value % 16 != 0)
      throw Error(MTRT_STATUS_INVALID_ARGUMENT,
                  what + ": " + name + " = " + std::to_string(value) +
                      " is not a multiple of 16, which cuBLASLt's FP8 "
                      "products need; pad the dimension");
  for (auto [name, pointer] : {std::pair<const char *, const void *>{"x", x},
                               {"w", w},
                               {"y", y},
                               {"x's scale", scaleX},
                               {"w's scale", scaleW},
                               {"the bias", bias ? bias : y}}) {
    auto offset = reinterpret_cast<uintptr_t>(pointer) % 16;
    // A scale 4 bytes past a 16-byte boundary made cublasLtMatmul refuse
    // every algorithm its heuristic proposed (CUBLAS_STATUS_NOT_SUPPORTED,
    // on the H200 with cuBLASLt 13.1); aligned, the same product runs.
    if (offset != 0)
      throw Error(MTRT_STATUS_INVALID_ARGUMENT,
                  what + ": " + name + " is at an address " +
                      std::to_string(offset) +
                      " bytes past a 16-byte boundary; cuBLASLt's FP8 "
                      "products need each operand and scale 16-byte "
                      "aligned");
  }
  Key key{m,
          n,
          k,
          static_cast<int>(xFormat),
          static_cast<int>(wFormat),
          yBf16,
          bias != nullptr,
          fastAccumulation};
  Plan *found = plan(key, scaleX, scaleW, what);
  if (!found)
    return false;
  Plan &p = *found;
  // The scales are attributes of the descriptor: set at every run (a
  // cached plan may serve other tensors' scales).
  MTRT_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(
                        p.desc, CUBLASLT_MATMUL_DESC_A_SCALE_POINTER, &scaleW,
                        sizeof(scaleW)),
                    what);
  MTRT_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(
                        p.desc, CUBLASLT_MATMUL_DESC_B_SCALE_POINTER, &scaleX,
                        sizeof(scaleX)),
                    what);
  if (bias)
    MTRT_CUBLAS_CHECK(
        cublasLtMatmulDescSetAttribute(
            p.desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &bias, sizeof(bias)),
        what);
  const float one = 1.0f, zero = 0.0f;
  auto launch = [&](const cublasLtMatmulAlgo_t &algo) {
    return cublasLtMatmul(handle_, p.desc, &one, w, p.a, x, p.b, &zero, y, p.d,
                          y, p.d, &algo, workspace_, kWorkspaceBytes, stream_);
  };
  if (tuning_ && !p.timed) {
    // A stream being captured cannot be waited on: the heuristic's order.
    cudaStreamCaptureStatus capture = cudaStreamCaptureStatusNone;
    MTRT_CUDA_CHECK(cudaStreamIsCapturing(stream_, &capture), what);
    if (capture == cudaStreamCaptureStatusNone)
      tune(p, what, launch);
  }
  cublasStatus_t status = CUBLAS_STATUS_NOT_SUPPORTED;
  while (!p.algos.empty()) {
    status = launch(p.algos.front());
    if (status != CUBLAS_STATUS_NOT_SUPPORTED)
      break;
    p.algos.erase(p.algos.begin());
  }
  if (status == CUBLAS_STATUS_NOT_SUPPORTED && bias)
    return false; // p.algos is empty: the key's later products too
  if (status == CUBLAS_STATUS_NOT_SUPPORTED)
    throw Error(MTRT_STATUS_UNIMPLEMENTED,
                what + ": cuBLASLt refused every algorithm its heuristic "
                       "proposed (CUBLAS_STATUS_NOT_SUPPORTED)");
  if (status != CUBLAS_STATUS_SUCCESS)
    throwCublasError(status, "cublasLtMatmul", what);
  return true;
}

} // namespace mtrt::cuda
