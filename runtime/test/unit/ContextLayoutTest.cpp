// core/ContextLayout.h, the positions the CUDA kernels of context
// parallelism compute (position_ids, rope, dropout, the attention blocks),
// against the host's contextParallelPositions: every row of the reordered
// sequence, whole ranks' blocks and the tiles sequence parallelism splits
// them into, maps to its global position.
#include "core/ContextLayout.h"
#include "host/kernels/Kernels.h"

#include "gtest/gtest.h"

#include <algorithm>
#include <numeric>
#include <vector>

using namespace mtrt;

namespace {

TEST(ContextLayoutTest, RanksAndTheirTilesMapToTheHostsPositions) {
  const int64_t seq = 96;
  for (int64_t cp : {2, 3, 4}) {
    const int64_t local = seq / cp;
    std::vector<int64_t> reordered; // the ranks' positions, rank by rank
    for (int64_t r = 0; r < cp; ++r) {
      std::vector<int64_t> positions(static_cast<size_t>(local));
      host::contextParallelPositions(r, cp, seq, positions.data());
      reordered.insert(reordered.end(), positions.begin(), positions.end());
      for (int64_t i = 0; i < local; ++i)
        EXPECT_EQ(contextGlobalPosition(ContextTile{r * local, seq, cp}, i),
                  positions[static_cast<size_t>(i)])
            << "cp " << cp << ", rank " << r << ", row " << i;
    }
    // The whole reordered sequence (a gathered block's keys), and tiles of
    // it as sequence parallelism splits each rank's block over 2 ranks.
    for (int64_t p = 0; p < seq; ++p)
      EXPECT_EQ(contextGlobalPosition(ContextTile{0, seq, cp}, p),
                reordered[static_cast<size_t>(p)])
          << "cp " << cp << ", row " << p;
    for (int64_t tile = 0; tile < 2 * cp; ++tile)
      for (int64_t i = 0; i < local / 2; ++i)
        EXPECT_EQ(contextGlobalPosition(
                      ContextTile{tile * (local / 2), seq, cp}, i),
                  reordered[static_cast<size_t>(tile * (local / 2) + i)]);
    // A permutation of the sequence.
    std::vector<int64_t> sorted = reordered, all(static_cast<size_t>(seq));
    std::sort(sorted.begin(), sorted.end());
    std::iota(all.begin(), all.end(), 0);
    EXPECT_EQ(sorted, all) << "cp " << cp;
  }
  // Without context parallelism a tile's rows are its positions.
  for (int64_t i = 0; i < 5; ++i) {
    EXPECT_EQ(contextGlobalPosition(ContextTile{7, 0, 1}, i), 7 + i);
    EXPECT_EQ(contextGlobalPosition(ContextTile{}, i), i);
  }
}

} // namespace
