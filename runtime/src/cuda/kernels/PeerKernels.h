// The kernels of the collectives of in-process ranks sharing one GPU
// (cuda/PeerCollective.h): a flag barrier and the copies and reductions that
// read the peers' buffers.
#ifndef MTRT_SRC_CUDA_KERNELS_PEERKERNELS_H
#define MTRT_SRC_CUDA_KERNELS_PEERKERNELS_H

#include <cuda_runtime_api.h>

#include <cstdint>

namespace mtrt::cuda {

/// The most ranks a peer group may have.
constexpr int kMaxPeerRanks = 16;

/// One group's state in device memory, shared by its ranks (zeroed when
/// made): the barriers of calls captured in CUDA graphs. Rank r writes only
/// its own entries; the others read them.
struct PeerSlots {
  /// Barriers rank r has arrived at (only rank r writes it, released).
  unsigned long long phase[kMaxPeerRanks];
  /// Rank r's current call (kind, element type, count), which every rank
  /// checks against its own.
  unsigned long long signature[kMaxPeerRanks];
};

/// Every rank's buffers of one call, exchanged on the host (kernel
/// arguments: a captured graph keeps them, as it keeps every address).
struct PeerPointers {
  const void *send[kMaxPeerRanks];
  void *recv[kMaxPeerRanks];
};

/// The element types the kernels move: fp32, or bf16 reduced in fp32.
enum class PeerElement { F32, BF16 };

/// Loads every kernel below (CUDA loads kernels lazily, at their first
/// launch, which may wait for the kernels running; a barrier spinning for
/// a peer that is loading a kernel would never end). The first error, or
/// cudaSuccess.
cudaError_t preloadPeerKernels();

/// Arrives at the group's next barrier and waits until every rank has: one
/// thread, spinning on the ranks' phase counters (acquire/release at device
/// scope, so everything the stream wrote before is visible to the peers'
/// later kernels, and the peers' to this stream's). With a nonzero
/// `signature` the rank first publishes its call and, once all have
/// arrived, checks that every rank's signature equals its own. A peer
/// missing for `timeoutSeconds`, or a signature that differs, prints the
/// group, rank and barrier and traps (the stream's work fails). The
/// counters live on the device, so a CUDA graph replays it as it is.
void peerBarrier(cudaStream_t stream, PeerSlots *slots, int rank, int size,
                 unsigned long long signature, unsigned long long group,
                 unsigned timeoutSeconds);

/// out[i] = the ranks' send[offset + i] for i in [0, count), combined in
/// comm/FixedOrderReduce.h's fixed order (sums: the balanced rank tree, in
/// fp32 for bf16 and rounded once; max: the largest, NaN first, in rank
/// order). `out` may be the calling rank's own send + offset (no other
/// rank reads those elements of it).
void peerReduce(cudaStream_t stream, const PeerPointers &ranks, int size,
                PeerElement element, bool max, int64_t offset, int64_t count,
                void *out);

/// All-reduce's second half: out[q c, min((q + 1) c, count)) = rank q's
/// recv there, for every rank q but `rank` (whose chunk out already holds).
void peerGatherChunks(cudaStream_t stream, const PeerPointers &ranks, int rank,
                      int size, PeerElement element, int64_t chunk,
                      int64_t count, void *out);

/// out[q count + i] = rank q's send[i] for every rank q whose send is not
/// already there (all-gather in place).
void peerGatherSends(cudaStream_t stream, const PeerPointers &ranks, int size,
                     PeerElement element, int64_t count, void *out);

/// out[0, count) = rank `root`'s recv (broadcast's one buffer), unless out
/// is it.
void peerCopyFrom(cudaStream_t stream, const PeerPointers &ranks, int root,
                  PeerElement element, int64_t count, void *out);

} // namespace mtrt::cuda

#endif // MTRT_SRC_CUDA_KERNELS_PEERKERNELS_H
