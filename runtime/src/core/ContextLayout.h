// Causal load balancing's positions (docs/Parallelism.md, "Context
// parallelism"), usable in host and device code: the sequence is cut into
// 2 N chunks and context rank r holds chunks r and 2 N - 1 - r, in that
// order, so a rank's tile of the reordered sequence maps back to global
// positions here (the CUDA kernels of position_ids, rope, dropout and the
// attention blocks; the host's tilePositions and contextParallelPositions
// compute the same).
#ifndef MTRT_SRC_CORE_CONTEXTLAYOUT_H
#define MTRT_SRC_CORE_CONTEXTLAYOUT_H

#include <cstdint>

#if defined(__CUDACC__)
#define MTRT_CONTEXT_HOST_DEVICE __host__ __device__
#else
#define MTRT_CONTEXT_HOST_DEVICE
#endif

namespace mtrt {

/// A run of rows of the reordered sequence: row i of the tile is row
/// first + i of the `global`-long reordered sequence (the context ranks'
/// blocks one after another). contextSize 1: the reordered sequence is the
/// sequence.
struct ContextTile {
  int64_t first = 0, global = 0, contextSize = 1;
};

/// The global position of the tile's row i.
MTRT_CONTEXT_HOST_DEVICE inline int64_t contextGlobalPosition(
    const ContextTile &tile, int64_t i) {
  int64_t p = tile.first + i;
  if (tile.contextSize <= 1)
    return p;
  int64_t chunk = tile.global / (2 * tile.contextSize);
  int64_t r = p / (2 * chunk), w = p % (2 * chunk);
  return w < chunk ? r * chunk + w
                   : (2 * tile.contextSize - 1 - r) * chunk + (w - chunk);
}

} // namespace mtrt

#undef MTRT_CONTEXT_HOST_DEVICE

#endif // MTRT_SRC_CORE_CONTEXTLAYOUT_H
