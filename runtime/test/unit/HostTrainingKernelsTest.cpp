// Host kernels for training: loss, AdamW, LR schedule, init, dropout and RNG, thread-count independence, data errors.
#include "core/Random.h"
#include "host/ThreadPool.h"
#include "host/kernels/Kernels.h"

#include "gtest/gtest.h"

#include <atomic>
#include <cmath>
#include <cstring>
#include <random>
#include <stdexcept>
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

//===----------------------------------------------------------------------===//
// Cross entropy
//===----------------------------------------------------------------------===//

TEST(HostTrainingKernels, CrossEntropyMatchesLogSumExpMinusTarget) {
  const int64_t rows = 5, vocab = 4;
  Vec logits = randomVec(rows * vocab, 1, -5, 5);
  std::vector<int32_t> labels = {2, -100, 0, 3, -100};
  Vec expected(rows, 0.0);
  double sum = 0;
  for (int r = 0; r < rows; ++r) {
    if (labels[r] == -100)
      continue;
    double z = 0;
    for (int v = 0; v < vocab; ++v)
      z += std::exp(logits[r * vocab + v]);
    expected[r] = std::log(z) - logits[r * vocab + labels[r]];
    sum += expected[r];
  }
  Vec none(rows), total(1), mean(1);
  ASSERT_TRUE((crossEntropyForward<double, int32_t>(
                   pool(), rows, vocab, logits.data(), labels.data(), -100,
                   LossReduction::None, none.data()))
                  .ok());
  ASSERT_TRUE((crossEntropyForward<double, int32_t>(
                   pool(), rows, vocab, logits.data(), labels.data(), -100,
                   LossReduction::Sum, total.data()))
                  .ok());
  ASSERT_TRUE((crossEntropyForward<double, int32_t>(
                   pool(), rows, vocab, logits.data(), labels.data(), -100,
                   LossReduction::Mean, mean.data()))
                  .ok());
  for (int r = 0; r < rows; ++r)
    EXPECT_NEAR(none[r], expected[r], 1e-14);
  EXPECT_NEAR(total[0], sum, 1e-13);
  EXPECT_NEAR(mean[0], sum / 3, 1e-13);
}

TEST(HostTrainingKernels, CrossEntropyMeanOfNoTokensIsZero) {
  Vec logits = randomVec(2 * 3, 2);
  std::vector<int64_t> labels = {7, 7};
  Vec loss = {NAN}, dlogits(6, NAN), dloss = {1.0};
  ASSERT_TRUE((crossEntropyForward<double, int64_t>(
                   pool(), 2, 3, logits.data(), labels.data(), 7,
                   LossReduction::Mean, loss.data()))
                  .ok());
  EXPECT_EQ(loss[0], 0.0);
  ASSERT_TRUE((crossEntropyBackward<double, int64_t>(
                   pool(), 2, 3, logits.data(), labels.data(), 7,
                   LossReduction::Mean, dloss.data(), dlogits.data()))
                  .ok());
  for (double g : dlogits)
    EXPECT_EQ(g, 0.0);
}

TEST(HostTrainingKernels, FloatCrossEntropyIsAccurateForLargeLogits) {
  const int64_t vocab = 1000;
  std::vector<float> logits = randomVec<float>(vocab, 3, 80, 90);
  std::vector<int32_t> label = {17};
  float loss;
  ASSERT_TRUE((crossEntropyForward<float, int32_t>(
                   pool(), 1, vocab, logits.data(), label.data(), -100,
                   LossReduction::Sum, &loss))
                  .ok());
  double maxValue = 0, z = 0;
  for (float v : logits)
    maxValue = std::max(maxValue, static_cast<double>(v));
  for (float v : logits)
    z += std::exp(static_cast<double>(v) - maxValue);
  double expected = maxValue + std::log(z) - logits[17];
  EXPECT_NEAR(loss, expected, 1e-6 * expected);
}

