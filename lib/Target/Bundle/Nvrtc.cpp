//===- Nvrtc.cpp - Compiles the fused kernels with nvrtc ------------------===//

#include "megatron/Target/FusedKernels.h"

#include "KernelCache.h"
#include "RandomSource.h"

#include "llvm/ADT/SmallVector.h"
#include "llvm/ADT/Twine.h"

#ifdef MEGATRON_HAVE_NVRTC
#include <nvrtc.h>
#endif

using namespace megatron;

#ifdef MEGATRON_HAVE_NVRTC

namespace {

/// One nvrtc program, destroyed on every path.
class Program {
public:
  ~Program() {
    if (program)
      nvrtcDestroyProgram(&program);
  }
  nvrtcProgram program = nullptr;
};

llvm::Error nvrtcError(nvrtcResult result, const llvm::Twine &what,
                       const std::string &log = std::string()) {
  return llvm::createStringError(
      "nvrtc: " + what + " failed: " + nvrtcGetErrorString(result) +
      (log.empty() ? std::string() : "\n" + log));
}

} // namespace

llvm::Expected<CompiledKernels>
megatron::compileFusedKernels(llvm::StringRef source) {
  // One compilation for sm_90 gives both the cubin and the PTX it was
  // made from (the PTX a compute_90 compilation gives, byte for byte). No
  // FMA contraction: each product and sum rounds as on the host (the
  // runtime's own kernels are compiled the same way).
  CompiledKernels kernels;
  kernels.arch = "sm_90";
  std::string archOption = "--gpu-architecture=" + kernels.arch;
  const char *options[] = {archOption.c_str(), "--fmad=false", "--std=c++17"};

  // An earlier compilation of the same source, options and nvrtc
  // (KernelCache.h).
  int major = 0, minor = 0;
  if (nvrtcResult result = nvrtcVersion(&major, &minor))
    return nvrtcError(result, "nvrtcVersion");
  std::string version = std::to_string(major) + "." + std::to_string(minor);
  std::optional<std::string> cache = kernel_cache::folder();
  std::string key =
      kernel_cache::key({version, options[0], options[1], options[2],
                         detail::kRandomHeaderSource, source});
  if (cache) {
    if (std::optional<CompiledKernels> cached =
            kernel_cache::read(*cache, key)) {
      cached->arch = kernels.arch;
      return std::move(*cached);
    }
  }

  Program program;
  const char *headers[] = {detail::kRandomHeaderSource};
  const char *headerNames[] = {"core/Random.h"};
  std::string text = source.str();
  if (nvrtcResult result = nvrtcCreateProgram(&program.program, text.c_str(),
                                              "mt_fused_kernels.cu", 1,
                                              headers, headerNames))
    return nvrtcError(result, "creating the program");
  nvrtcResult compiled = nvrtcCompileProgram(program.program, 3, options);
  size_t logSize = 0;
  std::string log;
  if (nvrtcGetProgramLogSize(program.program, &logSize) == NVRTC_SUCCESS &&
      logSize > 1) {
    log.resize(logSize);
    nvrtcGetProgramLog(program.program, log.data());
    log.resize(logSize - 1);
  }
  if (compiled != NVRTC_SUCCESS)
    return nvrtcError(compiled,
                      "compiling the fused kernels for " + kernels.arch, log);
  size_t size = 0;
  if (nvrtcResult result = nvrtcGetCUBINSize(program.program, &size))
    return nvrtcError(result, "nvrtcGetCUBINSize");
  kernels.cubin.resize(size);
  if (nvrtcResult result = nvrtcGetCUBIN(program.program, kernels.cubin.data()))
    return nvrtcError(result, "nvrtcGetCUBIN");
  if (nvrtcResult result = nvrtcGetPTXSize(program.program, &size))
    return nvrtcError(result, "nvrtcGetPTXSize");
  kernels.ptx.resize(size);
  if (nvrtcResult result = nvrtcGetPTX(program.program, kernels.ptx.data()))
    return nvrtcError(result, "nvrtcGetPTX");
  if (cache)
    kernel_cache::write(*cache, key, kernels);
  return kernels;
}

#else

llvm::Expected<CompiledKernels>
megatron::compileFusedKernels(llvm::StringRef) {
  (void)detail::kRandomHeaderSource;
  return llvm::createStringError(
      "this megatron-compile was built without the CUDA toolkit (nvrtc), so "
      "it cannot compile fused kernels; rebuild it with the toolkit at "
      "/usr/local/cuda, or compile with --fuse-kernels=false");
}

#endif
