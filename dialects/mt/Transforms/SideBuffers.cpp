//===- SideBuffers.cpp - The CUDA backend's blocks besides the values ------===//
//
// Mirrors runtime/src/cuda/OpDispatch.cpp (Executor::scratchBytes,
// pairAttention, pairCrossEntropy), Bf16Values.cpp (planBf16Copies) and the kernels' scratch
// sizes (runtime/src/cuda/kernels/*.cu, the *ScratchBytes functions); the
// runtime checks at load time that each block here is at least what it needs.
//
//===----------------------------------------------------------------------===//

#include "mt/Transforms/SideBuffers.h"

#include "mt/IR/MtCastOp.h"
#include "mt/IR/MtOps.h"
#include "mt/Transforms/MemoryPlan.h"

#include "mlir/IR/BuiltinTypes.h"
#include "mlir/Interfaces/FunctionInterfaces.h"
#include "llvm/ADT/DenseMap.h"

#include <algorithm>

using namespace mlir;
using namespace mlir::mt;

namespace {

int64_t roundUp(int64_t bytes) {
  return (bytes + kArenaAlignment - 1) / kArenaAlignment * kArenaAlignment;
}

int64_t floats(int64_t count) { return roundUp(4 * count); }

RankedTensorType typeOf(Value value) {
  return cast<RankedTensorType>(value.getType());
}

int64_t elementsOf(Value value) { return typeOf(value).getNumElements(); }

/// Rows of a value read as [rows, last dimension].
int64_t rowsOf(Value value) {
  RankedTensorType type = typeOf(value);
  if (type.getRank() == 0)
    return 1;
  int64_t last = type.getShape().back();
  return last ? type.getNumElements() / last : 0;
}

/// The kernels' sizes (runtime/src/cuda/kernels).
constexpr int64_t kNormRowsPerChunk = 64; // Norms.cu, bias gradients
constexpr int64_t kNormMinRowsPerBlock = 8, kNormMaxBlocks = 1024; // norms
constexpr int64_t kFlashTile = 64;        // FlashAttention.cu
constexpr int64_t kFlashMaxSeq = (int64_t(1) << 31) - 2 * kFlashTile;

int64_t columnSumBytes(int64_t rows, int64_t hidden) {
  int64_t chunks =
      std::max<int64_t>(1, (rows + kNormRowsPerChunk - 1) / kNormRowsPerChunk);
  return 8 * chunks * std::max<int64_t>(hidden, 1);
}

/// Norms.cu normBackwardScratchBytes: a row of f32 partial sums per block
/// of rows, per parameter gradient.
int64_t normPartialBytes(int64_t rows, int64_t hidden) {
  int64_t blocks = std::clamp<int64_t>(
      (rows + kNormMinRowsPerBlock - 1) / kNormMinRowsPerBlock, 1,
      kNormMaxBlocks);
  return 4 * blocks * std::max<int64_t>(hidden, 1);
}

/// Embedding.cu: the ids, two int64 index arrays and CUB's radix sort of
/// (id, index) pairs. CUB sizes its temporary storage at run time: the
/// alternate keys and values, and digit histograms that grow with the
/// device's grid (cub/device/dispatch/dispatch_radix_sort.cuh); bounded here
/// by twice the pairs plus 4 MiB.
int64_t embeddingBackwardBytes(int64_t count, bool wideIds) {
  if (count <= 0)
    return 0;
  int64_t idBytes = wideIds ? 8 : 4;
  return roundUp(idBytes * count) + 2 * roundUp(8 * count) +
         roundUp(2 * (idBytes + 8) * count + (int64_t(4) << 20));
}

int64_t crossEntropyScratchBytes(int64_t rows) { return 8 * (rows + 1); }
int64_t crossEntropySavedBytes(int64_t rows) { return 8 * rows; }

/// linear_cross_entropy's chunk (runtime/src/core/OpShapes.h,
/// linearCrossEntropyScratchBytes): one chunk's f32 logits, overwritten by
/// their gradient, and its rows' statistics as cross_entropy's scratch.
int64_t linearCrossEntropyChunkBytes(int64_t chunkRows, int64_t vocab) {
  return roundUp(4 * chunkRows * vocab) +
         roundUp(crossEntropyScratchBytes(chunkRows));
}

/// runtime/src/core/OpShapes.cpp attentionParams: q, k, v are
/// [batch, sequence, heads, head dimension].
struct AttentionShape {
  int64_t batch, seqQ, headsQ, headDim, seqK, headsKv, headDimV;
  bool causal;
  double scale, dropoutP;
  int64_t seed;

