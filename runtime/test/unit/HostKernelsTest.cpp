// Forward values of the host kernels against naive double formulas written independently here.
#include "core/Random.h"
#include "host/ThreadPool.h"
#include "host/kernels/Kernels.h"

#include "gtest/gtest.h"

#include <cmath>
#include <random>
#include <vector>

using namespace mtrt::host;

namespace {

using Vec = std::vector<double>;

ThreadPool &pool() {
  static ThreadPool instance(2);
  return instance;
}

template <typename T = double>
std::vector<T> randomVec(size_t n, uint64_t seed, double lo = -1,
                         double hi = 1) {
  std::mt19937_64 engine(seed);
  std::uniform_real_distribution<double> dist(lo, hi);
  std::vector<T> v(n);
  for (T &x : v)
    x = static_cast<T>(dist(engine));
  return v;
}

void expectNear(const Vec &actual, const Vec &expected, double tolerance) {
  ASSERT_EQ(actual.size(), expected.size());
  for (size_t i = 0; i < actual.size(); ++i)
    ASSERT_NEAR(actual[i], expected[i],
                tolerance * std::max(1.0, std::fabs(expected[i])))
        << "at " << i;
}

TEST(HostKernels, SoftmaxMatchesDirectExpOverSum) {
  // [2, 5, 3] along the middle axis, and [6, 7] along the last.
  for (auto [outer, axis, inner] :
       {std::make_tuple(2, 5, 3), std::make_tuple(6, 7, 1)}) {
    Vec x = randomVec(outer * axis * inner, 1, -20, 20), y(x.size());
    softmaxForward<double>(pool(), outer, axis, inner, x.data(), y.data());
    Vec expected(x.size());
    for (int o = 0; o < outer; ++o)
      for (int in = 0; in < inner; ++in) {
        double sum = 0;
        for (int a = 0; a < axis; ++a)
          sum += std::exp(x[(o * axis + a) * inner + in]);
        for (int a = 0; a < axis; ++a)
          expected[(o * axis + a) * inner + in] =
              std::exp(x[(o * axis + a) * inner + in]) / sum;
      }
    expectNear(y, expected, 1e-14);
  }
}

TEST(HostKernels, NormsMatchTheirFormulas) {
  const int64_t rows = 6, hidden = 10;
  Vec x = randomVec(rows * hidden, 2, -3, 5), w = randomVec(hidden, 3),
      b = randomVec(hidden, 4);
  Vec y(x.size()), mean(rows), rstd(rows), yr(x.size()), rrstd(rows);
  layerNormForward<double>(pool(), rows, hidden, x.data(), w.data(), b.data(),
                           1e-5, y.data(), mean.data(), rstd.data());
  rmsNormForward<double>(pool(), rows, hidden, x.data(), w.data(), 1e-6,
                         yr.data(), rrstd.data());
  Vec expected(x.size()), expectedRms(x.size());
  for (int64_t r = 0; r < rows; ++r) {
    double mu = 0, var = 0, ms = 0;
    for (int64_t j = 0; j < hidden; ++j)
      mu += x[r * hidden + j] / hidden;
    for (int64_t j = 0; j < hidden; ++j) {
      double d = x[r * hidden + j] - mu;
      var += d * d / hidden; // biased, like PyTorch
      ms += x[r * hidden + j] * x[r * hidden + j] / hidden;
    }
    EXPECT_NEAR(mean[r], mu, 1e-14);
    EXPECT_NEAR(rstd[r], 1 / std::sqrt(var + 1e-5), 1e-12);
    for (int64_t j = 0; j < hidden; ++j) {
      double v = x[r * hidden + j];
      expected[r * hidden + j] = (v - mu) / std::sqrt(var + 1e-5) * w[j] + b[j];
      expectedRms[r * hidden + j] = v / std::sqrt(ms + 1e-6) * w[j];
    }
  }
  expectNear(y, expected, 1e-13);
  expectNear(yr, expectedRms, 1e-13);
}

/// y[b] = op(a[b]) @ op(c[b]) with explicit indexing.
Vec naiveMatmul(int64_t batch, int64_t m, int64_t n, int64_t k, const Vec &a,
                bool ta, const Vec &b, bool tb) {
  Vec y(batch * m * n, 0.0);
  for (int64_t s = 0; s < batch; ++s)
    for (int64_t i = 0; i < m; ++i)
      for (int64_t j = 0; j < n; ++j) {
        double sum = 0;
        for (int64_t p = 0; p < k; ++p) {
          double av = ta ? a[s * m * k + p * m + i] : a[s * m * k + i * k + p];
          double bv = tb ? b[s * k * n + j * k + p] : b[s * k * n + p * n + j];
          sum += av * bv;
        }
        y[s * m * n + i * n + j] = sum;
      }
  return y;
}

TEST(HostKernels, MatmulMatchesNaiveLoopsForEveryTranspose) {
  // Sizes that are not multiples of the GEMM's tiles.
  const int64_t batch = 3, m = 67, n = 37, k = 19;
  Vec a = randomVec(batch * m * k, 5), b = randomVec(batch * k * n, 6);
  for (bool ta : {false, true})
    for (bool tb : {false, true}) {
      Vec y(batch * m * n);
      matmulForward<double>(pool(), batch, m, n, k, a.data(), ta, b.data(), tb,
                            y.data());
      expectNear(y, naiveMatmul(batch, m, n, k, a, ta, b, tb), 1e-13);
    }
}

/// a[i, p0..p0+len) . b[p0..p0+len), j] in the canonical order: halves
/// while the range is even and longer than 32 terms, leaves in increasing p.
float canonicalDot(const std::vector<float> &a, const std::vector<float> &b,
                   int64_t k, int64_t n, int64_t i, int64_t j, int64_t p0,
                   int64_t len) {
  if (len > 32 && len % 2 == 0)
    return canonicalDot(a, b, k, n, i, j, p0, len / 2) +
           canonicalDot(a, b, k, n, i, j, p0 + len / 2, len / 2);
  float sum = 0;
  for (int64_t p = p0; p < p0 + len; ++p) {
    float product = a[i * k + p] * b[p * n + j];
    sum += product;
  }
  return sum;
}

TEST(HostKernels, GemmSumsInCanonicalOrderBitForBit) {
  // k = 300 splits twice (75-term leaves); 70 x 45 is not a whole tile.
  const int64_t m = 70, n = 45, k = 300;
  auto a = randomVec<float>(m * k, 7), b = randomVec<float>(k * n, 8);
  std::vector<float> c(m * n);
  gemm<float>(pool(), 1, m, n, k, a.data(), false, b.data(), false, c.data(),
              false);
  int64_t differsFromNaive = 0;
  for (int64_t i = 0; i < m; ++i)
    for (int64_t j = 0; j < n; ++j) {
      ASSERT_EQ(c[i * n + j], canonicalDot(a, b, k, n, i, j, 0, k))
          << i << ", " << j;
      float naive = 0;
      for (int64_t p = 0; p < k; ++p) {
        float product = a[i * k + p] * b[p * n + j];
        naive += product;
      }
      differsFromNaive += c[i * n + j] != naive;
    }
  EXPECT_GT(differsFromNaive, 0) << "the order must be visible in the bits";
}

// A product whose contraction is split over k ranks (a row-parallel layer)
// gives the one-rank bits once the rank partials are added as the
// all-reduce adds them: (p0 + p1) for two, (p0 + p1) + (p2 + p3) for four.
TEST(HostKernels, GemmSplitOverKShardsAddsUpToTheWholeProductBitForBit) {
  const int64_t m = 9, n = 40, k = 256;
  auto a = randomVec<float>(m * k, 17), b = randomVec<float>(k * n, 18);
  std::vector<float> whole(m * n);
  gemm<float>(pool(), 1, m, n, k, a.data(), false, b.data(), false,
              whole.data(), false);
  for (int64_t shards : {2, 4, 8}) {
    int64_t width = k / shards;
    std::vector<std::vector<float>> partial(shards, std::vector<float>(m * n));
    for (int64_t s = 0; s < shards; ++s) {
      // Shard s: columns [s * width, (s + 1) * width) of A, rows of B.
      std::vector<float> as(m * width);
      for (int64_t i = 0; i < m; ++i)
        for (int64_t p = 0; p < width; ++p)
          as[i * width + p] = a[i * k + s * width + p];
      gemm<float>(pool(), 1, m, n, width, as.data(), false,
                  b.data() + s * width * n, false, partial[s].data(), false);
    }
    for (int64_t e = 0; e < m * n; ++e) {
      std::vector<float> level(shards);
      for (int64_t s = 0; s < shards; ++s)
        level[s] = partial[s][e];
      for (int64_t size = shards; size > 1; size /= 2)
        for (int64_t s = 0; s < size / 2; ++s)
          level[s] = level[2 * s] + level[2 * s + 1];
      ASSERT_EQ(level[0], whole[e]) << shards << " shards, element " << e;
    }
  }
}

TEST(HostKernels, LinearMatchesNaiveLoopsInBothLayouts) {
  const int64_t rows = 13, in = 21, out = 18;
  Vec x = randomVec(rows * in, 9), w = randomVec(in * out, 10),
      bias = randomVec(out, 11);
  for (bool transposed : {false, true}) {
    Vec y(rows * out);
    linearForward<double>(pool(), rows, in, out, x.data(), w.data(),
                          transposed, bias.data(), y.data());
    Vec expected = naiveMatmul(1, rows, out, in, x, false, w, transposed);
    for (int64_t r = 0; r < rows; ++r)
      for (int64_t j = 0; j < out; ++j)
        expected[r * out + j] += bias[j];
    expectNear(y, expected, 1e-13);
  }
}

TEST(HostKernels, FloatLinearIsCloseToDouble) {
  const int64_t rows = 40, in = 300, out = 50;
  auto x = randomVec<float>(rows * in, 12), w = randomVec<float>(out * in, 13);
  std::vector<float> y(rows * out);
  linearForward<float>(pool(), rows, in, out, x.data(), w.data(), true,
                       nullptr, y.data());
  Vec expected = naiveMatmul(1, rows, out, in, Vec(x.begin(), x.end()), false,
                             Vec(w.begin(), w.end()), true);
  expectNear(Vec(y.begin(), y.end()), expected, 2e-5);
}

TEST(HostKernels, AttentionMatchesExplicitLoops) {
  AttentionParams p;
  p.batch = 2, p.seqQ = 6, p.seqK = 6, p.headsQ = 4, p.headsKv = 2;
  p.headDim = 5, p.headDimV = 3;
  p.seed = 5, p.firstSample = 11;
  Vec q = randomVec(p.batch * p.seqQ * p.headsQ * p.headDim, 20, -2, 2);
  Vec k = randomVec(p.batch * p.seqK * p.headsKv * p.headDim, 21, -2, 2);
  Vec v = randomVec(p.batch * p.seqK * p.headsKv * p.headDimV, 22);
  for (bool causal : {false, true})
    for (double dropout : {0.0, 0.4}) {
      p.causal = causal;
      p.dropoutP = dropout;
      Vec out(p.batch * p.seqQ * p.headsQ * p.headDimV);
      Vec lse(p.batch * p.headsQ * p.seqQ);
      attentionForward<double>(pool(), p, q.data(), k.data(), v.data(),
                               out.data(), lse.data());
      Vec expected(out.size(), 0.0), expectedLse(lse.size());
      double scale = 1 / std::sqrt(5.0);
      for (int b = 0; b < 2; ++b)
        for (int h = 0; h < 4; ++h)
          for (int i = 0; i < 6; ++i) {
            int g = h / 2; // 4 query heads share 2 kv heads
            double scores[6], sum = 0;
            for (int j = 0; j < 6; ++j) {
              double s = 0;
              for (int d = 0; d < 5; ++d)
                s += q[((b * 6 + i) * 4 + h) * 5 + d] *
                     k[((b * 6 + j) * 2 + g) * 5 + d];
              scores[j] = (causal && j > i) ? -INFINITY : s * scale;
              sum += std::exp(scores[j]);
            }
            expectedLse[(b * 4 + h) * 6 + i] = std::log(sum);
            for (int j = 0; j < 6; ++j) {
              double prob = std::exp(scores[j]) / sum;
              // Sample 11 + b's key; the position within the sample.
              uint64_t key = mtrt::random::streamKey(5, 11 + b);
              uint64_t index = (h * 6 + i) * 6 + j;
              if (dropout > 0)
                prob = ((mtrt::random::bitsFromKey(key, index / 4) >>
                         (16 * (index % 4))) &
                        0xFFFF) >= static_cast<uint64_t>(dropout * 65536 + 0.5)
                           ? prob / (1 - dropout)
                           : 0;
              for (int d = 0; d < 3; ++d)
                expected[((b * 6 + i) * 4 + h) * 3 + d] +=
                    prob * v[((b * 6 + j) * 2 + g) * 3 + d];
            }
          }
      expectNear(out, expected, 1e-13);
      expectNear(lse, expectedLse, 1e-13);
    }
}

// The kernels that draw consecutive positions step random::drawCounter by
// kCounterStep instead of multiplying: the same bits as bitsFromKey, where
// the counter wraps around 2^64 too.
TEST(HostKernels, SteppedDrawCountersEqualBitsFromKey) {
  namespace random = mtrt::random;
  std::mt19937_64 rng(11);
  for (uint64_t index :
       {uint64_t(0), uint64_t(1) << 20, ~uint64_t(0) - 3, uint64_t(rng())}) {
    uint64_t key = rng();
    uint64_t counter = random::drawCounter(key, index);
    for (uint64_t k = 0; k < 8; ++k)
      ASSERT_EQ(random::mix64(counter + k * random::kCounterStep),
                random::bitsFromKey(key, index + k))
          << "index " << index << " + " << k;
  }
}

// The mask kernels' four-lane compare (random::dropoutKeepSpread, packed
// by dropoutGatherNibbles) keeps exactly what dropoutLaneKeep keeps, at
// every 16-bit threshold (0 and 65536 included) and for lanes at the
// extremes and around the threshold.
TEST(HostKernels, DropoutLaneWordsEqualTheLaneCompare) {
  namespace random = mtrt::random;
  std::mt19937_64 rng(7);
  for (uint32_t threshold = 0; threshold <= 65536; ++threshold) {
    random::DropoutLanes lanes = random::dropoutLanes(threshold);
    // The extremes and the threshold's neighbours, else a random lane.
    const uint64_t edges[] = {
        0,      0xFFFF, threshold & 0xFFFF, (threshold - 1) & 0xFFFF,
        0x8000, 0x7FFF};
    auto lane = [&](int n) -> uint64_t {
      return n < 6 ? edges[n] : rng() & 0xFFFF;
    };
    for (int round = 0; round < 4; ++round) {
      uint64_t draws[4];
      uint32_t spread = 0, expected = 0;
      for (int n = 0; n < 4; ++n) {
        draws[n] = 0;
        for (int l = 0; l < 4; ++l)
          draws[n] |= lane(static_cast<int>(rng() % 8)) << (16 * l);
        if (round == 0 && n == 0)
          draws[n] = rng();
        spread |= random::dropoutKeepSpread(draws[n], lanes) << (4 * n);
        for (unsigned l = 0; l < 4; ++l)
          expected |= uint32_t(random::dropoutLaneKeep(draws[n], l, threshold))
                      << (4 * n + l);
      }
      ASSERT_EQ(random::dropoutGatherNibbles(spread), expected)
          << "threshold " << threshold << ", draws " << std::hex << draws[0]
          << " " << draws[1] << " " << draws[2] << " " << draws[3];
    }
  }
}

TEST(HostKernels, RopeRotatesHalvesByPositionAngles) {
  const int64_t batch = 2, seq = 4, heads = 3, dim = 10, rotary = 6;
  const double base = 500;
  Vec x = randomVec(batch * seq * heads * dim, 30), y(x.size());
  ropeForward<double>(pool(), batch, seq, heads, dim, rotary, base, x.data(),
                      y.data());
  Vec expected(x.size());
  for (int64_t row = 0; row < batch * seq * heads; ++row) {
    double pos = static_cast<double>((row / heads) % seq);
    const double *xr = &x[row * dim];
    double *er = &expected[row * dim];
    for (int i = 0; i < rotary / 2; ++i) {
      double angle = pos / std::pow(base, 2.0 * i / rotary);
      er[i] = xr[i] * std::cos(angle) - xr[i + 3] * std::sin(angle);
      er[i + 3] = xr[i + 3] * std::cos(angle) + xr[i] * std::sin(angle);
    }
    for (int i = rotary; i < dim; ++i)
      er[i] = xr[i];
  }
  expectNear(y, expected, 1e-14);
  // In place, and back: the backward is the inverse rotation.
  ropeBackward<double>(pool(), batch, seq, heads, dim, rotary, base, y.data(),
                       y.data());
  expectNear(y, x, 1e-14);
}

/// Hugging Face's llama3 and linear RoPE scalings, computed here in float64
/// the way transformers' _compute_llama3_parameters writes them (two
/// torch.where over the wavelengths), against the host kernel.
TEST(HostKernels, RopeScalingsMatchHuggingFaceFormulas) {
  const int64_t batch = 1, seq = 9, heads = 2, dim = 16, rotary = 16;
  const double base = 10000, factor = 8, low = 1, high = 4, original = 64;
  const double pi = std::acos(-1.0);
  // Wavelengths 2 pi base^(2i / 16): 6.3 (kept, below 64 / 4), 19.9 and 62.8
  // (blended), 199 and up (divided, above 64 / 1): every branch is taken.
  std::vector<double> llama3, linear;
  for (int i = 0; i < rotary / 2; ++i) {
    double f = 1.0 / std::pow(base, 2.0 * i / rotary);
    double wavelength = 2 * pi / f;
    double scaled = wavelength > original / low ? f / factor : f;
    double smooth = (original / wavelength - low) / (high - low);
    double smoothed = (1 - smooth) * scaled / factor + smooth * scaled;
    bool medium = !(wavelength < original / high) &&
                  !(wavelength > original / low);
    llama3.push_back(medium ? smoothed : scaled);
    linear.push_back(f / factor);
  }
  EXPECT_EQ(llama3[0], 1.0);
  EXPECT_NEAR(llama3[7], 1.0 / std::pow(base, 14.0 / 16) / factor, 1e-18);

  mtrt::RopeFrequencies llama3Attrs(base);
  llama3Attrs.factor = factor;
  llama3Attrs.lowFreqFactor = low;
  llama3Attrs.highFreqFactor = high;
  llama3Attrs.originalMaxPositions = original;
  mtrt::RopeFrequencies linearAttrs(base);
  linearAttrs.factor = factor;
  for (auto [attrs, frequencies] :
       {std::pair{llama3Attrs, llama3}, std::pair{linearAttrs, linear}}) {
    Vec x = randomVec(batch * seq * heads * dim, 31), y(x.size());
    ropeForward<double>(pool(), batch, seq, heads, dim, rotary, attrs,
                        x.data(), y.data());
    Vec expected(x.size());
    for (int64_t row = 0; row < batch * seq * heads; ++row) {
      double pos = static_cast<double>((row / heads) % seq);
      const double *xr = &x[row * dim];
      double *er = &expected[row * dim];
      for (int i = 0; i < rotary / 2; ++i) {
        double angle = pos * frequencies[i];
        er[i] = xr[i] * std::cos(angle) - xr[i + 8] * std::sin(angle);
        er[i + 8] = xr[i + 8] * std::cos(angle) + xr[i] * std::sin(angle);
      }
    }
    expectNear(y, expected, 1e-14);
    ropeBackward<double>(pool(), batch, seq, heads, dim, rotary, attrs,
                         y.data(), y.data());
    expectNear(y, x, 1e-14);
  }
}

/// YaRN's inverse frequencies against those transformers 5.17 computed for
/// hf-reference's yarn Llama (float32: head_dim 16, base 10000, factor 4,
/// 64 original positions, beta_fast 4, beta_slow 0.5, truncated: pair 0
/// kept, pairs 1 and 2 blended a third and two thirds, the rest divided),
/// and the attention factor on the rotation: forward then backward
/// multiplies by its square, the backward being the scaled rotation's
/// transpose.
TEST(HostKernels, RopeYarnMatchesTransformers) {
  const double transformers[8] = {1,           0.237170815,    0.049999997,
                                  0.00790569466, 0.00249999994, 0.000790569466,
                                  0.000250000012, 7.90569466e-05};
  mtrt::RopeFrequencies yarn(10000.0);
  yarn.factor = 4;
  yarn.originalMaxPositions = 64;
  yarn.betaFast = 4;
  yarn.betaSlow = 0.5;
  yarn.attentionFactor = 0.1 * std::log(4.0) + 1;
  for (int i = 0; i < 8; ++i)
    EXPECT_NEAR(mtrt::ropeInverseFrequency(yarn, i, 16) / transformers[i], 1.0,
                1e-7)
        << "pair " << i;
  // Without truncation the ramp runs from 0.81 to 2.62 instead of 0 to 3.
  mtrt::RopeFrequencies exact = yarn;
  exact.truncate = false;
  double low = 16 * std::log(64 / (4 * 2 * std::acos(-1.0))) /
               (2 * std::log(10000.0));
  double high = 16 * std::log(64 / (0.5 * 2 * std::acos(-1.0))) /
                (2 * std::log(10000.0));
  double ramp = (1 - low) / (high - low);
  double f1 = std::pow(10000.0, -2.0 / 16);
  EXPECT_NEAR(mtrt::ropeInverseFrequency(exact, 1, 16),
              f1 / 4 * ramp + f1 * (1 - ramp), 1e-15);
  EXPECT_EQ(mtrt::ropeInverseFrequency(exact, 0, 16), 1.0);

  const int64_t batch = 1, seq = 5, heads = 2, dim = 16;
  Vec x = randomVec(batch * seq * heads * dim, 33), y(x.size());
  ropeForward<double>(pool(), batch, seq, heads, dim, dim, yarn, x.data(),
                      y.data());
  // Position 0 is not rotated, only scaled.
  for (int64_t e = 0; e < heads * dim; ++e)
    EXPECT_NEAR(y[e], yarn.attentionFactor * x[e], 1e-15);
  ropeBackward<double>(pool(), batch, seq, heads, dim, dim, yarn, y.data(),
                       y.data());
  Vec scaled(x);
  for (double &v : scaled)
    v *= yarn.attentionFactor * yarn.attentionFactor;
  expectNear(y, scaled, 1e-14);
}

TEST(HostKernels, ActivationsMatchTheirFormulas) {
  Vec x = randomVec(200, 40, -6, 6), up = randomVec(200, 41);
  Vec erf(x.size()), tanhForm(x.size()), silu(x.size()), swiglu(x.size());
  geluForward<double>(pool(), x.size(), x.data(), erf.data(),
                      GeluApproximation::None);
  geluForward<double>(pool(), x.size(), x.data(), tanhForm.data(),
                      GeluApproximation::Tanh);
  siluForward<double>(pool(), x.size(), x.data(), silu.data());
  swigluForward<double>(pool(), x.size(), x.data(), up.data(), swiglu.data());
  const double pi = std::acos(-1.0);
  for (size_t i = 0; i < x.size(); ++i) {
    double v = x[i];
    EXPECT_NEAR(erf[i], 0.5 * v * std::erfc(-v / std::sqrt(2.0)), 1e-14);
    EXPECT_NEAR(tanhForm[i],
                0.5 * v *
                    (1 + std::tanh(std::sqrt(2 / pi) *
                                   (v + 0.044715 * v * v * v))),
                1e-14);
    EXPECT_NEAR(silu[i], v / (1 + std::exp(-v)), 1e-14);
    EXPECT_NEAR(swiglu[i], v / (1 + std::exp(-v)) * up[i], 1e-14);
  }
}

TEST(HostKernels, AddMulAndAccumulate) {
  Vec a = randomVec(50, 42), b = randomVec(50, 43), sum(50), product(50);
  addForward<double>(pool(), 50, a.data(), b.data(), sum.data());
  mulForward<double>(pool(), 50, a.data(), b.data(), product.data());
  Vec accumulated = a;
  accumulateInto<double>(pool(), 50, b.data(), accumulated.data());
  for (int i = 0; i < 50; ++i) {
    EXPECT_EQ(sum[i], a[i] + b[i]);
    EXPECT_EQ(product[i], a[i] * b[i]);
    EXPECT_EQ(accumulated[i], a[i] + b[i]);
  }
}

TEST(HostKernels, TransposeMovesEveryElementToItsPermutedIndex) {
  const int64_t shape[] = {2, 3, 4, 5};
  const int64_t permutation[] = {3, 1, 0, 2};
  Vec x(120), y(120);
  for (int i = 0; i < 120; ++i)
    x[i] = i;
  transposeForward<double>(pool(), 4, shape, permutation, x.data(), y.data());
  // y[d, b, a, c] = x[a, b, c, d]; y's shape is [5, 3, 2, 4].
  for (int a = 0; a < 2; ++a)
    for (int b = 0; b < 3; ++b)
      for (int c = 0; c < 4; ++c)
        for (int d = 0; d < 5; ++d)
          ASSERT_EQ(y[((d * 3 + b) * 2 + a) * 4 + c],
                    x[((a * 3 + b) * 4 + c) * 5 + d]);
  int64_t inverse[4];
  inversePermutation(4, permutation, inverse);
  const int64_t permutedShape[] = {5, 3, 2, 4};
  Vec back(120);
  transposeForward<double>(pool(), 4, permutedShape, inverse, y.data(),
                           back.data());
  EXPECT_EQ(back, x);
}

TEST(HostKernels, SplitAndConcatAlongAMiddleAxis) {
  // [2, 5, 3] into [2, 2, 3] and [2, 3, 3].
  Vec x(30);
  for (int i = 0; i < 30; ++i)
    x[i] = i;
  const int64_t sizes[] = {2, 3};
  Vec first(12), second(18);
  double *outputs[] = {first.data(), second.data()};
  splitForward<double>(pool(), 2, 3, 2, sizes, x.data(), outputs);
  for (int o = 0; o < 2; ++o)
    for (int a = 0; a < 5; ++a)
      for (int in = 0; in < 3; ++in) {
        double expected = x[(o * 5 + a) * 3 + in];
        double actual = a < 2 ? first[(o * 2 + a) * 3 + in]
                              : second[(o * 3 + (a - 2)) * 3 + in];
        ASSERT_EQ(actual, expected);
      }
  Vec joined(30);
  const double *inputs[] = {first.data(), second.data()};
  concatForward<double>(pool(), 2, 3, 2, sizes, inputs, joined.data());
  EXPECT_EQ(joined, x);
}

TEST(HostKernels, EmbeddingGathersRows) {
  Vec table = randomVec(5 * 3, 50);
  std::vector<int64_t> ids = {4, 0, 4, 2};
  Vec out(4 * 3);
  ASSERT_TRUE((embeddingForward<double, int64_t>(
                   pool(), 4, 5, 3, table.data(), ids.data(), out.data()))
                  .ok());
  for (int i = 0; i < 4; ++i)
    for (int j = 0; j < 3; ++j)
      EXPECT_EQ(out[i * 3 + j], table[ids[i] * 3 + j]);
}

TEST(HostKernels, ParameterGradientsAccumulateWhenAsked) {
  const int64_t rows = 7, in = 5, out = 4;
  Vec x = randomVec(rows * in, 60), w = randomVec(in * out, 61),
      dy = randomVec(rows * out, 62);
  Vec dw(w.size()), db(out);
  linearBackward<double>(pool(), rows, in, out, x.data(), w.data(), false,
                         dy.data(), nullptr, dw.data(), db.data(), false);
  Vec dwAcc(w.size(), 1.5), dbAcc(out, -2.0);
  linearBackward<double>(pool(), rows, in, out, x.data(), w.data(), false,
                         dy.data(), nullptr, dwAcc.data(), dbAcc.data(), true);
  for (size_t i = 0; i < dw.size(); ++i)
    EXPECT_EQ(dwAcc[i], 1.5 + dw[i]);
  for (int64_t j = 0; j < out; ++j)
    EXPECT_EQ(dbAcc[j], -2.0 + db[j]);

  Vec mean(rows), rstd(rows), y(rows * in), g = randomVec(in, 63);
  layerNormForward<double>(pool(), rows, in, x.data(), g.data(), nullptr, 1e-5,
                           y.data(), mean.data(), rstd.data());
  Vec dy2 = randomVec(rows * in, 64), dg(in), dgAcc(in, 0.25);
  layerNormBackward<double>(pool(), rows, in, x.data(), g.data(), mean.data(),
                            rstd.data(), dy2.data(), nullptr, dg.data(),
                            nullptr, false);
  layerNormBackward<double>(pool(), rows, in, x.data(), g.data(), mean.data(),
                            rstd.data(), dy2.data(), nullptr, dgAcc.data(),
                            nullptr, true);
  for (int64_t j = 0; j < in; ++j)
    EXPECT_EQ(dgAcc[j], 0.25 + dg[j]);

  std::vector<int32_t> ids = {1, 1, 0};
  Vec dtable(2 * 2, 10.0), dout = {1, 2, 3, 4, 5, 6};
  ASSERT_TRUE((embeddingBackward<double, int32_t>(
                   pool(), 3, 2, 2, ids.data(), dout.data(), dtable.data(),
                   true))
                  .ok());
  EXPECT_EQ(dtable, (Vec{15, 16, 14, 16}));
}

} // namespace
