// One communicator call as data, and the text that messages use to name it.
#ifndef MTRT_SRC_COMM_COLLECTIVECALL_H
#define MTRT_SRC_COMM_COLLECTIVECALL_H

#include "core/Bundle.h"

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace mtrt::comm {

/// How all_reduce and reduce_scatter combine the ranks' contributions.
enum class ReduceOp : uint8_t {
  /// x0 + x1 + ... + x(n-1), added as a balanced tree over the group ranks
  /// ((x0 + x1) + (x2 + x3) for four; FixedOrderReduce.h).
  Sum,
  /// The largest; NaN if any contribution is NaN; of equal values (such as
  /// -0 and +0) the lowest rank's.
  Max,
};

/// "sum", "max".
const char *reduceOpName(ReduceOp op);

/// What a call is for, given by the caller and only used in messages: a label
/// such as "all_reduce tp grads of linear 12" and the training step (or any
/// sequence number the caller keeps; negative when there is none). The label
/// is only read during the call.
struct CallInfo {
  std::string_view label;
  int64_t step = -1;
};

enum class CallKind : uint8_t {
  AllReduce,
  AllGather,
  ReduceScatter,
  Broadcast,
  Barrier,
  Split,
  Send,
  Recv,
  SendRecv,
  SendAsync,
};

/// "all_reduce", "send_recv", ...
const char *callKindName(CallKind kind);

/// True for the kinds every rank of the group calls together (all but
/// send, recv and send_recv).
bool isCollective(CallKind kind);

/// One call of one rank. Ranks are group ranks; `count` is in elements:
///   all_reduce      send[count] -> recv[count]
///   all_gather      send[count] -> recv[count * size], rank r's at r * count
///   reduce_scatter  send[count * size] -> recv[count], chunk r to rank r
///   broadcast       recv[count] on every rank; `root`'s is the source
///   send            send[count] to `peer`
///   recv            recv[count] from `peer`
///   send_recv       send[count] to `peer`, recv[count] from `recvPeer`
///   send_async      send[count] to `peer`, returning at once (buffered)
///   split           `color`, `key`, `name`
struct Call {
  CallKind kind = CallKind::Barrier;
  const void *send = nullptr;
  void *recv = nullptr;
  int64_t count = 0;
  DType dtype = DType::F32;
  ReduceOp op = ReduceOp::Sum;
  /// The root of a broadcast, the destination of send and send_recv.
  int peer = -1;
  /// The source of send_recv.
  int recvPeer = -1;
  int color = -1;
  int key = 0;
  std::string_view name;
  CallInfo info;

  /// Whether every rank must have passed the same values for this call to
  /// mean one collective: kind, count, dtype, and the reduce op or root where
  /// the kind has one.
  bool sameCollectiveAs(const Call &other) const;

  /// "all_reduce sum of 64 f32 (\"grads\", step 3)", with `peer` and
  /// `recvPeer` printed as members[peer], the world ranks that messages name.
  std::string describe(const std::vector<int> &members) const;
};

/// "tp[0,1]", "dp[0,2,4,6]", "world[0-7]": a group's name followed by its
/// members' world ranks, with runs of three or more written as a range.
std::string groupName(std::string_view name, const std::vector<int> &members);

} // namespace mtrt::comm

#endif // MTRT_SRC_COMM_COLLECTIVECALL_H
