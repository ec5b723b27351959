// The collective interface the executors call: one rank of a group of ranks.
#ifndef MTRT_SRC_COMM_COMMUNICATOR_H
#define MTRT_SRC_COMM_COMMUNICATOR_H

#include "comm/CollectiveCall.h"
#include "core/Bundle.h"
#include "core/Error.h"

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

namespace mtrt::comm {

/// The DType of a C++ element type, for the typed overloads.
template <typename T> struct DTypeOf;
template <> struct DTypeOf<float> {
  static constexpr DType value = DType::F32;
};
template <> struct DTypeOf<double> {
  static constexpr DType value = DType::F64;
};

/// One rank of a group of ranks, with the collectives of NCCL and MPI over
/// contiguous buffers.
///
/// Rules every implementation keeps:
/// - Every rank of the group makes the same collective calls in the same
///   order, with the same kind, count, dtype, reduce op and root. The n-th
///   send from rank a to rank b pairs with the n-th recv of b from a, and the
///   two agree on count and dtype. A rank that breaks these rules, fails
///   locally (abort), or does not arrive within the timeout aborts the whole
///   world: every pending and later call on every rank throws mtrt::Error
///   with code MTRT_STATUS_ABORTED and a message that names the ranks, the
///   calls (kind, count, dtype, label, step) and the call's position ("at
///   collective #7 of group tp[0,1]"). Ranks in messages are world ranks.
/// - Reductions are deterministic: contributions are combined in one fixed
///   order over the group ranks (ReduceOp: sums as a balanced tree), so
///   every rank gets the same bits.
/// - When a call returns, its output is ready for this rank's next work and
///   its input may be reused: at once on the host; an NCCL implementation
///   will order the call on the stream it was made with instead. send
///   completes once the receiver has the data, so two ranks that send to
///   each other first deadlock (as under NCCL without a group call);
///   sendRecv does both at once.
/// - In place is allowed: all_reduce with send == recv; all_gather with
///   send == recv + rank() * count; reduce_scatter with
///   recv == send + rank() * count.
/// - Arguments that cannot be right (negative counts, null buffers, roots or
///   peers out of range, unsupported dtypes) throw INVALID_ARGUMENT on the
///   calling rank and abort the world, so no other rank waits for it.
///
/// Thread-safety: one thread at a time per rank, and a rank's communicators
/// (the world's and those split from it) are used in that thread's program
/// order. abort() may be called from any thread at any time.
class Communicator {
public:
  /// The color that joins no group in split().
  static constexpr int kNoColor = -1;

  virtual ~Communicator() = default;
  Communicator(const Communicator &) = delete;
  Communicator &operator=(const Communicator &) = delete;

  /// This rank's index in the group, 0 <= rank() < size().
  virtual int rank() const = 0;
  virtual int size() const = 0;
  /// This rank in the world the group was split from; messages name these.
  virtual int worldRank() const = 0;
  /// The group for messages: "tp[0,1]", its name and its world ranks.
  virtual const std::string &name() const = 0;
  /// The world rank of each group rank, in group order.
  virtual const std::vector<int> &members() const = 0;

  /// The CUDA stream (a cudaStream_t) this communicator orders its calls on,
  /// for one that takes device memory (NCCL): a call returns once enqueued
  /// there, and later work on that stream sees its result. nullptr for one
  /// that takes host memory and completes each call before it returns (the
  /// in-process communicator). cuda/DeviceCollective.h picks its path by it.
  virtual void *deviceStream() const { return nullptr; }
  /// Whether calls may be given device buffers without staging them on the
  /// host (deviceStream() is set).
  bool takesDeviceMemory() const { return deviceStream() != nullptr; }
  /// Nonzero when every rank of the group is a thread of this process (the
  /// in-process communicator): the same id on each of the group's
  /// communicators, and no other group of the process has it. Ranks sharing
  /// an address space may read each other's buffers directly: on one GPU,
  /// cuda/PeerCollective.h runs the group's collectives as kernels that do.
  virtual uint64_t inProcessGroupId() const { return 0; }

