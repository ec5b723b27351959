// Communicator calls over device buffers: straight through to a communicator
// that takes device memory, staged through the host for one that does not.
#include "cuda/DeviceCollective.h"

#include "cuda/CudaCheck.h"
#include "cuda/PeerCollective.h"

#include <cstring>
#include <utility>

namespace mtrt::cuda {

namespace {

/// bf16 elements (their bits) as floats: exact.
void widenBf16(const std::vector<unsigned char> &bf16,
               std::vector<float> &wide) {
  wide.resize(bf16.size() / sizeof(uint16_t));
  for (size_t i = 0; i < wide.size(); ++i) {
    uint16_t bits;
    std::memcpy(&bits, bf16.data() + i * sizeof(bits), sizeof(bits));
    uint32_t word = static_cast<uint32_t>(bits) << 16;
    std::memcpy(&wide[i], &word, sizeof(word));
  }
}

/// Floats rounded to bf16 (nearest even, as __float2bfloat16_rn; a NaN stays
/// a quiet NaN).
void narrowToBf16(const std::vector<float> &wide,
                  std::vector<unsigned char> &bf16) {
  bf16.resize(wide.size() * sizeof(uint16_t));
  for (size_t i = 0; i < wide.size(); ++i) {
    uint32_t word;
    std::memcpy(&word, &wide[i], sizeof(word));
    uint16_t bits;
    if ((word & 0x7fffffffu) > 0x7f800000u)
      bits = static_cast<uint16_t>((word >> 16) | 0x0040u);
    else
      bits =
          static_cast<uint16_t>((word + 0x7fffu + ((word >> 16) & 1u)) >> 16);
    std::memcpy(bf16.data() + i * sizeof(bits), &bits, sizeof(bits));
  }
}

} // namespace

DeviceCollective::DeviceCollective(cudaStream_t stream, std::string where,
                                   bool peerKernels)
    : stream_(stream), where_(std::move(where)), peerKernels_(peerKernels) {}

DeviceCollective::~DeviceCollective() {
  if (ready_)
    (void)cudaEventDestroy(ready_);
  if (done_)
    (void)cudaEventDestroy(done_);
}

bool DeviceCollective::runsOnDevice(const comm::Communicator &comm,
                                    DType dtype) const {
  return comm.takesDeviceMemory() ||
         (peerKernels_ && PeerGroup::serves(comm, dtype));
}

PeerGroup *DeviceCollective::peer(const comm::Communicator &comm, DType dtype,
                                  const comm::CallInfo &info) {
  if (!peerKernels_ || !PeerGroup::serves(comm, dtype))
    return nullptr;
  std::shared_ptr<PeerGroup> &group = peers_[comm.inProcessGroupId()];
  if (!group)
    group = PeerGroup::attach(comm, stream_, where(info));
  return group.get();
}

bool DeviceCollective::captured(const comm::Communicator &comm,
                                const comm::CallInfo &info, uint64_t barriers) {
  cudaStreamCaptureStatus status = cudaStreamCaptureStatusNone;
  MTRT_CUDA_CHECK(cudaStreamIsCapturing(stream_, &status), where(info));
  if (status == cudaStreamCaptureStatusNone)
    return false;
  std::shared_ptr<PeerGroup> &group = peers_[comm.inProcessGroupId()];
  for (CapturedCalls &calls : captured_)
    if (calls.group == group) {
      ++calls.count;
      calls.barriers += barriers;
      return true;
    }
  captured_.push_back({group, comm.rank(), 1, barriers});
  return true;
}

std::vector<DeviceCollective::CapturedCalls>
DeviceCollective::takeCapturedCalls() {
  return std::exchange(captured_, {});
}

std::string DeviceCollective::where(const comm::CallInfo &info) const {
  std::string text = where_;
  if (!info.label.empty())
    text += (text.empty() ? "" : ": ") + std::string(info.label);
  if (info.step >= 0)
    text += " (step " + std::to_string(info.step) + ")";
  return text;
}

template <typename Call>
void DeviceCollective::run(comm::Communicator &comm, const Buffers &buffers,
                           const comm::CallInfo &info, Call &&call,
                           bool awaited) {
  if (comm.takesDeviceMemory()) {
    auto theirs = static_cast<cudaStream_t>(comm.deviceStream());
    if (theirs != stream_) {
      if (!ready_) {
        MTRT_CUDA_CHECK(
            cudaEventCreateWithFlags(&ready_, cudaEventDisableTiming),
            where(info));
        MTRT_CUDA_CHECK(
            cudaEventCreateWithFlags(&done_, cudaEventDisableTiming),
            where(info));
      }
      MTRT_CUDA_CHECK(cudaEventRecord(ready_, stream_), where(info));
      MTRT_CUDA_CHECK(cudaStreamWaitEvent(theirs, ready_, 0), where(info));
    }
    call(buffers.send, buffers.recv, buffers.dtype);
    if (theirs != stream_ && awaited) {
      MTRT_CUDA_CHECK(cudaEventRecord(done_, theirs), where(info));
      MTRT_CUDA_CHECK(cudaStreamWaitEvent(stream_, done_, 0), where(info));
    }
    return;
  }
  bool tracing = PeerGroup::tracing();
  if (tracing)
    PeerGroup::trace("staged call begins: " + where(info));
  struct TraceEnd {
    bool on;
    std::string what;
    ~TraceEnd() {
      if (on)
        PeerGroup::trace("staged call ends: " + what);
    }
  } traceEnd{tracing, tracing ? where(info) : std::string()};
  // Staged: the operands after the stream's work, the call on host copies,
  // the result back before returning (the host copies are reused). bf16
  // elements are widened to fp32 for the call (the in-process communicator
  // reduces fp32: a sum of bf16 values rounds once, at the end) and the
  // result is rounded back to bf16.
  hostSend_.resize(buffers.sendBytes);
  hostRecv_.resize(buffers.recvBytes);
  if (buffers.sendBytes)
    MTRT_CUDA_CHECK(cudaMemcpyAsync(hostSend_.data(), buffers.send,
                                    buffers.sendBytes, cudaMemcpyDeviceToHost,
                                    stream_),
                    where(info) + ": copying the send buffer to the host");
  if (buffers.recvBytes && buffers.recvIsInput)
    MTRT_CUDA_CHECK(cudaMemcpyAsync(hostRecv_.data(), buffers.recv,
                                    buffers.recvBytes, cudaMemcpyDeviceToHost,
                                    stream_),
                    where(info) + ": copying the buffer to the host");
  MTRT_CUDA_CHECK(cudaStreamSynchronize(stream_),
                  where(info) + ": waiting for the operands");
  if (buffers.dtype == DType::BF16) {
    widenBf16(hostSend_, hostSendWide_);
    widenBf16(hostRecv_, hostRecvWide_);
    call(buffers.sendBytes ? hostSendWide_.data() : nullptr,
         buffers.recvBytes ? hostRecvWide_.data() : nullptr, DType::F32);
    narrowToBf16(hostRecvWide_, hostRecv_);
  } else {
    call(buffers.sendBytes ? hostSend_.data() : nullptr,
         buffers.recvBytes ? hostRecv_.data() : nullptr, buffers.dtype);
  }
  if (buffers.recvBytes) {
    MTRT_CUDA_CHECK(cudaMemcpyAsync(buffers.recv, hostRecv_.data(),
                                    buffers.recvBytes, cudaMemcpyHostToDevice,
                                    stream_),
                    where(info) + ": copying the result to the device");
    MTRT_CUDA_CHECK(cudaStreamSynchronize(stream_),
                    where(info) + ": waiting for the result");
  }
}

namespace {
size_t bytesOf(int64_t count, DType dtype) {
  return count > 0 ? static_cast<size_t>(count) * dtypeSize(dtype) : 0;
}
} // namespace

void DeviceCollective::allReduce(comm::Communicator &comm, const void *send,
                                 void *recv, int64_t count, DType dtype,
                                 comm::ReduceOp op,
                                 const comm::CallInfo &info) {
  if (PeerGroup *group = peer(comm, dtype, info))
    return group->allReduce(stream_, comm.rank(), send, recv, count, dtype, op,
                            captured(comm, info, 3), where(info));
  size_t bytes = bytesOf(count, dtype);
  run(comm, {send, bytes, recv, bytes, false, dtype}, info,
      [&](const void *s, void *r, DType type) {
        comm.allReduce(s, r, count, type, op, info);
      });
}

void DeviceCollective::allGather(comm::Communicator &comm, const void *send,
                                 void *recv, int64_t count, DType dtype,
                                 const comm::CallInfo &info) {
  if (PeerGroup *group = peer(comm, dtype, info))
    return group->allGather(stream_, comm.rank(), send, recv, count, dtype,
                            captured(comm, info, 2), where(info));
  size_t bytes = bytesOf(count, dtype);
  run(comm,
      {send, bytes, recv, bytes * static_cast<size_t>(comm.size()), false,
       dtype},
      info, [&](const void *s, void *r, DType type) {
        comm.allGather(s, r, count, type, info);
      });
}

void DeviceCollective::reduceScatter(comm::Communicator &comm, const void *send,
                                     void *recv, int64_t count, DType dtype,
                                     comm::ReduceOp op,
                                     const comm::CallInfo &info) {
  if (PeerGroup *group = peer(comm, dtype, info))
    return group->reduceScatter(stream_, comm.rank(), send, recv, count, dtype,
                                op, captured(comm, info, 2), where(info));
  size_t bytes = bytesOf(count, dtype);
  run(comm,
      {send, bytes * static_cast<size_t>(comm.size()), recv, bytes, false,
       dtype},
      info, [&](const void *s, void *r, DType type) {
        comm.reduceScatter(s, r, count, type, op, info);
      });
}

void DeviceCollective::broadcast(comm::Communicator &comm, void *buffer,
                                 int64_t count, DType dtype, int root,
                                 const comm::CallInfo &info) {
  if (PeerGroup *group = peer(comm, dtype, info))
    return group->broadcast(stream_, comm.rank(), buffer, count, dtype, root,
                            captured(comm, info, 2), where(info));
  run(comm, {nullptr, 0, buffer, bytesOf(count, dtype), true, dtype}, info,
      [&](const void *, void *r, DType type) {
        comm.broadcast(r, count, type, root, info);
      });
}

void DeviceCollective::send(comm::Communicator &comm, const void *buffer,
                            int64_t count, DType dtype, int peer,
                            const comm::CallInfo &info) {
  run(comm, {buffer, bytesOf(count, dtype), nullptr, 0, false, dtype}, info,
      [&](const void *s, void *, DType type) {
        comm.send(s, count, type, peer, info);
      });
}

void DeviceCollective::sendAsync(comm::Communicator &comm, const void *buffer,
                                 int64_t count, DType dtype, int peer,
                                 const comm::CallInfo &info) {
  run(
      comm, {buffer, bytesOf(count, dtype), nullptr, 0, false, dtype}, info,
      [&](const void *s, void *, DType type) {
        comm.sendAsync(s, count, type, peer, info);
      },
      /*awaited=*/false);
}

void DeviceCollective::recv(comm::Communicator &comm, void *buffer,
                            int64_t count, DType dtype, int peer,
                            const comm::CallInfo &info) {
  run(comm, {nullptr, 0, buffer, bytesOf(count, dtype), false, dtype}, info,
      [&](const void *, void *r, DType type) {
        comm.recv(r, count, type, peer, info);
      });
}

void DeviceCollective::sendRecv(comm::Communicator &comm,
                                const void *sendBuffer, int sendPeer,
                                void *recvBuffer, int recvPeer, int64_t count,
                                DType dtype, const comm::CallInfo &info) {
  size_t bytes = bytesOf(count, dtype);
  run(comm, {sendBuffer, bytes, recvBuffer, bytes, false, dtype}, info,
      [&](const void *s, void *r, DType type) {
        comm.sendRecv(s, sendPeer, r, recvPeer, count, type, info);
      });
}

} // namespace mtrt::cuda
