// Tests of the host kernels that bundles for several ranks add: bias_add and
// the initialization of parameter shards by global position.
#include "host/ThreadPool.h"
#include "host/kernels/Kernels.h"

#include "gtest/gtest.h"

#include <cstring>
#include <vector>

using namespace mtrt::host;

namespace {

ThreadPool &pool() {
  static ThreadPool instance(3);
  return instance;
}

TEST(HostParallelKernelsTest, BiasAddMatchesANaiveLoop) {
  const int64_t rows = 37, n = 5;
  std::vector<double> x(rows * n), bias(n), y(rows * n);
  for (size_t i = 0; i < x.size(); ++i)
    x[i] = 0.25 * static_cast<double>(i) - 3;
  for (int64_t j = 0; j < n; ++j)
    bias[j] = 1.5 * static_cast<double>(j) + 0.125;
  biasAddForward<double>(pool(), rows, n, x.data(), bias.data(), y.data());
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t j = 0; j < n; ++j)
      EXPECT_EQ(y[r * n + j], x[r * n + j] + bias[j]) << r << ", " << j;
}

TEST(HostParallelKernelsTest, AWholeShardHasInitNormalsBits) {
  const std::vector<int64_t> shape = {7, 9, 4}, zeros = {0, 0, 0};
  int64_t n = 7 * 9 * 4;
  std::vector<float> whole(n), shard(n);
  initNormal<float>(pool(), n, whole.data(), 0.02, 1234, 3);
  initNormalShard<float>(pool(), 3, shape.data(), zeros.data(), shape.data(),
                         shard.data(), 0.02, 1234, 3);
  EXPECT_EQ(std::memcmp(whole.data(), shard.data(), sizeof(float) * n), 0);
}

TEST(HostParallelKernelsTest, AShardDrawsItsGlobalPositions) {
  // A [6, 8] tensor; the shard is rows [2, 4) and columns [4, 8).
  const std::vector<int64_t> shape = {6, 8}, offsets = {2, 4}, local = {2, 4};
  std::vector<double> whole(48), shard(8);
  initNormal<double>(pool(), 48, whole.data(), 0.5, 99, 7);
  initNormalShard<double>(pool(), 2, shape.data(), offsets.data(), local.data(),
                          shard.data(), 0.5, 99, 7);
  for (int64_t r = 0; r < 2; ++r)
    for (int64_t c = 0; c < 4; ++c)
      EXPECT_EQ(shard[r * 4 + c], whole[(r + 2) * 8 + (c + 4)])
          << r << ", " << c;
}

} // namespace
