//===- SideBuffers.cpp - The CUDA backend's blocks besides the values ------===//
//
// Each op's sizes are runtime/src/core/OpScratch.h's, the one definition the
// CUDA backend uses too (runtime/src/core/ScratchPlan.cpp); what is read off
// the IR here (dimensions, which attention pairs with which gradient) is
// what ScratchPlan reads off the bundle, and the runtime checks at load time
// that each block here is at least what it needs (test/Target/Bundle/
// cuda-plan-check.test runs that check on compiled bundles).
//
//===----------------------------------------------------------------------===//

#include "mt/Transforms/SideBuffers.h"

#include "mt/IR/MtCastOp.h"
#include "mt/IR/MtOps.h"
#include "mt/Transforms/MemoryPlan.h"

#include "core/OpScratch.h"

#include "mlir/IR/BuiltinTypes.h"
#include "mlir/Interfaces/FunctionInterfaces.h"
#include "llvm/ADT/DenseMap.h"

#include <algorithm>

using namespace mlir;
using namespace mlir::mt;
namespace scratch = mtrt::scratch;

static_assert(scratch::kAlignment == kArenaAlignment,
              "the plan's blocks are aligned as the scratch pieces are");

namespace {

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

/// runtime/src/core/OpShapes.cpp attentionParams: q, k, v are
/// [batch, sequence, heads, head dimension].
struct AttentionShape {
  scratch::AttentionShape dims;
  double scale;
  int64_t seed;

