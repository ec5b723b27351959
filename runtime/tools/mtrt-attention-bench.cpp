// mtrt-attention-bench: times the CUDA backend's flash-attention kernels
// alone (forward as training runs it: out, the saved copy, logsumexp and
// dropout bits; backward: delta, dq, dk, dv) at issue 22's shapes and the step
// table's gpt2-350m and llama-1.5b, with q, k, v, dout and out, dq, dk, dv in
// fp32 and in bf16 ("io"), and in bf16 with q, k, v read from one packed
// [batch, seq, heads, 3 headDim] tensor and dq, dk, dv written into another
// ("qkv": the GPT bundles' split and concat elided, a row pitch of 3 headDim;
// shapes with as many key/value heads as query heads). Where the backward sums
// dq by reductions (head dimension 128, bf16), the bf16 lines are repeated with
// a deterministic dq (FlashTensors::deterministic: the separate dq kernel),
// marked "-det". Without dropout the same is timed through cuDNN's fused
// attention (cuda/CudnnAttention.h), the path the executor takes there: "cudnn"
// (separate bf16 q, k, v; the forward writes out and the logsumexp only, as
// PyTorch's SDPA does) and "cudnn-qkv" (q, k, v and dq, dk, dv in place as
// "qkv"; the forward also copies out for the gradient, as training runs
// it), each first checked against the own kernels' results (the largest
// difference over the largest magnitude of out, logsumexp, dq, dk, dv).
// "hopper" and "hopper-qkv" (q, k, v separate or in place as "qkv") time
// the Hopper forward and backward (cuda/kernels/HopperAttention.h: wgmma,
// TMA, warp specialization; with and without dropout), first checked
// against the own kernels: the forward's out and logsumexp (the largest
// difference over the largest magnitude: within 1e-2 for out, both
// rounding P to bf16 at different tiles, and 1e-5 for the logsumexp), the
// backward's dq, dk, dv from the same forward state (within 2e-2); a miss
// is printed as MISMATCH and makes the exit status 1. With dropout, the
// Hopper lines are preceded by the time of the dropout mask kernel alone
// ("of which the dropout mask kernel"), which the forward includes.
//
//   mtrt-attention-bench [repeats] [shapes] [ios] [dropouts]
//
// `shapes`: the shapes to time, comma-separated names (default: all);
// `ios`: the io names to time (fp32, bf16, qkv, bf16-det, qkv-det, cudnn,
// cudnn-qkv, hopper, hopper-qkv; default: all); `dropouts`: 0.1, 0 or both
// (default).
//
// Prints one line per shape and dropout: milliseconds per call (the median of
// `repeats` timed calls after two warm-up calls; with MTRT_BENCH_FLUSH_L2=1
// each from a cold L2, twice its size written before it) and TFLOP/s, counting
// the products of the visible (causal) half only: forward 4 b h s^2 d / 2,
// backward 2.5 times that (FlashAttention's convention, so the figures
// compare with PyTorch's bench/torch_sdpa.py). MTRT_BENCH_SUSTAIN=N times
// the mean of N calls back to back instead, after N more (sustainedCalls).
#include "cuda/CudnnAttention.h"
#include "cuda/kernels/HopperAttention.h"
#include "cuda/kernels/Kernels.h"

#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <string>
#include <vector>

