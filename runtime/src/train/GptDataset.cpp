// Splitting a token stream, windowing it into samples and shuffling them per
// epoch.
#include "train/GptDataset.h"

#include "core/Bundle.h"
#include "core/Random.h"

#include <cmath>
#include <cstring>
#include <numeric>
#include <sstream>

namespace mtrt::train {

namespace {
// Keeps the shuffle's streams apart from other users of the seed.
constexpr uint64_t kShuffleStream = 0x53485546464C4500ull; // "SHUFFLE"
} // namespace

std::array<double, 3> parseSplit(const std::string &text) {
  std::array<double, 3> weights = {0, 0, 0};
  std::stringstream stream(text);
  std::string part;
  size_t count = 0;
  bool valid = !text.empty();
  while (valid && std::getline(stream, part, ',')) {
    char *end = nullptr;
    double w = std::strtod(part.c_str(), &end);
    if (count >= 3 || part.empty() || *end != '\0' || !std::isfinite(w) ||
        w < 0)
      valid = false;
    else
      weights[count++] = w;
  }
  if (!valid || count == 0 || weights[0] <= 0)
    throw Error(MTRT_STATUS_INVALID_ARGUMENT,
                "--split: found '" + text +
                    "', expected up to three non-negative weights of the "
                    "train, validation and test parts, the first positive, "
                    "e.g. 969,30,1");
  return weights;
}

std::array<std::pair<int64_t, int64_t>, 3>
splitRanges(const std::array<double, 3> &weights, int64_t size) {
  double sum = weights[0] + weights[1] + weights[2];
  std::array<int64_t, 4> index = {0, 0, 0, 0};
  for (int i = 0; i < 3; ++i)
    index[i + 1] =
        index[i] + static_cast<int64_t>(std::llround(
                       weights[i] / sum * static_cast<double>(size)));
  int64_t diff = index[3] - size;
  for (int i = 1; i < 4; ++i)
    index[i] -= diff;
  std::array<std::pair<int64_t, int64_t>, 3> ranges;
  for (int i = 0; i < 3; ++i)
    ranges[i] = {std::max<int64_t>(index[i], 0),
                 std::max<int64_t>(index[i + 1], 0)};
  return ranges;
}

GptDataset::GptDataset(std::shared_ptr<const std::vector<int32_t>> tokens,
                       int64_t begin, int64_t end, int64_t seqLength,
                       uint64_t seed, bool shuffle, const std::string &what)
    : tokens_(std::move(tokens)), begin_(begin), seqLength_(seqLength),
      windows_(0), seed_(seed), shuffle_(shuffle) {
  int64_t size = end - begin;
  if (seqLength > 0 && size > seqLength)
    windows_ = (size - 1) / seqLength;
  if (windows_ == 0)
    throw Error(MTRT_STATUS_INVALID_ARGUMENT,
                what + " has " + std::to_string(std::max<int64_t>(size, 0)) +
                    " tokens; a sample needs seq_length + 1 = " +
                    std::to_string(seqLength + 1) +
                    ": use a longer corpus or give this part a larger share "
                    "with --split");
}

int64_t GptDataset::windowOf(int64_t sample) {
  int64_t epoch = sample / windows_, position = sample % windows_;
  if (!shuffle_)
    return position;
  if (epoch != cachedEpoch_) {
    permutation_.resize(static_cast<size_t>(windows_));
    std::iota(permutation_.begin(), permutation_.end(), int64_t(0));
    uint64_t key = random::streamKey(seed_, kShuffleStream + epoch);
    for (int64_t i = windows_ - 1; i > 0; --i) {
      // A uniform j in [0, i] by the multiply-shift method.
      uint64_t bits = random::bitsFromKey(key, static_cast<uint64_t>(i));
      auto j = static_cast<int64_t>((static_cast<unsigned __int128>(bits) *
                                     static_cast<uint64_t>(i + 1)) >>
                                    64);
      std::swap(permutation_[i], permutation_[j]);
    }
    cachedEpoch_ = epoch;
  }
  return permutation_[position];
}

void GptDataset::read(int64_t sample, int32_t *inputs, int32_t *labels) {
  const int32_t *window = tokens_->data() + windowStart(windowOf(sample));
  std::memcpy(inputs, window, sizeof(int32_t) * seqLength_);
  std::memcpy(labels, window + 1, sizeof(int32_t) * seqLength_);
}

} // namespace mtrt::train
