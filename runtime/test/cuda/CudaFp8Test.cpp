// The host's FP8 emulation (core/Fp8.h) against the GPU's own conversions
// (cvt.rn.satfinite to E4M3 and E5M2, and back), bit for bit, on inputs of
// every class: each code's value, the exact ties between neighbouring codes
// and their float neighbours, values past the largest finite, zeros,
// infinities, NaN, float subnormals and random floats; and a scale applied
// before the rounding, as the FP8 casts of issue 26 apply theirs. And
// cuBLASLt's FP8 products (cuda::Fp8Gemm) against the host's sums of the
// codes' values.
#include "CudaTestSupport.h"
#include "Fp8TestInputs.h"

#include "core/Fp8.h"
#include "cuda/CudaCheck.h"
#include "cuda/Fp8Gemm.h"
#include "cuda/kernels/Fp8Scaling.h"
#include "cuda/kernels/Kernels.h"

#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <vector>

using namespace mtrt;
using namespace mtrt::test;

namespace {

using fp8::Format;

/// Fp8TestInputs.h's, with a NaN of each sign and 2^20 random values.
std::vector<float> inputs(Format format) {
  std::vector<float> xs = fp8TestInputs(format, 1 << 20);
  xs.push_back(-std::numeric_limits<float>::quiet_NaN());
  return xs;
}

class CudaFp8Test : public CudaTest,
                    public ::testing::WithParamInterface<Format> {
protected:
  /// The device's codes of xs * scale (scale 1: no scale pointer).
  std::vector<uint8_t> castOnDevice(const std::vector<float> &xs,
                                    float scale) {
    cudaStream_t stream = context->stream();
    cuda::DeviceBuffer in(xs.size() * sizeof(float), "test inputs"),
        out(xs.size(), "test codes"), factor(sizeof(float), "test scale");
    MTRT_CUDA_CHECK(cudaMemcpyAsync(in.data(), xs.data(),
                                    xs.size() * sizeof(float),
                                    cudaMemcpyHostToDevice, stream),
                    "test");
    MTRT_CUDA_CHECK(cudaMemcpyAsync(factor.data(), &scale, sizeof(float),
                                    cudaMemcpyHostToDevice, stream),
                    "test");
    MTRT_CUDA_CHECK_LAUNCH(
        cuda::castToFp8(stream, int64_t(xs.size()), in.as<float>(),
                        static_cast<uint8_t *>(out.data()), GetParam(),
                        scale == 1.0f ? nullptr : factor.as<float>()),
        "test");
    std::vector<uint8_t> codes(xs.size());
    MTRT_CUDA_CHECK(cudaMemcpyAsync(codes.data(), out.data(), codes.size(),
                                    cudaMemcpyDeviceToHost, stream),
                    "test");
    context->synchronize("test");
    return codes;
  }
};

TEST_P(CudaFp8Test, EncodeIsTheDevicesConversion) {
  Format format = GetParam();
  std::vector<float> xs = inputs(format);
  for (float scale : {1.0f, 0.75f, 1024.0f}) {
    std::vector<uint8_t> device = castOnDevice(xs, scale);
    size_t differing = 0, first = xs.size();
    for (size_t i = 0; i < xs.size(); ++i)
      if (fp8::encode(xs[i] * scale, format) != device[i]) {
        first = differing++ ? first : i;
      }
    EXPECT_EQ(differing, 0u)
        << "scale " << scale << ": first at x = " << std::hexfloat
        << (first < xs.size() ? xs[first] : 0.0f) << std::defaultfloat
        << ": host " << int(first < xs.size() ? fp8::encode(xs[first] * scale, format) : 0)
        << ", device " << int(first < xs.size() ? device[first] : 0);
    std::cout << "[ fp8      ] " << (format == Format::E4M3 ? "E4M3" : "E5M2")
              << " scale " << scale << ": " << xs.size()
              << " conversions, " << differing << " differ from the host's\n";
  }
}

TEST_P(CudaFp8Test, CastRecordsTheAmax) {
  Format format = GetParam();
  std::vector<float> xs;
  for (float x : inputs(format))
    if (std::isfinite(x))
      xs.push_back(x);
  float expected = 0;
  for (float x : xs)
    expected = std::max(expected, std::fabs(x));
  cudaStream_t stream = context->stream();
  cuda::DeviceBuffer in(xs.size() * sizeof(float), "test inputs"),
      out(xs.size(), "test codes"), amax(sizeof(float), "test amax");
  MTRT_CUDA_CHECK(cudaMemcpyAsync(in.data(), xs.data(),
                                  xs.size() * sizeof(float),
                                  cudaMemcpyHostToDevice, stream),
                  "test");
  MTRT_CUDA_CHECK(cudaMemsetAsync(amax.data(), 0, sizeof(float), stream),
                  "test");
  MTRT_CUDA_CHECK_LAUNCH(
      cuda::castToFp8(stream, int64_t(xs.size()), in.as<float>(),
                      static_cast<uint8_t *>(out.data()), format, nullptr,
                      amax.as<float>()),
      "test");
  float found = 0;
  MTRT_CUDA_CHECK(cudaMemcpyAsync(&found, amax.data(), sizeof(float),
                                  cudaMemcpyDeviceToHost, stream),
                  "test");
  context->synchronize("test");
  EXPECT_EQ(found, expected);
  // A NaN among the values makes the amax NaN.
  float nan = std::nanf("");
  MTRT_CUDA_CHECK(cudaMemcpyAsync(in.data(), &nan, sizeof(float),
                                  cudaMemcpyHostToDevice, stream),
                  "test");
  MTRT_CUDA_CHECK_LAUNCH(
      cuda::castToFp8(stream, int64_t(xs.size()), in.as<float>(),
                      static_cast<uint8_t *>(out.data()), format, nullptr,
                      amax.as<float>()),
      "test");
  MTRT_CUDA_CHECK(cudaMemcpyAsync(&found, amax.data(), sizeof(float),
                                  cudaMemcpyDeviceToHost, stream),
                  "test");
  context->synchronize("test");
  EXPECT_TRUE(std::isnan(found));
}

TEST_P(CudaFp8Test, DecodeIsTheDevicesConversion) {
  Format format = GetParam();
  std::vector<uint8_t> codes(256);
  for (int c = 0; c < 256; ++c)
    codes[size_t(c)] = static_cast<uint8_t>(c);
  cudaStream_t stream = context->stream();
  cuda::DeviceBuffer in(256, "test codes"),
      out(256 * sizeof(float), "test values");
  MTRT_CUDA_CHECK(cudaMemcpyAsync(in.data(), codes.data(), 256,
                                  cudaMemcpyHostToDevice, stream),
                  "test");
  MTRT_CUDA_CHECK_LAUNCH(cuda::widenFp8(stream, 256,
                                        static_cast<uint8_t *>(in.data()),
                                        out.as<float>(), format),
                         "test");
  std::vector<float> values(256);
  MTRT_CUDA_CHECK(cudaMemcpyAsync(values.data(), out.data(),
                                  256 * sizeof(float), cudaMemcpyDeviceToHost,
                                  stream),
                  "test");
  context->synchronize("test");
  for (int c = 0; c < 256; ++c) {
    float host = fp8::decode(static_cast<uint8_t>(c), format);
    if (std::isnan(host)) {
      EXPECT_TRUE(std::isnan(values[size_t(c)])) << "code " << c;
      continue;
    }
    uint32_t a, b;
    std::memcpy(&a, &host, 4);
    std::memcpy(&b, &values[size_t(c)], 4);
    EXPECT_EQ(a, b) << "code " << c << ": host " << host << ", device "
                    << values[size_t(c)];
  }
}

// The casts from bf16 and from fp32, eight elements a thread (a size that
// is a multiple of 8, aligned) and one at a time (the same values 4 bytes
// further on), against the host's encode of each value, with the amax.
TEST_P(CudaFp8Test, VectorAndElementwiseCastsAgreeWithTheHost) {
  Format format = GetParam();
  std::mt19937 random(7);
  std::normal_distribution<float> normal(0.0f, 3.0f);
  const size_t n = 4096 + 8;
  std::vector<float> values(n + 1);
  std::vector<__nv_bfloat16> halves(n + 1);
  for (size_t i = 0; i < values.size(); ++i) {
    halves[i] = __float2bfloat16_rn(normal(random));
    values[i] = __bfloat162float(halves[i]);
  }
  const float scale = 3.0f;
  cudaStream_t stream = context->stream();
  cuda::DeviceBuffer f32(values.size() * 4, "fp32 inputs"),
      bf16(halves.size() * 2, "bf16 inputs"), codes(n + 16, "codes"),
      scalars(64, "scale and amax");
  MTRT_CUDA_CHECK(cudaMemcpyAsync(f32.data(), values.data(), values.size() * 4,
                                  cudaMemcpyHostToDevice, stream),
                  "test");
  MTRT_CUDA_CHECK(cudaMemcpyAsync(bf16.data(), halves.data(), halves.size() * 2,
                                  cudaMemcpyHostToDevice, stream),
                  "test");
  MTRT_CUDA_CHECK(cudaMemcpyAsync(scalars.data(), &scale, 4,
                                  cudaMemcpyHostToDevice, stream),
                  "test");
  struct Case {
    const char *name;
    cuda::InElements in;
    size_t first; // index of the first value cast
  };
  const Case cases[] = {
      {"fp32, 8 a thread", f32.as<float>(), 0},
      {"fp32, one a thread", f32.as<float>() + 1, 1},
      {"bf16, 8 a thread", bf16.as<__nv_bfloat16>(), 0},
      {"bf16, one a thread", bf16.as<__nv_bfloat16>() + 1, 1}};
  for (const Case &c : cases) {
    float *amax = scalars.as<float>() + 4;
    MTRT_CUDA_CHECK(cudaMemsetAsync(amax, 0, 4, stream), "test");
    MTRT_CUDA_CHECK_LAUNCH(cuda::castToFp8(stream, int64_t(n), c.in,
                                           static_cast<uint8_t *>(codes.data()),
                                           format, scalars.as<float>(), amax),
                           "test");
    std::vector<uint8_t> device(n);
    float deviceAmax = 0;
    MTRT_CUDA_CHECK(cudaMemcpyAsync(device.data(), codes.data(), n,
                                    cudaMemcpyDeviceToHost, stream),
                    "test");
    MTRT_CUDA_CHECK(
        cudaMemcpyAsync(&deviceAmax, amax, 4, cudaMemcpyDeviceToHost, stream),
        "test");
    context->synchronize("test");
    size_t differing = 0;
    float hostAmax = 0;
    for (size_t i = 0; i < n; ++i) {
      float v = values[c.first + i];
      hostAmax = std::max(hostAmax, std::fabs(v));
      differing += fp8::encode(v * scale, format) != device[i];
    }
    EXPECT_EQ(differing, 0u) << c.name;
    EXPECT_EQ(deviceAmax, hostAmax) << c.name;
  }
}

// transposeBytes against the host's transpose: shapes that take the
// 16-bytes-a-thread tiles (multiples of 16, partial tiles at the edges) and
// one that takes the byte tiles.
class CudaFp8TransposeTest : public CudaTest {};

TEST_F(CudaFp8TransposeTest, MatchesTheHostsTranspose) {
  cudaStream_t stream = context->stream();
  for (auto [rows, cols] : {std::pair<int64_t, int64_t>{1024, 128},
                            {80, 208},
                            {16, 16},
                            {33, 70}}) {
    std::vector<uint8_t> x(size_t(rows * cols));
    for (size_t i = 0; i < x.size(); ++i)
      x[i] = static_cast<uint8_t>((i * 2654435761u) >> 13);
    cuda::DeviceBuffer in(x.size(), "bytes"), out(x.size(), "transposed");
    MTRT_CUDA_CHECK(cudaMemcpyAsync(in.data(), x.data(), x.size(),
                                    cudaMemcpyHostToDevice, stream),
                    "test");
    MTRT_CUDA_CHECK_LAUNCH(
        cuda::transposeBytes(stream, rows, cols,
                             static_cast<uint8_t *>(in.data()),
                             static_cast<uint8_t *>(out.data())),
        "test");
    std::vector<uint8_t> y(x.size());
    MTRT_CUDA_CHECK(cudaMemcpyAsync(y.data(), out.data(), y.size(),
                                    cudaMemcpyDeviceToHost, stream),
                    "test");
    context->synchronize("test");
    size_t differing = 0;
    for (int64_t r = 0; r < rows; ++r)
      for (int64_t c = 0; c < cols; ++c)
        differing += y[size_t(c * rows + r)] != x[size_t(r * cols + c)];
    EXPECT_EQ(differing, 0u) << rows << " x " << cols;
  }
}

/// y = x w^T (+ bias) through Fp8Gemm, x [m, k] and w [n, k] cast with
/// per-tensor scales 448 / amax (E4M3) or 57344 / amax (E5M2), against the
/// host's double sums of the same codes' values times the inverse scales
/// (plus the bf16 bias): within bf16's rounding of the result.
class CudaFp8GemmTest : public CudaTest {
protected:
  double product(int64_t m, int64_t n, int64_t k, Format xFormat,
                 Format wFormat, bool withBias = false, bool fast = false) {
    std::mt19937 random(unsigned(m + n + k));
    std::normal_distribution<float> normal;
    std::vector<float> x(size_t(m * k)), w(size_t(n * k));
    for (float &v : x)
      v = normal(random);
    for (float &v : w)
      v = 0.02f * normal(random);
    auto cast = [](const std::vector<float> &v, Format format, float &inverse) {
      float amax = 0;
      for (float e : v)
        amax = std::max(amax, std::fabs(e));
      float scale = fp8::maxFinite(format) / amax;
      inverse = 1.0f / scale;
      std::vector<uint8_t> codes(v.size());
      for (size_t i = 0; i < v.size(); ++i)
        codes[i] = fp8::encode(v[i] * scale, format);
      return codes;
    };
    float inverseX = 0, inverseW = 0;
    std::vector<uint8_t> qx = cast(x, xFormat, inverseX),
                         qw = cast(w, wFormat, inverseW);
    std::vector<__nv_bfloat16> bias(size_t(n), __float2bfloat16_rn(0.0f));
    if (withBias)
      for (auto &b : bias)
        b = __float2bfloat16_rn(normal(random));
    std::vector<double> expected(size_t(m * n));
    double largest = 0;
    for (int64_t i = 0; i < m; ++i)
      for (int64_t j = 0; j < n; ++j) {
        double sum = 0;
        for (int64_t e = 0; e < k; ++e)
          sum += double(fp8::decode(qx[size_t(i * k + e)], xFormat)) *
                 double(fp8::decode(qw[size_t(j * k + e)], wFormat));
        double y = sum * inverseX * inverseW +
                   double(__bfloat162float(bias[size_t(j)]));
        expected[size_t(i * n + j)] = y;
        largest = std::max(largest, std::fabs(y));
      }
    cudaStream_t stream = context->stream();
    cuda::DeviceBuffer dx(qx.size(), "x"), dw(qw.size(), "w"),
        dy(size_t(m * n) * 2, "y"), scales(32, "scales"),
        db(size_t(n) * 2, "bias");
    MTRT_CUDA_CHECK(cudaMemcpyAsync(db.data(), bias.data(), bias.size() * 2,
                                    cudaMemcpyHostToDevice, stream),
                    "test");
    // Each scale 16-byte aligned (Fp8Gemm refuses others).
    float hostScales[8] = {inverseX, 0, 0, 0, inverseW, 0, 0, 0};
    MTRT_CUDA_CHECK(cudaMemcpyAsync(dx.data(), qx.data(), qx.size(),
                                    cudaMemcpyHostToDevice, stream), "test");
    MTRT_CUDA_CHECK(cudaMemcpyAsync(dw.data(), qw.data(), qw.size(),
                                    cudaMemcpyHostToDevice, stream), "test");
    MTRT_CUDA_CHECK(cudaMemcpyAsync(scales.data(), hostScales,
                                    sizeof(hostScales),
                                    cudaMemcpyHostToDevice, stream), "test");
    cuda::Fp8Gemm gemm(stream);
    bool ran = gemm.run(m, n, k, static_cast<uint8_t *>(dx.data()), xFormat,
                        scales.as<float>(), static_cast<uint8_t *>(dw.data()),
                        wFormat, scales.as<float>() + 4, dy.data(),
                        /*yBf16=*/true,
                        withBias ? db.as<__nv_bfloat16>() : nullptr, fast);
    EXPECT_TRUE(ran) << "cuBLASLt has no bias epilogue for it";
    std::vector<__nv_bfloat16> y(size_t(m * n));
    MTRT_CUDA_CHECK(cudaMemcpyAsync(y.data(), dy.data(), y.size() * 2,
                                    cudaMemcpyDeviceToHost, stream), "test");
    context->synchronize("test");
    double worst = 0;
    for (size_t i = 0; i < y.size(); ++i)
      worst = std::max(worst, std::fabs(double(__bfloat162float(y[i])) -
                                        expected[i]));
    return worst / largest;
  }
};

TEST_F(CudaFp8GemmTest, MatchesTheHostsSumsOfTheCodes) {
  for (auto [xFormat, wFormat] : {std::pair{Format::E4M3, Format::E4M3},
                                  std::pair{Format::E5M2, Format::E4M3},
                                  std::pair{Format::E4M3, Format::E5M2}}) {
    double difference = product(128, 256, 512, xFormat, wFormat);
    EXPECT_LT(difference, 8e-3);
    std::cout << "[ fp8 gemm ] " << (xFormat == Format::E4M3 ? "E4M3" : "E5M2")
              << " x " << (wFormat == Format::E4M3 ? "E4M3" : "E5M2")
              << " [128 x 512] @ [256 x 512]^T: largest difference "
              << difference << " of the largest result\n";
  }
}

// The forward's product: fast accumulation and the bias in the epilogue.
TEST_F(CudaFp8GemmTest, BiasEpilogueAndFastAccumulation) {
  for (bool fast : {false, true}) {
    double difference =
        product(256, 384, 1024, Format::E4M3, Format::E4M3, true, fast);
    EXPECT_LT(difference, 8e-3);
    std::cout << "[ fp8 gemm ] E4M3 x E4M3 [256 x 1024] @ [384 x 1024]^T + "
                 "bias, fast accumulation "
              << (fast ? "on" : "off") << ": largest difference " << difference
              << " of the largest result\n";
  }
}

TEST_F(CudaFp8GemmTest, RefusesWhatCublasLtCannotTake) {
  cuda::DeviceBuffer buffer(1 << 16, "operands");
  cuda::Fp8Gemm gemm(context->stream());
  auto *codes = static_cast<uint8_t *>(buffer.data());
  auto *scale = buffer.as<float>();
  auto *y = buffer.as<__nv_bfloat16>();
  auto expectRefusal = [&](int64_t k, Format x, Format w, const char *text) {
    try {
      gemm.run(16, 16, k, codes, x, scale, codes, w, scale, y, true);
      ADD_FAILURE() << "no refusal for " << text;
    } catch (const Error &e) {
      EXPECT_EQ(e.code(), MTRT_STATUS_INVALID_ARGUMENT) << e.what();
      EXPECT_NE(std::string(e.what()).find(text), std::string::npos)
          << e.what();
    }
  };
  expectRefusal(32, Format::E5M2, Format::E5M2, "both operands are E5M2");
  expectRefusal(40, Format::E4M3, Format::E4M3, "k = 40 is not a multiple of 16");
  try {
    gemm.run(16, 16, 32, codes, Format::E4M3, scale, codes, Format::E4M3,
             scale + 1, y, true);
    ADD_FAILURE() << "no refusal for a scale 4 bytes past a boundary";
  } catch (const Error &e) {
    EXPECT_EQ(e.code(), MTRT_STATUS_INVALID_ARGUMENT) << e.what();
    EXPECT_NE(std::string(e.what()).find(
                  "w's scale is at an address 4 bytes past a 16-byte "
                  "boundary"),
              std::string::npos)
        << e.what();
  }
}

INSTANTIATE_TEST_SUITE_P(Formats, CudaFp8Test,
                         ::testing::Values(Format::E4M3, Format::E5M2),
                         [](const auto &info) {
                           return info.param == Format::E4M3 ? "E4M3"
                                                             : "E5M2";
                         });

} // namespace
