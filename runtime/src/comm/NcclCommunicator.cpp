// The NCCL communicator and its watchdog.
#include "comm/NcclCommunicator.h"

#include "comm/NcclDeadline.h"
#include "comm/NcclLibrary.h"
#include "core/Error.h"
#include "cuda/DeviceMemory.h"

#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <mutex>
#include <thread>

namespace mtrt::comm {

namespace {

using Clock = std::chrono::steady_clock;

std::string secondsText(std::chrono::milliseconds duration) {
  char text[32];
  std::snprintf(text, sizeof(text), "%.3g s", duration.count() / 1000.0);
  return text;
}

/// Throws Error for a failed CUDA call made by the communicator.
void checkCuda(cudaError_t error, const char *call, const std::string &where) {
  if (error == cudaSuccess)
    return;
  throw Error(error == cudaErrorMemoryAllocation ? MTRT_STATUS_RESOURCE_EXHAUSTED
                                                 : MTRT_STATUS_INTERNAL,
              where + ": " + call + " failed: " + cudaGetErrorName(error) +
                  " (" + cudaGetErrorString(error) + ")");
}

std::string ncclErrorText(const NcclLibrary &lib, ncclComm_t comm,
                          ncclResult_t result) {
  std::string text = lib.getErrorString(result);
  const char *last = comm ? lib.getLastError(comm) : nullptr;
  if (last && *last)
    text += std::string(": ") + last;
  return text;
}

/// After an NCCL call on a non-blocking communicator: waits while it is in
/// progress (until `deadline`); returns "" or the failure's text.
std::string settleNccl(const NcclLibrary &lib, ncclComm_t comm,
                       ncclResult_t result, Clock::time_point deadline) {
  while (result == ncclInProgress) {
    if (Clock::now() > deadline)
      return "still in progress at the deadline";
    std::this_thread::sleep_for(std::chrono::microseconds(200));
    if (lib.commGetAsyncError(comm, &result) != ncclSuccess)
      return "ncclCommGetAsyncError failed";
  }
  if (result == ncclSuccess)
    return "";
  return ncclErrorText(lib, comm, result);
}

ncclDataType_t ncclType(DType dtype) {
  switch (dtype) {
  case DType::F32:
    return ncclFloat32;
  case DType::F64:
    return ncclFloat64;
  case DType::BF16:
    return ncclBfloat16;
  case DType::F16:
    return ncclFloat16;
  case DType::I32:
    return ncclInt32;
  case DType::I64:
    return ncclInt64;
  case DType::F8E4M3:
    return ncclFloat8e4m3;
  case DType::F8E5M2:
    return ncclFloat8e5m2;
  }
  return ncclFloat32;
}

} // namespace

/// How long after a call's collective timeout the host-clock guard
/// (NcclDeadline) ends a process whose watchdog has not reported it.
constexpr std::chrono::seconds kDeadlineGrace{4};

/// Watches the calls a rank has enqueued: each one's completion event, its
/// deadline, and the communicator's asynchronous error. On a failure it
/// aborts the communicator once and, with exitOnFailure, ends the process.
/// With exitOnFailure, an NcclDeadline also times every call on the host
/// clock alone, for when this thread or the rank's main thread is blocked
/// in a CUDA call behind the stuck collective.
class NcclWatchdog {
public:
  NcclWatchdog(ncclComm_t comm, int device, std::string rankName,
               const NcclOptions &options)
      : comm_(comm), device_(device), rankName_(std::move(rankName)),
        options_(options),
        deadline_(options.exitOnFailure
                      ? std::make_unique<NcclDeadline>(
                            rankName_, options.collectiveTimeout,
                            std::chrono::duration_cast<
                                std::chrono::milliseconds>(kDeadlineGrace))
                      : nullptr),
        thread_([this] { loop(); }) {}

  ~NcclWatchdog() {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      stop_ = true;
    }
    wake_.notify_all();
    thread_.join();
    for (Pending &p : pending_)
      (void)cudaEventDestroy(p.event);
  }

