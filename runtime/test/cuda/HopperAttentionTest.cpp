// The Hopper forward (cuda/kernels/HopperAttention.h: wgmma, TMA, warp
// specialization) against the host's attention in float64 and against the
// own flash forward, on the same bf16-exact inputs: out, the saved bf16
// copy and logsumexp within the tolerances FlashAttentionKernelTest holds
// the own forward to, and the dropout keep bits equal to the own forward's
// word for word (both drawn by its mask kernel; the host's mask, which
// FlashAttentionKernelTest checks bit by bit). Shapes: head dimensions 128
// and 64, causal and not, grouped-query heads, ragged query blocks and key
// tiles, q/k/v in place in a packed qkv tensor, a data- and
// tensor-parallel rank's dropout positions, fp32 and bf16 out. Skipped,
// with the reason, on devices other than compute capability 9.0.
#include "CudaTestSupport.h"

#include "cuda/kernels/HopperAttention.h"
#include "cuda/kernels/Kernels.h"
#include "host/ThreadPool.h"
#include "host/kernels/Kernels.h"

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

using namespace mtrt;

namespace {

struct HopperCase {
  int64_t batch, seqQ, seqK, headsQ, headsKv, headDim;
  bool causal;
  double dropout;
  /// q, k, v in place in one [batch, seq, heads, 3 headDim] tensor.
  bool packed = false;
  /// out in bf16 (else fp32).
  bool outBf16 = false;
  int64_t headOffset = 0, globalHeadsQ = 0, batchOffset = 0;
};

template <typename T> T *upload(const std::vector<T> &values) {
  T *device = nullptr;
  EXPECT_EQ(cudaMalloc(&device, values.size() * sizeof(T)), cudaSuccess);
  EXPECT_EQ(cudaMemcpy(device, values.data(), values.size() * sizeof(T),
                       cudaMemcpyHostToDevice),
            cudaSuccess);
  return device;
}

template <typename T> std::vector<T> download(const void *device, size_t n) {
  std::vector<T> values(n);
  EXPECT_EQ(
      cudaMemcpy(values.data(), device, n * sizeof(T), cudaMemcpyDeviceToHost),
      cudaSuccess);
  return values;
}

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

/// One forward's results, read back as doubles.
struct Results {
  std::vector<double> out, copy, lse;
  std::vector<uint64_t> mask;
};

class HopperAttentionTest : public test::CudaTest {
protected:
  void run(const HopperCase &c) {
    host::AttentionParams p;
    p.batch = c.batch;
    p.seqQ = c.seqQ;
    p.seqK = c.seqK;
    p.headsQ = c.headsQ;
    p.headsKv = c.headsKv;
    p.headDim = p.headDimV = c.headDim;
    p.causal = c.causal;
    p.dropoutP = c.dropout;
    p.seed = 17;
    p.firstSample = 5;
    p.batchOffset = c.batchOffset;
    p.headOffset = c.headOffset;
    p.globalHeadsQ = c.globalHeadsQ;
    int64_t d = c.headDim;
    size_t qn = static_cast<size_t>(c.batch * c.seqQ * c.headsQ * d);
    size_t kn = static_cast<size_t>(c.batch * c.seqK * c.headsKv * d);
    size_t rows = static_cast<size_t>(c.batch * c.headsQ * c.seqQ);
    std::vector<double> q = bf16Values(qn, 1, 2.0), k = bf16Values(kn, 2, 2.0),
                        v = bf16Values(kn, 3, 1.0);
    std::vector<double> expectedOut(qn), expectedLse(rows);
    host::ThreadPool pool(2);
    host::attentionForward<double>(pool, p, q.data(), k.data(), v.data(),
                                   expectedOut.data(), expectedLse.data());

    cuda::FlashTensors io;
    io.inputsBf16 = true;
    io.outputsBf16 = c.outBf16;
    std::vector<void *> buffers;
    auto toBf16 = [](const std::vector<double> &x) {
      std::vector<__nv_bfloat16> y(x.size());
      for (size_t i = 0; i < x.size(); ++i)
        y[i] = __float2bfloat16(static_cast<float>(x[i]));
      return y;
    };
    if (c.packed) {
      ASSERT_EQ(c.headsQ, c.headsKv);
      ASSERT_EQ(c.seqQ, c.seqK);
      std::vector<double> qkv(3 * qn);
      for (size_t row = 0; row < qn / d; ++row)
        for (int64_t e = 0; e < d; ++e) {
          qkv[row * 3 * d + e] = q[row * d + e];
          qkv[row * 3 * d + d + e] = k[row * d + e];
          qkv[row * 3 * d + 2 * d + e] = v[row * d + e];
        }
      __nv_bfloat16 *packed = upload(toBf16(qkv));
      buffers.push_back(packed);
      io.q = packed;
      io.k = packed + d;
      io.v = packed + 2 * d;
      cuda::FlashLayout pitch{c.headsQ * 3 * d, 3 * d};
      io.qLayout = io.kLayout = io.vLayout = pitch;
    } else {
      for (const std::vector<double> *x : {&q, &k, &v})
        buffers.push_back(upload(toBf16(*x)));
      io.q = buffers[0];
      io.k = buffers[1];
      io.v = buffers[2];
    }
    std::string reason = cuda::hopperAttentionUnsupportedReason(p, io);
    if (!reason.empty()) {
      for (void *buffer : buffers)
        cudaFree(buffer);
      GTEST_SKIP() << reason;
    }

    size_t maskBytes = cuda::flashAttentionMaskBytes(p);
    auto forward = [&](bool hopper) {
      void *out = nullptr, *lse = nullptr, *copy = nullptr, *mask = nullptr;
      EXPECT_EQ(cudaMalloc(&out, qn * (c.outBf16 ? 2 : 4)), cudaSuccess);
      EXPECT_EQ(cudaMalloc(&lse, rows * 4), cudaSuccess);
      EXPECT_EQ(cudaMalloc(&copy, cuda::flashAttentionSavedOutputBytes(p)),
                cudaSuccess);
      if (maskBytes) {
        EXPECT_EQ(cudaMalloc(&mask, maskBytes), cudaSuccess);
        EXPECT_EQ(cudaMemset(mask, 0, maskBytes), cudaSuccess);
      }
      cuda::FlashTensors call = io;
      call.out = out;
      auto *copyBf16 = static_cast<__nv_bfloat16 *>(copy);
      auto *lseFloat = static_cast<float *>(lse);
      auto *words = static_cast<uint64_t *>(mask);
      if (hopper)
        cuda::hopperAttentionForward(nullptr, p, call, copyBf16, lseFloat,
                                     words);
      else
        cuda::flashAttentionForward(nullptr, p, call, copyBf16, lseFloat,
                                    words);
      EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess)
          << (hopper ? "the Hopper forward" : "the own forward");
      Results r;
      if (c.outBf16)
        for (__nv_bfloat16 x : download<__nv_bfloat16>(out, qn))
          r.out.push_back(__bfloat162float(x));
      else
        for (float x : download<float>(out, qn))
          r.out.push_back(x);
      for (__nv_bfloat16 x : download<__nv_bfloat16>(copy, qn))
        r.copy.push_back(__bfloat162float(x));
      for (float x : download<float>(lse, rows))
        r.lse.push_back(x);
      if (mask)
        r.mask = download<uint64_t>(mask, maskBytes / 8);
      for (void *buffer : {out, lse, copy, mask})
        cudaFree(buffer);
      return r;
    };
    Results own = forward(false), hopper = forward(true);
    for (void *buffer : buffers)
      cudaFree(buffer);

