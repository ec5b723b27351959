// Loading and launching the bundle's generated kernels.
#include "cuda/FusedKernels.h"

#include "core/Error.h"
#include "core/Random.h"
#include "cuda/CudaCheck.h"

#include <algorithm>

namespace mtrt::cuda {

namespace {
constexpr unsigned kThreads = 256; // the kernels' __launch_bounds__
} // namespace

FusedKernelLibrary::FusedKernelLibrary(const Bundle &bundle) {
  const FusedKernels &kernels = bundle.fusedKernels();
  std::string what = "loading the " + std::to_string(kernels.names.size()) +
                     " fused kernels of bundle '" + bundle.name() + "'";
  cudaError_t fromCubin = cudaErrorInvalidKernelImage;
  if (!kernels.cubin.empty())
    fromCubin = cudaLibraryLoadData(&library_, kernels.cubin.data(), nullptr,
                                    nullptr, 0, nullptr, nullptr, 0);
  if (fromCubin != cudaSuccess) {
    cudaGetLastError(); // the cubin's failure is reported below if PTX fails
    std::string ptx = kernels.ptx; // NUL-terminated for the JIT
    cudaError_t fromText = cudaLibraryLoadData(&library_, ptx.c_str(), nullptr,
                                               nullptr, 0, nullptr, nullptr, 0);
    if (fromText != cudaSuccess)
      throw Error(MTRT_STATUS_UNIMPLEMENTED,
                  what + ": the " + kernels.arch + " cubin failed (" +
                      cudaGetErrorString(fromCubin) + ") and so did the PTX (" +
                      cudaGetErrorString(fromText) +
                      "); recompile the bundle with a megatron-compile whose "
                      "nvrtc targets this GPU");
    fromPtx_ = true;
  }
  for (const std::string &name : kernels.names) {
    cudaKernel_t kernel = nullptr;
    MTRT_CUDA_CHECK(cudaLibraryGetKernel(&kernel, library_, name.c_str()),
                    what + ": kernel " + name);
    kernels_.push_back(kernel);
  }
}

FusedKernelLibrary::~FusedKernelLibrary() {
  if (library_)
    cudaLibraryUnload(library_);
}

void FusedKernelLibrary::launch(cudaStream_t stream, const Instruction &inst,
                                int64_t n,
                                const std::vector<const float *> &operands,
                                const std::vector<float *> &results,
                                uint64_t step, const std::string &where) const {
  if (n <= 0)
    return;
  // float4 groups only when every pointer allows 16-byte accesses.
  bool aligned = true;
  for (const float *p : operands)
    aligned = aligned && reinterpret_cast<uintptr_t>(p) % 16 == 0;
  for (float *p : results)
    aligned = aligned && reinterpret_cast<uintptr_t>(p) % 16 == 0;
  long long count = n;
  long long vectors = aligned ? n / 4 : 0;
  // One stream key per dropout with p > 0, in body order (the host's
  // random::streamKey(seed, step)).
  std::vector<unsigned long long> keys;
  for (const Instruction &op : inst.body)
    if (op.op == Op::Dropout && op.attrs.p != 0)
      keys.push_back(random::streamKey(static_cast<uint64_t>(op.attrs.seed),
                                       step));
  std::vector<const void *> pointers;
  for (const float *p : operands)
    pointers.push_back(p);
  for (float *p : results)
    pointers.push_back(p);
  std::vector<void *> args;
  args.push_back(&count);
  args.push_back(&vectors);
  for (unsigned long long &key : keys)
    args.push_back(&key);
  for (const void *&p : pointers)
    args.push_back(&p);
  long long items = std::max<long long>(vectors, count - 4 * vectors);
  long long blocks = std::clamp<long long>((items + kThreads - 1) / kThreads,
                                           1, 65535LL * 16);
  MTRT_CUDA_CHECK(
      cudaLaunchKernel(reinterpret_cast<const void *>(
                           kernels_[static_cast<size_t>(inst.attrs.kernel)]),
                       dim3(static_cast<unsigned>(blocks)), dim3(kThreads),
                       args.data(), 0, stream),
      where + ": fused kernel " + std::to_string(inst.attrs.kernel));
}

} // namespace mtrt::cuda
