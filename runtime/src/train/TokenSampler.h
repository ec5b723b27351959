// Text generation with a bundle's predict_step: the next token drawn from the
// logits with temperature and top-k (Megatron-LM's --temperature, --top-k),
// greedy with top-k 1.
#ifndef MTRT_SRC_TRAIN_TOKENSAMPLER_H
#define MTRT_SRC_TRAIN_TOKENSAMPLER_H

#include "host/HostTensor.h"

#include <cstdint>
#include <functional>
#include <optional>
#include <random>
#include <vector>

namespace mtrt::comm {
class RankContext;
} // namespace mtrt::comm

namespace mtrt::host {
class Executor;
} // namespace mtrt::host

namespace mtrt::train {

/// Megatron-LM's sampling flags.
struct SamplingOptions {
  /// --temperature: the logits are divided by it (> 0).
  double temperature = 1.0;
  /// --top-k: draw among the k most likely tokens; 1 is greedy, 0 the whole
  /// vocabulary.
  int64_t topK = 1;
  /// The draws' generator is seeded with it (--seed).
  uint64_t seed = 1234;
};

/// What TokenSampler runs for each token: predict_step (predictorOf), or a
/// pipeline's predict stages (Trainer::sample).
struct Predictor {
  /// The tokens [B, S] a rank runs (its part of the window), their storage
  /// type (I32 or I64), and the logits' last dimension V.
  std::vector<int64_t> tokenShape;
  DType tokenType = DType::I32;
  int64_t vocab = 0;
  /// Runs `tokens` and returns the V logits of batch row 0 at `position`
  /// (among the rank's S positions), or nullopt on a rank that holds none
  /// (position -1, or a pipeline's earlier stages). Only that row leaves
  /// the device: the whole [B, S, V] is gigabytes at a training shape.
  /// Every rank calls it, with or without a position (a collective).
  std::function<std::optional<std::vector<double>>(
      const host::TensorView &tokens, int64_t position)>
      run;
};

/// The `count` values at `data` of type F32, F64 or BF16 as doubles (the
/// logits as a backend holds them). Throws Error (INTERNAL) for another
/// type.
std::vector<double> logitsAsDoubles(DType type, const void *data,
                                    int64_t count);

/// A Predictor of `predictStep`'s shapes (the tokens in their declared
/// type), without `run`. Throws Error (INVALID_ARGUMENT) if the function is
/// not tokens [B, S] -> logits [B, S, V].
Predictor predictorShapes(const Function &predictStep);

/// predict_step's executor as a Predictor (predictorShapes' checks).
Predictor predictorOf(host::Executor &predictStep);

/// The ranks that sample together, each running its predict_step executor
/// on its part of the same window: every rank of `rank`'s world calls
/// generate() with the same prompt and options. With context parallelism
/// over `contextSize` ranks (this one `contextRank` along the context axis),
/// the window of S = local * contextSize positions is cut into
/// 2 * contextSize chunks and the rank holds chunks contextRank and
/// 2 * contextSize - 1 - contextRank (Trainer::readSamples' load-balanced
/// order); the ranks holding the last real position draw the token, and an
/// all-reduce over the world gives it to every rank.
struct SamplingRanks {
  comm::RankContext *rank = nullptr;
  int64_t contextSize = 1;
  int64_t contextRank = 0;
};

/// The next token's probabilities from `logits` (ids [0, logits.size())):
/// softmax(logits / temperature), in float64, over the topK largest logits
/// (all of them for topK 0 or topK >= size; ties keep the lower ids), zero
/// elsewhere. topK 1 puts all of it on the argmax (the lowest id of ties).
std::vector<double> nextTokenProbabilities(const std::vector<double> &logits,
                                           double temperature, int64_t topK);

/// The id whose cumulative probability (ids in order) first exceeds `u` in
/// [0, 1); the last id of non-zero probability if rounding leaves none.
int64_t drawToken(const std::vector<double> &probabilities, double u);

/// Continues a token sequence with a Predictor (predict_step: tokens
/// [B, S] -> logits [B, S, V]). Each new token: the last S tokens of the text
/// so far (or the whole text, padded after its end with token 0, while it is
/// shorter) go in row 0 of the batch (every row holds the same window), and a
/// token is drawn from the logits at the last real position, over ids below
/// `vocabLimit` (padded vocabulary entries are never chosen), by
/// nextTokenProbabilities and drawToken with u from a 64-bit Mersenne
/// Twister seeded with options.seed (53 bits per draw). Causal models do
/// not see the padding. With `ranks`, a collective over their world (see
/// SamplingRanks): every rank returns the same text.
class TokenSampler {
public:
  /// Throws Error (INVALID_ARGUMENT) for a temperature <= 0 or a negative
  /// top-k.
  TokenSampler(Predictor predictor, int64_t vocabLimit,
               const SamplingOptions &options, const SamplingRanks &ranks = {});

  /// `prompt` followed by `count` generated tokens. Throws Error
  /// (INVALID_ARGUMENT) for an empty prompt.
  std::vector<int32_t> generate(std::vector<int32_t> prompt, int64_t count);

private:
  Predictor predictor_;
  int64_t vocabLimit_;
  SamplingOptions options_;
  SamplingRanks ranks_;
  std::mt19937_64 random_;
};

} // namespace mtrt::train

#endif // MTRT_SRC_TRAIN_TOKENSAMPLER_H