namespace {

void check(cudaError_t error, const char *what) {
  if (error != cudaSuccess) {
    std::fprintf(stderr, "mtrt-attention-bench: %s: %s\n", what,
                 cudaGetErrorString(error));
    std::exit(1);
  }
}

struct Shape {
  const char *name;
  int64_t batch, seq, headsQ, headsKv, headDim;
};

/// n uniform values in [-1, 1) of T (float or __nv_bfloat16): a
/// 2^20-element pattern, repeated.
template <typename T = float> T *deviceRandom(size_t n, unsigned seed) {
  std::vector<T> pattern(std::min<size_t>(n, size_t(1) << 20));
  uint32_t x = seed * 2654435761u + 1;
  for (T &value : pattern) {
    x = x * 1664525u + 1013904223u;
    value = T(static_cast<float>(x >> 8) * 0x1.0p-24f * 2.f - 1.f);
  }
  T *device = nullptr;
  check(cudaMalloc(&device, n * sizeof(T)), "cudaMalloc");
  for (size_t at = 0; at < n; at += pattern.size())
    check(cudaMemcpy(device + at, pattern.data(),
                     std::min(pattern.size(), n - at) * sizeof(T),
                     cudaMemcpyHostToDevice),
          "cudaMemcpy");
  return device;
}

/// With MTRT_BENCH_FLUSH_L2=1, a buffer of twice the L2 cache that
/// medianMs writes before each timed call, so that the call starts from a
/// cold L2 as in a training step (where other kernels ran before it);
/// null otherwise.
void *l2Flush(size_t &bytes) {
  static void *buffer = nullptr;
  static size_t size = 0;
  static bool asked = [] {
    const char *flush = std::getenv("MTRT_BENCH_FLUSH_L2");
    return flush && std::string(flush) == "1";
  }();
  if (asked && !buffer) {
    int device = 0, l2 = 0;
    check(cudaGetDevice(&device), "cudaGetDevice");
    check(cudaDeviceGetAttribute(&l2, cudaDevAttrL2CacheSize, device),
          "the L2 cache's size");
    size = 2 * static_cast<size_t>(l2);
    check(cudaMalloc(&buffer, size), "cudaMalloc (the L2 flush)");
  }
  bytes = size;
  return buffer;
}

/// MTRT_BENCH_SUSTAIN=N: medianMs times N calls back to back instead (after
/// N more that bring the GPU to the clock and power it holds under that
/// load), as a training step runs its kernels; 0 otherwise.
int sustainedCalls() {
  static int calls = [] {
    const char *value = std::getenv("MTRT_BENCH_SUSTAIN");
    return value ? std::max(0, std::atoi(value)) : 0;
  }();
  return calls;
}

template <typename Body> double medianMs(int repeats, Body &&body) {
  cudaEvent_t start, stop;
  check(cudaEventCreate(&start), "cudaEventCreate");
  check(cudaEventCreate(&stop), "cudaEventCreate");
  // The milliseconds of `calls` calls back to back.
  auto time = [&](int calls) {
    check(cudaEventRecord(start), "cudaEventRecord");
    for (int i = 0; i < calls; ++i)
      body();
    check(cudaEventRecord(stop), "cudaEventRecord");
    check(cudaEventSynchronize(stop), "cudaEventSynchronize");
    check(cudaGetLastError(), "a kernel");
    float ms = 0;
    check(cudaEventElapsedTime(&ms, start, stop), "cudaEventElapsedTime");
    return ms;
  };
  double ms = 0;
  if (int calls = sustainedCalls()) {
    for (int i = 0; i < calls; ++i)
      body();
    ms = time(calls) / calls;
  } else {
    for (int i = 0; i < 2; ++i)
      body();
    size_t flushBytes = 0;
    void *flush = l2Flush(flushBytes);
    std::vector<float> times;
    for (int i = 0; i < repeats; ++i) {
      if (flush)
        check(cudaMemset(flush, i & 0xFF, flushBytes), "the L2 flush");
      times.push_back(time(1));
    }
    std::sort(times.begin(), times.end());
    ms = times[times.size() / 2];
  }
  cudaEventDestroy(start);
  cudaEventDestroy(stop);
  return ms;
}

/// The packed dq, dk, dv ([batch, seq, heads, 3 headDim] bf16 at io.dq) of
/// the backward as `io` asks, against those of the deterministic backward:
/// prints the largest difference of each over its largest magnitude.
void compareWithDeterministic(const mtrt::host::AttentionParams &p,
                              const mtrt::cuda::FlashTensors &io,
                              const __nv_bfloat16 *outCopy, const float *lse,
                              const uint64_t *mask, void *scratch) {
  size_t n = static_cast<size_t>(p.batch * p.seqQ * p.headsQ * 3 * p.headDim);
  auto run = [&](bool deterministic) {
    mtrt::cuda::FlashTensors call = io;
    call.deterministic = deterministic;
    mtrt::cuda::flashAttentionBackward(nullptr, p, call, outCopy, lse, mask,
                                       scratch);
    std::vector<__nv_bfloat16> host(n);
    check(cudaMemcpy(host.data(), io.dq, n * sizeof(__nv_bfloat16),
                     cudaMemcpyDeviceToHost),
          "cudaMemcpy");
    return host;
  };
  std::vector<__nv_bfloat16> fused = run(false), reference = run(true);
  double diff[3] = {0, 0, 0}, largest[3] = {0, 0, 0};
  for (size_t i = 0; i < n; ++i) {
    int part = static_cast<int>(i % (3 * p.headDim) / p.headDim);
    double a = __bfloat162float(fused[i]), b = __bfloat162float(reference[i]);
    diff[part] = std::max(diff[part], std::abs(a - b));
    largest[part] = std::max(largest[part], std::abs(b));
  }
  std::printf("  vs deterministic: dq %.2e, dk %.2e, dv %.2e of the largest\n",
              diff[0] / largest[0], diff[1] / largest[1], diff[2] / largest[2]);
}

/// The largest |a - b| over the largest |b| of n device elements of T.
template <typename T>
double relativeDifference(const void *a, const void *b, size_t n) {
  std::vector<T> x(n), y(n);
  check(cudaMemcpy(x.data(), a, n * sizeof(T), cudaMemcpyDeviceToHost),
        "cudaMemcpy");
  check(cudaMemcpy(y.data(), b, n * sizeof(T), cudaMemcpyDeviceToHost),
        "cudaMemcpy");
  double diff = 0, largest = 0;
  for (size_t i = 0; i < n; ++i) {
    double u = static_cast<float>(x[i]), w = static_cast<float>(y[i]);
    diff = std::max(diff, std::abs(u - w));
    largest = std::max(largest, std::abs(w));
  }
  return largest > 0 ? diff / largest : diff;
}

} // namespace