TEST(HostTrainingKernels, OutOfRangeLabelsAndIdsAreErrors) {
  Vec logits(2 * 3, 0.0), loss(1, 42.0);
  std::vector<int32_t> labels = {1, 3};
  KernelStatus status = crossEntropyForward<double, int32_t>(
      pool(), 2, 3, logits.data(), labels.data(), -100, LossReduction::Sum,
      loss.data());
  ASSERT_FALSE(status.ok());
  EXPECT_EQ(status.message(),
            "cross_entropy: label 3 of row 1 is outside the vocabulary of 3 "
            "(valid labels are 0 to 2, or the ignore index -100)");
  EXPECT_EQ(loss[0], 42.0);

  Vec table(4 * 2, 1.0), out(3 * 2, -1.0);
  std::vector<int64_t> ids = {0, 4, 1};
  status = embeddingForward<double, int64_t>(pool(), 3, 4, 2, table.data(),
                                             ids.data(), out.data());
  ASSERT_FALSE(status.ok());
  EXPECT_EQ(status.message(),
            "embedding: id 4 at position 1 is outside the embedding table's "
            "4 rows (valid ids are 0 to 3)");
  for (double v : out)
    EXPECT_EQ(v, -1.0); // nothing written
  std::vector<int32_t> negative = {-1};
  Vec dtable(4 * 2, 0.0);
  status = embeddingBackward<double, int32_t>(
      pool(), 1, 4, 2, negative.data(), out.data(), dtable.data(), false);
  ASSERT_FALSE(status.ok());
  EXPECT_NE(status.message().find("id -1 at position 0"), std::string::npos);
}

//===----------------------------------------------------------------------===//
// Optimizer and schedule
//===----------------------------------------------------------------------===//

TEST(HostTrainingKernels, AdamWTwoStepsMatchHandComputedValues) {
  Vec p = {1.0, -2.0}, g = {0.5, 0.1}, m = {0, 0}, v = {0, 0};
  AdamWParams params;
  params.lr = 0.1;
  params.beta1 = 0.9;
  params.beta2 = 0.999;
  params.eps = 1e-8;
  params.weightDecay = 0.01;
  params.step = 1;
  adamwStep<double>(pool(), 2, p.data(), g.data(), m.data(), v.data(), params);
  // Step 1: m = 0.1 g, v = 0.001 g^2; the corrected m/sqrt(v) is sign(g).
  // p = p (1 - 0.001) - 0.1 * |g| / (|g| + 1e-8) * sign(g).
  EXPECT_NEAR(m[0], 0.05, 1e-16);
  EXPECT_NEAR(v[0], 0.00025, 1e-18);
  EXPECT_NEAR(p[0], 0.999 - 0.1 * 0.5 / (0.5 + 1e-8), 1e-15);
  EXPECT_NEAR(p[1], -1.998 - 0.1 * 0.1 / (0.1 + 1e-8), 1e-15);

  Vec g2 = {-0.2, 0.1};
  params.step = 2;
  double p0 = p[0];
  adamwStep<double>(pool(), 2, p.data(), g2.data(), m.data(), v.data(),
                    params);
  double m2 = 0.9 * 0.05 + 0.1 * -0.2;               // 0.025
  double v2 = 0.999 * 0.00025 + 0.001 * 0.04;        // 0.00028975
  double mHat = m2 / (1 - 0.81), vHat = v2 / (1 - 0.998001);
  EXPECT_NEAR(m[0], m2, 1e-16);
  EXPECT_NEAR(v[0], v2, 1e-18);
  EXPECT_NEAR(p[0], p0 * 0.999 - 0.1 * mHat / (std::sqrt(vHat) + 1e-8), 1e-15);
}

TEST(HostTrainingKernels, SumOfSquaresAndScaling) {
  std::vector<float> x = randomVec<float>(10000, 4);
  double expected = 0;
  for (float v : x)
    expected += static_cast<double>(v) * v;
  EXPECT_NEAR(sumOfSquares<float>(pool(), x.size(), x.data()), expected,
              1e-12 * expected);
  scaleInPlace<float>(pool(), x.size(), x.data(), 0.5);
  EXPECT_NEAR(sumOfSquares<float>(pool(), x.size(), x.data()), expected / 4,
              1e-12 * expected);
}

