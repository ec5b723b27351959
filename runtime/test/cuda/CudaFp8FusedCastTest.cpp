// The FP8 casts fused into their producers (swigluToFp8, rmsNormToFp8,
// layerNormToFp8: the executor's fused casts, Fp8Ops.cpp) against the
// producer's kernel followed by castToFp8: the same codes and the same amax,
// bit for bit, for both formats, with the result held in bf16 and in fp32,
// on the vectorized and the element-wise paths (swiglu) and on the staged
// and the registers' kernels (norms: hidden 2048 and 100); the cast that
// also writes the transposed codes (castToFp8Transposed) against the cast
// and transposeBytes; SwiGLU's backward with both gradients' casts
// (swigluBackwardToFp8) against swigluBackward and the casts. And the
// batched
// fp8_update (fp8UpdateMetas, 300 metas: three launches) against the host's
// delayed-scaling arithmetic (core/Fp8.h), and the FP8 GEMMs' table of
// inverse scales (fp8InverseTable).
#include "CudaTestSupport.h"

#include "core/Fp8.h"
#include "cuda/CudaCheck.h"
#include "cuda/kernels/Fp8Scaling.h"
#include "cuda/kernels/Kernels.h"
#include "cuda/kernels/NormFp8.h"

#include <cstring>
#include <limits>
#include <random>
#include <vector>

using namespace mtrt;
using namespace mtrt::test;

