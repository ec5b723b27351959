// An in-process world's state: aborts, rank records, deadlocks, messages.
#include "comm/InProcessState.h"

#include <algorithm>
#include <numeric>
#include <sstream>

namespace mtrt::comm {

InProcessState::InProcessState(int size, InProcessOptions options)
    : taken(size, false), options_(options), ranks_(size) {
  std::vector<int> all(size);
  std::iota(all.begin(), all.end(), 0);
  world = addGroupLocked("world", std::move(all));
}

std::shared_ptr<InProcessGroup>
InProcessState::addGroupLocked(std::string name, std::vector<int> members) {
  auto group =
      std::make_shared<InProcessGroup>(std::move(name), std::move(members));
  groups_.push_back(group);
  return group;
}

void InProcessState::abort(const std::string &reason) {
  std::lock_guard<std::mutex> lock(mutex);
  abortLocked(reason);
}

void InProcessState::abortLocked(const std::string &reason, int origin) {
  if (aborted_)
    return;
  aborted_ = true;
  abortReason_ = reason;
  abortOrigin_ = origin;
  abortOriginCall_ = origin >= 0 ? ranks_[origin].call : nullptr;
  for (RankRecord &record : ranks_)
    record.wake.notify_all();
}

void InProcessState::rankFinished(int rank) {
  std::lock_guard<std::mutex> lock(mutex);
  ranks_[rank].finished = true;
  if (!options_.detectDeadlocks)
    return;
  for (int other = 0; other < size() && !aborted_; ++other) {
    if (!ranks_[other].blocked)
      continue;
    std::vector<int> chain = findDeadlockLocked(other);
    if (!chain.empty())
      abortLocked(deadlockMessageLocked(chain));
  }
}

void InProcessState::beginCallLocked(int rank, const Call &call,
                                     const InProcessGroup &group, int member,
                                     uint64_t seq, uint64_t recvSeq) {
  RankRecord &record = ranks_[rank];
  record.call = &call;
  record.group = &group;
  record.member = member;
  record.seq = seq;
  record.recvSeq = recvSeq;
  if (aborted_) {
    std::string message = describeCallLocked(rank);
    endCallLocked(rank);
    throw Error(MTRT_STATUS_ABORTED,
                message +
                    " was not run: the world was aborted: " + abortReason_);
  }
}

void InProcessState::endCallLocked(int rank) {
  RankRecord &record = ranks_[rank];
  if (!record.call)
    return;
  record.hasLast = true;
  record.lastKind = record.call->kind;
  record.lastGroup = record.group;
  record.lastSeq = record.seq;
  record.call = nullptr;
  record.group = nullptr;
}

void InProcessState::throwAbortedLocked(int rank) const {
  if (rank == abortOrigin_ && ranks_[rank].call == abortOriginCall_)
    throw Error(MTRT_STATUS_ABORTED, abortReason_);
  throw Error(MTRT_STATUS_ABORTED,
              describeCallLocked(rank) + " was aborted: " + abortReason_);
}

std::string InProcessState::whereLocked(const RankRecord &record) const {
  const InProcessGroup &group = *record.group;
  const Call &call = *record.call;
  auto peer = [&](int groupRank) {
    return std::to_string(group.members[groupRank]);
  };
  std::string of = " of group " + group.name;
  switch (call.kind) {
  case CallKind::Send:
  case CallKind::SendAsync:
    return "message #" + std::to_string(record.seq) + " to rank " +
           peer(call.peer) + of;
  case CallKind::Recv:
    return "message #" + std::to_string(record.recvSeq) + " from rank " +
           peer(call.peer) + of;
  case CallKind::SendRecv:
    return "messages #" + std::to_string(record.seq) + " to rank " +
           peer(call.peer) + " and #" + std::to_string(record.recvSeq) +
           " from rank " + peer(call.recvPeer) + of;
  default:
    return "collective #" + std::to_string(record.seq) + of;
  }
}

std::string InProcessState::callTextLocked(int rank) const {
  const RankRecord &record = ranks_[rank];
  if (!record.call)
    return "no call";
  return record.call->describe(record.group->members) + " at " +
         whereLocked(record);
}

std::string InProcessState::describeCallLocked(int rank) const {
  return "rank " + std::to_string(rank) + ": " + callTextLocked(rank);
}

std::vector<int> InProcessState::waitsForLocked(int rank) const {
  const RankRecord &record = ranks_[rank];
  std::vector<int> waits;
  if (!record.blocked || !record.call)
    return waits;
  const InProcessGroup &group = *record.group;
  const Call *call = record.call;
  int self = record.member;
  if (isCollective(call->kind)) {
    for (int r = 0; r < group.size(); ++r)
      if (!group.slots[r])
        waits.push_back(group.members[r]);
    return waits;
  }
  if (call->kind != CallKind::Recv) {
    const InProcessChannel &out = group.channel(self, call->peer);
    if (out.send == call && !out.recv)
      waits.push_back(group.members[call->peer]);
  }
  if (call->kind != CallKind::Send) {
    int from = call->kind == CallKind::Recv ? call->peer : call->recvPeer;
    const InProcessChannel &in = group.channel(from, self);
    if (in.recv == call && !in.send && in.queued.empty() &&
        std::find(waits.begin(), waits.end(), group.members[from]) ==
            waits.end())
      waits.push_back(group.members[from]);
  }
  return waits;
}

std::vector<int> InProcessState::findDeadlockLocked(int rank) const {
  // Depth-first over blocked ranks; a rank that is running may still come,
  // so only blocked and finished ranks extend a chain.
  std::vector<int> chain{rank};
  std::vector<size_t> next{0};
  std::vector<std::vector<int>> edges{waitsForLocked(rank)};
  std::vector<bool> seen(size(), false);
  seen[rank] = true;
  while (!chain.empty()) {
    if (next.back() == edges.back().size()) {
      chain.pop_back();
      next.pop_back();
      edges.pop_back();
      continue;
    }
    int to = edges.back()[next.back()++];
    if (to == rank || ranks_[to].finished) {
      chain.push_back(to);
      return chain;
    }
    if (seen[to] || !ranks_[to].blocked)
      continue;
    seen[to] = true;
    chain.push_back(to);
    next.push_back(0);
    edges.push_back(waitsForLocked(to));
  }
  return {};
}

std::string
InProcessState::deadlockMessageLocked(const std::vector<int> &chain) const {
  std::string message = "deadlock: ";
  for (size_t i = 0; i + 1 < chain.size(); ++i) {
    if (i)
      message += "; ";
    message += "rank " + std::to_string(chain[i]) + " waits in " +
               callTextLocked(chain[i]) + " for rank " +
               std::to_string(chain[i + 1]);
  }
  if (ranks_[chain.back()].finished)
    message += "; " + rankStateLocked(chain.back());
  else
    message += " (a cycle: none of them can go on)";
  return message;
}

std::string InProcessState::timeoutMessageLocked(int rank,
                                                 Clock::duration waited) const {
  std::vector<int> missing = waitsForLocked(rank);
  std::ostringstream text;
  text << "timeout: rank " << rank << " waited "
       << std::chrono::duration<double>(waited).count() << " s (the limit is "
       << std::chrono::duration<double>(options_.timeout).count() << " s) in "
       << callTextLocked(rank) << " for rank";
  if (missing.size() > 1)
    text << "s";
  for (size_t i = 0; i < missing.size(); ++i)
    text << (i ? ", " : " ") << missing[i];
  for (int other : missing)
    text << "; " << rankStateLocked(other);
  return text.str();
}

std::string InProcessState::rankStateLocked(int rank) const {
  const RankRecord &record = ranks_[rank];
  std::string name = "rank " + std::to_string(rank);
  if (record.finished)
    return name + " has finished and makes no more calls";
  if (record.call)
    return name + " is in " + record.call->describe(record.group->members) +
           " at " + whereLocked(record);
  if (!record.hasLast)
    return name + " has made no communicator call yet";
  std::string last = name + " is not in a communicator call; its last was " +
                     callKindName(record.lastKind);
  if (isCollective(record.lastKind))
    return last + " at collective #" + std::to_string(record.lastSeq) +
           " of group " + record.lastGroup->name;
  return last + " in group " + record.lastGroup->name;
}

} // namespace mtrt::comm
