// A world of in-process ranks (threads of one process) and its options.
#ifndef MTRT_SRC_COMM_INPROCESSWORLD_H
#define MTRT_SRC_COMM_INPROCESSWORLD_H

#include "comm/Communicator.h"

#include <chrono>
#include <memory>
#include <string>
#include <string_view>

namespace mtrt::comm {

class InProcessState;

struct InProcessOptions {
  /// How long a rank waits in one call for the other ranks before it aborts
  /// the world with a message naming the ranks that did not come, the call
  /// and the step. Zero or less: wait forever.
  std::chrono::milliseconds timeout{60000};
  /// Abort at once, instead of at the timeout, when ranks wait for each other
  /// in a cycle (rank 0 in an all_reduce of tp waiting for rank 1, rank 1 in
  /// an all_reduce of dp waiting for rank 0) or for a rank that has finished.
  /// Sound as long as each rank's calls come from one thread in program
  /// order (Communicator's thread-safety rule).
  bool detectDeadlocks = true;
};

/// `size` ranks that run as threads of this process, with the
/// Communicator interface: the rank threads take one communicator each and
/// call collectives on it; all must call the same ones in the same order.
/// Reductions sum in a fixed tree order (FixedOrderReduce.h), so every rank
/// gets the same bits.
///
/// Thread-safety: every member may be called from any thread. The world's
/// state is shared with its communicators, so they may outlive it.
class InProcessWorld {
public:
  explicit InProcessWorld(int size, InProcessOptions options = {});
  ~InProcessWorld();
  InProcessWorld(const InProcessWorld &) = delete;
  InProcessWorld &operator=(const InProcessWorld &) = delete;

  int size() const { return size_; }

  /// The communicator of `rank` over the whole world, group "world[0-N]".
  /// Each rank's is taken once: a second call for the same rank throws
  /// FAILED_PRECONDITION, a rank out of range INVALID_ARGUMENT.
  std::unique_ptr<Communicator> communicator(int rank);

  /// Fails every pending and later call of every rank with ABORTED; for a
  /// supervisor outside the ranks. The first abort's message wins.
  void abort(std::string_view reason);
  /// Records that `rank`'s thread makes no more calls (it returned or
  /// failed), so that ranks waiting for it fail at once rather than at the
  /// timeout (with detectDeadlocks).
  void rankFinished(int rank);

  bool aborted() const;
  /// Why the world was aborted; "" while it is not.
  std::string abortReason() const;

private:
  int size_;
  std::shared_ptr<InProcessState> state_;
};

} // namespace mtrt::comm

#endif // MTRT_SRC_COMM_INPROCESSWORLD_H
