// Blends of indexed datasets, and the train/validation/test parts
// megatron-train reads.
#include "data/BlendedGptDataset.h"

#include "core/Error.h"
#include "train/GptDataset.h"

#include <cerrno>
#include <cmath>
#include <cstdlib>

namespace mtrt::data {

namespace {

[[noreturn]] void invalid(const std::string &message) {
  throw Error(MTRT_STATUS_INVALID_ARGUMENT, message);
}

const char *const kPartNames[3] = {"training", "validation", "test"};

} // namespace

std::vector<BlendEntry> parseDataBlend(const std::vector<std::string> &values) {
  if (values.empty())
    invalid("--data-path: give a dataset prefix, or weights and prefixes "
            "(e.g. --data-path 0.3 a_text_document 0.7 b_text_document)");
  if (values.size() == 1)
    return {{1.0, values[0]}};
  if (values.size() % 2 != 0)
    invalid("--data-path: found " + std::to_string(values.size()) +
            " values; a blend is pairs of a weight and a prefix (e.g. 0.3 a "
            "0.7 b)");
  std::vector<BlendEntry> blend;
  for (size_t i = 0; i < values.size(); i += 2) {
    const std::string &text = values[i];
    errno = 0;
    char *end = nullptr;
    double weight = std::strtod(text.c_str(), &end);
    if (text.empty() || *end != '\0' || errno == ERANGE ||
        !std::isfinite(weight) || !(weight > 0))
      invalid("--data-path: found '" + text + "' before '" + values[i + 1] +
              "', expected a weight > 0 (a blend is pairs of a weight and a "
              "prefix, e.g. 0.3 a 0.7 b)");
    blend.push_back({weight, values[i + 1]});
  }
  return blend;
}

void buildBlendingIndices(const std::vector<double> &weights, int64_t size,
                          std::vector<int64_t> &datasetIndex,
                          std::vector<int64_t> &datasetSampleIndex) {
  std::vector<int64_t> counts(weights.size(), 0);
  datasetIndex.resize(static_cast<size_t>(size));
  datasetSampleIndex.resize(static_cast<size_t>(size));
  for (int64_t i = 0; i < size; ++i) {
    double at = std::max(static_cast<double>(i), 1.0);
    size_t best = 0;
    double bestLag = weights[0] * at - static_cast<double>(counts[0]);
    for (size_t k = 1; k < weights.size(); ++k) {
      double lag = weights[k] * at - static_cast<double>(counts[k]);
      if (lag > bestLag) {
        bestLag = lag;
        best = k;
      }
    }
    datasetIndex[i] = static_cast<int64_t>(best);
    datasetSampleIndex[i] = counts[best]++;
  }
}

int64_t blendedDatasetSamples(double weight, int64_t size) {
  double share = std::ceil(weight * static_cast<double>(size));
  return static_cast<int64_t>(std::ceil(share * 1.005));
}

BlendedGptDataset::BlendedGptDataset(
    std::vector<std::unique_ptr<SampleSource>> datasets,
    std::vector<double> weights, int64_t size)
    : datasets_(std::move(datasets)), size_(size) {
  double sum = 0;
  for (double w : weights)
    sum += w;
  for (double &w : weights)
    w /= sum;
  buildBlendingIndices(weights, size, datasetIndex_, datasetSampleIndex_);
}

void BlendedGptDataset::read(int64_t sample, int32_t *inputs,
                             int32_t *labels) {
  if (sample < 0 || sample >= size_)
    throw Error(MTRT_STATUS_OUT_OF_RANGE,
                "the blend was built for " + std::to_string(size_) +
                    " samples; sample " + std::to_string(sample) +
                    " asked for");
  datasets_[datasetIndex_[sample]]->read(datasetSampleIndex_[sample], inputs,
                                         labels);
}

std::array<std::unique_ptr<SampleSource>, 3>
buildGptDatasets(const std::vector<BlendEntry> &blend,
                 const std::string &split, int64_t seqLength,
                 const std::array<int64_t, 3> &samples, uint64_t seed) {
  std::array<double, 3> shares = train::parseSplit(split);
  double total = 0;
  for (const BlendEntry &entry : blend)
    total += entry.weight;
  std::vector<std::shared_ptr<const IndexedDataset>> datasets;
  for (const BlendEntry &entry : blend)
    datasets.push_back(std::make_shared<const IndexedDataset>(entry.prefix));
  std::array<std::unique_ptr<SampleSource>, 3> parts;
  for (int part = 0; part < 3; ++part) {
    if (samples[part] <= 0 || shares[part] <= 0)
      continue;
    std::vector<std::unique_ptr<SampleSource>> members;
    std::vector<double> weights;
    for (size_t k = 0; k < blend.size(); ++k) {
      auto ranges =
          train::splitRanges(shares, datasets[k]->documentCount());
      double weight = blend[k].weight / total;
      int64_t wanted = blend.size() == 1
                           ? samples[part]
                           : blendedDatasetSamples(weight, samples[part]);
      members.push_back(std::make_unique<IndexedGptDataset>(
          datasets[k], ranges[part].first, ranges[part].second, seqLength,
          wanted, seed, static_cast<uint64_t>(part),
          std::string("the ") + kPartNames[part] + " split of '" +
              blend[k].prefix + "' (--split " + split + ")"));
      weights.push_back(weight);
    }
    if (members.size() == 1)
      parts[part] = std::move(members[0]);
    else
      parts[part] = std::make_unique<BlendedGptDataset>(
          std::move(members), std::move(weights), samples[part]);
  }
  return parts;
}

} // namespace mtrt::data
