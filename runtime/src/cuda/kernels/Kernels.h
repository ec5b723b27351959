// The CUDA backend's kernels: forward and backward of every mt op except the
// GEMMs (cuBLASLt, cuda/Gemm.h), as host-callable launchers.
//
// Conventions, for every launcher here:
// - The device twins of host/kernels/Kernels.h: the same arguments (plus a
//   stream and, where a kernel needs it, device scratch), the same formulas
//   and the same element indexing, so the dropout masks and every value the
//   host computes in double (normalization statistics, softmax and
//   cross-entropy sums, rotary angles) are computed the same way. Sums run in
//   another order than on the host (trees over threads), so results agree to
//   rounding, not bit for bit; every reduction has a fixed shape, so a
//   launcher gives the same bits on every run.
// - Compute in f32; storage float, or float or bf16 where a launcher takes
//   InElements / OutElements (the storage type Executor::storageType picks
//   at load time); ids and labels int32_t or int64_t (Id).
// - Launches are asynchronous on `stream` and report nothing: the caller
//   checks cudaGetLastError() after them (MTRT_CUDA_CHECK_LAUNCH).
// - Ids and labels are checked on the host before upload (cuda/Executor);
//   kernels that still meet one outside their table skip it (writing zeros)
//   and store `tag` into *fault if it holds 0, so that the executor can
//   report the instruction.
// - Scratch arguments are device buffers of at least the bytes the matching
//   *ScratchBytes function returns, owned by the caller.
// - Outputs never alias inputs unless a launcher says so.
#ifndef MTRT_SRC_CUDA_KERNELS_KERNELS_H
#define MTRT_SRC_CUDA_KERNELS_KERNELS_H

#include "core/ContextLayout.h"
#include "core/Fp8.h"
#include "host/kernels/Kernels.h"

#include <cuda_bf16.h>
#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>
#include <string>

