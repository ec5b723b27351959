// Tests of the launcher environment and the TCP rendezvous (no GPU: the
// ranks are threads of this process on the loopback interface).
#include "comm/Rendezvous.h"
#include "core/Error.h"

#include "gtest/gtest.h"

#include <chrono>
#include <map>
#include <netinet/in.h>
#include <string>
#include <sys/socket.h>
#include <thread>
#include <unistd.h>
#include <vector>

using namespace mtrt;
using namespace mtrt::comm;

#define EXPECT_CONTAINS(text, part)                                            \
  EXPECT_NE(std::string(text).find(part), std::string::npos)                   \
      << "  which is: " << (text)

namespace {

using Clock = std::chrono::steady_clock;
using std::chrono::milliseconds;

/// A getenv over `vars`.
std::function<const char *(const char *)>
environment(const std::map<std::string, std::string> &vars) {
  return [vars](const char *name) -> const char * {
    auto found = vars.find(name);
    return found == vars.end() ? nullptr : found->second.c_str();
  };
}

/// A TCP port that was free a moment ago (bound to port 0, then closed).
int freePort() {
  int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in address{};
  address.sin_family = AF_INET;
  address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  address.sin_port = 0;
  EXPECT_EQ(::bind(fd, reinterpret_cast<sockaddr *>(&address), sizeof(address)),
            0);
  socklen_t length = sizeof(address);
  ::getsockname(fd, reinterpret_cast<sockaddr *>(&address), &length);
  ::close(fd);
  return ntohs(address.sin_port);
}

LaunchEnvironment rankOf(int rank, int size, int port) {
  LaunchEnvironment env;
  env.rank = rank;
  env.worldSize = size;
  env.localRank = rank;
  env.masterAddr = "127.0.0.1";
  env.masterPort = port;
  env.launcher = "test";
  return env;
}

/// Every rank's result (or error message) of one rendezvous.
struct Outcome {
  std::vector<std::vector<uint8_t>> received;
  std::vector<std::string> errors;
};

Outcome runRendezvous(const std::vector<LaunchEnvironment> &ranks,
                      const std::vector<uint8_t> &bytes, milliseconds timeout) {
  Outcome outcome;
  outcome.received.resize(ranks.size());
  outcome.errors.resize(ranks.size());
  std::vector<std::thread> threads;
  for (size_t r = 0; r < ranks.size(); ++r)
    threads.emplace_back([&, r] {
      try {
        std::vector<uint8_t> mine =
            ranks[r].rank == 0 ? bytes : std::vector<uint8_t>(bytes.size());
        outcome.received[r] = rendezvous(ranks[r], mine, timeout);
      } catch (const Error &e) {
        outcome.errors[r] = e.what();
      }
    });
  for (std::thread &t : threads)
    t.join();
  return outcome;
}

} // namespace

TEST(LaunchEnvironmentTest, NoLauncherMeansOneProcess) {
  EXPECT_FALSE(readLaunchEnvironment(environment({})).has_value());
}

TEST(LaunchEnvironmentTest, ReadsTorchrunVariables) {
  auto env = readLaunchEnvironment(environment({{"RANK", "3"},
                                                {"WORLD_SIZE", "8"},
                                                {"LOCAL_RANK", "1"},
                                                {"MASTER_ADDR", "node7"},
                                                {"MASTER_PORT", "12345"}}));
  ASSERT_TRUE(env.has_value());
  EXPECT_EQ(env->launcher, "torchrun");
  EXPECT_EQ(env->rank, 3);
  EXPECT_EQ(env->worldSize, 8);
  EXPECT_EQ(env->localRank, 1);
  EXPECT_EQ(env->masterAddr, "node7");
  EXPECT_EQ(env->masterPort, 12345);
}

TEST(LaunchEnvironmentTest, ReadsOpenMpiAndPmiVariablesWithDefaults) {
  auto ompi = readLaunchEnvironment(
      environment({{"OMPI_COMM_WORLD_RANK", "2"},
                   {"OMPI_COMM_WORLD_SIZE", "4"},
                   {"OMPI_COMM_WORLD_LOCAL_RANK", "0"}}));
  ASSERT_TRUE(ompi.has_value());
  EXPECT_EQ(ompi->launcher, "Open MPI");
  EXPECT_EQ(ompi->rank, 2);
  EXPECT_EQ(ompi->worldSize, 4);
  EXPECT_EQ(ompi->localRank, 0);
  EXPECT_EQ(ompi->masterAddr, "127.0.0.1");
  EXPECT_EQ(ompi->masterPort, 29500);

  auto pmi = readLaunchEnvironment(
      environment({{"PMI_RANK", "1"}, {"PMI_SIZE", "2"}}));
  ASSERT_TRUE(pmi.has_value());
  EXPECT_EQ(pmi->launcher, "PMI");
  EXPECT_EQ(pmi->rank, 1);
  EXPECT_EQ(pmi->localRank, 1); // no local rank given: the rank
}

TEST(LaunchEnvironmentTest, RejectsBadValuesNamingTheVariable) {
  auto message = [](const std::map<std::string, std::string> &vars) {
    try {
      readLaunchEnvironment(environment(vars));
    } catch (const Error &e) {
      EXPECT_EQ(e.code(), MTRT_STATUS_INVALID_ARGUMENT);
      return std::string(e.what());
    }
    return std::string("no error");
  };
  EXPECT_EQ(message({{"RANK", "2"}, {"WORLD_SIZE", "2"}}),
            "launcher environment: RANK='2' is not a whole number from 0 to 1");
  EXPECT_EQ(message({{"RANK", "0"}, {"WORLD_SIZE", "two"}}),
            "launcher environment: WORLD_SIZE='two' is not a whole number "
            "from 1 to 1048576");
  EXPECT_EQ(message({{"RANK", "0"}}),
            "launcher environment: RANK is set but WORLD_SIZE is not; a "
            "torchrun launch sets both");
  EXPECT_EQ(message({{"RANK", "0"}, {"WORLD_SIZE", "2"}, {"MASTER_PORT", "0"}}),
            "launcher environment: MASTER_PORT='0' is not a whole number "
            "from 1 to 65535");
}

