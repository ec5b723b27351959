// Tests of the next-token distribution with temperature and top-k, against
// softmax values computed here in float64 from the definition, and of the
// draw from it, and of what a Predictor is asked for.
#include "train/TokenSampler.h"

#include "core/Error.h"

#include "gtest/gtest.h"

#include <cmath>
#include <map>
#include <random>

using namespace mtrt::train;

namespace {

TEST(TokenSamplerTest, TopOneIsTheArgmaxWithTheLowestIdOnTies) {
  EXPECT_EQ(nextTokenProbabilities({0.5, 2.0, -1.0, 2.0}, 1.0, 1),
            (std::vector<double>{0, 1, 0, 0}));
  EXPECT_EQ(nextTokenProbabilities({0.5, 2.0, -1.0, 2.0}, 0.01, 1),
            (std::vector<double>{0, 1, 0, 0}));
}

TEST(TokenSamplerTest, TemperatureScalesTheLogitsOfTheTopK) {
  std::vector<double> logits = {1.0, 3.0, 2.0, -4.0};
  // Top 2 (ids 1 and 2) at temperature 0.5: softmax of (6, 4).
  std::vector<double> p = nextTokenProbabilities(logits, 0.5, 2);
  double e = std::exp(-2.0);
  EXPECT_NEAR(p[1], 1 / (1 + e), 1e-15);
  EXPECT_NEAR(p[2], e / (1 + e), 1e-15);
  EXPECT_EQ(p[0], 0);
  EXPECT_EQ(p[3], 0);
  // Top-k 0 and top-k beyond the size are the whole vocabulary.
  for (int64_t k : {0, 4, 10}) {
    p = nextTokenProbabilities(logits, 2.0, k);
    double z = 0;
    for (double l : logits)
      z += std::exp(l / 2.0);
    for (size_t i = 0; i < logits.size(); ++i)
      EXPECT_NEAR(p[i], std::exp(logits[i] / 2.0) / z, 1e-15) << k;
  }
}

TEST(TokenSamplerTest, DrawsFollowTheCumulativeProbabilities) {
  std::vector<double> p = {0, 0.25, 0, 0.75};
  EXPECT_EQ(drawToken(p, 0.0), 1);
  EXPECT_EQ(drawToken(p, 0.2499), 1);
  EXPECT_EQ(drawToken(p, 0.25), 3);
  EXPECT_EQ(drawToken(p, 0.9999999), 3);
  // Rounding that leaves the sum below u takes the last possible id.
  EXPECT_EQ(drawToken({0.3, 0.3, 0.3999999, 0}, 0.99999999), 2);
  // Frequencies over many uniform draws: within 5 standard deviations.
  std::mt19937_64 random(7);
  std::map<int64_t, int> counts;
  const int n = 100000;
  for (int i = 0; i < n; ++i)
    ++counts[drawToken(p, static_cast<double>(random() >> 11) * 0x1.0p-53)];
  EXPECT_EQ(counts.size(), 2u);
  EXPECT_NEAR(counts[3] / double(n), 0.75,
              5 * std::sqrt(0.75 * 0.25 / n));
}

TEST(TokenSamplerTest, ThePredictorIsAskedForTheLastRealPosition) {
  // Greedy on logits that put everything on the last token plus one: the
  // sample counts up, and each run is asked for the last real position of
  // its window (the prompt's end, then the window's last).
  Predictor predictor;
  predictor.tokenShape = {2, 4};
  predictor.tokenType = mtrt::DType::I32;
  predictor.vocab = 8;
  std::vector<int64_t> positions;
  predictor.run = [&](const mtrt::host::TensorView &tokens,
                      int64_t position) -> std::optional<std::vector<double>> {
    positions.push_back(position);
    std::vector<double> row(8, 0.0);
    int32_t last = static_cast<const int32_t *>(tokens.data)[position];
    row[(last + 1) % 8] = 1;
    return row;
  };
  TokenSampler sampler(predictor, 8, {1.0, 1, 1});
  EXPECT_EQ(sampler.generate({3}, 5), (std::vector<int32_t>{3, 4, 5, 6, 7, 0}));
  EXPECT_EQ(positions, (std::vector<int64_t>{0, 1, 2, 3, 3}));
}

TEST(TokenSamplerTest, LogitsOfEachTypeAsDoubles) {
  float f32[] = {1.5f, -2.25f};
  double f64[] = {0.1, -3.0};
  uint16_t bf16[] = {0x3f80, 0xc010}; // 1.0, -2.25
  EXPECT_EQ(logitsAsDoubles(mtrt::DType::F32, f32, 2),
            (std::vector<double>{1.5, -2.25}));
  EXPECT_EQ(logitsAsDoubles(mtrt::DType::F64, f64, 2),
            (std::vector<double>{0.1, -3.0}));
  EXPECT_EQ(logitsAsDoubles(mtrt::DType::BF16, bf16, 2),
            (std::vector<double>{1.0, -2.25}));
  int32_t ids[] = {1, 2};
  EXPECT_THROW(logitsAsDoubles(mtrt::DType::I32, ids, 2), mtrt::Error);
}

} // namespace
