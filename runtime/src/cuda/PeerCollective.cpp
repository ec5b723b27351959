// The in-process groups' device state, shared by their ranks, and the
// order of barriers and kernels of each collective.
#include "cuda/PeerCollective.h"

#include "cuda/CudaCheck.h"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <mutex>

namespace mtrt::cuda {

namespace {

/// The groups' states, by in-process group id, while any rank holds one.
struct Registry {
  std::mutex mutex;
  std::map<uint64_t, std::weak_ptr<PeerGroup>> groups;
};

Registry &registry() {
  static Registry instance;
  return instance;
}

PeerElement elementOf(DType dtype) {
  return dtype == DType::BF16 ? PeerElement::BF16 : PeerElement::F32;
}

/// What every rank's call must agree on: kind, element type, count (and a
/// broadcast's root), never 0.
unsigned long long signatureOf(unsigned kind, DType dtype, int64_t count,
                               int root = 0) {
  return (static_cast<unsigned long long>(kind + 1) << 60) |
         (static_cast<unsigned long long>(dtype) << 54) |
         (static_cast<unsigned long long>(root & 0x3f) << 48) |
         (static_cast<unsigned long long>(count) & 0xffffffffffffull);
}

} // namespace

unsigned PeerGroup::timeoutSeconds() {
  const char *text = std::getenv("MTRT_PEER_COLLECTIVE_TIMEOUT");
  if (!text || !*text)
    return 300;
  char *end = nullptr;
  unsigned long seconds = std::strtoul(text, &end, 10);
  if (*end || seconds == 0 || seconds > 86400)
    throw Error(MTRT_STATUS_INVALID_ARGUMENT,
                std::string("MTRT_PEER_COLLECTIVE_TIMEOUT is '") + text +
                    "'; it must be a whole number of seconds from 1 to 86400");
  return static_cast<unsigned>(seconds);
}

bool PeerGroup::serves(const comm::Communicator &comm) {
  return comm.inProcessGroupId() != 0 && !comm.takesDeviceMemory() &&
         comm.size() <= kMaxPeerRanks;
}

bool PeerGroup::serves(const comm::Communicator &comm, DType dtype) {
  return serves(comm) && (dtype == DType::F32 || dtype == DType::BF16);
}

std::shared_ptr<PeerGroup> PeerGroup::attach(const comm::Communicator &comm,
                                             cudaStream_t stream,
                                             const std::string &what) {
  int device = -1;
  MTRT_CUDA_CHECK(cudaGetDevice(&device), what);
  Registry &r = registry();
  std::lock_guard<std::mutex> lock(r.mutex);
  uint64_t id = comm.inProcessGroupId();
  if (std::shared_ptr<PeerGroup> found = r.groups[id].lock()) {
    if (found->device_ != device)
      throw Error(MTRT_STATUS_FAILED_PRECONDITION,
                  what + ": rank " + std::to_string(comm.worldRank()) +
                      " of in-process group " + comm.name() +
                      " runs on CUDA device " + std::to_string(device) +
                      ", and the group's first rank on device " +
                      std::to_string(found->device_) +
                      "; in-process ranks share one GPU (give them the same "
                      "device)");
    return found;
  }
  cudaStreamCaptureStatus capture = cudaStreamCaptureStatusNone;
  MTRT_CUDA_CHECK(cudaStreamIsCapturing(stream, &capture), what);
  if (capture != cudaStreamCaptureStatusNone)
    throw Error(MTRT_STATUS_FAILED_PRECONDITION,
                what + ": the first collective of in-process group " +
                    comm.name() +
                    " on the device is being captured in a CUDA graph; its "
                    "state must be made in an eager run first");
  PeerGroup::Setup setup;
  MTRT_CUDA_CHECK(preloadPeerKernels(), what + ": loading the peer kernels");
  void *memory = nullptr;
  MTRT_CUDA_CHECK(cudaMalloc(&memory, sizeof(PeerSlots)),
                  what + ": allocating the device state of group " +
                      comm.name());
  auto *slots = static_cast<PeerSlots *>(memory);
  std::shared_ptr<PeerGroup> group(
      new PeerGroup(id, comm.name(), comm.size(), device, slots));
  MTRT_CUDA_CHECK(cudaMemsetAsync(slots, 0, sizeof(PeerSlots), stream), what);
  MTRT_CUDA_CHECK(cudaStreamSynchronize(stream),
                  what + ": zeroing the device state of group " + comm.name());
  r.groups[id] = group;
  return group;
}

PeerGroup::PeerGroup(uint64_t id, std::string name, int size, int device,
                     PeerSlots *slots)
    : id_(id), name_(std::move(name)), size_(size), device_(device),
      slots_(slots), exchanges_(size, 0), posts_(size), events_(size),
      released_(size, 0), next_(size, 0), awaiting_(size, 0), gates_(size, 0),
      launchedBarriers_(size, 0) {
  for (auto &events : events_)
    events.fill(nullptr);
}

PeerGroup::~PeerGroup() {
  for (auto &events : events_)
    for (cudaEvent_t event : events)
      if (event)
        (void)cudaEventDestroy(event);
  if (slots_) {
    Setup setup;
    (void)cudaFree(slots_);
  }
}

bool PeerGroup::eagerModuleLoading() {
  const char *mode = std::getenv("CUDA_MODULE_LOADING");
  return mode && std::string(mode) == "EAGER";
}

int PeerGroup::hardwareQueues() {
  const char *text = std::getenv("CUDA_DEVICE_MAX_CONNECTIONS");
  if (!text || !*text)
    return 8;
  char *end = nullptr;
  long queues = std::strtol(text, &end, 10);
  return *end || queues < 1 || queues > 32 ? 8 : static_cast<int>(queues);
}

void PeerGroup::checkLaunch(const std::string &what) const {
  cudaError_t launch = cudaGetLastError();
  if (launch != cudaSuccess)
    throwCudaError(launch, "launching the in-process group's collective", what);
}

uint64_t PeerGroup::post(int rank, uint64_t count, uint64_t barriers) {
  std::lock_guard<std::mutex> lock(hostMutex_);
  awaiting_[rank] = next_[rank];
  next_[rank] += count;
  released_[rank] = next_[rank];
  launchedBarriers_[rank] += barriers;
  hostWake_.notify_all();
  return launchedBarriers_[rank];
}

namespace {
thread_local int traceRank = -1;

/// The process's open launch windows and setups (PeerGroup::LaunchWindow).
struct Windows {
  std::mutex mutex;
  std::condition_variable wake;
  int open = 0, setups = 0;
};

Windows &windows() {
  static Windows instance;
  return instance;
}
} // namespace

PeerGroup::LaunchWindow::LaunchWindow() {
  Windows &w = windows();
  std::unique_lock<std::mutex> lock(w.mutex);
  w.wake.wait(lock, [&] { return w.setups == 0; });
  ++w.open;
}

PeerGroup::LaunchWindow::~LaunchWindow() {
  Windows &w = windows();
  std::lock_guard<std::mutex> lock(w.mutex);
  --w.open;
  w.wake.notify_all();
}

PeerGroup::Setup::Setup() {
  Windows &w = windows();
  std::unique_lock<std::mutex> lock(w.mutex);
  w.wake.wait(lock, [&] { return w.open == 0; });
  ++w.setups;
}

PeerGroup::Setup::~Setup() {
  Windows &w = windows();
  std::lock_guard<std::mutex> lock(w.mutex);
  --w.setups;
  w.wake.notify_all();
}

bool PeerGroup::tracing() {
  static const bool on = [] {
    const char *text = std::getenv("MTRT_PEER_TRACE");
    return text && std::string(text) == "1";
  }();
  return on;
}

void PeerGroup::setTraceRank(int rank) { traceRank = rank; }

void PeerGroup::trace(const std::string &line) {
  if (!tracing())
    return;
  static const auto start = std::chrono::steady_clock::now();
  double ms = std::chrono::duration<double, std::milli>(
                  std::chrono::steady_clock::now() - start)
                  .count();
  std::fprintf(stderr, "peer trace %10.3f ms rank %d: %s\n", ms, traceRank,
               line.c_str());
}

void PeerGroup::await(int rank, const std::string &what) {
  std::unique_lock<std::mutex> lock(hostMutex_);
  uint64_t call = awaiting_[rank];
  auto behind = [&] {
    for (int peer = 0; peer < size_; ++peer)
      if (released_[peer] <= call)
        return peer;
    return -1;
  };
  waitForPeers(lock, rank, what, behind, [&](int peer) {
    return "to launch captured call #" + std::to_string(call + 1) +
           " of the group; it has launched " + std::to_string(released_[peer]) +
           " (a rank that failed, or ranks whose graphs differ)";
  });
}

void PeerGroup::gate(int rank, const std::string &what) {
  std::unique_lock<std::mutex> lock(hostMutex_);
  uint64_t mine = ++gates_[rank];
  hostWake_.notify_all();
  auto behind = [&] {
    for (int peer = 0; peer < size_; ++peer)
      if (gates_[peer] < mine)
        return peer;
    return -1;
  };
  waitForPeers(lock, rank, what, behind, [&](int peer) {
    return "at CUDA graph launch #" + std::to_string(mine) + "; it is at #" +
           std::to_string(gates_[peer]) +
           " (a rank that failed, or ranks whose graphs differ)";
  });
}

void PeerGroup::waitForPeers(std::unique_lock<std::mutex> &lock, int rank,
                             const std::string &what,
                             const std::function<int()> &behind,
                             const std::function<std::string(int)> &late) {
  auto deadline =
      std::chrono::steady_clock::now() + std::chrono::seconds(timeoutSeconds());
  while (behind() >= 0)
    if (hostWake_.wait_until(lock, deadline) == std::cv_status::timeout &&
        behind() >= 0) {
      int peer = behind();
      throw Error(MTRT_STATUS_ABORTED,
                  what + ": rank " + std::to_string(rank) +
                      " of in-process group " + name_ + " waited " +
                      std::to_string(timeoutSeconds()) +
                      " s (MTRT_PEER_COLLECTIVE_TIMEOUT) for rank " +
                      std::to_string(peer) + " " + late(peer));
    }
}

std::vector<PeerGroup::Post> PeerGroup::exchange(int rank, const Post &mine,
                                                 const std::string &what) {
  std::unique_lock<std::mutex> lock(hostMutex_);
  uint64_t n = exchanges_[rank];
  posts_[rank][n % 2] = mine;
  exchanges_[rank] = n + 1;
  hostWake_.notify_all();
  auto behind = [&] {
    for (int peer = 0; peer < size_; ++peer)
      if (exchanges_[peer] <= n)
        return peer;
    return -1;
  };
  waitForPeers(lock, rank, what, behind, [&](int peer) {
    return "at exchange #" + std::to_string(n + 1) +
           " of the group; it is at #" + std::to_string(exchanges_[peer]) +
           " (a rank that failed, or ranks whose calls differ)";
  });
  std::vector<Post> all(static_cast<size_t>(size_));
  for (int peer = 0; peer < size_; ++peer)
    all[peer] = posts_[peer][n % 2];
  for (int peer = 0; peer < size_; ++peer) {
    if (all[peer].captured != mine.captured)
      throw Error(
          MTRT_STATUS_FAILED_PRECONDITION,
          what + ": in-process group " + name_ + ": rank " +
              std::to_string(rank) + (mine.captured ? " captures" : " runs") +
              " its call in a CUDA graph while rank " + std::to_string(peer) +
              (mine.captured ? " runs it eagerly" : " captures it") +
              "; the ranks of a group must run their multi-rank "
              "functions alike");
    if (mine.signature && all[peer].signature != mine.signature)
      throw Error(MTRT_STATUS_INVALID_ARGUMENT,
                  what + ": in-process group " + name_ + ": rank " +
                      std::to_string(peer) + "'s call (signature " +
                      std::to_string(all[peer].signature) +
                      ") differs from rank " + std::to_string(rank) + "'s (" +
                      std::to_string(mine.signature) +
                      "): kind, element type, count and root must match");
  }
  return all;
}

PeerPointers PeerGroup::pointers(const std::vector<Post> &posts) {
  PeerPointers p{};
  for (size_t r = 0; r < posts.size(); ++r) {
    p.send[r] = posts[r].send;
    p.recv[r] = posts[r].recv;
  }
  return p;
}

std::vector<PeerGroup::Post> PeerGroup::meet(cudaStream_t stream, int rank,
                                             int which, const Post &call,
                                             const std::string &what) {
  std::vector<Post> posts;
  if (call.captured) {
    if (which == 0)
      posts = exchange(rank, call, what);
    static const unsigned timeout = timeoutSeconds();
    peerBarrier(stream, slots_, rank, size_, which == 0 ? call.signature : 0,
                id_, timeout);
    return posts;
  }
  cudaEvent_t &event = events_[rank][which];
  if (!event)
    MTRT_CUDA_CHECK(cudaEventCreateWithFlags(&event, cudaEventDisableTiming),
                    what + ": creating the in-process group's events");
  MTRT_CUDA_CHECK(cudaEventRecord(event, stream), what);
  Post mine = call;
  mine.event = event;
  if (which != 0)
    mine.signature = 0;
  posts = exchange(rank, mine, what);
  for (int peer = 0; peer < size_; ++peer)
    if (peer != rank)
      MTRT_CUDA_CHECK(cudaStreamWaitEvent(stream, posts[peer].event, 0),
                      what + ": waiting for rank " + std::to_string(peer) +
                          " of in-process group " + name_);
  return posts;
}

void PeerGroup::allReduce(cudaStream_t stream, int rank, const void *send,
                          void *recv, int64_t count, DType dtype,
                          comm::ReduceOp op, bool captured,
                          const std::string &what) {
  PeerElement element = elementOf(dtype);
  size_t bytes = dtype == DType::BF16 ? 2 : 4;
  int64_t chunk = std::max<int64_t>(1, (count + size_ - 1) / size_);
  int64_t begin = std::min<int64_t>(count, chunk * rank);
  int64_t end = std::min<int64_t>(count, begin + chunk);
  Post call{send, recv, nullptr, signatureOf(0, dtype, count), captured};
  PeerPointers ranks = pointers(meet(stream, rank, 0, call, what));
  peerReduce(stream, ranks, size_, element, op == comm::ReduceOp::Max, begin,
             end - begin, static_cast<char *>(recv) + begin * bytes);
  meet(stream, rank, 1, call, what);
  peerGatherChunks(stream, ranks, rank, size_, element, chunk, count, recv);
  meet(stream, rank, 2, call, what);
  checkLaunch(what);
}

void PeerGroup::allGather(cudaStream_t stream, int rank, const void *send,
                          void *recv, int64_t count, DType dtype, bool captured,
                          const std::string &what) {
  Post call{send, recv, nullptr, signatureOf(1, dtype, count), captured};
  PeerPointers ranks = pointers(meet(stream, rank, 0, call, what));
  peerGatherSends(stream, ranks, size_, elementOf(dtype), count, recv);
  meet(stream, rank, 2, call, what);
  checkLaunch(what);
}

void PeerGroup::reduceScatter(cudaStream_t stream, int rank, const void *send,
                              void *recv, int64_t count, DType dtype,
                              comm::ReduceOp op, bool captured,
                              const std::string &what) {
  Post call{send, recv, nullptr, signatureOf(2, dtype, count), captured};
  PeerPointers ranks = pointers(meet(stream, rank, 0, call, what));
  peerReduce(stream, ranks, size_, elementOf(dtype), op == comm::ReduceOp::Max,
             rank * count, count, recv);
  meet(stream, rank, 2, call, what);
  checkLaunch(what);
}

void PeerGroup::broadcast(cudaStream_t stream, int rank, void *buffer,
                          int64_t count, DType dtype, int root, bool captured,
                          const std::string &what) {
  Post call{nullptr, buffer, nullptr, signatureOf(3, dtype, count, root),
            captured};
  PeerPointers ranks = pointers(meet(stream, rank, 0, call, what));
  if (rank != root)
    peerCopyFrom(stream, ranks, root, elementOf(dtype), count, buffer);
  meet(stream, rank, 2, call, what);
  checkLaunch(what);
}

} // namespace mtrt::cuda
