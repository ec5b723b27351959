// mtrt-moe-bench: times the CUDA backend's mixture-of-experts layer alone,
// forward and forward + backward, in bf16 as a typed bundle runs it
// (docs/MoE.md, "On CUDA"): the router in fp32 (its GEMM, softmax top-k
// with normalized weights), the tokens permuted into expert order, the
// experts' SwiGLU MLPs as grouped GEMMs (gate and up [E, ffn, hidden],
// down [E, hidden, ffn], bf16 operands, fp32 accumulation and weight
// gradients), the rows unpermuted and weighted; the backward: the
// permutations' and the routing weights' gradients, the grouped data and
// weight gradients, SwiGLU's, the router's. The first grouped GEMM reads
// the experts' row offsets back to the host and the others reuse them, as
// the executor does within a run (cuda/MoeOps.cpp); the permutations
// compute the layout each. bench/torch_moe.py times the same layer in PyTorch
// (torch._grouped_mm).
//
//   mtrt-moe-bench [repeats] [tokens] [hidden] [ffn] [experts] [topk]
//
// Defaults: 20 repeats, the Mixtral-shaped layer of issue 25 (4096 tokens,
// hidden 2048, ffn 7168, 8 experts, top-2). Prints milliseconds per call
// (the median of `repeats` timed calls after two warm-up calls) and TFLOP/s
// counting the products: the experts' 3 GEMMs of 2 S h f each (S = tokens
// x top-k rows) and the router's 2 T h E, times 3 for forward + backward.
#include "core/Error.h"
#include "cuda/CudaCheck.h"
#include "cuda/Gemm.h"
#include "cuda/MoeGemm.h"
#include "cuda/kernels/Kernels.h"
#include "cuda/kernels/MoeKernels.h"

#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

using namespace mtrt;
using namespace mtrt::cuda;

namespace {

/// A device buffer freed at exit of its scope; failures end the program.
struct Buffer {
  void *data = nullptr;
  explicit Buffer(size_t bytes) {
    MTRT_CUDA_CHECK(cudaMalloc(&data, std::max<size_t>(bytes, 1)),
                    "mtrt-moe-bench: allocating a buffer");
  }
  ~Buffer() { cudaFree(data); }
  template <typename T> T *as() const { return static_cast<T *>(data); }
};

int64_t argument(int argc, char **argv, int i, int64_t fallback) {
  return argc > i ? std::atoll(argv[i]) : fallback;
}

} // namespace