namespace mtrt::cuda {

using host::AttentionParams;
using host::GeluApproximation;
using host::LossReduction;

/// Device elements a kernel reads: fp32, or bf16 when `bf16` (a value held
/// in bf16, Bf16Values.cpp). Loads widen to float; the kernels compute in
/// fp32 either way. Converts implicitly from either pointer type.
struct InElements {
  const void *data = nullptr;
  bool bf16 = false;
  InElements(const float *p) : data(p) {}
  InElements(const __nv_bfloat16 *p) : data(p), bf16(true) {}
  InElements(const void *p, bool isBf16) : data(p), bf16(isBf16) {}
};

/// Device elements a kernel writes: fp32, or bf16 (rounded to nearest even,
/// as __float2bfloat16_rn) when `bf16`. May be null where a launcher says so.
struct OutElements {
  void *data = nullptr;
  bool bf16 = false;
  OutElements(std::nullptr_t) {}
  OutElements(float *p) : data(p) {}
  OutElements(__nv_bfloat16 *p) : data(p), bf16(true) {}
};

//===----------------------------------------------------------------------===//
// Init.cu: fills, parameter initialization, position ids
//===----------------------------------------------------------------------===//

/// out[i] = value (out fp32 or bf16).
void fill(cudaStream_t stream, int64_t n, OutElements out, float value);

/// out[i] = float(std * random::normal(seed, parameterId, i)), as
/// host::initNormal (Box-Muller in double).
void initNormal(cudaStream_t stream, int64_t n, float *out, double std,
                uint64_t seed, uint64_t parameterId);

/// ids[i] = first + i % seq (`first`: the offset of a rank's sequence tile
/// under sequence parallelism, else 0).
template <typename Id>
void positionIds(cudaStream_t stream, int64_t n, int64_t seq, Id *ids,
                 int64_t first = 0);

/// ids[i] = contextGlobalPosition(tile, i % seq): a tile of the
/// load-balanced sequence under context parallelism (core/ContextLayout.h).
template <typename Id>
void positionIds(cudaStream_t stream, int64_t n, int64_t seq, Id *ids,
                 const ContextTile &tile);

//===----------------------------------------------------------------------===//
// Embedding.cu
//===----------------------------------------------------------------------===//

/// out[i, :] = table[ids[i], :] (out fp32 or bf16).
template <typename Id>
void embeddingForward(cudaStream_t stream, int64_t count, int64_t vocab,
                      int64_t hidden, const float *table, const Id *ids,
                      OutElements out, unsigned *fault, unsigned tag);

/// Scratch of embeddingBackward for `count` ids (int64_t ids when
/// `wideIds`, else int32_t).
size_t embeddingBackwardScratchBytes(int64_t count, bool wideIds);

/// dtable = 0, then dtable[ids[i], :] += dout[i, :] in increasing i for each
/// table row: a stable radix sort of the ids (CUB) groups each row's
/// positions in increasing order, and one block per run of equal ids sums
/// them (no atomics, fixed order, the host's sums) in fp32; dout fp32 or
/// bf16.
template <typename Id>
void embeddingBackward(cudaStream_t stream, int64_t count, int64_t vocab,
                       int64_t hidden, const Id *ids, InElements dout,
                       float *dtable, void *scratch, unsigned *fault,
                       unsigned tag);

/// Megatron-LM's vocabulary-parallel lookup: the table holds rows
/// [start, start + vocab) of a vocabulary of `total` ids; ids of other rows
/// give zeros (an all-reduce over the vocabulary's ranks completes the
/// lookup), ids outside [0, total) raise the fault.
template <typename Id>
void vocabEmbeddingForward(cudaStream_t stream, int64_t count, int64_t vocab,
                           int64_t hidden, int64_t start, int64_t total,
                           const float *table, const Id *ids, OutElements out,
                           unsigned *fault, unsigned tag);

/// embeddingBackward into the rows [start, start + vocab) of the table;
/// positions whose id is another rank's row are skipped.
template <typename Id>
void vocabEmbeddingBackward(cudaStream_t stream, int64_t count, int64_t vocab,
                            int64_t hidden, int64_t start, int64_t total,
                            const Id *ids, InElements dout, float *dtable,
                            void *scratch, unsigned *fault, unsigned tag);

//===----------------------------------------------------------------------===//
// VocabParallel.cu: the vocabulary-parallel cross-entropy on one rank's
// block of the vocabulary [start, start + vocab), as host/kernels'
// vocabMax, vocabPartials, vocabCrossEntropy and vocabCrossEntropyGrad; the
// all-reduces between them (max, then sum of the partials) are the
// bundle's own instructions. The logits and their gradient are fp32 or
// bf16 (the statistics are computed from the widened values); the
// statistics, the loss and dloss are fp32.
//===----------------------------------------------------------------------===//

/// max [rows] = each row's largest logit of the block.
void vocabMax(cudaStream_t stream, int64_t rows, int64_t vocab,
              InElements logits, float *max);

/// partials [rows, 2] = (sum over the block of exp(logit - max[r]), in
/// float per thread and merged in double; logits[label - start] - max[r]
/// when the label is in the block, else 0).
template <typename Id>
void vocabPartials(cudaStream_t stream, int64_t rows, int64_t vocab,
                   int64_t start, InElements logits, const Id *labels,
                   const float *max, float *partials);

/// The loss from the whole vocabulary's partials: per row log(sum) -
/// target, 0 on ignored rows; [rows] for None, else the sum (Sum) or the
/// mean over rows not ignored (Mean), accumulated in double by one block.
template <typename Id>
void vocabCrossEntropy(cudaStream_t stream, int64_t rows,
                       const float *partials, const Id *labels,
                       int64_t ignoreIndex, LossReduction reduction,
                       float *loss);

/// Bytes of vocabCrossEntropyGrad's scratch (the rows' shared factor).
constexpr size_t kVocabCrossEntropyGradScratchBytes = sizeof(double);

/// dlogits of the block = g_r * (exp(logit - max[r]) / sum_r - onehot), 0
/// on ignored rows; g_r = dloss[r] (None), dloss[0] (Sum) or dloss[0] over
/// the rows not ignored (Mean), that factor computed into `scratch` first.
template <typename Id>
void vocabCrossEntropyGrad(cudaStream_t stream, int64_t rows, int64_t vocab,
                           int64_t start, InElements logits,
                           const Id *labels, int64_t ignoreIndex,
                           LossReduction reduction, const float *dloss,
                           const float *max, const float *partials,
                           OutElements dlogits, void *scratch);

/// vocabCrossEntropyGrad in two steps, for the chunked output layer
/// (linear_vocab_cross_entropy_grad): the factor the rows share, over all
/// the rows (nothing for None), then a chunk's rows from it. `logits` and
/// `dlogits` may be the same elements (each is read before it is written).
template <typename Id>
void vocabCrossEntropyGradFactor(cudaStream_t stream, int64_t rows,
                                 const Id *labels, int64_t ignoreIndex,
                                 LossReduction reduction, const float *dloss,
                                 double *factor);
template <typename Id>
void vocabCrossEntropyGradRows(cudaStream_t stream, int64_t rows, int64_t vocab,
                               int64_t start, InElements logits,
                               const Id *labels, int64_t ignoreIndex,
                               LossReduction reduction, const float *dloss,
                               const float *max, const float *partials,
                               const double *factor, OutElements dlogits);

//===----------------------------------------------------------------------===//
// Norms.cu: a row in registers, statistics in double as on the host
//===----------------------------------------------------------------------===//

/// A norm's activations [rows, hidden]: float, or bf16 when the value is
/// held in bf16 (cuda/Bf16Values.cpp). Weights, biases and their gradients
/// stay float.
struct NormRows {
  const void *data = nullptr;
  bool bf16 = false;
};
struct NormRowsOut {
  void *data = nullptr;
  bool bf16 = false;
};

/// The largest hidden size the norm kernels take (32 elements of a row per
/// thread, 512 threads); the executor rejects larger ones.
constexpr int64_t kMaxNormHidden = 16384;

/// y = (x - mean) * rstd * weight (+ bias if not null), as
/// host::layerNormForward; the statistics are not kept (the gradient
/// recomputes them).
void layerNormForward(cudaStream_t stream, int64_t rows, int64_t hidden,
                      NormRows x, const float *weight, const float *bias,
                      double eps, NormRowsOut y);
/// y = x * rstd * weight, as host::rmsNormForward.
void rmsNormForward(cudaStream_t stream, int64_t rows, int64_t hidden,
                    NormRows x, const float *weight, double eps,
                    NormRowsOut y);

/// Scratch of a norm backward, per parameter gradient: one row of float
/// partial sums per block of rows.
size_t normBackwardScratchBytes(int64_t rows, int64_t hidden);

/// dx (if its data is not null), dweight and (if not null) dbias, as
/// host::layerNormBackward with the statistics recomputed from x: one kernel
/// for dx and per-block partial column sums, one for their totals.
/// `scratch`: normBackwardScratchBytes(rows, hidden) * (dbias ? 2 : 1).
void layerNormBackward(cudaStream_t stream, int64_t rows, int64_t hidden,
                       NormRows x, const float *weight, NormRows dy,
                       double eps, NormRowsOut dx, float *dweight,
                       float *dbias, void *scratch);
/// As layerNormBackward for RMS norm; `scratch`:
/// normBackwardScratchBytes(rows, hidden).
void rmsNormBackward(cudaStream_t stream, int64_t rows, int64_t hidden,
                     NormRows x, const float *weight, NormRows dy, double eps,
                     NormRowsOut dx, float *dweight, void *scratch);

//===----------------------------------------------------------------------===//
// Attention.cu: the attention core (one block per query row, then one per
// key row for dk and dv; not flash yet) and rotary position embedding
//===----------------------------------------------------------------------===//

/// Whether the device can run attention with these shapes (dynamic shared
/// memory of seqK floats plus a row of q); an empty string when it can,
/// else why not.
std::string attentionUnsupportedReason(const AttentionParams &params,
                                       int device);

/// out and logsumexp [batch, headsQ, seqQ], as host::attentionForward;
/// out may be null (only the logsumexp is computed).
void attentionForward(cudaStream_t stream, const AttentionParams &params,
                      const float *q, const float *k, const float *v,
                      float *out, float *logsumexp);

/// Scratch of attentionBackward: one float per query row.
size_t attentionBackwardScratchBytes(const AttentionParams &params);

/// dq, dk, dv (each may be null) as host::attentionBackward, from the
/// forward's logsumexp.
void attentionBackward(cudaStream_t stream, const AttentionParams &params,
                       const float *q, const float *k, const float *v,
                       const float *logsumexp, const float *dout, float *dq,
                       float *dk, float *dv, void *scratch);

//===----------------------------------------------------------------------===//
// FlashAttention.cu: the attention core of mixed precision (tiles of 64
// queries x 64 keys, online softmax, bf16 tensor-core products with fp32
// accumulation; inputs and outputs fp32 or bf16; same dropout masks as the
// host)
//===----------------------------------------------------------------------===//

/// Empty when the flash kernels take these shapes, else why not.
std::string flashAttentionUnsupportedReason(const AttentionParams &params);

/// Where a flash-attention tensor's rows lie, in elements: element e of
/// position i of head h in batch b is at
/// (b * positions + i) * position + h * head + e. Both 0 (the default): the
/// packed [batch, positions, heads, headDim] (position = heads * headDim,
/// head = headDim). A piece of a larger [batch, positions, H, X] tensor
/// split on its last two axes (q, k and v in place in the qkv GEMM's
/// result) has position = H * X, head = X, and its data pointer at its
/// first element. Strides and the data pointer must keep 16-byte rows
/// aligned: multiples of 8 elements.
struct FlashLayout {
  int64_t position = 0, head = 0;
};

/// The tensors of a flash-attention call and their element types: q, k, v
/// (and dout) are bf16 when inputsBf16, else fp32; out (or dq, dk, dv) bf16
/// when outputsBf16, else fp32. Outputs may be null (not computed); dout
/// and dq, dk, dv belong to the backward only. q, dout, out, dq span the
/// query heads, k, v, dk, dv the key/value heads.
struct FlashTensors {
  const void *q = nullptr, *k = nullptr, *v = nullptr, *dout = nullptr;
  void *out = nullptr, *dq = nullptr, *dk = nullptr, *dv = nullptr;
  FlashLayout qLayout, kLayout, vLayout, doutLayout, outLayout, dqLayout,
      dkLayout, dvLayout;
  bool inputsBf16 = false, outputsBf16 = false;
  /// The backward computes dq in a fixed order (a run gives the same bits
  /// every time). Otherwise, at head dimension 128 with bf16 inputs, dq is
  /// summed by fp32 reductions from the dk/dv kernel (one kernel instead of
  /// two, the order of the additions varying between runs).
  bool deterministic = false;
};

/// io.out and logsumexp [batch, headsQ, seqQ], as attentionForward; out
/// and outCopy (a second copy of out in bf16, of
/// flashAttentionSavedOutputBytes, kept for the gradient) may be null. With
/// dropout a `mask` of flashAttentionMaskBytes is required: the keep
/// decisions are drawn into it as bits first, then the forward reads them,
/// and the gradient reuses them.
void flashAttentionForward(cudaStream_t stream, const AttentionParams &params,
                           const FlashTensors &io, __nv_bfloat16 *outCopy,
                           float *logsumexp, uint64_t *mask);

/// Bytes of the forward's dropout mask: 0 without dropout.
size_t flashAttentionMaskBytes(const AttentionParams &params);

/// Bytes of the forward's output copy kept for the gradient (bf16).
size_t flashAttentionSavedOutputBytes(const AttentionParams &params);

/// Scratch of flashAttentionBackward: one float per query row (delta),
/// and at head dimension 128 the fused backward's fp32 dq sums (batch x
/// headsQ x seqQ x 128 floats).
size_t flashAttentionBackwardScratchBytes(const AttentionParams &params);

/// io.dq, io.dk, io.dv (each may be null) from io.q, k, v, dout and the
/// forward's bf16 out copy, logsumexp and, with dropout, its mask (required
/// then: the backward reads the keep decisions, it does not recompute
/// them).
void flashAttentionBackward(cudaStream_t stream, const AttentionParams &params,
                            const FlashTensors &io, const __nv_bfloat16 *out,
                            const float *logsumexp, const uint64_t *mask,
                            void *scratch);

/// Scratch of rope: the cos/sin table, [seq][rotaryDim / 2] each, in float.
size_t ropeScratchBytes(int64_t seq, int64_t rotaryDim);

/// host::ropeForward (inverse false) or host::ropeBackward (inverse true).
/// y may alias x when both have one storage type.
/// `rows` places the seq rows in the global sequence (context parallelism:
/// a tile of the load-balanced sequence, core/ContextLayout.h); the default
/// is rows 0.. at positions 0...
void rope(cudaStream_t stream, int64_t batch, int64_t seq, int64_t heads,
          int64_t headDim, int64_t rotaryDim,
          const RopeFrequencies &frequencies, bool inverse,
          InElements x, OutElements y, void *scratch,
          const ContextTile &rows = {});

//===----------------------------------------------------------------------===//
// Elementwise.cu: n elements each, fp32 or bf16 storage per operand and
// result (compute in fp32); outputs may alias inputs of their shape and
// storage type
//===----------------------------------------------------------------------===//

void geluForward(cudaStream_t stream, int64_t n, InElements x, OutElements y,
                 GeluApproximation approximation);
void geluBackward(cudaStream_t stream, int64_t n, InElements x, InElements dy,
                  OutElements dx, GeluApproximation approximation);

/// Scratch of biasGrad's column sums of a [rows, hidden] input.
size_t columnSumScratchBytes(int64_t rows, int64_t hidden);

/// dbias [out] = sum over rows of dy [rows, out] (float or bf16);
/// `scratch`: columnSumScratchBytes(rows, out).
void biasGrad(cudaStream_t stream, int64_t rows, int64_t out, NormRows dy,
              float *dbias, void *scratch);
inline void biasGrad(cudaStream_t stream, int64_t rows, int64_t out,
                     const float *dy, float *dbias, void *scratch) {
  biasGrad(stream, rows, out, NormRows{dy, false}, dbias, scratch);
}

/// sums [cols] = the totals of a column sum's partial rows over [rows,
/// cols] values (the chunks' f32 rows at `partial`, as biasGrad leaves
/// them: a generated kernel's column-sum form writes them alike).
void columnSumTotals(cudaStream_t stream, int64_t rows, int64_t cols,
                     const float *partial, float *sums);

/// geluBackward over [rows, cols] elements, and dbias [cols] = the sum over
/// rows of dx as stored (the bias gradient of the layer before the GeLU),
/// summed as dx is written (where every pointer is 16-byte aligned and cols
/// a multiple of 8), with the bits biasGrad gives for dx. `scratch`:
/// columnSumScratchBytes(rows, cols).
void geluBackwardBiasGrad(cudaStream_t stream, int64_t rows, int64_t cols,
                          InElements x, InElements dy, OutElements dx,
                          GeluApproximation approximation, float *dbias,
                          void *scratch);

void siluForward(cudaStream_t stream, int64_t n, InElements x, OutElements y);
void siluBackward(cudaStream_t stream, int64_t n, InElements x, InElements dy,
                  OutElements dx);
void swigluForward(cudaStream_t stream, int64_t n, InElements gate,
                   InElements up, OutElements y);
/// swigluForward and castToFp8 in one pass, for an fp8_quantize of the
/// SwiGLU's result (the executor's fused FP8 casts, Fp8Ops.cpp): each y is
/// rounded to bf16 when `roundToBf16` (as a result held in bf16 is), then
/// *amax = max(*amax, |y|) (the caller zeroes it) and codes[i] is
/// y * *scale in `format`, saturated: the bits of the two kernels, without
/// y's store and load.
void swigluToFp8(cudaStream_t stream, int64_t n, InElements gate, InElements up,
                 bool roundToBf16, uint8_t *codes, fp8::Format format,
                 const float *scale, float *amax);
/// dgate and dup may be null.
void swigluBackward(cudaStream_t stream, int64_t n, InElements gate,
                    InElements up, InElements dy, OutElements dgate,
                    OutElements dup);
/// Where swigluBackwardToFp8 casts one of its gradients: the codes
/// [rows, cols], their transpose [cols, rows] (null: not written), the
/// scale and the amax (*amax = max(*amax, |y|); the caller zeroes it);
/// the gradient rounded to bf16 first when `roundToBf16` (as a result held
/// in bf16 is).
struct SwigluGradFp8 {
  uint8_t *codes = nullptr;
  uint8_t *transposed = nullptr;
  const float *scale = nullptr;
  float *amax = nullptr;
  fp8::Format format = fp8::Format::E5M2;
  bool roundToBf16 = true;
};
/// swigluBackward of gate, up, dy [rows, cols] and the casts of dgate and
/// dup to FP8 (castToFp8Transposed's, Fp8Scaling.h) in one pass, for the
/// fp8_quantizes of the two gradients (the executor's fused FP8 casts,
/// Fp8Ops.cpp): the bits of the three kernels, without the gradients'
/// stores and loads (at llama-1.5b mb 4, 268 MB written and read a
/// layer). False, with nothing launched, where rows or cols is not a
/// multiple of 16 or a pointer is not 16-byte aligned.
bool swigluBackwardToFp8(cudaStream_t stream, int64_t rows, int64_t cols,
                         InElements gate, InElements up, InElements dy,
                         const SwigluGradFp8 &dgate, const SwigluGradFp8 &dup);
/// host::dropoutForward: the same keep decisions (seed, and each element's
/// sample and position from `tile`, core/Random.h).
void dropout(cudaStream_t stream, int64_t n, InElements x, OutElements y,
             double p, uint64_t seed, const random::MaskTile &tile);
void add(cudaStream_t stream, int64_t n, InElements a, InElements b,
         OutElements y);
void mul(cudaStream_t stream, int64_t n, InElements a, InElements b,
         OutElements y);
/// y = x * factor[0], factor a device scalar (mt.scale).
void scale(cudaStream_t stream, int64_t n, InElements x, const float *factor,
           OutElements y);
/// y += x, in fp32 (parameter gradients).
void accumulateInto(cudaStream_t stream, int64_t n, const float *x, float *y);
/// y[r, c] += bias[c] for y [rows, cols] (the host's bias add after its
/// GEMM; used where cuBLASLt has no bias epilogue for a shape).
void addBiasRows(cudaStream_t stream, int64_t rows, int64_t cols,
                 const float *bias, float *y);
/// y[r, c] = x[r, c] + bias[c] for x, y [rows, cols] (bias_add: x and y fp32
/// or bf16 each, the bias fp32; y may be x).
void biasAdd(cudaStream_t stream, int64_t rows, int64_t cols, InElements x,
             const float *bias, OutElements y);

void softmaxForward(cudaStream_t stream, int64_t outer, int64_t axisSize,
                    int64_t inner, InElements x, OutElements y);
void softmaxBackward(cudaStream_t stream, int64_t outer, int64_t axisSize,
                     int64_t inner, InElements y, InElements dy,
                     OutElements dx);

//===----------------------------------------------------------------------===//
// Precision.cu: mixed precision
//===----------------------------------------------------------------------===//

/// y[i] = bf16(x[i]), rounded to nearest even.
void roundToBf16(cudaStream_t stream, int64_t n, const float *x,
                 __nv_bfloat16 *y);

/// y[i] = float(x[i]) (exact).
void widenBf16(cudaStream_t stream, int64_t n, const __nv_bfloat16 *x,
               float *y);

/// y[i] = the FP8 code of x[i] * scale[0] (scale: a device scalar, or
/// nullptr for 1), rounded to nearest even and saturated by the GPU's
/// conversion (`cvt.rn.satfinite`), which core/Fp8.h's fp8::encode is on
/// the host. With `amax` (a device float the caller set to 0, or an amax to
/// add to), *amax = max(*amax, the largest |x[i]|) (NaN if any x[i] is):
/// the delayed-scaling recipe's record of the tensor.
void castToFp8(cudaStream_t stream, int64_t n, InElements x, uint8_t *y,
               fp8::Format format, const float *scale, float *amax = nullptr);

/// y[i] = the value of FP8 code x[i] (exact; the GPU's conversion).
void widenFp8(cudaStream_t stream, int64_t n, const uint8_t *x, float *y,
              fp8::Format format);

//===----------------------------------------------------------------------===//
// Loss.cu: softmax cross-entropy, per-row logsumexp in double
//===----------------------------------------------------------------------===//

/// Scratch of both cross-entropy launchers.
size_t crossEntropyScratchBytes(int64_t rows);
/// Bytes of the rows' logsumexps the forward can save for the backward.
size_t crossEntropySavedBytes(int64_t rows);

/// One pass over each row of logits (float or __nv_bfloat16; 16-byte
/// vector loads where the array is 16-byte aligned): each thread's running
/// max and sum of exponentials in float, merged over the row in double, as
/// the host's canonical sum rounded to float. The loss stays float. With
/// `saved` (crossEntropySavedBytes), also stores each row's logsumexp.
template <typename T, typename Id>
void crossEntropyForward(cudaStream_t stream, int64_t rows, int64_t vocab,
                         const T *logits, const Id *labels, int64_t ignoreIndex,
                         LossReduction reduction, float *loss, void *scratch,
                         double *saved, unsigned *fault, unsigned tag);

/// dlogits (float or __nv_bfloat16, with logits of either type) computed in
/// float. With `saved` (the forward's logsumexps of the same logits and
/// labels), one read of the logits and one write of dlogits; else the
/// logsumexps are recomputed first.
template <typename T, typename G, typename Id>
void crossEntropyBackward(cudaStream_t stream, int64_t rows, int64_t vocab,
                          const T *logits, const Id *labels,
                          int64_t ignoreIndex, LossReduction reduction,
                          const float *dloss, G *dlogits, void *scratch,
                          const double *saved, unsigned *fault, unsigned tag);

/// linear_cross_entropy (Executor: the chunks' GEMMs around these), its
/// statistics in `state` (3 doubles after the chunk's row losses,
/// scratch::linearCrossEntropyStatisticsBytes): Start counts the labelled
/// rows of all `rows` tokens and sets each row's share of a loss gradient
/// of one (1 / count for mean, 1 for sum) and the total to 0.
template <typename Id>
void linearCrossEntropyStart(cudaStream_t stream, int64_t rows,
                             const Id *labels, int64_t ignoreIndex,
                             LossReduction reduction, double *state);

/// One chunk of `rows` tokens whose logits [rows, vocab] (float, or bf16
/// for a bf16-typed op) are in `logits`: each row's loss
/// (crossEntropyForward's arithmetic, in float and double) into rowLoss and
/// added to the state's total in a fixed order, and the logits overwritten
/// by their gradient in their own type, share * (softmax - onehot), zeros
/// for ignored rows; a label outside [0, vocab) raises `fault` with `tag`.
template <typename T, typename Id>
void linearCrossEntropyChunk(cudaStream_t stream, int64_t rows, int64_t vocab,
                             T *logits, const Id *labels, int64_t ignoreIndex,
                             double *rowLoss, double *state, unsigned *fault,
                             unsigned tag);

/// loss[0] = the state's total (over the labelled rows for mean), in float.
void linearCrossEntropyFinish(cudaStream_t stream, const double *state,
                              LossReduction reduction, float *loss);

//===----------------------------------------------------------------------===//
// Shape.cu
//===----------------------------------------------------------------------===//

/// The most dimensions transpose handles.
constexpr int kMaxTransposeRank = 8;

/// host::transposeForward; in and out fp32 or bf16 each.
void transpose(cudaStream_t stream, int rank, const int64_t *shape,
               const int64_t *permutation, InElements in, OutElements out);

//===----------------------------------------------------------------------===//
// Optimizer.cu
//===----------------------------------------------------------------------===//

/// One AdamW step's scalars, computed on the host in double and rounded to
/// float exactly as host::adamwStep does, plus the gradient scaling and
/// clipping that train::Optimizer applies to the gradients first.
struct AdamWScalars {
  /// 1 - lr * weightDecay, for the parameters with weight decay (the
  /// others' factor is 1, exactly the host's 1 - lr * 0).
  float decay = 1;
  float beta1 = 0, beta2 = 0, oneMinusBeta1 = 0, oneMinusBeta2 = 0;
  float stepSize = 0;     // lr / (1 - beta1^step)
  float bias2Sqrt = 1;    // sqrt(1 - beta2^step)
  float eps = 0;
  float gradScale = 1;    // applied when applyScale
  float clipCoefficient = 1; // applied when applyClip
  bool applyScale = false, applyClip = false;
};

/// A piece of at most kAdamWChunkElements elements of one parameter for the
/// multi-tensor AdamW: its first element in the store's flat fp32 values,
/// in the moment arrays (the store's, at the same offset; the distributed
/// optimizer's shard, elsewhere), in the gradients (the store's flat array
/// or the shard, at the moments' offset; or, with the gradients in the
/// train step's arena, its slot there, counted from the lowest slot), and
/// in the flat bf16 copies (-1: the parameter has none), its length and
/// whether the parameter has weight decay.
struct AdamWChunk {
  int64_t begin = 0;
  int64_t stateBegin = 0;
  int64_t gradBegin = 0;
  int64_t bf16Begin = -1;
  int32_t count = 0;
  int32_t weightDecay = 0;
};
constexpr int64_t kAdamWChunkElements = 32768;

/// AdamW over every parameter in one launch, one block per chunk (a device
/// array of `chunkCount`; param is indexed from a chunk's begin, the
/// moments from its stateBegin, grad from its gradBegin). Per element: g = grad
/// (* gradScale)
/// (* clipCoefficient), each product rounded to float as the host's
/// in-place scaling does (not written back: nothing reads a step's
/// gradients after its update, and the store saved 4 bytes a parameter of
/// the step's traffic); then AdamW on param,
/// expAvg, expAvgSq with host::adamwStep's order of operations; and the
/// new param rounded to bf16 into `bf16` (the store's copies) where the
/// chunk has one.
void adamwStepChunks(cudaStream_t stream, int64_t chunkCount,
                     const AdamWChunk *chunks, float *param, const float *grad,
                     float *expAvg, float *expAvgSq, __nv_bfloat16 *bf16,
                     const AdamWScalars &scalars);

/// Scratch of sumOfSquares.
size_t sumOfSquaresScratchBytes(int64_t n);

/// *out (device) = sum over i of float(x[i] * scale)^2, accumulated in
/// double over fixed blocks and then in block order.
void sumOfSquares(cudaStream_t stream, int64_t n, const float *x, float scale,
                  double *out, void *scratch);

/// Scratch of sumOfSquaresOfChunks.
size_t sumOfSquaresOfChunksScratchBytes(int64_t chunkCount);

/// *out (device) = sum over the chunks' gradients (grad from each chunk's
/// gradBegin, `count` elements) of float(g * scale)^2, accumulated in
/// double per chunk and then in chunk order: the gradient norm's square
/// when the gradients are not one flat array.
void sumOfSquaresOfChunks(cudaStream_t stream, int64_t chunkCount,
                          const AdamWChunk *chunks, const float *grad,
                          float scale, double *out, void *scratch);

/// The bins of squareHistogram: a float's biased exponents 0 to 254, and
/// 255 counting inf and nan.
constexpr int kSquareHistogramBins = 256;

/// Adds to `histogram` (device, kSquareHistogramBins (low, high) pairs of
/// 64-bit words, a 128-bit integer each) the squared mantissas of
/// float(x[i] * scale) by exponent, and in bin 255 the count of non-finite
/// elements: train::ExactSquareSum::addFloatHistogram turns it into the
/// exact sum of squares, whatever the order or the split.
void squareHistogram(cudaStream_t stream, int64_t n, const float *x,
                     float scale, uint64_t *histogram);

} // namespace mtrt::cuda

#endif // MTRT_SRC_CUDA_KERNELS_KERNELS_H
