// The exact sum of squares of floating-point values: a gradient norm whose
// value does not depend on how the elements are grouped, ordered or split
// over ranks.
#ifndef MTRT_SRC_TRAIN_EXACTSQUARESUM_H
#define MTRT_SRC_TRAIN_EXACTSQUARESUM_H

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace mtrt::comm {
class Communicator;
struct CallInfo;
} // namespace mtrt::comm

namespace mtrt::train {

/// Sums x*x over float or double values exactly, as a fixed-point integer.
///
/// A float is m * 2^(e - 150) with an integer m < 2^24 (e its biased
/// exponent; e = 0 is subnormal, m * 2^-149), so its square is m^2 (below
/// 2^48) times a power of two, exact; likewise a double's square is m^2
/// (below 2^106) times a power of two. Every square is an integer multiple
/// of the smallest one (2^-298 for floats, 2^-2148 for doubles), and their
/// sum is an integer: it is kept in 32-bit limbs, so adding is associative
/// and commutative and the sum is one number however the elements are
/// grouped. The distributed optimizer's gradient norm sums each rank's
/// range so: the ranges move with the gradient buckets, the norm does not.
///
/// Across ranks: limbs() are the normalized limbs as doubles (each below
/// 2^32, so a sum over up to 2^21 ranks is exact in any order), all-reduced
/// and read back with addLimbs().
///
/// Thread-safety: none; one accumulator per thread, then add().
class ExactSquareSum {
public:
  /// For float (f64 = false) or double squares.
  explicit ExactSquareSum(bool f64);

  void addSquares(const float *x, int64_t n);
  void addSquares(const double *x, int64_t n);
  /// The device's partial sums (cuda::squareHistogram), 256 (low, high)
  /// pairs of words: for each float biased exponent e in [0, 255), the
  /// 128-bit sum of the squared mantissas (with the implicit bit) of the
  /// elements with that exponent; at 255, the count of inf and nan.
  void addFloatHistogram(const uint64_t *lowHigh);

  /// The normalized limbs, least significant first, as doubles, and last
  /// 1 if an element was inf or nan (else 0).
  std::vector<double> limbs() const;
  /// Adds limbs as limbs() gives them (e.g. all-reduced over ranks).
  void addLimbs(const std::vector<double> &limbs);
  /// The sum, rounded to a double (the same double for the same sum); NaN
  /// when an element was inf or nan.
  double value() const;
  bool isDouble() const { return f64_; }

private:
  template <typename T> void addSquaresOf(const T *x, int64_t n);
  /// Adds `value` * 2^shift (in units of the smallest square).
  void addShifted(unsigned __int128 value, int64_t shift);
  /// Propagates carries so that every word is below 2^32.
  void normalize() const;

  bool f64_;
  /// 32-bit limbs kept in 64-bit words, carried lazily.
  mutable std::vector<uint64_t> words_;
  mutable int64_t pendingAdds_ = 0;
  bool nonFinite_ = false;
};

/// Every rank's sum, exactly: `sum` all-reduced over `group` (its limbs,
/// one double each).
void allReduceExact(ExactSquareSum &sum, comm::Communicator &group,
                    const comm::CallInfo &info);

} // namespace mtrt::train

#endif // MTRT_SRC_TRAIN_EXACTSQUARESUM_H
