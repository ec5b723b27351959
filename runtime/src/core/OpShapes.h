// What every backend derives from a bundle instruction and its value types:
// kernel dimensions, attention parameters and attribute conversions, so that
// the host and CUDA dispatchers size their kernels the same way.
#ifndef MTRT_SRC_CORE_OPSHAPES_H
#define MTRT_SRC_CORE_OPSHAPES_H

#include "core/Bundle.h"
// The parameter types of the kernel interface; the CUDA kernels share them.
#include "host/kernels/Kernels.h"

#include <cstddef>
#include <cstdint>
#include <vector>

namespace mtrt {

/// shape[begin] * ... * shape[end - 1]; 1 when empty.
int64_t product(const std::vector<int64_t> &shape, size_t begin, size_t end);

/// Embedding, EmbeddingGrad: `count` ids into a [vocab, hidden] table (the
/// table is operand 0 of the forward, result 0 of the gradient).
struct EmbeddingDims {
  int64_t count = 0, vocab = 0, hidden = 0;
};
EmbeddingDims embeddingDims(const Function &fn, const Instruction &inst);

/// LayerNorm, RmsNorm and their gradients: `rows` rows of x normalized over
/// its last axis of size `hidden` (x is operand 0, or 1 for the gradients).
struct NormDims {
  int64_t rows = 0, hidden = 0;
};
NormDims normDims(const Function &fn, const Instruction &inst);

/// Linear, LinearGelu and LinearGeluGrad (x [..., in] and a weight [in, out],
/// or [out, in] with transpose_weight), LinearWeightGrad and
/// LinearWeightBiasGrad (x [..., in], dy [..., out]) and
/// BiasGrad (dy [..., out]; inSize 0): `rows` is the product of the leading
/// axes.
struct LinearDims {
  int64_t rows = 0, inSize = 0, outSize = 0;
};
LinearDims linearDims(const Function &fn, const Instruction &inst);

/// Matmul: `batch` products of [m, k] by [k, n] after the transposes.
struct MatmulDims {
  int64_t batch = 0, m = 0, n = 0, k = 0;
};
MatmulDims matmulDims(const Function &fn, const Instruction &inst);

/// Softmax, SoftmaxGrad: x as [outer, axis, inner] around the attribute axis
/// (x is operand 0, or 1 for the gradient).
struct SoftmaxDims {
  int64_t outer = 0, axis = 0, inner = 0;
};
SoftmaxDims softmaxDims(const Function &fn, const Instruction &inst);

/// CrossEntropy, CrossEntropyGrad: where the logits and labels are among the
/// operands, `rows` labels over a vocabulary of `vocab`.
struct CrossEntropyDims {
  size_t logitsAt = 0, labelsAt = 0;
  int64_t rows = 0, vocab = 0;
};
CrossEntropyDims crossEntropyDims(const Function &fn, const Instruction &inst);

/// Rope: x [batch, seq, heads, headDim], the first `rotary` features rotated.
struct RopeDims {
  int64_t batch = 0, seq = 0, heads = 0, headDim = 0, rotary = 0;
};
RopeDims ropeDims(const Function &fn, const Instruction &inst);
/// Rope's base and frequency scaling, as the kernels take them.
RopeFrequencies ropeFrequencies(const Attributes &attrs);

/// Split, Concat: the whole value (operand 0 of a split, result 0 of a
/// concat) as [outer, axis, inner], `inner` in elements.
struct SplitDims {
  int64_t whole = 0;
  size_t axis = 0;
  int64_t outer = 0, inner = 0;
};
SplitDims splitDims(const Function &fn, const Instruction &inst);

/// Attention, AttentionGrad, AttentionBlock, AttentionBlockGrad: the shapes
/// of q, k and v (operands 0-2, or 1-3 after the gradient's dy) and the
/// attributes; the dropout is keyed on the samples from `firstSample` (the
/// global micro-batch's row 0; a tile's offsets: setAttentionTile).
host::AttentionParams attentionParams(const Function &fn,
                                      const Instruction &inst,
                                      uint64_t firstSample);

/// Where value `value` (an operand of a random op) lies in its global
/// tensor, from the instruction's split_axes and the rank's grid
/// coordinates (the whole value without split_axes).
host::GlobalTile globalTile(const Function &fn, const Instruction &inst,
                            int64_t value, const std::vector<int64_t> &grid,
                            const std::vector<int64_t> &coordinates);

/// The MaskTile (core/Random.h) of dropout instruction `inst` on the rank
/// with grid coordinates `coordinates` (empty: one rank), in the run whose
/// global micro-batch starts at sample `firstSample`: its operand's global
/// tile, dimension 0 the samples.
random::MaskTile dropoutMaskTile(const Function &fn, const Instruction &inst,
                                 const std::vector<int64_t> &grid,
                                 const std::vector<int64_t> &coordinates,
                                 uint64_t firstSample);

/// Attention's dropout over the global probabilities: sets `p`'s batch and
/// head offsets from q's tile (q [batch, seq, heads, head_dim] may be split
/// along batch and heads; operand 0, or 1 of AttentionGrad).
void setAttentionTile(host::AttentionParams &p, const Function &fn,
                      const Instruction &inst, const std::vector<int64_t> &grid,
                      const std::vector<int64_t> &coordinates);

host::LossReduction toKernel(Reduction reduction);
host::GeluApproximation toKernel(GeluApproximate approximate);

} // namespace mtrt

#endif // MTRT_SRC_CORE_OPSHAPES_H
