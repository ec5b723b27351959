// Tests of every collective on 1-8 in-process ranks against serial references.
#include "comm/InProcessWorld.h"
#include "comm/RunRanks.h"

#include "gtest/gtest.h"

#include <atomic>
#include <cmath>
#include <cstring>
#include <string>
#include <vector>

using namespace mtrt;
using namespace mtrt::comm;

namespace {

uint64_t mix(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

/// Rank `rank`'s contribution: signs and magnitudes spread over many
/// binades, so that a sum's rounding depends on the order of its terms.
template <typename T>
std::vector<T> contribution(int rank, int64_t count, uint64_t seed) {
  std::vector<T> values(count);
  for (int64_t i = 0; i < count; ++i) {
    uint64_t bits = mix(seed * 1000003 + rank * 7919 + i);
    T mantissa = T(1) + T(bits & 0xffffff) / T(1 << 24);
    int exponent = static_cast<int>((bits >> 24) % 40) - 12;
    values[i] = std::ldexp(mantissa, exponent) * ((bits >> 40) & 1 ? -1 : 1);
  }
  return values;
}

/// Element i of ranks [lo, hi) summed as the balanced tree: the first
/// ceil(n / 2) ranks' sum plus the rest's.
template <typename T>
T treeSum(const std::vector<std::vector<T>> &inputs, size_t lo, size_t hi,
          int64_t i) {
  if (hi - lo == 1)
    return inputs[lo][i];
  size_t mid = lo + (hi - lo + 1) / 2;
  return treeSum(inputs, lo, mid, i) + treeSum(inputs, mid, hi, i);
}

/// The reference: the tree sum (or the running max), over elements
/// [offset, offset + count) of each rank's input.
template <typename T>
std::vector<T> serialReduce(const std::vector<std::vector<T>> &inputs,
                            ReduceOp op, int64_t offset, int64_t count) {
  std::vector<T> out(inputs[0].begin() + offset,
                     inputs[0].begin() + offset + count);
  for (int64_t i = 0; i < count; ++i) {
    if (op == ReduceOp::Sum) {
      out[i] = treeSum(inputs, 0, inputs.size(), offset + i);
      continue;
    }
    for (size_t r = 1; r < inputs.size(); ++r)
      out[i] = std::max(out[i], inputs[r][offset + i]);
  }
  return out;
}

template <typename T>
bool sameBits(const std::vector<T> &a, const std::vector<T> &b) {
  return a.size() == b.size() &&
         std::memcmp(a.data(), b.data(), a.size() * sizeof(T)) == 0;
}

/// Runs fn on every rank and fails the test if any rank threw.
void runAll(InProcessWorld &world,
            const std::function<void(Communicator &)> &fn) {
  std::vector<std::exception_ptr> errors = runRanks(world, fn);
  for (size_t r = 0; r < errors.size(); ++r)
    if (errors[r]) {
      try {
        std::rethrow_exception(errors[r]);
      } catch (const std::exception &e) {
        ADD_FAILURE() << "rank " << r << " threw: " << e.what();
      }
    }
}

class CommCollectiveTest : public ::testing::TestWithParam<int> {};

constexpr int64_t kCount = 37;

template <typename T> void checkAllReduce(int n, ReduceOp op, bool inPlace) {
  std::vector<std::vector<T>> inputs(n), outputs(n);
  for (int r = 0; r < n; ++r)
    inputs[r] = contribution<T>(r, kCount, 1);
  InProcessWorld world(n);
  runAll(world, [&](Communicator &comm) {
    int r = comm.rank();
    outputs[r] = inPlace ? inputs[r] : std::vector<T>(kCount, T(-7));
    const T *send = inPlace ? outputs[r].data() : inputs[r].data();
    comm.allReduce(send, outputs[r].data(), kCount, op, {"grads", 3});
  });
  std::vector<T> expected = serialReduce(inputs, op, 0, kCount);
  for (int r = 0; r < n; ++r)
    EXPECT_TRUE(sameBits(outputs[r], expected)) << "rank " << r;
  if (n >= 3 && op == ReduceOp::Sum) {
    // The data must make the order matter, or the test proves nothing: the
    // ranks rotated by one give other bits.
    std::vector<std::vector<T>> rotated(inputs.begin() + 1, inputs.end());
    rotated.push_back(inputs[0]);
    EXPECT_FALSE(sameBits(serialReduce(rotated, op, 0, kCount), expected));
  }
}

TEST_P(CommCollectiveTest, AllReduceSumIsTheTreeSumOnEveryRank) {
  checkAllReduce<float>(GetParam(), ReduceOp::Sum, false);
  checkAllReduce<double>(GetParam(), ReduceOp::Sum, false);
}

TEST_P(CommCollectiveTest, AllReduceInPlace) {
  checkAllReduce<float>(GetParam(), ReduceOp::Sum, true);
  checkAllReduce<double>(GetParam(), ReduceOp::Sum, true);
}

TEST_P(CommCollectiveTest, AllReduceMax) {
  checkAllReduce<float>(GetParam(), ReduceOp::Max, false);
  checkAllReduce<double>(GetParam(), ReduceOp::Max, true);
}

template <typename T> void checkReduceScatter(int n, bool inPlace) {
  std::vector<std::vector<T>> inputs(n), outputs(n);
  for (int r = 0; r < n; ++r)
    inputs[r] = contribution<T>(r, kCount * n, 2);
  std::vector<std::vector<T>> buffers = inputs;
  InProcessWorld world(n);
  runAll(world, [&](Communicator &comm) {
    int r = comm.rank();
    if (inPlace) {
      T *chunk = buffers[r].data() + r * kCount;
      comm.reduceScatter(buffers[r].data(), chunk, kCount, ReduceOp::Sum,
                         {"grads", 3});
      outputs[r].assign(chunk, chunk + kCount);
    } else {
      outputs[r].assign(kCount, T(-7));
      comm.reduceScatter(inputs[r].data(), outputs[r].data(), kCount,
                         ReduceOp::Sum, {"grads", 3});
    }
  });
  for (int r = 0; r < n; ++r)
    EXPECT_TRUE(sameBits(
        outputs[r], serialReduce(inputs, ReduceOp::Sum, r * kCount, kCount)))
        << "rank " << r;
}

TEST_P(CommCollectiveTest, ReduceScatterGivesRankRChunkROfTheSum) {
  checkReduceScatter<float>(GetParam(), false);
  checkReduceScatter<double>(GetParam(), false);
  checkReduceScatter<float>(GetParam(), true);
}

template <typename T> void checkAllGather(int n, bool inPlace) {
  std::vector<std::vector<T>> inputs(n), outputs(n);
  for (int r = 0; r < n; ++r)
    inputs[r] = contribution<T>(r, kCount, 3);
  InProcessWorld world(n);
  runAll(world, [&](Communicator &comm) {
    int r = comm.rank();
    outputs[r].assign(kCount * n, T(-7));
    const T *send = inputs[r].data();
    if (inPlace) {
      std::copy(inputs[r].begin(), inputs[r].end(),
                outputs[r].begin() + r * kCount);
      send = outputs[r].data() + r * kCount;
    }
    comm.allGather(send, outputs[r].data(), kCount, {"activations", 3});
  });
  std::vector<T> expected;
  for (int r = 0; r < n; ++r)
    expected.insert(expected.end(), inputs[r].begin(), inputs[r].end());
  for (int r = 0; r < n; ++r)
    EXPECT_TRUE(sameBits(outputs[r], expected)) << "rank " << r;
}

TEST_P(CommCollectiveTest, AllGatherConcatenatesInRankOrder) {
  checkAllGather<float>(GetParam(), false);
  checkAllGather<double>(GetParam(), false);
  checkAllGather<double>(GetParam(), true);
}

TEST_P(CommCollectiveTest, BroadcastFromEveryRoot) {
  int n = GetParam();
  for (int root = 0; root < n; ++root) {
    std::vector<std::vector<double>> buffers(n);
    InProcessWorld world(n);
    runAll(world, [&](Communicator &comm) {
      int r = comm.rank();
      buffers[r] = contribution<double>(r, kCount, 4);
      comm.broadcast(buffers[r].data(), kCount, root, {"initial weights", 0});
    });
    std::vector<double> expected = contribution<double>(root, kCount, 4);
    for (int r = 0; r < n; ++r)
      EXPECT_TRUE(sameBits(buffers[r], expected))
          << "rank " << r << " root " << root;
  }
}

TEST_P(CommCollectiveTest, BarrierWaitsForEveryRank) {
  int n = GetParam();
  std::vector<std::atomic<int>> arrived(n);
  std::vector<int> seen(n, 0);
  InProcessWorld world(n);
  runAll(world, [&](Communicator &comm) {
    arrived[comm.rank()].store(1);
    comm.barrier({"after setup", -1});
    for (int r = 0; r < n; ++r)
      seen[comm.rank()] += arrived[r].load();
  });
  for (int r = 0; r < n; ++r)
    EXPECT_EQ(seen[r], n) << "rank " << r;
}

TEST_P(CommCollectiveTest, EmptyBuffersAreFine) {
  int n = GetParam();
  InProcessWorld world(n);
  runAll(world, [&](Communicator &comm) {
    comm.allReduce<float>(nullptr, nullptr, 0, ReduceOp::Sum, {"empty", 0});
    comm.allGather<float>(nullptr, nullptr, 0, {"empty", 0});
    comm.reduceScatter<double>(nullptr, nullptr, 0, ReduceOp::Sum,
                               {"empty", 0});
    comm.broadcast<double>(nullptr, 0, n - 1, {"empty", 0});
  });
}

TEST_P(CommCollectiveTest, RankAndSizeAndName) {
  int n = GetParam();
  std::vector<std::string> names(n);
  std::vector<int> ranks(n, -1), sizes(n, -1);
  InProcessWorld world(n);
  runAll(world, [&](Communicator &comm) {
    ranks[comm.worldRank()] = comm.rank();
    sizes[comm.rank()] = comm.size();
    names[comm.rank()] = comm.name();
  });
  std::string expected = n == 1   ? "world[0]"
                         : n == 2 ? "world[0,1]"
                                  : "world[0-" + std::to_string(n - 1) + "]";
  for (int r = 0; r < n; ++r) {
    EXPECT_EQ(ranks[r], r);
    EXPECT_EQ(sizes[r], n);
    EXPECT_EQ(names[r], expected);
  }
}

INSTANTIATE_TEST_SUITE_P(Ranks, CommCollectiveTest,
                         ::testing::Values(1, 2, 3, 4, 8),
                         [](const ::testing::TestParamInfo<int> &info) {
                           return std::to_string(info.param) + "ranks";
                         });

TEST(CommReduceTest, MaxPropagatesNaNAndKeepsTheFirstOfEqualValues) {
  std::vector<std::vector<float>> inputs = {
      {1.0f, -0.0f, 2.0f}, {NAN, 0.0f, 3.0f}, {5.0f, 0.0f, -1.0f}};
  std::vector<std::vector<float>> outputs(3, std::vector<float>(3));
  InProcessWorld world(3);
  runAll(world, [&](Communicator &comm) {
    int r = comm.rank();
    comm.allReduce(inputs[r].data(), outputs[r].data(), 3, ReduceOp::Max,
                   {"max", 0});
  });
  for (int r = 0; r < 3; ++r) {
    EXPECT_TRUE(std::isnan(outputs[r][0]));
    EXPECT_TRUE(std::signbit(outputs[r][1])) << "rank 0's -0 comes first";
    EXPECT_EQ(outputs[r][2], 3.0f);
  }
}

TEST(CommReduceTest, SumStartsFromTheFirstContributionSoMinusZeroStays) {
  std::vector<std::vector<double>> inputs = {{-0.0}, {-0.0}};
  std::vector<std::vector<double>> outputs(2, std::vector<double>(1, 1.0));
  InProcessWorld world(2);
  runAll(world, [&](Communicator &comm) {
    int r = comm.rank();
    comm.allReduce(inputs[r].data(), outputs[r].data(), 1, ReduceOp::Sum,
                   {"sum", 0});
  });
  EXPECT_TRUE(std::signbit(outputs[0][0]));
  EXPECT_TRUE(std::signbit(outputs[1][0]));
}

// Four ranks add (x0 + x1) + (x2 + x3), the top of the host kernels'
// canonical tree; left to right would give 1 here.
TEST(CommReduceTest, FourRanksSumAsABalancedTree) {
  const float tiny = std::ldexp(1.0f, -24);
  std::vector<float> inputs = {1.0f, tiny, tiny, tiny};
  std::vector<float> outputs(4, 0.0f);
  InProcessWorld world(4);
  runAll(world, [&](Communicator &comm) {
    int r = comm.rank();
    comm.allReduce(&inputs[r], &outputs[r], 1, ReduceOp::Sum, {"sum", 0});
  });
  for (int r = 0; r < 4; ++r)
    EXPECT_EQ(outputs[r], 1.0f + 2 * tiny) << "rank " << r;
}

} // namespace
