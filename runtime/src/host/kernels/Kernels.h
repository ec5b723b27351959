// The host backend's reference kernels: forward and backward of every mt op.
//
// Conventions, for every kernel here:
// - Plain functions over contiguous row-major buffers with explicit sizes.
//   T is float or double (explicitly instantiated for both); ids and labels
//   are int32_t or int64_t (Id).
// - Exact and deterministic: each output element is computed by one thread
//   with a fixed order of accumulation, so results are bit-identical whatever
//   the ThreadPool's size. Work is split over independent rows or blocks.
// - Sizes and shapes are the caller's to validate (the bundle's plan is
//   checked when it is loaded); kernels only check data they cannot know in
//   advance (ids, labels) and report it with a KernelStatus.
// - Backward kernels compute vector-Jacobian products: given the upstream
//   gradient dy of an output, they produce the gradients of the inputs. A
//   gradient output that is nullptr is not computed. Gradients of inputs that
//   are activations are overwritten; gradients of parameters (weights,
//   biases, embedding tables) take `accumulate`: true adds the gradient into
//   the buffer (for micro-batches), false overwrites it.
// - Outputs never alias inputs unless a kernel says so.
// - Floating-point contraction is off (-ffp-contract=off), so the results do
//   not depend on the CPU's FMA support.
#ifndef MTRT_SRC_HOST_KERNELS_KERNELS_H
#define MTRT_SRC_HOST_KERNELS_KERNELS_H

#include "core/Fp8.h"
#include "core/Random.h"
#include "core/RopeFrequencies.h"

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

