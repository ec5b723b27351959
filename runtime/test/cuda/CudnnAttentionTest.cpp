// cuDNN's fused attention (cuda/CudnnAttention.h) against the host's
// attention in float64 on the same bf16-exact inputs: out, the packed copy
// the gradient reads, the logsumexp (natural log, as the own kernels keep
// it) and dq, dk, dv within bf16 rounding. Cases: head dimensions 64 and
// 128, causal and not (other key counts than query counts), grouped-query
// heads, q/k/v read and dq/dk/dv written in place in packed qkv tensors
// (the GPT bundles' views), and what cuDNN is not given (dropout, fp32).
// Skipped where the runtime has no cuDNN (the reason printed).
#include "CudaTestSupport.h"

#include "cuda/CudnnAttention.h"
#include "cuda/kernels/Kernels.h"
#include "host/ThreadPool.h"
#include "host/kernels/Kernels.h"

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdio>
#include <vector>

using namespace mtrt;

namespace {

struct CudnnCase {
  int64_t batch, seqQ, seqK, headsQ, headsKv, headDim;
  bool causal;
  /// q, k, v in place in one [batch, seq, heads, 3 headDim] tensor and dq,
  /// dk, dv in another (headsQ == headsKv, seqQ == seqK).
  bool packed = false;
  double scale = 0; // 0: 1 / sqrt(headDim)
};

/// n values in [-scale, scale) that are exact in bf16.
std::vector<double> bf16Values(size_t n, uint64_t seed, double scale) {
  std::vector<double> values(n);
  for (size_t i = 0; i < n; ++i) {
    float x = static_cast<float>(
        (random::uniformDouble(random::randomBits(seed, 0, i)) * 2 - 1) *
        scale);
    values[i] = static_cast<double>(__bfloat162float(__float2bfloat16(x)));
  }
  return values;
}

/// The largest |actual - expected| over the largest |expected|.
double relative(const std::vector<double> &actual,
                const std::vector<double> &expected) {
  double diff = 0, largest = 0;
  for (size_t i = 0; i < expected.size(); ++i) {
    diff = std::max(diff, std::abs(actual[i] - expected[i]));
    largest = std::max(largest, std::abs(expected[i]));
  }
  return largest > 0 ? diff / largest : diff;
}

class CudnnAttentionTest : public test::CudaTest {
protected:
  void SetUp() override {
    test::CudaTest::SetUp();
    if (IsSkipped())
      return;
    context = std::make_unique<cuda::Context>(cuda::ContextOptions{});
    cudnn = context->cudnnAttention();
    if (!cudnn)
      GTEST_SKIP() << "no cuDNN attention: "
                   << context->cudnnAttentionMissing();
  }