TEST(HostTrainingKernels, LearningRateScheduleFollowsMegatron) {
  LrSchedule s;
  s.maxLr = 1e-3;
  s.minLr = 1e-4;
  s.warmupIters = 10;
  s.decayIters = 110;
  const double pi = std::acos(-1.0);
  for (LrDecayStyle style :
       {LrDecayStyle::Constant, LrDecayStyle::Linear, LrDecayStyle::Cosine}) {
    s.style = style;
    // Warmup from 0, whatever the style.
    EXPECT_DOUBLE_EQ(learningRate(s, 0), 0.0);
    EXPECT_DOUBLE_EQ(learningRate(s, 5), 0.5e-3);
    EXPECT_DOUBLE_EQ(learningRate(s, 10), 1e-3);
  }
  s.style = LrDecayStyle::Constant;
  EXPECT_DOUBLE_EQ(learningRate(s, 60), 1e-3);
  EXPECT_DOUBLE_EQ(learningRate(s, 500), 1e-3);
  s.style = LrDecayStyle::Linear;
  EXPECT_DOUBLE_EQ(learningRate(s, 60), 1e-4 + 0.5 * 9e-4);
  EXPECT_DOUBLE_EQ(learningRate(s, 85), 1e-4 + 0.25 * 9e-4);
  EXPECT_DOUBLE_EQ(learningRate(s, 110), 1e-4);
  EXPECT_DOUBLE_EQ(learningRate(s, 500), 1e-4);
  s.style = LrDecayStyle::Cosine;
  EXPECT_DOUBLE_EQ(learningRate(s, 60), 1e-4 + 0.5 * 9e-4);
  EXPECT_DOUBLE_EQ(learningRate(s, 35),
                   1e-4 + 0.5 * (std::cos(pi * 0.25) + 1) * 9e-4);
  EXPECT_NEAR(learningRate(s, 110), 1e-4, 1e-18);
  EXPECT_DOUBLE_EQ(learningRate(s, 111), 1e-4);
  // A warmup start other than 0, and no warmup at all.
  s.warmupInitLr = 2e-4;
  EXPECT_DOUBLE_EQ(learningRate(s, 5), 2e-4 + 0.5 * 8e-4);
  s.warmupIters = 0;
  EXPECT_DOUBLE_EQ(learningRate(s, 0), 1e-3);
}

//===----------------------------------------------------------------------===//
// Randomness: the counter-based generator, dropout masks, init
//===----------------------------------------------------------------------===//

/// Random.h's documented formula, written out again.
uint64_t referenceBits(uint64_t seed, uint64_t stream, uint64_t index) {
  auto mix = [](uint64_t z) {
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
  };
  uint64_t key = mix(mix(seed ^ 0x6A09E667F3BCC909ull) ^ stream);
  return mix(key + (index + 1) * 0x9E3779B97F4A7C15ull);
}

TEST(HostTrainingKernels, RandomBitsFollowTheDocumentedFormula) {
  for (uint64_t seed : {0ull, 1ull, 1234ull})
    for (uint64_t stream : {0ull, 7ull})
      for (uint64_t index : {0ull, 1ull, 1ull << 40})
        EXPECT_EQ(mtrt::random::randomBits(seed, stream, index),
                  referenceBits(seed, stream, index));
  uint64_t bits = referenceBits(3, 4, 5);
  EXPECT_EQ(mtrt::random::uniformFloat(bits),
            static_cast<float>(bits >> 40) / 16777216.0f);
  EXPECT_EQ(mtrt::random::uniformDouble(bits),
            static_cast<double>(bits >> 11) / 9007199254740992.0);
  EXPECT_LT(mtrt::random::uniformFloat(~0ull), 1.0f);
  EXPECT_LT(mtrt::random::uniformDouble(~0ull), 1.0);
}

/// The mask tile of n / sampleElements whole samples from `firstSample`.
mtrt::random::MaskTile wholeSamples(int64_t n, int64_t sampleElements,
                                    uint64_t firstSample) {
  std::vector<int64_t> shape = {n / sampleElements, sampleElements},
                       offsets = {0, 0};
  mtrt::random::MaskTile tile;
  EXPECT_TRUE(mtrt::random::makeMaskTile(shape.data(), shape.data(),
                                         offsets.data(), 2, firstSample, tile));
  return tile;
}

