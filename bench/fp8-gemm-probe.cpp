// Which cuBLASLt FP8 descriptor variants run on this GPU (issue 26): for
// y [128, 256] = x [128, 512] w [256, 512]^T (codes of 0, 1, 2, -1, so the
// sums are exact), each variant's heuristic status, each proposal's
// cublasLtMatmul status and the first success's largest difference from
// the host's double product, relative to the largest result. Session 19's
// first call (bench/NOTES.md) found the scale pointers' alignment to be
// what cuBLASLt refused.
//
// Build (here) and run (on the GPU, CUBLASLT_LOG_LEVEL=5 for its trace):
//   g++ -O1 -std=c++17 -I/usr/local/cuda/include bench/fp8-gemm-probe.cpp
//       -o fp8-gemm-probe -L/usr/local/cuda/lib64 -lcublasLt -lcudart
#include "probe-check.h"

#include <cublasLt.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime_api.h>

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>

namespace {

struct Variant {
  const char *name;
  cudaDataType_t xType = CUDA_R_8F_E4M3, wType = CUDA_R_8F_E4M3;
  cudaDataType_t cType = CUDA_R_16BF, dType = CUDA_R_16BF;
  bool aliasC = true; // C's pointer is D's
  int scales = 1;     // 0: none; 1: 4 bytes apart; 2: separate allocations
  int fastAccum = 0;  // -1: unset
  bool scalesBeforeHeuristic = true;
  bool cNull = false; // C's pointer null (beta 0)
};

} // namespace

