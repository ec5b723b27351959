// Slices of global tensors and the copy of their overlap.
#include "core/TensorSlice.h"

#include <algorithm>
#include <cstring>

namespace mtrt {

namespace {

std::string list(const std::vector<int64_t> &values) {
  std::string text = "[";
  for (size_t i = 0; i < values.size(); ++i)
    text += (i ? ", " : "") + std::to_string(values[i]);
  return text + "]";
}

int64_t product(const std::vector<int64_t> &shape) {
  int64_t n = 1;
  for (int64_t d : shape)
    n *= d;
  return n;
}

/// A slice with scalars seen as shape [1] and the flat range made explicit.
struct Box {
  std::vector<int64_t> offsets, shape;
  int64_t flatBegin, flatEnd;
};

Box boxOf(const TensorSlice &s) {
  Box box{s.offsets, s.shape, 0, 0};
  if (box.shape.empty()) {
    box.offsets = {0};
    box.shape = {1};
  }
  box.flatBegin = s.flat ? s.flat->first : 0;
  box.flatEnd = s.flat ? s.flat->second : product(box.shape);
  return box;
}

/// Calls run(x, y, n) for every run of n elements that both slices hold,
/// x and y being the run's first element's position in each slice's
/// storage. The runs follow the last dimension, row by row of the boxes'
/// intersection, clipped to both flat ranges.
template <typename Run>
void forEachSharedRun(const TensorSlice &a, const TensorSlice &b, Run run) {
  Box x = boxOf(a), y = boxOf(b);
  size_t rank = x.shape.size();
  if (y.shape.size() != rank)
    return;
  std::vector<int64_t> lo(rank), hi(rank);
  for (size_t d = 0; d < rank; ++d) {
    lo[d] = std::max(x.offsets[d], y.offsets[d]);
    hi[d] = std::min(x.offsets[d] + x.shape[d], y.offsets[d] + y.shape[d]);
    if (hi[d] <= lo[d])
      return;
  }
  std::vector<int64_t> strideX(rank, 1), strideY(rank, 1);
  for (size_t d = rank - 1; d-- > 0;) {
    strideX[d] = strideX[d + 1] * x.shape[d + 1];
    strideY[d] = strideY[d + 1] * y.shape[d + 1];
  }
  int64_t length = hi[rank - 1] - lo[rank - 1];
  std::vector<int64_t> index = lo;
  while (true) {
    int64_t sx = 0, sy = 0;
    for (size_t d = 0; d < rank; ++d) {
      sx += (index[d] - x.offsets[d]) * strideX[d];
      sy += (index[d] - y.offsets[d]) * strideY[d];
    }
    int64_t k0 = std::max({int64_t(0), x.flatBegin - sx, y.flatBegin - sy});
    int64_t k1 = std::min({length, x.flatEnd - sx, y.flatEnd - sy});
    if (k1 > k0)
      run(sx + k0 - x.flatBegin, sy + k0 - y.flatBegin, k1 - k0);
    // The next row: dimensions before the last, the last of them fastest.
    size_t d = rank - 1;
    while (d-- > 0) {
      if (++index[d] < hi[d])
        break;
      index[d] = lo[d];
    }
    if (d == static_cast<size_t>(-1))
      return;
  }
}

} // namespace

int64_t TensorSlice::boxElements() const { return product(shape); }

int64_t TensorSlice::numElements() const {
  return flat ? flat->second - flat->first : boxElements();
}

std::string TensorSlice::str() const {
  std::string text = "offsets " + list(offsets) + " shape " + list(shape);
  if (flat)
    text += " flat [" + std::to_string(flat->first) + ", " +
            std::to_string(flat->second) + ")";
  return text;
}

TensorSlice wholeTensor(const std::vector<int64_t> &globalShape) {
  TensorSlice slice;
  slice.offsets.assign(globalShape.size(), 0);
  slice.shape = globalShape;
  return slice;
}

std::string checkSlice(const TensorSlice &slice,
                       const std::vector<int64_t> &globalShape) {
  size_t rank = globalShape.size();
  if (slice.offsets.size() != rank || slice.shape.size() != rank)
    return "offsets " + list(slice.offsets) + " and shape " +
           list(slice.shape) + " must both have " + std::to_string(rank) +
           " dimensions, as the global shape " + list(globalShape);
  for (size_t d = 0; d < rank; ++d)
    if (slice.offsets[d] < 0 || slice.shape[d] < 0 ||
        slice.offsets[d] > globalShape[d] ||
        slice.shape[d] > globalShape[d] - slice.offsets[d])
      return "dimension " + std::to_string(d) + " [" +
             std::to_string(slice.offsets[d]) + ", " +
             std::to_string(slice.offsets[d]) + " + " +
             std::to_string(slice.shape[d]) + ") is not inside [0, " +
             std::to_string(globalShape[d]) + ") of the global shape " +
             list(globalShape);
  if (slice.flat && (slice.flat->first < 0 ||
                     slice.flat->first > slice.flat->second ||
                     slice.flat->second > slice.boxElements()))
    return "flat range [" + std::to_string(slice.flat->first) + ", " +
           std::to_string(slice.flat->second) + ") is not inside the box's " +
           std::to_string(slice.boxElements()) + " elements";
  return "";
}

bool slicesOverlap(const TensorSlice &a, const TensorSlice &b) {
  bool shared = false;
  forEachSharedRun(a, b, [&](int64_t, int64_t, int64_t) { shared = true; });
  return shared;
}

int64_t elementsWithin(const TensorSlice &slice,
                       const std::vector<int64_t> &bound) {
  int64_t count = 0;
  forEachSharedRun(slice, wholeTensor(bound),
                   [&](int64_t, int64_t, int64_t n) { count += n; });
  return count;
}

template <typename T>
int64_t copySliceOverlap(const TensorSlice &from, const T *source,
                         const TensorSlice &to, T *target) {
  int64_t copied = 0;
  forEachSharedRun(from, to, [&](int64_t x, int64_t y, int64_t n) {
    std::memcpy(target + y, source + x, static_cast<size_t>(n) * sizeof(T));
    copied += n;
  });
  return copied;
}

template int64_t copySliceOverlap<float>(const TensorSlice &, const float *,
                                         const TensorSlice &, float *);
template int64_t copySliceOverlap<double>(const TensorSlice &, const double *,
                                          const TensorSlice &, double *);

} // namespace mtrt