  void run(const CudnnCase &c) {
    host::AttentionParams p;
    p.batch = c.batch;
    p.seqQ = c.seqQ;
    p.seqK = c.seqK;
    p.headsQ = c.headsQ;
    p.headsKv = c.headsKv;
    p.headDim = p.headDimV = c.headDim;
    p.causal = c.causal;
    p.scale = c.scale ? c.scale : 1.0 / std::sqrt(double(c.headDim));
    int64_t d = c.headDim;
    size_t qn = static_cast<size_t>(c.batch * c.seqQ * c.headsQ * d);
    size_t kn = static_cast<size_t>(c.batch * c.seqK * c.headsKv * d);
    size_t rows = static_cast<size_t>(c.batch * c.headsQ * c.seqQ);
    std::vector<double> q = bf16Values(qn, 1, 2.0), k = bf16Values(kn, 2, 2.0),
                        v = bf16Values(kn, 3, 1.0),
                        dout = bf16Values(qn, 4, 1.0);

    // The reference in float64.
    host::ThreadPool pool(4);
    std::vector<double> out(qn), lse(rows), dq(qn), dk(kn), dv(kn);
    host::attentionForward<double>(pool, p, q.data(), k.data(), v.data(),
                                   out.data(), lse.data());
    host::attentionBackward<double>(pool, p, q.data(), k.data(), v.data(),
                                    lse.data(), dout.data(), dq.data(),
                                    dk.data(), dv.data());

    // The device tensors: bf16, packed or in place in [b, s, h, 3d].
    std::vector<void *> buffers;
    auto device = [&](size_t bytes) {
      void *pointer = nullptr;
      EXPECT_EQ(cudaMalloc(&pointer, bytes ? bytes : 256), cudaSuccess);
      EXPECT_EQ(cudaMemset(pointer, 0, bytes ? bytes : 256), cudaSuccess);
      buffers.push_back(pointer);
      return static_cast<__nv_bfloat16 *>(pointer);
    };
    auto upload = [&](const std::vector<double> &x, __nv_bfloat16 *to,
                      int64_t pitch, int64_t offset) {
      // Rows of d elements at `pitch` apart, from element `offset`.
      size_t count = x.size() / d;
      std::vector<__nv_bfloat16> host(count * pitch);
      if (!buffers.empty()) {
        EXPECT_EQ(cudaMemcpy(host.data(), to, host.size() * 2,
                             cudaMemcpyDeviceToHost),
                  cudaSuccess);
      }
      for (size_t r = 0; r < count; ++r)
        for (int64_t e = 0; e < d; ++e)
          host[r * pitch + offset + e] =
              __float2bfloat16(static_cast<float>(x[r * d + e]));
      EXPECT_EQ(
          cudaMemcpy(to, host.data(), host.size() * 2, cudaMemcpyHostToDevice),
          cudaSuccess);
    };
    auto download = [&](const __nv_bfloat16 *from, size_t n, int64_t pitch,
                        int64_t offset) {
      size_t count = n / d;
      std::vector<__nv_bfloat16> host(count * pitch);
      EXPECT_EQ(cudaMemcpy(host.data(), from, host.size() * 2,
                           cudaMemcpyDeviceToHost),
                cudaSuccess);
      std::vector<double> x(n);
      for (size_t r = 0; r < count; ++r)
        for (int64_t e = 0; e < d; ++e)
          x[r * d + e] = __bfloat162float(host[r * pitch + offset + e]);
      return x;
    };

    cuda::FlashTensors io;
    io.inputsBf16 = io.outputsBf16 = true;
    int64_t pitch = c.packed ? 3 * d : d;
    __nv_bfloat16 *qkv = nullptr, *dqkv = nullptr;
    if (c.packed) {
      ASSERT_EQ(c.headsQ, c.headsKv);
      ASSERT_EQ(c.seqQ, c.seqK);
      qkv = device(3 * qn * 2);
      dqkv = device(3 * qn * 2);
      upload(q, qkv, pitch, 0);
      upload(k, qkv, pitch, d);
      upload(v, qkv, pitch, 2 * d);
      io.q = qkv;
      io.k = qkv + d;
      io.v = qkv + 2 * d;
      io.dq = dqkv;
      io.dk = dqkv + d;
      io.dv = dqkv + 2 * d;
      cuda::FlashLayout layout{c.headsQ * 3 * d, 3 * d};
      io.qLayout = io.kLayout = io.vLayout = layout;
      io.dqLayout = io.dkLayout = io.dvLayout = layout;
    } else {
      __nv_bfloat16 *qd = device(qn * 2), *kd = device(kn * 2),
                    *vd = device(kn * 2);
      upload(q, qd, d, 0);
      upload(k, kd, d, 0);
      upload(v, vd, d, 0);
      io.q = qd;
      io.k = kd;
      io.v = vd;
      io.dq = device(qn * 2);
      io.dk = device(kn * 2);
      io.dv = device(kn * 2);
    }
    __nv_bfloat16 *doutD = device(qn * 2);
    upload(dout, doutD, d, 0);
    io.dout = doutD;
    __nv_bfloat16 *outD = device(qn * 2), *copy = device(qn * 2);
    io.out = outD;
    auto *lseD = reinterpret_cast<float *>(device(rows * 4));

    size_t forwardWorkspace = 0, backwardWorkspace = 0;
    ASSERT_EQ(cudnn->prepare(p, io, false, &forwardWorkspace), "");
    ASSERT_EQ(cudnn->prepare(p, io, true, &backwardWorkspace), "");
    void *workspace = device(forwardWorkspace);
    size_t scratchBytes =
        cuda::CudnnAttention::backwardScratchBytes(p, backwardWorkspace);
    void *scratch = device(scratchBytes);
    cudnn->forward(nullptr, p, io, copy, lseD, workspace, forwardWorkspace);
    cudnn->backward(nullptr, p, io, copy, lseD, scratch, scratchBytes);
    ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);

