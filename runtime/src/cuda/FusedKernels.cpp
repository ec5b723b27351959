// Loading and launching the bundle's generated kernels.
#include "cuda/FusedKernels.h"

#include "core/Error.h"
#include "core/OpScratch.h"
#include "core/Random.h"
#include "cuda/CudaCheck.h"

#include <algorithm>

namespace mtrt::cuda {

namespace {
constexpr unsigned kThreads = 256; // the kernels' __launch_bounds__
/// The bits of the kernels' type mask (kFusedKernelTypeBits).
constexpr size_t kTypeBits = 64;
} // namespace

FusedKernelLibrary::FusedKernelLibrary(const Bundle &bundle)
    : typeMask_(bundle.fusedKernels().typeMask),
      sampleKeys_(bundle.fusedKernels().sampleKeys),
      fourPositionDraws_(bundle.fusedKernels().fourPositionDraws),
      version_(bundle.fusedKernels().version), bundleName_(bundle.name()) {
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
    // A group with column sums also has NAME_sums.
    cudaKernel_t sums = nullptr;
    if (cudaLibraryGetKernel(&sums, library_, (name + "_sums").c_str()) !=
        cudaSuccess) {
      cudaGetLastError(); // no column sums in this group
      sums = nullptr;
    }
    sumKernels_.push_back(sums);
  }
}

FusedKernelLibrary::~FusedKernelLibrary() {
  if (library_)
    cudaLibraryUnload(library_);
}

bool FusedKernelLibrary::takesBf16(size_t index) const {
  return typeMask_ && index < kTypeBits;
}

