// The in-process rendezvous for collectives and split, and blocking messages.
#include "comm/InProcessCommunicator.h"

#include "comm/FixedOrderReduce.h"
#include "comm/InProcessState.h"

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <new>
#include <tuple>

namespace mtrt::comm {

namespace {

bool overlaps(const void *a, size_t aBytes, const void *b, size_t bBytes) {
  if (!a || !b || !aBytes || !bBytes)
    return false;
  auto x = reinterpret_cast<uintptr_t>(a);
  auto y = reinterpret_cast<uintptr_t>(b);
  return x < y + bBytes && y < x + aBytes;
}

/// Marks a rank as in a call for as long as it lives; the lock must be held
/// when it is made, and is taken again if needed when it ends.
class CallScope {
public:
  CallScope(InProcessState &state, std::unique_lock<std::mutex> &lock, int rank,
            const Call &call, const InProcessGroup &group, int member,
            uint64_t seq, uint64_t recvSeq = 0)
      : state_(state), lock_(lock), rank_(rank) {
    state_.beginCallLocked(rank, call, group, member, seq, recvSeq);
  }
  ~CallScope() {
    if (!lock_.owns_lock())
      lock_.lock();
    state_.endCallLocked(rank_);
  }
  CallScope(const CallScope &) = delete;
  CallScope &operator=(const CallScope &) = delete;

private:
  InProcessState &state_;
  std::unique_lock<std::mutex> &lock_;
  int rank_;
};

void notifyMembersLocked(InProcessState &state, const InProcessGroup &group) {
  for (int rank : group.members)
    state.notifyLocked(rank);
}

std::string rankList(const std::vector<int> &ranks) {
  std::string text = ranks.size() == 1 ? "rank " : "ranks ";
  for (size_t i = 0; i < ranks.size(); ++i)
    text += (i ? ", " : "") + std::to_string(ranks[i]);
  return text;
}

} // namespace

InProcessCommunicator::InProcessCommunicator(
    std::shared_ptr<InProcessState> state,
    std::shared_ptr<InProcessGroup> group, int member)
    : state_(std::move(state)), group_(std::move(group)), member_(member) {}

InProcessCommunicator::~InProcessCommunicator() = default;

int InProcessCommunicator::size() const { return group_->size(); }
int InProcessCommunicator::worldRank() const {
  return group_->members[member_];
}
const std::string &InProcessCommunicator::name() const { return group_->name; }
uint64_t InProcessCommunicator::inProcessGroupId() const { return group_->id; }
const std::vector<int> &InProcessCommunicator::members() const {
  return group_->members;
}

void InProcessCommunicator::abort(std::string_view reason) {
  state_->abort("rank " + std::to_string(worldRank()) +
                " aborted: " + std::string(reason));
}

void InProcessCommunicator::execute(const Call &call) {
  if (isCollective(call.kind))
    collective(call);
  else
    pointToPoint(call);
}

std::unique_ptr<Communicator>
InProcessCommunicator::executeSplit(const Call &call) {
  auto [group, member] = collective(call);
  if (!group)
    return nullptr;
  return std::make_unique<InProcessCommunicator>(state_, std::move(group),
                                                 member);
}

std::pair<std::shared_ptr<InProcessGroup>, int>
InProcessCommunicator::collective(const Call &call) {
  InProcessState &state = *state_;
  InProcessGroup &group = *group_;
  const int n = group.size();
  const int self = worldRank();
  const size_t chunk = static_cast<size_t>(call.count) * dtypeSize(call.dtype);
  size_t inBytes = chunk, outBytes = chunk;
  if (call.kind == CallKind::AllGather)
    outBytes = chunk * n;
  if (call.kind == CallKind::ReduceScatter)
    inBytes = chunk * n;
  if (call.kind == CallKind::Broadcast && call.peer == member_)
    outBytes = 0; // The root only gives.

  const uint64_t seq = ++collectives_;
  std::unique_lock<std::mutex> lock(state.mutex);
  CallScope scope(state, lock, self, call, group, member_, seq);

  // Phase 1: arrive, and wait for the others.
  group.slots[member_] = &call;
  ++group.arrived;
  try {
    if (group.arrived == n)
      completeArrivalLocked(seq);
    else
      state.waitLocked(
          lock, self, [&] { return group.gathered >= seq; },
          [] { return true; });
  } catch (...) {
    group.slots[member_] = nullptr;
    --group.arrived;
    throw;
  }

  // Phase 2: read the others' inputs. The slots stay as they are until every
  // rank has finished here, so no lock is needed to read them.
  std::pair<std::shared_ptr<InProcessGroup>, int> split =
      group.splitResults[member_];
  inputs_.assign(n, nullptr);
  for (int r = 0; r < n; ++r)
    if (call.kind != CallKind::Broadcast || r == call.peer)
      inputs_[r] = group.slots[r]->send;
  lock.unlock();
  void *out = call.recv;
  bool outOfMemory = false;
  try {
    bool aliased = false;
    for (int r = 0; r < n; ++r)
      aliased = aliased || overlaps(call.recv, outBytes, inputs_[r], inBytes);
    if (aliased) {
      if (scratch_.size() < outBytes)
        scratch_.resize(outBytes);
      out = scratch_.data();
    }
    compute(call, out);
  } catch (const std::bad_alloc &) {
    outOfMemory = true;
  }
  lock.lock();
  if (++group.finished == n) {
    group.finished = 0;
    std::fill(group.slots.begin(), group.slots.end(), nullptr);
    std::fill(group.splitResults.begin(), group.splitResults.end(),
              std::pair<std::shared_ptr<InProcessGroup>, int>());
    group.released = seq;
    notifyMembersLocked(state, group);
  } else {
    state.waitBoundedLocked(lock, self, [&] { return group.released >= seq; });
  }
  if (outOfMemory) {
    std::string message = state.describeCallLocked(self) +
                          ": out of memory for a scratch buffer of " +
                          std::to_string(outBytes) + " bytes";
    state.abortLocked(message, self);
    throw Error(MTRT_STATUS_RESOURCE_EXHAUSTED, message);
  }
  lock.unlock();
  // Every rank has finished reading, so an input that is also this rank's
  // output may now be written.
  if (out != call.recv && outBytes)
    std::memcpy(call.recv, out, outBytes);
  return split;
}

void InProcessCommunicator::completeArrivalLocked(uint64_t seq) {
  InProcessState &state = *state_;
  InProcessGroup &group = *group_;
  const Call &first = *group.slots[0];
  bool same = true;
  for (const Call *call : group.slots)
    same = same && call->sameCollectiveAs(first);
  if (!same) {
    // Ranks that made the same call are listed together.
    std::vector<std::pair<std::string, std::vector<int>>> calls;
    for (int r = 0; r < group.size(); ++r) {
      std::string text = group.slots[r]->describe(group.members);
      auto it =
          std::find_if(calls.begin(), calls.end(),
                       [&](const auto &entry) { return entry.first == text; });
      if (it == calls.end())
        calls.push_back({text, {group.members[r]}});
      else
        it->second.push_back(group.members[r]);
    }
    std::string message = "mismatched collectives: ";
    for (size_t i = 0; i < calls.size(); ++i)
      message += (i ? ", " : "") + rankList(calls[i].second) + " called " +
                 calls[i].first;
    message +=
        " at collective #" + std::to_string(seq) + " of group " + group.name;
    state.abortLocked(message, worldRank());
    throw Error(MTRT_STATUS_ABORTED, message);
  }

  if (first.kind == CallKind::Split) {
    // Like MPI_Comm_split: by color, then key, then rank in this group.
    std::vector<std::tuple<int, int, int>> order;
    for (int r = 0; r < group.size(); ++r)
      if (group.slots[r]->color >= 0)
        order.emplace_back(group.slots[r]->color, group.slots[r]->key, r);
    std::sort(order.begin(), order.end());
    for (size_t begin = 0; begin < order.size();) {
      size_t end = begin;
      std::vector<int> members;
      while (end < order.size() &&
             std::get<0>(order[end]) == std::get<0>(order[begin]))
        members.push_back(group.members[std::get<2>(order[end++])]);
      std::shared_ptr<InProcessGroup> made = state.addGroupLocked(
          std::string(group.slots[std::get<2>(order[begin])]->name),
          std::move(members));
      for (size_t i = begin; i < end; ++i)
        group.splitResults[std::get<2>(order[i])] = {
            made, static_cast<int>(i - begin)};
      begin = end;
    }
  }
  group.arrived = 0;
  group.gathered = seq;
  notifyMembersLocked(state, group);
}

void InProcessCommunicator::compute(const Call &call, void *out) {
  const int n = group_->size();
  const size_t chunk = static_cast<size_t>(call.count) * dtypeSize(call.dtype);
  switch (call.kind) {
  case CallKind::AllReduce:
    reduceInFixedOrder(call.dtype, call.op, inputs_.data(), n, 0, call.count,
                       out);
    break;
  case CallKind::ReduceScatter:
    reduceInFixedOrder(call.dtype, call.op, inputs_.data(), n,
                       member_ * call.count, call.count, out);
    break;
  case CallKind::AllGather:
    for (int r = 0; r < n && chunk; ++r)
      std::memcpy(static_cast<unsigned char *>(out) + r * chunk, inputs_[r],
                  chunk);
    break;
  case CallKind::Broadcast:
    if (call.peer != member_ && chunk)
      std::memcpy(out, inputs_[call.peer], chunk);
    break;
  default:
    break;
  }
}

void InProcessCommunicator::pointToPoint(const Call &call) {
  InProcessState &state = *state_;
  InProcessGroup &group = *group_;
  const int self = worldRank();
  std::unique_lock<std::mutex> lock(state.mutex);
  if (call.kind == CallKind::SendAsync) {
    InProcessChannel &channel = group.channel(member_, call.peer);
    const uint64_t seq = channel.sendsPosted + 1;
    CallScope scope(state, lock, self, call, group, member_, seq);
    auto message = std::make_unique<InProcessQueuedMessage>();
    message->call = call;
    message->label = std::string(call.info.label);
    message->call.info.label = message->label;
    const auto *bytes = static_cast<const unsigned char *>(call.send);
    message->bytes.assign(
        bytes, bytes + static_cast<size_t>(call.count) * dtypeSize(call.dtype));
    message->call.send = message->bytes.data();
    channel.sendsPosted = seq;
    channel.queued.push_back(std::move(message));
    state.notifyLocked(group.members[call.peer]);
    return;
  }
  InProcessChannel *out = nullptr, *in = nullptr;
  int from = -1;
  if (call.kind != CallKind::Recv)
    out = &group.channel(member_, call.peer);
  if (call.kind != CallKind::Send) {
    from = call.kind == CallKind::Recv ? call.peer : call.recvPeer;
    in = &group.channel(from, member_);
  }
  const uint64_t sendSeq = out ? out->sendsPosted + 1 : 0;
  const uint64_t recvSeq = in ? in->recvsPosted + 1 : 0;
  CallScope scope(state, lock, self, call, group, member_, sendSeq, recvSeq);
  if (out) {
    out->sendsPosted = sendSeq;
    out->send = &call;
    state.notifyLocked(group.members[call.peer]);
  }
  if (in) {
    in->recvsPosted = recvSeq;
    in->recv = &call;
  }
  // While a receiver copies from this rank's buffer, it may not leave.
  auto beingRead = [&] { return out && out->send == &call && out->claimed; };
  try {
    if (in) {
      state.waitLocked(
          lock, self,
          [&] { return in->send != nullptr || !in->queued.empty(); },
          [&] { return !beingRead(); });
      receiveLocked(lock, call, from);
    }
    if (out)
      state.waitLocked(
          lock, self, [&] { return out->completed >= sendSeq; },
          [&] { return !beingRead(); });
  } catch (...) {
    state.waitBoundedLocked(lock, self, [&] { return !beingRead(); });
    if (out && out->send == &call)
      out->send = nullptr;
    if (in && in->recv == &call)
      in->recv = nullptr;
    throw;
  }
}

void InProcessCommunicator::receiveLocked(std::unique_lock<std::mutex> &lock,
                                          const Call &call, int from) {
  InProcessState &state = *state_;
  InProcessGroup &group = *group_;
  InProcessChannel &in = group.channel(from, member_);
  // A send_async's message is older than any posted send.
  std::unique_ptr<InProcessQueuedMessage> queued;
  if (!in.queued.empty()) {
    queued = std::move(in.queued.front());
    in.queued.pop_front();
  }
  const Call &sent = queued ? queued->call : *in.send;
  if (sent.count != call.count || sent.dtype != call.dtype) {
    std::string message =
        "mismatched messages: rank " + std::to_string(group.members[from]) +
        " sent " + sent.describe(group.members) + ", rank " +
        std::to_string(worldRank()) + " received with " +
        call.describe(group.members) + " at message #" +
        std::to_string(in.recvsPosted) + " from rank " +
        std::to_string(group.members[from]) + " to rank " +
        std::to_string(worldRank()) + " of group " + group.name;
    state.abortLocked(message, worldRank());
    throw Error(MTRT_STATUS_ABORTED, message);
  }
  if (queued) {
    if (call.count)
      std::memcpy(call.recv, sent.send,
                  static_cast<size_t>(call.count) * dtypeSize(call.dtype));
    in.recv = nullptr;
    ++in.completed;
    return;
  }
  in.claimed = true;
  lock.unlock();
  // memmove: a send_recv to this same rank may pass overlapping buffers.
  if (call.count)
    std::memmove(call.recv, sent.send,
                 static_cast<size_t>(call.count) * dtypeSize(call.dtype));
  lock.lock();
  in.claimed = false;
  in.send = nullptr;
  in.recv = nullptr;
  ++in.completed;
  state.notifyLocked(group.members[from]);
}

} // namespace mtrt::comm
