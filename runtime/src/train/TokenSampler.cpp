// Next-token sampling over predict_step's logits.
#include "train/TokenSampler.h"

#include "core/Bundle.h"
#include "host/Executor.h"

#include <algorithm>
#include <cmath>
#include <numeric>

namespace mtrt::train {

std::vector<double> nextTokenProbabilities(const std::vector<double> &logits,
                                           double temperature, int64_t topK) {
  auto size = static_cast<int64_t>(logits.size());
  std::vector<double> p(logits.size(), 0.0);
  if (size == 0)
    return p;
  int64_t k = topK <= 0 || topK >= size ? size : topK;
  std::vector<int64_t> order(logits.size());
  std::iota(order.begin(), order.end(), 0);
  std::partial_sort(order.begin(), order.begin() + k, order.end(),
                    [&](int64_t a, int64_t b) {
                      return logits[a] != logits[b] ? logits[a] > logits[b]
                                                    : a < b;
                    });
  double top = logits[order[0]];
  double sum = 0;
  for (int64_t i = 0; i < k; ++i) {
    double e = std::exp((logits[order[i]] - top) / temperature);
    p[order[i]] = e;
    sum += e;
  }
  for (int64_t i = 0; i < k; ++i)
    p[order[i]] /= sum;
  return p;
}

int64_t drawToken(const std::vector<double> &probabilities, double u) {
  double cumulative = 0;
  int64_t last = 0;
  for (size_t id = 0; id < probabilities.size(); ++id) {
    if (probabilities[id] <= 0)
      continue;
    last = static_cast<int64_t>(id);
    cumulative += probabilities[id];
    if (cumulative > u)
      return last;
  }
  return last;
}

TokenSampler::TokenSampler(host::Executor &predictStep, int64_t vocabLimit,
                           const SamplingOptions &options)
    : executor_(predictStep), vocabLimit_(vocabLimit), options_(options),
      random_(options.seed) {
  const Function &fn = predictStep.function();
  if (fn.inputs.size() != 1 || fn.outputs.size() != 1 ||
      fn.values[fn.inputs[0]].rank() != 2 ||
      fn.values[fn.outputs[0]].rank() != 3)
    throw Error(MTRT_STATUS_INVALID_ARGUMENT,
                "sampling needs a function tokens [B, S] -> logits "
                "[B, S, V]; '" +
                    fn.name + "' is not one");
  if (!(options.temperature > 0) || !std::isfinite(options.temperature))
    throw Error(MTRT_STATUS_INVALID_ARGUMENT,
                "--temperature: found " + std::to_string(options.temperature) +
                    ", expected a number > 0 (1 samples from the model's "
                    "distribution; lower is closer to greedy)");
  if (options.topK < 0)
    throw Error(MTRT_STATUS_INVALID_ARGUMENT,
                "--top-k: found " + std::to_string(options.topK) +
                    ", expected 0 (the whole vocabulary), 1 (greedy) or more");
}

std::vector<int32_t> TokenSampler::generate(std::vector<int32_t> text,
                                            int64_t count) {
  if (text.empty())
    throw Error(MTRT_STATUS_INVALID_ARGUMENT,
                "--sample-prompt is empty; sampling needs at least one "
                "token to continue");
  const Function &fn = executor_.function();
  int64_t inputValue = fn.inputs[0];
  const std::vector<int64_t> &shape = fn.values[inputValue].shape;
  int64_t batch = shape[0], seq = shape[1];
  int64_t vocab = fn.values[fn.outputs[0]].shape[2];
  int64_t limit = std::min(vocab, vocabLimit_);
  DType idType = executor_.storageType(inputValue);
  std::vector<int32_t> window32(static_cast<size_t>(batch * seq));
  std::vector<int64_t> window64(idType == DType::I64 ? window32.size() : 0);
  std::vector<double> logits(static_cast<size_t>(limit));

  for (int64_t generated = 0; generated < count && seq > 0; ++generated) {
    int64_t length = std::min<int64_t>(static_cast<int64_t>(text.size()), seq);
    std::fill(window32.begin(), window32.end(), 0);
    for (int64_t b = 0; b < batch; ++b)
      std::copy(text.end() - length, text.end(), window32.begin() + b * seq);
    host::TensorView input{idType, shape, window32.data()};
    if (idType == DType::I64) {
      std::copy(window32.begin(), window32.end(), window64.begin());
      input.data = window64.data();
    }
    std::vector<host::Tensor> outputs = executor_.run({input}, {});
    const host::Tensor &out = outputs[0];
    int64_t row = (length - 1) * vocab;
    for (int64_t v = 0; v < limit; ++v)
      logits[v] = out.dtype == DType::F64 ? out.data<double>()[row + v]
                                          : out.data<float>()[row + v];
    std::vector<double> p =
        nextTokenProbabilities(logits, options_.temperature, options_.topK);
    double u = static_cast<double>(random_() >> 11) * 0x1.0p-53;
    text.push_back(static_cast<int32_t>(drawToken(p, u)));
  }
  return text;
}

} // namespace mtrt::train