  int64_t rows() const { return batch * seqQ * headsQ; }
  bool operator==(const AttentionShape &o) const {
    return batch == o.batch && seqQ == o.seqQ && headsQ == o.headsQ &&
           headDim == o.headDim && seqK == o.seqK && headsKv == o.headsKv &&
           headDimV == o.headDimV && causal == o.causal && scale == o.scale &&
           dropoutP == o.dropoutP && seed == o.seed;
  }
};

template <typename AttentionLike>
AttentionShape attentionShape(AttentionLike op) {
  ArrayRef<int64_t> q = typeOf(op.getQuery()).getShape();
  ArrayRef<int64_t> k = typeOf(op.getKey()).getShape();
  ArrayRef<int64_t> v = typeOf(op.getValue()).getShape();
  std::optional<APFloat> scale = op.getScale();
  return {q[0],
          q[1],
          q[2],
          q[3],
          k[1],
          k[2],
          v[3],
          op.getCausal(),
          scale ? scale->convertToDouble() : 0.0,
          op.getDropoutP().convertToDouble(),
          static_cast<int64_t>(op.getSeed())};
}

/// FlashAttention.cu flashAttentionUnsupportedReason: the flash kernels run
/// under mixed precision for the shapes they take.
bool runsFlash(const AttentionShape &p, const SideBufferOptions &options) {
  return options.mixedPrecision && p.headDim == p.headDimV &&
         (p.headDim == 16 || p.headDim == 32 || p.headDim == 64 ||
          p.headDim == 128) &&
         !(p.causal && p.seqQ != p.seqK) && p.batch <= 65535 &&
         p.headsQ <= 65535 && p.seqQ <= kFlashMaxSeq && p.seqK <= kFlashMaxSeq;
}

/// FlashAttention.cu flashAttentionSavedOutputBytes: the output kept for
/// the gradient, in bf16.
int64_t flashSavedOutputBytes(const AttentionShape &p) {
  return roundUp(2 * p.rows() * p.headDimV);
}

int64_t flashMaskBytes(const AttentionShape &p) {
  if (p.dropoutP <= 0)
    return 0;
  return 8 * p.rows() * ((p.seqK + kFlashTile - 1) / kFlashTile);
}

/// FlashAttention.cu flashAttentionBackwardScratchBytes: delta (a float
/// per query row) and at head dimension 128 the fused backward's fp32 dq
/// sums.
int64_t flashBackwardScratchBytes(const AttentionShape &p) {
  int64_t bytes = floats(p.rows());
  if (p.headDim >= 128)
    bytes += floats(p.rows() * p.headDim);
  return bytes;
}

/// The values a GEMM reads as its two operands (both null for other ops).
std::pair<Value, Value> gemmOperands(Operation *op) {
  if (readsGemmOperands(op))
    return {op->getOperand(0), op->getOperand(1)};
  return {};
}

/// runtime/src/core/OpShapes.cpp linearDims: rows and output columns of a
/// GEMM with a bias-gradient epilogue.
std::pair<int64_t, int64_t> biasGradDims(Operation *op) {
  ArrayRef<int64_t> first = typeOf(op->getOperand(0)).getShape();
  ArrayRef<int64_t> second = typeOf(op->getOperand(1)).getShape();
  int64_t leading = 1;
  for (int64_t d : first.drop_back())
    leading *= d;
  if (isa<LinearWeightBiasGradOp>(op)) // x [.., in], dy [.., out]
    return {leading, second.back()};
  // linear_gelu_grad: dy, the weight [in, out] (transposed: [out, in]).
  bool transposed = op->hasAttr("transpose_weight");
  int64_t in = transposed ? second[1] : second[0];
  int64_t out = transposed ? second[0] : second[1];
  return {in ? elementsOf(op->getOperand(0)) / in : leading, out};
}

} // namespace

