// Kernel dimensions and parameters from bundle instructions (core/OpShapes.h).
#include "core/OpShapes.h"

#include "core/Error.h"

#include <string>

namespace mtrt {

namespace {

const std::vector<int64_t> &shapeOf(const Function &fn, int64_t value) {
  return fn.values[value].shape;
}

} // namespace

int64_t product(const std::vector<int64_t> &shape, size_t begin, size_t end) {
  int64_t n = 1;
  for (size_t i = begin; i < end; ++i)
    n *= shape[i];
  return n;
}

EmbeddingDims embeddingDims(const Function &fn, const Instruction &inst) {
  const auto &table = shapeOf(
      fn, inst.op == Op::EmbeddingGrad ? inst.results[0] : inst.operands[0]);
  EmbeddingDims d;
  d.count = fn.values[inst.operands[1]].numElements;
  d.vocab = table[0];
  d.hidden = table[1];
  return d;
}

NormDims normDims(const Function &fn, const Instruction &inst) {
  bool grad = inst.op == Op::LayerNormGrad || inst.op == Op::RmsNormGrad;
  int64_t x = inst.operands[grad ? 1 : 0];
  NormDims d;
  d.hidden = shapeOf(fn, x).back();
  d.rows = d.hidden ? fn.values[x].numElements / d.hidden : 0;
  return d;
}

LinearDims linearDims(const Function &fn, const Instruction &inst) {
  const Attributes &a = inst.attrs;
  const auto &first = shapeOf(fn, inst.operands[0]);
  LinearDims d;
  switch (inst.op) {
  case Op::Linear:
  case Op::LinearGelu:
  case Op::LinearGeluGrad:
  case Op::LinearAdd: {
    const auto &w = shapeOf(fn, inst.operands[1]);
    d.inSize = a.transposeWeight ? w[1] : w[0];
    d.outSize = a.transposeWeight ? w[0] : w[1];
    d.rows = d.inSize ? fn.values[inst.operands[0]].numElements / d.inSize
                      : product(first, 0, first.size() - 1);
    break;
  }
  case Op::LinearWeightGrad:
  case Op::LinearWeightBiasGrad:
    d.inSize = first.back();
    d.outSize = shapeOf(fn, inst.operands[1]).back();
    d.rows = product(first, 0, first.size() - 1);
    break;
  default: // BiasGrad
    d.outSize = first.back();
    d.rows = product(first, 0, first.size() - 1);
    break;
  }
  return d;
}

MatmulDims matmulDims(const Function &fn, const Instruction &inst) {
  const Attributes &a = inst.attrs;
  const auto &l = shapeOf(fn, inst.operands[0]);
  const auto &r = shapeOf(fn, inst.operands[1]);
  size_t rank = l.size();
  MatmulDims d;
  d.batch = product(l, 0, rank - 2);
  d.m = a.transposeLhs ? l[rank - 1] : l[rank - 2];
  d.k = a.transposeLhs ? l[rank - 2] : l[rank - 1];
  d.n = a.transposeRhs ? r[rank - 2] : r[rank - 1];
  return d;
}

SoftmaxDims softmaxDims(const Function &fn, const Instruction &inst) {
  const auto &x =
      shapeOf(fn, inst.operands[inst.op == Op::SoftmaxGrad ? 1 : 0]);
  size_t axis = static_cast<size_t>(inst.attrs.axis);
  SoftmaxDims d;
  d.outer = product(x, 0, axis);
  d.axis = x[axis];
  d.inner = product(x, axis + 1, x.size());
  return d;
}

CrossEntropyDims crossEntropyDims(const Function &fn, const Instruction &inst) {
  bool grad = inst.op == Op::CrossEntropyGrad;
  CrossEntropyDims d;
  d.logitsAt = grad ? 1 : 0;
  d.labelsAt = grad ? 2 : 1;
  d.vocab = shapeOf(fn, inst.operands[d.logitsAt]).back();
  d.rows = fn.values[inst.operands[d.labelsAt]].numElements;
  return d;
}

RopeFrequencies ropeFrequencies(const Attributes &attrs) {
  RopeFrequencies r(attrs.base);
  r.factor = attrs.scalingFactor;
  r.lowFreqFactor = attrs.lowFreqFactor;
  r.highFreqFactor = attrs.highFreqFactor;
  r.originalMaxPositions = static_cast<double>(attrs.originalMaxPositions);
  r.betaFast = attrs.betaFast;
  r.betaSlow = attrs.betaSlow;
  r.truncate = attrs.truncate;
  r.attentionFactor = attrs.attentionFactor;
  return r;
}

RopeDims ropeDims(const Function &fn, const Instruction &inst) {
  const auto &x = shapeOf(fn, inst.operands[0]);
  RopeDims d;
  d.batch = x[0];
  d.seq = x[1];
  d.heads = x[2];
  d.headDim = x[3];
  d.rotary = inst.attrs.rotaryDim.value_or(x[3]);
  return d;
}

SplitDims splitDims(const Function &fn, const Instruction &inst) {
  SplitDims d;
  d.whole = inst.op == Op::Split ? inst.operands[0] : inst.results[0];
  const auto &whole = shapeOf(fn, d.whole);
  d.axis = static_cast<size_t>(inst.attrs.axis);
  d.outer = product(whole, 0, d.axis);
  d.inner = product(whole, d.axis + 1, whole.size());
  return d;
}

host::AttentionParams attentionParams(const Function &fn,
                                      const Instruction &inst,
                                      uint64_t firstSample) {
  size_t first =
      inst.op == Op::AttentionGrad || inst.op == Op::AttentionBlockGrad ? 1 : 0;
  const auto &q = shapeOf(fn, inst.operands[first]);
  const auto &k = shapeOf(fn, inst.operands[first + 1]);
  const auto &v = shapeOf(fn, inst.operands[first + 2]);
  const Attributes &a = inst.attrs;
  host::AttentionParams p;
  p.batch = q[0];
  p.seqQ = q[1];
  p.headsQ = q[2];
  p.headDim = q[3];
  p.seqK = k[1];
  p.headsKv = k[2];
  p.headDimV = v[3];
  p.causal = a.causal;
  p.scale = a.scale.value_or(0.0);
  p.dropoutP = a.dropoutP;
  p.seed = static_cast<uint64_t>(a.seed);
  p.firstSample = firstSample;
  return p;
}

host::GlobalTile globalTile(const Function &fn, const Instruction &inst,
                            int64_t value, const std::vector<int64_t> &grid,
                            const std::vector<int64_t> &coordinates) {
  host::GlobalTile tile;
  tile.localShape = shapeOf(fn, value);
  for (size_t d = 0; d < tile.localShape.size(); ++d) {
    bool split = !inst.attrs.splitAxes.empty() && !coordinates.empty();
    const std::vector<int64_t> none;
    const std::vector<int64_t> &axes = split ? inst.attrs.splitAxes[d] : none;
    tile.globalShape.push_back(tile.localShape[d] * gridGroupSize(grid, axes));
    tile.offsets.push_back(split ? tile.localShape[d] *
                                       gridGroupIndex(grid, coordinates, axes)
                                 : 0);
  }
  return tile;
}

random::MaskTile dropoutMaskTile(const Function &fn, const Instruction &inst,
                                 const std::vector<int64_t> &grid,
                                 const std::vector<int64_t> &coordinates,
                                 uint64_t firstSample) {
  host::GlobalTile tile =
      globalTile(fn, inst, inst.operands[0], grid, coordinates);
  random::MaskTile mask;
  if (!random::makeMaskTile(
          tile.localShape.data(), tile.globalShape.data(), tile.offsets.data(),
          static_cast<unsigned>(tile.localShape.size()), firstSample, mask))
    throw Error(MTRT_STATUS_INVALID_ARGUMENT,
                "dropout of a tensor of " +
                    std::to_string(tile.localShape.size()) +
                    " dimensions split across ranks: its mask tile has more "
                    "than " +
                    std::to_string(random::kMaskTileDims) +
                    " split dimensions per sample");
  return mask;
}

void setAttentionTile(host::AttentionParams &p, const Function &fn,
                      const Instruction &inst, const std::vector<int64_t> &grid,
                      const std::vector<int64_t> &coordinates) {
  if (inst.attrs.splitAxes.empty() || coordinates.empty())
    return;
  size_t q =
      inst.op == Op::AttentionGrad || inst.op == Op::AttentionBlockGrad ? 1 : 0;
  host::GlobalTile tile =
      globalTile(fn, inst, inst.operands[q], grid, coordinates);
  p.batchOffset = tile.offsets[0];
  p.headOffset = tile.offsets[2];
  p.globalHeadsQ = tile.globalShape[2];
}

host::LossReduction toKernel(Reduction reduction) {
  switch (reduction) {
  case Reduction::Mean:
    return host::LossReduction::Mean;
  case Reduction::Sum:
    return host::LossReduction::Sum;
  case Reduction::None:
    break;
  }
  return host::LossReduction::None;
}

host::GeluApproximation toKernel(GeluApproximate approximate) {
  return approximate == GeluApproximate::Tanh ? host::GeluApproximation::Tanh
                                              : host::GeluApproximation::None;
}

} // namespace mtrt
