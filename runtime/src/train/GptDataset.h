// Training samples from a token stream, indexed and shuffled as Megatron-LM's
// GPTDataset does.
#ifndef MTRT_SRC_TRAIN_GPTDATASET_H
#define MTRT_SRC_TRAIN_GPTDATASET_H

#include "data/SampleSource.h"

#include <array>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace mtrt::train {

/// Megatron-LM's --split: relative weights of the train, validation and test
/// parts ("969,30,1"). Throws Error (INVALID_ARGUMENT) on anything else.
std::array<double, 3> parseSplit(const std::string &text);

/// The [begin, end) token ranges of the three parts of `size` tokens, by
/// Megatron-LM's get_train_valid_test_split_ (rounded cumulative shares, the
/// rounding error taken off the last boundaries).
std::array<std::pair<int64_t, int64_t>, 3>
splitRanges(const std::array<double, 3> &weights, int64_t size);

/// Samples of seqLength + 1 consecutive tokens from tokens[begin, end): the
/// sample index of Megatron-LM's GPTDataset for one document, windows at a
/// stride of seqLength so that consecutive windows share one token (the
/// last label of one is the first input of the next). The inputs of a sample
/// are its first seqLength tokens and the labels its last seqLength.
///
/// Sample order: with `shuffle`, each epoch (one pass over the windows) is a
/// permutation of the windows drawn by a Fisher-Yates shuffle from the
/// counter-based generator keyed on (seed, epoch), so the order depends only
/// on the seed; without, windows come in order, epoch after epoch.
///
/// Thread-safety: none (the current epoch's permutation is cached).
class GptDataset : public data::SampleSource {
public:
  /// Throws Error (INVALID_ARGUMENT) when the range holds no window.
  GptDataset(std::shared_ptr<const std::vector<int32_t>> tokens, int64_t begin,
             int64_t end, int64_t seqLength, uint64_t seed, bool shuffle,
             const std::string &what);

  /// Windows per epoch: (end - begin - 1) / seqLength.
  int64_t windowsPerEpoch() const { return windows_; }
  int64_t samplesPerEpoch() const override { return windows_; }
  int64_t seqLength() const { return seqLength_; }

  /// The window that global sample `sample` (0, 1, ...; epochs follow each
  /// other) reads.
  int64_t windowOf(int64_t sample);
  /// Offset in the token stream of the first token of window `window`.
  int64_t windowStart(int64_t window) const {
    return begin_ + window * seqLength_;
  }

  /// Writes sample `sample`'s inputs and labels (seqLength each).
  void read(int64_t sample, int32_t *inputs, int32_t *labels) override;

private:
  std::shared_ptr<const std::vector<int32_t>> tokens_;
  int64_t begin_, seqLength_, windows_;
  uint64_t seed_;
  bool shuffle_;
  int64_t cachedEpoch_ = -1;
  std::vector<int64_t> permutation_;
};

} // namespace mtrt::train

#endif // MTRT_SRC_TRAIN_GPTDATASET_H
