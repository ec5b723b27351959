// The in-process groups' device state, shared by their ranks, and the
// order of barriers and kernels of each collective.
#include "cuda/PeerCollective.h"

#include "cuda/CudaCheck.h"

#include <chrono>
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
  void *memory = nullptr;
  MTRT_CUDA_CHECK(cudaMalloc(&memory, sizeof(PeerSlots)),
                  what + ": allocating the device state of group " +
                      comm.name());
  auto *slots = static_cast<PeerSlots *>(memory);
  MTRT_CUDA_CHECK(preloadPeerKernels(), what + ": loading the peer kernels");
  std::shared_ptr<PeerGroup> group(
      new PeerGroup(id, comm.name(), comm.size(), device, slots));
  MTRT_CUDA_CHECK(cudaMemsetAsync(slots, 0, sizeof(PeerSlots), stream), what);
  MTRT_CUDA_CHECK(cudaStreamSynchronize(stream),
                  what + ": zeroing the device state of group " + comm.name());
  r.groups[id] = group;
  return group;
}

PeerGroup::~PeerGroup() {
  if (slots_)
    (void)cudaFree(slots_);
}

void PeerGroup::checkLaunch(const std::string &what) const {
  cudaError_t launch = cudaGetLastError();
  if (launch != cudaSuccess)
    throwCudaError(launch, "launching the in-process group's collective",
                   what);
}

void PeerGroup::post(int rank, uint64_t count) {
  std::lock_guard<std::mutex> lock(hostMutex_);
  awaiting_[rank] = next_[rank];
  next_[rank] += count;
  released_[rank] = next_[rank];
  hostWake_.notify_all();
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
  auto deadline = std::chrono::steady_clock::now() +
                  std::chrono::seconds(timeoutSeconds());
  while (behind() >= 0)
    if (hostWake_.wait_until(lock, deadline) == std::cv_status::timeout &&
        behind() >= 0) {
      int peer = behind();
      throw Error(MTRT_STATUS_ABORTED,
                  what + ": rank " + std::to_string(rank) +
                      " of in-process group " + name_ + " waited " +
                      std::to_string(timeoutSeconds()) +
                      " s (MTRT_PEER_COLLECTIVE_TIMEOUT) for rank " +
                      std::to_string(peer) + " to reach collective #" +
                      std::to_string(call + 1) + " of the group; it has " +
                      "released " + std::to_string(released_[peer]) +
                      " (a rank that failed, or ranks whose calls differ)");
    }
}

void PeerGroup::release(int rank, bool captured, const std::string &what) {
  if (captured)
    return;
  post(rank, 1);
  await(rank, what);
}

void PeerGroup::barrier(cudaStream_t stream, int rank,
                        unsigned long long signature, const void *send,
                        void *recv) {
  static const unsigned timeout = timeoutSeconds();
  peerBarrier(stream, slots_, rank, size_, signature, send, recv, id_,
              timeout);
}

void PeerGroup::allReduce(cudaStream_t stream, int rank, const void *send,
                          void *recv, int64_t count, DType dtype,
                          comm::ReduceOp op, bool captured,
                          const std::string &what) {
  release(rank, captured, what);
  PeerElement element = elementOf(dtype);
  size_t bytes = dtype == DType::BF16 ? 2 : 4;
  int64_t chunk = (count + size_ - 1) / size_;
  int64_t begin = std::min<int64_t>(count, chunk * rank);
  int64_t end = std::min<int64_t>(count, begin + chunk);
  barrier(stream, rank, signatureOf(0, dtype, count), send, recv);
  peerReduce(stream, slots_, size_, element, op == comm::ReduceOp::Max, begin,
             end - begin, static_cast<char *>(recv) + begin * bytes);
  barrier(stream, rank, 0, nullptr, nullptr);
  peerGatherChunks(stream, slots_, rank, size_, element, chunk > 0 ? chunk : 1,
                   count, recv);
  barrier(stream, rank, 0, nullptr, nullptr);
  checkLaunch(what);
}

void PeerGroup::allGather(cudaStream_t stream, int rank, const void *send,
                          void *recv, int64_t count, DType dtype,
                          bool captured, const std::string &what) {
  release(rank, captured, what);
  barrier(stream, rank, signatureOf(1, dtype, count), send, recv);
  peerGatherSends(stream, slots_, size_, elementOf(dtype), count, recv);
  barrier(stream, rank, 0, nullptr, nullptr);
  checkLaunch(what);
}

void PeerGroup::reduceScatter(cudaStream_t stream, int rank, const void *send,
                              void *recv, int64_t count, DType dtype,
                              comm::ReduceOp op, bool captured,
                              const std::string &what) {
  release(rank, captured, what);
  barrier(stream, rank, signatureOf(2, dtype, count), send, recv);
  peerReduce(stream, slots_, size_, elementOf(dtype),
             op == comm::ReduceOp::Max, rank * count, count, recv);
  barrier(stream, rank, 0, nullptr, nullptr);
  checkLaunch(what);
}

void PeerGroup::broadcast(cudaStream_t stream, int rank, void *buffer,
                          int64_t count, DType dtype, int root,
                          bool captured, const std::string &what) {
  release(rank, captured, what);
  barrier(stream, rank, signatureOf(3, dtype, count, root), nullptr, buffer);
  if (rank != root)
    peerCopyFrom(stream, slots_, root, elementOf(dtype), count, buffer);
  barrier(stream, rank, 0, nullptr, nullptr);
  checkLaunch(what);
}

} // namespace mtrt::cuda