  /// Starts the host clock of the call `what` (before it is enqueued):
  /// the ticket for track() or finish().
  uint64_t begin(const std::string &what) {
    return deadline_ ? deadline_->begin(what) : 0;
  }
  /// The call of `ticket` is over on the host (or failed and was reported).
  void finish(uint64_t ticket) {
    if (deadline_)
      deadline_->end(ticket);
  }

  /// Takes ownership of `event`, recorded after the call `what` (begun as
  /// `ticket`).
  void track(cudaEvent_t event, std::string what, uint64_t ticket) {
    std::lock_guard<std::mutex> lock(mutex_);
    pending_.push_back({event, std::move(what),
                        Clock::now() + options_.collectiveTimeout, ticket});
    wake_.notify_all();
  }

  /// Waits until `event` (tracked) has completed; throws the failure.
  /// The watchdog's thread destroys a tracked event once it has completed,
  /// under the mutex: the event is queried under it too, and only while it
  /// is still pending (gone from pending_: completed). Querying a destroyed
  /// event returned cudaErrorContextIsDestroyed now and then, and left it
  /// as the runtime's last error for the next kernel launch to report.
  void wait(cudaEvent_t event) {
    for (;;) {
      {
        std::lock_guard<std::mutex> lock(mutex_);
        if (!failure_.empty())
          throw Error(MTRT_STATUS_ABORTED, failure_);
        bool pending = false;
        for (const Pending &p : pending_)
          pending = pending || p.event == event;
        if (!pending)
          return;
        cudaError_t state = cudaEventQuery(event);
        if (state == cudaSuccess)
          return;
        if (state != cudaErrorNotReady)
          checkCuda(state, "cudaEventQuery", rankName_);
      }
      std::this_thread::sleep_for(std::chrono::microseconds(100));
    }
  }

  /// Records the first failure, aborts the communicator, and with
  /// exitOnFailure prints the message and ends the process.
  void failWith(const std::string &message) {
    bool first = false;
    {
      std::lock_guard<std::mutex> lock(mutex_);
      if (failure_.empty()) {
        failure_ = message;
        first = true;
      }
    }
    if (!first)
      return;
    if (options_.exitOnFailure) {
      // Said first, and the process ends even if the abort itself hangs.
      std::fprintf(stderr,
                   "mtrt: %s; aborting the NCCL communicator and exiting\n",
                   message.c_str());
      std::fflush(stderr);
      std::thread([] {
        std::this_thread::sleep_for(std::chrono::seconds(5));
        std::fprintf(stderr, "mtrt: ncclCommAbort did not return within "
                             "5 s; exiting without it\n");
        std::_Exit(1);
      }).detach();
      std::fflush(stdout);
    }
    if (deadline_)
      deadline_->disarm(); // reported above; the 5 s guard ends the process
    if (comm_)
      (void)ncclLibrary().commAbort(comm_);
    if (options_.exitOnFailure)
      std::_Exit(1);
  }

  void throwIfFailed() const {
    std::lock_guard<std::mutex> lock(mutex_);
    if (!failure_.empty())
      throw Error(MTRT_STATUS_ABORTED, failure_);
  }
  /// The rank's name in messages ("rank 5": its world rank).
  void rename(std::string rankName) {
    std::lock_guard<std::mutex> lock(mutex_);
    if (deadline_)
      deadline_->rename(rankName);
    rankName_ = std::move(rankName);
  }
  bool failed() const {
    std::lock_guard<std::mutex> lock(mutex_);
    return !failure_.empty();
  }

private:
  struct Pending {
    cudaEvent_t event;
    std::string what;
    Clock::time_point deadline;
    uint64_t ticket;
  };

  void loop() {
    (void)cudaSetDevice(device_);
    std::unique_lock<std::mutex> lock(mutex_);
    while (!stop_) {
      wake_.wait_for(lock, std::chrono::milliseconds(20));
      while (!pending_.empty() && failure_.empty()) {
        Pending &front = pending_.front();
        cudaError_t state = cudaEventQuery(front.event);
        if (state == cudaSuccess) {
          (void)cudaEventDestroy(front.event);
          finish(front.ticket);
          pending_.pop_front();
          continue;
        }
        std::string message;
        ncclResult_t async = ncclSuccess;
        if (state != cudaErrorNotReady)
          message = rankName_ + ": CUDA error while " + front.what +
                    " was pending: " + cudaGetErrorName(state);
        else if (comm_ &&
                 ncclLibrary().commGetAsyncError(comm_, &async) ==
                     ncclSuccess &&
                 async != ncclSuccess && async != ncclInProgress)
          message = rankName_ + ": NCCL error in " + front.what + ": " +
                    ncclErrorText(ncclLibrary(), comm_, async);
        else if (Clock::now() > front.deadline)
          message = rankName_ + ": " + front.what +
                    " did not complete within the collective timeout (" +
                    secondsText(options_.collectiveTimeout) +
                    ", --collective-timeout); a peer rank died or hangs";
        if (message.empty())
          break;
        lock.unlock();
        failWith(message);
        lock.lock();
      }
    }
  }

