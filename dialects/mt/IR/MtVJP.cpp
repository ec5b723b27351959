//===- MtVJP.cpp - The reverse-mode derivative (VJP) rule of each mt op ---===//
//
// One rule per forward op: given the gradients of its results, build the
// gradients of its operands. Where a derivative is itself a forward op (the
// input gradient of linear, dropout with the same mask, rope's inverse
// rotation, reshapes), the rule reuses it; otherwise it emits a backward op
// from MtGradOps.td.
//
//===----------------------------------------------------------------------===//

#include "mt/IR/MtOps.h"

#include "mlir/IR/Builders.h"

using namespace mlir;
using namespace mlir::mt;

#include "mt/IR/MtInterfaces.cpp.inc"

static UnitAttr unitIf(OpBuilder &builder, bool flag) {
  return flag ? builder.getUnitAttr() : UnitAttr();
}

LogicalResult EmbeddingOp::buildVJP(OpBuilder &builder, ValueRange dys,
                                    SmallVectorImpl<Value> &grads) {
  grads.push_back(EmbeddingGradOp::create(builder, getLoc(),
                                          getTable().getType(), dys[0],
                                          getIds(), getVocabShardAxesAttr()));
  grads.push_back(Value());
  return success();
}

LogicalResult LayerNormOp::buildVJP(OpBuilder &builder, ValueRange dys,
                                    SmallVectorImpl<Value> &grads) {
  Type weightType = getWeight().getType();
  auto grad = LayerNormGradOp::create(
      builder, getLoc(), getInput().getType(), weightType,
      getBias() ? weightType : Type(), dys[0], getInput(), getWeight(),
      getEpsilonAttr());
  grads.append({grad.getInputGrad(), grad.getWeightGrad()});
  if (getBias())
    grads.push_back(grad.getBiasGrad());
  return success();
}

LogicalResult RmsNormOp::buildVJP(OpBuilder &builder, ValueRange dys,
                                  SmallVectorImpl<Value> &grads) {
  auto grad = RmsNormGradOp::create(builder, getLoc(), getInput().getType(),
                                    getWeight().getType(), dys[0], getInput(),
                                    getWeight(), getEpsilonAttr());
  grads.append({grad.getInputGrad(), grad.getWeightGrad()});
  return success();
}

LogicalResult LinearOp::buildVJP(OpBuilder &builder, ValueRange dys,
                                 SmallVectorImpl<Value> &grads) {
  Value dy = dys[0];
  bool transposed = getTransposeWeight();
  // dx = dy @ W^T: the same weight read in the other layout.
  grads.push_back(LinearOp::create(builder, getLoc(), getInput().getType(), dy,
                                   getWeight(), Value(),
                                   unitIf(builder, !transposed)));
  grads.push_back(LinearWeightGradOp::create(
      builder, getLoc(), getWeight().getType(), getInput(), dy,
      unitIf(builder, transposed)));
  if (getBias())
    grads.push_back(BiasGradOp::create(builder, getLoc(), getBias().getType(),
                                       dy));
  return success();
}

LogicalResult BiasAddOp::buildVJP(OpBuilder &builder, ValueRange dys,
                                  SmallVectorImpl<Value> &grads) {
  grads.push_back(dys[0]);
  grads.push_back(
      BiasGradOp::create(builder, getLoc(), getBias().getType(), dys[0]));
  return success();
}

LogicalResult MatmulOp::buildVJP(OpBuilder &builder, ValueRange dys,
                                 SmallVectorImpl<Value> &grads) {
  // With Y = op(A) op(B): d op(A) = dY op(B)^T and d op(B) = op(A)^T dY,
  // transposed back when an operand was read transposed.
  Value dy = dys[0], a = getLhs(), b = getRhs();
  bool ta = getTransposeLhs(), tb = getTransposeRhs();
  Location loc = getLoc();
  Value da = ta ? MatmulOp::create(builder, loc, a.getType(), b, dy,
                                   unitIf(builder, tb), builder.getUnitAttr())
                : MatmulOp::create(builder, loc, a.getType(), dy, b, UnitAttr(),
                                   unitIf(builder, !tb));
  Value db = tb ? MatmulOp::create(builder, loc, b.getType(), dy, a,
                                   builder.getUnitAttr(), unitIf(builder, ta))
                : MatmulOp::create(builder, loc, b.getType(), a, dy,
                                   unitIf(builder, !ta), UnitAttr());
  grads.append({da, db});
  return success();
}

