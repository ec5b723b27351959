// What the trainers read samples from: a text corpus cut into windows
// (train/GptDataset) or Megatron-LM's GPTDataset over indexed datasets
// (data/IndexedGptDataset, data/BlendedGptDataset).
#ifndef MTRT_SRC_DATA_SAMPLESOURCE_H
#define MTRT_SRC_DATA_SAMPLESOURCE_H

#include <cstdint>

namespace mtrt::data {

/// Samples of seqLength + 1 consecutive tokens, numbered from 0: the inputs
/// are the first seqLength, the labels the last seqLength.
///
/// Thread-safety: none (sources may cache).
class SampleSource {
public:
  virtual ~SampleSource() = default;
  /// Writes sample `sample`'s inputs and labels (seqLength each). Throws
  /// Error (OUT_OF_RANGE) past the samples the source was built for.
  virtual void read(int64_t sample, int32_t *inputs, int32_t *labels) = 0;
  /// Samples in one pass over the data.
  virtual int64_t samplesPerEpoch() const = 0;
};

} // namespace mtrt::data

#endif // MTRT_SRC_DATA_SAMPLESOURCE_H
