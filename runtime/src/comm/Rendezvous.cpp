// The launcher's environment and the TCP rendezvous through rank 0.
//
// The exchange: each rank r > 0 connects to rank 0 and sends a hello (magic,
// protocol version, r, world size, the payload's size; five little-endian
// u32). Rank 0 checks it, and once every rank has said hello it answers each
// with a status word (0: ok, then the payload; 1: an error, then its text) and
// closes the connection.
#include "comm/Rendezvous.h"

#include "core/Error.h"

#include <arpa/inet.h>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <thread>
#include <unistd.h>

namespace mtrt::comm {

namespace {

using Clock = std::chrono::steady_clock;
constexpr uint32_t kMagic = 0x5652544d; // "MTRV"
constexpr uint32_t kVersion = 1;

/// Parses a whole decimal integer in [low, high]; nullopt otherwise.
std::optional<long> parseInt(const char *text, long low, long high) {
  if (!text || !*text)
    return std::nullopt;
  char *end = nullptr;
  errno = 0;
  long value = std::strtol(text, &end, 10);
  if (errno || *end || value < low || value > high)
    return std::nullopt;
  return value;
}

/// A socket closed at scope exit.
class Socket {
public:
  explicit Socket(int fd = -1) : fd_(fd) {}
  ~Socket() {
    if (fd_ >= 0)
      ::close(fd_);
  }
  Socket(Socket &&other) noexcept : fd_(other.fd_) { other.fd_ = -1; }
  Socket &operator=(Socket &&other) noexcept {
    std::swap(fd_, other.fd_);
    return *this;
  }
  int fd() const { return fd_; }

private:
  int fd_;
};

std::string errnoText(int error) { return std::strerror(error); }

int remainingMs(Clock::time_point deadline) {
  auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
                  deadline - Clock::now())
                  .count();
  return left > 0 ? static_cast<int>(left) : 0;
}

/// Waits until `fd` is ready for `events`; false on timeout.
bool waitFor(int fd, short events, Clock::time_point deadline) {
  for (;;) {
    pollfd p{fd, events, 0};
    int ready = ::poll(&p, 1, remainingMs(deadline));
    if (ready > 0)
      return true;
    if (ready == 0)
      return false;
    if (errno != EINTR)
      return false;
  }
}

/// Reads exactly `size` bytes before `deadline`; an error text on failure.
std::string readAll(int fd, void *data, size_t size,
                    Clock::time_point deadline) {
  auto *out = static_cast<unsigned char *>(data);
  while (size) {
    if (!waitFor(fd, POLLIN, deadline))
      return "timed out waiting for data";
    ssize_t got = ::recv(fd, out, size, 0);
    if (got == 0)
      return "the connection was closed";
    if (got < 0) {
      if (errno == EINTR || errno == EAGAIN)
        continue;
      return errnoText(errno);
    }
    out += got;
    size -= static_cast<size_t>(got);
  }
  return "";
}

std::string writeAll(int fd, const void *data, size_t size,
                     Clock::time_point deadline) {
  const auto *in = static_cast<const unsigned char *>(data);
  while (size) {
    if (!waitFor(fd, POLLOUT, deadline))
      return "timed out sending data";
    ssize_t sent = ::send(fd, in, size, MSG_NOSIGNAL);
    if (sent < 0) {
      if (errno == EINTR || errno == EAGAIN)
        continue;
      return errnoText(errno);
    }
    in += sent;
    size -= static_cast<size_t>(sent);
  }
  return "";
}

void putU32(std::vector<uint8_t> &out, uint32_t v) {
  for (int i = 0; i < 4; ++i)
    out.push_back(static_cast<uint8_t>(v >> (8 * i)));
}

uint32_t getU32(const uint8_t *in) {
  return uint32_t(in[0]) | uint32_t(in[1]) << 8 | uint32_t(in[2]) << 16 |
         uint32_t(in[3]) << 24;
}

std::string endpoint(const LaunchEnvironment &env) {
  return env.masterAddr + ":" + std::to_string(env.masterPort);
}

std::string seconds(std::chrono::milliseconds timeout) {
  char text[32];
  std::snprintf(text, sizeof(text), "%.3g s", timeout.count() / 1000.0);
  return text;
}

/// Rank 0: accepts every other rank's hello, then answers all.
std::vector<uint8_t> serve(const LaunchEnvironment &env,
                           const std::vector<uint8_t> &bytes,
                           std::chrono::milliseconds timeout) {
  Clock::time_point deadline = Clock::now() + timeout;
  Socket listener(::socket(AF_INET6, SOCK_STREAM | SOCK_CLOEXEC, 0));
  bool v6 = listener.fd() >= 0;
  if (!v6)
    listener = Socket(::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0));
  if (listener.fd() < 0)
    throw Error(MTRT_STATUS_UNAVAILABLE,
                "rendezvous: rank 0 could not make a socket: " +
                    errnoText(errno));
  int one = 1, zero = 0;
  ::setsockopt(listener.fd(), SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
  int bound;
  if (v6) {
    // Both IPv6 and IPv4 clients.
    ::setsockopt(listener.fd(), IPPROTO_IPV6, IPV6_V6ONLY, &zero, sizeof(zero));
    sockaddr_in6 address{};
    address.sin6_family = AF_INET6;
    address.sin6_addr = in6addr_any;
    address.sin6_port = htons(static_cast<uint16_t>(env.masterPort));
    bound = ::bind(listener.fd(), reinterpret_cast<sockaddr *>(&address),
                   sizeof(address));
  } else {
    sockaddr_in address{};
    address.sin_family = AF_INET;
    address.sin_addr.s_addr = htonl(INADDR_ANY);
    address.sin_port = htons(static_cast<uint16_t>(env.masterPort));
    bound = ::bind(listener.fd(), reinterpret_cast<sockaddr *>(&address),
                   sizeof(address));
  }
  if (bound != 0 || ::listen(listener.fd(), env.worldSize) != 0)
    throw Error(MTRT_STATUS_INVALID_ARGUMENT,
                "rendezvous: rank 0 cannot listen on port " +
                    std::to_string(env.masterPort) + " (MASTER_PORT): " +
                    errnoText(errno) +
                    "; pick a free port and pass the same MASTER_PORT to "
                    "every rank");

  std::vector<Socket> clients(static_cast<size_t>(env.worldSize));
  int joined = 1;
  std::string refused; // the first bad hello, answered to every rank
  while (joined < env.worldSize) {
    if (!waitFor(listener.fd(), POLLIN, deadline)) {
      std::string missing;
      int listed = 0;
      for (int r = 1; r < env.worldSize; ++r) {
        if (clients[r].fd() >= 0)
          continue;
        if (listed++ == 8) {
          missing += ", ...";
          break;
        }
        missing += (missing.empty() ? "" : ", ") + std::to_string(r);
      }
      throw Error(MTRT_STATUS_DEADLINE_EXCEEDED,
                  "rendezvous: rank 0 heard from " + std::to_string(joined) +
                      " of " + std::to_string(env.worldSize) +
                      " ranks on port " + std::to_string(env.masterPort) +
                      " within " + seconds(timeout) + "; missing rank(s) " +
                      missing + " (did they start, with MASTER_ADDR reaching "
                      "this host and the same MASTER_PORT?)");
    }
    Socket client(::accept4(listener.fd(), nullptr, nullptr, SOCK_CLOEXEC));
    if (client.fd() < 0)
      continue;
    uint8_t hello[20];
    if (!readAll(client.fd(), hello, sizeof(hello),
                 std::min(deadline, Clock::now() + std::chrono::seconds(5)))
             .empty())
      continue; // not one of ours, or it went away; it may retry
    uint32_t magic = getU32(hello), version = getU32(hello + 4);
    uint32_t rank = getU32(hello + 8), size = getU32(hello + 12);
    uint32_t length = getU32(hello + 16);
    if (magic != kMagic || version != kVersion)
      continue;
    std::string problem;
    if (size != static_cast<uint32_t>(env.worldSize))
      problem = "rank " + std::to_string(rank) + " says the world has " +
                std::to_string(size) + " ranks, rank 0 says " +
                std::to_string(env.worldSize) + " (WORLD_SIZE)";
    else if (rank == 0 || rank >= size)
      problem = "a second process says it is rank " + std::to_string(rank) +
                (rank == 0 ? "" : " (out of range)") +
                "; give each process its own RANK";
    else if (clients[rank].fd() >= 0)
      problem = "two processes say they are rank " + std::to_string(rank) +
                "; give each process its own RANK";
    else if (length != bytes.size())
      problem = "rank " + std::to_string(rank) + " expects " +
                std::to_string(length) + " bytes, rank 0 has " +
                std::to_string(bytes.size()) + " (mixed versions?)";
    if (!problem.empty()) {
      refused = problem;
      std::vector<uint8_t> answer;
      putU32(answer, 1);
      putU32(answer, static_cast<uint32_t>(problem.size()));
      answer.insert(answer.end(), problem.begin(), problem.end());
      (void)writeAll(client.fd(), answer.data(), answer.size(),
                     Clock::now() + std::chrono::seconds(2));
      break;
    }
    clients[rank] = std::move(client);
    ++joined;
  }
  std::vector<uint8_t> answer;
  if (refused.empty()) {
    putU32(answer, 0);
    putU32(answer, static_cast<uint32_t>(bytes.size()));
    answer.insert(answer.end(), bytes.begin(), bytes.end());
  } else {
    putU32(answer, 1);
    putU32(answer, static_cast<uint32_t>(refused.size()));
    answer.insert(answer.end(), refused.begin(), refused.end());
  }
  for (int r = 1; r < env.worldSize; ++r)
    if (clients[r].fd() >= 0)
      (void)writeAll(clients[r].fd(), answer.data(), answer.size(),
                     Clock::now() + std::chrono::seconds(5));
  if (!refused.empty())
    throw Error(MTRT_STATUS_INVALID_ARGUMENT, "rendezvous: " + refused);
  return bytes;
}

/// Connects to `address` before `deadline`; an error text on failure.
std::string connectTo(const addrinfo &address, Socket &out,
                      Clock::time_point deadline) {
  Socket s(::socket(address.ai_family,
                    address.ai_socktype | SOCK_CLOEXEC | SOCK_NONBLOCK,
                    address.ai_protocol));
  if (s.fd() < 0)
    return errnoText(errno);
  if (::connect(s.fd(), address.ai_addr, address.ai_addrlen) != 0) {
    if (errno != EINPROGRESS)
      return errnoText(errno);
    if (!waitFor(s.fd(), POLLOUT, deadline))
      return "connection timed out";
    int error = 0;
    socklen_t length = sizeof(error);
    ::getsockopt(s.fd(), SOL_SOCKET, SO_ERROR, &error, &length);
    if (error)
      return errnoText(error);
  }
  out = std::move(s);
  return "";
}

/// Ranks > 0: connect (retrying), say hello, read rank 0's answer.
std::vector<uint8_t> join(const LaunchEnvironment &env, size_t size,
                          std::chrono::milliseconds timeout) {
  Clock::time_point deadline = Clock::now() + timeout;
  std::string last = "no attempt";
  auto delay = std::chrono::milliseconds(50);
  for (;;) {
    addrinfo hints{};
    hints.ai_family = AF_UNSPEC;
    hints.ai_socktype = SOCK_STREAM;
    addrinfo *found = nullptr;
    std::string port = std::to_string(env.masterPort);
    int resolved =
        ::getaddrinfo(env.masterAddr.c_str(), port.c_str(), &hints, &found);
    if (resolved != 0) {
      last = std::string("cannot resolve MASTER_ADDR: ") +
             gai_strerror(resolved);
    } else {
      for (addrinfo *a = found; a; a = a->ai_next) {
        Socket s;
        last = connectTo(*a, s, std::min(deadline, Clock::now() + delay * 20));
        if (!last.empty())
          continue;
        std::vector<uint8_t> hello;
        putU32(hello, kMagic);
        putU32(hello, kVersion);
        putU32(hello, static_cast<uint32_t>(env.rank));
        putU32(hello, static_cast<uint32_t>(env.worldSize));
        putU32(hello, static_cast<uint32_t>(size));
        last = writeAll(s.fd(), hello.data(), hello.size(), deadline);
        uint8_t head[8];
        if (last.empty())
          last = readAll(s.fd(), head, sizeof(head), deadline);
        if (!last.empty()) {
          last = "rank 0 accepted the connection, then: " + last;
          continue;
        }
        uint32_t status = getU32(head), length = getU32(head + 4);
        if (length > (1u << 20)) {
          last = "rank 0 answered with a " + std::to_string(length) +
                 "-byte message (not a rendezvous on this port?)";
          continue;
        }
        std::vector<uint8_t> payload(length);
        last = readAll(s.fd(), payload.data(), length, deadline);
        if (!last.empty())
          continue;
        ::freeaddrinfo(found);
        if (status != 0)
          throw Error(MTRT_STATUS_INVALID_ARGUMENT,
                      "rendezvous: rank 0 refused the run: " +
                          std::string(payload.begin(), payload.end()));
        if (payload.size() != size)
          throw Error(MTRT_STATUS_INVALID_ARGUMENT,
                      "rendezvous: rank 0 sent " +
                          std::to_string(payload.size()) + " bytes, expected " +
                          std::to_string(size));
        return payload;
      }
      ::freeaddrinfo(found);
    }
    if (Clock::now() >= deadline)
      throw Error(MTRT_STATUS_DEADLINE_EXCEEDED,
                  "rendezvous: rank " + std::to_string(env.rank) +
                      " could not reach rank 0 at " + endpoint(env) +
                      " within " + seconds(timeout) + " (last error: " + last +
                      "); is rank 0 running, and do MASTER_ADDR and "
                      "MASTER_PORT name its host and port on every rank?");
    std::this_thread::sleep_for(
        std::min<Clock::duration>(delay, deadline - Clock::now()));
    delay = std::min(delay * 2, std::chrono::milliseconds(1000));
  }
}

} // namespace

