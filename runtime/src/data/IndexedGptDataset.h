// Megatron-LM's GPTDataset: samples of seq_length + 1 tokens cut from the
// documents of an indexed dataset, over as many shuffled epochs as needed.
#ifndef MTRT_SRC_DATA_INDEXEDGPTDATASET_H
#define MTRT_SRC_DATA_INDEXEDGPTDATASET_H

#include "data/IndexedDataset.h"
#include "data/SampleSource.h"

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace mtrt::data {

/// Shuffles `values` in place: Fisher-Yates driven by the counter-based
/// generator of core/Random.h with key streamKey(seed, stream), j drawn
/// uniformly from [0, i] by multiply-shift.
void seededShuffle(std::vector<int64_t> &values, uint64_t seed,
                   uint64_t stream);

/// The documents [begin, end) of `dataset`, sampled as Megatron-LM's
/// GPTDataset does (docs/GptDataset.md):
/// - epochs: the fewest E such that (E * tokens - 1) / seqLength >=
///   numSamples, where tokens is the documents' total;
/// - document index: the documents repeated E times and shuffled; when
///   E > 1 and the last epoch supplies fewer than 80% of an epoch's
///   samples, the last epoch is shuffled on its own after the others;
/// - sample index: (position in the document index, offset) where each
///   sample starts; samples follow each other through the concatenated
///   documents at a stride of seqLength tokens, so consecutive samples
///   share one token, and a sample may span several documents;
/// - shuffle index: the samples shuffled (the last epoch's apart when it is
///   separate).
/// Sample i is sample shuffle[i] of the sample index. The shuffles draw from
/// `seed` (streams apart for `part`, the split's number), not from NumPy's
/// generator: the structure is Megatron-LM's, the order is the runtime's.
class IndexedGptDataset : public SampleSource {
public:
  /// Throws Error (INVALID_ARGUMENT) naming `what` when the documents hold
  /// no sample.
  IndexedGptDataset(std::shared_ptr<const IndexedDataset> dataset,
                    int64_t begin, int64_t end, int64_t seqLength,
                    int64_t numSamples, uint64_t seed, uint64_t part,
                    std::string what);

  void read(int64_t sample, int32_t *inputs, int32_t *labels) override;
  int64_t samplesPerEpoch() const override { return samplesPerEpoch_; }
  /// seqLength + 1 tokens of sample `sample`.
  void readTokens(int64_t sample, int32_t *tokens) const;

  /// Samples built: at least numSamples, all of the E epochs.
  int64_t size() const {
    return static_cast<int64_t>(shuffleIndex_.size());
  }
  int64_t epochs() const { return epochs_; }
  bool separateFinalEpoch() const { return separateFinalEpoch_; }
  const std::vector<int64_t> &documentIndex() const { return documentIndex_; }
  /// Pairs (document index position, offset), size() + 1 of them.
  const std::vector<std::pair<int64_t, int64_t>> &sampleIndex() const {
    return sampleIndex_;
  }
  const std::vector<int64_t> &shuffleIndex() const { return shuffleIndex_; }

private:
  std::shared_ptr<const IndexedDataset> dataset_;
  int64_t seqLength_;
  std::string what_;
  int64_t epochs_ = 0, samplesPerEpoch_ = 0;
  bool separateFinalEpoch_ = false;
  std::vector<int64_t> documentIndex_;
  std::vector<std::pair<int64_t, int64_t>> sampleIndex_;
  std::vector<int64_t> shuffleIndex_;
  std::vector<int32_t> buffer_;
};

} // namespace mtrt::data

#endif // MTRT_SRC_DATA_INDEXEDGPTDATASET_H
