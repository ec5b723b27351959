// Tests of the next-token distribution with temperature and top-k, against
// softmax values computed here in float64 from the definition, and of the
// draw from it.
#include "train/TokenSampler.h"

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

} // namespace