std::optional<LaunchEnvironment>
readLaunchEnvironment(const std::function<const char *(const char *)> &get) {
  auto read = [&](const char *name) -> const char * {
    return get ? get(name) : std::getenv(name);
  };
  auto number = [&](const char *name, long low, long high) -> int {
    const char *text = read(name);
    std::optional<long> value = parseInt(text, low, high);
    if (!value)
      throw Error(MTRT_STATUS_INVALID_ARGUMENT,
                  std::string("launcher environment: ") + name + "='" +
                      (text ? text : "") + "' is not a whole number from " +
                      std::to_string(low) + " to " + std::to_string(high));
    return static_cast<int>(*value);
  };
  struct Names {
    const char *launcher, *rank, *size, *localRank;
  };
  static const Names kLaunchers[] = {
      {"torchrun", "RANK", "WORLD_SIZE", "LOCAL_RANK"},
      {"Open MPI", "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE",
       "OMPI_COMM_WORLD_LOCAL_RANK"},
      {"PMI", "PMI_RANK", "PMI_SIZE", "MPI_LOCALRANKID"},
  };
  for (const Names &names : kLaunchers) {
    if (!read(names.rank) && !read(names.size))
      continue;
    if (!read(names.size) || !read(names.rank))
      throw Error(MTRT_STATUS_INVALID_ARGUMENT,
                  std::string("launcher environment: ") +
                      (read(names.rank) ? names.rank : names.size) +
                      " is set but " +
                      (read(names.rank) ? names.size : names.rank) +
                      " is not; a " + names.launcher +
                      " launch sets both");
    LaunchEnvironment env;
    env.launcher = names.launcher;
    env.worldSize = number(names.size, 1, 1 << 20);
    env.rank = number(names.rank, 0, env.worldSize - 1);
    const char *local = "LOCAL_RANK";
    if (!read(local) && read(names.localRank))
      local = names.localRank;
    if (!read(local) && read("PMI_LOCAL_RANK"))
      local = "PMI_LOCAL_RANK";
    env.localRank = read(local) ? number(local, 0, 1 << 20) : env.rank;
    if (read("MASTER_ADDR") && *read("MASTER_ADDR"))
      env.masterAddr = read("MASTER_ADDR");
    if (read("MASTER_PORT"))
      env.masterPort = number("MASTER_PORT", 1, 65535);
    return env;
  }
  return std::nullopt;
}

std::vector<uint8_t> rendezvous(const LaunchEnvironment &env,
                                const std::vector<uint8_t> &bytes,
                                std::chrono::milliseconds timeout) {
  if (env.worldSize <= 1)
    return bytes;
  if (env.rank == 0)
    return serve(env, bytes, timeout);
  return join(env, bytes.size(), timeout);
}

} // namespace mtrt::comm