bool mt::readsGemmOperands(Operation *op) {
  return isa_and_nonnull<LinearOp, LinearGeluOp, LinearGeluGradOp, MatmulOp,
                         LinearWeightGradOp, LinearWeightBiasGradOp>(op);
}

FlatSymbolRefAttr mt::parameterRead(Value value) {
  // A master weight's mt.cast to bf16 reads the store's persistent copy.
  if (auto cast = value.getDefiningOp<CastOp>())
    value = cast.getInput();
  if (auto read = value.getDefiningOp<GetParameterOp>())
    return read.getNameAttr();
  auto argument = dyn_cast<BlockArgument>(value);
  if (!argument)
    return {};
  auto function =
      dyn_cast_or_null<FunctionOpInterface>(argument.getOwner()->getParentOp());
  if (!function)
    return {};
  return function.getArgAttrOfType<FlatSymbolRefAttr>(argument.getArgNumber(),
                                                      "mt.parameter");
}

SmallVector<SmallVector<SideBuffer, 1>>
mt::declareSideBuffers(ArrayRef<Operation *> stream,
                       const SideBufferOptions &options) {
  const int64_t n = static_cast<int64_t>(stream.size());
  // The kernel block of each instruction: bytes and last reader.
  SmallVector<SideBuffer> kernel(n);
  for (int64_t i = 0; i < n; ++i)
    kernel[i].until = i;

  // Each flash attention_grad reads the state of the nearest earlier
  // attention of the same q, k, v and attributes (a recomputed clone when
  // there is one); each cross_entropy_grad the logsumexps of its forward.
  SmallVector<int64_t> partner(n, -1);
  for (int64_t grad = 0; grad < n; ++grad) {
    if (auto g = dyn_cast_or_null<AttentionGradOp>(stream[grad])) {
      AttentionShape shape = attentionShape(g);
      if (!runsFlash(shape, options))
        continue;
      for (int64_t forward = grad - 1; forward >= 0; --forward) {
        auto f = dyn_cast_or_null<AttentionOp>(stream[forward]);
        if (!f || partner[forward] >= 0 || f.getQuery() != g.getQuery() ||
            f.getKey() != g.getKey() || f.getValue() != g.getValue() ||
            !(attentionShape(f) == shape))
          continue;
        partner[forward] = grad;
        partner[grad] = forward;
        kernel[forward].until = grad;
        break;
      }
    } else if (auto g = dyn_cast_or_null<CrossEntropyGradOp>(stream[grad])) {
      for (int64_t forward = grad - 1; forward >= 0; --forward) {
        auto f = dyn_cast_or_null<CrossEntropyOp>(stream[forward]);
        if (!f || partner[forward] >= 0 || f.getLogits() != g.getLogits() ||
            f.getLabels() != g.getLabels() ||
            f.getIgnoreIndex() != g.getIgnoreIndex() ||
            f.getReduction() != g.getReduction())
          continue;
        partner[forward] = grad;
        partner[grad] = forward;
        kernel[forward].until = grad;
        break;
      }
    }
  }

  for (int64_t i = 0; i < n; ++i) {
    Operation *op = stream[i];
    if (!op)
      continue;
    int64_t &bytes = kernel[i].bytes;
    if (isa<LayerNormGradOp, RmsNormGradOp>(op)) {
      Value x = op->getOperand(1);
      int64_t rows = rowsOf(x), hidden = typeOf(x).getShape().back();
      bytes += roundUp(normPartialBytes(rows, hidden) *
                       (op->getNumResults() == 3 ? 2 : 1));
    } else if (isa<LinearWeightBiasGradOp>(op) ||
               (isa<LinearGeluGradOp>(op) && op->getNumResults() == 2)) {
      // The bias gradient's column sums, in case cuBLASLt cannot do them.
      auto [rows, columns] = biasGradDims(op);
      bytes += roundUp(columnSumBytes(rows, columns));
    } else if (auto biasGrad = dyn_cast<BiasGradOp>(op)) {
      Value dy = op->getOperand(0);
      bytes += roundUp(
          columnSumBytes(rowsOf(dy), typeOf(dy).getShape().back()));
    } else if (auto embeddingGrad = dyn_cast<EmbeddingGradOp>(op)) {
      Value ids = embeddingGrad.getIds();
      bytes += roundUp(embeddingBackwardBytes(
          elementsOf(ids), typeOf(ids).getElementType().isInteger(64)));
    } else if (auto attention = dyn_cast<AttentionOp>(op)) {
      AttentionShape p = attentionShape(attention);
      bytes += floats(p.rows()); // the logsumexp
      if (partner[i] >= 0) // the bf16 output, for grad
        bytes += flashSavedOutputBytes(p);
      if (partner[i] >= 0 || runsFlash(p, options)) // the dropout bits
        bytes += roundUp(flashMaskBytes(p));
    } else if (auto grad = dyn_cast<AttentionGradOp>(op)) {
      AttentionShape p = attentionShape(grad);
      if (partner[i] >= 0) // the row sums of dO * O (and the dq sums)
        bytes += flashBackwardScratchBytes(p);
      else if (runsFlash(p, options)) // the forward rerun here, then delta
        bytes += floats(p.rows()) + flashSavedOutputBytes(p) +
                 roundUp(flashMaskBytes(p)) + flashBackwardScratchBytes(p);
      else // the logsumexp and delta
        bytes += floats(p.rows()) + floats(p.rows());
    } else if (auto rope = dyn_cast<RopeOp>(op)) {
      ArrayRef<int64_t> x = typeOf(rope.getInput()).getShape();
      int64_t rotary = rope.getRotaryDim() ? int64_t(*rope.getRotaryDim())
                                           : x[3];
      bytes += roundUp(8 * std::max<int64_t>(1, x[1] * (rotary / 2)));
    } else if (auto loss = dyn_cast<CrossEntropyOp>(op)) {
      int64_t rows = elementsOf(loss.getLabels());
      bytes += roundUp(crossEntropyScratchBytes(rows));
      if (partner[i] >= 0) // the logsumexps, for the grad
        bytes += roundUp(crossEntropySavedBytes(rows));
    } else if (auto fused = dyn_cast<LinearCrossEntropyOp>(op)) {
      bytes += linearCrossEntropyChunkBytes(
          fused.getChunkRows(), fused.getTransposeWeight()
                                    ? typeOf(fused.getWeight()).getShape()[0]
                                    : typeOf(fused.getWeight()).getShape()[1]);
    } else if (auto lossGrad = dyn_cast<CrossEntropyGradOp>(op)) {
      bytes += roundUp(crossEntropyScratchBytes(elementsOf(lossGrad.getLabels())));
    }
  }
  SmallVector<SmallVector<SideBuffer, 1>> buffers(n);
  for (int64_t i = 0; i < n; ++i)
    if (kernel[i].bytes > 0)
      buffers[i].push_back(kernel[i]);

  // Mixed precision: every f32 value a GEMM reads gets one bf16 copy, made
  // by its first GEMM and kept until its last; a parameter's is the store's
  // (runtime/src/cuda/Bf16Values.cpp, planBf16Copies). After
  // mt-mixed-precision every GEMM operand is bf16 (an explicit mt.cast
  // where it was f32), and none needs a copy.
  if (options.mixedPrecision) {
    DenseMap<Value, std::pair<int64_t, size_t>> copyAt; // instruction, index
    for (int64_t i = 0; i < n; ++i) {
      auto [a, b] = gemmOperands(stream[i]);
      for (Value v : {a, b}) {
        if (!v || parameterRead(v) ||
            !cast<RankedTensorType>(v.getType()).getElementType().isF32())
          continue;
        auto [it, first] = copyAt.try_emplace(v, i, buffers[i].size());
        if (first)
          buffers[i].push_back({roundUp(2 * elementsOf(v)), i, v});
        else
          buffers[it->second.first][it->second.second].until = i;
      }
    }
  }
  return buffers;
}
