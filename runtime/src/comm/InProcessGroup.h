// One group of in-process ranks: members, rendezvous and message channels.
#ifndef MTRT_SRC_COMM_INPROCESSGROUP_H
#define MTRT_SRC_COMM_INPROCESSGROUP_H

#include "comm/CollectiveCall.h"

#include <cstdint>
#include <deque>
#include <memory>
#include <string>
#include <vector>

namespace mtrt::comm {

/// The messages from one group rank to another. A rank blocks in its send
/// until the copy is done, so each channel holds at most one send and one
/// recv at a time, and the n-th send pairs with the n-th recv.
/// A send_async's message, copied, until the receiver takes it.
struct InProcessQueuedMessage {
  Call call;
  std::string label;
  std::vector<unsigned char> bytes;
};

struct InProcessChannel {
  /// Messages of send_async, oldest first; they precede any posted `send`.
  std::deque<std::unique_ptr<InProcessQueuedMessage>> queued;
  /// The posted send (or send_recv) call, until the receiver has copied it.
  const Call *send = nullptr;
  /// The posted recv (or send_recv) call, until it has copied.
  const Call *recv = nullptr;
  /// The receiver is copying from `send`: the sender must stay until done.
  bool claimed = false;
  uint64_t sendsPosted = 0;
  uint64_t recvsPosted = 0;
  uint64_t completed = 0;
};

/// Every field is guarded by the world's mutex (InProcessState::mutex).
///
/// Collective number k (counting from 1) goes through two phases: ranks
/// arrive and publish their calls in `slots`, the last one checks that they
/// match and sets gathered = k; each rank then reads the others' inputs and
/// writes its own output, and the last to finish clears the slots and sets
/// released = k. No rank leaves collective k before released == k, so the
/// inputs stay valid while they are read, and the slots are free for k + 1.
struct InProcessGroup {
  InProcessGroup(std::string name, std::vector<int> members);

  int size() const { return static_cast<int>(members.size()); }
  InProcessChannel &channel(int from, int to) {
    return channels[static_cast<size_t>(from) * members.size() + to];
  }
  const InProcessChannel &channel(int from, int to) const {
    return channels[static_cast<size_t>(from) * members.size() + to];
  }

  /// groupName(): "tp[0,1]".
  const std::string name;
  /// Unique in the process, never 0 (Communicator::inProcessGroupId).
  const uint64_t id;
  /// The world rank of each group rank.
  const std::vector<int> members;

  /// Per group rank, its call in collective gathered + 1, once it arrived.
  std::vector<const Call *> slots;
  int arrived = 0;
  int finished = 0;
  uint64_t gathered = 0;
  uint64_t released = 0;
  /// A split's result per group rank: its new group (null for kNoColor)
  /// and its rank there; set with gathered, read before released.
  std::vector<std::pair<std::shared_ptr<InProcessGroup>, int>> splitResults;

  /// Indexed from * size + to.
  std::vector<InProcessChannel> channels;
};

} // namespace mtrt::comm

#endif // MTRT_SRC_COMM_INPROCESSGROUP_H