int main() {
  const int m = 128, n = 256, k = 512;
  cudaDeviceProp prop;
  CK(cudaGetDeviceProperties(&prop, 0));
  std::printf("cublasLt version %d, device %s sm_%d%d\n",
              int(cublasLtGetVersion()), prop.name, prop.major, prop.minor);
  cublasLtHandle_t h;
  if (cublasLtCreate(&h) != CUBLAS_STATUS_SUCCESS)
    return 1;
  cudaStream_t stream;
  CK(cudaStreamCreate(&stream));
  // E4M3 0x38 = 1, 0x40 = 2, 0xB8 = -1; E5M2 0x3C = 1, 0x40 = 2, 0xBC = -1.
  const uint8_t e4[4] = {0x00, 0x38, 0x40, 0xB8},
                e5[4] = {0x00, 0x3C, 0x40, 0xBC};
  const float val[4] = {0, 1, 2, -1};
  std::vector<uint8_t> x(m * k), w(n * k), x5(m * k), w5(n * k);
  std::vector<float> xv(m * k), wv(n * k);
  unsigned s = 1;
  auto next = [&] {
    s = s * 1103515245u + 12345u;
    return (s >> 16) % 4;
  };
  for (int i = 0; i < m * k; ++i) {
    unsigned r = next();
    x[i] = e4[r], x5[i] = e5[r], xv[i] = val[r];
  }
  for (int i = 0; i < n * k; ++i) {
    unsigned r = next();
    w[i] = e4[r], w5[i] = e5[r], wv[i] = val[r];
  }
  // The scales: 0.5 for x, 0.25 for w.
  std::vector<double> ref(m * n);
  for (int i = 0; i < m; ++i)
    for (int j = 0; j < n; ++j) {
      double sum = 0;
      for (int e = 0; e < k; ++e)
        sum += xv[i * k + e] * wv[j * k + e];
      ref[i * n + j] = sum * 0.5 * 0.25;
    }
  void *dx, *dw, *dx5, *dw5, *dy, *dc, *ws, *sc, *sa, *sb, *amax;
  size_t wsBytes = 32u << 20;
  CK(cudaMalloc(&dx, m * k));
  CK(cudaMalloc(&dw, n * k));
  CK(cudaMalloc(&dx5, m * k));
  CK(cudaMalloc(&dw5, n * k));
  CK(cudaMalloc(&dy, m * n * 4));
  CK(cudaMalloc(&dc, m * n * 4));
  CK(cudaMalloc(&ws, wsBytes));
  CK(cudaMalloc(&sc, 64));
  CK(cudaMalloc(&sa, 16));
  CK(cudaMalloc(&sb, 16));
  CK(cudaMalloc(&amax, 16));
  CK(cudaMemcpy(dx, x.data(), m * k, cudaMemcpyHostToDevice));
  CK(cudaMemcpy(dw, w.data(), n * k, cudaMemcpyHostToDevice));
  CK(cudaMemcpy(dx5, x5.data(), m * k, cudaMemcpyHostToDevice));
  CK(cudaMemcpy(dw5, w5.data(), n * k, cudaMemcpyHostToDevice));
  float scales[2] = {0.5f, 0.25f}, one = 1.f, zero = 0.f;
  CK(cudaMemcpy(sc, scales, 8, cudaMemcpyHostToDevice));
  CK(cudaMemcpy(sa, &scales[0], 4, cudaMemcpyHostToDevice));
  CK(cudaMemcpy(sb, &scales[1], 4, cudaMemcpyHostToDevice));
  CK(cudaMemset(dc, 0, m * n * 4));

  std::vector<Variant> variants;
  auto add = [&](const char *name, auto change) {
    Variant v;
    v.name = name;
    change(v);
    variants.push_back(v);
  };
  add("scales 4 bytes apart (Fp8Gemm before)", [](Variant &) {});
  add("no scale pointers", [](Variant &v) { v.scales = 0; });
  add("scales in separate allocations", [](Variant &v) { v.scales = 2; });
  add("fast accumulation unset", [](Variant &v) { v.fastAccum = -1; });
  add("fast accumulation 1", [](Variant &v) { v.fastAccum = 1; });
  add("C its own buffer", [](Variant &v) { v.aliasC = false; });
  add("C null", [](Variant &v) { v.cNull = true; });
  add("scales set after the heuristic",
      [](Variant &v) { v.scalesBeforeHeuristic = false; });
  add("C, D fp32", [](Variant &v) { v.cType = v.dType = CUDA_R_32F; });
  add("C, D fp32, C its own buffer", [](Variant &v) {
    v.cType = v.dType = CUDA_R_32F;
    v.aliasC = false;
  });
  add("C bf16, D e4m3", [](Variant &v) {
    v.dType = CUDA_R_8F_E4M3;
    v.aliasC = false;
  });
  add("C, D fp16", [](Variant &v) { v.cType = v.dType = CUDA_R_16F; });
  add("x e5m2, w e4m3", [](Variant &v) { v.xType = CUDA_R_8F_E5M2; });
  add("x e4m3, w e5m2", [](Variant &v) { v.wType = CUDA_R_8F_E5M2; });
  add("x e5m2, C its own buffer", [](Variant &v) {
    v.xType = CUDA_R_8F_E5M2;
    v.aliasC = false;
  });
  add("no scales, fast accumulation unset, C its own buffer", [](Variant &v) {
    v.scales = 0;
    v.fastAccum = -1;
    v.aliasC = false;
  });

  for (const Variant &v : variants) {
    cublasLtMatmulDesc_t desc;
    cublasLtMatrixLayout_t a, b, c, d;
    cublasLtMatmulDescCreate(&desc, CUBLAS_COMPUTE_32F, CUDA_R_32F);
    cublasOperation_t t = CUBLAS_OP_T, nt = CUBLAS_OP_N;
    cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_TRANSA, &t,
                                   sizeof t);
    cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_TRANSB, &nt,
                                   sizeof nt);
    // A is w (scale 0.25), B is x (0.5).
    const float *pa = v.scales == 1 ? static_cast<const float *>(sc) + 1
                                    : static_cast<const float *>(sb);
    const float *pb = v.scales == 1 ? static_cast<const float *>(sc)
                                    : static_cast<const float *>(sa);
    auto setScales = [&] {
      if (!v.scales)
        return;
      cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_A_SCALE_POINTER,
                                     &pa, sizeof pa);
      cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_B_SCALE_POINTER,
                                     &pb, sizeof pb);
    };
    if (v.scalesBeforeHeuristic)
      setScales();
    if (v.fastAccum >= 0) {
      int8_t f = static_cast<int8_t>(v.fastAccum);
      cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_FAST_ACCUM, &f,
                                     sizeof f);
    }
    if (v.dType == CUDA_R_8F_E4M3) {
      const float *dScale = static_cast<const float *>(sa);
      float *dAmax = static_cast<float *>(amax);
      cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_D_SCALE_POINTER,
                                     &dScale, sizeof dScale);
      cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_AMAX_D_POINTER,
                                     &dAmax, sizeof dAmax);
    }
    cublasLtMatrixLayoutCreate(&a, v.wType, k, n, k);
    cublasLtMatrixLayoutCreate(&b, v.xType, k, m, k);
    cublasLtMatrixLayoutCreate(&c, v.cType, n, m, n);
    cublasLtMatrixLayoutCreate(&d, v.dType, n, m, n);
    cublasLtMatmulPreference_t preference;
    cublasLtMatmulPreferenceCreate(&preference);
    cublasLtMatmulPreferenceSetAttribute(
        preference, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &wsBytes,
        sizeof wsBytes);
    cublasLtMatmulHeuristicResult_t results[8] = {};
    int count = 0;
    cublasStatus_t hs = cublasLtMatmulAlgoGetHeuristic(
        h, desc, a, b, c, d, preference, 8, results, &count);
    if (!v.scalesBeforeHeuristic)
      setScales();
    std::printf("%-52s heuristic %s, %d proposals:", v.name,
                cublasLtGetStatusName(hs), count);
    const void *wp = v.wType == CUDA_R_8F_E5M2 ? dw5 : dw;
    const void *xp = v.xType == CUDA_R_8F_E5M2 ? dx5 : dx;
    void *cp = v.cNull ? nullptr : (v.aliasC ? dy : dc);
    bool checked = false;
    for (int i = 0; i < count; ++i) {
      cublasStatus_t ms =
          cublasLtMatmul(h, desc, &one, wp, a, xp, b, &zero, cp, c, dy, d,
                         &results[i].algo, ws, wsBytes, stream);
      std::printf(" [%d %s]", i, cublasLtGetStatusName(ms));
      if (ms != CUBLAS_STATUS_SUCCESS || checked || v.dType == CUDA_R_8F_E4M3)
        continue;
      checked = true;
      CK(cudaStreamSynchronize(stream));
      std::vector<uint8_t> raw(m * n * 4);
      CK(cudaMemcpy(raw.data(), dy, m * n * 4, cudaMemcpyDeviceToHost));
      double worst = 0, largest = 0;
      for (int e = 0; e < m * n; ++e) {
        double got;
        if (v.dType == CUDA_R_32F) {
          float f;
          std::memcpy(&f, &raw[e * 4], 4);
          got = f;
        } else if (v.dType == CUDA_R_16BF) {
          __nv_bfloat16 f;
          std::memcpy(&f, &raw[e * 2], 2);
          got = __bfloat162float(f);
        } else {
          __half f;
          std::memcpy(&f, &raw[e * 2], 2);
          got = __half2float(f);
        }
        double want = v.scales ? ref[e] : ref[e] * 8.0;
        worst = std::fmax(worst, std::fabs(got - want));
        largest = std::fmax(largest, std::fabs(want));
      }
      std::printf(" difference/largest %.3g", worst / largest);
    }
    std::printf("\n");
    cublasLtMatmulPreferenceDestroy(preference);
    cublasLtMatrixLayoutDestroy(a);
    cublasLtMatrixLayoutDestroy(b);
    cublasLtMatrixLayoutDestroy(c);
    cublasLtMatrixLayoutDestroy(d);
    cublasLtMatmulDescDestroy(desc);
  }
  std::printf("final sync: %s\n", cudaGetErrorString(cudaDeviceSynchronize()));
  return 0;
}
