// The exact fixed-point sum of squares.
#include "train/ExactSquareSum.h"

#include "comm/Communicator.h"

#include <cmath>
#include <cstring>
#include <limits>
#include <type_traits>

namespace mtrt::train {

namespace {
/// Words enough for the largest square shifted to its place (float: 506 +
/// 128 bits of a histogram entry; double: 4090 + 106), with 64 bits to
/// spare for the carries of 2^64 additions.
constexpr size_t kFloatWords = 22, kDoubleWords = 136;
/// The smallest square, 2^-unit: a float's subnormal 2^-149 squared, or a
/// double's 2^-1074.
constexpr int kFloatUnit = 298, kDoubleUnit = 2148;
/// Each addShifted adds below 2^32 to at most two halves of a word; after
/// this many the words are carried (they stay below 2^63).
constexpr int64_t kAddsBeforeCarry = int64_t(1) << 29;
constexpr uint64_t kLow32 = 0xffffffffu;
} // namespace

ExactSquareSum::ExactSquareSum(bool f64)
    : f64_(f64), words_(f64 ? kDoubleWords : kFloatWords, 0) {}

void ExactSquareSum::addShifted(unsigned __int128 value, int64_t shift) {
  size_t q = static_cast<size_t>(shift / 32);
  int r = static_cast<int>(shift % 32);
  for (size_t j = 0; j < 4 && value != 0; ++j, value >>= 32) {
    uint64_t piece = static_cast<uint64_t>(value) & kLow32;
    uint64_t placed = piece << r; // below 2^63
    words_[q + j] += placed & kLow32;
    words_[q + j + 1] += placed >> 32;
  }
  if (++pendingAdds_ >= kAddsBeforeCarry)
    normalize();
}

void ExactSquareSum::normalize() const {
  uint64_t carry = 0;
  for (uint64_t &word : words_) {
    uint64_t w = word + carry;
    word = w & kLow32;
    carry = w >> 32;
  }
  // The spare words make an overflow impossible: the sum of 2^64 squares of
  // the largest value fits.
  pendingAdds_ = 0;
}

/// Adds the squares of IEEE values whose bits are `Bits`: a value is
/// m * 2^(e - bias - mantissa bits) with m holding the implicit bit (e > 0),
/// or m * 2^(1 - bias - mantissa bits) when subnormal, so its square in
/// units of the smallest square is m^2 * 2^(2e - 2) (e > 0) or m^2.
template <typename T> void ExactSquareSum::addSquaresOf(const T *x, int64_t n) {
  using Bits = std::conditional_t<sizeof(T) == 4, uint32_t, uint64_t>;
  constexpr int kMantissaBits = std::numeric_limits<T>::digits - 1;
  constexpr Bits kMantissaMask = (Bits(1) << kMantissaBits) - 1;
  constexpr Bits kExponentMask =
      (Bits(1) << (8 * sizeof(T) - 1 - kMantissaBits)) - 1;
  for (int64_t i = 0; i < n; ++i) {
    Bits bits;
    std::memcpy(&bits, &x[i], sizeof(bits));
    uint64_t exponent = (bits >> kMantissaBits) & kExponentMask;
    uint64_t mantissa = bits & kMantissaMask;
    if (exponent == kExponentMask) { // inf or nan: the norm is not finite
      nonFinite_ = true;
      continue;
    }
    if (mantissa == 0 && exponent == 0)
      continue;
    if (exponent != 0)
      mantissa |= uint64_t(1) << kMantissaBits;
    addShifted(static_cast<unsigned __int128>(mantissa) * mantissa,
               exponent == 0 ? 0 : 2 * int64_t(exponent) - 2);
  }
}

void ExactSquareSum::addSquares(const float *x, int64_t n) {
  addSquaresOf(x, n);
}

void ExactSquareSum::addSquares(const double *x, int64_t n) {
  addSquaresOf(x, n);
}

void ExactSquareSum::addFloatHistogram(const uint64_t *lowHigh) {
  if (lowHigh[2 * 255] != 0 || lowHigh[2 * 255 + 1] != 0)
    nonFinite_ = true;
  for (int64_t e = 0; e < 255; ++e) {
    unsigned __int128 value =
        (static_cast<unsigned __int128>(lowHigh[2 * e + 1]) << 64) |
        lowHigh[2 * e];
    if (value != 0)
      addShifted(value, e == 0 ? 0 : 2 * e - 2);
  }
}

std::vector<double> ExactSquareSum::limbs() const {
  normalize();
  std::vector<double> out(words_.begin(), words_.end());
  out.push_back(nonFinite_ ? 1.0 : 0.0);
  return out;
}

void ExactSquareSum::addLimbs(const std::vector<double> &limbs) {
  // Each is an integer below 2^53 (a limb, or a sum of up to 2^21 limbs).
  normalize();
  for (size_t k = 0; k < words_.size(); ++k)
    words_[k] += static_cast<uint64_t>(limbs[k]);
  if (limbs.back() != 0)
    nonFinite_ = true;
  normalize();
}

double ExactSquareSum::value() const {
  if (nonFinite_)
    return std::numeric_limits<double>::quiet_NaN();
  normalize();
  int unit = f64_ ? kDoubleUnit : kFloatUnit;
  double sum = 0;
  for (size_t k = words_.size(); k-- > 0;)
    if (words_[k] != 0)
      sum += std::ldexp(static_cast<double>(words_[k]),
                        32 * static_cast<int>(k) - unit);
  return sum;
}

void allReduceExact(ExactSquareSum &sum, comm::Communicator &group,
                    const comm::CallInfo &info) {
  std::vector<double> limbs = sum.limbs();
  group.allReduce<double>(limbs.data(), limbs.data(),
                          static_cast<int64_t>(limbs.size()),
                          comm::ReduceOp::Sum, info);
  sum = ExactSquareSum(sum.isDouble());
  sum.addLimbs(limbs);
}

} // namespace mtrt::train
