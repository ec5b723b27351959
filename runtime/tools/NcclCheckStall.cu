// mtrt-nccl-check's --stall-at-step: a kernel that keeps the rank's stream
// busy, so that its next collective cannot complete (a hung rank, for the
// watchdog's test).
#include <cuda_runtime.h>

namespace {

__global__ void stallKernel(unsigned long long nanoseconds) {
  unsigned long long start, now;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(start));
  do {
    __nanosleep(1000000);
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(now));
  } while (now - start < nanoseconds);
}

} // namespace

/// Enqueues the stall on `stream`; returns the launch's error.
cudaError_t launchStall(cudaStream_t stream, double seconds) {
  stallKernel<<<1, 1, 0, stream>>>(
      static_cast<unsigned long long>(seconds * 1e9));
  return cudaGetLastError();
}
