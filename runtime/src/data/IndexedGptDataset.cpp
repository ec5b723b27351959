// Megatron-LM's document, sample and shuffle indices over an indexed
// dataset.
#include "data/IndexedGptDataset.h"

#include "core/Error.h"
#include "core/Random.h"

#include <numeric>

namespace mtrt::data {

namespace {
// Keep the shuffles' streams apart from each other and from other users of
// the seed; the split's number is added.
constexpr uint64_t kDocumentShuffle = 0x444F435348554600ull; // "DOCSHUF"
constexpr uint64_t kSampleShuffle = 0x534D505348554600ull;   // "SMPSHUF"
constexpr uint64_t kFinalEpoch = 0x100;
} // namespace

void seededShuffle(std::vector<int64_t> &values, uint64_t seed,
                   uint64_t stream) {
  uint64_t key = random::streamKey(seed, stream);
  for (int64_t i = static_cast<int64_t>(values.size()) - 1; i > 0; --i) {
    uint64_t bits = random::bitsFromKey(key, static_cast<uint64_t>(i));
    auto j = static_cast<int64_t>((static_cast<unsigned __int128>(bits) *
                                   static_cast<uint64_t>(i + 1)) >>
                                  64);
    std::swap(values[i], values[j]);
  }
}

IndexedGptDataset::IndexedGptDataset(
    std::shared_ptr<const IndexedDataset> dataset, int64_t begin, int64_t end,
    int64_t seqLength, int64_t numSamples, uint64_t seed, uint64_t part,
    std::string what)
    : dataset_(std::move(dataset)), seqLength_(seqLength),
      what_(std::move(what)) {
  int64_t tokens = 0;
  for (int64_t d = begin; d < end; ++d)
    tokens += dataset_->documentLength(d);
  if (seqLength < 1 || tokens < seqLength + 1)
    throw Error(MTRT_STATUS_INVALID_ARGUMENT,
                what_ + " has " + std::to_string(end - begin) +
                    " documents of " + std::to_string(tokens) +
                    " tokens; a sample needs seq_length + 1 = " +
                    std::to_string(seqLength + 1) +
                    ": use more data or give this part a larger share with "
                    "--split");
  numSamples = std::max<int64_t>(numSamples, 1);
  samplesPerEpoch_ = (tokens - 1) / seqLength;
  epochs_ = 1;
  while ((epochs_ * tokens - 1) / seqLength < numSamples)
    ++epochs_;
  int64_t samplesBeforeFinal = 0;
  if (epochs_ > 1) {
    samplesBeforeFinal = ((epochs_ - 1) * tokens - 1) / seqLength;
    int64_t fromFinal = numSamples - samplesBeforeFinal;
    separateFinalEpoch_ =
        fromFinal < static_cast<int64_t>(0.8 * static_cast<double>(
                                                   samplesPerEpoch_));
  }

  // Document index: E copies of the documents, shuffled (the last epoch on
  // its own when separate).
  int64_t documents = end - begin;
  documentIndex_.resize(static_cast<size_t>(epochs_ * documents));
  for (int64_t e = 0; e < epochs_; ++e)
    std::iota(documentIndex_.begin() + e * documents,
              documentIndex_.begin() + (e + 1) * documents, begin);
  if (!separateFinalEpoch_) {
    seededShuffle(documentIndex_, seed, kDocumentShuffle + part);
  } else {
    std::vector<int64_t> first(documentIndex_.begin(),
                               documentIndex_.end() - documents);
    std::vector<int64_t> last(documentIndex_.end() - documents,
                              documentIndex_.end());
    seededShuffle(first, seed, kDocumentShuffle + part);
    seededShuffle(last, seed, kDocumentShuffle + kFinalEpoch + part);
    std::copy(first.begin(), first.end(), documentIndex_.begin());
    std::copy(last.begin(), last.end(), documentIndex_.begin() + first.size());
  }

  // Sample index: walk seqLength + 1 tokens through the documents for each
  // sample; the next sample starts on the current one's last token.
  int64_t total = (epochs_ * tokens - 1) / seqLength;
  sampleIndex_.resize(static_cast<size_t>(total + 1));
  sampleIndex_[0] = {0, 0};
  int64_t position = 0, offset = 0;
  auto lastPosition = static_cast<int64_t>(documentIndex_.size()) - 1;
  for (int64_t s = 1; s <= total; ++s) {
    int64_t remaining = seqLength + 1;
    while (remaining != 0) {
      int64_t length =
          dataset_->documentLength(documentIndex_[position]) - offset;
      remaining -= length;
      if (remaining <= 0) {
        offset += remaining + length - 1;
        remaining = 0;
      } else {
        if (position == lastPosition)
          throw Error(MTRT_STATUS_INTERNAL,
                      what_ + ": the sample index ran past the documents");
        ++position;
        offset = 0;
      }
    }
    sampleIndex_[s] = {position, offset};
  }

  // Shuffle index.
  shuffleIndex_.resize(static_cast<size_t>(total));
  std::iota(shuffleIndex_.begin(), shuffleIndex_.end(), int64_t(0));
  if (!separateFinalEpoch_) {
    seededShuffle(shuffleIndex_, seed, kSampleShuffle + part);
  } else {
    std::vector<int64_t> first(shuffleIndex_.begin(),
                               shuffleIndex_.begin() + samplesBeforeFinal);
    std::vector<int64_t> last(shuffleIndex_.begin() + samplesBeforeFinal,
                              shuffleIndex_.end());
    seededShuffle(first, seed, kSampleShuffle + part);
    seededShuffle(last, seed, kSampleShuffle + kFinalEpoch + part);
    std::copy(first.begin(), first.end(), shuffleIndex_.begin());
    std::copy(last.begin(), last.end(), shuffleIndex_.begin() + first.size());
  }
  buffer_.resize(static_cast<size_t>(seqLength + 1));
}

void IndexedGptDataset::readTokens(int64_t sample, int32_t *tokens) const {
  if (sample < 0 || sample >= size())
    throw Error(MTRT_STATUS_OUT_OF_RANGE,
                what_ + ": sample " + std::to_string(sample) +
                    " asked for, but it was built for " +
                    std::to_string(size()));
  int64_t j = shuffleIndex_[sample];
  auto [first, firstOffset] = sampleIndex_[j];
  auto [last, lastOffset] = sampleIndex_[j + 1];
  for (int64_t p = first; p <= last; ++p) {
    int64_t document = documentIndex_[p];
    int64_t from = p == first ? firstOffset : 0;
    int64_t to = p == last ? lastOffset + 1 : dataset_->documentLength(document);
    dataset_->readDocument(document, from, to - from, tokens);
    tokens += to - from;
  }
}

void IndexedGptDataset::read(int64_t sample, int32_t *inputs,
                             int32_t *labels) {
  readTokens(sample, buffer_.data());
  std::copy(buffer_.begin(), buffer_.end() - 1, inputs);
  std::copy(buffer_.begin() + 1, buffer_.end(), labels);
}

} // namespace mtrt::data
