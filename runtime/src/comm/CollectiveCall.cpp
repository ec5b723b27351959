// Names and descriptions of communicator calls, for error messages.
#include "comm/CollectiveCall.h"

namespace mtrt::comm {

const char *reduceOpName(ReduceOp op) {
  switch (op) {
  case ReduceOp::Sum:
    return "sum";
  case ReduceOp::Max:
    return "max";
  }
  return "?";
}

const char *callKindName(CallKind kind) {
  switch (kind) {
  case CallKind::AllReduce:
    return "all_reduce";
  case CallKind::AllGather:
    return "all_gather";
  case CallKind::ReduceScatter:
    return "reduce_scatter";
  case CallKind::Broadcast:
    return "broadcast";
  case CallKind::Barrier:
    return "barrier";
  case CallKind::Split:
    return "split";
  case CallKind::Send:
    return "send";
  case CallKind::Recv:
    return "recv";
  case CallKind::SendRecv:
    return "send_recv";
  case CallKind::SendAsync:
    return "send_async";
  }
  return "?";
}

bool isCollective(CallKind kind) {
  return kind != CallKind::Send && kind != CallKind::Recv &&
         kind != CallKind::SendRecv && kind != CallKind::SendAsync;
}

bool Call::sameCollectiveAs(const Call &other) const {
  if (kind != other.kind)
    return false;
  switch (kind) {
  case CallKind::Barrier:
  case CallKind::Split:
    return true;
  case CallKind::AllReduce:
  case CallKind::ReduceScatter:
    return count == other.count && dtype == other.dtype && op == other.op;
  case CallKind::Broadcast:
    return count == other.count && dtype == other.dtype && peer == other.peer;
  default:
    return count == other.count && dtype == other.dtype;
  }
}

namespace {
/// "rank 5" (the world rank), or "group rank 9" when out of range, so that
/// the message shows the value given.
std::string rankText(const std::vector<int> &members, int groupRank) {
  if (groupRank >= 0 && groupRank < static_cast<int>(members.size()))
    return "rank " + std::to_string(members[groupRank]);
  return "group rank " + std::to_string(groupRank);
}
} // namespace

std::string Call::describe(const std::vector<int> &members) const {
  std::string text = callKindName(kind);
  if (kind == CallKind::AllReduce || kind == CallKind::ReduceScatter)
    text += std::string(" ") + reduceOpName(op);
  if (kind == CallKind::Split) {
    text += " into \"" + std::string(name) + "\" with color " +
            std::to_string(color) + ", key " + std::to_string(key);
  } else if (kind != CallKind::Barrier) {
    text += " of " + std::to_string(count) + " " + dtypeName(dtype);
    if (kind == CallKind::AllGather || kind == CallKind::ReduceScatter)
      text += " per rank";
  }
  switch (kind) {
  case CallKind::Broadcast:
  case CallKind::Recv:
    text += " from " + rankText(members, peer);
    break;
  case CallKind::Send:
  case CallKind::SendAsync:
    text += " to " + rankText(members, peer);
    break;
  case CallKind::SendRecv:
    text += " to " + rankText(members, peer) + " and from " +
            rankText(members, recvPeer);
    break;
  default:
    break;
  }
  text += " (\"" + std::string(info.label) + "\"";
  if (info.step >= 0)
    text += ", step " + std::to_string(info.step);
  return text + ")";
}

std::string groupName(std::string_view name, const std::vector<int> &members) {
  std::string text(name);
  text += "[";
  for (size_t i = 0; i < members.size();) {
    size_t end = i + 1;
    while (end < members.size() && members[end] == members[end - 1] + 1)
      ++end;
    if (i)
      text += ",";
    if (end - i >= 3) {
      text +=
          std::to_string(members[i]) + "-" + std::to_string(members[end - 1]);
    } else {
      text += std::to_string(members[i]);
      if (end - i == 2)
        text += "," + std::to_string(members[i + 1]);
    }
    i = end;
  }
  return text + "]";
}

} // namespace mtrt::comm
