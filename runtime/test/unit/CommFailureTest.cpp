// Tests of communicator failures: mismatches, timeouts, aborts, deadlocks.
#include "comm/InProcessWorld.h"
#include "comm/RunRanks.h"

#include "gtest/gtest.h"

#include <chrono>
#include <string>
#include <thread>
#include <vector>

using namespace mtrt;
using namespace mtrt::comm;

#define EXPECT_CONTAINS(text, part)                                            \
  EXPECT_NE(std::string(text).find(part), std::string::npos)                   \
      << "  which is: " << (text)
#define EXPECT_STARTS_WITH(text, prefix)                                       \
  EXPECT_EQ(std::string(text).rfind(prefix, 0), 0u) << "  which is: " << (text)

namespace {

using Clock = std::chrono::steady_clock;

/// What each rank threw: its code (OK if it returned) and message.
struct Outcome {
  std::vector<mtrt_status_code_t> codes;
  std::vector<std::string> messages;
  std::string reason;
  double seconds = 0;
};

Outcome run(InProcessWorld &world,
            const std::function<void(Communicator &)> &fn) {
  Outcome outcome;
  Clock::time_point start = Clock::now();
  std::vector<std::exception_ptr> errors = runRanks(world, fn);
  outcome.seconds = std::chrono::duration<double>(Clock::now() - start).count();
  for (std::exception_ptr &error : errors) {
    outcome.codes.push_back(MTRT_STATUS_OK);
    outcome.messages.emplace_back();
    if (!error)
      continue;
    try {
      std::rethrow_exception(error);
    } catch (const Error &e) {
      outcome.codes.back() = e.code();
      outcome.messages.back() = e.what();
    } catch (const std::exception &e) {
      outcome.codes.back() = MTRT_STATUS_UNKNOWN;
      outcome.messages.back() = e.what();
    }
  }
  outcome.reason = world.abortReason();
  return outcome;
}

InProcessOptions timeoutOf(int milliseconds) {
  InProcessOptions options;
  options.timeout = std::chrono::milliseconds(milliseconds);
  return options;
}

void sleepFor(int milliseconds) {
  std::this_thread::sleep_for(std::chrono::milliseconds(milliseconds));
}

TEST(CommMismatchTest, DifferentOperations) {
  InProcessWorld world(2);
  Outcome o = run(world, [](Communicator &comm) {
    std::vector<float> a(64), b(128);
    comm.barrier({"start", 7});
    if (comm.rank() == 0)
      comm.allReduce(a.data(), a.data(), 64, ReduceOp::Sum,
                     {"all_reduce tp grads of linear 12", 7});
    else
      comm.allGather(a.data(), b.data(), 64,
                     {"all_gather sp input of linear 12", 7});
  });
  EXPECT_EQ(o.reason,
            "mismatched collectives: rank 0 called all_reduce sum of 64 f32 "
            "(\"all_reduce tp grads of linear 12\", step 7), rank 1 called "
            "all_gather of 64 f32 per rank (\"all_gather sp input of linear "
            "12\", step 7) at collective #2 of group world[0,1]");
  for (int r = 0; r < 2; ++r) {
    EXPECT_EQ(o.codes[r], MTRT_STATUS_ABORTED) << o.messages[r];
    EXPECT_CONTAINS(o.messages[r], (o.reason));
  }
}

TEST(CommMismatchTest, DifferentCountsListRanksThatAgreeTogether) {
  InProcessWorld world(3);
  Outcome o = run(world, [](Communicator &comm) {
    std::vector<float> a(64);
    int64_t count = comm.rank() == 2 ? 32 : 64;
    comm.allReduce(a.data(), a.data(), count, ReduceOp::Sum, {"grads", 3});
  });
  EXPECT_EQ(o.reason, "mismatched collectives: ranks 0, 1 called all_reduce "
                      "sum of 64 f32 (\"grads\", step 3), rank 2 called "
                      "all_reduce sum of 32 f32 (\"grads\", step 3) at "
                      "collective #1 of group world[0-2]");
  for (int r = 0; r < 3; ++r)
    EXPECT_EQ(o.codes[r], MTRT_STATUS_ABORTED);
}

TEST(CommMismatchTest, DifferentDTypes) {
  InProcessWorld world(2);
  Outcome o = run(world, [](Communicator &comm) {
    std::vector<float> f(8);
    std::vector<double> d(8);
    if (comm.rank() == 0)
      comm.allReduce(f.data(), f.data(), 8, ReduceOp::Sum, {"loss", 1});
    else
      comm.allReduce(d.data(), d.data(), 8, ReduceOp::Sum, {"loss", 1});
  });
  EXPECT_EQ(o.reason, "mismatched collectives: rank 0 called all_reduce sum "
                      "of 8 f32 (\"loss\", step 1), rank 1 called all_reduce "
                      "sum of 8 f64 (\"loss\", step 1) at collective #1 of "
                      "group world[0,1]");
}

TEST(CommMismatchTest, DifferentRootsAndReduceOps) {
  InProcessWorld roots(2);
  Outcome o = run(roots, [](Communicator &comm) {
    std::vector<float> a(4);
    comm.broadcast(a.data(), 4, comm.rank(), {"weights", 0});
  });
  EXPECT_CONTAINS(o.reason, ("rank 0 called broadcast of 4 f32 from "
                             "rank 0 (\"weights\", step 0), rank 1 "
                             "called broadcast of 4 f32 from rank 1"));
  InProcessWorld ops(2);
  o = run(ops, [](Communicator &comm) {
    float x = 1;
    comm.allReduce(&x, &x, 1, comm.rank() ? ReduceOp::Max : ReduceOp::Sum,
                   {"logits max", 2});
  });
  EXPECT_CONTAINS(o.reason, ("rank 0 called all_reduce sum of 1 f32 "
                             "(\"logits max\", step 2), rank 1 called "
                             "all_reduce max of 1 f32"));
}

TEST(CommMismatchTest, InsideASubGroupNamesTheGroupAndWorldRanks) {
  InProcessWorld world(4);
  Outcome o = run(world, [](Communicator &comm) {
    int r = comm.rank();
    auto tp = comm.split(r / 2, r, "tp", {"split", -1});
    std::vector<float> a(16), b(32);
    if (r == 3)
      tp->allGather(a.data(), b.data(), 16, {"gather", 5});
    else
      tp->allReduce(a.data(), a.data(), 16, ReduceOp::Sum, {"reduce", 5});
  });
  EXPECT_EQ(o.reason, "mismatched collectives: rank 2 called all_reduce sum "
                      "of 16 f32 (\"reduce\", step 5), rank 3 called "
                      "all_gather of 16 f32 per rank (\"gather\", step 5) at "
                      "collective #1 of group tp[2,3]");
  // Ranks 0 and 1 agreed, but the world is aborted: they fail too, or
  // finish if their all_reduce completed first.
  EXPECT_EQ(o.codes[2], MTRT_STATUS_ABORTED);
  EXPECT_EQ(o.codes[3], MTRT_STATUS_ABORTED);
}

TEST(CommMismatchTest, MessagesOfDifferentSizes) {
  InProcessWorld world(2);
  Outcome o = run(world, [](Communicator &comm) {
    std::vector<float> a(8);
    if (comm.rank() == 0)
      comm.send(a.data(), 8, 1, {"activations", 4});
    else
      comm.recv(a.data(), 4, 0, {"activations", 4});
  });
  EXPECT_EQ(o.reason, "mismatched messages: rank 0 sent send of 8 f32 to "
                      "rank 1 (\"activations\", step 4), rank 1 received "
                      "with recv of 4 f32 from rank 0 (\"activations\", "
                      "step 4) at message #1 from rank 0 to rank 1 of group "
                      "world[0,1]");
  EXPECT_EQ(o.codes[0], MTRT_STATUS_ABORTED);
  EXPECT_EQ(o.codes[1], MTRT_STATUS_ABORTED);
}

TEST(CommTimeoutTest, NamesTheMissingRankTheCallAndTheStep) {
  InProcessWorld world(3, timeoutOf(200));
  Outcome o = run(world, [](Communicator &comm) {
    std::vector<float> a(64);
    comm.barrier({"start", 5});
    if (comm.rank() == 2)
      sleepFor(1000); // A rank stuck computing.
    comm.allReduce(a.data(), a.data(), 64, ReduceOp::Sum,
                   {"all_reduce dp grads", 5});
  });
  EXPECT_STARTS_WITH(o.reason, ("timeout: rank "));
  EXPECT_CONTAINS(o.reason,
                  ("s (the limit is 0.2 s) in all_reduce sum of 64 f32 "
                   "(\"all_reduce dp grads\", step 5) at collective #2 "
                   "of group world[0-2] for rank 2; rank 2 is not in a "
                   "communicator call; its last was barrier at "
                   "collective #1 of group world[0-2]"));
  for (int r = 0; r < 3; ++r)
    EXPECT_EQ(o.codes[r], MTRT_STATUS_ABORTED) << o.messages[r];
  // Rank 2's late call fails at once rather than waiting.
  EXPECT_CONTAINS(o.messages[2], ("was not run: the world was aborted"));
  EXPECT_LT(o.seconds, 5.0);
}

TEST(CommTimeoutTest, InARecvNamesTheSender) {
  InProcessWorld world(2, timeoutOf(100));
  Outcome o = run(world, [](Communicator &comm) {
    std::vector<float> a(8);
    if (comm.rank() == 0) {
      sleepFor(600);
      comm.send(a.data(), 8, 1, {"activations", 2});
    } else {
      comm.recv(a.data(), 8, 0, {"activations", 2});
    }
  });
  EXPECT_STARTS_WITH(o.reason, ("timeout: rank 1 waited 0.1"));
  EXPECT_CONTAINS(o.reason,
                  ("in recv of 8 f32 from rank 0 (\"activations\", step "
                   "2) at message #1 from rank 0 of group world[0,1] "
                   "for rank 0; rank 0 has made no communicator call "
                   "yet"));
  EXPECT_EQ(o.codes[1], MTRT_STATUS_ABORTED);
  EXPECT_EQ(o.codes[0], MTRT_STATUS_ABORTED);
}

TEST(CommAbortTest, OneRankReleasesTheOthers) {
  InProcessWorld world(4); // Default timeout: 60 s.
  Outcome o = run(world, [](Communicator &comm) {
    std::vector<double> a(16);
    if (comm.rank() == 3) {
      sleepFor(50);
      comm.abort("loss is NaN at step 3");
      // Later calls fail at once, on the aborting rank too.
      comm.barrier({"after abort", 3});
    }
    comm.allReduce(a.data(), a.data(), 16, ReduceOp::Sum, {"grads", 3});
  });
  EXPECT_EQ(o.reason, "rank 3 aborted: loss is NaN at step 3");
  EXPECT_LT(o.seconds, 5.0);
  for (int r = 0; r < 3; ++r) {
    // "was aborted" while waiting, or "was not run" if this rank came late.
    EXPECT_EQ(o.codes[r], MTRT_STATUS_ABORTED);
    EXPECT_STARTS_WITH(o.messages[r],
                       "rank " + std::to_string(r) +
                           ": all_reduce sum of 16 f64 (\"grads\", step 3) "
                           "at collective #1 of group world[0-3] was ");
    EXPECT_CONTAINS(o.messages[r], "aborted: rank 3 aborted: loss is NaN at "
                                   "step 3");
  }
  EXPECT_EQ(o.messages[3],
            "rank 3: barrier (\"after abort\", step 3) at collective #1 of "
            "group world[0-3] was not run: the world was aborted: rank 3 "
            "aborted: loss is NaN at step 3");
}

TEST(CommAbortTest, ARankThatThrowsReleasesTheOthers) {
  InProcessWorld world(3);
  Outcome o = run(world, [](Communicator &comm) {
    std::vector<float> a(4), b(12);
    if (comm.rank() == 1)
      throw std::runtime_error("cannot read batch 17");
    comm.allGather(a.data(), b.data(), 4, {"gather", 0});
  });
  EXPECT_EQ(o.reason, "rank 1 aborted: cannot read batch 17");
  EXPECT_EQ(o.codes[1], MTRT_STATUS_UNKNOWN);
  EXPECT_EQ(o.codes[0], MTRT_STATUS_ABORTED);
  EXPECT_EQ(o.codes[2], MTRT_STATUS_ABORTED);
  EXPECT_LT(o.seconds, 5.0);
}

TEST(CommAbortTest, EveryKindOfCallFailsAfterAnAbort) {
  InProcessWorld world(2);
  world.abort("operator stopped the run");
  std::vector<int> failures(2, 0);
  run(world, [&](Communicator &comm) {
    float x = 0, y[2] = {0, 0};
    int peer = 1 - comm.rank();
    std::vector<std::function<void()>> calls = {
        [&] {
          comm.allReduce(&x, &x, 1, ReduceOp::Sum, {"a", 0});
        },
        [&] {
          comm.allGather(&x, y, 1, {"b", 0});
        },
        [&] {
          comm.reduceScatter(y, &x, 1, ReduceOp::Sum, {"c", 0});
        },
        [&] {
          comm.broadcast(&x, 1, 0, {"d", 0});
        },
        [&] {
          comm.send(&x, 1, peer, {"e", 0});
        },
        [&] {
          comm.recv(&x, 1, peer, {"f", 0});
        },
        [&] {
          comm.sendRecv(&x, peer, y, peer, 1, {"g", 0});
        },
        [&] {
          comm.barrier({"h", 0});
        },
        [&] {
          comm.split(0, 0, "x", {"i", 0});
        },
    };
    for (auto &call : calls) {
      try {
        call();
      } catch (const Error &e) {
        failures[comm.rank()] +=
            e.code() == MTRT_STATUS_ABORTED &&
            std::string(e.what()).find("operator stopped the run") !=
                std::string::npos;
      }
    }
  });
  EXPECT_EQ(failures, (std::vector<int>{9, 9}));
}

TEST(CommDeadlockTest, GroupsCalledInACycleFailAtOnce) {
  // tp 2 x dp 2; ranks 0 and 3 start with dp, ranks 1 and 2 with tp:
  // 0 waits for 2 (dp), 2 for 3 (tp), 3 for 1 (dp), 1 for 0 (tp).
  InProcessWorld world(4); // Default timeout: 60 s.
  Outcome o = run(world, [](Communicator &comm) {
    int r = comm.rank();
    auto tp = comm.split(r / 2, r, "tp", {"split tp", -1});
    auto dp = comm.split(r % 2, r, "dp", {"split dp", -1});
    float x = 1;
    bool dpFirst = r == 0 || r == 3;
    for (int i = 0; i < 2; ++i) {
      if (dpFirst == (i == 0))
        dp->allReduce(&x, &x, 1, ReduceOp::Sum, {"dp grads", 9});
      else
        tp->allReduce(&x, &x, 1, ReduceOp::Sum, {"tp partials", 9});
    }
  });
  EXPECT_LT(o.seconds, 5.0);
  EXPECT_STARTS_WITH(o.reason, ("deadlock: rank "));
  EXPECT_CONTAINS(o.reason, ("rank 0 waits in all_reduce sum of 1 f32 "
                             "(\"dp grads\", step 9) at collective #1 of "
                             "group dp[0,2] for rank 2"));
  EXPECT_CONTAINS(o.reason, ("rank 1 waits in all_reduce sum of 1 f32 "
                             "(\"tp partials\", step 9) at collective "
                             "#1 of group tp[0,1] for rank 0"));
  EXPECT_CONTAINS(o.reason, ("(a cycle: none of them can go on)"));
  for (int r = 0; r < 4; ++r)
    EXPECT_EQ(o.codes[r], MTRT_STATUS_ABORTED);
}

TEST(CommDeadlockTest, TwoBlockingSendsFailAtOnce) {
  InProcessWorld world(2);
  Outcome o = run(world, [](Communicator &comm) {
    std::vector<float> out(4), in(4);
    int peer = 1 - comm.rank();
    comm.send(out.data(), 4, peer, {"exchange", 1});
    comm.recv(in.data(), 4, peer, {"exchange", 1});
  });
  EXPECT_LT(o.seconds, 5.0);
  EXPECT_STARTS_WITH(o.reason, ("deadlock: rank "));
  EXPECT_CONTAINS(o.reason, ("rank 0 waits in send of 4 f32 to rank 1 "
                             "(\"exchange\", step 1) at message #1 to "
                             "rank 1 of group world[0,1] for rank 1"));
  EXPECT_CONTAINS(o.reason, ("rank 1 waits in send of 4 f32 to rank 0"));
}

TEST(CommDeadlockTest, ACollectiveAgainstARecvFailsAtOnce) {
  InProcessWorld world(2);
  Outcome o = run(world, [](Communicator &comm) {
    float x = 0;
    if (comm.rank() == 0)
      comm.allReduce(&x, &x, 1, ReduceOp::Sum, {"loss", 2});
    else
      comm.recv(&x, 1, 0, {"activations", 2});
  });
  EXPECT_LT(o.seconds, 5.0);
  EXPECT_STARTS_WITH(o.reason, ("deadlock: "));
  EXPECT_CONTAINS(o.reason, ("waits in recv of 1 f32 from rank 0"));
  EXPECT_CONTAINS(o.reason, ("waits in all_reduce sum of 1 f32"));
}

TEST(CommDeadlockTest, WaitingForAFinishedRankFailsAtOnce) {
  InProcessWorld world(2);
  Outcome o = run(world, [](Communicator &comm) {
    if (comm.rank() == 1)
      return; // Forgot the last all_reduce.
    float x = 0;
    comm.allReduce(&x, &x, 1, ReduceOp::Sum, {"final loss", 10});
  });
  EXPECT_LT(o.seconds, 5.0);
  EXPECT_EQ(o.reason, "deadlock: rank 0 waits in all_reduce sum of 1 f32 "
                      "(\"final loss\", step 10) at collective #1 of group "
                      "world[0,1] for rank 1; rank 1 has finished and makes "
                      "no more calls");
  EXPECT_EQ(o.codes[0], MTRT_STATUS_ABORTED);
  EXPECT_EQ(o.codes[1], MTRT_STATUS_OK);
}

/// A bad argument fails on its rank with INVALID_ARGUMENT and aborts the
/// others, which would otherwise wait for it.
void expectRejected(const std::function<void(Communicator &)> &bad,
                    const std::string &message) {
  InProcessWorld world(2);
  Outcome o = run(world, [&](Communicator &comm) {
    float x[2] = {0, 0};
    if (comm.rank() == 1)
      bad(comm);
    else
      comm.allReduce(x, x, 2, ReduceOp::Sum, {"other", 0});
  });
  EXPECT_EQ(o.codes[1], MTRT_STATUS_INVALID_ARGUMENT) << o.messages[1];
  EXPECT_EQ(o.messages[1], message);
  EXPECT_EQ(o.codes[0], MTRT_STATUS_ABORTED) << o.messages[0];
  EXPECT_EQ(o.reason, "rank 1 aborted: " + message.substr(8));
  EXPECT_CONTAINS(o.messages[0], (o.reason));
}

TEST(CommArgumentTest, BadArgumentsAreRejectedWithTheValue) {
  float x[2] = {0, 0};
  expectRejected(
      [&](Communicator &c) {
        c.broadcast(x, 2, 2, {"weights", 0});
      },
      "rank 1: broadcast of 2 f32 from group rank 2 (\"weights\", "
      "step 0) in group world[0,1]: root 2 is not a rank of the group (0 to "
      "1)");
  expectRejected(
      [&](Communicator &c) {
        c.allReduce(x, x, -1, ReduceOp::Sum, {"grads", 1});
      },
      "rank 1: all_reduce sum of -1 f32 (\"grads\", step 1) in group "
      "world[0,1]: count -1 is negative");
  expectRejected(
      [&](Communicator &c) {
        c.allGather(x, static_cast<float *>(nullptr), 1, {"params", 2});
      },
      "rank 1: all_gather of 1 f32 per rank (\"params\", step 2) in group "
      "world[0,1]: the receive buffer is null");
  expectRejected(
      [&](Communicator &c) {
        c.allReduce(x, x, 1, DType::BF16, ReduceOp::Sum, {"grads", 3});
      },
      "rank 1: all_reduce sum of 1 bf16 (\"grads\", step 3) in group "
      "world[0,1]: dtype bf16 is not supported by this communicator (it "
      "takes f32, f64)");
  expectRejected(
      [&](Communicator &c) {
        c.send(x, 1, 1, {"self", 4});
      },
      "rank 1: send of 1 f32 to rank 1 (\"self\", step 4) in group "
      "world[0,1]: a send with itself never completes; use sendRecv to copy "
      "to the same rank");
  expectRejected(
      [&](Communicator &c) {
        c.split(-3, 0, "tp", {"split", -1});
      },
      "rank 1: split into \"tp\" with color -3, key 0 (\"split\") in group "
      "world[0,1]: color -3 is negative; use a color >= 0, or "
      "Communicator::kNoColor (-1) to join no group");
}

TEST(CommArgumentTest, WorldMisuse) {
  EXPECT_THROW(InProcessWorld(0), Error);
  InProcessWorld world(2);
  EXPECT_THROW(world.communicator(2), Error);
  auto first = world.communicator(0);
  try {
    world.communicator(0);
    ADD_FAILURE() << "a second communicator for rank 0 was handed out";
  } catch (const Error &e) {
    EXPECT_EQ(e.code(), MTRT_STATUS_FAILED_PRECONDITION);
    EXPECT_CONTAINS(e.what(), ("rank 0's communicator was already "
                               "taken"));
  }
}

} // namespace

