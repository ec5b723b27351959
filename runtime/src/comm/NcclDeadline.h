// The last line of an NCCL rank's fault handling: a thread that makes no
// CUDA or NCCL call and ends the process when a call outlives its deadline.
#ifndef MTRT_SRC_COMM_NCCLDEADLINE_H
#define MTRT_SRC_COMM_NCCLDEADLINE_H

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <map>
#include <mutex>
#include <string>
#include <thread>

namespace mtrt::comm {

/// Watches the calls of one rank against a host clock only. The NCCL
/// watchdog reports a stuck call through CUDA (an event query) and NCCL (the
/// asynchronous error, then ncclCommAbort); when a peer dies inside a
/// collective, a CUDA call of the rank's main thread (a synchronization, a
/// copy) can wait forever behind the spinning NCCL kernel, and the
/// watchdog's own CUDA calls can block behind that one, so the rank would
/// hang without a word. This guard touches neither: a call begun and not
/// ended within `timeout` + `grace` gets `onExpired` with a message naming
/// the rank, the call (its kind, label and step) and the timeout, once.
///
/// The default `onExpired` (exitProcess) prints the message on stderr and
/// ends the process with status 1, without aborting the communicator
/// (whose abort would block as well): Megatron-LM's behaviour for a rank
/// whose peer died.
///
/// Thread-safety: begin() and end() from any thread.
class NcclDeadline {
public:
  using Expired = std::function<void(const std::string &message)>;

  /// Prints `message` on stderr and calls std::_Exit(1).
  static void exitProcess(const std::string &message);

  NcclDeadline(std::string rankName, std::chrono::milliseconds timeout,
               std::chrono::milliseconds grace, Expired onExpired = exitProcess);
  ~NcclDeadline();
  NcclDeadline(const NcclDeadline &) = delete;
  NcclDeadline &operator=(const NcclDeadline &) = delete;

  /// Starts the clock of a call described by `what` ("all_reduce sum of 64
  /// f32 (\"label\", step 3) on group tp[0,1]"); returns its ticket.
  uint64_t begin(std::string what);
  /// The call completed (or failed and was reported).
  void end(uint64_t ticket);
  /// The rank's name in messages ("rank 5").
  void rename(std::string rankName);
  /// Stops watching: the failure was reported otherwise (the watchdog's
  /// message, its abort and exit).
  void disarm();

private:
  using Clock = std::chrono::steady_clock;
  struct Pending {
    std::string what;
    Clock::time_point deadline;
  };
  void loop();

  std::string rankName_;
  std::chrono::milliseconds timeout_, grace_;
  Expired onExpired_;
  std::mutex mutex_;
  std::condition_variable wake_;
  std::map<uint64_t, Pending> pending_;
  uint64_t next_ = 0;
  bool stop_ = false, expired_ = false;
  std::thread thread_;
};

} // namespace mtrt::comm

#endif // MTRT_SRC_COMM_NCCLDEADLINE_H