    // The keep bits: the same words as the own forward's. Both forwards call
    // the one mask kernel, each into its own zeroed buffer, so this checks
    // that the Hopper forward draws every word it and the backward read.
    int64_t wrongWords = 0;
    for (size_t i = 0; i < own.mask.size(); ++i)
      wrongWords += own.mask[i] != hopper.mask[i];
    EXPECT_EQ(wrongWords, 0) << "of " << own.mask.size() << " mask words";

    double largest = 0;
    for (double x : expectedOut)
      largest = std::max(largest, std::abs(x));
    auto maxDiff = [](const std::vector<double> &a,
                      const std::vector<double> &b, bool relative) {
      double diff = 0;
      for (size_t i = 0; i < a.size(); ++i)
        diff = std::max(diff, std::abs(a[i] - b[i]) /
                                  (relative ? std::max(1.0, std::abs(b[i]))
                                            : 1.0));
      return diff;
    };
    // As FlashAttentionKernelTest: P rounds to bf16 before P V (a bf16 out
    // and the copy round again).
    double outTolerance = (c.outBf16 ? 1.6e-2 : 8e-3) * largest;
    double outHost = maxDiff(hopper.out, expectedOut, false);
    double copyHost = maxDiff(hopper.copy, expectedOut, false);
    double lseHost = maxDiff(hopper.lse, expectedLse, true);
    double outOwn = maxDiff(hopper.out, own.out, false);
    double lseOwn = maxDiff(hopper.lse, own.lse, true);
    EXPECT_LE(outHost, outTolerance) << "largest |out| " << largest;
    EXPECT_LE(copyHost, 1.6e-2 * largest) << "largest |out| " << largest;
    EXPECT_LE(lseHost, 1e-4);
    EXPECT_LE(outOwn, outTolerance) << "against the own forward";
    EXPECT_LE(lseOwn, 1e-4) << "against the own forward";
    std::printf("[ hopper forward ] vs host: out %.3g, copy %.3g of the "
                "largest %.3g, logsumexp %.3g; vs own: out %.3g, "
                "logsumexp %.3g\n",
                outHost / largest, copyHost / largest, largest, lseHost,
                outOwn / largest, lseOwn);
  }
};