TEST(HostTrainingKernels, DropoutMaskDependsOnSeedSampleAndPositionOnly) {
  const int64_t n = 200000, sample = 1000;
  const double p = 0.3;
  std::vector<float> x(n, 1.0f), a(n), b(n), c(n), d(n);
  dropoutForward<float>(pool(), n, x.data(), a.data(), p, 42,
                        wholeSamples(n, sample, 7));
  ThreadPool serial(1);
  dropoutForward<float>(serial, n, x.data(), b.data(), p, 42,
                        wholeSamples(n, sample, 7));
  // Samples 8 onwards: the same masks, one sample later.
  dropoutForward<float>(pool(), n, x.data(), c.data(), p, 42,
                        wholeSamples(n, sample, 8));
  dropoutForward<float>(pool(), n, x.data(), d.data(), p, 43,
                        wholeSamples(n, sample, 7));
  EXPECT_EQ(std::memcmp(a.data(), b.data(), n * sizeof(float)), 0);
  EXPECT_EQ(
      std::memcmp(a.data() + sample, c.data(), (n - sample) * sizeof(float)),
      0);
  int64_t kept = 0, differ = 0;
  float scale = static_cast<float>(1 / (1 - p));
  for (int64_t i = 0; i < n; ++i) {
    ASSERT_TRUE(a[i] == 0.0f || a[i] == scale) << a[i];
    kept += a[i] != 0.0f;
    differ += (a[i] != 0.0f) != (d[i] != 0.0f);
  }
  // Binomial(n, 0.7): the standard deviation of the rate is about 0.001.
  EXPECT_NEAR(static_cast<double>(kept) / n, 1 - p, 0.005);
  // Independent masks (another seed) disagree on 2 p (1 - p) = 42% of the
  // elements.
  EXPECT_NEAR(static_cast<double>(differ) / n, 2 * p * (1 - p), 0.01);
  // Element i of sample s is Random.h's formula written out.
  for (int64_t i : {int64_t{0}, int64_t{1}, int64_t{2}, int64_t{3}, int64_t{999},
                    int64_t{1000}, int64_t{1002}, n - 1}) {
    uint64_t s = 7 + static_cast<uint64_t>(i / sample);
    uint64_t position = static_cast<uint64_t>(i % sample);
    // One draw per four positions, 16 bits each, against round(p * 2^16).
    uint64_t bits = referenceBits(42, s, position / 4);
    bool keep = ((bits >> (16 * (position % 4))) & 0xFFFF) >=
                static_cast<uint64_t>(p * 65536 + 0.5);
    EXPECT_EQ(a[i] != 0.0f, keep) << i;
  }
  // The backward applies the same mask.
  std::vector<float> dx(n);
  dropoutBackward<float>(pool(), n, x.data(), dx.data(), p, 42,
                         wholeSamples(n, sample, 7));
  EXPECT_EQ(std::memcmp(a.data(), dx.data(), n * sizeof(float)), 0);
}

TEST(HostTrainingKernels, InitNormalHasItsStdAndIgnoresChunking) {
  const int64_t n = 100000;
  const double std = 0.02;
  std::vector<float> whole(n), halves(n), serialFill(n);
  initNormal<float>(pool(), n, whole.data(), std, 1234, 5);
  // As two shards of the same parameter, and on one thread.
  initNormal<float>(pool(), n / 2, halves.data(), std, 1234, 5);
  initNormal<float>(pool(), n - n / 2, halves.data() + n / 2, std, 1234, 5,
                    n / 2);
  ThreadPool serial(1);
  initNormal<float>(serial, n, serialFill.data(), std, 1234, 5);
  EXPECT_EQ(std::memcmp(whole.data(), halves.data(), n * sizeof(float)), 0);
  EXPECT_EQ(std::memcmp(whole.data(), serialFill.data(), n * sizeof(float)),
            0);
  double sum = 0, squares = 0;
  for (float v : whole) {
    sum += v;
    squares += static_cast<double>(v) * v;
  }
  double mean = sum / n, sd = std::sqrt(squares / n - mean * mean);
  EXPECT_NEAR(mean, 0.0, 4 * std / std::sqrt(double(n)));
  EXPECT_NEAR(sd, std, 0.01 * std);
  // Another parameter id is another stream.
  std::vector<float> other(n);
  initNormal<float>(pool(), n, other.data(), std, 1234, 6);
  EXPECT_NE(std::memcmp(whole.data(), other.data(), n * sizeof(float)), 0);
  // Ones and zeros.
  std::vector<double> ones(10, 5.0);
  fill<double>(pool(), 10, ones.data(), 1.0);
  EXPECT_EQ(ones, std::vector<double>(10, 1.0));
}

//===----------------------------------------------------------------------===//
// Thread-count independence and the pool
//===----------------------------------------------------------------------===//

template <typename T> bool sameBits(const std::vector<T> &a, const std::vector<T> &b) {
  return a.size() == b.size() &&
         std::memcmp(a.data(), b.data(), a.size() * sizeof(T)) == 0;
}

