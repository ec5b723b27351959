// Timings of the memory-bound kernels outside attention and the GEMMs at
// the benchmark models' shapes (bench/NOTES.md): layer_norm and its
// gradient, gelu and its gradient, and the optimizer's sum of squares and
// multi-tensor AdamW over gpt-1.3b's parameter count. Each prints its time
// and its effective bandwidth (the bytes it must read and write over the
// time). Also the cuBLASLt epilogue GEMMs of gpt2-124m's MLP against the
// plain GEMM plus the kernels they replace, each printing its mean time and
// TFLOP/s. Disabled: they measure, they check nothing; run them with
//   mtrt-cuda-tests --gtest_also_run_disabled_tests
//     --gtest_filter='CudaKernelBench.*'
#include "CudaTestSupport.h"

#include "cuda/CudaCheck.h"
#include "cuda/Gemm.h"
#include "cuda/kernels/Kernels.h"

#include <cstdio>
#include <functional>
#include <random>
#include <string>

using namespace mtrt;
using namespace mtrt::test;

namespace {

class CudaKernelBench : public CudaTest {
protected:
  /// A device buffer of `bytes` filled with the byte 0x3c (fp32 and bf16
  /// elements of about 0.0115: finite, no special cases).
  cuda::DeviceBuffer buffer(size_t bytes) {
    cuda::DeviceBuffer b(std::max<size_t>(bytes, 16), "a benchmark buffer");
    MTRT_CUDA_CHECK(cudaMemset(b.data(), 0x3c, b.size()), "filling");
    return b;
  }