TEST(RendezvousTest, EveryRankGetsRankZerosBytes) {
  int port = freePort();
  std::vector<uint8_t> id(128);
  for (size_t i = 0; i < id.size(); ++i)
    id[i] = static_cast<uint8_t>(i * 7 + 3);
  std::vector<LaunchEnvironment> ranks;
  for (int r = 3; r >= 0; --r) // rank 0 last: the others retry
    ranks.push_back(rankOf(r, 4, port));
  Outcome outcome = runRendezvous(ranks, id, milliseconds(10000));
  for (size_t r = 0; r < ranks.size(); ++r) {
    EXPECT_EQ(outcome.errors[r], "") << "rank " << ranks[r].rank;
    EXPECT_EQ(outcome.received[r], id) << "rank " << ranks[r].rank;
  }
}

TEST(RendezvousTest, AWorldOfOneNeedsNoNetwork) {
  std::vector<uint8_t> id = {1, 2, 3};
  EXPECT_EQ(rendezvous(rankOf(0, 1, 1), id, milliseconds(1)), id);
}

TEST(RendezvousTest, ARankWithoutRankZeroTimesOutNamingTheAddress) {
  int port = freePort();
  Clock::time_point start = Clock::now();
  Outcome outcome =
      runRendezvous({rankOf(1, 2, port)}, std::vector<uint8_t>(8),
                    milliseconds(600));
  double seconds = std::chrono::duration<double>(Clock::now() - start).count();
  EXPECT_LT(seconds, 5.0);
  EXPECT_CONTAINS(outcome.errors[0],
                  "rendezvous: rank 1 could not reach rank 0 at 127.0.0.1:" +
                      std::to_string(port) + " within 0.6 s (last error: ");
  EXPECT_CONTAINS(outcome.errors[0], "is rank 0 running");
}

TEST(RendezvousTest, RankZeroNamesTheMissingRanks) {
  int port = freePort();
  Outcome outcome = runRendezvous({rankOf(0, 3, port), rankOf(2, 3, port)},
                                  std::vector<uint8_t>(8), milliseconds(800));
  EXPECT_EQ(outcome.errors[0],
            "rendezvous: rank 0 heard from 2 of 3 ranks on port " +
                std::to_string(port) +
                " within 0.8 s; missing rank(s) 1 (did they start, with "
                "MASTER_ADDR reaching this host and the same MASTER_PORT?)");
  // Rank 2 waited for an answer that never came.
  EXPECT_CONTAINS(outcome.errors[1], "rendezvous: rank 2 could not reach "
                                     "rank 0");
}

TEST(RendezvousTest, ADuplicateRankFailsEveryRank) {
  int port = freePort();
  Outcome outcome =
      runRendezvous({rankOf(0, 3, port), rankOf(1, 3, port), rankOf(1, 3, port)},
                    std::vector<uint8_t>(8), milliseconds(10000));
  EXPECT_EQ(outcome.errors[0], "rendezvous: two processes say they are rank "
                               "1; give each process its own RANK");
  int refused = 0;
  for (size_t r = 1; r < 3; ++r)
    refused += outcome.errors[r] ==
               "rendezvous: rank 0 refused the run: two processes say they "
               "are rank 1; give each process its own RANK";
  EXPECT_EQ(refused, 2) << outcome.errors[1] << "\n" << outcome.errors[2];
}

TEST(RendezvousTest, AWorldSizeMismatchIsNamed) {
  int port = freePort();
  Outcome outcome = runRendezvous({rankOf(0, 2, port), rankOf(1, 3, port)},
                                  std::vector<uint8_t>(8), milliseconds(10000));
  EXPECT_EQ(outcome.errors[0], "rendezvous: rank 1 says the world has 3 ranks, "
                               "rank 0 says 2 (WORLD_SIZE)");
  EXPECT_CONTAINS(outcome.errors[1], "rank 0 refused the run: rank 1 says");
}

TEST(RendezvousTest, APortInUseIsNamedWithTheFix) {
  int fd = ::socket(AF_INET6, SOCK_STREAM, 0);
  sockaddr_in6 address{};
  address.sin6_family = AF_INET6;
  address.sin6_addr = in6addr_any;
  address.sin6_port = 0;
  ASSERT_EQ(::bind(fd, reinterpret_cast<sockaddr *>(&address), sizeof(address)),
            0);
  ASSERT_EQ(::listen(fd, 1), 0);
  socklen_t length = sizeof(address);
  ::getsockname(fd, reinterpret_cast<sockaddr *>(&address), &length);
  int port = ntohs(address.sin6_port);
  Outcome outcome = runRendezvous({rankOf(0, 2, port)}, std::vector<uint8_t>(8),
                                  milliseconds(500));
  ::close(fd);
  EXPECT_CONTAINS(outcome.errors[0], "rendezvous: rank 0 cannot listen on port " +
                                         std::to_string(port) +
                                         " (MASTER_PORT): ");
  EXPECT_CONTAINS(outcome.errors[0], "pick a free port");
}