LogicalResult AttentionOp::buildVJP(OpBuilder &builder, ValueRange dys,
                                    SmallVectorImpl<Value> &grads) {
  auto grad = AttentionGradOp::create(
      builder, getLoc(), getQuery().getType(), getKey().getType(),
      getValue().getType(), dys[0], getQuery(), getKey(), getValue(),
      getCausalAttr(), getScaleAttr(), getDropoutPAttr(), getSeedAttr());
  grads.append({grad.getQueryGrad(), grad.getKeyGrad(), grad.getValueGrad()});
  return success();
}

LogicalResult RopeOp::buildVJP(OpBuilder &builder, ValueRange dys,
                               SmallVectorImpl<Value> &grads) {
  // A rotation's transpose is the rotation by the negative angle; a scaled
  // one's (attention_factor) is scaled alike.
  grads.push_back(RopeOp::create(
      builder, getLoc(), getType(), dys[0], getBaseAttr(), getRotaryDimAttr(),
      unitIf(builder, !getInverse()), getScalingFactorAttr(),
      getLowFreqFactorAttr(), getHighFreqFactorAttr(),
      getOriginalMaxPositionsAttr(), getBetaFastAttr(), getBetaSlowAttr(),
      getTruncateAttr(), getAttentionFactorAttr()));
  return success();
}

LogicalResult GeluOp::buildVJP(OpBuilder &builder, ValueRange dys,
                               SmallVectorImpl<Value> &grads) {
  grads.push_back(GeluGradOp::create(builder, getLoc(), getType(), dys[0],
                                     getInput(), getApproximateAttr()));
  return success();
}

LogicalResult SiluOp::buildVJP(OpBuilder &builder, ValueRange dys,
                               SmallVectorImpl<Value> &grads) {
  grads.push_back(
      SiluGradOp::create(builder, getLoc(), getType(), dys[0], getInput()));
  return success();
}

LogicalResult SwigluOp::buildVJP(OpBuilder &builder, ValueRange dys,
                                 SmallVectorImpl<Value> &grads) {
  auto grad = SwigluGradOp::create(builder, getLoc(), getType(), getType(),
                                   dys[0], getGate(), getUp());
  grads.append({grad.getGateGrad(), grad.getUpGrad()});
  return success();
}

LogicalResult DropoutOp::buildVJP(OpBuilder &builder, ValueRange dys,
                                  SmallVectorImpl<Value> &grads) {
  // The same seed draws the same mask: dropout is its own VJP.
  grads.push_back(DropoutOp::create(builder, getLoc(), getType(), dys[0],
                                    getPAttr(), getSeedAttr()));
  return success();
}

LogicalResult AddOp::buildVJP(OpBuilder &builder, ValueRange dys,
                              SmallVectorImpl<Value> &grads) {
  grads.append({dys[0], dys[0]});
  return success();
}

LogicalResult MulOp::buildVJP(OpBuilder &builder, ValueRange dys,
                              SmallVectorImpl<Value> &grads) {
  grads.push_back(
      MulOp::create(builder, getLoc(), getType(), dys[0], getRhs()));
  grads.push_back(
      MulOp::create(builder, getLoc(), getType(), dys[0], getLhs()));
  return success();
}

LogicalResult ScaleOp::buildVJP(OpBuilder &builder, ValueRange dys,
                                SmallVectorImpl<Value> &grads) {
  // The factor is a constant (an mt.fill): no gradient of its own.
  grads.push_back(
      ScaleOp::create(builder, getLoc(), getType(), dys[0], getFactor()));
  grads.push_back(Value());
  return success();
}

LogicalResult SoftmaxOp::buildVJP(OpBuilder &builder, ValueRange dys,
                                  SmallVectorImpl<Value> &grads) {
  grads.push_back(SoftmaxGradOp::create(builder, getLoc(), getType(), dys[0],
                                        getResult(), getAxisAttr()));
  return success();
}

LogicalResult CrossEntropyOp::buildVJP(OpBuilder &builder, ValueRange dys,
                                       SmallVectorImpl<Value> &grads) {
  grads.push_back(CrossEntropyGradOp::create(
      builder, getLoc(), getLogits().getType(), dys[0], getLogits(),
      getLabels(), getReductionAttr(), getIgnoreIndexAttr()));
  grads.push_back(Value());
  return success();
}

LogicalResult ReshapeOp::buildVJP(OpBuilder &builder, ValueRange dys,
                                  SmallVectorImpl<Value> &grads) {
  grads.push_back(
      ReshapeOp::create(builder, getLoc(), getInput().getType(), dys[0]));
  return success();
}

LogicalResult TransposeOp::buildVJP(OpBuilder &builder, ValueRange dys,
                                    SmallVectorImpl<Value> &grads) {
  ArrayRef<int64_t> permutation = getPermutation();
  SmallVector<int64_t> inverse(permutation.size());
  for (auto [index, dim] : llvm::enumerate(permutation))
    inverse[dim] = index;
  grads.push_back(TransposeOp::create(builder, getLoc(), getInput().getType(),
                                      dys[0],
                                      builder.getDenseI64ArrayAttr(inverse)));
  return success();
}