TEST(HostTrainingKernels, ResultsAreBitIdenticalWithOneAndTwoThreads) {
  ThreadPool one(1), two(2);
  const int64_t rows = 256, in = 96, out = 80;
  auto x = randomVec<float>(rows * in, 10), w = randomVec<float>(in * out, 11),
       bias = randomVec<float>(out, 12), dy = randomVec<float>(rows * out, 13),
       gamma = randomVec<float>(in, 14), beta = randomVec<float>(in, 15);
  auto run = [&](ThreadPool &pool) {
    std::vector<float> y(rows * out), dx(rows * in), dw(in * out), db(out);
    linearForward<float>(pool, rows, in, out, x.data(), w.data(), false,
                         bias.data(), y.data());
    linearBackward<float>(pool, rows, in, out, x.data(), w.data(), false,
                          dy.data(), dx.data(), dw.data(), db.data(), false);
    std::vector<float> all = y;
    for (auto *v : {&dx, &dw, &db})
      all.insert(all.end(), v->begin(), v->end());
    // Layer norm over x's rows, forward and backward.
    std::vector<float> ln(rows * in), mean(rows), rstd(rows), dln(rows * in),
        dg(in), dbeta(in);
    layerNormForward<float>(pool, rows, in, x.data(), gamma.data(),
                            beta.data(), 1e-5, ln.data(), mean.data(),
                            rstd.data());
    layerNormBackward<float>(pool, rows, in, x.data(), gamma.data(), mean.data(),
                             rstd.data(), x.data(), dln.data(), dg.data(),
                             dbeta.data(), false);
    for (auto *v : {&ln, &dln, &dg, &dbeta})
      all.insert(all.end(), v->begin(), v->end());
    // Causal GQA attention with dropout, forward and backward.
    AttentionParams p;
    p.batch = 2, p.seqQ = 32, p.seqK = 32, p.headsQ = 4, p.headsKv = 2;
    p.headDim = 12, p.headDimV = 12, p.causal = true, p.dropoutP = 0.1;
    p.seed = 3, p.firstSample = 2;
    size_t qSize = 2 * 32 * 4 * 12, kSize = 2 * 32 * 2 * 12;
    const float *q = x.data(), *k = w.data(), *v = dy.data();
    std::vector<float> o(qSize), lse(2 * 4 * 32), dq(qSize), dk(kSize),
        dv(kSize);
    attentionForward<float>(pool, p, q, k, v, o.data(), lse.data());
    attentionBackward<float>(pool, p, q, k, v, lse.data(), x.data() + qSize,
                             dq.data(), dk.data(), dv.data());
    for (auto *vec : {&o, &lse, &dq, &dk, &dv})
      all.insert(all.end(), vec->begin(), vec->end());
    // Embedding backward and the gradient norm.
    std::vector<int32_t> ids(rows);
    for (int64_t i = 0; i < rows; ++i)
      ids[i] = static_cast<int32_t>((i * 7) % 50);
    std::vector<float> dtable(50 * out);
    EXPECT_TRUE((embeddingBackward<float, int32_t>(
                     pool, rows, 50, out, ids.data(), dy.data(), dtable.data(),
                     false))
                    .ok());
    all.insert(all.end(), dtable.begin(), dtable.end());
    all.push_back(static_cast<float>(sumOfSquares<float>(pool, all.size(), all.data())));
    return all;
  };
  EXPECT_TRUE(sameBits(run(one), run(two)));
}

TEST(HostTrainingKernels, ThreadPoolCoversTheRangeInContiguousChunks) {
  ThreadPool three(3);
  EXPECT_EQ(three.size(), 3u);
  std::vector<int> hits(1000, 0);
  std::atomic<int> chunks{0};
  three.parallelFor(0, 1000, [&](int64_t begin, int64_t end) {
    ++chunks;
    for (int64_t i = begin; i < end; ++i)
      ++hits[i];
    // A nested loop runs serially on this thread.
    int inner = 0;
    three.parallelFor(0, 10, [&](int64_t b, int64_t e) { inner += e - b; });
    EXPECT_EQ(inner, 10);
  });
  EXPECT_EQ(chunks.load(), 3);
  EXPECT_EQ(hits, std::vector<int>(1000, 1));
  EXPECT_EQ(ThreadPool::chunkCount(1000, 400, 3), 3);
  EXPECT_EQ(ThreadPool::chunkCount(1000, 600, 3), 2);
  EXPECT_EQ(ThreadPool::chunkCount(0, 1, 3), 0);
  // A chunk's exception reaches the caller, and the pool still works.
  EXPECT_THROW(three.parallelFor(0, 9,
                                 [](int64_t begin, int64_t) {
                                   if (begin > 0)
                                     throw std::runtime_error("chunk");
                                 }),
               std::runtime_error);
  int total = 0;
  ThreadPool(1).parallelFor(0, 5, [&](int64_t b, int64_t e) { total += e - b; });
  EXPECT_EQ(total, 5);
}

} // namespace