// Causal, dropout with paired draws, q/k/v in place, three query blocks of
// 128 (the last ragged) over three key tiles.
TEST_F(HopperAttentionTest, HeadDim128CausalDropoutInPlace) {
  run({2, 320, 320, 3, 3, 128, true, 0.1, true});
}

// Not causal, grouped-query heads, unpaired draws (260 keys: a ragged
// third key tile), 70 queries.
TEST_F(HopperAttentionTest, HeadDim128GroupedQueryDropout) {
  run({1, 70, 260, 4, 2, 128, false, 0.1});
}

// Without dropout, ragged, out in bf16.
TEST_F(HopperAttentionTest, HeadDim128RaggedWithoutDropoutBf16Out) {
  HopperCase c{2, 130, 130, 2, 2, 128, true, 0.0};
  c.outBf16 = true;
  run(c);
}

// Without dropout, several full tiles, grouped-query heads.
TEST_F(HopperAttentionTest, HeadDim128CausalGroupedQuery) {
  run({1, 512, 512, 4, 1, 128, true, 0.0});
}

// Head dimension 64: a data- and tensor-parallel rank's dropout positions,
// grouped-query heads.
TEST_F(HopperAttentionTest, HeadDim64DropoutOnATensorParallelRank) {
  HopperCase c{2, 192, 192, 4, 2, 64, true, 0.1};
  c.headOffset = 4;
  c.globalHeadsQ = 8;
  c.batchOffset = 2;
  run(c);
}

// Head dimension 64 in place, not causal, ragged, unpaired draws.
TEST_F(HopperAttentionTest, HeadDim64InPlaceRaggedDropout) {
  run({1, 100, 100, 2, 2, 64, false, 0.2, true});
}

// Causal at head dimension 64 over four query blocks and up to four key
// tiles, so that each of the two K/V stages is reused.
TEST_F(HopperAttentionTest, HeadDim64CausalDropoutOverFourTiles) {
  run({2, 512, 512, 2, 2, 64, true, 0.1});
}

// Head dimension 64, dropout, ragged (200), out in bf16: both outputs by
// the tensor stores.
TEST_F(HopperAttentionTest, HeadDim64RaggedDropoutBf16Out) {
  HopperCase c{1, 200, 200, 2, 2, 64, true, 0.1};
  c.outBf16 = true;
  run(c);
}

