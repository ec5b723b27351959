// Pieces of a global tensor (a box, optionally a flat range of it) and the
// copy between two differently cut pieces, which resharding is made of.
#ifndef MTRT_SRC_CORE_TENSORSLICE_H
#define MTRT_SRC_CORE_TENSORSLICE_H

#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace mtrt {

/// The elements of a global tensor that one shard holds: the box
/// [offsets, offsets + shape) of the global index space, and, when `flat` is
/// set, only the elements [flat->first, flat->second) of the box in
/// row-major order (a distributed optimizer's piece of a flattened shard).
/// The shard stores its elements contiguously in that order. A scalar has
/// empty offsets and shape.
struct TensorSlice {
  std::vector<int64_t> offsets;
  std::vector<int64_t> shape;
  std::optional<std::pair<int64_t, int64_t>> flat;

  /// Elements of the box.
  int64_t boxElements() const;
  /// Elements the shard stores: the flat range's length, or boxElements().
  int64_t numElements() const;
  /// "offsets [0, 64] shape [128, 64]" and " flat [b, e)" when set.
  std::string str() const;
};

/// The whole of a tensor of `globalShape`.
TensorSlice wholeTensor(const std::vector<int64_t> &globalShape);

/// Why `slice` is not a valid piece of a tensor of `globalShape` (rank,
/// negative or out-of-range bounds, a flat range outside the box), or an
/// empty string.
std::string checkSlice(const TensorSlice &slice,
                       const std::vector<int64_t> &globalShape);

/// Whether two slices of one tensor share an element.
bool slicesOverlap(const TensorSlice &a, const TensorSlice &b);

/// The number of elements of `slice` inside the box [0, bound) (all of them
/// when bound contains the slice): what a copy from a tensor of global shape
/// `bound` can fill.
int64_t elementsWithin(const TensorSlice &slice,
                       const std::vector<int64_t> &bound);

/// Copies every element that `from` and `to` share from `source` (laid out
/// as `from`) into `target` (laid out as `to`), row by row; returns how many
/// it copied. T is float or double. Both slices must be of one tensor (same
/// rank) and valid.
template <typename T>
int64_t copySliceOverlap(const TensorSlice &from, const T *source,
                         const TensorSlice &to, T *target);

} // namespace mtrt

#endif // MTRT_SRC_CORE_TENSORSLICE_H
