// The host-clock guard of an NCCL rank's calls.
#include "comm/NcclDeadline.h"

#include <cstdio>
#include <cstdlib>

#include <unistd.h>

namespace mtrt::comm {

namespace {
std::string secondsText(std::chrono::milliseconds duration) {
  char text[32];
  std::snprintf(text, sizeof(text), "%.3g s", duration.count() / 1000.0);
  return text;
}
} // namespace

void NcclDeadline::exitProcess(const std::string &message) {
  // One write(2), no stdio lock: the main thread may hold one while blocked.
  std::string line = "mtrt: " + message + "\n";
  for (size_t done = 0; done < line.size();) {
    ssize_t wrote = ::write(2, line.data() + done, line.size() - done);
    if (wrote <= 0)
      break;
    done += static_cast<size_t>(wrote);
  }
  std::_Exit(1);
}

NcclDeadline::NcclDeadline(std::string rankName,
                           std::chrono::milliseconds timeout,
                           std::chrono::milliseconds grace, Expired onExpired)
    : rankName_(std::move(rankName)), timeout_(timeout), grace_(grace),
      onExpired_(std::move(onExpired)), thread_([this] { loop(); }) {}

NcclDeadline::~NcclDeadline() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stop_ = true;
  }
  wake_.notify_all();
  thread_.join();
}

uint64_t NcclDeadline::begin(std::string what) {
  std::lock_guard<std::mutex> lock(mutex_);
  uint64_t ticket = next_++;
  pending_.emplace(ticket,
                   Pending{std::move(what), Clock::now() + timeout_ + grace_});
  return ticket;
}

void NcclDeadline::end(uint64_t ticket) {
  std::lock_guard<std::mutex> lock(mutex_);
  pending_.erase(ticket);
}

void NcclDeadline::rename(std::string rankName) {
  std::lock_guard<std::mutex> lock(mutex_);
  rankName_ = std::move(rankName);
}

void NcclDeadline::disarm() {
  std::lock_guard<std::mutex> lock(mutex_);
  expired_ = true;
}

void NcclDeadline::loop() {
  std::unique_lock<std::mutex> lock(mutex_);
  while (!stop_) {
    wake_.wait_for(lock, std::chrono::milliseconds(50));
    if (stop_ || expired_ || pending_.empty())
      continue;
    // Tickets grow with time and every call has the same timeout: the
    // oldest call has the earliest deadline.
    const Pending &oldest = pending_.begin()->second;
    if (Clock::now() < oldest.deadline)
      continue;
    expired_ = true;
    std::string message =
        rankName_ + ": " + oldest.what +
        " did not complete within the collective timeout (" +
        secondsText(timeout_) +
        ", --collective-timeout), and the NCCL watchdog did not report it "
        "within " +
        secondsText(grace_) +
        " more (a CUDA call is blocked behind the stuck collective); a peer "
        "rank died or hangs. Exiting without aborting the communicator";
    lock.unlock();
    onExpired_(message);
    lock.lock();
  }
}

} // namespace mtrt::comm
