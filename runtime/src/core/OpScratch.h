// Each op's device scratch, defined once: the bytes a CUDA kernel needs
// besides its operands and results, and the state a forward kernel keeps for
// its gradient. The compiler's memory plan
// (dialects/mt/Transforms/SideBuffers.cpp) and the CUDA backend
// (core/ScratchPlan.cpp, whose sizes the executor checks against the plan at
// load time, and the kernels in cuda/kernels/, which carve their scratch by
// these sizes) both include this header. It is plain C++ (no MLIR, no CUDA):
// the runtime never links MLIR, and the compiler never links CUDA.
//
// A new op with scratch adds its size function here (from the dimensions both
// sides read off its operands' types), then one case in each caller; the
// lit test test/Target/Bundle/cuda-plan-check.test fails when they disagree.
#ifndef MTRT_SRC_CORE_OPSCRATCH_H
#define MTRT_SRC_CORE_OPSCRATCH_H

#include <algorithm>
#include <cstdint>
#include <string>

namespace mtrt::scratch {

/// Every block of the plan and every piece of a block is a multiple of this
/// (cuBLASLt's preferred alignment; the compiler's kArenaAlignment, the CUDA
/// backend's kArenaAlignment).
constexpr uint64_t kAlignment = 256;

constexpr uint64_t roundUp(uint64_t bytes) {
  return (bytes + kAlignment - 1) / kAlignment * kAlignment;
}

constexpr uint64_t floats(int64_t count) {
  return roundUp(4 * static_cast<uint64_t>(std::max<int64_t>(count, 0)));
}

/// cuBLASLt's workspace: every GEMM instruction's kernel block ends with it
/// (gemmOpBytes; GEMMs run one at a time, so blocks released after each
/// cost one workspace at the peak, as one shared workspace would). The CUDA
/// backend takes cuBLASLt algorithms needing at most this much.
constexpr uint64_t kGemmWorkspaceBytes = uint64_t(32) << 20;

// ---- Column sums (bias gradients) and norm gradients (kernels/Norms.cu) ----

/// Rows per chunk of the column-sum kernels (a row of f32 partials each).
constexpr int64_t kColumnSumRowsPerChunk = 64;
/// The norm backward's blocks: at least this many rows each, at most this
/// many blocks (each writes one row of f32 partial sums per parameter).
constexpr int64_t kNormMinRowsPerBlock = 8;
constexpr int64_t kNormMaxBlocks = 1024;

inline int64_t columnSumChunks(int64_t rows) {
  return std::max<int64_t>(
      1, (rows + kColumnSumRowsPerChunk - 1) / kColumnSumRowsPerChunk);
}

inline int64_t normBackwardBlocks(int64_t rows) {
  int64_t blocks = (rows + kNormMinRowsPerBlock - 1) / kNormMinRowsPerBlock;
  return std::max<int64_t>(1, std::min(blocks, kNormMaxBlocks));
}

/// The f32 partial column sums of a [rows, hidden] bias gradient.
inline uint64_t columnSumBytes(int64_t rows, int64_t hidden) {
  return 4 * uint64_t(columnSumChunks(rows)) *
         uint64_t(std::max<int64_t>(hidden, 1));
}

/// The f32 partial sums of one parameter gradient of a norm backward.
inline uint64_t normBackwardPartialBytes(int64_t rows, int64_t hidden) {
  return 4 * uint64_t(normBackwardBlocks(rows)) *
         uint64_t(std::max<int64_t>(hidden, 1));
}

// ---- Embedding gradient (kernels/Embedding.cu) ----

/// CUB's radix sort of (id, position) pairs sizes its temporary storage at
/// run time (the alternate keys and values, and digit histograms that grow
/// with the device's grid); the plan bounds it by twice the pairs plus this,
/// and the kernel refuses to run when CUB asks for more.
constexpr uint64_t kEmbeddingSortSlackBytes = uint64_t(4) << 20;

inline uint64_t embeddingIdBytes(bool wideIds) { return wideIds ? 8 : 4; }

inline uint64_t embeddingSortBoundBytes(int64_t count, bool wideIds) {
  return roundUp(2 * (embeddingIdBytes(wideIds) + 8) * uint64_t(count) +
                 kEmbeddingSortSlackBytes);
}

// ---- Rope (kernels/Rope.cu): the cos and sin tables, f32 ----

inline uint64_t ropeTableBytes(int64_t seq, int64_t rotaryDim) {
  return 8 * uint64_t(std::max<int64_t>(1, seq * (rotaryDim / 2)));
}

// ---- Cross-entropy (kernels/Loss.cu) ----

/// The per-row f64 losses and their sum.
inline uint64_t crossEntropyPartialBytes(int64_t rows) {
  return 8 * uint64_t(rows + 1);
}
/// The rows' logsumexps (f64), kept by the forward for its gradient.
inline uint64_t crossEntropySavedBytes(int64_t rows) {
  return 8 * uint64_t(rows);
}

// ---- Attention (kernels/Attention.cu, kernels/FlashAttention.cu) ----

/// q [batch, seqQ, headsQ, headDim], k [batch, seqK, headsKv, headDim],
/// v [batch, seqK, headsKv, headDimV].
struct AttentionShape {
  int64_t batch = 0, seqQ = 0, seqK = 0, headsQ = 0, headsKv = 0;
  int64_t headDim = 0, headDimV = 0;
  bool causal = false;
  double dropoutP = 0;

