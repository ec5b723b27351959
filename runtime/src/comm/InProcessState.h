// An in-process world's shared state: lock, groups, ranks, aborts, waits.
#ifndef MTRT_SRC_COMM_INPROCESSSTATE_H
#define MTRT_SRC_COMM_INPROCESSSTATE_H

#include "comm/InProcessGroup.h"
#include "comm/InProcessWorld.h"

#include <chrono>
#include <condition_variable>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

namespace mtrt::comm {

/// Everything here is guarded by `mutex`; functions named ...Locked expect
/// the caller to hold it.
class InProcessState {
public:
  InProcessState(int size, InProcessOptions options);

  int size() const { return static_cast<int>(ranks_.size()); }

  /// The world's one lock: for every group, channel and rank record.
  std::mutex mutex;
  /// The group of all ranks.
  std::shared_ptr<InProcessGroup> world;
  /// Whether each rank's world communicator was handed out.
  std::vector<bool> taken;

  /// Makes a group and keeps it for as long as the world lives, so messages
  /// may name it after its communicators are gone.
  std::shared_ptr<InProcessGroup> addGroupLocked(std::string name,
                                                 std::vector<int> members);

  void abort(const std::string &reason);
  /// `origin`: the world rank whose current call detected the problem; that
  /// call then throws `reason` as it is, the others "<their call> was
  /// aborted: <reason>".
  void abortLocked(const std::string &reason, int origin = -1);
  bool abortedLocked() const { return aborted_; }
  const std::string &abortReasonLocked() const { return abortReason_; }
  void rankFinished(int rank);

  /// Records that world rank `rank` is in `call`, as group rank `member` of
  /// `group`: collective number `seq`, or message numbers `seq` (sent) and
  /// `recvSeq` (received). Throws ABORTED if the world is aborted.
  void beginCallLocked(int rank, const Call &call, const InProcessGroup &group,
                       int member, uint64_t seq, uint64_t recvSeq = 0);
  void endCallLocked(int rank);

  /// Waits until done(). While it waits the rank counts as blocked on the
  /// ranks that waitsForLocked names: a deadlock or a timeout aborts the
  /// world. Once the world is aborted, throws ABORTED as soon as mayLeave()
  /// (no other rank is reading this rank's buffers).
  template <typename Done, typename MayLeave>
  void waitLocked(std::unique_lock<std::mutex> &lock, int rank, Done done,
                  MayLeave mayLeave);
  /// Waits until done(), which other ranks make true without waiting for
  /// anything (finishing a copy): no timeout, no abort.
  template <typename Done>
  void waitBoundedLocked(std::unique_lock<std::mutex> &lock, int rank,
                         Done done) {
    while (!done())
      ranks_[rank].wake.wait(lock);
  }
  void notifyLocked(int rank) { ranks_[rank].wake.notify_all(); }

  /// "rank 3: all_reduce sum of 4 f32 (\"x\", step 1) at collective #2 of
  /// group tp[2,3]": the rank's current call, for messages.
  std::string describeCallLocked(int rank) const;
  /// The same without "rank 3: ".
  std::string callTextLocked(int rank) const;

private:
  using Clock = std::chrono::steady_clock;

  /// What one rank is doing.
  struct RankRecord {
    const Call *call = nullptr;
    const InProcessGroup *group = nullptr;
    int member = -1;
    uint64_t seq = 0;
    uint64_t recvSeq = 0;
    /// Waiting in waitLocked for the ranks waitsForLocked names.
    bool blocked = false;
    bool finished = false;
    /// The last call, for "its last call was ..." in messages.
    bool hasLast = false;
    CallKind lastKind = CallKind::Barrier;
    const InProcessGroup *lastGroup = nullptr;
    uint64_t lastSeq = 0;
    std::condition_variable wake;
  };

  [[noreturn]] void throwAbortedLocked(int rank) const;
  std::string whereLocked(const RankRecord &record) const;
  /// The world ranks a blocked rank waits for.
  std::vector<int> waitsForLocked(int rank) const;
  /// A chain of blocked ranks from `rank` back to itself, or to a rank that
  /// has finished; empty if there is none.
  std::vector<int> findDeadlockLocked(int rank) const;
  std::string deadlockMessageLocked(const std::vector<int> &chain) const;
  std::string timeoutMessageLocked(int rank, Clock::duration waited) const;
  /// "rank 1 is in ...", "rank 1 has finished ...", for messages.
  std::string rankStateLocked(int rank) const;

  InProcessOptions options_;
  std::vector<RankRecord> ranks_;
  std::vector<std::shared_ptr<InProcessGroup>> groups_;
  bool aborted_ = false;
  std::string abortReason_;
  int abortOrigin_ = -1;
  const Call *abortOriginCall_ = nullptr;
};

template <typename Done, typename MayLeave>
void InProcessState::waitLocked(std::unique_lock<std::mutex> &lock, int rank,
                                Done done, MayLeave mayLeave) {
  if (done())
    return;
  RankRecord &self = ranks_[rank];
  struct Unblock {
    RankRecord &record;
    ~Unblock() { record.blocked = false; }
  } unblock{self};
  self.blocked = true;
  if (options_.detectDeadlocks && !aborted_) {
    std::vector<int> chain = findDeadlockLocked(rank);
    if (!chain.empty())
      abortLocked(deadlockMessageLocked(chain), rank);
  }
  bool timed = options_.timeout.count() > 0;
  Clock::time_point start = Clock::now();
  Clock::time_point deadline = start + options_.timeout;
  while (!done()) {
    if (aborted_) {
      if (mayLeave())
        throwAbortedLocked(rank);
      self.wake.wait(lock);
    } else if (!timed) {
      self.wake.wait(lock);
    } else if (self.wake.wait_until(lock, deadline) ==
                   std::cv_status::timeout &&
               !done() && !aborted_) {
      abortLocked(timeoutMessageLocked(rank, Clock::now() - start), rank);
    }
  }
}

} // namespace mtrt::comm

#endif // MTRT_SRC_COMM_INPROCESSSTATE_H
