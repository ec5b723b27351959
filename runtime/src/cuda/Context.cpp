// Device selection, the stream, cuBLASLt, cuDNN and device buffers.
#include "cuda/Context.h"

#include "core/Error.h"
#include "cuda/CudaCheck.h"
#include "cuda/CudnnAttention.h"
#include "cuda/PeerCollective.h"

#include <cstdio>

namespace mtrt::cuda {

DeviceBuffer::DeviceBuffer(size_t bytes, const std::string &what)
    : size_(bytes) {
  // Never 0 bytes, so that data() is a valid device pointer for empty
  // tensors too. cudaMalloc and cudaFree may wait for the device: not
  // while an in-process rank's graph spins for a peer (PeerGroup::Setup).
  PeerGroup::Setup setup;
  MTRT_CUDA_CHECK(cudaMalloc(&data_, bytes ? bytes : 256),
                  "allocating " + std::to_string(bytes) + " bytes for " +
                      what);
}

DeviceBuffer::~DeviceBuffer() {
  if (data_) {
    PeerGroup::Setup setup;
    cudaFree(data_);
  }
}

DeviceBuffer::DeviceBuffer(DeviceBuffer &&other) noexcept
    : data_(other.data_), size_(other.size_) {
  other.data_ = nullptr;
  other.size_ = 0;
}

DeviceBuffer &DeviceBuffer::operator=(DeviceBuffer &&other) noexcept {
  if (this != &other) {
    if (data_) {
      PeerGroup::Setup setup;
      cudaFree(data_);
    }
    data_ = other.data_;
    size_ = other.size_;
    other.data_ = nullptr;
    other.size_ = 0;
  }
  return *this;
}

int Context::deviceCount() {
  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess) {
    // No driver or no device: clear the runtime's last error, report none.
    (void)cudaGetLastError();
    return 0;
  }
  return count;
}

Context::Context(const ContextOptions &options) : options_(options) {
  int count = deviceCount();
  if (options.device < 0 || options.device >= count)
    throw Error(MTRT_STATUS_UNAVAILABLE,
                "the cuda backend needs CUDA device " +
                    std::to_string(options.device) + ", and this machine has " +
                    std::to_string(count) +
                    (count == 0 ? " (no GPU or no driver); use --backend host"
                                : ""));
  MTRT_CUDA_CHECK(cudaSetDevice(options.device), "selecting the CUDA device");
  cudaDeviceProp prop{};
  MTRT_CUDA_CHECK(cudaGetDeviceProperties(&prop, options.device),
                  "reading the CUDA device's properties");
  char memory[32];
  std::snprintf(memory, sizeof(memory), "%.1f GiB",
                static_cast<double>(prop.totalGlobalMem) / (1u << 30));
  description_ = std::string(prop.name) + " (device " +
                 std::to_string(options.device) + ", compute capability " +
                 std::to_string(prop.major) + "." +
                 std::to_string(prop.minor) + ", " +
                 std::to_string(prop.multiProcessorCount) + " SMs, " + memory +
                 ")";
  MTRT_CUDA_CHECK(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking),
                  "creating the CUDA stream");
  gemm_ = std::make_unique<Gemm>(stream_, options.tf32, options.gemmTuning);
  fault_ = DeviceBuffer(sizeof(unsigned), "the kernels' fault word");
  resetFault();
}

Context::~Context() {
  cudnn_.reset();
  fp8Gemm_.reset();
  gemm_.reset();
  fault_ = DeviceBuffer();
  if (commStream_) {
    cudaStreamSynchronize(commStream_);
    cudaStreamDestroy(commStream_);
  }
  if (stream_) {
    cudaStreamSynchronize(stream_);
    cudaStreamDestroy(stream_);
  }
}

cudaStream_t Context::communicationStream() {
  if (!commStream_)
    MTRT_CUDA_CHECK(
        cudaStreamCreateWithFlags(&commStream_, cudaStreamNonBlocking),
        "creating the communication stream");
  return commStream_;
}

CudnnAttention *Context::cudnnAttention() {
  if (!cudnnTried_) {
    cudnnTried_ = true;
    if (!options_.cudnnAttention)
      cudnnMissing_ = "ContextOptions::cudnnAttention is off "
                      "(MTRT_CUDA_CUDNN_ATTENTION=0 in megatron-train)";
    else
      cudnnMissing_ = cudnnAttentionUnavailableReason();
    if (cudnnMissing_.empty()) {
      try {
        cudnn_ = std::make_unique<CudnnAttention>();
      } catch (const Error &e) { // the own kernels run instead
        cudnnMissing_ = e.what();
      }
    }
  }
  return cudnn_.get();
}

void Context::resetFault() {
  MTRT_CUDA_CHECK(cudaMemsetAsync(fault_.data(), 0, sizeof(unsigned), stream_),
                  "clearing the fault word");
}

unsigned Context::readFault() {
  unsigned value = 0;
  MTRT_CUDA_CHECK(cudaMemcpyAsync(&value, fault_.data(), sizeof(unsigned),
                                  cudaMemcpyDeviceToHost, stream_),
                  "reading the fault word");
  synchronize("reading the fault word");
  return value;
}

Fp8Gemm &Context::fp8Gemm() {
  if (!fp8Gemm_)
    fp8Gemm_ = std::make_unique<Fp8Gemm>(stream_, gemm_->tuning());
  return *fp8Gemm_;
}

void Context::synchronize(const std::string &what) {
  PeerGroup::trace("synchronizing: " + what);
  MTRT_CUDA_CHECK(cudaStreamSynchronize(stream_), what);
  PeerGroup::trace("synchronized");
}

} // namespace mtrt::cuda