  bool operator==(const AttentionShape &o) const {
    const scratch::AttentionShape &a = dims, &b = o.dims;
    return a.batch == b.batch && a.seqQ == b.seqQ && a.headsQ == b.headsQ &&
           a.headDim == b.headDim && a.seqK == b.seqK &&
           a.headsKv == b.headsKv && a.headDimV == b.headDimV &&
           a.causal == b.causal && a.dropoutP == b.dropoutP &&
           scale == o.scale && seed == o.seed;
  }
};

template <typename AttentionLike>
AttentionShape attentionShape(AttentionLike op) {
  ArrayRef<int64_t> q = typeOf(op.getQuery()).getShape();
  ArrayRef<int64_t> k = typeOf(op.getKey()).getShape();
  ArrayRef<int64_t> v = typeOf(op.getValue()).getShape();
  std::optional<APFloat> scale = op.getScale();
  scratch::AttentionShape dims;
  dims.batch = q[0];
  dims.seqQ = q[1];
  dims.headsQ = q[2];
  dims.headDim = q[3];
  dims.seqK = k[1];
  dims.headsKv = k[2];
  dims.headDimV = v[3];
  dims.causal = op.getCausal();
  dims.dropoutP = op.getDropoutP().convertToDouble();
  return {dims, scale ? scale->convertToDouble() : 0.0,
          static_cast<int64_t>(op.getSeed())};
}

/// The flash kernels run under mixed precision, for the shapes they take.
bool runsFlash(const AttentionShape &p, const SideBufferOptions &options) {
  return options.mixedPrecision &&
         scratch::flashAttentionUnsupportedReason(p.dims).empty();
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

/// runtime/src/core/ScratchPlan.cpp gemmBf16VectorColumns: the bias vector
/// a GEMM with a bf16 result keeps in its block, in bf16 elements, else 0.
int64_t bf16VectorColumns(Operation *op) {
  RankedTensorType result = typeOf(op->getResult(0));
  if (!result.getElementType().isBF16())
    return 0;
  bool bias = (isa<LinearOp, LinearGeluOp>(op) && op->getNumOperands() == 3) ||
              (isa<LinearAddOp>(op) && op->getNumOperands() == 4);
  return bias ? result.getShape().back() : 0;
}

} // namespace

bool mt::readsGemmOperands(Operation *op) {
  return isa_and_nonnull<LinearOp, LinearGeluOp, LinearGeluGradOp, LinearAddOp,
                         MatmulOp, LinearWeightGradOp, LinearWeightBiasGradOp>(
      op);
}

bool mt::runsFlashAttention(Operation *op, const SideBufferOptions &options) {
  if (auto attention = dyn_cast_or_null<AttentionOp>(op))
    return runsFlash(attentionShape(attention), options);
  if (auto grad = dyn_cast_or_null<AttentionGradOp>(op))
    return runsFlash(attentionShape(grad), options);
  return false;
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
    bool paired = partner[i] >= 0;
    if (isa<LayerNormGradOp, RmsNormGradOp>(op)) {
      Value x = op->getOperand(1);
      bytes += scratch::normGradOpBytes(rowsOf(x), typeOf(x).getShape().back(),
                                        op->getNumResults() == 3);
    } else if (readsGemmOperands(op)) {
      // A bias gradient's column sums (linear_gelu_grad's kernel, or a
      // BGRAD epilogue's in case cuBLASLt cannot do them), a bf16 result's
      // bias vector, then cuBLASLt's workspace.
      uint64_t epilogue = 0;
      if (isa<LinearWeightBiasGradOp>(op) ||
          (isa<LinearGeluGradOp>(op) && op->getNumResults() == 2)) {
        auto [rows, columns] = biasGradDims(op);
        epilogue = scratch::biasGradOpBytes(rows, columns);
      }
      epilogue += scratch::gemmBf16VectorBytes(bf16VectorColumns(op));
      bytes += scratch::gemmOpBytes(epilogue);
    } else if (isa<BiasGradOp>(op)) {
      Value dy = op->getOperand(0);
      bytes += scratch::biasGradOpBytes(rowsOf(dy), typeOf(dy).getShape().back());
    } else if (auto group = dyn_cast<FusedOp>(op)) {
      // Each column sum's partial rows, one after another.
      for (Operation &inner : group.getBody().front().without_terminator())
        if (auto sum = dyn_cast<BiasGradOp>(inner)) {
          Value dy = sum.getOutputGrad();
          bytes += scratch::biasGradOpBytes(rowsOf(dy),
                                            typeOf(dy).getShape().back());
        }
    } else if (auto embeddingGrad = dyn_cast<EmbeddingGradOp>(op)) {
      Value ids = embeddingGrad.getIds();
      bytes += scratch::embeddingGradOpBytes(
          elementsOf(ids), typeOf(ids).getElementType().isInteger(64));
    } else if (auto attention = dyn_cast<AttentionOp>(op)) {
      AttentionShape p = attentionShape(attention);
      bytes +=
          scratch::attentionOpBytes(p.dims, runsFlash(p, options), paired,
                                    options.heldAttentionOutputs.contains(op));
    } else if (auto grad = dyn_cast<AttentionGradOp>(op)) {
      AttentionShape p = attentionShape(grad);
      bytes +=
          scratch::attentionGradOpBytes(p.dims, runsFlash(p, options), paired);
    } else if (auto rope = dyn_cast<RopeOp>(op)) {
      ArrayRef<int64_t> x = typeOf(rope.getInput()).getShape();
      int64_t rotary = rope.getRotaryDim() ? int64_t(*rope.getRotaryDim())
                                           : x[3];
      bytes += scratch::ropeOpBytes(x[1], rotary);
    } else if (auto loss = dyn_cast<CrossEntropyOp>(op)) {
      bytes += scratch::crossEntropyOpBytes(elementsOf(loss.getLabels()),
                                            paired);
    } else if (isa<LinearCrossEntropyOp, LinearVocabMaxOp,
                   LinearVocabPartialsOp, LinearVocabCrossEntropyGradOp>(op)) {
      // The chunked output layers: one chunk's logits in the input's type
      // (x and W are operands 0 and 1 of each).
      RankedTensorType weight = typeOf(op->getOperand(1));
      bool transpose = op->hasAttr("transpose_weight");
      bytes += scratch::linearCrossEntropyOpBytes(
          cast<IntegerAttr>(op->getAttr("chunk_rows")).getInt(),
          weight.getShape()[transpose ? 0 : 1],
          typeOf(op->getOperand(0)).getElementType().getIntOrFloatBitWidth() /
              8);
    } else if (auto lossGrad = dyn_cast<CrossEntropyGradOp>(op)) {
      bytes += scratch::crossEntropyOpBytes(elementsOf(lossGrad.getLabels()),
                                            /*paired=*/false);
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
          buffers[i].push_back(
              {int64_t(scratch::roundUp(2 * elementsOf(v))), i, v});
        else
          buffers[it->second.first][it->second.second].until = i;
      }
    }
  }
  return buffers;
}