LogicalResult SplitOp::buildVJP(OpBuilder &builder, ValueRange dys,
                                SmallVectorImpl<Value> &grads) {
  // Pieces that do not reach the loss contribute zeros.
  SmallVector<Value> pieces;
  for (auto [dy, result] : llvm::zip(dys, getResults()))
    pieces.push_back(dy ? dy
                        : FillOp::create(builder, getLoc(), result.getType(),
                                         builder.getF64FloatAttr(0.0))
                              .getResult());
  grads.push_back(ConcatOp::create(builder, getLoc(), getInput().getType(),
                                   pieces, getAxisAttr()));
  return success();
}

LogicalResult ConcatOp::buildVJP(OpBuilder &builder, ValueRange dys,
                                 SmallVectorImpl<Value> &grads) {
  auto split = SplitOp::create(builder, getLoc(), getInputs().getTypes(),
                               dys[0], getAxisAttr());
  llvm::append_range(grads, split.getResults());
  return success();
}

//===----------------------------------------------------------------------===//
// Mixture of experts
//===----------------------------------------------------------------------===//

LogicalResult MoeRouteOp::buildVJP(OpBuilder &builder, ValueRange dys,
                                   SmallVectorImpl<Value> &grads) {
  // The indices are integers; only the weights carry a gradient, to the
  // logits (the expert bias only selects: it has none).
  if (!dys[0])
    grads.push_back(Value());
  else
    grads.push_back(MoeRouteGradOp::create(
        builder, getLoc(), getLogits().getType(), dys[0], getLogits(),
        getIndices(), getExpertBias(), getTopkAttr(), getScoreFunctionAttr(),
        getNormalizeAttr(), getNumGroupsAttr(), getGroupTopkAttr()));
  if (getExpertBias())
    grads.push_back(Value());
  return success();
}

LogicalResult MoeAuxLossOp::buildVJP(OpBuilder &builder, ValueRange dys,
                                     SmallVectorImpl<Value> &grads) {
  grads.push_back(MoeAuxLossGradOp::create(
      builder, getLoc(), getLogits().getType(), dys[0], getLogits(),
      getTopkAttr(), getScoreFunctionAttr(), getCoeffAttr(),
      getSequenceLengthAttr()));
  return success();
}

LogicalResult MoeZLossOp::buildVJP(OpBuilder &builder, ValueRange dys,
                                   SmallVectorImpl<Value> &grads) {
  grads.push_back(MoeZLossGradOp::create(builder, getLoc(),
                                         getLogits().getType(), dys[0],
                                         getLogits(), getCoeffAttr()));
  return success();
}

LogicalResult MoePermuteOp::buildVJP(OpBuilder &builder, ValueRange dys,
                                     SmallVectorImpl<Value> &grads) {
  // Permutation and unpermutation with the same weights are each other's
  // transpose.
  Value drows = dys[0];
  grads.push_back(MoeUnpermuteOp::create(builder, getLoc(),
                                         getInput().getType(), drows,
                                         getIndices(), getProbs()));
  grads.push_back(Value());
  if (getProbs())
    grads.push_back(MoeProbsGradOp::create(builder, getLoc(),
                                           getProbs().getType(), getInput(),
                                           drows, getIndices()));
  return success();
}

LogicalResult MoeUnpermuteOp::buildVJP(OpBuilder &builder, ValueRange dys,
                                       SmallVectorImpl<Value> &grads) {
  Value dy = dys[0];
  grads.push_back(MoePermuteOp::create(builder, getLoc(), getRows().getType(),
                                       dy, getIndices(), getProbs()));
  grads.push_back(Value());
  if (getProbs())
    grads.push_back(MoeProbsGradOp::create(builder, getLoc(),
                                           getProbs().getType(), dy, getRows(),
                                           getIndices()));
  return success();
}

LogicalResult MoeGroupedLinearOp::buildVJP(OpBuilder &builder, ValueRange dys,
                                           SmallVectorImpl<Value> &grads) {
  Value dy = dys[0];
  bool transposed = getTransposeWeight();
  // dx = dy @ W_e^T per group: the same weights read in the other layout.
  grads.push_back(MoeGroupedLinearOp::create(
      builder, getLoc(), getInput().getType(), dy, getWeight(), getIndices(),
      unitIf(builder, !transposed)));
  grads.push_back(MoeGroupedLinearWeightGradOp::create(
      builder, getLoc(), getWeight().getType(), getInput(), dy, getIndices(),
      unitIf(builder, transposed)));
  grads.push_back(Value());
  return success();
}
