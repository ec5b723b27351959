// The host's FP8 emulation (core/Fp8.h) against the GPU's own conversions
// (cvt.rn.satfinite to E4M3 and E5M2, and back), bit for bit, on inputs of
// every class: each code's value, the exact ties between neighbouring codes
// and their float neighbours, values past the largest finite, zeros,
// infinities, NaN, float subnormals and random floats; and a scale applied
// before the rounding, as the FP8 casts of issue 26 apply theirs.
#include "CudaTestSupport.h"

#include "core/Fp8.h"
#include "cuda/CudaCheck.h"
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

std::vector<float> inputs(Format format) {
  std::vector<float> xs;
  int maxCode = fp8::layoutOf(format).maxFinite;
  for (int code = 0; code <= maxCode; ++code) {
    float value = fp8::decode(static_cast<uint8_t>(code), format);
    float next = code < maxCode
                     ? fp8::decode(static_cast<uint8_t>(code + 1), format)
                     : 2 * value;
    float middle = static_cast<float>((double(value) + double(next)) / 2);
    for (float x : {value, middle, std::nextafter(middle, 0.0f),
                    std::nextafter(middle, 1e30f)}) {
      xs.push_back(x);
      xs.push_back(-x);
    }
  }
  for (float x : {0.0f, std::numeric_limits<float>::infinity(),
                  std::numeric_limits<float>::max(),
                  std::numeric_limits<float>::denorm_min(),
                  std::numeric_limits<float>::min(), 1e-30f, 3e5f}) {
    xs.push_back(x);
    xs.push_back(-x);
  }
  xs.push_back(std::numeric_limits<float>::quiet_NaN());
  xs.push_back(-std::numeric_limits<float>::quiet_NaN());
  std::mt19937 random(26);
  std::uniform_real_distribution<float> exponent(-30, 20);
  for (int i = 0; i < (1 << 20); ++i)
    xs.push_back((i % 2 ? -1 : 1) * std::exp2(exponent(random)));
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

INSTANTIATE_TEST_SUITE_P(Formats, CudaFp8Test,
                         ::testing::Values(Format::E4M3, Format::E5M2),
                         [](const auto &info) {
                           return info.param == Format::E4M3 ? "E4M3"
                                                             : "E5M2";
                         });

} // namespace