// What the kernel does not take is named before any device is asked (no
// GPU needed): head dimensions other than 64 and 128, fp32 inputs, rows
// the tensor copy engine cannot address (strides not multiples of 8).
TEST(HopperAttentionReasonTest, NamesWhatItDoesNotTake) {
  host::AttentionParams p;
  p.batch = 1;
  p.seqQ = p.seqK = 128;
  p.headsQ = p.headsKv = 2;
  p.headDim = p.headDimV = 32;
  p.causal = true;
  alignas(16) static __nv_bfloat16 data[8];
  cuda::FlashTensors io;
  io.q = io.k = io.v = data;
  io.inputsBf16 = true;
  EXPECT_EQ(cuda::hopperAttentionUnsupportedReason(p, io),
            "the Hopper attention kernel takes head dimensions 64 and 128, "
            "found 32");
  p.headDim = p.headDimV = 128;
  io.inputsBf16 = false;
  EXPECT_EQ(cuda::hopperAttentionUnsupportedReason(p, io),
            "the Hopper attention kernel takes bf16 q, k and v (fp32 given)");
  io.inputsBf16 = true;
  io.kLayout = {2 * 132, 132};
  EXPECT_EQ(cuda::hopperAttentionUnsupportedReason(p, io),
            "the Hopper attention kernel copies tiles by TMA, which needs "
            "16-byte aligned rows: k's data or strides (position 264, head "
            "132 elements) are not multiples of 8 elements");
}

//===----------------------------------------------------------------------===//
// The Hopper backward (hopperAttentionBackward): dq, dk, dv against the host's
// attentionBackward in float64 (from the same bf16-exact q, k, v, dout and
// the host's own forward) and against the own kernels' (the deterministic
// two-kernel backward), each chain run from its own forward: the own
// forward + own backward, the Hopper forward + Hopper backward. With dropout
// both backwards read their forward's keep bits, which the forward test
// above checks word for word against the own forward's; a kept element
// read as dropped (or the reverse) moves a gradient by about a probability
// times dout, far past the tolerances. Tolerances (of each gradient's
// largest magnitude): 2e-2 against the host, as CudnnAttentionTest holds
// cuDNN's backward (P and dS round to bf16 before their products); 1e-2
// against the own kernels, which round at the same points.
//===----------------------------------------------------------------------===//

struct HopperBackwardCase {
  int64_t batch, seqQ, seqK, headsQ, headsKv, headDim;
  bool causal;
  double dropout;
  /// dq, dk, dv in bf16 (else fp32).
  bool gradsBf16 = false;
};

/// The largest |actual - expected| over the largest |expected|.
double relativeToLargest(const std::vector<double> &actual,
                         const std::vector<double> &expected) {
  double diff = 0, largest = 0;
  for (size_t i = 0; i < expected.size(); ++i) {
    diff = std::max(diff, std::abs(actual[i] - expected[i]));
    largest = std::max(largest, std::abs(expected[i]));
  }
  return largest > 0 ? diff / largest : diff;
}