    std::vector<double> actualOut = download(outD, qn, d, 0),
                        actualCopy = download(copy, qn, d, 0);
    std::vector<float> lseHost(rows);
    ASSERT_EQ(
        cudaMemcpy(lseHost.data(), lseD, rows * 4, cudaMemcpyDeviceToHost),
        cudaSuccess);
    double lseDiff = 0;
    for (size_t i = 0; i < rows; ++i)
      lseDiff = std::max(lseDiff, std::abs(lseHost[i] - lse[i]) /
                                      std::max(1.0, std::abs(lse[i])));
    auto *dqBase = static_cast<const __nv_bfloat16 *>(io.dq);
    std::vector<double> actualDq = download(dqBase, qn, pitch, 0);
    std::vector<double> actualDk =
        c.packed ? download(dqBase, kn, pitch, d)
                 : download(static_cast<__nv_bfloat16 *>(io.dk), kn, d, 0);
    std::vector<double> actualDv =
        c.packed ? download(dqBase, kn, pitch, 2 * d)
                 : download(static_cast<__nv_bfloat16 *>(io.dv), kn, d, 0);
    double outDiff = relative(actualOut, out),
           copyDiff = relative(actualCopy, out),
           dqDiff = relative(actualDq, dq), dkDiff = relative(actualDk, dk),
           dvDiff = relative(actualDv, dv);
    std::printf("[ cuDNN attention ] workspace %zu/%zu bytes; out %.3g, copy "
                "%.3g, logsumexp %.3g; dq %.3g, dk %.3g, dv %.3g\n",
                forwardWorkspace, backwardWorkspace, outDiff, copyDiff, lseDiff,
                dqDiff, dkDiff, dvDiff);
    // bf16 P and dS (2^-9 relative) before their products, bf16 results.
    EXPECT_LE(outDiff, 1e-2);
    EXPECT_EQ(copyDiff, outDiff); // the copy holds out's bits
    EXPECT_LE(lseDiff, 1e-4);
    EXPECT_LE(dqDiff, 2e-2);
    EXPECT_LE(dkDiff, 2e-2);
    EXPECT_LE(dvDiff, 2e-2);
    for (void *buffer : buffers)
      cudaFree(buffer);
  }

  cuda::CudnnAttention *cudnn = nullptr;
};

TEST_F(CudnnAttentionTest, HeadDim64Causal) {
  run({2, 256, 256, 4, 4, 64, true});
}

TEST_F(CudnnAttentionTest, HeadDim128CausalGroupedQuery) {
  run({1, 384, 384, 8, 2, 128, true});
}

TEST_F(CudnnAttentionTest, HeadDim64CausalGroupedQueryRagged) {
  run({2, 200, 200, 6, 2, 64, true});
}

TEST_F(CudnnAttentionTest, HeadDim128CausalInPlaceQkv) {
  run({2, 256, 256, 4, 4, 128, true, true});
}

TEST_F(CudnnAttentionTest, HeadDim64InPlaceQkv) {
  run({1, 192, 192, 12, 12, 64, true, true});
}

TEST_F(CudnnAttentionTest, HeadDim128NonCausalOtherKeyCountAndScale) {
  run({1, 130, 320, 4, 2, 128, false, false, 0.07});
}

// What the executor keeps on the own kernels, and says why.
TEST_F(CudnnAttentionTest, DeclinesDropoutFp32AndTheDeterministicBackward) {
  host::AttentionParams p;
  p.batch = 1;
  p.seqQ = p.seqK = 64;
  p.headsQ = p.headsKv = 2;
  p.headDim = p.headDimV = 64;
  p.causal = true;
  p.scale = 0.125;
  cuda::FlashTensors io;
  io.inputsBf16 = io.outputsBf16 = true;
  EXPECT_EQ(cuda::cudnnAttentionUnsupportedReason(p, io), "");
  p.dropoutP = 0.1;
  EXPECT_NE(cuda::cudnnAttentionUnsupportedReason(p, io).find("dropout"),
            std::string::npos);
  p.dropoutP = 0;
  io.outputsBf16 = false;
  EXPECT_NE(cuda::cudnnAttentionUnsupportedReason(p, io).find("fp32"),
            std::string::npos);
  io.outputsBf16 = true;
  io.deterministic = true;
  EXPECT_NE(cuda::cudnnAttentionUnsupportedReason(p, io).find("deterministic"),
            std::string::npos);
  size_t bytes = 0;
  EXPECT_NE(cudnn->prepare(p, io, true, &bytes), "");
}

} // namespace
