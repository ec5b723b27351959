// core/Fp8.h against a brute-force reference: every finite code's value in
// double, the nearest to each input (ties to the even code), saturated at
// the largest finite value. CudaFp8Test checks the same functions against
// the GPU's conversions.
#include "Fp8TestInputs.h"
#include "core/Fp8.h"

#include "gtest/gtest.h"

#include <cmath>
#include <cstdint>
#include <limits>
#include <vector>

using namespace mtrt;

namespace {

using fp8::Format;

/// The reference encoder: the nearest finite code by value (ties: the even
/// code), infinities the largest finite, NaN 0x7F.
uint8_t referenceEncode(float x, Format format) {
  if (std::isnan(x))
    return 0x7F;
  uint8_t sign = std::signbit(x) ? 0x80 : 0x00;
  double magnitude = std::fabs(static_cast<double>(x));
  if (magnitude > fp8::maxFinite(format)) // saturated (infinities too)
    return sign | fp8::layoutOf(format).maxFinite;
  uint8_t best = 0;
  double bestDistance = std::numeric_limits<double>::infinity();
  for (int code = 0; code <= fp8::layoutOf(format).maxFinite; ++code) {
    double value = fp8::decode(static_cast<uint8_t>(code), format);
    double distance = std::fabs(value - magnitude);
    if (distance < bestDistance ||
        (distance == bestDistance && code % 2 == 0)) {
      best = static_cast<uint8_t>(code);
      bestDistance = distance;
    }
  }
  return sign | best;
}

std::vector<float> inputs(Format format) {
  return test::fp8TestInputs(format, 20000);
}

class Fp8Test : public ::testing::TestWithParam<Format> {};

TEST_P(Fp8Test, EncodeIsTheNearestCodeTiesToEvenSaturated) {
  Format format = GetParam();
  size_t checked = 0;
  for (float x : inputs(format)) {
    uint8_t expected = referenceEncode(x, format);
    ASSERT_EQ(fp8::encode(x, format), expected)
        << "x = " << x << " (" << std::hexfloat << x << std::defaultfloat
        << ")";
    ++checked;
  }
  EXPECT_GT(checked, 20000u);
}

TEST_P(Fp8Test, EveryFiniteCodeRoundTrips) {
  Format format = GetParam();
  for (int code = 0; code < 256; ++code) {
    float value = fp8::decode(static_cast<uint8_t>(code), format);
    if (std::isnan(value)) {
      EXPECT_EQ(fp8::encode(value, format), 0x7F);
      continue;
    }
    if (std::isinf(value)) { // E5M2's infinities saturate
      EXPECT_EQ(fp8::encode(value, format),
                (code & 0x80) | fp8::layoutOf(format).maxFinite);
      continue;
    }
    EXPECT_EQ(fp8::encode(value, format), code) << "code " << code;
  }
}

TEST(Fp8FormatTest, KnownValues) {
  EXPECT_EQ(fp8::maxFinite(Format::E4M3), 448.0f);
  EXPECT_EQ(fp8::maxFinite(Format::E5M2), 57344.0f);
  EXPECT_EQ(fp8::decode(0x01, Format::E4M3), std::exp2(-9.0f));
  EXPECT_EQ(fp8::decode(0x01, Format::E5M2), std::exp2(-16.0f));
  EXPECT_EQ(fp8::decode(0x08, Format::E4M3), std::exp2(-6.0f));
  EXPECT_EQ(fp8::decode(0x38, Format::E4M3), 1.0f);
  EXPECT_EQ(fp8::decode(0x3C, Format::E5M2), 1.0f);
  EXPECT_TRUE(std::isnan(fp8::decode(0x7F, Format::E4M3)));
  EXPECT_TRUE(std::isnan(fp8::decode(0xFF, Format::E4M3)));
  EXPECT_EQ(fp8::decode(0x7C, Format::E5M2),
            std::numeric_limits<float>::infinity());
  EXPECT_EQ(fp8::decode(0xFC, Format::E5M2),
            -std::numeric_limits<float>::infinity());
  EXPECT_TRUE(std::isnan(fp8::decode(0x7D, Format::E5M2)));
  // Ties: 1 + 1/16 lies between 1 (0x38) and 1.125 (0x39): to 0x38;
  // 1 + 3/16 between 1.125 and 1.25 (0x3A): to 0x3A.
  EXPECT_EQ(fp8::encode(1.0625f, Format::E4M3), 0x38);
  EXPECT_EQ(fp8::encode(1.1875f, Format::E4M3), 0x3A);
  // Saturation and the signs of zeros.
  EXPECT_EQ(fp8::encode(1e9f, Format::E4M3), 0x7E);
  EXPECT_EQ(fp8::encode(-1e9f, Format::E5M2), 0xFB);
  EXPECT_EQ(fp8::encode(-1e-9f, Format::E4M3), 0x80);
}

TEST(Fp8ScalingTest, ScaleFromAmaxIsTransformerEnginesDelayedScaling) {
  EXPECT_EQ(fp8::scaleFromAmax(2.0f, 7.0f, Format::E4M3, 0), 224.0f);
  EXPECT_EQ(fp8::scaleFromAmax(2.0f, 7.0f, Format::E4M3, 1), 112.0f);
  EXPECT_EQ(fp8::scaleFromAmax(2.0f, 7.0f, Format::E5M2, 0), 28672.0f);
  EXPECT_EQ(fp8::scaleFromAmax(3.0f, 7.0f, Format::E4M3, 0), 448.0f / 3.0f);
  // No information: the previous scale stays.
  EXPECT_EQ(fp8::scaleFromAmax(0.0f, 7.0f, Format::E4M3, 0), 7.0f);
  EXPECT_EQ(fp8::scaleFromAmax(std::numeric_limits<float>::infinity(), 7.0f,
                               Format::E4M3, 0),
            7.0f);
  EXPECT_EQ(fp8::scaleFromAmax(std::nanf(""), 7.0f, Format::E4M3, 0), 7.0f);
  // A subnormal amax: the quotient overflows to the largest float.
  EXPECT_EQ(fp8::scaleFromAmax(std::numeric_limits<float>::denorm_min(), 7.0f,
                               Format::E4M3, 0),
            std::numeric_limits<float>::max());
}

TEST(Fp8ScalingTest, HistoryKeepsTheNewestFirst) {
  float history[3] = {0, 0, 0};
  for (float amax : {1.0f, 5.0f, 2.0f, 3.0f})
    fp8::pushAmax(history, 3, amax);
  EXPECT_EQ(history[0], 3.0f);
  EXPECT_EQ(history[1], 2.0f);
  EXPECT_EQ(history[2], 5.0f); // 1 dropped out
  EXPECT_EQ(fp8::historyAmax(history, 3, fp8::AmaxAlgorithm::MostRecent),
            3.0f);
  EXPECT_EQ(fp8::historyAmax(history, 3, fp8::AmaxAlgorithm::Max), 5.0f);
  history[2] = std::nanf("");
  EXPECT_TRUE(std::isnan(fp8::historyAmax(history, 3, fp8::AmaxAlgorithm::Max)));
  float one[1] = {4.0f};
  fp8::pushAmax(one, 1, 6.0f);
  EXPECT_EQ(one[0], 6.0f);
}

INSTANTIATE_TEST_SUITE_P(Formats, Fp8Test,
                         ::testing::Values(Format::E4M3, Format::E5M2),
                         [](const auto &info) {
                           return info.param == Format::E4M3 ? "E4M3"
                                                             : "E5M2";
                         });

} // namespace
