// Which form of the weight-gradient GEMM cuBLASLt runs fastest on this GPU
// (issue 22): the runtime's weight gradient of y = x W (W stored [in,
// out]) is dW [in, out] = x^T dy, with the bias gradient (the sum of dy's
// rows) in the BGRADA epilogue and an fp32 dW (the fp32 main gradients);
// PyTorch's (W stored [out, in]) is dW [out, in] = dy^T x, with a bf16 dW
// and the bias sums in separate kernels. For each shape this times, over
// every algorithm the heuristic proposes (up to 64), the best of:
//   orientation  ours ([in, out]) or torch's ([out, in]);
//   dW's type    fp32 or bf16;
//   epilogue     the bias gradient in the GEMM (BGRADA / BGRADB) or none;
// and prints milliseconds and TFLOP/s, with the candidate's index.
//
// Build (here) and run (on the GPU):
//   g++ -O2 -std=c++17 -I/usr/local/cuda/include bench/wgrad-gemm-probe.cpp
//       -o wgrad-gemm-probe -L/usr/local/cuda/lib64 -lcublasLt -lcudart
#include "probe-check.h"

#include <cublasLt.h>
#include <cuda_bf16.h>
#include <cuda_runtime_api.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <vector>

namespace {

struct Shape {
  const char *name;
  int64_t tokens, in, out;
};

constexpr size_t kWorkspace = 32 << 20;

/// Row-major C [m, n] = A^T B with A stored [k, m] and B stored [k, n]
/// (bf16), C of `cType`; the bias gradient, when asked, is the sum of the
/// rows of the operand `biasOfB` names (B: [n], else A: [m]). Returns the
/// best milliseconds over the heuristic's proposals and its index.
double best(cublasLtHandle_t handle, cudaStream_t stream, int64_t m, int64_t n,
            int64_t k, const void *a, const void *b, void *c,
            cudaDataType_t cType, bool biasGrad, bool biasOfB, void *bias,
            void *workspace, int &index, int &proposals) {
  // Column-major view: C' [n, m] = B' [n, k] (B row-major [k, n]) times
  // A'^T, A' [m, k] (A row-major [k, m]).
  cublasLtMatmulDesc_t desc;
  LT(cublasLtMatmulDescCreate(&desc, CUBLAS_COMPUTE_32F, CUDA_R_32F));
  cublasOperation_t opN = CUBLAS_OP_N, opT = CUBLAS_OP_T;
  LT(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_TRANSA, &opN,
                                    sizeof(opN)));
  LT(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_TRANSB, &opT,
                                    sizeof(opT)));
  if (biasGrad) {
    // B is cuBLAS's A (its rows over k: BGRADA), A is cuBLAS's B (BGRADB).
    cublasLtEpilogue_t epilogue =
        biasOfB ? CUBLASLT_EPILOGUE_BGRADA : CUBLASLT_EPILOGUE_BGRADB;
    LT(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_EPILOGUE,
                                      &epilogue, sizeof(epilogue)));
    LT(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER,
                                      &bias, sizeof(bias)));
    cudaDataType_t biasType = cType;
    LT(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE,
                                      &biasType, sizeof(biasType)));
  }
  cublasLtMatrixLayout_t la, lb, lc;
  LT(cublasLtMatrixLayoutCreate(&la, CUDA_R_16BF, n, k, n));
  LT(cublasLtMatrixLayoutCreate(&lb, CUDA_R_16BF, m, k, m));
  LT(cublasLtMatrixLayoutCreate(&lc, cType, n, m, n));
  cublasLtMatmulPreference_t pref;
  LT(cublasLtMatmulPreferenceCreate(&pref));
  size_t ws = kWorkspace;
  LT(cublasLtMatmulPreferenceSetAttribute(
      pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws, sizeof(ws)));
  std::vector<cublasLtMatmulHeuristicResult_t> results(64);
  int found = 0;
  cublasStatus_t status = cublasLtMatmulAlgoGetHeuristic(
      handle, desc, la, lb, lc, lc, pref, 64, results.data(), &found);
  proposals = status == CUBLAS_STATUS_SUCCESS ? found : 0;
  float alpha = 1, beta = 0;
  cudaEvent_t e0, e1;
  CK(cudaEventCreate(&e0));
  CK(cudaEventCreate(&e1));
  double bestMs = 1e30;
  index = -1;
  for (int i = 0; i < proposals; ++i) {
    auto run = [&] {
      return cublasLtMatmul(handle, desc, &alpha, b, la, a, lb, &beta, c, lc, c,
                            lc, &results[i].algo, workspace, kWorkspace,
                            stream);
    };
    if (run() != CUBLAS_STATUS_SUCCESS)
      continue;
    for (int w = 0; w < 2; ++w)
      run();
    CK(cudaEventRecord(e0, stream));
    const int reps = 10;
    for (int r = 0; r < reps; ++r)
      run();
    CK(cudaEventRecord(e1, stream));
    CK(cudaEventSynchronize(e1));
    float ms = 0;
    CK(cudaEventElapsedTime(&ms, e0, e1));
    if (ms / reps < bestMs) {
      bestMs = ms / reps;
      index = i;
    }
  }
  CK(cudaEventDestroy(e0));
  CK(cudaEventDestroy(e1));
  cublasLtMatmulPreferenceDestroy(pref);
  cublasLtMatrixLayoutDestroy(la);
  cublasLtMatrixLayoutDestroy(lb);
  cublasLtMatrixLayoutDestroy(lc);
  cublasLtMatmulDescDestroy(desc);
  return bestMs;
}

} // namespace