void FusedKernelLibrary::launch(cudaStream_t stream, const Instruction &inst,
                                int64_t n,
                                const std::vector<InElements> &operands,
                                const std::vector<OutElements> &results,
                                const random::MaskTile &tile,
                                const std::string &where, int64_t cols,
                                const std::vector<ColumnSum> &sums,
                                void *scratch) const {
  int64_t rows = cols > 0 ? n / cols : 0;
  // Each sum's partial rows (core/OpScratch.h).
  std::vector<float *> partials;
  for (size_t s = 0; s < sums.size(); ++s)
    partials.push_back(
        reinterpret_cast<float *>(static_cast<char *>(scratch) +
                                  s * scratch::biasGradOpBytes(rows, cols)));
  if (n <= 0) {
    for (size_t s = 0; s < sums.size(); ++s)
      columnSumTotals(stream, 0, cols, partials[s], sums[s].out);
    return;
  }
  // Groups of four only when every pointer allows 16-byte accesses; bit k
  // of the mask: value k (operands, then results) is bf16.
  bool aligned = true;
  unsigned long long bf16 = 0;
  size_t index = 0;
  auto add = [&](const void *data, bool isBf16) {
    aligned = aligned && reinterpret_cast<uintptr_t>(data) % 16 == 0;
    if (isBf16) {
      if (!takesBf16(index))
        throw Error(MTRT_STATUS_INTERNAL,
                    where + ": value " + std::to_string(index) +
                        " of the fused kernel is bf16, which its kernel "
                        "cannot store (format version 3 to 5 bundle, or "
                        "past the type mask's 64 bits)");
      bf16 |= 1ull << index;
    }
    ++index;
  };
  for (const InElements &x : operands)
    add(x.data, x.bf16);
  for (const OutElements &y : results)
    add(y.data, y.bf16);
  long long count = n;
  long long vectors = aligned ? n / 4 : 0;
  // One seed key per dropout with p > 0, in body order, after the tile
  // that maps elements to (sample, position).
  std::vector<unsigned long long> keys;
  for (const Instruction &op : inst.body)
    if (op.op == Op::Dropout && op.attrs.p != 0)
      keys.push_back(random::seedKey(static_cast<uint64_t>(op.attrs.seed)));
  if (!keys.empty() && !sampleKeys_)
    throw Error(MTRT_STATUS_FAILED_PRECONDITION,
                where + ": fused kernel " + std::to_string(inst.attrs.kernel) +
                    " of bundle '" + bundleName_ + "' (format version " +
                    std::to_string(version_) +
                    ") keys its dropout masks on the micro-batch step, which "
                    "this runtime no longer does (version 7 keys them on the "
                    "sample); recompile the bundle with this "
                    "megatron-compile, or compile it without "
                    "--fuse-kernels");
  if (!keys.empty() && !fourPositionDraws_)
    throw Error(MTRT_STATUS_FAILED_PRECONDITION,
                where + ": fused kernel " + std::to_string(inst.attrs.kernel) +
                    " of bundle '" + bundleName_ + "' (format version " +
                    std::to_string(version_) +
                    ") draws one dropout hash per element, where this "
                    "runtime draws one per four positions (version 10), so "
                    "its masks would not be the host's; recompile the "
                    "bundle with this megatron-compile, or compile it "
                    "without --fuse-kernels");
  random::MaskTile maskTile = tile;
  std::vector<const void *> pointers;
  for (const InElements &x : operands)
    pointers.push_back(x.data);
  for (const OutElements &y : results)
    pointers.push_back(y.data);
  std::vector<void *> args;
  args.push_back(&count);
  args.push_back(&vectors);
  if (typeMask_)
    args.push_back(&bf16);
  if (!keys.empty())
    args.push_back(&maskTile);
  for (unsigned long long &key : keys)
    args.push_back(&key);
  for (const void *&p : pointers)
    args.push_back(&p);
  auto kernel = static_cast<size_t>(inst.attrs.kernel);
  if (!sums.empty() && sumKernels_[kernel] && typeMask_ && aligned &&
      cols % 8 == 0) {
    // The column-sum form: (rows, colOctets) instead of (n, vectors), the
    // partial rows last; block (32, 8), a chunk of 64 rows a block row.
    long long sumRows = rows, colOctets = cols / 8;
    args[0] = &sumRows;
    args[1] = &colOctets;
    for (float *&partial : partials)
      args.push_back(&partial);
    dim3 grid(static_cast<unsigned>((colOctets + 31) / 32),
              static_cast<unsigned>(scratch::columnSumChunks(rows)));
    MTRT_CUDA_CHECK(
        cudaLaunchKernel(reinterpret_cast<const void *>(sumKernels_[kernel]),
                         grid, dim3(32, 8), args.data(), 0, stream),
        where + ": fused kernel " + std::to_string(inst.attrs.kernel) +
            " with column sums");
    for (size_t s = 0; s < sums.size(); ++s)
      columnSumTotals(stream, rows, cols, partials[s], sums[s].out);
    return;
  }
  // The kernels take pairs of groups of eight (vectors / 4 of them), the
  // odd group, then the rest one by one, in a grid-stride loop (so the
  // groups of eight or four that earlier compilers' kernels take run right
  // with the same grid).
  long long octets = vectors / 2;
  long long items = std::max<long long>((octets + 1) / 2, count - 8 * octets);
  long long blocks = std::clamp<long long>((items + kThreads - 1) / kThreads,
                                           1, 65535LL * 16);
  MTRT_CUDA_CHECK(
      cudaLaunchKernel(reinterpret_cast<const void *>(kernels_[kernel]),
                       dim3(static_cast<unsigned>(blocks)), dim3(kThreads),
                       args.data(), 0, stream),
      where + ": fused kernel " + std::to_string(inst.attrs.kernel));
  // Without the column-sum form: the sums of what the kernel stored.
  for (size_t s = 0; s < sums.size(); ++s) {
    const OutElements &stored = results[sums[s].summed];
    biasGrad(stream, rows, cols, NormRows{stored.data, stored.bf16},
             sums[s].out, partials[s]);
  }
}

} // namespace mtrt::cuda