class HopperAttentionBackwardTest : public test::CudaTest {
protected:
  void run(const HopperBackwardCase &c) {
    host::AttentionParams p;
    p.batch = c.batch;
    p.seqQ = c.seqQ;
    p.seqK = c.seqK;
    p.headsQ = c.headsQ;
    p.headsKv = c.headsKv;
    p.headDim = p.headDimV = c.headDim;
    p.causal = c.causal;
    p.dropoutP = c.dropout;
    p.seed = 23;
    p.firstSample = 9;
    int64_t d = c.headDim;
    size_t qn = static_cast<size_t>(c.batch * c.seqQ * c.headsQ * d);
    size_t kn = static_cast<size_t>(c.batch * c.seqK * c.headsKv * d);
    size_t rows = static_cast<size_t>(c.batch * c.headsQ * c.seqQ);
    std::vector<double> q = bf16Values(qn, 11, 2.0),
                        k = bf16Values(kn, 12, 2.0),
                        v = bf16Values(kn, 13, 1.0),
                        dout = bf16Values(qn, 14, 1.0);
    std::vector<double> out(qn), lse(rows), dq(qn), dk(kn), dv(kn);
    host::ThreadPool pool(2);
    host::attentionForward<double>(pool, p, q.data(), k.data(), v.data(),
                                   out.data(), lse.data());
    host::attentionBackward<double>(pool, p, q.data(), k.data(), v.data(),
                                    lse.data(), dout.data(), dq.data(),
                                    dk.data(), dv.data());

    auto toBf16 = [](const std::vector<double> &x) {
      std::vector<__nv_bfloat16> y(x.size());
      for (size_t i = 0; i < x.size(); ++i)
        y[i] = __float2bfloat16(static_cast<float>(x[i]));
      return y;
    };
    std::vector<void *> inputs;
    for (const std::vector<double> *x : {&q, &k, &v, &dout})
      inputs.push_back(upload(toBf16(*x)));
    cuda::FlashTensors io;
    io.q = inputs[0];
    io.k = inputs[1];
    io.v = inputs[2];
    io.dout = inputs[3];
    io.inputsBf16 = true;
    io.outputsBf16 = c.gradsBf16;
    std::string reason = cuda::hopperAttentionBackwardUnsupportedReason(p, io);
    if (!reason.empty()) {
      for (void *buffer : inputs)
        cudaFree(buffer);
      GTEST_SKIP() << reason;
    }

    size_t maskBytes = cuda::flashAttentionMaskBytes(p);
    size_t scratchBytes = cuda::flashAttentionBackwardScratchBytes(p);
    size_t element = c.gradsBf16 ? 2 : 4;
    struct Gradients {
      std::vector<double> dq, dk, dv;
    };
    auto chain = [&](bool hopper) {
      void *outBuffer = nullptr, *lseBuffer = nullptr, *copy = nullptr,
           *mask = nullptr, *scratch = nullptr, *grads[3] = {};
      EXPECT_EQ(cudaMalloc(&outBuffer, qn * 4), cudaSuccess);
      EXPECT_EQ(cudaMalloc(&lseBuffer, rows * 4), cudaSuccess);
      EXPECT_EQ(cudaMalloc(&copy, cuda::flashAttentionSavedOutputBytes(p)),
                cudaSuccess);
      EXPECT_EQ(cudaMalloc(&scratch, scratchBytes), cudaSuccess);
      // Garbage in the scratch: the backward must zero its dq sums.
      EXPECT_EQ(cudaMemset(scratch, 0x7f, scratchBytes), cudaSuccess);
      if (maskBytes) {
        EXPECT_EQ(cudaMalloc(&mask, maskBytes), cudaSuccess);
      }
      EXPECT_EQ(cudaMalloc(&grads[0], qn * element), cudaSuccess);
      EXPECT_EQ(cudaMalloc(&grads[1], kn * element), cudaSuccess);
      EXPECT_EQ(cudaMalloc(&grads[2], kn * element), cudaSuccess);
      cuda::FlashTensors call = io;
      call.out = outBuffer;
      call.outputsBf16 = false;
      auto *copyBf16 = static_cast<__nv_bfloat16 *>(copy);
      auto *lseFloat = static_cast<float *>(lseBuffer);
      auto *words = static_cast<uint64_t *>(mask);
      if (hopper)
        cuda::hopperAttentionForward(nullptr, p, call, copyBf16, lseFloat,
                                     words);
      else
        cuda::flashAttentionForward(nullptr, p, call, copyBf16, lseFloat,
                                    words);
      call.outputsBf16 = c.gradsBf16;
      call.out = nullptr;
      call.dq = grads[0];
      call.dk = grads[1];
      call.dv = grads[2];
      if (hopper) {
        cuda::hopperAttentionBackward(nullptr, p, call, copyBf16, lseFloat,
                                      words, scratch);
      } else {
        call.deterministic = true;
        cuda::flashAttentionBackward(nullptr, p, call, copyBf16, lseFloat,
                                     words, scratch);
      }
      EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess)
          << (hopper ? "the Hopper chain" : "the own chain");
      Gradients g;
      auto read = [&](void *from, size_t n, std::vector<double> &to) {
        if (c.gradsBf16)
          for (__nv_bfloat16 x : download<__nv_bfloat16>(from, n))
            to.push_back(__bfloat162float(x));
        else
          for (float x : download<float>(from, n))
            to.push_back(x);
      };
      read(grads[0], qn, g.dq);
      read(grads[1], kn, g.dk);
      read(grads[2], kn, g.dv);
      for (void *buffer :
           {outBuffer, lseBuffer, copy, mask, scratch, grads[0], grads[1],
            grads[2]})
        cudaFree(buffer);
      return g;
    };
    Gradients own = chain(false), mine = chain(true);
    for (void *buffer : inputs)
      cudaFree(buffer);