int main() {
  // gpt2-350m (32 x 1024 tokens), gpt-1.3b (8 x 2048), llama-1.5b (4 x
  // 2048: qkv with 8 of 32 heads for keys and values, gate and up as one).
  const Shape shapes[] = {
      {"350m-qkv", 32768, 1024, 3072},     {"350m-proj", 32768, 1024, 1024},
      {"350m-fc1", 32768, 1024, 4096},     {"350m-fc2", 32768, 4096, 1024},
      {"1.3b-qkv", 16384, 2048, 6144},     {"1.3b-proj", 16384, 2048, 2048},
      {"1.3b-fc1", 16384, 2048, 8192},     {"1.3b-fc2", 16384, 8192, 2048},
      {"llama-qkv", 8192, 2048, 3072},     {"llama-o", 8192, 2048, 2048},
      {"llama-gateup", 8192, 2048, 16384}, {"llama-down", 8192, 8192, 2048},
  };
  cublasLtHandle_t handle;
  LT(cublasLtCreate(&handle));
  cudaStream_t stream;
  CK(cudaStreamCreate(&stream));
  size_t most = 0;
  for (const Shape &s : shapes)
    most = std::max<size_t>(most, size_t(s.tokens) * std::max(s.in, s.out));
  void *x, *dy, *dw, *bias, *workspace;
  CK(cudaMalloc(&x, most * 2));
  CK(cudaMalloc(&dy, most * 2));
  CK(cudaMalloc(&dw, size_t(8192) * 16384 * 4));
  CK(cudaMalloc(&bias, 16384 * 4));
  CK(cudaMalloc(&workspace, kWorkspace));
  CK(cudaMemset(x, 0x3c, most * 2));
  CK(cudaMemset(dy, 0x3c, most * 2));
  std::printf("%-13s %-6s %-5s %-5s %9s %8s %s\n", "shape", "orient", "dW",
              "bgrad", "ms", "TFLOP/s", "candidate");
  for (const Shape &s : shapes) {
    double flops = 2.0 * s.tokens * s.in * s.out;
    for (int torch = 0; torch < 2; ++torch)
      for (int fp32 = 1; fp32 >= 0; --fp32)
        for (int bg = 1; bg >= 0; --bg) {
          int64_t m = torch ? s.out : s.in, n = torch ? s.in : s.out;
          const void *a = torch ? dy : x, *b = torch ? x : dy;
          int index = -1, proposals = 0;
          double ms = best(handle, stream, m, n, s.tokens, a, b, dw,
                           fp32 ? CUDA_R_32F : CUDA_R_16BF, bg, !torch, bias,
                           workspace, index, proposals);
          if (index < 0)
            std::printf("%-13s %-6s %-5s %-5s %9s %8s none of %d\n", s.name,
                        torch ? "torch" : "ours", fp32 ? "fp32" : "bf16",
                        bg ? "yes" : "no", "-", "-", proposals);
          else
            std::printf("%-13s %-6s %-5s %-5s %9.4f %8.1f %d of %d\n", s.name,
                        torch ? "torch" : "ours", fp32 ? "fp32" : "bf16",
                        bg ? "yes" : "no", ms, flops / ms / 1e9, index + 1,
                        proposals);
          std::fflush(stdout);
        }
  }
  return 0;
}
