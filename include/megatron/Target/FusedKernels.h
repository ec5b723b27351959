//===- FusedKernels.h - CUDA kernels for mt.fused groups --------*- C++ -*-===//
//
// Each mt.fused group (mt-fuse-elementwise) becomes one CUDA C++ kernel,
// compiled once at compile time with nvrtc to an sm_90 cubin and to PTX (for
// later GPUs, through the driver's JIT); the bundle stores both
// (docs/BundleFormat.md, "Fused kernels").
//
//===----------------------------------------------------------------------===//

#ifndef MEGATRON_TARGET_FUSEDKERNELS_H
#define MEGATRON_TARGET_FUSEDKERNELS_H

#include "mt/IR/MtOps.h"

#include "llvm/Support/Error.h"

#include <string>

namespace megatron {

/// The kernels' launch contract, shared with the runtime
/// (runtime/src/cuda/FusedKernels.cpp):
///
///   extern "C" __global__ void NAME(long long n, long long vectors,
///       unsigned long long key0, ..., const float *in0, ...,
///       float *out0, ...)
///
/// over `n` elements of every operand (in0...) and result (out0...), all
/// f32 and of one shape, in the group's operand and result order. Threads
/// take elements in a grid-stride loop: first `vectors` groups of four
/// (float4 loads and stores; 0 unless every pointer is 16-byte aligned and
/// vectors * 4 <= n), then the rest one by one. One key per dropout of the
/// body with p > 0, in body order: random::streamKey(seed, step), the
/// mask of element i drawn at index i exactly as
/// runtime/src/core/Random.h, whose source the kernels include. Groups
/// that differ only in their dropout seeds share one kernel.
constexpr unsigned kFusedKernelThreads = 256;

/// The CUDA C++ of one group's kernel named `name`.
std::string emitFusedKernel(mlir::mt::FusedOp group, llvm::StringRef name);

/// What every generated translation unit starts with: the random
/// generator's source and the types it needs.
std::string fusedKernelPrelude();

/// The compiled forms of a translation unit of generated kernels.
struct CompiledKernels {
  std::string arch; ///< "sm_90"
  std::string cubin;
  std::string ptx;
};

/// Compiles `source` with nvrtc for sm_90: a cubin and PTX. Fails with
/// nvrtc's log, or when the compiler was built without the toolkit.
llvm::Expected<CompiledKernels> compileFusedKernels(llvm::StringRef source);

} // namespace megatron

#endif // MEGATRON_TARGET_FUSEDKERNELS_H
