// Communicator calls over device buffers, in the order of a CUDA stream: the
// one way the CUDA backend's instructions, optimizer and schedules reach a
// comm::Communicator.
#ifndef MTRT_SRC_CUDA_DEVICECOLLECTIVE_H
#define MTRT_SRC_CUDA_DEVICECOLLECTIVE_H

#include "comm/Communicator.h"

#include <cuda_runtime_api.h>

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

namespace mtrt::cuda {

class PeerGroup;

/// Runs comm::Communicator calls on device buffers as work of `stream`: each
/// call sees every earlier piece of work on the stream, and later work on
/// the stream sees its result. Buffers, counts, dtypes and the in-place rules
/// are the Communicator's (comm/Communicator.h); `info` names the call in
/// failures (a label and the training step).
///
/// Three paths, picked per call by the communicator:
/// - takesDeviceMemory() (NCCL): straight through, no host copy and no
///   synchronization. When the communicator's stream is not `stream`, an
///   event on each side orders the two (the call waits for `stream`'s work,
///   `stream` waits for the call). A hang or a dead peer is the
///   communicator's watchdog's to report.
/// - with `peerKernels`, the in-process communicator of the one-GPU checks,
///   for all-reduce, all-gather, reduce-scatter and broadcast of fp32 or
///   bf16 elements:
///   kernels on `stream` that read the peers' buffers (PeerGroup,
///   cuda/PeerCollective.h); the host does not wait, the same bits as the
///   staged path, and a CUDA graph may capture them.
/// - otherwise (the in-process communicator's point-to-point calls and
///   other element types): the send
///   buffer is copied to the host after `stream`'s work, the call runs on
///   host memory, and the result is copied back; the call returns once the
///   result is on the device. bf16 buffers are widened to fp32 on the host
///   for the call (the in-process communicator takes fp32) and its result
///   rounded back to bf16 (nearest even): a sum rounds once. Correct, not
///   fast.
///
/// Thread-safety: one thread at a time (the rank's), as the Communicator.
class DeviceCollective {
public:
  /// Calls ordered on `stream`, of the current CUDA device; `where` prefixes
  /// the messages of failed CUDA calls ("train_step of bundle 'x'").
  /// `peerKernels`: the in-process communicator's collectives through
  /// PeerGroup (ContextOptions::peerCollectives); off: staged.
  DeviceCollective(cudaStream_t stream, std::string where,
                   bool peerKernels = false);
  ~DeviceCollective();
  DeviceCollective(const DeviceCollective &) = delete;
  DeviceCollective &operator=(const DeviceCollective &) = delete;

  cudaStream_t stream() const { return stream_; }

  /// Whether this one's collectives (all-reduce, all-gather,
  /// reduce-scatter) of `dtype` elements over `comm` run on the device
  /// without the host waiting: NCCL, or PeerGroup's kernels.
  bool runsOnDevice(const comm::Communicator &comm, DType dtype) const;

  /// PeerGroup calls captured in a CUDA graph on `stream` since the last
  /// take, per group: the graph's launch must release them
  /// (PeerGroup::post and await with `count`, then the launch).
  struct CapturedCalls {
    std::shared_ptr<PeerGroup> group;
    int rank = 0;
    uint64_t count = 0;
    /// The barrier kernels of those calls.
    uint64_t barriers = 0;
  };
  std::vector<CapturedCalls> takeCapturedCalls();

  /// recv[count] = send[count] combined over the group's ranks.
  void allReduce(comm::Communicator &comm, const void *send, void *recv,
                 int64_t count, DType dtype, comm::ReduceOp op,
                 const comm::CallInfo &info);
  /// recv[size * count]: rank r's send[count] at r * count.
  void allGather(comm::Communicator &comm, const void *send, void *recv,
                 int64_t count, DType dtype, const comm::CallInfo &info);
  /// recv[count] = block rank() of send[size * count], combined over ranks.
  void reduceScatter(comm::Communicator &comm, const void *send, void *recv,
                     int64_t count, DType dtype, comm::ReduceOp op,
                     const comm::CallInfo &info);
  /// buffer[count] = root's buffer on every rank.
  void broadcast(comm::Communicator &comm, void *buffer, int64_t count,
                 DType dtype, int root, const comm::CallInfo &info);
  /// buffer[count] to `peer`'s matching recv.
  void send(comm::Communicator &comm, const void *buffer, int64_t count,
            DType dtype, int peer, const comm::CallInfo &info);
  /// send() without waiting for the receiver (comm::Communicator::sendAsync:
  /// a pipeline schedule's sends). Staged: the host copy is sent, which the
  /// communicator copies, and `buffer` is free at once. Straight through:
  /// enqueued on the communicator's stream after `stream`'s work, and
  /// `stream` does not wait for it; `buffer` must stay unchanged until a
  /// later call that the host waits for passes the communicator's stream
  /// (e.g. a collective on host memory).
  void sendAsync(comm::Communicator &comm, const void *buffer, int64_t count,
                 DType dtype, int peer, const comm::CallInfo &info);
  /// buffer[count] from `peer`'s matching send.
  void recv(comm::Communicator &comm, void *buffer, int64_t count, DType dtype,
            int peer, const comm::CallInfo &info);
  /// send to `sendPeer` and recv from `recvPeer` at once (a pipeline's or a
  /// ring's exchange).
  void sendRecv(comm::Communicator &comm, const void *sendBuffer, int sendPeer,
                void *recvBuffer, int recvPeer, int64_t count, DType dtype,
                const comm::CallInfo &info);

private:
  /// One call: its device buffers' bytes, and the communicator call on the
  /// buffers it is given (device ones, or their host copies).
  struct Buffers {
    const void *send = nullptr;
    size_t sendBytes = 0;
    void *recv = nullptr;
    size_t recvBytes = 0;
    /// The call reads the recv buffer too (broadcast's one buffer).
    bool recvIsInput = false;
    /// The elements' type: the staged path widens bf16 to fp32 for the call.
    DType dtype = DType::F32;
  };
  /// `awaited`: `stream` waits for the call (all but sendAsync). `call(send,
  /// recv, dtype)` runs the communicator call on the buffers given, of that
  /// dtype.
  template <typename Call>
  void run(comm::Communicator &comm, const Buffers &buffers,
           const comm::CallInfo &info, Call &&call, bool awaited = true);
  std::string where(const comm::CallInfo &info) const;
  /// The in-process group of `comm` when PeerGroup serves the call, else
  /// null (attached at its first call).
  PeerGroup *peer(const comm::Communicator &comm, DType dtype,
                  const comm::CallInfo &info);
  /// Whether `stream_` is being captured; counts a captured call of
  /// `group` when it is.
  /// `barriers`: the call's barrier kernels (an all-reduce 3, others 2).
  bool captured(const comm::Communicator &comm, const comm::CallInfo &info,
                uint64_t barriers);

  cudaStream_t stream_;
  std::string where_;
  bool peerKernels_;
  /// Orders `stream_` and a communicator's own stream (made on first use).
  cudaEvent_t ready_ = nullptr, done_ = nullptr;
  /// The host copies of the staged path, and their fp32 widening for bf16.
  std::vector<unsigned char> hostSend_, hostRecv_;
  std::vector<float> hostSendWide_, hostRecvWide_;
  /// PeerGroup states by in-process group id.
  std::map<uint64_t, std::shared_ptr<PeerGroup>> peers_;
  std::vector<CapturedCalls> captured_;
};

} // namespace mtrt::cuda

#endif // MTRT_SRC_CUDA_DEVICECOLLECTIVE_H
