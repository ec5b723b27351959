// Communicator calls over device buffers: straight through to a communicator
// that takes device memory, staged through the host for one that does not.
#include "cuda/DeviceCollective.h"

#include "cuda/CudaCheck.h"

namespace mtrt::cuda {

DeviceCollective::DeviceCollective(cudaStream_t stream, std::string where)
    : stream_(stream), where_(std::move(where)) {}

DeviceCollective::~DeviceCollective() {
  if (ready_)
    (void)cudaEventDestroy(ready_);
  if (done_)
    (void)cudaEventDestroy(done_);
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
        MTRT_CUDA_CHECK(cudaEventCreateWithFlags(&done_, cudaEventDisableTiming),
                        where(info));
      }
      MTRT_CUDA_CHECK(cudaEventRecord(ready_, stream_), where(info));
      MTRT_CUDA_CHECK(cudaStreamWaitEvent(theirs, ready_, 0), where(info));
    }
    call(buffers.send, buffers.recv);
    if (theirs != stream_ && awaited) {
      MTRT_CUDA_CHECK(cudaEventRecord(done_, theirs), where(info));
      MTRT_CUDA_CHECK(cudaStreamWaitEvent(stream_, done_, 0), where(info));
    }
    return;
  }
  // Staged: the operands after the stream's work, the call on host copies,
  // the result back before returning (the host copies are reused).
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
  call(buffers.sendBytes ? hostSend_.data() : nullptr,
       buffers.recvBytes ? hostRecv_.data() : nullptr);
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
  size_t bytes = bytesOf(count, dtype);
  run(comm, {send, bytes, recv, bytes, false}, info,
      [&](const void *s, void *r) {
        comm.allReduce(s, r, count, dtype, op, info);
      });
}

void DeviceCollective::allGather(comm::Communicator &comm, const void *send,
                                 void *recv, int64_t count, DType dtype,
                                 const comm::CallInfo &info) {
  size_t bytes = bytesOf(count, dtype);
  run(comm, {send, bytes, recv, bytes * static_cast<size_t>(comm.size()), false},
      info, [&](const void *s, void *r) {
        comm.allGather(s, r, count, dtype, info);
      });
}

void DeviceCollective::reduceScatter(comm::Communicator &comm,
                                     const void *send, void *recv,
                                     int64_t count, DType dtype,
                                     comm::ReduceOp op,
                                     const comm::CallInfo &info) {
  size_t bytes = bytesOf(count, dtype);
  run(comm, {send, bytes * static_cast<size_t>(comm.size()), recv, bytes, false},
      info, [&](const void *s, void *r) {
        comm.reduceScatter(s, r, count, dtype, op, info);
      });
}

void DeviceCollective::broadcast(comm::Communicator &comm, void *buffer,
                                 int64_t count, DType dtype, int root,
                                 const comm::CallInfo &info) {
  run(comm, {nullptr, 0, buffer, bytesOf(count, dtype), true}, info,
      [&](const void *, void *r) {
        comm.broadcast(r, count, dtype, root, info);
      });
}

void DeviceCollective::send(comm::Communicator &comm, const void *buffer,
                            int64_t count, DType dtype, int peer,
                            const comm::CallInfo &info) {
  run(comm, {buffer, bytesOf(count, dtype), nullptr, 0, false}, info,
      [&](const void *s, void *) { comm.send(s, count, dtype, peer, info); });
}

void DeviceCollective::sendAsync(comm::Communicator &comm,
                                 const void *buffer, int64_t count,
                                 DType dtype, int peer,
                                 const comm::CallInfo &info) {
  run(
      comm, {buffer, bytesOf(count, dtype), nullptr, 0, false}, info,
      [&](const void *s, void *) {
        comm.sendAsync(s, count, dtype, peer, info);
      },
      /*awaited=*/false);
}

void DeviceCollective::recv(comm::Communicator &comm, void *buffer,
                            int64_t count, DType dtype, int peer,
                            const comm::CallInfo &info) {
  run(comm, {nullptr, 0, buffer, bytesOf(count, dtype), false}, info,
      [&](const void *, void *r) { comm.recv(r, count, dtype, peer, info); });
}

void DeviceCollective::sendRecv(comm::Communicator &comm,
                                const void *sendBuffer, int sendPeer,
                                void *recvBuffer, int recvPeer, int64_t count,
                                DType dtype, const comm::CallInfo &info) {
  size_t bytes = bytesOf(count, dtype);
  run(comm, {sendBuffer, bytes, recvBuffer, bytes, false}, info,
      [&](const void *s, void *r) {
        comm.sendRecv(s, sendPeer, r, recvPeer, count, dtype, info);
      });
}

} // namespace mtrt::cuda