int main(int argc, char **argv) {
  int devices = 0;
  if (cudaError_t status = cudaGetDeviceCount(&devices);
      status != cudaSuccess || devices == 0) {
    std::fprintf(stderr, "mtrt-attention-bench: no CUDA device (%s)\n",
                 status != cudaSuccess ? cudaGetErrorString(status)
                                       : "none found");
    return 1;
  }
  int repeats = argc > 1 ? std::atoi(argv[1]) : 10;
  // A list given and not empty, between commas.
  auto list = [&](int i) {
    return argc > i && *argv[i] ? "," + std::string(argv[i]) + "," : "";
  };
  std::string only = list(2), ios = list(3), dropouts = list(4);
  auto listed = [](const std::string &list, const std::string &name) {
    return list.empty() || list.find("," + name + ",") != std::string::npos;
  };
  // Issue 22's shapes, then the step table's other two models' (bench/
  // torch_sdpa.py has the same list).
  const Shape shapes[] = {
      {"gpt2-124m", 32, 1024, 12, 12, 64}, {"gpt-1.3b", 8, 2048, 16, 16, 128},
      {"s4096", 4, 4096, 32, 32, 128},     {"s8192", 2, 8192, 16, 16, 128},
      {"gqa-4096", 4, 4096, 32, 8, 128},   {"gpt2-350m", 32, 1024, 16, 16, 64},
      {"llama-1.5b", 4, 2048, 32, 8, 64},
  };
  std::printf("%-10s %10s %7s %9s %9s %9s %9s\n", "shape", "io", "dropout",
              "fwd ms", "fwd TF/s", "bwd ms", "bwd TF/s");
  int mismatches = 0; // Hopper results outside their tolerance
  std::unique_ptr<mtrt::cuda::CudnnAttention> cudnn;
  std::string cudnnMissing = mtrt::cuda::cudnnAttentionUnavailableReason();
  if (cudnnMissing.empty())
    cudnn = std::make_unique<mtrt::cuda::CudnnAttention>();
  std::printf(
      "cuDNN: %s\n",
      cudnn ? ("version " +
               std::to_string(mtrt::cuda::CudnnAttention::libraryVersion()))
                  .c_str()
            : cudnnMissing.c_str());
  for (const Shape &shape : shapes)
    if (only.empty() ||
        only.find("," + std::string(shape.name) + ",") != std::string::npos)
      for (double dropout : {0.1, 0.0})
        // fp32, bf16, qkv, bf16 det., qkv det., cudnn, cudnn-qkv, hopper,
        // hopper-qkv
        for (int mode : {0, 1, 2, 3, 4, 5, 6, 7, 8}) {
          bool bf16 = mode > 0,
               packed = mode == 2 || mode == 4 || mode == 6 || mode == 8;
          bool deterministic = mode == 3 || mode == 4;
          bool viaCudnn = mode == 5 || mode == 6;
          bool viaHopper = mode >= 7;
          {
            std::string name = packed ? "qkv" : bf16 ? "bf16" : "fp32";
            if (viaCudnn)
              name = packed ? "cudnn-qkv" : "cudnn";
            else if (viaHopper)
              name = packed ? "hopper-qkv" : "hopper";
            else if (deterministic)
              name += "-det";
            if (!listed(ios, name) ||
                !listed(dropouts, dropout > 0 ? "0.1" : "0"))
              continue;
            // A packed q, k, v has as many key/value heads as query heads:
            // asked for by name at a grouped-query shape, say so.
            if (packed && shape.headsKv != shape.headsQ) {
              if (!ios.empty())
                std::printf("%s: %s skipped: packed q, k, v need as many "
                            "key/value heads as query heads (%d, %d); ask "
                            "for %s\n",
                            shape.name, name.c_str(),
                            static_cast<int>(shape.headsKv),
                            static_cast<int>(shape.headsQ),
                            viaCudnn        ? "cudnn"
                            : viaHopper     ? "hopper"
                            : deterministic ? "bf16-det"
                                            : "bf16");
              continue;
            }
          }
          if (deterministic && shape.headDim < 128)
            continue;
          if (viaCudnn && (!cudnn || dropout > 0))
            continue;
          mtrt::host::AttentionParams p;
          p.batch = shape.batch;
          p.seqQ = p.seqK = shape.seq;
          p.headsQ = shape.headsQ;
          p.headsKv = shape.headsKv;
          p.headDim = p.headDimV = shape.headDim;
          p.causal = true;
          p.dropoutP = dropout;
          p.seed = 7;
          p.firstSample = 3;
          std::string reason = mtrt::cuda::flashAttentionUnsupportedReason(p);
          if (!reason.empty()) {
            std::printf("%s: %s\n", shape.name, reason.c_str());
            continue;
          }
          size_t qn =
              static_cast<size_t>(p.batch * p.seqQ * p.headsQ * p.headDim);
          size_t kn =
              static_cast<size_t>(p.batch * p.seqK * p.headsKv * p.headDim);
          size_t rows = static_cast<size_t>(p.batch * p.headsQ * p.seqQ);
          float *q = deviceRandom(qn, 1), *k = deviceRandom(kn, 2),
                *v = deviceRandom(kn, 3), *dout = deviceRandom(qn, 4);
          float *out, *lse, *dq, *dk, *dv;
          __nv_bfloat16 *outCopy;
          void *mask = nullptr, *scratch = nullptr;
          check(cudaMalloc(&out, qn * sizeof(float)), "cudaMalloc");
          check(cudaMalloc(&outCopy,
                           mtrt::cuda::flashAttentionSavedOutputBytes(p)),
                "cudaMalloc");
          check(cudaMalloc(&dq, qn * sizeof(float)), "cudaMalloc");
          check(cudaMalloc(&dk, kn * sizeof(float)), "cudaMalloc");
          check(cudaMalloc(&dv, kn * sizeof(float)), "cudaMalloc");
          check(cudaMalloc(&lse, rows * sizeof(float)), "cudaMalloc");
          size_t maskBytes = mtrt::cuda::flashAttentionMaskBytes(p);
          if (maskBytes)
            check(cudaMalloc(&mask, maskBytes), "cudaMalloc");
          check(cudaMalloc(&scratch,
                           mtrt::cuda::flashAttentionBackwardScratchBytes(p)),
                "cudaMalloc");
          auto *maskWords = static_cast<uint64_t *>(mask);
          mtrt::cuda::FlashTensors io;
          io.q = q;
          io.k = k;
          io.v = v;
          io.dout = dout;
          io.out = out;
          io.dq = dq;
          io.dk = dk;
          io.dv = dv;
          io.inputsBf16 = io.outputsBf16 = bf16;
          io.deterministic = deterministic;
          std::vector<void *> rounded; // the inputs in bf16
          if (bf16) {
            rounded = {deviceRandom<__nv_bfloat16>(qn, 1),
                       deviceRandom<__nv_bfloat16>(kn, 2),
                       deviceRandom<__nv_bfloat16>(kn, 3),
                       deviceRandom<__nv_bfloat16>(qn, 4)};
            io.q = rounded[0];
            io.k = rounded[1];
            io.v = rounded[2];
            io.dout = rounded[3];
          }
          if (packed) {
            int64_t d = p.headDim;
            auto *qkv = deviceRandom<__nv_bfloat16>(3 * qn, 1);
            auto *dqkv = deviceRandom<__nv_bfloat16>(3 * qn, 5);
            rounded.push_back(qkv);
            rounded.push_back(dqkv);
            io.q = qkv;
            io.k = qkv + d;
            io.v = qkv + 2 * d;
            io.dq = dqkv;
            io.dk = dqkv + d;
            io.dv = dqkv + 2 * d;
            mtrt::cuda::FlashLayout pitch{p.headsQ * 3 * d, 3 * d};
            io.qLayout = io.kLayout = io.vLayout = pitch;
            io.dqLayout = io.dkLayout = io.dvLayout = pitch;
          }
          double forwardMs, backwardMs = 0;
          if (viaHopper) {
            std::string declined =
                mtrt::cuda::hopperAttentionUnsupportedReason(p, io);
            if (!declined.empty()) {
              std::printf("%s: %s\n", shape.name, declined.c_str());
              continue;
            }
            // Against the own forward: its out (bf16) and logsumexp.
            void *ownOut = nullptr, *ownLse = nullptr;
            check(cudaMalloc(&ownOut, qn * 2), "cudaMalloc");
            check(cudaMalloc(&ownLse, rows * 4), "cudaMalloc");
            mtrt::cuda::FlashTensors mine = io;
            mine.out = ownOut;
            mtrt::cuda::flashAttentionForward(
                nullptr, p, mine, nullptr, static_cast<float *>(ownLse),
                maskWords);
            mtrt::cuda::hopperAttentionForward(nullptr, p, io, outCopy, lse,
                                               maskWords);
            check(cudaDeviceSynchronize(), "the comparison");
            double outDiff =
                relativeDifference<__nv_bfloat16>(out, ownOut, qn);
            double lseDiff = relativeDifference<float>(lse, ownLse, rows);
            bool within = outDiff <= 1e-2 && lseDiff <= 1e-5;
            mismatches += !within;
            std::printf("  vs own: out %.2e, lse %.2e of the largest%s\n",
                        outDiff, lseDiff,
                        within ? "" : " MISMATCH (tolerance 1e-2, 1e-5)");
            cudaFree(ownOut);
            cudaFree(ownLse);
            forwardMs = medianMs(repeats, [&] {
              mtrt::cuda::hopperAttentionForward(nullptr, p, io, outCopy, lse,
                                                 maskWords);
            });
            if (maskWords)
              std::printf("  of which the dropout mask kernel: %.3f ms\n",
                          medianMs(repeats, [&] {
                            mtrt::cuda::flashAttentionDropoutMask(nullptr, p,
                                                                  maskWords);
                          }));
            // The Hopper backward from the Hopper forward's copy, logsumexp
            // and keep bits, against the own backward's dq, dk, dv from the
            // same (2e-2 of the largest: both round P and dS to bf16 at the
            // same points, dq's fp32 sums in a different order).
            std::string backwardDeclined =
                mtrt::cuda::hopperAttentionBackwardUnsupportedReason(p, io);
            if (backwardDeclined.empty()) {
              size_t gradN = packed ? 3 * qn : qn, kGradN = packed ? 0 : kn;
              std::vector<void *> own(3, nullptr);
              check(cudaMalloc(&own[0], gradN * 2), "cudaMalloc");
              check(cudaMalloc(&own[1], std::max<size_t>(kGradN, 1) * 2),
                    "cudaMalloc");
              check(cudaMalloc(&own[2], std::max<size_t>(kGradN, 1) * 2),
                    "cudaMalloc");
              mtrt::cuda::FlashTensors mine = io;
              if (packed) {
                auto *base = static_cast<__nv_bfloat16 *>(own[0]);
                mine.dq = base;
                mine.dk = base + p.headDim;
                mine.dv = base + 2 * p.headDim;
              } else {
                mine.dq = own[0];
                mine.dk = own[1];
                mine.dv = own[2];
              }
              mtrt::cuda::flashAttentionBackward(nullptr, p, mine, outCopy,
                                                 lse, maskWords, scratch);
              mtrt::cuda::hopperAttentionBackward(nullptr, p, io, outCopy, lse,
                                                  maskWords, scratch);
              check(cudaDeviceSynchronize(), "the backward comparison");
              using B = __nv_bfloat16;
              double worst;
              if (packed) {
                worst = relativeDifference<B>(io.dq, own[0], gradN);
                std::printf("  backward vs own: dq+dk+dv %.2e of the largest",
                            worst);
              } else {
                double dqDiff = relativeDifference<B>(io.dq, own[0], qn),
                       dkDiff = relativeDifference<B>(io.dk, own[1], kn),
                       dvDiff = relativeDifference<B>(io.dv, own[2], kn);
                worst = std::max(dqDiff, std::max(dkDiff, dvDiff));
                std::printf("  backward vs own: dq %.2e, dk %.2e, dv %.2e of "
                            "the largest",
                            dqDiff, dkDiff, dvDiff);
              }
              bool close = worst <= 2e-2;
              mismatches += !close;
              std::printf("%s\n", close ? "" : " MISMATCH (tolerance 2e-2)");
              for (void *buffer : own)
                cudaFree(buffer);
              backwardMs = medianMs(repeats, [&] {
                mtrt::cuda::hopperAttentionBackward(nullptr, p, io, outCopy,
                                                    lse, maskWords, scratch);
              });
            } else {
              std::printf("  the Hopper backward declines: %s\n",
                          backwardDeclined.c_str());
            }
          } else if (viaCudnn) {
            size_t forwardWorkspace = 0, backwardWorkspace = 0;
            std::string declined =
                cudnn->prepare(p, io, false, &forwardWorkspace);
            if (declined.empty())
              declined = cudnn->prepare(p, io, true, &backwardWorkspace);
            if (!declined.empty()) {
              std::printf("%s: cuDNN declines: %s\n", shape.name,
                          declined.c_str());
              continue;
            }
            size_t scratchBytes =
                mtrt::cuda::CudnnAttention::backwardScratchBytes(
                    p, backwardWorkspace);
            void *workspace = nullptr, *cudnnScratch = nullptr;
            check(cudaMalloc(&workspace, std::max<size_t>(forwardWorkspace, 1)),
                  "cudaMalloc");
            check(cudaMalloc(&cudnnScratch, scratchBytes), "cudaMalloc");
            std::printf("  cuDNN workspace: forward %zu, backward %zu bytes "
                        "(scratch %zu)\n",
                        forwardWorkspace, backwardWorkspace, scratchBytes);
            __nv_bfloat16 *copy = packed ? outCopy : nullptr;
            auto cudnnForward = [&] {
              cudnn->forward(nullptr, p, io, copy, lse, workspace,
                             forwardWorkspace);
            };
            auto cudnnBackward = [&] {
              cudnn->backward(nullptr, p, io, outCopy, lse, cudnnScratch,
                              scratchBytes);
            };
            // Against the own kernels: their out, logsumexp, dq, dk, dv.
            {
              size_t outN = qn, gradN = packed ? 3 * qn : qn;
              size_t kGradN = packed ? 0 : kn;
              std::vector<void *> own(5, nullptr);
              check(cudaMalloc(&own[0], outN * 2), "cudaMalloc");
              check(cudaMalloc(&own[1], rows * 4), "cudaMalloc");
              check(cudaMalloc(&own[2], gradN * 2), "cudaMalloc");
              check(cudaMalloc(&own[3], std::max<size_t>(kGradN, 1) * 2),
                    "cudaMalloc");
              check(cudaMalloc(&own[4], std::max<size_t>(kGradN, 1) * 2),
                    "cudaMalloc");
              mtrt::cuda::FlashTensors mine = io;
              mine.out = own[0];
              mine.outLayout = {};
              if (packed) {
                auto *base = static_cast<__nv_bfloat16 *>(own[2]);
                mine.dq = base;
                mine.dk = base + p.headDim;
                mine.dv = base + 2 * p.headDim;
              } else {
                mine.dq = own[2];
                mine.dk = own[3];
                mine.dv = own[4];
              }
              mtrt::cuda::flashAttentionForward(nullptr, p, mine, outCopy,
                                                static_cast<float *>(own[1]),
                                                nullptr);
              mtrt::cuda::flashAttentionBackward(nullptr, p, mine, outCopy,
                                                 static_cast<float *>(own[1]),
                                                 nullptr, scratch);
              // cuDNN's: out into io.out (packed bf16 here), copy for the
              // backward from the own kernels' (same values to rounding).
              mtrt::cuda::FlashTensors theirs = io;
              theirs.out = out;
              theirs.outLayout = {};
              cudnn->forward(nullptr, p, theirs, nullptr, lse, workspace,
                             forwardWorkspace);
              cudnn->backward(nullptr, p, io, outCopy, lse, cudnnScratch,
                              scratchBytes);
              check(cudaDeviceSynchronize(), "the comparison");
              using B = __nv_bfloat16;
              std::printf("  vs own: out %.2e, lse %.2e, ",
                          relativeDifference<B>(out, own[0], outN),
                          relativeDifference<float>(lse, own[1], rows));
              if (packed)
                std::printf("dq+dk+dv %.2e of the largest\n",
                            relativeDifference<B>(io.dq, own[2], gradN));
              else
                std::printf("dq %.2e, dk %.2e, dv %.2e of the largest\n",
                            relativeDifference<B>(io.dq, own[2], qn),
                            relativeDifference<B>(io.dk, own[3], kn),
                            relativeDifference<B>(io.dv, own[4], kn));
              for (void *buffer : own)
                cudaFree(buffer);
            }
            forwardMs = medianMs(repeats, cudnnForward);
            backwardMs = medianMs(repeats, cudnnBackward);
            cudaFree(workspace);
            cudaFree(cudnnScratch);
          } else {
            forwardMs = medianMs(repeats, [&] {
              mtrt::cuda::flashAttentionForward(nullptr, p, io, outCopy, lse,
                                                maskWords);
            });
            backwardMs = medianMs(repeats, [&] {
              mtrt::cuda::flashAttentionBackward(nullptr, p, io, outCopy, lse,
                                                 maskWords, scratch);
            });
          }
          double forwardFlop = 4.0 * p.batch * p.headsQ * p.seqQ *
                               static_cast<double>(p.seqK) * p.headDim / 2;
          std::string ioName = packed ? "qkv" : bf16 ? "bf16" : "fp32";
          if (viaCudnn)
            ioName = packed ? "cudnn-qkv" : "cudnn";
          if (viaHopper)
            ioName = packed ? "hopper-qkv" : "hopper";
          if (deterministic)
            ioName += "-det";
          if (viaHopper && backwardMs == 0) // forward only
            std::printf("%-10s %10s %7.1f %9.3f %9.1f %9s %9s\n", shape.name,
                        ioName.c_str(), dropout, forwardMs,
                        forwardFlop / forwardMs * 1e-9, "-", "-");
          else
            std::printf("%-10s %10s %7.1f %9.3f %9.1f %9.3f %9.1f\n",
                        shape.name, ioName.c_str(), dropout, forwardMs,
                        forwardFlop / forwardMs * 1e-9, backwardMs,
                        2.5 * forwardFlop / backwardMs * 1e-9);
          std::fflush(stdout);
          if (packed && !deterministic && !viaHopper && shape.headDim >= 128)
            compareWithDeterministic(p, io, outCopy, lse, maskWords, scratch);
          for (void *buffer :
               {static_cast<void *>(q), static_cast<void *>(k),
                static_cast<void *>(v), static_cast<void *>(dout),
                static_cast<void *>(out), static_cast<void *>(outCopy),
                static_cast<void *>(dq), static_cast<void *>(dk),
                static_cast<void *>(dv), static_cast<void *>(lse), mask,
                scratch})
            cudaFree(buffer);
          for (void *buffer : rounded)
            cudaFree(buffer);
        }
  return mismatches ? 1 : 0;
}