namespace {

using fp8::Format;

class CudaFp8FusedCastTest : public CudaTest,
                             public ::testing::WithParamInterface<Format> {
protected:
  /// Uploads `values` as bf16 (or fp32) into a new device buffer.
  cuda::DeviceBuffer upload(const std::vector<float> &values, bool bf16) {
    cudaStream_t stream = context->stream();
    cuda::DeviceBuffer buffer(values.size() * 4 + 64, "test inputs");
    if (bf16) {
      std::vector<__nv_bfloat16> halves(values.size());
      for (size_t i = 0; i < values.size(); ++i)
        halves[i] = __float2bfloat16_rn(values[i]);
      MTRT_CUDA_CHECK(cudaMemcpyAsync(buffer.data(), halves.data(),
                                      halves.size() * 2, cudaMemcpyHostToDevice,
                                      stream),
                      "test");
    } else {
      MTRT_CUDA_CHECK(cudaMemcpyAsync(buffer.data(), values.data(),
                                      values.size() * 4, cudaMemcpyHostToDevice,
                                      stream),
                      "test");
    }
    context->synchronize("test");
    return buffer;
  }

  std::vector<float> randomValues(size_t n, float stddev, unsigned seed) {
    std::mt19937 random(seed);
    std::normal_distribution<float> normal(0.0f, stddev);
    std::vector<float> values(n);
    for (float &v : values)
      v = normal(random);
    return values;
  }

  /// The codes and the amax a cast left: `n` codes at `codes`, the float
  /// at `amax`.
  std::pair<std::vector<uint8_t>, float> download(const void *codes, size_t n,
                                                  const float *amax) {
    cudaStream_t stream = context->stream();
    std::vector<uint8_t> out(n);
    float largest = 0;
    MTRT_CUDA_CHECK(
        cudaMemcpyAsync(out.data(), codes, n, cudaMemcpyDeviceToHost, stream),
        "test");
    MTRT_CUDA_CHECK(
        cudaMemcpyAsync(&largest, amax, 4, cudaMemcpyDeviceToHost, stream),
        "test");
    context->synchronize("test");
    return {out, largest};
  }

  /// A device scale (and two amax words) for the casts.
  cuda::DeviceBuffer scalars() {
    cuda::DeviceBuffer buffer(256, "scale and amaxes");
    const float scale = GetParam() == Format::E4M3 ? 40.0f : 3000.0f;
    MTRT_CUDA_CHECK(cudaMemcpyAsync(buffer.data(), &scale, 4,
                                    cudaMemcpyHostToDevice, context->stream()),
                    "test");
    MTRT_CUDA_CHECK(
        cudaMemsetAsync(buffer.as<float>() + 16, 0, 8, context->stream()),
        "test");
    return buffer;
  }

  /// Counts differing codes and expects none, and equal amaxes.
  void expectSame(const std::pair<std::vector<uint8_t>, float> &plain,
                  const std::pair<std::vector<uint8_t>, float> &fused,
                  const std::string &what) {
    size_t differing = 0;
    for (size_t i = 0; i < plain.first.size(); ++i)
      differing += plain.first[i] != fused.first[i];
    EXPECT_EQ(differing, 0u) << what;
    EXPECT_EQ(plain.second, fused.second) << what;
    EXPECT_GT(fused.second, 0.0f) << what;
  }
};

TEST_P(CudaFp8FusedCastTest, SwigluToFp8IsSwigluThenTheCast) {
  Format format = GetParam();
  cudaStream_t stream = context->stream();
  // 8-aligned sizes take 8 elements a thread; an odd one element-wise.
  for (int64_t n : {int64_t(1) << 16, int64_t(4099)}) {
    for (bool bf16 : {true, false}) {
      std::vector<float> gate = randomValues(size_t(n), 2.0f, 1),
                         up = randomValues(size_t(n), 1.0f, 2);
      cuda::DeviceBuffer g = upload(gate, bf16), u = upload(up, bf16),
                         y(size_t(n) * 4, "y"), plainCodes(size_t(n), "codes"),
                         fusedCodes(size_t(n), "codes"), s = scalars();
      auto in = [&](cuda::DeviceBuffer &b) -> cuda::InElements {
        if (bf16)
          return b.as<__nv_bfloat16>();
        return b.as<float>();
      };
      cuda::OutElements out = y.as<float>();
      cuda::InElements yIn = y.as<float>();
      if (bf16) {
        out = y.as<__nv_bfloat16>();
        yIn = y.as<__nv_bfloat16>();
      }
      float *amaxes = s.as<float>() + 16;
      MTRT_CUDA_CHECK_LAUNCH(cuda::swigluForward(stream, n, in(g), in(u), out),
                             "test");
      MTRT_CUDA_CHECK_LAUNCH(cuda::castToFp8(stream, n, yIn,
                                             plainCodes.as<uint8_t>(), format,
                                             s.as<float>(), amaxes),
                             "test");
      MTRT_CUDA_CHECK_LAUNCH(cuda::swigluToFp8(stream, n, in(g), in(u), bf16,
                                               fusedCodes.as<uint8_t>(), format,
                                               s.as<float>(), amaxes + 1),
                             "test");
      expectSame(download(plainCodes.data(), size_t(n), amaxes),
                 download(fusedCodes.data(), size_t(n), amaxes + 1),
                 "swiglu of " + std::to_string(n) + (bf16 ? " bf16" : " fp32") +
                     " elements");
    }
  }
}

TEST_P(CudaFp8FusedCastTest, NormsToFp8AreTheNormsThenTheCast) {
  Format format = GetParam();
  cudaStream_t stream = context->stream();
  // Hidden 2048 (aligned, bf16 or fp32) takes the staged kernels, 100 the
  // registers' ones.
  for (int64_t hidden : {int64_t(2048), int64_t(100)}) {
    for (bool layer : {false, true}) {
      for (bool bf16 : {true, false}) {
        const int64_t rows = 300, n = rows * hidden;
        std::vector<float> x = randomValues(size_t(n), 1.5f, 3),
                           w = randomValues(size_t(hidden), 1.0f, 4),
                           b = randomValues(size_t(hidden), 0.5f, 5);
        cuda::DeviceBuffer dx = upload(x, bf16), dw = upload(w, false),
                           db = upload(b, false), y(size_t(n) * 4, "y"),
                           plainCodes(size_t(n), "codes"),
                           fusedCodes(size_t(n), "codes"), s = scalars();
        cuda::NormRows in{dx.data(), bf16};
        cuda::NormRowsOut out{y.data(), bf16};
        cuda::InElements yIn = y.as<float>();
        if (bf16)
          yIn = y.as<__nv_bfloat16>();
        float *amaxes = s.as<float>() + 16;
        cuda::NormFp8Out fp8{fusedCodes.as<uint8_t>(), s.as<float>(),
                             amaxes + 1, format};
        if (layer) {
          MTRT_CUDA_CHECK_LAUNCH(
              cuda::layerNormForward(stream, rows, hidden, in, dw.as<float>(),
                                     db.as<float>(), 1e-5, out),
              "test");
          MTRT_CUDA_CHECK_LAUNCH(
              cuda::layerNormToFp8(stream, rows, hidden, in, dw.as<float>(),
                                   db.as<float>(), 1e-5, out, fp8),
              "test");
        } else {
          MTRT_CUDA_CHECK_LAUNCH(cuda::rmsNormForward(stream, rows, hidden, in,
                                                      dw.as<float>(), 1e-5,
                                                      out),
                                 "test");
          MTRT_CUDA_CHECK_LAUNCH(cuda::rmsNormToFp8(stream, rows, hidden, in,
                                                    dw.as<float>(), 1e-5, out,
                                                    fp8),
                                 "test");
        }
        MTRT_CUDA_CHECK_LAUNCH(cuda::castToFp8(stream, n, yIn,
                                               plainCodes.as<uint8_t>(), format,
                                               s.as<float>(), amaxes),
                               "test");
        expectSame(download(plainCodes.data(), size_t(n), amaxes),
                   download(fusedCodes.data(), size_t(n), amaxes + 1),
                   std::string(layer ? "layer" : "RMS") + " norm, hidden " +
                       std::to_string(hidden) + (bf16 ? ", bf16" : ", fp32"));
      }
    }
  }
}

// An output gradient's cast with its transposed codes against castToFp8
// and transposeBytes: whole and partial 64 x 64 tiles, bf16 and fp32; a
// shape that is not a multiple of 16 is declined (nothing launched).
TEST_P(CudaFp8FusedCastTest, TransposedCastIsTheCastThenTheTranspose) {
  Format format = GetParam();
  cudaStream_t stream = context->stream();
  for (auto [rows, cols] :
       {std::pair<int64_t, int64_t>{512, 384}, {80, 208}, {16, 16}}) {
    for (bool bf16 : {true, false}) {
      const int64_t n = rows * cols;
      std::vector<float> x = randomValues(size_t(n), 2.0f, 6);
      cuda::DeviceBuffer dx = upload(x, bf16), plainCodes(size_t(n), "codes"),
                         plainT(size_t(n), "transposed"),
                         fusedCodes(size_t(n), "codes"),
                         fusedT(size_t(n), "transposed"), s = scalars();
      cuda::InElements in = dx.as<float>();
      if (bf16)
        in = dx.as<__nv_bfloat16>();
      float *amaxes = s.as<float>() + 16;
      MTRT_CUDA_CHECK_LAUNCH(cuda::castToFp8(stream, n, in,
                                             plainCodes.as<uint8_t>(), format,
                                             s.as<float>(), amaxes),
                             "test");
      MTRT_CUDA_CHECK_LAUNCH(cuda::transposeBytes(stream, rows, cols,
                                                  plainCodes.as<uint8_t>(),
                                                  plainT.as<uint8_t>()),
                             "test");
      bool launched = false;
      MTRT_CUDA_CHECK_LAUNCH(launched = cuda::castToFp8Transposed(
                                 stream, rows, cols, in,
                                 fusedCodes.as<uint8_t>(), fusedT.as<uint8_t>(),
                                 format, s.as<float>(), amaxes + 1),
                             "test");
      ASSERT_TRUE(launched) << rows << " x " << cols;
      std::string what = std::to_string(rows) + " x " + std::to_string(cols) +
                         (bf16 ? " bf16" : " fp32");
      expectSame(download(plainCodes.data(), size_t(n), amaxes),
                 download(fusedCodes.data(), size_t(n), amaxes + 1),
                 what + ", codes");
      expectSame(download(plainT.data(), size_t(n), amaxes),
                 download(fusedT.data(), size_t(n), amaxes + 1),
                 what + ", transposed codes");
    }
  }
  cuda::DeviceBuffer buffer(4096, "odd shape"), s = scalars();
  EXPECT_FALSE(cuda::castToFp8Transposed(
      stream, 24, 20, buffer.as<float>(), buffer.as<uint8_t>() + 2048,
      buffer.as<uint8_t>() + 3072, format, s.as<float>(), s.as<float>() + 16));
}

// SwiGLU's backward with both gradients cast (swigluBackwardToFp8: the
// executor's swiglu_grad fused with the gradients' fp8_quantizes) against
// swigluBackward then castToFp8Transposed (dgate) and castToFp8 (dup,
// whose transpose the fused kernel is asked not to write): codes,
// transposed codes and amaxes bit for bit; the gradients held in bf16 and
// in fp32, the inputs in bf16 and in fp32, whole and partial 64 x 64
// tiles; a shape that is not a multiple of 16 is declined.
TEST_P(CudaFp8FusedCastTest, SwigluGradToFp8IsSwigluGradThenTheCasts) {
  Format format = GetParam();
  cudaStream_t stream = context->stream();
  for (auto [rows, cols] :
       {std::pair<int64_t, int64_t>{512, 384}, {80, 208}, {16, 16}}) {
    for (bool bf16 : {true, false}) {
      const int64_t n = rows * cols;
      std::vector<float> gate = randomValues(size_t(n), 2.0f, 7),
                         up = randomValues(size_t(n), 1.0f, 8),
                         dy = randomValues(size_t(n), 0.5f, 9);
      cuda::DeviceBuffer g = upload(gate, bf16), u = upload(up, bf16),
                         d = upload(dy, bf16), dgate(size_t(n) * 4, "dgate"),
                         dup(size_t(n) * 4, "dup"), s = scalars();
      std::vector<cuda::DeviceBuffer> codes;
      for (int i = 0; i < 6; ++i)
        codes.emplace_back(size_t(n), "codes");
      auto in = [&](cuda::DeviceBuffer &b) -> cuda::InElements {
        if (bf16)
          return b.as<__nv_bfloat16>();
        return b.as<float>();
      };
      auto out = [&](cuda::DeviceBuffer &b) -> cuda::OutElements {
        if (bf16)
          return b.as<__nv_bfloat16>();
        return b.as<float>();
      };
      float *amaxes = s.as<float>() + 16;
      MTRT_CUDA_CHECK(cudaMemsetAsync(amaxes, 0, 16, stream), "test");
      MTRT_CUDA_CHECK_LAUNCH(cuda::swigluBackward(stream, n, in(g), in(u),
                                                  in(d), out(dgate), out(dup)),
                             "test");
      bool launched = false;
      MTRT_CUDA_CHECK_LAUNCH(launched = cuda::castToFp8Transposed(
                                 stream, rows, cols, in(dgate),
                                 codes[0].as<uint8_t>(), codes[1].as<uint8_t>(),
                                 format, s.as<float>(), amaxes),
                             "test");
      ASSERT_TRUE(launched);
      MTRT_CUDA_CHECK_LAUNCH(cuda::castToFp8(stream, n, in(dup),
                                             codes[2].as<uint8_t>(), format,
                                             s.as<float>(), amaxes + 1),
                             "test");
      cuda::SwigluGradFp8 fusedGate, fusedUp;
      fusedGate.codes = codes[3].as<uint8_t>();
      fusedGate.transposed = codes[4].as<uint8_t>();
      fusedUp.codes = codes[5].as<uint8_t>();
      for (auto [sink, amax] : {std::pair{&fusedGate, amaxes + 2},
                                std::pair{&fusedUp, amaxes + 3}}) {
        sink->scale = s.as<float>();
        sink->amax = amax;
        sink->format = format;
        sink->roundToBf16 = bf16;
      }
      MTRT_CUDA_CHECK_LAUNCH(
          launched = cuda::swigluBackwardToFp8(stream, rows, cols, in(g), in(u),
                                               in(d), fusedGate, fusedUp),
          "test");
      ASSERT_TRUE(launched) << rows << " x " << cols;
      std::string what = std::to_string(rows) + " x " + std::to_string(cols) +
                         (bf16 ? " bf16" : " fp32");
      expectSame(download(codes[0].data(), size_t(n), amaxes),
                 download(codes[3].data(), size_t(n), amaxes + 2),
                 what + ", dgate's codes");
      expectSame(download(codes[1].data(), size_t(n), amaxes),
                 download(codes[4].data(), size_t(n), amaxes + 2),
                 what + ", dgate's transposed codes");
      expectSame(download(codes[2].data(), size_t(n), amaxes + 1),
                 download(codes[5].data(), size_t(n), amaxes + 3),
                 what + ", dup's codes");
    }
  }
  cuda::DeviceBuffer buffer(4096, "odd shape"), s = scalars();
  cuda::SwigluGradFp8 sink;
  sink.codes = buffer.as<uint8_t>() + 2048;
  sink.scale = s.as<float>();
  sink.amax = s.as<float>() + 16;
  EXPECT_FALSE(cuda::swigluBackwardToFp8(stream, 24, 20, buffer.as<float>(),
                                         buffer.as<float>(), buffer.as<float>(),
                                         sink, sink));
}

INSTANTIATE_TEST_SUITE_P(Formats, CudaFp8FusedCastTest,
                         ::testing::Values(Format::E4M3, Format::E5M2),
                         [](const auto &info) {
                           return info.param == Format::E4M3 ? "e4m3" : "e5m2";
                         });

class CudaFp8UpdateTest : public CudaTest {};

// 300 metas (launches of 128, 128 and 44) with histories of 4, algorithm
// max, margin 1, alternating formats; amaxes including 0 and infinity (the
// scale kept) against fp8::pushAmax, historyAmax and scaleFromAmax on the
// host.
TEST_F(CudaFp8UpdateTest, BatchedUpdatesAreTheHostsArithmetic) {
  cudaStream_t stream = context->stream();
  const int metas = 300, length = 4, margin = 1;
  std::mt19937 random(11);
  std::uniform_real_distribution<float> uniform(0.0f, 30.0f);
  std::vector<float> amax(metas), scale(metas), history(size_t(metas) * length);
  for (int i = 0; i < metas; ++i) {
    amax[size_t(i)] = i % 17 == 0   ? 0.0f
                      : i % 19 == 0 ? std::numeric_limits<float>::infinity()
                                    : uniform(random);
    scale[size_t(i)] = 1.0f + float(i);
    for (int h = 0; h < length; ++h)
      history[size_t(i * length + h)] = uniform(random);
  }
  cuda::DeviceBuffer dAmax(amax.size() * 4, "amaxes"),
      dScale(scale.size() * 4, "scales"), dHistory(history.size() * 4, "h");
  MTRT_CUDA_CHECK(cudaMemcpyAsync(dAmax.data(), amax.data(), amax.size() * 4,
                                  cudaMemcpyHostToDevice, stream),
                  "test");
  MTRT_CUDA_CHECK(cudaMemcpyAsync(dScale.data(), scale.data(), scale.size() * 4,
                                  cudaMemcpyHostToDevice, stream),
                  "test");
  MTRT_CUDA_CHECK(cudaMemcpyAsync(dHistory.data(), history.data(),
                                  history.size() * 4, cudaMemcpyHostToDevice,
                                  stream),
                  "test");
  cuda::Fp8UpdateBatch batch;
  auto launch = [&] {
    MTRT_CUDA_CHECK_LAUNCH(cuda::fp8UpdateMetas(stream, batch, length,
                                                fp8::AmaxAlgorithm::Max,
                                                margin),
                           "test");
    batch.count = 0;
  };
  for (int i = 0; i < metas; ++i) {
    batch.amax[batch.count] = dAmax.as<float>() + i;
    batch.scale[batch.count] = dScale.as<float>() + i;
    batch.history[batch.count] = dHistory.as<float>() + i * length;
    batch.format[batch.count] = i % 2 ? Format::E5M2 : Format::E4M3;
    if (++batch.count == cuda::kFp8UpdateBatch)
      launch();
  }
  launch();
  std::vector<float> deviceScale(scale.size()), deviceHistory(history.size());
  MTRT_CUDA_CHECK(cudaMemcpyAsync(deviceScale.data(), dScale.data(),
                                  scale.size() * 4, cudaMemcpyDeviceToHost,
                                  stream),
                  "test");
  MTRT_CUDA_CHECK(cudaMemcpyAsync(deviceHistory.data(), dHistory.data(),
                                  history.size() * 4, cudaMemcpyDeviceToHost,
                                  stream),
                  "test");
  context->synchronize("test");
  size_t differing = 0;
  for (int i = 0; i < metas; ++i) {
    float *h = history.data() + i * length;
    fp8::pushAmax(h, length, amax[size_t(i)]);
    float expected = fp8::scaleFromAmax(
        fp8::historyAmax(h, length, fp8::AmaxAlgorithm::Max), scale[size_t(i)],
        i % 2 ? Format::E5M2 : Format::E4M3, margin);
    differing += std::memcmp(&expected, &deviceScale[size_t(i)], 4) != 0;
  }
  EXPECT_EQ(differing, 0u) << "scales";
  EXPECT_EQ(
      std::memcmp(history.data(), deviceHistory.data(), history.size() * 4), 0)
      << "histories";
  // The GEMMs' table of inverse scales from the updated scales.
  cuda::DeviceBuffer table(metas * cuda::kFp8InverseTableStride * 4, "table");
  MTRT_CUDA_CHECK_LAUNCH(cuda::fp8InverseTable(stream, metas,
                                               dScale.as<float>(),
                                               table.as<float>()),
                         "test");
  std::vector<float> inverses(size_t(metas) * cuda::kFp8InverseTableStride);
  MTRT_CUDA_CHECK(cudaMemcpyAsync(inverses.data(), table.data(),
                                  inverses.size() * 4, cudaMemcpyDeviceToHost,
                                  stream),
                  "test");
  context->synchronize("test");
  size_t wrongInverses = 0;
  for (int i = 0; i < metas; ++i) {
    float expected = 1.0f / deviceScale[size_t(i)];
    wrongInverses +=
        std::memcmp(&expected, &inverses[cuda::kFp8InverseTableStride * i],
                    4) != 0;
  }
  EXPECT_EQ(wrongInverses, 0u) << "inverse scales";
}

} // namespace
