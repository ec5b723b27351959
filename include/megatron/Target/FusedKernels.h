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

/// The kernels' launch contract (bundle format version 7), shared with the
/// runtime (runtime/src/cuda/FusedKernels.cpp):
///
///   extern "C" __global__ void NAME(long long n, long long vectors,
///       unsigned long long bf16, mtrt::random::MaskTile tile,
///       unsigned long long key0, ..., const void *in0, ..., void *out0, ...)
///
/// over `n` elements of every operand (in0...) and result (out0...), all of
/// one shape, in the group's operand and result order. Each is stored in
/// fp32, or in bf16 when its bit of `bf16` is set: bit i for operand i,
/// bit (operands + j) for result j; values past bit 63 are fp32. The
/// arithmetic is f32 either way (bf16 widens exactly and rounds to nearest
/// even when stored). Threads take elements in a grid-stride loop: first
/// pairs of the vectors / 2 groups of eight (`vectors` is n / 4 when every
/// pointer is 16-byte aligned, else 0; one 16-byte access per bf16
/// pointer, two per fp32 one), then the odd group, then the rest one by
/// one (earlier compilers' kernels took groups of eight, or `vectors`
/// groups of four, a thread). A group with a dropout of p > 0 takes `tile` (by
/// value: where its elements lie among the micro-batch's samples, the global
/// tile of the host's GlobalTile) and one key per such dropout, in body order,
/// random::seedKey(seed); element i is kept iff random::dropoutKeep(
/// sampleKey(key, maskSample(tile, i)), maskPosition(tile, i),
/// dropoutThreshold16(p)), exactly as runtime/src/core/Random.h, whose
/// source the kernels include (one draw per four aligned positions; a group
/// of eight that is two draws' positions maps its first element and hashes
/// each draw once, a pair of them four draws' once for all four, else each
/// half maps and hashes as a group of four, or lane by lane); a group
/// without one takes
/// neither. Groups that differ only in their dropout seeds share one
/// kernel. (Versions 7 to 9 drew one hash per element; version 6 took
/// random::streamKey(seed, step) keys and drew element i at index i;
/// versions 3 to 5 had no `bf16` argument and f32 pointers.)
///
/// A group with column sums (an mt.bias_grad of a stored result in its
/// body, mt-fuse-column-sums) passes only its stored results, and has a
/// second entry point NAME_sums(long long rows, long long colOctets, bf16,
/// [tile, keys,] operands..., stored results..., float *partial0, ...)
/// over [rows, 8 colOctets] elements with every pointer 16-byte aligned,
/// block (32, 8): blockIdx.y a chunk of 64 rows, threadIdx.y a group of 8
/// of them, thread x column octet 32 blockIdx.x + x. Each sum adds its
/// result's values as stored, in f32 in row order within a group; the
/// block adds its groups' sums in order into the chunk's partial row (the
/// runtime's biasGrad definition: docs/BundleFormat.md, "Fused kernels").
constexpr unsigned kFusedKernelThreads = 256;
/// The bits of the type mask: operands and results past them are fp32.
constexpr size_t kFusedKernelTypeBits = 64;

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
