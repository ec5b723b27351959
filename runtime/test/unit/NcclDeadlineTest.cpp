// The host-clock guard of NCCL calls (comm/NcclDeadline.h): no GPU needed.
#include "comm/NcclDeadline.h"

#include "gtest/gtest.h"

#include <atomic>
#include <chrono>
#include <mutex>
#include <string>
#include <thread>

using namespace mtrt::comm;
using namespace std::chrono_literals;

namespace {

struct Expiries {
  std::mutex mutex;
  std::vector<std::string> messages;
  std::chrono::steady_clock::time_point at;
  NcclDeadline::Expired callback() {
    return [this](const std::string &message) {
      std::lock_guard<std::mutex> lock(mutex);
      messages.push_back(message);
      at = std::chrono::steady_clock::now();
    };
  }
  size_t count() {
    std::lock_guard<std::mutex> lock(mutex);
    return messages.size();
  }
};

TEST(NcclDeadlineTest, AStuckCallExpiresOnceNamingTheRankCallAndStep) {
  Expiries expiries;
  auto start = std::chrono::steady_clock::now();
  {
    NcclDeadline deadline("rank 0", 200ms, 100ms, expiries.callback());
    deadline.end(deadline.begin("all_reduce done"));
    deadline.begin("all_reduce sum of 64 f32 (\"train_step: instruction 7 "
                   "(all_reduce)\", step 701) on group tp[0,1]");
    deadline.begin("a later call");
    std::this_thread::sleep_for(800ms);
  }
  ASSERT_EQ(expiries.count(), 1u) << "one message, for the oldest call";
  double seconds =
      std::chrono::duration<double>(expiries.at - start).count();
  EXPECT_GE(seconds, 0.3);
  EXPECT_LE(seconds, 0.6);
  const std::string &message = expiries.messages[0];
  EXPECT_NE(message.find("rank 0: all_reduce sum of 64 f32"), std::string::npos)
      << message;
  EXPECT_NE(message.find("step 701"), std::string::npos) << message;
  EXPECT_NE(message.find("on group tp[0,1]"), std::string::npos) << message;
  EXPECT_NE(message.find("collective timeout (0.2 s"), std::string::npos)
      << message;
}

TEST(NcclDeadlineTest, CallsThatEndInTimeNeverExpire) {
  Expiries expiries;
  {
    NcclDeadline deadline("rank 1", 150ms, 50ms, expiries.callback());
    for (int i = 0; i < 20; ++i) {
      uint64_t ticket = deadline.begin("send " + std::to_string(i));
      std::this_thread::sleep_for(20ms);
      deadline.end(ticket);
    }
    std::this_thread::sleep_for(300ms);
  }
  EXPECT_EQ(expiries.count(), 0u);
}

TEST(NcclDeadlineTest, ADisarmedGuardStaysQuiet) {
  Expiries expiries;
  {
    NcclDeadline deadline("rank 1", 50ms, 50ms, expiries.callback());
    deadline.begin("reported by the watchdog");
    deadline.disarm();
    std::this_thread::sleep_for(300ms);
  }
  EXPECT_EQ(expiries.count(), 0u);
}

TEST(NcclDeadlineTest, ExitProcessPrintsAndEndsWithStatusOne) {
  EXPECT_EXIT(NcclDeadline::exitProcess("rank 3: recv timed out"),
              ::testing::ExitedWithCode(1), "mtrt: rank 3: recv timed out");
}

} // namespace