  ncclComm_t comm_;
  int device_;
  std::string rankName_;
  NcclOptions options_;
  mutable std::mutex mutex_;
  std::condition_variable wake_;
  std::deque<Pending> pending_;
  std::string failure_;
  bool stop_ = false;
  std::unique_ptr<NcclDeadline> deadline_;
  std::thread thread_;
};

NcclCommunicator::NcclCommunicator(ncclComm *comm, bool owned,
                                   std::vector<int> members, std::string name,
                                   const NcclOptions &options)
    : comm_(comm), owned_(owned), members_(std::move(members)),
      name_(std::move(name)), options_(options) {
  const NcclLibrary &lib = ncclLibrary();
  int value = 0;
  if (lib.commUserRank(comm_, &value) == ncclSuccess)
    rank_ = value;
  if (lib.commCount(comm_, &value) == ncclSuccess)
    size_ = value;
  if (lib.commCuDevice(comm_, &value) == ncclSuccess)
    device_ = value;
  if (members_.empty())
    for (int r = 0; r < size_; ++r)
      members_.push_back(r);
  if (name_.empty())
    name_ = groupName("world", members_);
  std::string rankName = "rank " + std::to_string(members_[rank_]);
  checkCuda(cudaSetDevice(device_), "cudaSetDevice", rankName);
  stream_ = options.stream;
  if (!stream_) {
    checkCuda(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking),
              "cudaStreamCreateWithFlags", rankName);
    ownsStream_ = true;
  }
  watchdog_ =
      std::make_shared<NcclWatchdog>(comm_, device_, rankName, options_);
}

NcclCommunicator::~NcclCommunicator() {
  bool failed = watchdog_->failed();
  watchdog_.reset();
  const NcclLibrary &lib = ncclLibrary();
  if (owned_ && !failed) {
    // Flush, then free; a peer that is gone turns this into an abort.
    Clock::time_point deadline = Clock::now() + std::chrono::seconds(10);
    if (!settleNccl(lib, comm_, lib.commFinalize(comm_), deadline).empty())
      (void)lib.commAbort(comm_);
    else
      (void)lib.commDestroy(comm_);
  }
  if (ownsStream_)
    (void)cudaStreamDestroy(stream_);
}

std::string NcclCommunicator::libraryVersion() { return ncclLibrary().version; }