namespace {

// sendAsync (pipeline schedules): the sender goes on at once, so the
// exchange that deadlocks with blocking sends completes; messages keep
// their per-pair order, also mixed with blocking sends; a receive that
// disagrees with a queued message is a mismatch; a receive whose message
// is never sent is a deadlock.

TEST(CommSendAsyncTest, AsyncSendsDoNotWaitAndKeepTheirOrder) {
  InProcessWorld world(2);
  std::vector<std::vector<float>> received(2);
  Outcome o = run(world, [&](Communicator &comm) {
    int peer = 1 - comm.rank();
    float first = 10.0f * comm.rank() + 1, second = first + 1,
          third = first + 2;
    comm.sendAsync(&first, 1, peer, {"first", 1});
    first = -1; // the buffer may be reused at once
    comm.sendAsync(&second, 1, peer, {"second", 1});
    float got[3];
    comm.recv(&got[0], 1, peer, {"first", 1});
    comm.recv(&got[1], 1, peer, {"second", 1});
    // A blocking send after the queued ones arrives after them.
    if (comm.rank() == 0)
      comm.send(&third, 1, peer, {"third", 1});
    else
      comm.recv(&got[2], 1, peer, {"third", 1});
    received[comm.rank()].assign(got, got + (comm.rank() == 0 ? 2 : 3));
  });
  EXPECT_EQ(o.reason, "");
  EXPECT_EQ(received[0], (std::vector<float>{11, 12}));
  EXPECT_EQ(received[1], (std::vector<float>{1, 2, 3}));
}

TEST(CommSendAsyncTest, AQueuedMessageOfAnotherSizeIsAMismatch) {
  InProcessWorld world(2);
  Outcome o = run(world, [](Communicator &comm) {
    std::vector<float> buffer(4);
    if (comm.rank() == 0)
      comm.sendAsync(buffer.data(), 4, 1, {"activation", 3});
    else
      comm.recv(buffer.data(), 2, 0, {"activation", 3});
  });
  EXPECT_CONTAINS(o.reason, ("mismatched messages: rank 0 sent send_async of "
                             "4 f32 to rank 1 (\"activation\", step 3), rank 1 "
                             "received with recv of 2 f32 from rank 0"));
}

TEST(CommSendAsyncTest, ARecvWithoutItsSendIsADeadlock) {
  InProcessWorld world(2);
  Outcome o = run(world, [](Communicator &comm) {
    float x = 0;
    int peer = 1 - comm.rank();
    comm.sendAsync(&x, 1, peer, {"activation", 1});
    comm.recv(&x, 1, peer, {"activation", 1});
    comm.recv(&x, 1, peer, {"gradient", 1});
  });
  EXPECT_LT(o.seconds, 5.0);
  EXPECT_STARTS_WITH(o.reason, ("deadlock: rank "));
  EXPECT_CONTAINS(o.reason, ("waits in recv of 1 f32 from rank"));
}

} // namespace
