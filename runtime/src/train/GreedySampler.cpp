// Greedy next-token decoding over predict_step's logits.
#include "train/GreedySampler.h"

#include "core/Bundle.h"
#include "host/Executor.h"

#include <algorithm>

namespace mtrt::train {

GreedySampler::GreedySampler(host::Executor &predictStep, int64_t vocabLimit)
    : executor_(predictStep), vocabLimit_(vocabLimit) {
  const Function &fn = predictStep.function();
  if (fn.inputs.size() != 1 || fn.outputs.size() != 1 ||
      fn.values[fn.inputs[0]].rank() != 2 ||
      fn.values[fn.outputs[0]].rank() != 3)
    throw Error(MTRT_STATUS_INVALID_ARGUMENT,
                "greedy sampling needs a function tokens [B, S] -> logits "
                "[B, S, V]; '" +
                    fn.name + "' is not one");
}

std::vector<int32_t> GreedySampler::generate(std::vector<int32_t> text,
                                             int64_t count) {
  if (text.empty())
    throw Error(MTRT_STATUS_INVALID_ARGUMENT,
                "--sample-prompt is empty; greedy sampling needs at least one "
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
    const host::Tensor &logits = outputs[0];
    int64_t row = (length - 1) * vocab;
    int64_t best = 0;
    if (logits.dtype == DType::F64) {
      const double *l = logits.data<double>() + row;
      for (int64_t v = 1; v < limit; ++v)
        if (l[v] > l[best])
          best = v;
    } else {
      const float *l = logits.data<float>() + row;
      for (int64_t v = 1; v < limit; ++v)
        if (l[v] > l[best])
          best = v;
    }
    text.push_back(static_cast<int32_t>(best));
  }
  return text;
}

} // namespace mtrt::train
