// Collectives of in-process ranks sharing one GPU, as kernels that read the
// peers' buffers: asynchronous on the caller's stream, deterministic, and
// capturable in CUDA graphs.
#ifndef MTRT_SRC_CUDA_PEERCOLLECTIVE_H
#define MTRT_SRC_CUDA_PEERCOLLECTIVE_H

#include "comm/Communicator.h"
#include "cuda/kernels/PeerKernels.h"

#include <cuda_runtime_api.h>

#include <cstdint>
#include <memory>
#include <string>

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

  /// comm::Communicator's calls with its buffers' rules (in place
  /// included), as work of `stream`; `rank` is the caller's group rank.
  /// Failed launches throw Error naming `what`.
  void allReduce(cudaStream_t stream, int rank, const void *send, void *recv,
                 int64_t count, DType dtype, comm::ReduceOp op,
                 const std::string &what);
  void allGather(cudaStream_t stream, int rank, const void *send, void *recv,
                 int64_t count, DType dtype, const std::string &what);
  void reduceScatter(cudaStream_t stream, int rank, const void *send,
                     void *recv, int64_t count, DType dtype,
                     comm::ReduceOp op, const std::string &what);
  void broadcast(cudaStream_t stream, int rank, void *buffer, int64_t count,
                 DType dtype, int root, const std::string &what);

private:
  PeerGroup(uint64_t id, int size, int device, PeerSlots *slots)
      : id_(id), size_(size), device_(device), slots_(slots) {}
  /// A barrier; a nonzero `signature` publishes the call first.
  void barrier(cudaStream_t stream, int rank, unsigned long long signature,
               const void *send, void *recv);
  void checkLaunch(const std::string &what) const;

  uint64_t id_;
  int size_;
  int device_;
  PeerSlots *slots_;
};

} // namespace mtrt::cuda

#endif // MTRT_SRC_CUDA_PEERCOLLECTIVE_H
