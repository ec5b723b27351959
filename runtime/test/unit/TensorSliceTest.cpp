// Tests of tensor slices: copies between differently cut pieces against an
// element-by-element reference, overlap, bounds and their messages.
#include "core/TensorSlice.h"

#include "gtest/gtest.h"

#include <random>

using namespace mtrt;

namespace {

/// The position of global element `index` in the storage of `slice`, or -1
/// when the slice does not hold it: the definition, element by element.
int64_t storagePosition(const TensorSlice &slice,
                        const std::vector<int64_t> &index) {
  int64_t flat = 0;
  for (size_t d = 0; d < index.size(); ++d) {
    int64_t local = index[d] - slice.offsets[d];
    if (local < 0 || local >= slice.shape[d])
      return -1;
    flat = flat * slice.shape[d] + local;
  }
  if (slice.flat) {
    if (flat < slice.flat->first || flat >= slice.flat->second)
      return -1;
    flat -= slice.flat->first;
  }
  return flat;
}

/// Every index of `shape`, row-major.
std::vector<std::vector<int64_t>> allIndices(const std::vector<int64_t> &shape) {
  std::vector<std::vector<int64_t>> out;
  std::vector<int64_t> index(shape.size(), 0);
  for (int64_t d : shape)
    if (d == 0)
      return out;
  while (true) {
    out.push_back(index);
    size_t d = shape.size();
    while (d-- > 0) {
      if (++index[d] < shape[d])
        break;
      index[d] = 0;
    }
    if (d == static_cast<size_t>(-1))
      return out;
  }
}

TensorSlice randomSlice(std::mt19937 &rng, const std::vector<int64_t> &global,
                        bool flat) {
  TensorSlice s;
  for (int64_t g : global) {
    int64_t begin = std::uniform_int_distribution<int64_t>(0, g - 1)(rng);
    int64_t end = std::uniform_int_distribution<int64_t>(begin + 1, g)(rng);
    s.offsets.push_back(begin);
    s.shape.push_back(end - begin);
  }
  if (flat) {
    int64_t n = s.boxElements();
    int64_t b = std::uniform_int_distribution<int64_t>(0, n)(rng);
    int64_t e = std::uniform_int_distribution<int64_t>(b, n)(rng);
    s.flat = std::make_pair(b, e);
  }
  return s;
}

TEST(TensorSliceTest, CopiesMatchTheElementwiseDefinition) {
  std::mt19937 rng(7);
  for (int trial = 0; trial < 400; ++trial) {
    size_t rank = 1 + trial % 3;
    std::vector<int64_t> global;
    for (size_t d = 0; d < rank; ++d)
      global.push_back(std::uniform_int_distribution<int64_t>(1, 7)(rng));
    TensorSlice from = randomSlice(rng, global, trial % 4 == 1);
    TensorSlice to = randomSlice(rng, global, trial % 4 == 2);
    std::vector<double> source(static_cast<size_t>(from.numElements()));
    for (size_t i = 0; i < source.size(); ++i)
      source[i] = static_cast<double>(i) + 0.5;
    std::vector<double> target(static_cast<size_t>(to.numElements()), -1);
    std::vector<double> expected = target;
    int64_t shared = 0;
    for (const std::vector<int64_t> &index : allIndices(global)) {
      int64_t x = storagePosition(from, index), y = storagePosition(to, index);
      if (x >= 0 && y >= 0) {
        expected[static_cast<size_t>(y)] = source[static_cast<size_t>(x)];
        ++shared;
      }
    }
    int64_t copied =
        copySliceOverlap(from, source.data(), to, target.data());
    ASSERT_EQ(copied, shared) << from.str() << " -> " << to.str();
    ASSERT_EQ(target, expected) << from.str() << " -> " << to.str();
    EXPECT_EQ(slicesOverlap(from, to), shared > 0);
    int64_t within = 0;
    for (const std::vector<int64_t> &index : allIndices(global))
      within += storagePosition(to, index) >= 0;
    EXPECT_EQ(elementsWithin(to, global), within);
  }
}

TEST(TensorSliceTest, ReshardsColumnsFromTwoToThreeShards) {
  // A [2, 6] tensor whose value is its flat index, cut in 2 then in 3.
  std::vector<float> halves[2];
  for (int h = 0; h < 2; ++h)
    for (int r = 0; r < 2; ++r)
      for (int c = 0; c < 3; ++c)
        halves[h].push_back(static_cast<float>(r * 6 + h * 3 + c));
  for (int t = 0; t < 3; ++t) {
    TensorSlice to{{0, 2 * t}, {2, 2}, std::nullopt};
    std::vector<float> out(4, -1);
    int64_t copied = 0;
    for (int h = 0; h < 2; ++h)
      copied += copySliceOverlap(TensorSlice{{0, 3 * h}, {2, 3}, std::nullopt},
                                 halves[h].data(), to, out.data());
    EXPECT_EQ(copied, 4);
    EXPECT_EQ(out, (std::vector<float>{float(2 * t), float(2 * t + 1),
                                       float(6 + 2 * t), float(7 + 2 * t)}));
  }
}

TEST(TensorSliceTest, ScalarsAndEmptyTensors) {
  TensorSlice scalar = wholeTensor({});
  float a = 3, b = 0;
  EXPECT_EQ(scalar.numElements(), 1);
  EXPECT_EQ(copySliceOverlap(scalar, &a, scalar, &b), 1);
  EXPECT_EQ(b, 3);
  TensorSlice empty = wholeTensor({0, 4});
  EXPECT_EQ(empty.numElements(), 0);
  EXPECT_FALSE(slicesOverlap(empty, empty));
  EXPECT_EQ(copySliceOverlap(empty, &a, empty, &b), 0);
}

TEST(TensorSliceTest, PaddedRowsOutsideTheSourceAreLeftAlone) {
  // A table of 4 rows loaded into one of 6: two rows are not in the source.
  TensorSlice bigger = wholeTensor({6, 2});
  EXPECT_EQ(elementsWithin(bigger, {4, 2}), 8);
  std::vector<float> source = {1, 2, 3, 4, 5, 6, 7, 8};
  std::vector<float> target(12, 9);
  EXPECT_EQ(copySliceOverlap(wholeTensor({4, 2}), source.data(), bigger,
                             target.data()),
            8);
  EXPECT_EQ(target,
            (std::vector<float>{1, 2, 3, 4, 5, 6, 7, 8, 9, 9, 9, 9}));
}

TEST(TensorSliceTest, CheckSliceNamesWhatIsWrong) {
  EXPECT_EQ(checkSlice(TensorSlice{{0, 2}, {4, 2}, std::nullopt}, {4, 4}), "");
  EXPECT_EQ(checkSlice(TensorSlice{{0}, {4}, std::nullopt}, {4, 4}),
            "offsets [0] and shape [4] must both have 2 dimensions, as the "
            "global shape [4, 4]");
  EXPECT_EQ(checkSlice(TensorSlice{{0, 3}, {4, 2}, std::nullopt}, {4, 4}),
            "dimension 1 [3, 3 + 2) is not inside [0, 4) of the global "
            "shape [4, 4]");
  EXPECT_EQ(checkSlice(TensorSlice{{0, -1}, {4, 1}, std::nullopt}, {4, 4}),
            "dimension 1 [-1, -1 + 1) is not inside [0, 4) of the global "
            "shape [4, 4]");
  EXPECT_EQ(checkSlice(TensorSlice{{0, 0}, {2, 2}, std::make_pair(1, 5)},
                       {4, 4}),
            "flat range [1, 5) is not inside the box's 4 elements");
  EXPECT_EQ(checkSlice(TensorSlice{{0, 0}, {2, 2}, std::make_pair(3, 2)},
                       {4, 4}),
            "flat range [3, 2) is not inside the box's 4 elements");
}

} // namespace