std::unique_ptr<NcclCommunicator>
NcclCommunicator::create(const LaunchEnvironment &env,
                         const NcclOptions &options) {
  const NcclLibrary &lib = ncclLibrary();
  std::string rankName = "rank " + std::to_string(env.rank);
  int devices = 0;
  if (cudaGetDeviceCount(&devices) != cudaSuccess) {
    (void)cudaGetLastError();
    devices = 0;
  }
  if (env.localRank >= devices)
    throw Error(MTRT_STATUS_UNAVAILABLE,
                rankName + ": its local rank " + std::to_string(env.localRank) +
                    " (LOCAL_RANK) selects CUDA device " +
                    std::to_string(env.localRank) + ", and this host has " +
                    std::to_string(devices) + " CUDA device(s)" +
                    (devices == 0 ? " (no GPU or no driver)" : "") +
                    "; start at most one rank per GPU on each host");
  checkCuda(cudaSetDevice(env.localRank), "cudaSetDevice", rankName);
  ncclUniqueId id{};
  if (env.rank == 0) {
    ncclResult_t made = lib.getUniqueId(&id);
    if (made != ncclSuccess)
      throw Error(MTRT_STATUS_INTERNAL,
                  rankName + ": ncclGetUniqueId failed: " +
                      ncclErrorText(lib, nullptr, made));
  }
  std::vector<uint8_t> bytes(sizeof(id.internal));
  std::memcpy(bytes.data(), id.internal, bytes.size());
  bytes = rendezvous(env, bytes, options.initTimeout);
  std::memcpy(id.internal, bytes.data(), bytes.size());

  ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
  config.blocking = 0;
  ncclComm_t comm = nullptr;
  ncclResult_t result =
      lib.commInitRankConfig(&comm, env.worldSize, id, env.rank, &config);
  std::string failure = comm ? settleNccl(lib, comm, result,
                                          Clock::now() + options.initTimeout)
                             : ncclErrorText(lib, nullptr, result);
  if (!failure.empty()) {
    if (comm)
      (void)lib.commAbort(comm);
    throw Error(MTRT_STATUS_UNAVAILABLE,
                rankName + " of " + std::to_string(env.worldSize) +
                    ": ncclCommInitRankConfig failed on CUDA device " +
                    std::to_string(env.localRank) + ": " + failure);
  }
  return std::unique_ptr<NcclCommunicator>(
      new NcclCommunicator(comm, true, {}, "", options));
}

std::unique_ptr<NcclCommunicator>
NcclCommunicator::wrap(ncclComm *comm, const NcclOptions &options) {
  // Nothing can check the pointer itself; without a GPU it cannot be a
  // communicator, so it is not touched.
  int devices = 0;
  cudaError_t counted = cudaGetDeviceCount(&devices);
  if (counted != cudaSuccess || devices == 0) {
    (void)cudaGetLastError();
    throw Error(MTRT_STATUS_UNAVAILABLE,
                std::string("no CUDA device (cudaGetDeviceCount returned ") +
                    (counted != cudaSuccess ? cudaGetErrorName(counted)
                                            : "0 devices") +
                    "); an NCCL communicator lives on a GPU");
  }
  return std::unique_ptr<NcclCommunicator>(
      new NcclCommunicator(comm, false, {}, "", options));
}

bool NcclCommunicator::supportsDType(DType) const { return true; }

void NcclCommunicator::abort(std::string_view reason) {
  watchdog_->failWith("rank " + std::to_string(worldRank()) +
                      " aborted the run: " + std::string(reason));
}

void NcclCommunicator::fail(const std::string &message) {
  watchdog_->failWith(message);
  watchdog_->throwIfFailed();
  throw Error(MTRT_STATUS_ABORTED, message);
}

void NcclCommunicator::throwIfAborted() const { watchdog_->throwIfFailed(); }

void NcclCommunicator::settle(const char *nccl, const std::string &what) {
  const NcclLibrary &lib = ncclLibrary();
  ncclResult_t state = ncclSuccess;
  if (lib.commGetAsyncError(comm_, &state) != ncclSuccess)
    state = ncclInternalError;
  std::string failure = settleNccl(lib, comm_, state,
                                   Clock::now() + options_.collectiveTimeout);
  if (!failure.empty())
    fail("rank " + std::to_string(worldRank()) + ": " + nccl + " for " + what +
         " on group " + name_ + " failed: " + failure);
}