namespace mtrt::host {

class ThreadPool;

/// The result of a kernel that can fail on its data: OK, or an error with a
/// message that names the kernel, the offending element and the limit.
/// Callers turn an error into an mtrt_status_t (OUT_OF_RANGE).
class [[nodiscard]] KernelStatus {
public:
  static KernelStatus success() { return KernelStatus(); }
  static KernelStatus error(std::string message) {
    KernelStatus status;
    status.ok_ = false;
    status.message_ = std::move(message);
    return status;
  }
  bool ok() const { return ok_; }
  const std::string &message() const { return message_; }

private:
  bool ok_ = true;
  std::string message_;
};

//===----------------------------------------------------------------------===//
// Embedding (Embedding.cpp)
//===----------------------------------------------------------------------===//

/// out[i, :] = table[ids[i], :] for i < count; table is [vocab, hidden].
/// Fails, writing nothing, if an id is outside [0, vocab).
template <typename T, typename Id>
KernelStatus embeddingForward(ThreadPool &pool, int64_t count, int64_t vocab,
                              int64_t hidden, const T *table, const Id *ids,
                              T *out);

/// dtable[ids[i], :] += dout[i, :] for i < count, each table row summed by
/// one thread in increasing i. Without `accumulate`, dtable is zeroed first.
/// Fails, writing nothing, if an id is outside [0, vocab).
template <typename T, typename Id>
KernelStatus embeddingBackward(ThreadPool &pool, int64_t count, int64_t vocab,
                               int64_t hidden, const Id *ids, const T *dout,
                               T *dtable, bool accumulate);

//===----------------------------------------------------------------------===//
// Normalization (Norms.cpp); statistics are accumulated in double.
//===----------------------------------------------------------------------===//

/// y = (x - mean) * rstd * weight (+ bias) per row of x [rows, hidden], with
/// the biased variance: rstd = 1 / sqrt(mean((x - mean)^2) + eps). Saves
/// mean[rows] and rstd[rows] for the backward. bias may be nullptr.
template <typename T>
void layerNormForward(ThreadPool &pool, int64_t rows, int64_t hidden,
                      const T *x, const T *weight, const T *bias, double eps,
                      T *y, T *mean, T *rstd);

/// From x, weight, the saved mean and rstd and dy: dx [rows, hidden],
/// dweight [hidden] = sum over rows of dy * xhat, dbias [hidden] = sum over
/// rows of dy (with `accumulate`). The parameter gradients sum the rows,
/// viewed as [rows / sequence, sequence], in the canonical order over the
/// sequence (detail::canonicalRowSums; leaves in double), so a sequence
/// shard's sums add up to the whole sequence's bits; `sequence` 0 means
/// rows.
template <typename T>
void layerNormBackward(ThreadPool &pool, int64_t rows, int64_t hidden,
                       const T *x, const T *weight, const T *mean,
                       const T *rstd, const T *dy, T *dx, T *dweight, T *dbias,
                       bool accumulate, int64_t sequence = 0);

/// y = x * rstd * weight per row, rstd = 1 / sqrt(mean(x^2) + eps); saves
/// rstd[rows].
template <typename T>
void rmsNormForward(ThreadPool &pool, int64_t rows, int64_t hidden,
                    const T *x, const T *weight, double eps, T *y, T *rstd);

/// dx [rows, hidden] and dweight [hidden] = sum over rows of dy * x * rstd,
/// summed as layerNormBackward's.
template <typename T>
void rmsNormBackward(ThreadPool &pool, int64_t rows, int64_t hidden, const T *x,
                     const T *weight, const T *rstd, const T *dy, T *dx,
                     T *dweight, bool accumulate, int64_t sequence = 0);

//===----------------------------------------------------------------------===//
// Linear algebra (Linear.cpp)
//===----------------------------------------------------------------------===//

/// The GEMM every other product uses, over `batch` consecutive matrices:
/// C[b] (+)= op(A[b]) @ op(B[b]) with op(A) [m, k], op(B) [k, n], C [m, n].
/// A[b] is stored [m, k], or [k, m] with transA; B[b] is [k, n], or [n, k]
/// with transB. Each C element is sum_{p = 0..k-1} op(A)[i,p] * op(B)[p,j]
/// accumulated in T in the canonical order over p (KernelSupport.h: halves
/// added as a tree, leaves in increasing p from zero), then stored (or,
/// with `accumulate`, added to C). A contraction split over ranks (a
/// row-parallel layer) is thus put back together bit for bit by the
/// all-reduce.
template <typename T>
void gemm(ThreadPool &pool, int64_t batch, int64_t m, int64_t n, int64_t k,
          const T *a, bool transA, const T *b, bool transB, T *c,
          bool accumulate);

/// y [rows, out] = x [rows, in] @ W (+ bias [out]); W is [in, out], or
/// [out, in] with transposeWeight. bias may be nullptr; it is added after the
/// product.
template <typename T>
void linearForward(ThreadPool &pool, int64_t rows, int64_t in, int64_t out,
                   const T *x, const T *weight, bool transposeWeight,
                   const T *bias, T *y);

/// dx = dy @ W^T; dweight (+)= x^T @ dy in W's layout (dy^T @ x with
/// transposeWeight); dbias (+)= sum over rows of dy, in the canonical order
/// over the sequence as layerNormBackward's, in T. Any of dx, dweight, dbias
/// may be nullptr.
template <typename T>
void linearBackward(ThreadPool &pool, int64_t rows, int64_t in, int64_t out,
                    const T *x, const T *weight, bool transposeWeight,
                    const T *dy, T *dx, T *dweight, T *dbias, bool accumulate,
                    int64_t sequence = 0);

/// Batched matmul: y[b] = op(lhs[b]) @ op(rhs[b]), op(lhs) [m, k], op(rhs)
/// [k, n], y [batch, m, n]; lhs is stored [m, k] ([k, m] with transposeLhs),
/// rhs [k, n] ([n, k] with transposeRhs). `batch` is the product of the
/// leading dimensions.
template <typename T>
void matmulForward(ThreadPool &pool, int64_t batch, int64_t m, int64_t n,
                   int64_t k, const T *lhs, bool transposeLhs, const T *rhs,
                   bool transposeRhs, T *y);

/// dlhs and drhs, each in its operand's stored layout; either may be nullptr.
/// `accumulate` applies to both (an operand may be a parameter).
template <typename T>
void matmulBackward(ThreadPool &pool, int64_t batch, int64_t m, int64_t n,
                    int64_t k, const T *lhs, bool transposeLhs, const T *rhs,
                    bool transposeRhs, const T *dy, T *dlhs, T *drhs,
                    bool accumulate);

//===----------------------------------------------------------------------===//
// Attention (Attention.cpp)
//===----------------------------------------------------------------------===//

/// The shape and options of mt.attention: q [batch, seqQ, headsQ, headDim],
/// k [batch, seqK, headsKv, headDim], v [batch, seqK, headsKv, headDimV],
/// out [batch, seqQ, headsQ, headDimV]. Query head h reads key/value head
/// h / (headsQ / headsKv). `causal` masks key j > query i (and needs
/// seqQ == seqK). scale <= 0 means 1/sqrt(headDim).
struct AttentionParams {
  int64_t batch = 0, seqQ = 0, seqK = 0, headsQ = 0, headsKv = 0;
  int64_t headDim = 0, headDimV = 0;
  bool causal = false;
  double scale = 0;
  /// Dropout on the probabilities P [batch, headsQ, seqQ, seqK]: element
  /// (b, h, i, j) is kept iff random::dropoutKeep(sampleKey(
  /// seedKey(seed), firstSample + b), (h * seqQ + i) * seqK + j,
  /// dropoutThreshold16(p)) (one draw per four positions of a sample), and
  /// kept values are scaled by 1 / (1 - p). p = 0 disables it. b and h
  /// count in the global tensor: a rank's batch rows and query heads start
  /// at batchOffset and headOffset of globalHeadsQ (0: headsQ); firstSample
  /// is the sample of the global micro-batch's row 0 (core/Random.h).
  double dropoutP = 0;
  uint64_t seed = 0;
  uint64_t firstSample = 0;
  int64_t batchOffset = 0, headOffset = 0, globalHeadsQ = 0;
};

/// out = dropout(softmax(scale * q k^T + mask)) v per (batch, query head);
/// saves logsumexp [batch, headsQ, seqQ] of the masked, scaled scores (before
/// dropout). Dot products in T; the softmax's sum in double.
template <typename T>
void attentionForward(ThreadPool &pool, const AttentionParams &params,
                      const T *q, const T *k, const T *v, T *out,
                      T *logsumexp);

/// dq, dk, dv from q, k, v, the saved logsumexp and dout, recomputing the
/// probabilities as exp(scale * q.k - logsumexp). dk and dv sum over the
/// query heads of their group in increasing (head, query) order.
template <typename T>
void attentionBackward(ThreadPool &pool, const AttentionParams &params,
                       const T *q, const T *k, const T *v,
                       const T *logsumexp, const T *dout, T *dq, T *dk,
                       T *dv);

//===----------------------------------------------------------------------===//
// Attention blocks of context parallelism (AttentionBlocks.cpp)
//===----------------------------------------------------------------------===//

/// Where a block's queries and keys sit in the global sequence: ring
/// attention computes a rank's queries against one rank's keys and values
/// at a time, and under causal load balancing neither is a contiguous range
/// (contextParallelPositions). A causal block masks key position > query
/// position, so a block may see all, some or none of a row's keys. Dropout
/// keys element (b, h, i, j) of the probabilities on its global place,
/// ((h + headOffset) * globalSeq + queryPositions[i]) * globalSeq +
/// keyPositions[j], as attentionForward keys the whole sequence's (where
/// the positions are 0.. and globalSeq is seqQ == seqK).
struct AttentionBlock {
  const int64_t *queryPositions = nullptr; // [seqQ]
  const int64_t *keyPositions = nullptr;   // [seqK]
  int64_t globalSeq = 0;
};

/// The global positions of context-parallel rank `rank`'s `seq / size`
/// positions of a `seq`-long sequence under causal load balancing
/// (Megatron-LM's): the sequence is cut into 2 * size chunks and the rank
/// holds chunks rank and 2 * size - 1 - rank, in that order.
void contextParallelPositions(int64_t rank, int64_t size, int64_t seq,
                              int64_t *positions);

/// One block's attention on its own: out = dropout(softmax over the block's
/// visible keys) v and its logsumexp [batch, headsQ, seqQ] (params.causal
/// masks by the block's positions). A row that sees no key of the block
/// gets out = 0 and logsumexp = -inf, which attentionMergeBlock ignores.
template <typename T>
void attentionBlockForward(ThreadPool &pool, const AttentionParams &params,
                           const AttentionBlock &block, const T *q, const T *k,
                           const T *v, T *out, T *logsumexp);

/// The online softmax's merge of a block into the running result:
/// lse' = log(exp(lse) + exp(blockLse)), out' = exp(lse - lse') out +
/// exp(blockLse - lse') blockOut, in double. out is [batch, seqQ, headsQ,
/// headDimV] and lse [batch, headsQ, seqQ], as attentionForward's; start
/// from out = 0 and lse = -inf (or from the first block's).
template <typename T>
void attentionMergeBlock(ThreadPool &pool, const AttentionParams &params,
                         const T *blockOut, const T *blockLogsumexp, T *out,
                         T *logsumexp);

/// delta [batch, headsQ, seqQ] = sum over the value dimension of dout * out:
/// the softmax backward's row term, the same for every block of the row.
template <typename T>
void attentionBackwardDelta(ThreadPool &pool, const AttentionParams &params,
                            const T *out, const T *dout, T *delta);

/// Adds one block's gradients: with P = exp(scale q.k - logsumexp) (the
/// whole row's logsumexp, so the block's probabilities are the global
/// softmax's), dq += scale dS k, dk += scale dS^T q and dv += dropout(P)^T
/// dout, dS = P (dP - delta). Each output may be null. dk and dv sum over
/// the query heads of their group in increasing (head, query) order.
template <typename T>
void attentionBlockBackward(ThreadPool &pool, const AttentionParams &params,
                            const AttentionBlock &block, const T *q, const T *k,
                            const T *v, const T *logsumexp, const T *delta,
                            const T *dout, T *dq, T *dk, T *dv);

//===----------------------------------------------------------------------===//
// Rotary position embedding (Attention.cpp)
//===----------------------------------------------------------------------===//

/// Rotate-half RoPE on x [batch, seq, heads, headDim]: with half =
/// rotaryDim / 2 and for i < half, (x[i], x[i + half]) is rotated by the angle
/// s * ropeInverseFrequency(frequencies, i, rotaryDim) at sequence position s
/// (base^(-2i / rotaryDim) unscaled):
///   y[i] = x[i] cos - x[i + half] sin, y[i + half] = x[i + half] cos + x[i] sin.
/// Features from rotaryDim on pass through. Angles, cos and sin in double.
/// rotaryDim is even and at most headDim. y may alias x. `positions` (seq
/// entries), when given, are the rows' positions in place of s: a context
/// rank's tile of the load-balanced sequence (contextParallelPositions).
template <typename T>
void ropeForward(ThreadPool &pool, int64_t batch, int64_t seq, int64_t heads,
                 int64_t headDim, int64_t rotaryDim,
                 const RopeFrequencies &frequencies, const T *x, T *y,
                 const int64_t *positions = nullptr);

/// The rotation by the negative angle. dx may alias dy.
template <typename T>
void ropeBackward(ThreadPool &pool, int64_t batch, int64_t seq, int64_t heads,
                  int64_t headDim, int64_t rotaryDim,
                  const RopeFrequencies &frequencies, const T *dy, T *dx,
                  const int64_t *positions = nullptr);

//===----------------------------------------------------------------------===//
// Elementwise ops and softmax (Elementwise.cpp), over n elements. Outputs
// may alias inputs of the same shape: every element is read before it is
// written.
//===----------------------------------------------------------------------===//

enum class GeluApproximation { None, Tanh };

/// y = x * Phi(x): exact, 0.5 x (1 + erf(x / sqrt 2)), or the tanh form
/// 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))).
template <typename T>
void geluForward(ThreadPool &pool, int64_t n, const T *x, T *y,
                 GeluApproximation approximation);
/// dx = dy * gelu'(x).
template <typename T>
void geluBackward(ThreadPool &pool, int64_t n, const T *x, const T *dy, T *dx,
                  GeluApproximation approximation);

/// y = x * sigmoid(x).
template <typename T>
void siluForward(ThreadPool &pool, int64_t n, const T *x, T *y);
/// dx = dy * sigmoid(x) * (1 + x (1 - sigmoid(x))).
template <typename T>
void siluBackward(ThreadPool &pool, int64_t n, const T *x, const T *dy, T *dx);

/// y = silu(gate) * up.
template <typename T>
void swigluForward(ThreadPool &pool, int64_t n, const T *gate, const T *up,
                   T *y);
/// dgate = dy * up * silu'(gate), dup = dy * silu(gate); either may be
/// nullptr.
template <typename T>
void swigluBackward(ThreadPool &pool, int64_t n, const T *gate, const T *up,
                    const T *dy, T *dgate, T *dup);

/// Where a rank's tile of a tensor lies in the global tensor, for random
/// streams keyed on global positions: per dimension, the tile's size, the
/// global size and the tile's offset.
struct GlobalTile {
  std::vector<int64_t> localShape, globalShape, offsets;
  /// The row-major index in the global tensor of the tile's element
  /// `local` (a row-major index in the tile).
  uint64_t globalIndex(int64_t local) const;
};

/// Inverted dropout: y[i] = keep(i) ? x[i] * scale : 0 with keep(i) =
/// random::dropoutTileKeep(seedKey(seed), tile, i, dropoutThreshold16(p))
/// and scale = T(1 / (1 - p)) computed in double; p in [0, 1). p = 0
/// copies x. The
/// mask is keyed on each element's sample and position within it (`tile`:
/// mtrt::dropoutMaskTile), so it does not depend on the layout or the
/// micro-batch split.
template <typename T>
void dropoutForward(ThreadPool &pool, int64_t n, const T *x, T *y, double p,
                    uint64_t seed, const random::MaskTile &tile);
/// dx = the same mask and scale applied to dy (the mask is regenerated).
template <typename T>
void dropoutBackward(ThreadPool &pool, int64_t n, const T *dy, T *dx, double p,
                     uint64_t seed, const random::MaskTile &tile);

/// y = a + b. The backward of add is the identity (da = db = dy).
/// y = x * factor (mt.scale).
template <typename T>
void scaleForward(ThreadPool &pool, int64_t n, const T *x, T factor, T *y);

template <typename T>
void addForward(ThreadPool &pool, int64_t n, const T *a, const T *b, T *y);
/// y[r, j] = x[r, j] + bias[j] for x [rows, n]. Its backward is the identity
/// for x and bias_grad for the bias.
template <typename T>
void biasAddForward(ThreadPool &pool, int64_t rows, int64_t n, const T *x,
                    const T *bias, T *y);
/// y += x: accumulates a gradient that reaches a value along several uses.
template <typename T>
void accumulateInto(ThreadPool &pool, int64_t n, const T *x, T *y);

/// y = a * b.
template <typename T>
void mulForward(ThreadPool &pool, int64_t n, const T *a, const T *b, T *y);
/// da = dy * b, db = dy * a; either may be nullptr.
template <typename T>
void mulBackward(ThreadPool &pool, int64_t n, const T *a, const T *b,
                 const T *dy, T *da, T *db);

/// Softmax along an axis of length `axisSize` of a tensor seen as
/// [outer, axisSize, inner] (inner = 1 for the last axis; any axis is
/// handled by taking outer and inner as the products of the dimensions
/// before and after it). y = exp(x - max) / sum(exp(x - max)), the sum in
/// double.
template <typename T>
void softmaxForward(ThreadPool &pool, int64_t outer, int64_t axisSize,
                    int64_t inner, const T *x, T *y);
/// dx = y * (dy - sum(dy * y)) along the axis, from the forward's output y.
template <typename T>
void softmaxBackward(ThreadPool &pool, int64_t outer, int64_t axisSize,
                     int64_t inner, const T *y, const T *dy, T *dx);

//===----------------------------------------------------------------------===//
// Loss (Loss.cpp)
//===----------------------------------------------------------------------===//

enum class LossReduction { None, Sum, Mean };

/// Softmax cross-entropy of logits [rows, vocab] against labels [rows]:
/// per row, log(sum(exp(logits - max))) - (logits[label] - max), computed as
/// the vocabulary-parallel kernels compute it (the sum of exponentials in
/// the canonical order of KernelSupport.h, its leaves in double, the tree
/// and the target term rounded to T), so that splitting the vocabulary over
/// ranks gives the same bits.
/// Rows whose label is ignoreIndex contribute 0. loss is [rows] for None;
/// a scalar for Sum (the sum over rows in increasing order, in double) and
/// Mean (that sum divided by the number of rows not ignored; 0 when there
/// are none). Fails, writing nothing, if a label is neither ignoreIndex nor
/// in [0, vocab).
template <typename T, typename Id>
KernelStatus crossEntropyForward(ThreadPool &pool, int64_t rows,
                                 int64_t vocab, const T *logits,
                                 const Id *labels, int64_t ignoreIndex,
                                 LossReduction reduction, T *loss);

/// dlogits [rows, vocab] = g_r * (softmax(logits_r) - onehot(label_r)) with
/// g_r = dloss[r] (None), dloss[0] (Sum) or dloss[0] / count (Mean); 0 on
/// ignored rows. The softmax is recomputed from the logits (nothing is
/// saved by the forward).
template <typename T, typename Id>
KernelStatus crossEntropyBackward(ThreadPool &pool, int64_t rows,
                                  int64_t vocab, const T *logits,
                                  const Id *labels, int64_t ignoreIndex,
                                  LossReduction reduction, const T *dloss,
                                  T *dlogits);

/// The output layer and its loss over chunks of `chunkRows` tokens
/// (mt.linear_cross_entropy): per chunk, logits = x_c @ op(W) into
/// `scratch` [chunkRows, vocab], the rows' losses as crossEntropyForward,
/// the logits' gradient in place as crossEntropyBackward for a loss
/// gradient of one, then dx_c = dlogits @ op(W)^T and dweight (+)= the
/// chunk's weight gradient (linearBackward). `loss` is reduced as
/// crossEntropyForward's (mean or sum). Labels must be valid (checked by
/// the caller). With `bf16Logits` (an op typed bf16: x and W hold bf16
/// values) the chunk's logits and their gradient are rounded to bf16 where
/// the CUDA kernel stores them in bf16, after the GEMM and before the
/// gradient GEMMs; the statistics and the loss stay in T.
template <typename T, typename Id>
void linearCrossEntropy(ThreadPool &pool, int64_t rows, int64_t in,
                        int64_t vocab, int64_t chunkRows, const T *x,
                        const T *weight, bool transposeWeight, const Id *labels,
                        int64_t ignoreIndex, LossReduction reduction,
                        bool bf16Logits, T *scratch, T *loss, T *dx,
                        T *dweight);

//===----------------------------------------------------------------------===//
// Vocabulary parallelism (VocabParallel.cpp): one rank's block of the
// vocabulary, rows [start, start + vocab) of the whole; ids and labels are
// checked against the whole vocabulary by the caller.
//===----------------------------------------------------------------------===//

/// out [count, hidden] = table[id - start] for ids in the block, 0 for the
/// others (an all-reduce over the vocabulary's ranks completes the lookup).
template <typename T, typename Id>
void vocabEmbeddingForward(ThreadPool &pool, int64_t count, int64_t vocab,
                           int64_t hidden, int64_t start, const T *table,
                           const Id *ids, T *out);

/// dtable [vocab, hidden] = the rows of dout summed by id - start, over the
/// ids in the block, in increasing position order.
template <typename T, typename Id>
void vocabEmbeddingBackward(ThreadPool &pool, int64_t count, int64_t vocab,
                            int64_t hidden, int64_t start, const Id *ids,
                            const T *dout, T *dtable);

/// max [rows] = each row's largest logit of the block.
template <typename T>
void vocabMax(ThreadPool &pool, int64_t rows, int64_t vocab, const T *logits,
              T *max);

/// partials [rows, 2] = (sum over the block of exp(logit - max[r]) in the
/// canonical order, KernelSupport.h; logits[label - start] - max[r] if the
/// label is in the block, else 0).
template <typename T, typename Id>
void vocabPartials(ThreadPool &pool, int64_t rows, int64_t vocab,
                   int64_t start, const T *logits, const Id *labels,
                   const T *max, T *partials);

/// The loss from whole-vocabulary partials: per row log(sum) - target, 0 for
/// ignored rows, reduced as crossEntropyForward reduces.
template <typename T, typename Id>
void vocabCrossEntropy(int64_t rows, const T *partials, const Id *labels,
                       int64_t ignoreIndex, LossReduction reduction, T *loss);

/// dlogits of the block: g_r * (exp(logit - max[r]) / sum_r - onehot), g_r
/// as crossEntropyBackward's, 0 on ignored rows.
template <typename T, typename Id>
void vocabCrossEntropyGrad(ThreadPool &pool, int64_t rows, int64_t vocab,
                           int64_t start, const T *logits, const Id *labels,
                           int64_t ignoreIndex, LossReduction reduction,
                           const T *dloss, const T *max, const T *partials,
                           T *dlogits);

/// The vocabulary-parallel output layer over chunks of `chunkRows` tokens
/// (mt.linear_vocab_*): per chunk, logits = x_c @ op(W) into `scratch`
/// ([chunkRows, vocab], rounded to bf16 with `bf16Logits` where the CUDA
/// kernel stores them in bf16), then vocabMax's, vocabPartials' or
/// vocabCrossEntropyGrad's rows of the chunk; the gradient's shared factor
/// is the whole op's (over all the rows), and the chunk's logit gradient
/// (rounded to bf16 with `bf16Logits`) gives its rows of dx = dlogits @
/// op(W)^T and its share of dweight, accumulated in chunk order.
template <typename T>
void linearVocabMax(ThreadPool &pool, int64_t rows, int64_t in, int64_t vocab,
                    int64_t chunkRows, const T *x, const T *weight,
                    bool transposeWeight, bool bf16Logits, T *scratch, T *max);

template <typename T, typename Id>
void linearVocabPartials(ThreadPool &pool, int64_t rows, int64_t in,
                         int64_t vocab, int64_t chunkRows, int64_t start,
                         const T *x, const T *weight, bool transposeWeight,
                         const Id *labels, const T *max, bool bf16Logits,
                         T *scratch, T *partials);

template <typename T, typename Id>
void linearVocabCrossEntropyGrad(ThreadPool &pool, int64_t rows, int64_t in,
                                 int64_t vocab, int64_t chunkRows,
                                 int64_t start, const T *x, const T *weight,
                                 bool transposeWeight, const Id *labels,
                                 int64_t ignoreIndex, LossReduction reduction,
                                 const T *dloss, const T *max,
                                 const T *partials, bool bf16Logits, T *scratch,
                                 T *dx, T *dweight);

//===----------------------------------------------------------------------===//
// Shapes (Shape.cpp): copies.
//===----------------------------------------------------------------------===//

/// out = the transpose of in [shape[0], ..., shape[rank-1]]: output dimension
/// i is input dimension permutation[i]. Its backward is transposeForward of
/// dout (whose shape is the permuted one) by inversePermutation.
template <typename T>
void transposeForward(ThreadPool &pool, int rank, const int64_t *shape,
                      const int64_t *permutation, const T *in, T *out);

/// inverse[permutation[i]] = i; `inverse` has `rank` elements.
void inversePermutation(int rank, const int64_t *permutation,
                        int64_t *inverse);

/// Splits in [outer, sum(sizes), inner] along the middle axis into
/// outputs[p] [outer, sizes[p], inner], p < count. Outer and inner are the
/// products of the dimensions before and after the axis. The backward of
/// split is concat and the other way round.
template <typename T>
void splitForward(ThreadPool &pool, int64_t outer, int64_t inner, int count,
                  const int64_t *sizes, const T *in, T *const *outputs);

/// Joins inputs[p] [outer, sizes[p], inner] into out [outer, sum(sizes),
/// inner].
template <typename T>
void concatForward(ThreadPool &pool, int64_t outer, int64_t inner, int count,
                   const int64_t *sizes, const T *const *inputs, T *out);

//===----------------------------------------------------------------------===//
// Optimizer (Optimizer.cpp)
//===----------------------------------------------------------------------===//

/// The hyper-parameters of one AdamW step.
struct AdamWParams {
  double lr = 0;
  double beta1 = 0.9;
  double beta2 = 0.999;
  double eps = 1e-8;
  /// 0 for parameters without decay (biases, norm weights: the caller's
  /// choice, as in Megatron-LM).
  double weightDecay = 0;
  /// 1-based.
  int64_t step = 1;
};

/// One AdamW step over n elements, torch.optim.AdamW's order of operations:
///   p *= 1 - lr * wd
///   m = beta1 m + (1 - beta1) g;   v = beta2 v + (1 - beta2) g^2
///   p -= (lr / bc1) * m / (sqrt(v) / sqrt(bc2) + eps)
/// with bc1 = 1 - beta1^step, bc2 = 1 - beta2^step. Scalars are computed in
/// double and rounded to T; the elementwise arithmetic is in T.
template <typename T>
void adamwStep(ThreadPool &pool, int64_t n, T *param, const T *grad,
               T *expAvg, T *expAvgSq, const AdamWParams &params);

/// sum(x^2) in double, over fixed blocks of 4096 elements whose partial sums
/// are added in order, so the result does not depend on the thread count.
/// Global gradient norm: sqrt of the sum over all gradients.
template <typename T>
double sumOfSquares(ThreadPool &pool, int64_t n, const T *x);

/// x *= factor (factor rounded to T), e.g. for gradient clipping.
template <typename T>
void scaleInPlace(ThreadPool &pool, int64_t n, T *x, double factor);

/// fp16 loss scaling's unscale: x *= factor (rounded to T); returns whether
/// any element is inf or nan (before or after the product), as
/// torch._amp_foreach_non_finite_check_and_unscale_ behind Megatron-LM's
/// found_inf flag.
template <typename T>
bool scaleAndCheckFinite(ThreadPool &pool, int64_t n, T *x, double factor);

enum class LrDecayStyle { Constant, Linear, Cosine };

/// The learning-rate schedule of Megatron-LM's OptimizerParamScheduler.
struct LrSchedule {
  double maxLr = 0;
  double minLr = 0;
  /// --lr-warmup-init: the rate warmup starts from.
  double warmupInitLr = 0;
  int64_t warmupIters = 0;
  int64_t decayIters = 0;
  LrDecayStyle style = LrDecayStyle::Cosine;
};

/// The learning rate after `iteration` completed iterations (Megatron-LM's
/// get_lr at num_steps = iteration):
///   warmupIters > 0 and iteration <= warmupIters:
///       warmupInitLr + (maxLr - warmupInitLr) * iteration / warmupIters
///   constant: maxLr (Megatron-LM never decays a constant schedule)
///   iteration > decayIters: minLr
///   otherwise, r = (iteration - warmupIters) / (decayIters - warmupIters):
///       minLr + (maxLr - minLr) * c, c = 1 - r (linear) or
///       0.5 (cos(pi r) + 1) (cosine); c = 1 when decayIters == warmupIters.
double learningRate(const LrSchedule &schedule, int64_t iteration);

//===----------------------------------------------------------------------===//
// Initialization (Init.cpp)
//===----------------------------------------------------------------------===//

/// out[i] = T(std * random::normal(seed, parameterId, firstIndex + i)) for
/// i < n, where firstIndex + i is the element's row-major index in the
/// parameter's global shape, so values do not depend on sharding or threads
/// (a contiguous shard passes its first element's global index).
template <typename T>
void initNormal(ThreadPool &pool, int64_t n, T *out, double std, uint64_t seed,
                uint64_t parameterId, uint64_t firstIndex = 0);

/// initNormal for a shard: out holds the block of `rank` dimensions
/// localShape[d] starting at offsets[d] of a parameter of globalShape, and
/// each element gets the value of its row-major index in the global shape.
/// A shard that is the whole tensor gets initNormal's bits.
template <typename T>
void initNormalShard(ThreadPool &pool, int rank, const int64_t *globalShape,
                     const int64_t *offsets, const int64_t *localShape, T *out,
                     double std, uint64_t seed, uint64_t parameterId);

/// out = value (0 for zeros, 1 for ones).
template <typename T>
void fill(ThreadPool &pool, int64_t n, T *out, T value);

//===----------------------------------------------------------------------===//
// Mixture of experts (Moe.cpp; docs/MoE.md)
//===----------------------------------------------------------------------===//

/// A router over `tokens` rows of `experts` logits choosing `topk`:
/// softmax or sigmoid scores, the top-k weights normalized or not, and
/// capacity routing (capacityFactor > 0; 0 is dropless) that keeps each
/// expert's highest weights, or with dropByPosition its first tokens.
/// Group-limited routing (groupTopk > 0) takes the top-k within each
/// token's groupTopk best of numGroups groups of consecutive experts. The
/// aux loss with a sequenceLength is the sequence-level one: the mean over
/// the sequences of sequenceLength consecutive tokens of each one's loss.
struct MoeRouter {
  int64_t tokens = 0, experts = 0, topk = 0;
  bool sigmoid = false, normalize = false;
  int64_t numGroups = 0, groupTopk = 0;
  int64_t sequenceLength = 0;
  double capacityFactor = 0;
  bool dropByPosition = false;
  /// The expert bias [experts] of aux-loss-free balancing (sigmoid scores),
  /// or null: the top-k and the groups' scores take each sigmoid plus its
  /// expert's bias; the weights do not.
  const double *expertBias = nullptr;
};

/// probs [tokens, topk] and indices [tokens, topk] (mt.moe_route): each
/// token's top-k experts by logit (ties: the lower expert; within its best
/// groups under group-limited routing; by sigmoid plus bias with an expert
/// bias), their weights,
/// and -1 and 0 where capacity dropped a slot.
template <typename T>
void moeRouteForward(ThreadPool &pool, const MoeRouter &router,
                     const T *logits, T *probs, int32_t *indices);

/// dlogits [tokens, experts] from dprobs [tokens, topk]; the top-k is
/// recomputed from the logits, and slots with index -1 pass nothing.
template <typename T>
void moeRouteBackward(ThreadPool &pool, const MoeRouter &router,
                      const T *logits, const int32_t *indices, const T *dprobs,
                      T *dlogits);

/// Megatron-LM's switch load-balancing loss (mt.moe_aux_loss), or with a
/// sequenceLength its sequence-level loss, and its gradient times dloss[0].
template <typename T>
void moeAuxLossForward(ThreadPool &pool, const MoeRouter &router, double coeff,
                       const T *logits, T *loss);
template <typename T>
void moeAuxLossBackward(ThreadPool &pool, const MoeRouter &router,
                        double coeff, const T *logits, const T *dloss,
                        T *dlogits);

/// The z-loss coeff / T * sum_t logsumexp(logits[t])^2 (mt.moe_z_loss), and
/// its gradient times dloss[0].
template <typename T>
void moeZLossForward(ThreadPool &pool, int64_t tokens, int64_t experts,
                     double coeff, const T *logits, T *loss);
template <typename T>
void moeZLossBackward(ThreadPool &pool, int64_t tokens, int64_t experts,
                      double coeff, const T *logits, const T *dloss,
                      T *dlogits);

/// Where the routing indices [tokens, topk] put each (token, slot) among the
/// tokens * topk permuted rows: `position` (-1 for a dropped slot), and per
/// expert below `experts` its first row (`offsets`, experts + 1 entries, the
/// last the number of kept slots). `experts` < 0 takes one more than the
/// largest index. Fails on an index below -1 or of `experts` or more.
struct MoeLayout {
  std::vector<int64_t> position;
  std::vector<int64_t> offsets;
};
KernelStatus moeLayout(int64_t tokens, int64_t topk, int64_t experts,
                       const int32_t *indices, MoeLayout &layout);

/// rows [tokens * topk, hidden] = x[t] (times probs[t, k] when given) at
/// position (t, k), zero rows after the kept ones (mt.moe_permute).
template <typename T>
void moePermute(ThreadPool &pool, int64_t tokens, int64_t topk, int64_t hidden,
                const MoeLayout &layout, const T *x, const T *probs, T *rows);

/// y [tokens, hidden] = sum over kept slots of (probs[t, k] or 1) times
/// rows[position(t, k)] (mt.moe_unpermute).
template <typename T>
void moeUnpermute(ThreadPool &pool, int64_t tokens, int64_t topk,
                  int64_t hidden, const MoeLayout &layout, const T *rows,
                  const T *probs, T *y);

/// dprobs [tokens, topk] = dot(x[t], rows[position(t, k)]), 0 when dropped
/// (mt.moe_probs_grad).
template <typename T>
void moeProbsGrad(ThreadPool &pool, int64_t tokens, int64_t topk,
                  int64_t hidden, const MoeLayout &layout, const T *x,
                  const T *rows, T *dprobs);

/// y [rows, out] = each expert's group of x [rows, in] times its weight
/// ([experts, in, out], or [experts, out, in] with transposeWeight), zero
/// rows after the groups (mt.moe_grouped_linear).
template <typename T>
void moeGroupedLinear(ThreadPool &pool, int64_t rows, int64_t in, int64_t out,
                      const MoeLayout &layout, const T *x, const T *weight,
                      bool transposeWeight, T *y);

/// dweight = per expert x_e^T @ dy_e in the weight's layout, zero for an
/// expert without rows (mt.moe_grouped_linear_weight_grad).
template <typename T>
void moeGroupedLinearWeightGrad(ThreadPool &pool, int64_t in, int64_t out,
                                const MoeLayout &layout, const T *x,
                                const T *dy, bool transposeWeight, T *dweight);

/// Expert parallelism's blocks (mt.moe_dispatch_rows and
/// mt.moe_combine_rows): N ranks hold experts/N experts each; `layout` is
/// the routing's (moeLayout over every expert). Block d of `blocks` [N *
/// tokens * topk, hidden] holds the permuted rows of rank d's experts, then
/// zero rows. `combine` copies the blocks back into `rows` [tokens * topk,
/// hidden] (zero rows after the kept ones) instead.
template <typename T>
void moeDispatchBlocks(int64_t slots, int64_t hidden, int64_t ranks,
                       const MoeLayout &layout, bool combine, const T *from,
                       T *to);

/// Each block row's expert less its destination's first, -1 for the zero
/// rows (mt.moe_dispatch_experts), [N * tokens * topk].
void moeDispatchExperts(int64_t slots, int64_t ranks, const MoeLayout &layout,
                        int32_t *experts);

//===----------------------------------------------------------------------===//
// FP8 (Fp8.cpp; docs/MixedPrecision.md, "FP8")
//===----------------------------------------------------------------------===//

/// The largest magnitude of x[0, n), in float (NaN if any is NaN; 0 when
/// n is 0): what a cast to FP8 records.
template <typename T> float fp8Amax(ThreadPool &pool, int64_t n, const T *x);

/// codes[i] = the value of x[i] * scale (in float) rounded to `format`
/// (core/Fp8.h's encode: nearest, ties to even, saturated); returns
/// fp8Amax of x. The codes are stored as their exact values.
template <typename T>
float fp8Quantize(ThreadPool &pool, int64_t n, const T *x, float scale,
                  fp8::Format format, T *codes);

/// y [rows, columns] = y * descale + bias (bias [columns] may be nullptr):
/// an FP8 GEMM's product of codes back to the operands' scale.
template <typename T>
void fp8Descale(ThreadPool &pool, int64_t rows, int64_t columns,
                float descale, const T *bias, T *y);

} // namespace mtrt::host

#endif // MTRT_SRC_HOST_KERNELS_KERNELS_H
