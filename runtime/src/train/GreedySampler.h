// Greedy decoding with a bundle's predict_step: argmax of the next-token
// logits, one token at a time.
#ifndef MTRT_SRC_TRAIN_GREEDYSAMPLER_H
#define MTRT_SRC_TRAIN_GREEDYSAMPLER_H

#include <cstdint>
#include <vector>

namespace mtrt::host {
class Executor;
} // namespace mtrt::host

namespace mtrt::train {

/// Continues a token sequence with predict_step (tokens [B, S] -> logits
/// [B, S, V]). Each new token: the last S tokens of the text so far (or the
/// whole text, padded after its end with token 0, while it is shorter) go in
/// row 0 of the batch (every row holds the same window), and the argmax of
/// the logits at the last real position, over ids below `vocabLimit`
/// (padded vocabulary entries are never chosen; ties take the lowest id),
/// is appended. Causal models do not see the padding.
class GreedySampler {
public:
  /// Throws Error (INVALID_ARGUMENT) if the executor does not run a
  /// function of predict_step's signature.
  GreedySampler(host::Executor &predictStep, int64_t vocabLimit);

  /// `prompt` followed by `count` generated tokens. Throws Error
  /// (INVALID_ARGUMENT) for an empty prompt.
  std::vector<int32_t> generate(std::vector<int32_t> prompt, int64_t count);

private:
  host::Executor &executor_;
  int64_t vocabLimit_;
};

} // namespace mtrt::train

#endif // MTRT_SRC_TRAIN_GREEDYSAMPLER_H
