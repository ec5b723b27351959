// Next-token sampling over predict_step's logits.
#include "train/TokenSampler.h"

#include "comm/RankContext.h"
#include "core/Bundle.h"
#include "core/Safetensors.h"
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

Predictor predictorShapes(const Function &fn) {
  if (fn.inputs.size() != 1 || fn.outputs.size() != 1 ||
      fn.values[fn.inputs[0]].rank() != 2 ||
      fn.values[fn.outputs[0]].rank() != 3)
    throw Error(MTRT_STATUS_INVALID_ARGUMENT,
                "sampling needs a function tokens [B, S] -> logits "
                "[B, S, V]; '" +
                    fn.name + "' is not one");
  Predictor predictor;
  predictor.tokenShape = fn.values[fn.inputs[0]].shape;
  predictor.tokenType = fn.values[fn.inputs[0]].dtype;
  predictor.vocab = fn.values[fn.outputs[0]].shape[2];
  return predictor;
}

Predictor predictorOf(host::Executor &predictStep) {
  const Function &fn = predictStep.function();
  Predictor predictor = predictorShapes(fn);
  predictor.tokenType = predictStep.storageType(fn.inputs[0]);
  int64_t vocab = predictor.vocab;
  predictor.run = [&predictStep, vocab](
                      const host::TensorView &tokens,
                      int64_t position) -> std::optional<std::vector<double>> {
    host::Tensor logits = std::move(predictStep.run({tokens}, {})[0]);
    if (position < 0)
      return std::nullopt;
    return logitsAsDoubles(logits.dtype,
                           static_cast<const char *>(logits.buffer.data()) +
                               position * vocab * dtypeSize(logits.dtype),
                           vocab);
  };
  return predictor;
}

std::vector<double> logitsAsDoubles(DType type, const void *data,
                                    int64_t count) {
  std::vector<double> values(static_cast<size_t>(count));
  for (int64_t i = 0; i < count; ++i) {
    switch (type) {
    case DType::F32:
      values[i] = static_cast<const float *>(data)[i];
      break;
    case DType::F64:
      values[i] = static_cast<const double *>(data)[i];
      break;
    case DType::BF16:
      values[i] = bf16ToFloat(static_cast<const uint16_t *>(data)[i]);
      break;
    default:
      throw Error(MTRT_STATUS_INTERNAL,
                  std::string("sampling: the logits are ") + dtypeName(type) +
                      ", expected f32, f64 or bf16");
    }
  }
  return values;
}

TokenSampler::TokenSampler(Predictor predictor, int64_t vocabLimit,
                           const SamplingOptions &options,
                           const SamplingRanks &ranks)
    : predictor_(std::move(predictor)), vocabLimit_(vocabLimit),
      options_(options), ranks_(ranks), random_(options.seed) {
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
  const std::vector<int64_t> &shape = predictor_.tokenShape;
  int64_t batch = shape[0], localSeq = shape[1];
  int64_t contextSize = ranks_.contextSize, contextRank = ranks_.contextRank;
  int64_t seq = localSeq * contextSize;
  int64_t chunk = contextSize > 1 ? localSeq / 2 : localSeq;
  int64_t vocab = predictor_.vocab;
  int64_t limit = std::min(vocab, vocabLimit_);
  DType idType = predictor_.tokenType;
  std::vector<int32_t> whole(static_cast<size_t>(seq));
  std::vector<int32_t> window32(static_cast<size_t>(batch * localSeq));
  std::vector<int64_t> window64(idType == DType::I64 ? window32.size() : 0);

  for (int64_t generated = 0; generated < count && seq > 0; ++generated) {
    int64_t length = std::min<int64_t>(static_cast<int64_t>(text.size()), seq);
    std::fill(whole.begin(), whole.end(), 0);
    std::copy(text.end() - length, text.end(), whole.begin());
    // The rank's part of the window, in every row of the batch.
    for (int64_t b = 0; b < batch; ++b) {
      int32_t *row = window32.data() + b * localSeq;
      if (contextSize == 1) {
        std::copy(whole.begin(), whole.end(), row);
        continue;
      }
      std::copy_n(whole.begin() + contextRank * chunk, chunk, row);
      std::copy_n(whole.begin() + (2 * contextSize - 1 - contextRank) * chunk,
                  chunk, row + chunk);
    }
    host::TensorView input{idType, shape, window32.data()};
    if (idType == DType::I64) {
      std::copy(window32.begin(), window32.end(), window64.begin());
      input.data = window64.data();
    }
    // Where the last real position is among this rank's positions, if it
    // is at all.
    int64_t position = length - 1, local = position;
    if (contextSize > 1) {
      int64_t c = position / chunk;
      int64_t holder = c < contextSize ? c : 2 * contextSize - 1 - c;
      local = holder != contextRank ? -1
              : c == contextRank    ? position % chunk
                                    : chunk + position % chunk;
    }
    std::optional<std::vector<double>> row = predictor_.run(input, local);
    // Every rank draws u, so that the generators stay in step.
    double u = static_cast<double>(random_() >> 11) * 0x1.0p-53;
    double token = -1;
    if (row) {
      row->resize(static_cast<size_t>(limit));
      std::vector<double> p =
          nextTokenProbabilities(*row, options_.temperature, options_.topK);
      token = static_cast<double>(drawToken(p, u));
    }
    if (ranks_.rank)
      ranks_.rank->world().allReduce(&token, &token, 1, comm::ReduceOp::Max,
                                     {"sampling: the next token", generated});
    text.push_back(static_cast<int32_t>(token));
  }
  return text;
}

} // namespace mtrt::train
