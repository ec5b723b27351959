// Collectives of in-process ranks sharing one GPU, as kernels that read the
// peers' buffers: asynchronous on the caller's stream, deterministic, and
// capturable in CUDA graphs.
#ifndef MTRT_SRC_CUDA_PEERCOLLECTIVE_H
#define MTRT_SRC_CUDA_PEERCOLLECTIVE_H

#include "comm/Communicator.h"
#include "cuda/kernels/PeerKernels.h"

#include <cuda_runtime_api.h>

#include <array>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

namespace mtrt::cuda {

/// One in-process group's collectives on the device (the one-GPU checks'
/// ranks are threads of one process on one GPU, so every rank's buffers are
/// in one address space).
///
/// Each call is work of the caller's stream, like an NCCL call, and reads
/// the peers' buffers in place:
/// - all-reduce: rank r reduces chunk r (ceil(count / n) elements) of every
///   rank's send into its recv, then, once every rank has, copies every
///   other rank's chunk from that rank's recv; in place is safe (no rank
///   reads another's chunk r of its send while r writes it).
/// - all-gather, reduce-scatter, broadcast: one pass.
/// Each element is combined by one rank, in comm/FixedOrderReduce.h's order
/// (bf16: widened to fp32, summed, rounded once), and copied to the others,
/// so every rank gets the bits of the in-process communicator's staged call.
///
/// The ranks' host threads exchange their buffers (and check that the
/// calls match: kind, type, count, root) at each call; no host thread waits
/// for the device. The streams are ordered across ranks:
/// - run eagerly, by events: each rank records one when its operands are
///   ready (and, for an all-reduce, when its chunk is reduced, and when it
///   is done reading), the threads exchange them, and each stream waits
///   for the peers' before its kernel (and before going on). No kernel
///   waits for another, so nothing here can hang on the device.
/// - captured in a CUDA graph (which cannot wait for another graph's
///   events), by barrier kernels: a thread spinning on the ranks' phase
///   counters in device memory (PeerSlots), which a replay advances as it
///   is. A spinning barrier completes only if the peers' streams reach
///   theirs, so a graph's launch first releases its calls (post), then
///   passes the gate of every rank connected to it (gate(), on the group
///   of its function's connected axes: every rank its barriers can wait
///   for is at its launch, with nothing left that waits for the device),
///   and the kernels a peer launches meanwhile must not
///   wait for the running kernels: CUDA's lazy loading of a kernel's
///   module may, so graphs with these barriers need CUDA_MODULE_LOADING=
///   EAGER (eagerModuleLoading(); cuda::Executor captures them only then).
/// Every rank of the group must run a call the same way (all eagerly, or
/// all captured); the exchange refuses a mix.
///
/// Thread-safety: one call at a time per rank; the ranks call concurrently.
class PeerGroup {
public:
  /// How long a rank waits for its peers (on the host at an exchange, on
  /// the device at a barrier) before failing: $MTRT_PEER_COLLECTIVE_TIMEOUT
  /// seconds (a positive integer), else 300. Throws Error
  /// (INVALID_ARGUMENT) naming a value that is not one.
  static unsigned timeoutSeconds();
  /// Whether CUDA loads every module when the context is made
  /// (CUDA_MODULE_LOADING=EAGER, read before CUDA starts).
  static bool eagerModuleLoading();
  /// CUDA's hardware work queues for this process's streams
  /// (CUDA_DEVICE_MAX_CONNECTIONS, read before CUDA starts: 1 to 32, else
  /// CUDA's default 8). A queue shared by two ranks' streams holds one
  /// rank's graph behind the other's barrier kernel spinning for it (the
  /// pipeline evaluations' stalls, bench/NOTES.md, sessions 21 and 22), so
  /// graphs with barriers need a queue for each stream: two a rank.
  static int hardwareQueues();
  /// Whether $MTRT_PEER_TRACE is 1: trace() then prints each graph launch
  /// (its groups' expected barrier counts), each eager multi-rank run and
  /// each staged call of in-process ranks, to find which rank stopped where
  /// when a barrier times out.
  static bool tracing();
  /// Prints `line` to stderr with the milliseconds since the first trace
  /// and the calling thread's rank (setTraceRank), when tracing().
  static void trace(const std::string &line);
  /// The world rank the calling thread runs (for trace()).
  static void setTraceRank(int rank);

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

  /// A CUDA graph's launch: releases this rank's next `count` captured
  /// calls, then await() waits until every rank of the group has released
  /// the first of them. Throws Error (ABORTED) naming the group, the ranks
  /// and the call after timeoutSeconds().
  /// `barriers`: the barrier kernels those calls hold; returns the
  /// barriers this rank's launches have held so far (its phase once they
  /// have run), for trace().
  uint64_t post(int rank, uint64_t count, uint64_t barriers);
  void await(int rank, const std::string &what);
  /// A graph's launch gate: waits until every rank of this group has
  /// reached its gate as often as this rank. The group is a launching
  /// function's component (the ranks its collectives' groups connect): no
  /// rank launches a graph with barriers before every rank those barriers
  /// wait for, directly or through another group, is at its launch and
  /// does nothing else before it. post() and await() alone let a rank
  /// launch once its peers had posted, while a peer that had posted one
  /// group still waited on the host for another, whose rank was blocked in
  /// a CUDA call that waits for the device (an allocation, a free), which
  /// waited for the first rank's spinning barrier: the DP2 x TP2 hang of
  /// bench/NOTES.md, session 20. Throws Error (ABORTED) naming the group,
  /// the ranks and the launch after timeoutSeconds().
  void gate(int rank, const std::string &what);
  const std::string &name() const { return name_; }
  uint64_t id() const { return id_; }

