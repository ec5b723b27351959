// Megatron-LM's blends: --data-path W1 PREFIX1 W2 PREFIX2 ... draws samples
// from several datasets in proportion to their weights.
#ifndef MTRT_SRC_DATA_BLENDEDGPTDATASET_H
#define MTRT_SRC_DATA_BLENDEDGPTDATASET_H

#include "data/IndexedGptDataset.h"
#include "data/SampleSource.h"

#include <array>
#include <memory>
#include <string>
#include <vector>

namespace mtrt::data {

struct BlendEntry {
  double weight = 1;
  std::string prefix;
};

/// --data-path's values: one prefix (weight 1), or pairs of a weight and a
/// prefix ("0.3 a 0.7 b"). Throws Error (INVALID_ARGUMENT) for anything
/// else: an odd count, a weight that is not a number > 0.
std::vector<BlendEntry> parseDataBlend(const std::vector<std::string> &values);

/// Megatron-LM's blending: sample i comes from the dataset k whose count so
/// far lags its share the most, argmax_k (weight_k * max(i, 1) - count_k),
/// the first such k on ties; it is that dataset's sample count_k. `weights`
/// sum to 1.
void buildBlendingIndices(const std::vector<double> &weights, int64_t size,
                          std::vector<int64_t> &datasetIndex,
                          std::vector<int64_t> &datasetSampleIndex);

/// The samples a dataset of a blend is built for so that the blend of
/// `size` never runs out: ceil(ceil(weight * size) * 1.005), as Megatron-LM.
int64_t blendedDatasetSamples(double weight, int64_t size);

/// Several datasets read through Megatron-LM's blending indices.
class BlendedGptDataset : public SampleSource {
public:
  /// `weights` are normalized here.
  BlendedGptDataset(std::vector<std::unique_ptr<SampleSource>> datasets,
                    std::vector<double> weights, int64_t size);

  void read(int64_t sample, int32_t *inputs, int32_t *labels) override;
  int64_t samplesPerEpoch() const override { return size_; }
  const std::vector<int64_t> &datasetIndex() const { return datasetIndex_; }

private:
  std::vector<std::unique_ptr<SampleSource>> datasets_;
  int64_t size_;
  std::vector<int64_t> datasetIndex_, datasetSampleIndex_;
};

/// Megatron-LM's train, validation and test datasets from --data-path and
/// --split: each prefix's documents are split by the shares (rounded as
/// get_train_valid_test_split_), each part sampled by IndexedGptDataset for
/// `samples[part]` samples (blended when there are several prefixes). A part
/// with no samples asked for, or no share, is nullptr. Throws Error naming
/// the prefix and the part when a part asked for has too little data.
std::array<std::unique_ptr<SampleSource>, 3>
buildGptDatasets(const std::vector<BlendEntry> &blend,
                 const std::string &split, int64_t seqLength,
                 const std::array<int64_t, 3> &samples, uint64_t seed);

} // namespace mtrt::data

#endif // MTRT_SRC_DATA_BLENDEDGPTDATASET_H
