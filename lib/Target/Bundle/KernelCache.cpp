//===- KernelCache.cpp - The fused kernels' compilations on disk ----------===//

#include "KernelCache.h"

#include "llvm/ADT/SmallString.h"
#include "llvm/ADT/StringExtras.h"
#include "llvm/Support/CachePruning.h"
#include "llvm/Support/Chrono.h"
#include "llvm/Support/Endian.h"
#include "llvm/Support/FileSystem.h"
#include "llvm/Support/MemoryBuffer.h"
#include "llvm/Support/Path.h"
#include "llvm/Support/Process.h"
#include "llvm/Support/SHA256.h"
#include "llvm/Support/raw_ostream.h"

using namespace megatron;

namespace {

// An entry: the magic, the SHA-256 of everything after it, the cubin's and
// the PTX's sizes (64-bit little-endian), the cubin, the PTX.
constexpr llvm::StringLiteral kMagic = "MTKERNEL";
constexpr size_t kChecksumAt = 8, kSizesAt = kChecksumAt + 32,
                 kDataAt = kSizesAt + 16;

// The entries' names start as LLVM's cache pruning asks (it leaves other
// files alone).
std::string entryPath(llvm::StringRef folder, llvm::StringRef key) {
  llvm::SmallString<256> path(folder);
  llvm::sys::path::append(path, "llvmcache-" + key);
  return std::string(path);
}

std::array<uint8_t, 32> checksum(llvm::StringRef bytes) {
  return llvm::SHA256::hash(llvm::arrayRefFromStringRef(bytes));
}

} // namespace

std::optional<std::string> kernel_cache::folder() {
  if (std::optional<std::string> named =
          llvm::sys::Process::GetEnv("MEGATRON_KERNEL_CACHE")) {
    if (*named == "off")
      return std::nullopt;
    if (!named->empty())
      return named;
  }
  llvm::SmallString<256> path;
  if (!llvm::sys::path::cache_directory(path))
    return std::nullopt;
  llvm::sys::path::append(path, "megatron", "fused-kernels");
  return std::string(path);
}

std::string kernel_cache::key(llvm::ArrayRef<llvm::StringRef> parts) {
  llvm::SHA256 hash;
  for (llvm::StringRef part : parts) {
    uint8_t size[8];
    llvm::support::endian::write64le(size, part.size());
    hash.update(llvm::ArrayRef<uint8_t>(size));
    hash.update(part);
  }
  return llvm::toHex(hash.final(), /*LowerCase=*/true);
}

std::optional<CompiledKernels> kernel_cache::read(llvm::StringRef folder,
                                                  llvm::StringRef key) {
  auto file = llvm::MemoryBuffer::getFile(entryPath(folder, key),
                                          /*IsText=*/false,
                                          /*RequiresNullTerminator=*/false);
  if (!file)
    return std::nullopt;
  llvm::StringRef bytes = (*file)->getBuffer();
  if (bytes.size() < kDataAt || !bytes.starts_with(kMagic))
    return std::nullopt;
  std::array<uint8_t, 32> expected = checksum(bytes.substr(kSizesAt));
  if (llvm::StringRef(reinterpret_cast<const char *>(expected.data()), 32) !=
      bytes.substr(kChecksumAt, 32))
    return std::nullopt;
  uint64_t cubinSize = llvm::support::endian::read64le(bytes.data() + kSizesAt);
  uint64_t ptxSize =
      llvm::support::endian::read64le(bytes.data() + kSizesAt + 8);
  if (cubinSize > bytes.size() - kDataAt ||
      ptxSize != bytes.size() - kDataAt - cubinSize)
    return std::nullopt;
  CompiledKernels kernels;
  kernels.cubin = bytes.substr(kDataAt, cubinSize).str();
  kernels.ptx = bytes.substr(kDataAt + cubinSize).str();
  // Used now: the pruning removes the entries used least recently.
  int fd = -1;
  if (!llvm::sys::fs::openFileForWrite(entryPath(folder, key), fd,
                                       llvm::sys::fs::CD_OpenExisting,
                                       llvm::sys::fs::OF_Append)) {
    (void)llvm::sys::fs::setLastAccessAndModificationTime(
        fd, std::chrono::system_clock::now());
    llvm::sys::Process::SafelyCloseFileDescriptor(fd);
  }
  return kernels;
}

void kernel_cache::write(llvm::StringRef folder, llvm::StringRef key,
                         const CompiledKernels &kernels) {
  if (llvm::sys::fs::create_directories(folder))
    return;
  std::string body(16, '\0');
  llvm::support::endian::write64le(body.data(), kernels.cubin.size());
  llvm::support::endian::write64le(body.data() + 8, kernels.ptx.size());
  body += kernels.cubin;
  body += kernels.ptx;
  std::array<uint8_t, 32> sum = checksum(body);
  std::string path = entryPath(folder, key);
  int fd = -1;
  llvm::SmallString<256> temporary;
  if (llvm::sys::fs::createUniqueFile(path + ".%%%%%%%%.tmp", fd, temporary))
    return;
  {
    llvm::raw_fd_ostream out(fd, /*shouldClose=*/true);
    out << kMagic
        << llvm::StringRef(reinterpret_cast<const char *>(sum.data()), 32)
        << body;
    out.close();
    if (out.has_error()) {
      out.clear_error();
      llvm::sys::fs::remove(temporary);
      return;
    }
  }
  if (llvm::sys::fs::rename(temporary, path)) {
    llvm::sys::fs::remove(temporary);
    return;
  }
  // At most 1 GiB (about 250 models' kernels), none unused for 4 weeks;
  // the folder is looked through at most every 20 minutes.
  llvm::CachePruningPolicy policy;
  policy.Expiration = std::chrono::hours(4 * 7 * 24);
  policy.MaxSizeBytes = uint64_t(1) << 30;
  llvm::pruneCache(folder, policy);
}
