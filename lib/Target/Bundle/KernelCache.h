//===- KernelCache.h - The fused kernels' compilations on disk --*- C++ -*-===//
//
// nvrtc takes tens of seconds for the fused kernels of a model, and the same
// source comes back whenever a model is compiled again with another layout,
// micro-batch size or flag that leaves its elementwise groups alone. The
// cache keeps each compilation's cubin and PTX in a file named by the
// SHA-256 of everything that decides them: nvrtc's version, the options,
// the random generator's header and the source.
//
// The folder is MEGATRON_KERNEL_CACHE, or <the user's cache folder>/megatron/
// fused-kernels (XDG_CACHE_HOME, else ~/.cache); MEGATRON_KERNEL_CACHE=off
// turns the cache off. An entry is written to a unique name and renamed into
// place, so that compilers running at once never see half of one; an entry
// whose checksum does not hold is compiled again and replaced. The cache is
// an optimization: a folder that cannot be made or written leaves the
// compilation as it was.
//
//===----------------------------------------------------------------------===//

#ifndef MEGATRON_LIB_TARGET_BUNDLE_KERNELCACHE_H
#define MEGATRON_LIB_TARGET_BUNDLE_KERNELCACHE_H

#include "megatron/Target/FusedKernels.h"

#include "llvm/ADT/ArrayRef.h"
#include "llvm/ADT/StringRef.h"

#include <optional>
#include <string>

namespace megatron::kernel_cache {

/// The cache's folder, or none when MEGATRON_KERNEL_CACHE=off or no user
/// cache folder is known.
std::optional<std::string> folder();

/// The hex SHA-256 of `parts`, each preceded by its length.
std::string key(llvm::ArrayRef<llvm::StringRef> parts);

/// The entry `key` in `folder`, when there is one and its checksum holds.
std::optional<CompiledKernels> read(llvm::StringRef folder,
                                    llvm::StringRef key);

/// Stores `kernels` as entry `key` in `folder` (made if missing); failures
/// are left silent (the next compilation compiles again).
void write(llvm::StringRef folder, llvm::StringRef key,
           const CompiledKernels &kernels);

} // namespace megatron::kernel_cache

#endif // MEGATRON_LIB_TARGET_BUNDLE_KERNELCACHE_H
