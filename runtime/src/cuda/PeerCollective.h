// Collectives of in-process ranks sharing one GPU, as kernels that read the
// peers' buffers: asynchronous on the caller's stream, deterministic, and
// capturable in CUDA graphs.
#ifndef MTRT_SRC_CUDA_PEERCOLLECTIVE_H
#define MTRT_SRC_CUDA_PEERCOLLECTIVE_H

#include "comm/Communicator.h"
#include "cuda/kernels/PeerKernels.h"

#include <cuda_runtime_api.h>

#include <condition_variable>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

namespace mtrt::cuda {

/// One in-process group's collectives on the device (the one-GPU checks'
/// ranks are threads of one process on one GPU, so every rank's buffers are
/// in one address space).
///
/// Each call is work of the caller's stream, like an NCCL call: the rank
/// publishes its buffers and arrives at a barrier (PeerSlots: a phase
/// counter per rank in device memory, one thread spinning), then kernels
/// read the peers' buffers, then a barrier again before the rank's stream
/// goes on, so no rank overwrites a buffer a peer still reads. The host
/// never waits: the ranks' streams meet on the device.
/// - all-reduce: rank r reduces chunk r (ceil(count / n) elements) of every
///   rank's send into its recv, a barrier, then copies every other rank's
///   chunk from that rank's recv; three barriers. In place is safe (no
///   rank reads another's chunk r of its send while r writes it).
/// - all-gather, reduce-scatter, broadcast: one pass after the first
///   barrier, then the second.
/// Each element is combined by one rank, in comm/FixedOrderReduce.h's
/// order (bf16: widened to fp32, summed, rounded once), and copied to the
/// others, so every rank gets the bits the in-process communicator's
/// staged call gives.
///
/// The ranks' host threads meet before each launch (post, await): a rank
/// launches the barrier kernels of call k only once every rank of the group
/// has released call k, i.e. launched it or is about to without waiting
/// for anything. So every barrier kernel on the device completes by the
/// device's progress alone, and a rank's host thread may block on the
/// device (a cudaFree, a synchronization, CUDA's lazy loading of a kernel,
/// which waits for the running kernels) without a peer spinning on the
/// device for a barrier that thread has yet to launch. A CUDA graph
/// releases all its calls at its launch (Executor::replayGraph: post
/// with their count, await, launch); a capture launches nothing and waits
/// for nothing (DeviceCollective counts the calls it captured).
///
/// The barrier's counters live on the device, so a captured graph replays
/// the calls as they are (the buffers' addresses must be the capture's, as
/// everywhere in a graph). Every rank of the group must make the same
/// calls in the same order (comm/Communicator.h's rule): each call's kind,
/// type and count are checked on the device at its first barrier, and a
/// mismatch, or a peer that does not arrive within timeoutSeconds(), prints
/// the group, rank and barrier and traps the kernel, failing the stream's
/// work (as an NCCL call of a hung peer fails at its watchdog).
///
/// Thread-safety: one call at a time per rank; the ranks call concurrently.
class PeerGroup {
public:
  /// How long a rank waits at a barrier for its peers before trapping:
  /// $MTRT_PEER_COLLECTIVE_TIMEOUT seconds (a positive integer), else 300.
  /// Throws Error (INVALID_ARGUMENT) naming a value that is not one.
  static unsigned timeoutSeconds();

  /// Whether `comm`'s group can run here: in-process ranks
  /// (Communicator::inProcessGroupId), at most kMaxPeerRanks, and a call
  /// of fp32 or bf16 elements.
  static bool serves(const comm::Communicator &comm, DType dtype);
  static bool serves(const comm::Communicator &comm);

  /// The group's state, made (zeroed, synchronously on `stream`) by the
  /// first of its ranks to ask and shared by the others while any holds it.
  /// Throws Error: FAILED_PRECONDITION when a rank's current CUDA device is
  /// not the group's (in-process ranks share one GPU), or when `stream` is
  /// being captured (the state is made at a function's first, eager run);
  /// the failed CUDA call's error, naming `what`.
  static std::shared_ptr<PeerGroup> attach(const comm::Communicator &comm,
                                           cudaStream_t stream,
                                           const std::string &what);
  ~PeerGroup();
  PeerGroup(const PeerGroup &) = delete;
  PeerGroup &operator=(const PeerGroup &) = delete;

  /// Releases this rank's next `count` calls (they are launched next, or
  /// captured in a graph launched next), then await() waits until every
  /// rank of the group has released the first of them. Throws Error
  /// (ABORTED) naming the group, the ranks and the call after
  /// timeoutSeconds().
  void post(int rank, uint64_t count);
  void await(int rank, const std::string &what);

  /// comm::Communicator's calls with its buffers' rules (in place
  /// included), as work of `stream`; `rank` is the caller's group rank.
  /// Unless `captured` (the stream is being captured in a CUDA graph), each
  /// first posts and awaits its release. Failed launches throw Error
  /// naming `what`.
  void allReduce(cudaStream_t stream, int rank, const void *send, void *recv,
                 int64_t count, DType dtype, comm::ReduceOp op, bool captured,
                 const std::string &what);
  void allGather(cudaStream_t stream, int rank, const void *send, void *recv,
                 int64_t count, DType dtype, bool captured,
                 const std::string &what);
  void reduceScatter(cudaStream_t stream, int rank, const void *send,
                     void *recv, int64_t count, DType dtype,
                     comm::ReduceOp op, bool captured,
                     const std::string &what);
  void broadcast(cudaStream_t stream, int rank, void *buffer, int64_t count,
                 DType dtype, int root, bool captured,
                 const std::string &what);

private:
  PeerGroup(uint64_t id, std::string name, int size, int device,
            PeerSlots *slots)
      : id_(id), name_(std::move(name)), size_(size), device_(device),
        slots_(slots), released_(size, 0), next_(size, 0),
        awaiting_(size, 0) {}
  /// post(rank, 1) and await(rank) unless `captured`.
  void release(int rank, bool captured, const std::string &what);
  /// A barrier; a nonzero `signature` publishes the call first.
  void barrier(cudaStream_t stream, int rank, unsigned long long signature,
               const void *send, void *recv);
  void checkLaunch(const std::string &what) const;

  uint64_t id_;
  std::string name_;
  int size_;
  int device_;
  PeerSlots *slots_;
  /// The host side: per rank, the calls it has released, the index of its
  /// next call, and the call its await() waits for.
  std::mutex hostMutex_;
  std::condition_variable hostWake_;
  std::vector<uint64_t> released_, next_, awaiting_;
};

} // namespace mtrt::cuda

#endif // MTRT_SRC_CUDA_PEERCOLLECTIVE_H
