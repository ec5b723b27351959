// The communicator's entry points: shared argument checks, then execute().
#include "comm/Communicator.h"

namespace mtrt::comm {

namespace {
/// A call that moves `count` elements of `dtype`; the entry points below add
/// what their kind needs (a reduction, a peer).
Call dataCall(CallKind kind, const void *send, void *recv, int64_t count,
              DType dtype, const CallInfo &info) {
  Call call;
  call.kind = kind;
  call.send = send;
  call.recv = recv;
  call.count = count;
  call.dtype = dtype;
  call.info = info;
  return call;
}
} // namespace

void Communicator::allReduce(const void *send, void *recv, int64_t count,
                             DType dtype, ReduceOp op, const CallInfo &info) {
  Call call = dataCall(CallKind::AllReduce, send, recv, count, dtype, info);
  call.op = op;
  run(call);
}

void Communicator::allGather(const void *send, void *recv, int64_t count,
                             DType dtype, const CallInfo &info) {
  run(dataCall(CallKind::AllGather, send, recv, count, dtype, info));
}

void Communicator::reduceScatter(const void *send, void *recv, int64_t count,
                                 DType dtype, ReduceOp op,
                                 const CallInfo &info) {
  Call call = dataCall(CallKind::ReduceScatter, send, recv, count, dtype, info);
  call.op = op;
  run(call);
}

void Communicator::broadcast(void *buffer, int64_t count, DType dtype, int root,
                             const CallInfo &info) {
  Call call = dataCall(CallKind::Broadcast, buffer, buffer, count, dtype, info);
  call.peer = root;
  run(call);
}

void Communicator::send(const void *buffer, int64_t count, DType dtype,
                        int peer, const CallInfo &info) {
  Call call = dataCall(CallKind::Send, buffer, nullptr, count, dtype, info);
  call.peer = peer;
  run(call);
}

void Communicator::sendAsync(const void *buffer, int64_t count, DType dtype,
                             int peer, const CallInfo &info) {
  Call call =
      dataCall(CallKind::SendAsync, buffer, nullptr, count, dtype, info);
  call.peer = peer;
  run(call);
}

void Communicator::recv(void *buffer, int64_t count, DType dtype, int peer,
                        const CallInfo &info) {
  Call call = dataCall(CallKind::Recv, nullptr, buffer, count, dtype, info);
  call.peer = peer;
  run(call);
}

void Communicator::sendRecv(const void *sendBuffer, int sendPeer,
                            void *recvBuffer, int recvPeer, int64_t count,
                            DType dtype, const CallInfo &info) {
  Call call = dataCall(CallKind::SendRecv, sendBuffer, recvBuffer, count,
                       dtype, info);
  call.peer = sendPeer;
  call.recvPeer = recvPeer;
  run(call);
}

void Communicator::barrier(const CallInfo &info) {
  run(dataCall(CallKind::Barrier, nullptr, nullptr, 0, DType::F32, info));
}

std::unique_ptr<Communicator> Communicator::split(int color, int key,
                                                  std::string_view name,
                                                  const CallInfo &info) {
  Call call;
  call.kind = CallKind::Split;
  call.color = color;
  call.key = key;
  call.name = name;
  call.info = info;
  validate(call);
  return executeSplit(call);
}

void Communicator::run(const Call &call) {
  validate(call);
  execute(call);
}

void Communicator::validate(const Call &call) {
  auto reject = [&](const std::string &problem) {
    std::string what =
        call.describe(members()) + " in group " + name() + ": " + problem;
    abort(what);
    throw Error(MTRT_STATUS_INVALID_ARGUMENT,
                "rank " + std::to_string(worldRank()) + ": " + what);
  };
  auto checkRank = [&](int groupRank, const char *what) {
    if (groupRank < 0 || groupRank >= size())
      reject(std::string(what) + " " + std::to_string(groupRank) +
             " is not a rank of the group (0 to " + std::to_string(size() - 1) +
             ")");
  };

  if (call.kind == CallKind::Split) {
    if (call.color < 0 && call.color != kNoColor)
      reject("color " + std::to_string(call.color) +
             " is negative; use a color >= 0, or Communicator::kNoColor (" +
             std::to_string(kNoColor) + ") to join no group");
    if (call.name.empty())
      reject("the new group has no name; name it (\"tp\", \"dp\", ...) so "
             "that messages can tell groups apart");
    return;
  }
  if (call.kind == CallKind::Barrier)
    return;

  if (call.count < 0)
    reject("count " + std::to_string(call.count) + " is negative");
  // all_gather and reduce_scatter touch count * size elements.
  if (call.count > kMaxElements / size())
    reject("count " + std::to_string(call.count) + " times the group size " +
           std::to_string(size()) + " is over the limit of " +
           std::to_string(kMaxElements) + " elements");
  if (!supportsDType(call.dtype)) {
    std::string supported;
    for (DType dtype : {DType::F32, DType::F64, DType::BF16, DType::F16,
                        DType::I32, DType::I64})
      if (supportsDType(dtype))
        supported +=
            std::string(supported.empty() ? "" : ", ") + dtypeName(dtype);
    reject(std::string("dtype ") + dtypeName(call.dtype) +
           " is not supported by this communicator (it takes " + supported +
           ")");
  }
  bool sends = call.kind != CallKind::Recv && call.kind != CallKind::Broadcast;
  bool receives =
      call.kind != CallKind::Send && call.kind != CallKind::SendAsync;
  if (call.count > 0 && sends && !call.send)
    reject("the send buffer is null");
  if (call.count > 0 && receives && !call.recv)
    reject(call.kind == CallKind::Broadcast ? "the buffer is null"
                                            : "the receive buffer is null");
  switch (call.kind) {
  case CallKind::Broadcast:
    checkRank(call.peer, "root");
    break;
  case CallKind::Send:
  case CallKind::SendAsync:
  case CallKind::Recv:
    checkRank(call.peer, "peer");
    if (call.peer == rank())
      reject(std::string("a ") + callKindName(call.kind) +
             " with itself never completes; use sendRecv to copy to the "
             "same rank");
    break;
  case CallKind::SendRecv:
    checkRank(call.peer, "send peer");
    checkRank(call.recvPeer, "receive peer");
    break;
  default:
    break;
  }
}

} // namespace mtrt::comm