int main(int argc, char **argv) try {
  const int repeats = static_cast<int>(argument(argc, argv, 1, 20));
  const int64_t tokens = argument(argc, argv, 2, 4096);
  const int64_t hidden = argument(argc, argv, 3, 2048);
  const int64_t ffn = argument(argc, argv, 4, 7168);
  const int64_t experts = argument(argc, argv, 5, 8);
  const int64_t topk = argument(argc, argv, 6, 2);
  if (repeats < 1 || tokens < 1 || hidden < 1 || ffn < 1 || experts < 1 ||
      experts > kMoeMaxExperts || topk < 1 || topk > experts ||
      topk > kMoeMaxTopk) {
    std::fprintf(stderr,
                 "mtrt-moe-bench: need repeats, tokens, hidden, ffn >= 1, "
                 "1 <= experts <= %lld and 1 <= topk <= min(experts, %lld)\n",
                 static_cast<long long>(kMoeMaxExperts),
                 static_cast<long long>(kMoeMaxTopk));
    return 2;
  }
  const int64_t slots = tokens * topk;
  cudaStream_t stream;
  MTRT_CUDA_CHECK(cudaStreamCreate(&stream), "creating the stream");
  Gemm gemm(stream, /*tf32=*/false);
  auto bf16Of = [](const Buffer &b) { return b.as<__nv_bfloat16>(); };

  // Inputs and weights: normals (x std 1, weights 0.02), bf16 copies.
  Buffer xF32(4 * tokens * hidden), x(2 * tokens * hidden);
  Buffer router(4 * experts * hidden), dy(2 * tokens * hidden);
  Buffer gate(2 * experts * ffn * hidden), up(2 * experts * ffn * hidden);
  Buffer down(2 * experts * hidden * ffn);
  {
    Buffer staging(4 * experts * ffn * hidden);
    auto fillBf16 = [&](const Buffer &to, int64_t n, double std, int id) {
      initNormal(stream, n, staging.as<float>(), std, 1234, id);
      roundToBf16(stream, n, staging.as<float>(), bf16Of(to));
    };
    initNormal(stream, tokens * hidden, xF32.as<float>(), 1.0, 1234, 1);
    roundToBf16(stream, tokens * hidden, xF32.as<float>(), bf16Of(x));
    initNormal(stream, experts * hidden, router.as<float>(), 0.02, 1234, 2);
    fillBf16(gate, experts * ffn * hidden, 0.02, 3);
    fillBf16(up, experts * ffn * hidden, 0.02, 4);
    fillBf16(down, experts * hidden * ffn, 0.02, 5);
    fillBf16(dy, tokens * hidden, 1.0, 6);
    MTRT_CUDA_CHECK(cudaStreamSynchronize(stream), "initializing");
  }

  MoeRouter r;
  r.tokens = tokens;
  r.experts = experts;
  r.topk = topk;
  r.normalize = true;
  Buffer logits(4 * tokens * experts), probs(4 * slots), indices(4 * slots);
  Buffer offsets(4 * (experts + 1)), positions(4 * slots);
  Buffer rows(2 * slots * hidden), g(2 * slots * ffn), u(2 * slots * ffn);
  Buffer act(2 * slots * ffn), o(2 * slots * hidden), y(2 * tokens * hidden);
  // The backward's.
  Buffer dRows(2 * slots * hidden), dProbs(4 * slots), dAct(2 * slots * ffn);
  Buffer dG(2 * slots * ffn), dU(2 * slots * ffn), dRowsUp(2 * slots * hidden);
  Buffer dRowsSum(2 * slots * hidden);
  Buffer dX(2 * tokens * hidden), dLogits(4 * tokens * experts);
  Buffer dXRouter(4 * tokens * hidden), dRouter(4 * experts * hidden);
  Buffer dGate(4 * experts * ffn * hidden), dUp(4 * experts * ffn * hidden);
  Buffer dDown(4 * experts * hidden * ffn);
  std::vector<int32_t> hostOffsets(static_cast<size_t>(experts + 1));
  ExpertGroups groups;
  groups.offsets = hostOffsets.data();
  groups.experts = experts;
  groups.bf16 = true;

  auto launched = [](const char *what) {
    MTRT_CUDA_CHECK(cudaGetLastError(), std::string("launching ") + what);
  };
  // The layout of the routing, as each grouped instruction computes it;
  // with `readBack`, its offsets on the host.
  auto layout = [&](bool readBack) {
    moeLayout(stream, slots, experts, indices.as<int32_t>(),
              offsets.as<int32_t>(), positions.as<int32_t>(), nullptr, nullptr,
              0);
    launched("the layout kernel");
    if (!readBack)
      return;
    MTRT_CUDA_CHECK(cudaMemcpyAsync(hostOffsets.data(), offsets.data,
                                    4 * hostOffsets.size(),
                                    cudaMemcpyDeviceToHost, stream),
                    "reading the offsets");
    MTRT_CUDA_CHECK(cudaStreamSynchronize(stream), "reading the offsets");
  };
  auto forward = [&] {
    // logits [T, E] = x W_r^T in fp32; the routing; the permuted rows.
    gemm.run(1, tokens, experts, hidden, xF32.as<float>(), false,
             router.as<float>(), true, logits.as<float>(), nullptr, false);
    moeRouteForward(stream, r, logits.as<float>(), nullptr, probs.as<float>(),
                    indices.as<int32_t>(), nullptr);
    launched("the routing kernels");
    layout(false);
    moePermute(stream, tokens, topk, hidden, experts, offsets.as<int32_t>(),
               positions.as<int32_t>(), bf16Of(x), nullptr, bf16Of(rows));
    launched("the permutation");
    layout(true);
    groupedLinear(gemm, stream, groups, slots, hidden, ffn, rows.data,
                  gate.data, true, g.data, true);
    groupedLinear(gemm, stream, groups, slots, hidden, ffn, rows.data, up.data,
                  true, u.data, true);
    swigluForward(stream, slots * ffn, bf16Of(g), bf16Of(u), bf16Of(act));
    launched("swiglu");
    groupedLinear(gemm, stream, groups, slots, ffn, hidden, act.data, down.data,
                  true, o.data, true);
    layout(false);
    moeUnpermute(stream, tokens, topk, hidden, positions.as<int32_t>(),
                 bf16Of(o), probs.as<float>(), bf16Of(y));
    launched("the unpermutation");
  };
  auto backward = [&] {
    // The unpermutation's: the rows' gradient (weighted) and the weights'.
    layout(false);
    moePermute(stream, tokens, topk, hidden, experts, offsets.as<int32_t>(),
               positions.as<int32_t>(), bf16Of(dy), probs.as<float>(),
               bf16Of(dRows));
    moeProbsGrad(stream, tokens, topk, hidden, positions.as<int32_t>(),
                 bf16Of(dy), bf16Of(o), dProbs.as<float>());
    launched("the unpermutation's gradient");
    // down: data and weight gradients.
    groupedLinear(gemm, stream, groups, slots, hidden, ffn, dRows.data,
                  down.data, false, dAct.data, true);
    groupedLinearWeightGrad(gemm, stream, groups, ffn, hidden, act.data,
                            dRows.data, true, dDown.as<float>());
    swigluBackward(stream, slots * ffn, bf16Of(g), bf16Of(u), bf16Of(dAct),
                   bf16Of(dG), bf16Of(dU));
    launched("swiglu's gradient");
    // gate and up: data gradients summed, weight gradients.
    groupedLinear(gemm, stream, groups, slots, ffn, hidden, dG.data, gate.data,
                  false, dRows.data, true);
    groupedLinear(gemm, stream, groups, slots, ffn, hidden, dU.data, up.data,
                  false, dRowsUp.data, true);
    add(stream, slots * hidden, bf16Of(dRows), bf16Of(dRowsUp),
        bf16Of(dRowsSum));
    launched("the sum of the rows' gradients");
    groupedLinearWeightGrad(gemm, stream, groups, hidden, ffn, rows.data,
                            dG.data, true, dGate.as<float>());
    groupedLinearWeightGrad(gemm, stream, groups, hidden, ffn, rows.data,
                            dU.data, true, dUp.as<float>());
    // The permutation's gradient; the router's.
    layout(false);
    moeUnpermute(stream, tokens, topk, hidden, positions.as<int32_t>(),
                 bf16Of(dRowsSum), nullptr, bf16Of(dX));
    moeRouteBackward(stream, r, logits.as<float>(), nullptr,
                     indices.as<int32_t>(), dProbs.as<float>(),
                     dLogits.as<float>());
    launched("the router's gradient");
    gemm.run(1, tokens, hidden, experts, dLogits.as<float>(), false,
             router.as<float>(), false, dXRouter.as<float>(), nullptr, false);
    gemm.run(1, experts, hidden, tokens, dLogits.as<float>(), true,
             xF32.as<float>(), false, dRouter.as<float>(), nullptr, false);
  };

  cudaEvent_t start, stop;
  MTRT_CUDA_CHECK(cudaEventCreate(&start), "creating an event");
  MTRT_CUDA_CHECK(cudaEventCreate(&stop), "creating an event");
  auto median = [&](auto &&call) {
    std::vector<float> times;
    for (int i = 0; i < repeats + 2; ++i) {
      MTRT_CUDA_CHECK(cudaEventRecord(start, stream), "timing");
      call();
      MTRT_CUDA_CHECK(cudaEventRecord(stop, stream), "timing");
      MTRT_CUDA_CHECK(cudaEventSynchronize(stop), "timing");
      float ms = 0;
      MTRT_CUDA_CHECK(cudaEventElapsedTime(&ms, start, stop), "timing");
      if (i >= 2)
        times.push_back(ms);
    }
    std::sort(times.begin(), times.end());
    return static_cast<double>(times[times.size() / 2]);
  };
  double forwardMs = median(forward);
  double stepMs = median([&] {
    forward();
    backward();
  });
  double kept = 0;
  for (int64_t e = 0; e < experts; ++e)
    kept += hostOffsets[e + 1] - hostOffsets[e];
  double flops = 3.0 * 2.0 * static_cast<double>(slots) * hidden * ffn +
                 2.0 * static_cast<double>(tokens) * hidden * experts;
  std::printf("mtrt-moe-bench: tokens %lld hidden %lld ffn %lld experts %lld "
              "top-%lld (%g rows kept), bf16\n",
              static_cast<long long>(tokens), static_cast<long long>(hidden),
              static_cast<long long>(ffn), static_cast<long long>(experts),
              static_cast<long long>(topk), kept);
  std::printf("  rows per expert:");
  for (int64_t e = 0; e < experts; ++e)
    std::printf(" %d", hostOffsets[e + 1] - hostOffsets[e]);
  std::printf("\n");
  std::printf("  forward            %8.3f ms  %6.1f TFLOP/s\n", forwardMs,
              flops / forwardMs * 1e-9);
  std::printf("  forward+backward   %8.3f ms  %6.1f TFLOP/s\n", stepMs,
              3.0 * flops / stepMs * 1e-9);
  cudaEventDestroy(start);
  cudaEventDestroy(stop);
  cudaStreamDestroy(stream);
  return 0;
} catch (const mtrt::Error &e) {
  std::fprintf(stderr, "mtrt-moe-bench: %s\n", e.what());
  return 1;
}