void NcclCommunicator::enqueue(const Call &call, const void *send,
                               void *recv) {
  const NcclLibrary &lib = ncclLibrary();
  size_t count = static_cast<size_t>(call.count);
  ncclDataType_t type = ncclType(call.dtype);
  ncclRedOp_t op = call.op == ReduceOp::Max ? ncclMax : ncclSum;
  std::string what = call.describe(members_);
  auto check = [&](ncclResult_t result, const char *nccl) {
    if (result != ncclSuccess && result != ncclInProgress)
      fail("rank " + std::to_string(worldRank()) + ": " + nccl + " for " +
           what + " on group " + name_ + " failed: " +
           ncclErrorText(lib, comm_, result));
    if (result == ncclInProgress)
      settle(nccl, what);
  };
  switch (call.kind) {
  case CallKind::AllReduce:
    check(lib.allReduce(send, recv, count, type, op, comm_, stream_),
          "ncclAllReduce");
    break;
  case CallKind::AllGather:
    check(lib.allGather(send, recv, count, type, comm_, stream_),
          "ncclAllGather");
    break;
  case CallKind::ReduceScatter:
    check(lib.reduceScatter(send, recv, count, type, op, comm_, stream_),
          "ncclReduceScatter");
    break;
  case CallKind::Broadcast:
    check(lib.broadcast(send, recv, count, type, call.peer, comm_, stream_),
          "ncclBroadcast");
    break;
  case CallKind::Send:
  case CallKind::SendAsync:
    check(lib.send(send, count, type, call.peer, comm_, stream_), "ncclSend");
    break;
  case CallKind::Recv:
    check(lib.recv(recv, count, type, call.peer, comm_, stream_), "ncclRecv");
    break;
  case CallKind::SendRecv:
    check(lib.groupStart(), "ncclGroupStart");
    check(lib.send(send, count, type, call.peer, comm_, stream_), "ncclSend");
    check(lib.recv(recv, count, type, call.recvPeer, comm_, stream_),
          "ncclRecv");
    check(lib.groupEnd(), "ncclGroupEnd");
    break;
  case CallKind::Barrier:
    check(lib.allReduce(send, recv, 1, ncclFloat32, ncclSum, comm_, stream_),
          "ncclAllReduce (barrier)");
    break;
  case CallKind::Split:
    break;
  }
}

void NcclCommunicator::execute(const Call &call) {
  throwIfAborted();
  std::string rankName = "rank " + std::to_string(worldRank());
  checkCuda(cudaSetDevice(device_), "cudaSetDevice", rankName);
  size_t element = dtypeSize(call.dtype);
  size_t sendBytes = 0, recvBytes = 0;
  switch (call.kind) {
  case CallKind::AllReduce:
  case CallKind::Broadcast:
  case CallKind::SendRecv:
    sendBytes = recvBytes = element * static_cast<size_t>(call.count);
    break;
  case CallKind::AllGather:
    sendBytes = element * static_cast<size_t>(call.count);
    recvBytes = sendBytes * static_cast<size_t>(size_);
    break;
  case CallKind::ReduceScatter:
    recvBytes = element * static_cast<size_t>(call.count);
    sendBytes = recvBytes * static_cast<size_t>(size_);
    break;
  case CallKind::Send:
  case CallKind::SendAsync:
    sendBytes = element * static_cast<size_t>(call.count);
    break;
  case CallKind::Recv:
    recvBytes = element * static_cast<size_t>(call.count);
    break;
  case CallKind::Barrier:
    sendBytes = recvBytes = sizeof(float);
    break;
  case CallKind::Split:
    return;
  }
  bool onDevice = call.kind != CallKind::Barrier &&
                  (!sendBytes || cuda::isDeviceMemory(call.send)) &&
                  (!recvBytes || cuda::isDeviceMemory(call.recv));
  std::string what = call.describe(members_) + " on group " + name_;
  // A call captured in a CUDA graph (cuda::Executor's step functions) is
  // enqueued into the graph only: the watchdog's event cannot be queried
  // before the graph is launched, and a replay enqueues no call. The
  // replays are the caller's to wait for; host buffers, which the host
  // waits for, cannot be captured.
  cudaStreamCaptureStatus capture = cudaStreamCaptureStatusNone;
  checkCuda(cudaStreamIsCapturing(stream_, &capture), "cudaStreamIsCapturing",
            rankName);
  if (capture != cudaStreamCaptureStatusNone) {
    if (!onDevice)
      throw Error(MTRT_STATUS_FAILED_PRECONDITION,
                  "rank " + std::to_string(worldRank()) + ": " + what +
                      " is being captured in a CUDA graph on host buffers "
                      "(or as a barrier), which the host waits for; capture "
                      "calls on device buffers only");
    enqueue(call, call.send, call.recv);
    return;
  }
  // The host clock runs from here: enqueueing can block too.
  uint64_t ticket = watchdog_->begin(what);
  cudaEvent_t done = nullptr;
  if (onDevice) {
    enqueue(call, call.send, call.recv);
    checkCuda(cudaEventCreateWithFlags(&done, cudaEventDisableTiming),
              "cudaEventCreateWithFlags", rankName);
    checkCuda(cudaEventRecord(done, stream_), "cudaEventRecord", rankName);
    watchdog_->track(done, what, ticket);
    return;
  }
  // Host buffers (or a barrier): staged through device memory, then waited
  // for, so that the host sees the result when the call returns.
  void *staged = nullptr;
  size_t total = sendBytes + recvBytes;
  checkCuda(cudaMallocAsync(&staged, total, stream_), "cudaMallocAsync",
            rankName);
  char *stagedSend = static_cast<char *>(staged);
  char *stagedRecv = stagedSend + sendBytes;
  if (sendBytes && call.send)
    checkCuda(cudaMemcpyAsync(stagedSend, call.send, sendBytes,
                              cudaMemcpyDefault, stream_),
              "cudaMemcpyAsync", rankName);
  else if (sendBytes)
    checkCuda(cudaMemsetAsync(stagedSend, 0, sendBytes, stream_),
              "cudaMemsetAsync", rankName);
  enqueue(call, stagedSend, stagedRecv);
  if (recvBytes && call.recv)
    checkCuda(cudaMemcpyAsync(call.recv, stagedRecv, recvBytes,
                              cudaMemcpyDefault, stream_),
              "cudaMemcpyAsync", rankName);
  checkCuda(cudaFreeAsync(staged, stream_), "cudaFreeAsync", rankName);
  checkCuda(cudaEventCreateWithFlags(&done, cudaEventDisableTiming),
            "cudaEventCreateWithFlags", rankName);
  checkCuda(cudaEventRecord(done, stream_), "cudaEventRecord", rankName);
  watchdog_->track(done, what, ticket);
  watchdog_->wait(done);
  watchdog_->finish(ticket);
}

