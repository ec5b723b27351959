// Tests of split groups (tp/dp/pp), send/recv and rings, and long runs.
#include "comm/InProcessWorld.h"
#include "comm/RunRanks.h"

#include "gtest/gtest.h"

#include <cstring>
#include <string>
#include <vector>

using namespace mtrt;
using namespace mtrt::comm;

namespace {

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

/// A value that depends on the world rank and the index, with low bits that
/// make float sums depend on their order.
float value(int worldRank, int64_t i) {
  return (1.0f + 0.001f * i) * (worldRank % 2 ? -1.0f : 1.0f) *
             static_cast<float>(1 << (worldRank * 3 % 23)) +
         0.1f * static_cast<float>(worldRank + 1);
}

std::vector<float> values(int worldRank, int64_t count) {
  std::vector<float> v(count);
  for (int64_t i = 0; i < count; ++i)
    v[i] = value(worldRank, i);
  return v;
}

bool sameBits(const std::vector<float> &a, const std::vector<float> &b) {
  return a.size() == b.size() &&
         std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

/// World 8 = tp 2 x dp 4, Megatron-LM's order: tensor-parallel ranks are
/// adjacent (tp fastest), so tp groups are {0,1},{2,3},... and dp groups
/// {0,2,4,6},{1,3,5,7}.
TEST(CommSplitTest, TensorAndDataParallelGroupsInMegatronOrder) {
  constexpr int kWorld = 8, kTp = 2;
  constexpr int64_t kCount = 16;
  struct Seen {
    int tpRank = -1, tpSize = -1, dpRank = -1, dpSize = -1;
    std::string tpName, dpName;
    std::vector<float> tpSum, dpGathered, dpScattered;
  };
  std::vector<Seen> seen(kWorld);
  InProcessWorld world(kWorld);
  runAll(world, [&](Communicator &comm) {
    int r = comm.rank();
    auto tp = comm.split(r / kTp, r, "tp", {"make tp groups", -1});
    auto dp = comm.split(r % kTp, r, "dp", {"make dp groups", -1});
    Seen &s = seen[r];
    s.tpRank = tp->rank();
    s.tpSize = tp->size();
    s.dpRank = dp->rank();
    s.dpSize = dp->size();
    s.tpName = tp->name();
    s.dpName = dp->name();
    std::vector<float> mine = values(r, kCount);
    s.tpSum.resize(kCount);
    tp->allReduce(mine.data(), s.tpSum.data(), kCount, ReduceOp::Sum,
                  {"all_reduce tp partial sums", 1});
    s.dpGathered.resize(kCount * dp->size());
    dp->allGather(mine.data(), s.dpGathered.data(), kCount,
                  {"all_gather dp params", 1});
    std::vector<float> big = values(r, kCount * dp->size());
    s.dpScattered.resize(kCount);
    dp->reduceScatter(big.data(), s.dpScattered.data(), kCount, ReduceOp::Sum,
                      {"reduce_scatter dp grads", 1});
  });
  for (int r = 0; r < kWorld; ++r) {
    const Seen &s = seen[r];
    int tpFirst = r - r % kTp;
    EXPECT_EQ(s.tpRank, r % kTp);
    EXPECT_EQ(s.tpSize, kTp);
    EXPECT_EQ(s.dpRank, r / kTp);
    EXPECT_EQ(s.dpSize, kWorld / kTp);
    EXPECT_EQ(s.tpName, "tp[" + std::to_string(tpFirst) + "," +
                            std::to_string(tpFirst + 1) + "]");
    EXPECT_EQ(s.dpName, r % 2 ? "dp[1,3,5,7]" : "dp[0,2,4,6]");

    std::vector<float> tpSum = values(tpFirst, kCount);
    for (int64_t i = 0; i < kCount; ++i)
      tpSum[i] = tpSum[i] + value(tpFirst + 1, i);
    EXPECT_TRUE(sameBits(s.tpSum, tpSum)) << "rank " << r;

    std::vector<float> gathered, scattered(kCount);
    for (int q = r % kTp; q < kWorld; q += kTp) {
      std::vector<float> v = values(q, kCount);
      gathered.insert(gathered.end(), v.begin(), v.end());
    }
    EXPECT_TRUE(sameBits(s.dpGathered, gathered)) << "rank " << r;
    for (int64_t i = 0; i < kCount; ++i) {
      // The four data ranks' contributions, added as the rank tree adds them.
      int64_t at = s.dpRank * kCount + i;
      int q = r % kTp;
      scattered[i] = (value(q, at) + value(q + kTp, at)) +
                     (value(q + 2 * kTp, at) + value(q + 3 * kTp, at));
    }
    EXPECT_TRUE(sameBits(s.dpScattered, scattered)) << "rank " << r;
  }
}

/// tp 2 x dp 2 x pp 2 (rank = tp + 2 * (dp + 2 * pp)): activations go from
/// stage 0 to stage 1 of each pipeline and gradients come back.
TEST(CommSplitTest, PipelineGroupsPassActivationsAndGradients) {
  constexpr int kWorld = 8, kTp = 2, kDp = 2;
  std::vector<std::string> ppNames(kWorld);
  std::vector<std::vector<float>> received(kWorld);
  InProcessWorld world(kWorld);
  runAll(world, [&](Communicator &comm) {
    int r = comm.rank();
    int stage = r / (kTp * kDp);
    auto pp = comm.split(r % (kTp * kDp), stage, "pp", {"make pp groups", -1});
    ppNames[r] = pp->name();
    std::vector<float> out = values(r, 8), in(8);
    if (pp->rank() == 0) {
      pp->send(out.data(), 8, 1, {"send activations", 4});
      pp->recv(in.data(), 8, 1, {"recv gradients", 4});
    } else {
      pp->recv(in.data(), 8, 0, {"recv activations", 4});
      pp->send(out.data(), 8, 0, {"send gradients", 4});
    }
    received[r] = in;
  });
  for (int r = 0; r < kWorld; ++r) {
    int peer = r < 4 ? r + 4 : r - 4;
    EXPECT_EQ(ppNames[r], "pp[" + std::to_string(std::min(r, peer)) + "," +
                              std::to_string(std::max(r, peer)) + "]");
    EXPECT_TRUE(sameBits(received[r], values(peer, 8))) << "rank " << r;
  }
}

TEST(CommSplitTest, KeysOrderTheNewGroupAndNoColorGetsNone) {
  constexpr int kWorld = 5;
  std::vector<int> ranks(kWorld, -2);
  std::vector<std::string> names(kWorld);
  std::vector<std::vector<float>> gathered(kWorld);
  InProcessWorld world(kWorld);
  runAll(world, [&](Communicator &comm) {
    int r = comm.rank();
    // Rank 2 stays out; the others are ordered by descending world rank.
    auto group = comm.split(r == 2 ? Communicator::kNoColor : 7, -r, "rev",
                            {"split", -1});
    if (!group)
      return;
    ranks[r] = group->rank();
    names[r] = group->name();
    float mine = static_cast<float>(r);
    gathered[r].resize(group->size());
    group->allGather(&mine, gathered[r].data(), 1, {"gather", 0});
  });
  EXPECT_EQ(ranks, (std::vector<int>{3, 2, -2, 1, 0}));
  for (int r : {0, 1, 3, 4}) {
    EXPECT_EQ(names[r], "rev[4,3,1,0]");
    EXPECT_EQ(gathered[r], (std::vector<float>{4, 3, 1, 0}));
  }
}

TEST(CommSplitTest, GroupsSplitFromGroups) {
  constexpr int kWorld = 8;
  std::vector<std::string> names(kWorld);
  std::vector<float> sums(kWorld);
  InProcessWorld world(kWorld);
  runAll(world, [&](Communicator &comm) {
    int r = comm.rank();
    auto half = comm.split(r / 4, r, "half", {"split halves", -1});
    auto pair = half->split(half->rank() / 2, half->rank(), "pair",
                            {"split pairs", -1});
    names[r] = pair->name();
    float mine = static_cast<float>(r);
    pair->allReduce(&mine, &sums[r], 1, ReduceOp::Sum, {"sum pair", 0});
  });
  for (int r = 0; r < kWorld; ++r) {
    int first = r - r % 2;
    EXPECT_EQ(names[r], "pair[" + std::to_string(first) + "," +
                            std::to_string(first + 1) + "]");
    EXPECT_EQ(sums[r], static_cast<float>(2 * first + 1));
  }
}

class CommMessageTest : public ::testing::TestWithParam<int> {};

TEST_P(CommMessageTest, SendRecvPairs) {
  int n = GetParam();
  std::vector<std::vector<float>> received(n);
  InProcessWorld world(n);
  runAll(world, [&](Communicator &comm) {
    int r = comm.rank();
    std::vector<float> buffer = values(r, 5);
    if (r % 2 == 0 && r + 1 < n)
      comm.send(buffer.data(), 5, r + 1, {"pair", 0});
    else if (r % 2 == 1)
      comm.recv(buffer.data(), 5, r - 1, {"pair", 0});
    received[r] = buffer;
  });
  for (int r = 0; r < n; ++r)
    EXPECT_TRUE(sameBits(received[r], values(r % 2 ? r - 1 : r, 5)))
        << "rank " << r;
}

/// Data travels once round the ring: after n - 1 steps each rank holds the
/// block of the rank after it.
TEST_P(CommMessageTest, RingWithSendRecv) {
  int n = GetParam();
  std::vector<std::vector<float>> held(n);
  InProcessWorld world(n);
  runAll(world, [&](Communicator &comm) {
    int r = comm.rank();
    std::vector<float> block = values(r, 6), incoming(6);
    for (int step = 0; step + 1 < n; ++step) {
      comm.sendRecv(block.data(), (r + 1) % n, incoming.data(), (r + n - 1) % n,
                    6, {"ring", step});
      block.swap(incoming);
    }
    held[r] = block;
  });
  for (int r = 0; r < n; ++r)
    EXPECT_TRUE(sameBits(held[r], values((r + 1) % n, 6))) << "rank " << r;
}

/// The same ring with blocking send and recv: even ranks send first, odd
/// ranks receive first; with one rank that receives first the chain of sends
/// unwinds, for any size.
TEST_P(CommMessageTest, RingWithOrderedSendAndRecv) {
  int n = GetParam();
  if (n == 1)
    GTEST_SKIP() << "a ring of one rank sends to itself: see "
                    "SendRecvToItselfCopies";
  std::vector<std::vector<float>> got(n);
  InProcessWorld world(n);
  runAll(world, [&](Communicator &comm) {
    int r = comm.rank();
    std::vector<float> mine = values(r, 3), theirs(3);
    int next = (r + 1) % n, prev = (r + n - 1) % n;
    if (r % 2 == 0) {
      comm.send(mine.data(), 3, next, {"ring", 0});
      comm.recv(theirs.data(), 3, prev, {"ring", 0});
    } else {
      comm.recv(theirs.data(), 3, prev, {"ring", 0});
      comm.send(mine.data(), 3, next, {"ring", 0});
    }
    got[r] = theirs;
  });
  for (int r = 0; r < n; ++r)
    EXPECT_TRUE(sameBits(got[r], values((r + n - 1) % n, 3))) << "rank " << r;
}

INSTANTIATE_TEST_SUITE_P(Ranks, CommMessageTest,
                         ::testing::Values(1, 2, 3, 4, 8),
                         [](const ::testing::TestParamInfo<int> &info) {
                           return std::to_string(info.param) + "ranks";
                         });

TEST(CommMessageTest, SendRecvToItselfCopies) {
  std::vector<double> out = {1, 2, 3}, in(3);
  InProcessWorld world(1);
  runAll(world, [&](Communicator &comm) {
    comm.sendRecv(out.data(), 0, in.data(), 0, 3, {"self", 0});
  });
  EXPECT_EQ(in, out);
}

/// Thousands of small calls of every kind, on the world and on split
/// groups, with results checked: no deadlock, no stale data between calls.
TEST(CommStressTest, ThousandsOfSmallCallsInARow) {
  constexpr int kWorld = 4, kIterations = 2000;
  std::vector<int> failures(kWorld, 0);
  InProcessWorld world(kWorld);
  runAll(world, [&](Communicator &comm) {
    int r = comm.rank();
    auto tp = comm.split(r / 2, r, "tp", {"tp", -1});
    auto dp = comm.split(r % 2, r, "dp", {"dp", -1});
    int &bad = failures[r];
    for (int it = 0; it < kIterations; ++it) {
      int64_t count = 1 + it % 5;
      std::vector<double> mine(count, r + it), sum(count);
      comm.allReduce(mine.data(), sum.data(), count, ReduceOp::Sum,
                     {"world sum", it});
      double expected = 0 + 1 + 2 + 3 + 4.0 * it;
      for (double s : sum)
        bad += s != expected;
      std::vector<double> gathered(count * 2);
      tp->allGather(mine.data(), gathered.data(), count, {"tp gather", it});
      bad += gathered[0] != (r - r % 2) + it ||
             gathered[count] != (r - r % 2) + 1 + it;
      double scattered = 0;
      std::vector<double> big(2, r * 10.0 + it);
      dp->reduceScatter(big.data(), &scattered, 1, ReduceOp::Sum,
                        {"dp scatter", it});
      bad += scattered != (r % 2) * 10.0 + (r % 2 + 2) * 10.0 + 2.0 * it;
      double token = r * 1000.0 + it, from = -1;
      comm.sendRecv(&token, (r + 1) % kWorld, &from, (r + kWorld - 1) % kWorld,
                    1, {"ring", it});
      bad += from != ((r + kWorld - 1) % kWorld) * 1000.0 + it;
      if (it % 100 == 0)
        comm.barrier({"barrier", it});
    }
  });
  for (int r = 0; r < kWorld; ++r)
    EXPECT_EQ(failures[r], 0) << "rank " << r;
}

} // namespace

namespace {

// Communicator::inProcessGroupId, which cuda::PeerGroup keys the group's
// device state on: the same on every rank of a group, different between
// groups (the world and each split), never 0.
TEST(CommGroupsTest, InProcessGroupIdsNameTheGroup) {
  InProcessWorld world(4);
  std::vector<uint64_t> worldIds(4), pairIds(4);
  runAll(world, [&](Communicator &c) {
    CallInfo info{"ids", 0};
    std::unique_ptr<Communicator> pair =
        c.split(c.rank() / 2, c.rank(), "tp", info);
    worldIds[c.rank()] = c.inProcessGroupId();
    pairIds[c.rank()] = pair->inProcessGroupId();
  });
  for (int r = 0; r < 4; ++r) {
    EXPECT_NE(worldIds[r], 0u);
    EXPECT_EQ(worldIds[r], worldIds[0]);
    EXPECT_NE(pairIds[r], worldIds[0]);
  }
  EXPECT_EQ(pairIds[0], pairIds[1]);
  EXPECT_EQ(pairIds[2], pairIds[3]);
  EXPECT_NE(pairIds[0], pairIds[2]);
}

} // namespace