  /// Median of the times of `repeats` launches of `body` after 3 warm-up
  /// ones, printed with `bytes / time`.
  void time(const std::string &what, double bytes,
            const std::function<void()> &body, int repeats = 21) {
    cudaStream_t stream = context->stream();
    for (int i = 0; i < 3; ++i)
      body();
    std::vector<cudaEvent_t> events(repeats + 1);
    for (cudaEvent_t &e : events)
      MTRT_CUDA_CHECK(cudaEventCreate(&e), "creating events");
    for (int i = 0; i < repeats; ++i) {
      MTRT_CUDA_CHECK(cudaEventRecord(events[i], stream), "recording");
      body();
    }
    MTRT_CUDA_CHECK(cudaEventRecord(events[repeats], stream), "recording");
    MTRT_CUDA_CHECK(cudaGetLastError(), what);
    context->synchronize(what);
    std::vector<float> ms(repeats);
    for (int i = 0; i < repeats; ++i)
      MTRT_CUDA_CHECK(cudaEventElapsedTime(&ms[i], events[i], events[i + 1]),
                      "timing");
    for (cudaEvent_t &e : events)
      cudaEventDestroy(e);
    std::sort(ms.begin(), ms.end());
    double median = ms[repeats / 2];
    std::printf("bench: %-58s %8.4f ms %7.0f GB/s\n", what.c_str(), median,
                bytes / (median * 1e-3) / 1e9);
    std::fflush(stdout);
  }
};

struct NormShape {
  const char *model;
  int64_t rows, hidden;
};

constexpr NormShape kNormShapes[] = {
    {"gpt-1.3b", 8 * 2048, 2048},
    {"gpt2-350m", 32 * 1024, 1024},
    {"gpt2-124m", 32 * 1024, 768},
};

std::string label(const char *op, const NormShape &s, const char *types) {
  return std::string(op) + " " + s.model + " [" + std::to_string(s.rows) +
         " x " + std::to_string(s.hidden) + "] " + types;
}

TEST_F(CudaKernelBench, DISABLED_LayerNorm) {
  for (const NormShape &s : kNormShapes) {
    size_t n = static_cast<size_t>(s.rows * s.hidden);
    cuda::DeviceBuffer x = buffer(4 * n), y = buffer(4 * n), dy = buffer(4 * n),
                       dx = buffer(4 * n), w = buffer(4 * s.hidden),
                       b = buffer(4 * s.hidden), dw = buffer(4 * s.hidden),
                       db = buffer(4 * s.hidden),
                       scratch =
                           buffer(2 * cuda::normBackwardScratchBytes(s.rows,
                                                                     s.hidden));
    cudaStream_t stream = context->stream();
    // The models' residual stream is fp32, the norms' y and dy bf16.
    struct Types {
      bool x, dy, out; // bf16 (else fp32): x, dy, and y or dx
      double bytes;    // moved per element
      const char *name;
    };
    for (Types t : {Types{false, false, true, 6, "x f32 -> y bf16"},
                    Types{true, false, true, 4, "x bf16 -> y bf16"}})
      time(label("layer_norm", s, t.name), t.bytes * n, [&] {
        cuda::layerNormForward(stream, s.rows, s.hidden, {x.data(), t.x},
                               w.as<float>(), b.as<float>(), 1e-5,
                               {y.data(), t.out});
      });
    for (Types t : {Types{false, true, false, 10, "x f32, dy bf16 -> dx f32"},
                    Types{true, true, true, 6, "x bf16, dy bf16 -> dx bf16"},
                    Types{false, false, false, 12, "x f32, dy f32 -> dx f32"}})
      time(label("layer_norm_grad", s, t.name), t.bytes * n, [&] {
        cuda::layerNormBackward(stream, s.rows, s.hidden, {x.data(), t.x},
                                w.as<float>(), {dy.data(), t.dy}, 1e-5,
                                {dx.data(), t.out}, dw.as<float>(),
                                db.as<float>(), scratch.data());
      });
  }
}

TEST_F(CudaKernelBench, DISABLED_Gelu) {
  // gpt-1.3b's MLP activations: 8 x 2048 tokens x 8192, bf16.
  int64_t n = int64_t(8) * 2048 * 8192;
  cuda::DeviceBuffer x = buffer(2 * n), dy = buffer(2 * n), y = buffer(2 * n);
  cudaStream_t stream = context->stream();
  const auto *xb = x.as<__nv_bfloat16>(), *dyb = dy.as<__nv_bfloat16>();
  auto *yb = y.as<__nv_bfloat16>();
  time("gelu gpt-1.3b [16384 x 8192] bf16 -> bf16", 4.0 * n, [&] {
    cuda::geluForward(stream, n, xb, yb, host::GeluApproximation::Tanh);
  });
  time("gelu_grad gpt-1.3b [16384 x 8192] bf16, bf16 -> bf16", 6.0 * n, [&] {
    cuda::geluBackward(stream, n, xb, dyb, yb, host::GeluApproximation::Tanh);
  });
}

TEST_F(CudaKernelBench, DISABLED_Optimizer) {
  // gpt-1.3b: 1,315,819,520 parameters, one flat array with a bf16 copy
  // (the GEMMs' weights have one; the cost per element is the same).
  int64_t n = 1315819520;
  cuda::DeviceBuffer param = buffer(4 * n), grad = buffer(4 * n),
                     m = buffer(4 * n), v = buffer(4 * n), bf16 = buffer(2 * n),
                     norm = buffer(sizeof(double)),
                     scratch = buffer(cuda::sumOfSquaresScratchBytes(n));
  MTRT_CUDA_CHECK(cudaMemset(m.data(), 0, m.size()), "zeroing m");
  MTRT_CUDA_CHECK(cudaMemset(v.data(), 0, v.size()), "zeroing v");
  std::vector<cuda::AdamWChunk> chunks;
  for (int64_t at = 0; at < n; at += cuda::kAdamWChunkElements) {
    cuda::AdamWChunk c;
    c.begin = c.stateBegin = c.gradBegin = c.bf16Begin = at;
    c.count = static_cast<int32_t>(
        std::min<int64_t>(cuda::kAdamWChunkElements, n - at));
    c.weightDecay = 1;
    chunks.push_back(c);
  }
  cuda::DeviceBuffer table(sizeof(cuda::AdamWChunk) * chunks.size(),
                           "the chunk table");
  MTRT_CUDA_CHECK(cudaMemcpy(table.data(), chunks.data(), table.size(),
                             cudaMemcpyHostToDevice),
                  "uploading the chunk table");
  cudaStream_t stream = context->stream();
  time("sum_of_squares gpt-1.3b [1315819520] f32", 4.0 * n, [&] {
    cuda::sumOfSquares(stream, n, grad.as<float>(), 1.0f, norm.as<double>(),
                       scratch.data());
  });
  // The distributed optimizer's exact norm, with every gradient in one
  // exponent's bin (the most contended case).
  MTRT_CUDA_CHECK(cudaMemset(grad.data(), 0x3c, grad.size()),
                  "filling the gradients");
  cuda::DeviceBuffer histogram =
      buffer(2 * sizeof(uint64_t) * cuda::kSquareHistogramBins);
  time("square_histogram gpt-1.3b [1315819520] f32, one exponent", 4.0 * n,
       [&] {
         cuda::squareHistogram(stream, n, grad.as<float>(), 1.0f,
                               histogram.as<uint64_t>());
       });
  // Gradient-like values: normal, spread over about 8 exponents.
  std::vector<float> values(size_t(1) << 24);
  std::mt19937 rng(5);
  std::normal_distribution<float> normal(0.0f, 1e-3f);
  for (float &v : values)
    v = normal(rng);
  for (int64_t at = 0; at < n; at += int64_t(values.size()))
    MTRT_CUDA_CHECK(
        cudaMemcpy(grad.as<float>() + at, values.data(),
                   sizeof(float) *
                       std::min<int64_t>(int64_t(values.size()), n - at),
                   cudaMemcpyHostToDevice),
        "uploading gradient-like values");
  time("square_histogram gpt-1.3b [1315819520] f32, normal values", 4.0 * n,
       [&] {
         cuda::squareHistogram(stream, n, grad.as<float>(), 1.0f,
                               histogram.as<uint64_t>());
       });
  cuda::AdamWScalars s;
  s.decay = 0.99999f;
  s.beta1 = 0.9f;
  s.beta2 = 0.95f;
  s.oneMinusBeta1 = 0.1f;
  s.oneMinusBeta2 = 0.05f;
  s.stepSize = 1e-4f;
  s.bias2Sqrt = 0.5f;
  s.eps = 1e-8f;
  s.applyClip = true; // gpt-1.3b's gradient norms are above the clip (1.0)
  s.clipCoefficient = 1.0f;
  // Reads param, grad, m, v; writes param, grad (clipped), m, v, the bf16
  // copy.
  time("adamw gpt-1.3b [1315819520] f32 + bf16 copy, clipped", 34.0 * n,
       [&] {
         cuda::adamwStepChunks(stream, static_cast<int64_t>(chunks.size()),
                               table.as<cuda::AdamWChunk>(), param.as<float>(),
                               grad.as<float>(), m.as<float>(), v.as<float>(),
                               bf16.as<__nv_bfloat16>(), s);
       },
       5);
}

/// The epilogue GEMMs of gpt2-124m's MLP at micro-batch 32 (rows 32768, hidden
/// 768, ffn 3072) with bf16 operands, against the plain product followed by
/// the kernels that do the epilogue's work, with an fp32 and a bf16 D.
TEST_F(CudaKernelBench, DISABLED_EpilogueGemms) {
  constexpr int64_t rows = 32768, hidden = 768, ffn = 3072;
  using Kind = cuda::GemmEpilogue::Kind;
  cudaStream_t stream = context->stream();
  size_t big = sizeof(float) * rows * ffn;
  cuda::DeviceBuffer x(2 * rows * ffn, "x"), w(2 * hidden * ffn, "w"),
      c(big, "C"), aux(big, "aux"), bias(sizeof(float) * ffn, "bias"),
      dbias(sizeof(float) * ffn, "bias gradient"),
      grad(sizeof(float) * hidden * ffn, "weight gradient"),
      scratch(cuda::columnSumScratchBytes(rows, ffn), "scratch");
  for (const cuda::DeviceBuffer *buffer : {&x, &w, &c, &aux, &bias})
    MTRT_CUDA_CHECK(cudaMemsetAsync(buffer->data(), 0, buffer->size(), stream),
                    "zeroing");
  cuda::Gemm gemm(stream, false, true);
  cudaEvent_t start, stop;
  MTRT_CUDA_CHECK(cudaEventCreate(&start), "events");
  MTRT_CUDA_CHECK(cudaEventCreate(&stop), "events");
  auto timeGemm = [&](const std::string &what, double flops, auto &&body) {
    body(); // tunes
    constexpr int kRuns = 20;
    MTRT_CUDA_CHECK(cudaEventRecord(start, stream), what);
    for (int i = 0; i < kRuns; ++i)
      body();
    MTRT_CUDA_CHECK(cudaEventRecord(stop, stream), what);
    MTRT_CUDA_CHECK(cudaEventSynchronize(stop), what);
    float ms = 0;
    MTRT_CUDA_CHECK(cudaEventElapsedTime(&ms, start, stop), what);
    ms /= kRuns;
    std::printf("[ gemm-bench ] %-58s %8.3f ms %7.1f TFLOP/s\n", what.c_str(),
                ms, flops / (ms * 1e-3) / 1e12);
  };
  auto *xb = x.as<__nv_bfloat16>();
  auto *wb = w.as<__nv_bfloat16>();
  float *cf = c.as<float>(), *auxf = aux.as<float>();
  const float *unusedA = cf, *unusedB = cf;
  for (bool bf16D : {false, true}) {
    cuda::Bf16Operands operands{xb, wb, bf16D};
    std::string d = bf16D ? ", bf16 D" : ", fp32 D";
    // Forward fc1: gelu(x W + b), the pre-activation kept.
    double forward = 2.0 * rows * hidden * ffn;
    cuda::GemmEpilogue gelu;
    gelu.kind = Kind::GeluAux;
    gelu.aux = auxf;
    timeGemm("fc1 GELU_AUX_BIAS" + d, forward, [&] {
      gemm.run(1, rows, ffn, hidden, unusedA, false, unusedB, false, cf,
               bias.as<float>(), false, operands, gelu);
    });
    timeGemm("fc1 BIAS" + d, forward, [&] {
      gemm.run(1, rows, ffn, hidden, unusedA, false, unusedB, false, cf,
               bias.as<float>(), false, operands);
    });
    if (!bf16D)
      timeGemm("fc1 BIAS + gelu kernel" + d, forward, [&] {
        gemm.run(1, rows, ffn, hidden, unusedA, false, unusedB, false, auxf,
                 bias.as<float>(), false, operands);
        cuda::geluForward(stream, rows * ffn, auxf, cf,
                          cuda::GeluApproximation::Tanh);
      });
    // fc1's input gradient through fc2: dh = (dy W2^T) * gelu'(pre), with
    // the bias gradient.
    cuda::GemmEpilogue dgelu;
    dgelu.kind = Kind::GeluGrad;
    dgelu.aux = auxf;
    dgelu.biasGrad = dbias.as<float>();
    dgelu.scratch = scratch.data();
    timeGemm("fc2 dx DGELU_BGRAD" + d, forward, [&] {
      gemm.run(1, rows, ffn, hidden, unusedA, false, unusedB, true, cf, nullptr,
               false, operands, dgelu);
    });
    timeGemm("fc2 dx plain" + d, forward, [&] {
      gemm.run(1, rows, ffn, hidden, unusedA, false, unusedB, true, cf, nullptr,
               false, operands);
    });
    if (!bf16D)
      timeGemm("fc2 dx plain + dgelu and bias-gradient kernels" + d, forward,
               [&] {
                 gemm.run(1, rows, ffn, hidden, unusedA, false, unusedB, true,
                          cf, nullptr, false, operands);
                 cuda::geluBackward(stream, rows * ffn, auxf, cf, cf,
                                    cuda::GeluApproximation::Tanh);
                 cuda::biasGrad(stream, rows, ffn, cf, dbias.as<float>(),
                                scratch.data());
               });
  }
  // fc1's weight gradient x^T dh [hidden, ffn] with the bias gradient
  // (BGRADB), written and accumulated into an fp32 gradient; x [rows,
  // hidden] and dh [rows, ffn] both from the buffer of rows * ffn.
  cuda::Bf16Operands operands{xb, xb, false};
  double weight = 2.0 * rows * hidden * ffn;
  cuda::GemmEpilogue bgrad;
  bgrad.kind = Kind::BiasGradB;
  bgrad.biasGrad = dbias.as<float>();
  bgrad.scratch = scratch.data();
  timeGemm("fc1 dW BGRADB", weight, [&] {
    gemm.run(1, hidden, ffn, rows, unusedA, true, unusedB, false,
             grad.as<float>(), nullptr, false, operands, bgrad);
  });
  bgrad.tuningScratch = cf;
  timeGemm("fc1 dW BGRADB accumulating", weight, [&] {
    gemm.run(1, hidden, ffn, rows, unusedA, true, unusedB, false,
             grad.as<float>(), nullptr, true, operands, bgrad);
  });
  cuda::GemmEpilogue plainAccumulate;
  plainAccumulate.tuningScratch = cf;
  timeGemm("fc1 dW plain accumulating", weight, [&] {
    gemm.run(1, hidden, ffn, rows, unusedA, true, unusedB, false,
             grad.as<float>(), nullptr, true, operands, plainAccumulate);
  });
  timeGemm("fc1 dW plain accumulating + bias-gradient kernel (fp32 dh)", weight,
           [&] {
             gemm.run(1, hidden, ffn, rows, unusedA, true, unusedB, false,
                      grad.as<float>(), nullptr, true, operands,
                      plainAccumulate);
             cuda::biasGrad(stream, rows, ffn, cf, dbias.as<float>(),
                            scratch.data());
           });
  for (const std::string &line : gemm.tuningChoices())
    std::printf("[ gemm-bench ] tuned: %s\n", line.c_str());
  cudaEventDestroy(start);
  cudaEventDestroy(stop);
}

// The weight gradient of the attention's qkv projection with its bias
// gradient, at gpt-1.3b's and gpt2-350m's shapes (bf16 operands, fp32
// gradients accumulated): the bias gradient in cuBLASLt's epilogue (BGRADA,
// as the executor runs linear_weight_bias_grad) against the plain GEMM and
// the column-sum kernel over the bf16 dy.
TEST_F(CudaKernelBench, DISABLED_QkvBiasGradient) {
  using Kind = cuda::GemmEpilogue::Kind;
  struct QkvShape {
    const char *model;
    int64_t rows, hidden;
  };
  for (QkvShape shape : {QkvShape{"gpt-1.3b", 8 * 2048, 2048},
                         QkvShape{"gpt2-350m", 32 * 1024, 1024}}) {
    int64_t rows = shape.rows, in = shape.hidden, out = 3 * shape.hidden;
    cudaStream_t stream = context->stream();
    cuda::DeviceBuffer dy = buffer(2 * rows * out), x = buffer(2 * rows * in),
                       grad = buffer(sizeof(float) * out * in),
                       tuning = buffer(sizeof(float) * out * in),
                       dbias = buffer(sizeof(float) * out),
                       scratch = buffer(cuda::columnSumScratchBytes(rows, out));
    cuda::Gemm gemm(stream, false, true);
    cuda::Bf16Operands operands{dy.as<__nv_bfloat16>(),
                                x.as<__nv_bfloat16>(), false};
    const float *unused = grad.as<float>();
    std::string name = std::string(shape.model) + " qkv dW [" +
                       std::to_string(out) + " x " + std::to_string(in) +
                       "] over " + std::to_string(rows) + " rows";
    double bytes = 2.0 * rows * (in + out) + 8.0 * out * in;
    cuda::GemmEpilogue bgrad;
    bgrad.kind = Kind::BiasGradA;
    bgrad.biasGrad = dbias.as<float>();
    bgrad.tuningScratch = tuning.as<float>();
    time(name + ", BGRADA", bytes, [&] {
      gemm.run(1, out, in, rows, unused, true, unused, false, grad.as<float>(),
               nullptr, true, operands, bgrad);
    });
    cuda::GemmEpilogue plain;
    plain.tuningScratch = tuning.as<float>();
    time(name + ", plain", bytes, [&] {
      gemm.run(1, out, in, rows, unused, true, unused, false, grad.as<float>(),
               nullptr, true, operands, plain);
    });
    time(name + ", column sums of bf16 dy", 2.0 * rows * out, [&] {
      cuda::biasGrad(stream, rows, out,
                     cuda::NormRows{dy.data(), /*bf16=*/true},
                     dbias.as<float>(), scratch.data());
    });
    for (const std::string &line : gemm.tuningChoices())
      std::printf("[ gemm-bench ] tuned: %s\n", line.c_str());
  }
}

} // namespace