std::unique_ptr<Communicator>
NcclCommunicator::executeSplit(const Call &call) {
  throwIfAborted();
  const NcclLibrary &lib = ncclLibrary();
  std::string rankName = "rank " + std::to_string(worldRank());
  ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
  config.blocking = 0;
  ncclComm_t child = nullptr;
  int color = call.color == kNoColor ? NCCL_SPLIT_NOCOLOR : call.color;
  ncclResult_t result = lib.commSplit(comm_, color, call.key, &child, &config);
  std::string what = call.describe(members_) + " on group " + name_;
  std::string failure =
      settleNccl(lib, comm_, result, Clock::now() + options_.initTimeout);
  // A non-blocking parent's split may hand the child back after the parent
  // has settled (seen with NCCL 2.28 on the H200): wait for it.
  auto deadline = Clock::now() + options_.initTimeout;
  while (failure.empty() && call.color != kNoColor &&
         !*static_cast<volatile ncclComm_t *>(&child) && Clock::now() < deadline)
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  if (failure.empty() && call.color != kNoColor && !child)
    failure = "no communicator came back before the initialization timeout";
  if (failure.empty() && child)
    failure = settleNccl(lib, child, ncclInProgress, deadline);
  if (!failure.empty())
    fail(rankName + ": ncclCommSplit for " + what + " failed: " + failure);
  if (call.color == kNoColor || !child)
    return nullptr;
  // The new group's world ranks, gathered over it.
  int childSize = 0, childRank = 0;
  lib.commCount(child, &childSize);
  lib.commUserRank(child, &childRank);
  std::vector<int> members(static_cast<size_t>(childSize));
  members[static_cast<size_t>(childRank)] = worldRank();
  // Its own stream: calls on different groups do not wait for each other
  // (a pipeline's message pairs, cuda/PipelineStages.h); device callers
  // order each call with their stream by events (cuda/DeviceCollective.h).
  NcclOptions options = options_;
  options.stream = nullptr;
  auto made = std::unique_ptr<NcclCommunicator>(
      new NcclCommunicator(child, true, {}, "", options));
  std::vector<int> gathered(static_cast<size_t>(childSize));
  int mine = worldRank();
  made->allGather(&mine, gathered.data(), 1, DType::I32,
                  {"the split's world ranks", call.info.step});
  made->members_ = gathered;
  made->name_ = groupName(call.name, gathered);
  made->watchdog_->rename(rankName);
  return made;
}

} // namespace mtrt::comm
