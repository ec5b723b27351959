// One rank of a grid of ranks: its coordinates and the communicators of the
// groups that a bundle's collectives run over.
#ifndef MTRT_SRC_COMM_RANKCONTEXT_H
#define MTRT_SRC_COMM_RANKCONTEXT_H

#include "comm/Communicator.h"

#include <cstdint>
#include <map>
#include <memory>
#include <vector>

namespace mtrt::comm {

/// A rank of a device grid (docs/BundleFormat.md, "Several ranks"): linear
/// rank r of the world is the grid coordinates gridCoordinates(shape, r).
/// The group along a list of grid axes is the ranks that share every other
/// coordinate, ordered by their coordinates along the axes, the first axis
/// slowest. Its communicator is split from the world's (color: the rank's
/// coordinates on the other axes; key: its index along the axes).
///
/// Thread-safety: the rank's thread only. group() on a list of axes not seen
/// before is a collective over the world (a split): every rank must ask for
/// new groups in the same order, as the ranks of one SPMD program do.
class RankContext {
public:
  /// `world` (which must outlive this) has one rank per grid position.
  /// Throws Error INVALID_ARGUMENT when the sizes disagree.
  RankContext(Communicator &world, std::vector<int64_t> gridShape);
  ~RankContext();
  RankContext(const RankContext &) = delete;
  RankContext &operator=(const RankContext &) = delete;

  const std::vector<int64_t> &gridShape() const { return gridShape_; }
  const std::vector<int64_t> &coordinates() const { return coordinates_; }
  int rank() const { return world_.rank(); }
  Communicator &world() { return world_; }

  /// The communicator of this rank's group along `axes`.
  Communicator &group(const std::vector<int64_t> &axes);

  /// Creates, in the bundle's order, the groups of every collective of
  /// every function, and each function's connected group (below), so that
  /// no split happens inside a run.
  void prepare(const Bundle &bundle);

  /// The grid axes `function`'s multi-rank instructions move along, sorted:
  /// the group along them holds every rank its collectives connect to this
  /// one, directly or through each other (cuda::PeerGroup::gate's
  /// component). Empty for a function without any.
  static std::vector<int64_t> connectedAxes(const Function &function);

private:
  Communicator &world_;
  std::vector<int64_t> gridShape_;
  std::vector<int64_t> coordinates_;
  std::map<std::vector<int64_t>, std::unique_ptr<Communicator>> groups_;
};

} // namespace mtrt::comm

#endif // MTRT_SRC_COMM_RANKCONTEXT_H