  /// recv[i] = send[i] of every rank, combined with `op` in a fixed
  /// order (sums as the balanced rank tree of FixedOrderReduce.h).
  void allReduce(const void *send, void *recv, int64_t count, DType dtype,
                 ReduceOp op, const CallInfo &info);
  /// recv[r * count + i] = send[i] of rank r.
  void allGather(const void *send, void *recv, int64_t count, DType dtype,
                 const CallInfo &info);
  /// recv[i] = send[rank() * count + i] of every rank, combined with `op` in
  /// the same fixed order.
  void reduceScatter(const void *send, void *recv, int64_t count, DType dtype,
                     ReduceOp op, const CallInfo &info);
  /// buffer[i] = buffer[i] of rank `root`, on every rank.
  void broadcast(void *buffer, int64_t count, DType dtype, int root,
                 const CallInfo &info);
  /// Gives buffer[count] to the matching recv of rank `peer`.
  void send(const void *buffer, int64_t count, DType dtype, int peer,
            const CallInfo &info);
  /// send() without waiting for the receiver: returns at once, and the
  /// buffer may be reused (the in-process communicator copies it; an NCCL
  /// implementation orders it on a side stream). Pairs with the peer's recv
  /// in the same per-pair order as send, so a pipeline schedule whose
  /// receives are in its sends' order cannot deadlock on its sends
  /// (Megatron-LM's isend).
  void sendAsync(const void *buffer, int64_t count, DType dtype, int peer,
                 const CallInfo &info);
  /// Fills buffer[count] from the matching send of rank `peer`.
  void recv(void *buffer, int64_t count, DType dtype, int peer,
            const CallInfo &info);
  /// send(sendBuffer, sendPeer) and recv(recvBuffer, recvPeer) at once, as a
  /// pipeline or ring exchange needs; either peer may be this rank.
  void sendRecv(const void *sendBuffer, int sendPeer, void *recvBuffer,
                int recvPeer, int64_t count, DType dtype, const CallInfo &info);
  /// Returns once every rank of the group has called it.
  void barrier(const CallInfo &info);
  /// A collective that makes one group per color >= 0 of the ranks that pass
  /// it, ordered by (key, rank()), named groupName(name, world ranks); each
  /// rank gets its communicator in its group, or nullptr for kNoColor. Like
  /// MPI_Comm_split and ncclCommSplit.
  std::unique_ptr<Communicator> split(int color, int key, std::string_view name,
                                      const CallInfo &info);

  /// Fails every pending and later call of every rank of this world with
  /// ABORTED and a message naming this rank and `reason`, for a rank that
  /// failed locally and will make no more calls. The first abort's message
  /// wins; later ones are ignored.
  virtual void abort(std::string_view reason) = 0;

  template <typename T>
  void allReduce(const T *send, T *recv, int64_t count, ReduceOp op,
                 const CallInfo &info) {
    allReduce(send, recv, count, DTypeOf<T>::value, op, info);
  }
  template <typename T>
  void allGather(const T *send, T *recv, int64_t count, const CallInfo &info) {
    allGather(send, recv, count, DTypeOf<T>::value, info);
  }
  template <typename T>
  void reduceScatter(const T *send, T *recv, int64_t count, ReduceOp op,
                     const CallInfo &info) {
    reduceScatter(send, recv, count, DTypeOf<T>::value, op, info);
  }
  template <typename T>
  void broadcast(T *buffer, int64_t count, int root, const CallInfo &info) {
    broadcast(buffer, count, DTypeOf<T>::value, root, info);
  }
  template <typename T>
  void send(const T *buffer, int64_t count, int peer, const CallInfo &info) {
    send(buffer, count, DTypeOf<T>::value, peer, info);
  }
  template <typename T>
  void sendAsync(const T *buffer, int64_t count, int peer,
                 const CallInfo &info) {
    sendAsync(buffer, count, DTypeOf<T>::value, peer, info);
  }
  template <typename T>
  void recv(T *buffer, int64_t count, int peer, const CallInfo &info) {
    recv(buffer, count, DTypeOf<T>::value, peer, info);
  }
  template <typename T>
  void sendRecv(const T *sendBuffer, int sendPeer, T *recvBuffer, int recvPeer,
                int64_t count, const CallInfo &info) {
    sendRecv(sendBuffer, sendPeer, recvBuffer, recvPeer, count,
             DTypeOf<T>::value, info);
  }

protected:
  Communicator() = default;

  /// Runs a call whose arguments passed the checks above. Throws mtrt::Error.
  virtual void execute(const Call &call) = 0;
  /// Runs a split; returns nullptr for kNoColor.
  virtual std::unique_ptr<Communicator> executeSplit(const Call &call) = 0;
  /// Whether execute() takes `dtype`; the others are rejected up front.
  virtual bool supportsDType(DType dtype) const = 0;

private:
  /// Rejects arguments that cannot be right (INVALID_ARGUMENT, after
  /// aborting the world), then runs the call.
  void run(const Call &call);
  void validate(const Call &call);
};

} // namespace mtrt::comm

#endif // MTRT_SRC_COMM_COMMUNICATOR_H