  /// The process's CUDA graphs with barriers in flight, against the CUDA
  /// calls that may wait for the device (bench/NOTES.md, sessions 21 and
  /// 22). A rank holds a LaunchWindow from its gate until its graph has
  /// finished (Executor::replayGraph waits for it); a Setup around such
  /// calls: a function's first run (GEMM tuning, whose candidates cuBLASLt
  /// loads then, and the first allocations), device allocations and frees
  /// (DeviceBuffer), pinned host memory, and a graph's instantiation and
  /// upload. While one waited for the device it held up the other ranks'
  /// CUDA calls, a launch among them, and a peer's graph spun for that
  /// launch: in session 22 three ranks' launches waited 4 s for a stage's
  /// first backward run; in session 21 a first launch 7.4 s. Setups run
  /// together, and so do windows (a window's peers, past the same gate,
  /// must all launch); a Setup waits until no window is open, a window
  /// until no Setup is held, neither for one that waits. A thread in a
  /// window makes no other CUDA call.
  class LaunchWindow {
  public:
    LaunchWindow();
    ~LaunchWindow();
    LaunchWindow(const LaunchWindow &) = delete;
    LaunchWindow &operator=(const LaunchWindow &) = delete;
  };
  class Setup {
  public:
    Setup();
    ~Setup();
    Setup(const Setup &) = delete;
    Setup &operator=(const Setup &) = delete;
  };

  /// comm::Communicator's calls with its buffers' rules (in place
  /// included), as work of `stream`; `rank` is the caller's group rank,
  /// `captured` whether `stream` is being captured. Throws Error:
  /// INVALID_ARGUMENT when the ranks' calls differ, ABORTED after
  /// timeoutSeconds() without a peer, a failed CUDA call naming `what`.
  void allReduce(cudaStream_t stream, int rank, const void *send, void *recv,
                 int64_t count, DType dtype, comm::ReduceOp op, bool captured,
                 const std::string &what);
  void allGather(cudaStream_t stream, int rank, const void *send, void *recv,
                 int64_t count, DType dtype, bool captured,
                 const std::string &what);
  void reduceScatter(cudaStream_t stream, int rank, const void *send,
                     void *recv, int64_t count, DType dtype, comm::ReduceOp op,
                     bool captured, const std::string &what);
  void broadcast(cudaStream_t stream, int rank, void *buffer, int64_t count,
                 DType dtype, int root, bool captured, const std::string &what);

private:
  /// What a rank posts at an exchange.
  struct Post {
    const void *send = nullptr;
    void *recv = nullptr;
    /// Eager calls: recorded on the rank's stream at this point.
    cudaEvent_t event = nullptr;
    unsigned long long signature = 0;
    bool captured = false;
  };
  PeerGroup(uint64_t id, std::string name, int size, int device,
            PeerSlots *slots);
  /// Posts this rank's next exchange and waits until every rank has posted
  /// the same one; returns every rank's post. Checks that the signatures
  /// and the captured flags agree.
  std::vector<Post> exchange(int rank, const Post &mine,
                             const std::string &what);
  /// Waits on hostWake_ (under `lock`) until `behind()` names no rank
  /// (-1); after timeoutSeconds() throws Error (ABORTED): `what`, this
  /// rank and group, the timeout, then `late(peer)` for the rank behind.
  void waitForPeers(std::unique_lock<std::mutex> &lock, int rank,
                    const std::string &what, const std::function<int()> &behind,
                    const std::function<std::string(int)> &late);
  /// The pointers of posts.
  static PeerPointers pointers(const std::vector<Post> &posts);
  /// An eager call's ordering point `which` (0: operands ready, 1: chunk
  /// reduced, 2: done): records this rank's event on `stream`, exchanges,
  /// and makes `stream` wait for the peers' events. A captured call's: a
  /// barrier kernel (the first also exchanges the buffers). Returns the
  /// posts.
  std::vector<Post> meet(cudaStream_t stream, int rank, int which,
                         const Post &call, const std::string &what);
  void checkLaunch(const std::string &what) const;

  uint64_t id_;
  std::string name_;
  int size_;
  int device_;
  PeerSlots *slots_;
  /// The host side, under hostMutex_: per rank, its exchanges so far and
  /// its last two posts (a rank is at most one exchange ahead of another),
  /// its three events (made by its thread at its first eager call), and a
  /// graph launch's releases (post, await).
  std::mutex hostMutex_;
  std::condition_variable hostWake_;
  std::vector<uint64_t> exchanges_;
  std::vector<std::array<Post, 2>> posts_;
  std::vector<std::array<cudaEvent_t, 3>> events_;
  std::vector<uint64_t> released_, next_, awaiting_;
  /// Per rank, the launch gates it has reached, and the barriers its
  /// launches hold.
  std::vector<uint64_t> gates_, launchedBarriers_;
};

} // namespace mtrt::cuda

#endif // MTRT_SRC_CUDA_PEERCOLLECTIVE_H