  int64_t rows() const { return batch * seqQ * headsQ; }
};

/// The shape of any attention parameters with these fields (the runtime's
/// host::AttentionParams).
template <typename Params> AttentionShape attentionShapeOf(const Params &p) {
  AttentionShape s;
  s.batch = p.batch;
  s.seqQ = p.seqQ;
  s.seqK = p.seqK;
  s.headsQ = p.headsQ;
  s.headsKv = p.headsKv;
  s.headDim = p.headDim;
  s.headDimV = p.headDimV;
  s.causal = p.causal;
  s.dropoutP = p.dropoutP;
  return s;
}

/// The flash kernels' key tile.
constexpr int64_t kFlashTile = 64;

/// Why the flash kernels cannot run this shape, or "" when they can (they
/// run under mixed precision only).
inline std::string flashAttentionUnsupportedReason(const AttentionShape &p) {
  if (p.headDim != p.headDimV)
    return "the flash-attention kernels need equal query/key and value head "
           "dimensions, found " +
           std::to_string(p.headDim) + " and " + std::to_string(p.headDimV);
  if (p.headDim != 16 && p.headDim != 32 && p.headDim != 64 &&
      p.headDim != 128)
    return "the flash-attention kernels take head dimensions 16, 32, 64 or "
           "128, found " +
           std::to_string(p.headDim);
  if (p.causal && p.seqQ != p.seqK)
    return "causal flash attention needs as many queries as keys, found " +
           std::to_string(p.seqQ) + " and " + std::to_string(p.seqK);
  if (p.batch > 65535 || p.headsQ > 65535)
    return "the grid would exceed CUDA's limits (batch or heads over 65535)";
  constexpr int64_t kMaxSeq = (int64_t(1) << 31) - 2 * kFlashTile;
  if (p.seqQ > kMaxSeq || p.seqK > kMaxSeq)
    return "the flash-attention kernels index positions in 32 bits: "
           "sequences up to " +
           std::to_string(kMaxSeq) + ", found " + std::to_string(p.seqQ) +
           " queries and " + std::to_string(p.seqK) + " keys";
  return std::string();
}

/// The logsumexp: a float per query row.
inline uint64_t attentionLogsumexpBytes(const AttentionShape &p) {
  return floats(p.rows());
}

/// The flash forward's dropout bits: a 64-bit word per query row and key
/// tile (none without dropout).
inline uint64_t flashAttentionMaskBytes(const AttentionShape &p) {
  if (p.dropoutP <= 0)
    return 0;
  return 8 * uint64_t(p.rows()) *
         uint64_t((p.seqK + kFlashTile - 1) / kFlashTile);
}

/// The flash forward's output, kept in bf16 for the gradient.
inline uint64_t flashAttentionSavedOutputBytes(const AttentionShape &p) {
  return 2 * uint64_t(p.rows()) * uint64_t(p.headDimV);
}

/// The flash backward's delta (a float per query row, aligned so that what
/// follows is).
inline uint64_t flashAttentionDeltaBytes(const AttentionShape &p) {
  return floats(p.rows());
}

/// The workspace of its own a cuDNN fused-attention plan may take
/// (cuda/CudnnAttention.h), as the memory plan holds it. Measured on the
/// H200 with cuDNN 9.19 (bench/NOTES.md, session 16): 256 bytes for the
/// forward and for the backward of as many key/value heads as query heads,
/// and with grouped-query heads one fp32 tensor of dK's or dV's shape over
/// the query heads (their sums before the reduction over a group) plus 256
/// bytes. The bounds leave room for other engines; the runtime takes cuDNN
/// only for plans within them, and its own kernels otherwise.
constexpr uint64_t kCudnnAttentionForwardWorkspaceBytes = uint64_t(64) << 10;
constexpr uint64_t kCudnnAttentionWorkspaceBytes = uint64_t(1) << 20;

inline uint64_t cudnnAttentionWorkspaceBoundBytes(const AttentionShape &p) {
  uint64_t bytes = kCudnnAttentionWorkspaceBytes;
  if (p.headsKv != p.headsQ)
    bytes += floats(p.batch * p.headsQ * p.seqK * p.headDim);
  return bytes;
}

/// cuDNN's fused backward: the softmax sums (a float per query row), the
/// fp32 dq accumulator, then its plan's workspace.
inline uint64_t cudnnAttentionBackwardScratchBytes(const AttentionShape &p) {
  return floats(p.rows()) + floats(p.rows() * p.headDim) +
         cudnnAttentionWorkspaceBoundBytes(p);
}

/// The flash backward's scratch: delta and, at head dimensions 64 and 128,
/// fp32 dq sums (the fused backward's at 128, the Hopper backward's at
/// both, over the query tiles of 64: kernels/HopperAttention.h); without
/// dropout, where cuDNN may run it instead, at least cuDNN's.
inline uint64_t flashAttentionBackwardScratchBytes(const AttentionShape &p) {
  uint64_t bytes = flashAttentionDeltaBytes(p);
  if (p.headDim >= 64)
    bytes += 4 * uint64_t(p.batch * p.headsQ) *
             uint64_t((p.seqQ + kFlashTile - 1) / kFlashTile * kFlashTile) *
             uint64_t(p.headDim);
  if (p.dropoutP <= 0)
    bytes = std::max(bytes, cudnnAttentionBackwardScratchBytes(p));
  return bytes;
}

/// The exact (fp32) backward's delta: a float per query row.
inline uint64_t attentionBackwardScratchBytes(const AttentionShape &p) {
  return 4 * uint64_t(p.rows());
}

// ---- Each op's kernel block: its scratch and what it keeps ----

/// attention: `flash` whether the flash kernels run it; `paired` whether a
/// later flash attention_grad reads its state (logsumexp, bf16 output,
/// dropout bits), which the block then keeps until that gradient;
/// `outputHeld` whether the memory plan holds the (bf16) output itself
/// through that gradient, which then reads it there: the block keeps no
/// copy of it (ScratchPlan::outputHeld). Without dropout, cuDNN's forward
/// workspace after them.
inline uint64_t attentionOpBytes(const AttentionShape &p, bool flash,
                                 bool paired, bool outputHeld) {
  uint64_t bytes = attentionLogsumexpBytes(p);
  if (paired && !outputHeld)
    bytes += roundUp(flashAttentionSavedOutputBytes(p));
  if (paired || flash)
    bytes += roundUp(flashAttentionMaskBytes(p));
  // Without dropout cuDNN may run it: its plan's workspace, last.
  if (flash && p.dropoutP <= 0)
    bytes += kCudnnAttentionForwardWorkspaceBytes;
  return bytes;
}

/// attention_grad: `paired` whether it reads a flash forward's state;
/// otherwise a flash gradient reruns the forward (logsumexp, output, mask)
/// and the exact one recomputes the logsumexp.
inline uint64_t attentionGradOpBytes(const AttentionShape &p, bool flash,
                                     bool paired) {
  if (paired)
    return roundUp(flashAttentionBackwardScratchBytes(p));
  if (flash)
    return attentionLogsumexpBytes(p) +
           roundUp(flashAttentionSavedOutputBytes(p)) +
           roundUp(flashAttentionMaskBytes(p)) +
           roundUp(flashAttentionBackwardScratchBytes(p));
  return attentionLogsumexpBytes(p) +
         roundUp(attentionBackwardScratchBytes(p));
}

/// cross_entropy (`paired`: a later cross_entropy_grad reads its
/// logsumexps) and cross_entropy_grad (`paired` false).
inline uint64_t crossEntropyOpBytes(int64_t rows, bool paired) {
  uint64_t bytes = roundUp(crossEntropyPartialBytes(rows));
  if (paired)
    bytes += roundUp(crossEntropySavedBytes(rows));
  return bytes;
}

/// linear_cross_entropy's statistics (f64, kernels/Loss.cu): a chunk's row
/// losses, then the loss gradient's share of a row, the labelled rows'
/// count and the running total of the losses over the chunks.
inline uint64_t linearCrossEntropyStatisticsBytes(int64_t chunkRows) {
  return 8 * uint64_t(chunkRows + 3);
}

/// linear_cross_entropy over chunks of `chunkRows` tokens, and the
/// vocabulary-parallel output layer's linear_vocab_max,
/// linear_vocab_partials and linear_vocab_cross_entropy_grad over the
/// rank's block of `vocab` logits (their statistics: the gradient's shared
/// factor, one f64): one chunk's
/// logits of `logitBytes` each (the op's input's type: 4 for f32, 2 for
/// bf16), overwritten by their gradient, its statistics, and cuBLASLt's
/// workspace for the chunk's three GEMMs (the cuda backend's; the host
/// leaves the block unused).
inline uint64_t linearCrossEntropyOpBytes(int64_t chunkRows, int64_t vocab,
                                          uint64_t logitBytes) {
  return roundUp(logitBytes * uint64_t(chunkRows) * uint64_t(vocab)) +
         roundUp(linearCrossEntropyStatisticsBytes(chunkRows)) +
         kGemmWorkspaceBytes;
}

/// layer_norm_grad / rms_norm_grad over [rows, hidden]: partial sums for
/// dweight and, with `dbias`, dbias.
inline uint64_t normGradOpBytes(int64_t rows, int64_t hidden, bool dbias) {
  return roundUp(normBackwardPartialBytes(rows, hidden) * (dbias ? 2 : 1));
}

/// bias_grad, and a GEMM with a bias-gradient epilogue (the column sums in
/// case cuBLASLt cannot do them) over [rows, columns].
inline uint64_t biasGradOpBytes(int64_t rows, int64_t columns) {
  return roundUp(columnSumBytes(rows, columns));
}

/// embedding_grad over `count` ids: the sorted ids, two i64 position arrays
/// and CUB's sort space (bounded).
inline uint64_t embeddingGradOpBytes(int64_t count, bool wideIds) {
  if (count <= 0)
    return 0;
  return roundUp(embeddingIdBytes(wideIds) * uint64_t(count)) +
         2 * roundUp(8 * uint64_t(count)) +
         embeddingSortBoundBytes(count, wideIds);
}

/// rope over a sequence of `seq` with `rotaryDim` rotated dimensions.
inline uint64_t ropeOpBytes(int64_t seq, int64_t rotaryDim) {
  return roundUp(ropeTableBytes(seq, rotaryDim));
}

/// A GEMM whose result is bf16 and that adds a bias or writes a bias
/// gradient: cuBLASLt takes that vector in the result's type, so the fp32
/// bias is rounded into (or the gradient written in bf16 to) `columns` bf16
/// elements of the GEMM's block, after the column sums, before the
/// workspace; the gradient is then widened into its fp32 result.
inline uint64_t gemmBf16VectorBytes(int64_t columns) {
  return roundUp(2 * static_cast<uint64_t>(std::max<int64_t>(columns, 0)));
}

/// A GEMM instruction (linear, linear_gelu, linear_gelu_grad, matmul,
/// linear_weight_grad, linear_weight_bias_grad): its epilogue's scratch
/// (`epilogueBytes`: a bias gradient's column sums, biasGradOpBytes, then a
/// bf16 result's vector, gemmBf16VectorBytes; each 0 without one), then
/// cuBLASLt's workspace at gemmWorkspaceOffset.
inline uint64_t gemmWorkspaceOffset(uint64_t epilogueBytes) {
  return roundUp(epilogueBytes);
}
inline uint64_t gemmOpBytes(uint64_t epilogueBytes) {
  return gemmWorkspaceOffset(epilogueBytes) + kGemmWorkspaceBytes;
}

} // namespace mtrt::scratch

#endif // MTRT_SRC_CORE_OPSCRATCH_H
