// One rank of a multi-process world over NCCL: the Communicator interface
// on a CUDA stream, with a watchdog that aborts the communicator and names
// the rank, the call and the step when a collective fails or hangs.
#ifndef MTRT_SRC_COMM_NCCLCOMMUNICATOR_H
#define MTRT_SRC_COMM_NCCLCOMMUNICATOR_H

#include "comm/Communicator.h"
#include "comm/Rendezvous.h"

#include <cuda_runtime_api.h>

#include <chrono>
#include <memory>

struct ncclComm;

namespace mtrt::comm {

class NcclWatchdog;

struct NcclOptions {
  /// A collective not complete this long after it was issued fails the run
  /// (megatron-train's --collective-timeout).
  std::chrono::milliseconds collectiveTimeout{std::chrono::seconds(300)};
  /// The rendezvous and ncclCommInitRankConfig's limit.
  std::chrono::milliseconds initTimeout{std::chrono::seconds(300)};
  /// The stream the calls are ordered on (the executor's); nullptr: the
  /// communicator makes its own.
  cudaStream_t stream = nullptr;
  /// On a failure or timeout the watchdog aborts the communicator, prints
  /// the message on stderr and ends the process with status 1 (a training
  /// process, whose peers then fail too: Megatron-LM's behavior). Otherwise
  /// it aborts the communicator and the rank's next call throws ABORTED with
  /// the message (a library caller that handles errors itself).
  bool exitOnFailure = false;
};

/// NCCL through libnccl.so.2, loaded when the first communicator is made
/// (builds and single-GPU runs do not need it). Takes f32, f64, bf16, f16,
/// i32 and i64; buffers are device memory of the communicator's device, or
/// host memory, which is staged through device buffers (the host executor's
/// collectives; slower).
///
/// Ordering: a call is enqueued on the stream; when it returns, work later on
/// that stream sees its result (device buffers) or the result is in place
/// (host buffers, after a synchronization). A group split from it orders
/// its calls on a stream of its own. The communicator is
/// non-blocking (ncclConfig_t::blocking = 0): every NCCL call's
/// ncclInProgress is polled to completion within the timeouts, so a peer
/// that died cannot hang initialization or a call.
///
/// CUDA graphs: a call on device buffers enqueued on a stream being
/// captured is captured (NCCL 2.9 and later), and not watched: the
/// watchdog tracks the calls it can query, and a replay of the graph is the
/// replayer's to wait for. A captured call on host buffers is refused.
///
/// Reductions: NCCL's ring or tree order, the same bits on every rank but
/// not the serial loop's (the in-process communicator's contract); the
/// multi-rank checks compare within fp32 rounding.
///
/// Thread-safety: as Communicator; the watchdog is its own thread.
class NcclCommunicator final : public Communicator {
public:
  /// Joins the world `env` describes: rank 0 makes the unique id and serves
  /// it over TCP (rendezvous()), every rank selects CUDA device
  /// env.localRank and initializes its communicator. Throws Error:
  /// UNAVAILABLE without libnccl.so.2 or a CUDA device for localRank; the
  /// rendezvous' errors; NCCL's error (naming the call) otherwise.
  static std::unique_ptr<NcclCommunicator>
  create(const LaunchEnvironment &env, const NcclOptions &options = {});

  /// Wraps a communicator the caller made and keeps (the C API's
  /// mtrt_communicator_create_nccl): never destroyed or split's parent
  /// destroyed here; an abort still aborts it.
  static std::unique_ptr<NcclCommunicator>
  wrap(ncclComm *comm, const NcclOptions &options = {});

  ~NcclCommunicator() override;

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  int worldRank() const override { return members_[rank_]; }
  const std::string &name() const override { return name_; }
  const std::vector<int> &members() const override { return members_; }
  void abort(std::string_view reason) override;
  void *deviceStream() const override { return stream_; }

  cudaStream_t stream() const { return stream_; }
  int device() const { return device_; }
  /// "NCCL 2.28.9".
  static std::string libraryVersion();

protected:
  void execute(const Call &call) override;
  std::unique_ptr<Communicator> executeSplit(const Call &call) override;
  bool supportsDType(DType dtype) const override;

private:
  NcclCommunicator(ncclComm *comm, bool owned, std::vector<int> members,
                   std::string name, const NcclOptions &options);
  /// Enqueues `call` on the stream (device buffers).
  void enqueue(const Call &call, const void *send, void *recv);
  /// Waits for NCCL's ncclInProgress after a call on `comm_`; throws the
  /// failure (aborting first) naming `what`.
  void settle(const char *nccl, const std::string &what);
  [[noreturn]] void fail(const std::string &message);
  void throwIfAborted() const;

  ncclComm *comm_;
  bool owned_;
  int rank_ = 0, size_ = 1, device_ = 0;
  std::vector<int> members_;
  std::string name_;
  NcclOptions options_;
  cudaStream_t stream_ = nullptr;
  bool ownsStream_ = false;
  uint64_t calls_ = 0;
  std::shared_ptr<NcclWatchdog> watchdog_;
};

} // namespace mtrt::comm

#endif // MTRT_SRC_COMM_NCCLCOMMUNICATOR_H