    const char *names[3] = {"dq", "dk", "dv"};
    const std::vector<double> *expected[3] = {&dq, &dk, &dv};
    const std::vector<double> *owns[3] = {&own.dq, &own.dk, &own.dv};
    const std::vector<double> *hoppers[3] = {&mine.dq, &mine.dk, &mine.dv};
    double hostTolerance = c.gradsBf16 ? 2.5e-2 : 2e-2;
    double ownTolerance = c.gradsBf16 ? 1.5e-2 : 1e-2;
    for (int i = 0; i < 3; ++i) {
      double vsHost = relativeToLargest(*hoppers[i], *expected[i]);
      double ownVsHost = relativeToLargest(*owns[i], *expected[i]);
      double vsOwn = relativeToLargest(*hoppers[i], *owns[i]);
      EXPECT_LE(vsHost, hostTolerance) << names[i] << " against the host";
      EXPECT_LE(vsOwn, ownTolerance) << names[i] << " against the own kernels";
      std::printf("[ hopper backward ] %s: vs host %.3g (own kernels %.3g), "
                  "vs own %.3g of the largest\n",
                  names[i], vsHost, ownVsHost, vsOwn);
    }
  }
};

// gpt-1.3b's and the Llama's case: head dimension 128, causal, dropout;
// 320 keys: two key blocks of 128 and a ragged third, query tiles of 64.
TEST_F(HopperAttentionBackwardTest, HeadDim128CausalDropout) {
  run({2, 320, 320, 3, 3, 128, true, 0.1});
}

// Grouped-query heads (4 query heads a key/value head), causal, no dropout.
TEST_F(HopperAttentionBackwardTest, HeadDim128CausalGroupedQuery) {
  run({1, 256, 256, 8, 2, 128, true, 0.0});
}

// Not causal, grouped-query heads, dropout, ragged queries (70) and keys
// (260), gradients in bf16.
TEST_F(HopperAttentionBackwardTest, HeadDim128GroupedQueryDropoutBf16) {
  run({1, 70, 260, 4, 2, 128, false, 0.1, true});
}

// gpt2's case: head dimension 64, causal, dropout, ragged (200).
TEST_F(HopperAttentionBackwardTest, HeadDim64CausalDropout) {
  run({2, 200, 200, 4, 4, 64, true, 0.1});
}

// Head dimension 64, grouped-query heads, not causal, no dropout.
TEST_F(HopperAttentionBackwardTest, HeadDim64GroupedQuery) {
  run({2, 128, 192, 4, 2, 64, false, 0.0});
}

// Head dimension 64, causal grouped-query heads with dropout, bf16 grads.
TEST_F(HopperAttentionBackwardTest, HeadDim64CausalGroupedQueryDropoutBf16) {
  run({1, 384, 384, 6, 2, 64, true, 0.15, true});
}

// Most of the probabilities dropped: P' = P / (1 - p) at 2.5 P, the kept
// fraction's share of delta large.
TEST_F(HopperAttentionBackwardTest, HighDropoutAtBothHeadDimensions) {
  run({2, 192, 192, 4, 2, 128, true, 0.6});
  run({2, 192, 192, 4, 2, 64, true, 0.6, true});
}

// None kept (p rounds to 65536 / 65536): zero outputs and gradients, no
// infinite 1 / (1 - p) on the way.
TEST_F(HopperAttentionBackwardTest, NoneKept) {
  run({1, 128, 128, 2, 2, 128, true, 0.999995});
  run({1, 128, 128, 2, 2, 64, false, 0.999995});
}

// The deterministic backward is not taken (the own kernels give it).
TEST(HopperAttentionReasonTest, BackwardDeclinesTheDeterministicDq) {
  host::AttentionParams p;
  p.batch = 1;
  p.seqQ = p.seqK = 128;
  p.headsQ = p.headsKv = 2;
  p.headDim = p.headDimV = 128;
  p.causal = true;
  alignas(16) static __nv_bfloat16 data[8];
  cuda::FlashTensors io;
  io.q = io.k = io.v = io.dout = data;
  io.inputsBf16 = true;
  io.deterministic = true;
  EXPECT_EQ(cuda::hopperAttentionBackwardUnsupportedReason(p, io),
            "the Hopper backward adds dq by fp32 reductions in a varying "
            "order; the deterministic backward runs the own kernels");
}

} // namespace
