// The flash-attention forward kernels alone against the host's attention in
// float64 on the same bf16-exact inputs: every dropout keep bit of the mask
// (drawn before the forward, which reads it, and kept for the gradient)
// equals core/Random.h's dropoutKeep (the host's mask) bit for
// bit, and out, the saved bf16 copy and logsumexp agree
// within the rounding of P to bf16. Shapes cover the classes the kernels
// treat differently: paired dropout draws (seqK % 4 == 0: a draw's four keys
// in one row, which the mask kernel draws four at a time) over several key
// tiles and query blocks, unpaired draws, grouped-query heads, causal and
// not, ragged tiles, q/k/v read in place from a packed qkv tensor, and a
// data- and tensor-parallel rank's global samples and dropout positions.
//
// MTRT_CUDA_FLASH_FORWARD=narrow (FlashAttention.cu) runs the 16-row forward
// at head dimension 128 instead of the 32-row one; run these tests both
// ways to check both.
#include "CudaTestSupport.h"

#include "cuda/kernels/Kernels.h"
#include "host/ThreadPool.h"
#include "host/kernels/Kernels.h"

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdio>
#include <vector>

using namespace mtrt;

namespace {

struct FlashCase {
  int64_t batch, seqQ, seqK, headsQ, headsKv, headDim;
  bool causal;
  double dropout;
  /// q, k, v read in place from one [batch, seq, heads, 3 headDim] tensor
  /// (the GPT bundles' qkv GEMM result; headsQ == headsKv, seqQ == seqK).
  bool packed = false;
  /// A data- and tensor-parallel rank's tile: its batch rows and query
  /// heads start at these offsets of the global micro-batch.
  int64_t headOffset = 0, globalHeadsQ = 0, batchOffset = 0;
};

void check(cudaError_t error, const char *what) {
  ASSERT_EQ(error, cudaSuccess) << what << ": " << cudaGetErrorString(error);
}

/// A device copy of `n` values of T.
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

class FlashAttentionKernelTest : public test::CudaTest {
protected:
  void run(const FlashCase &c) {
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
    ASSERT_EQ(cuda::flashAttentionUnsupportedReason(p), "");
    int64_t d = c.headDim;
    size_t qn = static_cast<size_t>(c.batch * c.seqQ * c.headsQ * d);
    size_t kn = static_cast<size_t>(c.batch * c.seqK * c.headsKv * d);
    size_t rows = static_cast<size_t>(c.batch * c.headsQ * c.seqQ);
    // Scores of a few units: softmax rows neither flat nor one-hot.
    std::vector<double> q = bf16Values(qn, 1, 2.0), k = bf16Values(kn, 2, 2.0),
                        v = bf16Values(kn, 3, 1.0);

    // The reference: the host's attention in float64, with its masks.
    std::vector<double> expectedOut(qn), expectedLse(rows);
    host::ThreadPool pool(2);
    host::attentionForward<double>(pool, p, q.data(), k.data(), v.data(),
                                   expectedOut.data(), expectedLse.data());

    // The device inputs in bf16, packed [b, s, h, d] or in place in one
    // [b, s, h, 3d] tensor.
    cuda::FlashTensors io;
    io.inputsBf16 = true;
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
    float *out = nullptr, *lse = nullptr;
    __nv_bfloat16 *outCopy = nullptr;
    uint64_t *mask = nullptr;
    check(cudaMalloc(&out, qn * sizeof(float)), "cudaMalloc");
    check(cudaMalloc(&lse, rows * sizeof(float)), "cudaMalloc");
    check(cudaMalloc(&outCopy, cuda::flashAttentionSavedOutputBytes(p)),
          "cudaMalloc");
    size_t maskBytes = cuda::flashAttentionMaskBytes(p);
    if (maskBytes) {
      check(cudaMalloc(&mask, maskBytes), "cudaMalloc");
      check(cudaMemset(mask, 0, maskBytes), "cudaMemset");
    }
    buffers.insert(buffers.end(), {out, lse, outCopy, mask});
    io.out = out;
    cuda::flashAttentionForward(nullptr, p, io, outCopy, lse, mask);
    check(cudaGetLastError(), "the forward's launch");
    check(cudaDeviceSynchronize(), "the forward");

    // Every keep bit of a key a row sees, against the host's decision.
    if (mask) {
      size_t words = maskBytes / sizeof(uint64_t);
      std::vector<uint64_t> bits = download<uint64_t>(mask, words);
      int64_t keyBlocks = words / rows;
      uint32_t threshold = random::dropoutThreshold16(p.dropoutP);
      int64_t wrong = 0, checked = 0;
      std::string first;
      for (int64_t b = 0; b < c.batch; ++b)
        for (int64_t h = 0; h < c.headsQ; ++h)
          for (int64_t i = 0; i < c.seqQ; ++i) {
            // Random.h's key: the global sample, the position within it.
            uint64_t key = random::streamKey(
                p.seed,
                p.firstSample + static_cast<uint64_t>(b + c.batchOffset));
            uint64_t row = static_cast<uint64_t>(
                ((h + c.headOffset) * c.seqQ + i) * c.seqK);
            int64_t seen = c.causal ? i + 1 : c.seqK;
            int64_t at = ((b * c.headsQ + h) * c.seqQ + i) * keyBlocks;
            for (int64_t j = 0; j < seen; ++j) {
              bool expected =
                  random::dropoutKeep(key, row + j, threshold);
              bool actual = (bits[at + j / 64] >> (j % 64)) & 1;
              ++checked;
              if (expected != actual && wrong++ == 0)
                first = "batch " + std::to_string(b) + ", head " +
                        std::to_string(h) + ", query " + std::to_string(i) +
                        ", key " + std::to_string(j);
            }
          }
      EXPECT_EQ(wrong, 0) << "of " << checked
                          << " keep bits differ from the host's; first at "
                          << first;
    }

    // out (fp32), the bf16 copy and logsumexp.
    std::vector<float> actualOut = download<float>(out, qn);
    std::vector<__nv_bfloat16> actualCopy =
        download<__nv_bfloat16>(outCopy, qn);
    std::vector<float> actualLse = download<float>(lse, rows);
    double largest = 0, outDiff = 0, copyDiff = 0, lseDiff = 0;
    for (size_t i = 0; i < qn; ++i) {
      largest = std::max(largest, std::abs(expectedOut[i]));
      outDiff = std::max(outDiff, std::abs(actualOut[i] - expectedOut[i]));
      copyDiff = std::max(
          copyDiff,
          std::abs(static_cast<double>(__bfloat162float(actualCopy[i])) -
                   expectedOut[i]));
    }
    for (size_t i = 0; i < rows; ++i)
      lseDiff = std::max(lseDiff, std::abs(actualLse[i] - expectedLse[i]) /
                                      std::max(1.0, std::abs(expectedLse[i])));
    // P rounds to bf16 (2^-9 relative) before P V; the copy rounds again.
    EXPECT_LE(outDiff, 8e-3 * largest) << "largest |out| " << largest;
    EXPECT_LE(copyDiff, 1.6e-2 * largest) << "largest |out| " << largest;
    EXPECT_LE(lseDiff, 1e-4);
    std::printf("[ flash forward ] out %.3g, copy %.3g of the largest %.3g; "
                "logsumexp %.3g\n",
                largest > 0 ? outDiff / largest : outDiff,
                largest > 0 ? copyDiff / largest : copyDiff, largest, lseDiff);
    for (void *buffer : buffers)
      cudaFree(buffer);
  }
};

// The class the 8-warp forward once got wrong (session 5): paired draws
// (seqK % 4 == 0) at head dimension 128 over five key tiles and three
// query blocks of 128 (the last half full), causal, q/k/v in place.
TEST_F(FlashAttentionKernelTest, HeadDim128PairedDrawsAcrossTilesAndBlocks) {
  run({2, 320, 320, 3, 3, 128, true, 0.1, true});
}

// Unpaired draws (260 keys), grouped-query heads, not causal, 70 queries.
TEST_F(FlashAttentionKernelTest, HeadDim128UnpairedDrawsGroupedQuery) {
  run({1, 70, 260, 4, 2, 128, false, 0.1});
}

// No dropout, a ragged last tile.
TEST_F(FlashAttentionKernelTest, HeadDim128RaggedWithoutDropout) {
  run({2, 130, 130, 2, 2, 128, true, 0.0});
}

// Head dimension 64: paired draws, grouped-query heads, a data- and
// tensor-parallel rank's tile (its samples start at batch row 2 of the
// global micro-batch, its dropout positions count the global heads).
TEST_F(FlashAttentionKernelTest, HeadDim64PairedDrawsOnATensorParallelRank) {
  FlashCase c{2, 192, 192, 4, 2, 64, true, 0.1};
  c.headOffset = 4;
  c.globalHeadsQ = 8;
  c.batchOffset = 2;
  run(c);
}

// Head dimension 64 in place, a ragged last tile, unpaired draws (not
// causal: 100 keys).
TEST_F(FlashAttentionKernelTest, HeadDim64InPlaceRaggedUnpaired) {
  run({1, 100, 100, 2, 2, 64, false, 0.2, true});
}

// Head dimension 32 (the 16-row kernel) with paired draws.
TEST_F(FlashAttentionKernelTest, HeadDim32PairedDraws) {
  run({1, 128, 128, 2, 1, 32, true, 0.1});
}

} // namespace
