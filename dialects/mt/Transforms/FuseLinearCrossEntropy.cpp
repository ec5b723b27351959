//===- FuseLinearCrossEntropy.cpp - The loss without whole logits ---------===//
//
// Forms mt.linear_cross_entropy (MtFusedOps.td) from a training step's output
// layer: its linear, cross_entropy, cross_entropy_grad and the two gradient
// GEMMs. The fused op runs where the logits were computed and yields the
// gradients for a loss gradient of one; mt.scale ops multiply them by the
// seed where cross_entropy_grad was, so the backward pass keeps its order.
// On a pipeline's last stage, split into a forward and a backward function,
// the fused op runs in the forward and the two gradients are stashed in
// place of the logits for the backward's scales.
//
// Under tensor parallelism the output layer is split over the vocabulary
// and its loss is the vocabulary-parallel one (vocab_max, all-reduce max,
// vocab_partials, all-reduce sum, vocab_cross_entropy and its gradient):
// the statistics need the whole vocabulary's maximum and sums before any
// gradient exists, so the pass forms three chunked ops in place of the
// three readers of the block's logits (mt.linear_vocab_max,
// mt.linear_vocab_partials, mt.linear_vocab_cross_entropy_grad with the two
// gradient GEMMs), each recomputing a chunk's logits, and leaves the
// all-reduces between them as they are; on a pipeline's last stage the
// statistics ops stay in the forward and the gradient op in the backward,
// and the logits' stash goes.
//
//===----------------------------------------------------------------------===//

#include "mt/IR/MtOps.h"
#include "mt/Transforms/Passes.h"
#include "mt/Transforms/SideBuffers.h"

#include "mlir/Dialect/Func/IR/FuncOps.h"
#include "mlir/Dialect/Shard/IR/ShardOps.h"
#include "mlir/IR/Builders.h"
#include "llvm/ADT/BitVector.h"

#include <map>

namespace mlir::mt {
#define GEN_PASS_DEF_FUSELINEARCROSSENTROPYPASS
#include "mt/Transforms/Passes.h.inc"
} // namespace mlir::mt

using namespace mlir;
using namespace mlir::mt;

namespace {

/// The ops of one output layer that the fused op replaces.
struct OutputLayer {
  LinearOp linear;
  CrossEntropyOp loss;
  CrossEntropyGradOp lossGrad;
  LinearOp inputGrad;
  LinearWeightGradOp weightGrad;
};

/// Whether `value` is defined before `op` in op's block (or is an argument
/// of that block), so that an op built at `op` may read it.
bool availableAt(Value value, Operation *op) {
  if (auto argument = dyn_cast<BlockArgument>(value))
    return argument.getOwner() == op->getBlock();
  Operation *definition = value.getDefiningOp();
  return definition->getBlock() == op->getBlock() &&
         definition->isBeforeInBlock(op);
}

/// The output layer whose logits `linear` computes, when it has exactly
/// the shape the fused op stands for (Passes.td).
std::optional<OutputLayer> matchOutputLayer(LinearOp linear) {
  if (linear.getBias())
    return std::nullopt;
  OutputLayer layer{linear, {}, {}, {}, {}};
  Block *block = linear->getBlock();
  for (Operation *user : linear->getUsers()) {
    if (user->getBlock() != block)
      return std::nullopt;
    if (auto loss = dyn_cast<CrossEntropyOp>(user)) {
      if (layer.loss || loss.getLogits() != linear.getResult())
        return std::nullopt;
      layer.loss = loss;
    } else if (auto grad = dyn_cast<CrossEntropyGradOp>(user)) {
      if (layer.lossGrad || grad.getLogits() != linear.getResult())
        return std::nullopt;
      layer.lossGrad = grad;
    } else {
      return std::nullopt;
    }
  }
  if (!layer.loss || !layer.lossGrad ||
      layer.loss.getReduction() == LossReduction::None ||
      layer.loss.getReduction() != layer.lossGrad.getReduction() ||
      layer.loss.getIgnoreIndex() != layer.lossGrad.getIgnoreIndex() ||
      layer.loss.getLabels() != layer.lossGrad.getLabels() ||
      !availableAt(layer.loss.getLabels(), linear))
    return std::nullopt;
  Value dlogits = layer.lossGrad.getResult();
  for (Operation *user : dlogits.getUsers()) {
    if (auto data = dyn_cast<LinearOp>(user)) {
      // dh = dlogits @ op(W)^T: the weight read the other way round.
      if (layer.inputGrad || data.getInput() != dlogits || data.getBias() ||
          data.getWeight() != linear.getWeight() ||
          data.getTransposeWeight() == linear.getTransposeWeight())
        return std::nullopt;
      layer.inputGrad = data;
    } else if (auto weight = dyn_cast<LinearWeightGradOp>(user)) {
      if (layer.weightGrad || weight.getInput() != linear.getInput() ||
          weight.getOutputGrad() != dlogits ||
          weight.getTransposeWeight() != linear.getTransposeWeight())
        return std::nullopt;
      layer.weightGrad = weight;
    } else {
      return std::nullopt;
    }
  }
  if (!layer.inputGrad || !layer.weightGrad)
    return std::nullopt;
  return layer;
}

/// The vocabulary-parallel output layer: the linear of the rank's
/// vocabulary block read only by vocab_max, vocab_partials and, in a
/// training step, vocab_cross_entropy_grad, whose gradient only the data
/// and weight GEMMs read. On a pipeline's last stage the linear and the
/// statistics are in the forward function, which stashes the logits, and
/// the gradient and its GEMMs in the backward function.
struct VocabOutputLayer {
  LinearOp linear;
  SmallVector<VocabMaxOp> maxima;
  SmallVector<VocabPartialsOp> partials;
  VocabCrossEntropyGradOp lossGrad; // none in evaluation
  LinearOp inputGrad;
  LinearWeightGradOp weightGrad;
  /// The gradient op's input and weight as its function sees them: the
  /// linear's, a stash of its input and the backward's read of the same
  /// parameter, or (sequence parallelism, mt-regather-in-backward) the
  /// same all-gather repeated in the backward pass; and the op the
  /// gradient op is built before, where those exist.
  Value gradInput, gradWeight;
  Operation *gradAt = nullptr;
  /// A regathered input that comes after the loss gradient though its shard
  /// exists before it: moved up to the gradient op rather than holding the
  /// gradient op back past readers of the gradients (under context x
  /// sequence parallelism the data gradient's all-reduce comes first).
  Operation *hoistedGather = nullptr;
  /// Split: the two functions and the logits' stash slot.
  func::FuncOp forward, backward;
  std::optional<unsigned> logitsStash;
};

/// Whether `a` and `b` are the same all-gather of one value
/// (mt-regather-in-backward's copy of a forward gather).
bool sameGather(Value a, Value b) {
  auto first = a.getDefiningOp<shard::AllGatherOp>();
  auto second = b.getDefiningOp<shard::AllGatherOp>();
  return first && second && first.getInput() == second.getInput() &&
         first.getType() == second.getType() &&
         first.getGridAttr() == second.getGridAttr() &&
         first.getGridAxesAttr() == second.getGridAxesAttr() &&
         first.getGatherAxisAttr() == second.getGatherAxisAttr();
}

/// Records `use` of the logits when it is vocab_max's or vocab_partials'.
bool addStatistic(VocabOutputLayer &layer, OpOperand &use) {
  Value logits = layer.linear.getResult();
  if (auto max = dyn_cast<VocabMaxOp>(use.getOwner())) {
    layer.maxima.push_back(max);
    return true;
  }
  auto partials = dyn_cast<VocabPartialsOp>(use.getOwner());
  if (!partials || partials.getLogits() != logits ||
      partials.getMax() == logits)
    return false;
  layer.partials.push_back(partials);
  return true;
}

/// Matches the readers of layer.lossGrad's result: the data gradient, a
/// linear by `isWeight` the other way round, and the weight gradient of
/// `isInput`; places the gradient op. False when they are not exactly
/// those, or a reader of the gradients comes before the gradient op's
/// inputs exist.
bool matchVocabGradients(VocabOutputLayer &layer,
                         function_ref<bool(Value)> isInput,
                         function_ref<bool(Value)> isWeight) {
  LinearOp linear = layer.linear;
  Value dlogits = layer.lossGrad.getResult();
  Block *block = layer.lossGrad->getBlock();
  for (Operation *user : dlogits.getUsers()) {
    if (auto data = dyn_cast<LinearOp>(user)) {
      if (layer.inputGrad || data.getInput() != dlogits || data.getBias() ||
          !isWeight(data.getWeight()) ||
          data.getTransposeWeight() == linear.getTransposeWeight())
        return false;
      layer.inputGrad = data;
    } else if (auto weight = dyn_cast<LinearWeightGradOp>(user)) {
      if (layer.weightGrad || !isInput(weight.getInput()) ||
          weight.getOutputGrad() != dlogits ||
          weight.getTransposeWeight() != linear.getTransposeWeight())
        return false;
      layer.weightGrad = weight;
    } else {
      return false;
    }
  }
  if (!layer.inputGrad || !layer.weightGrad)
    return false;
  // The gradient op goes where the loss gradient was, or right after its
  // input or weight when those come later (a regathered input); every
  // reader of the two gradients must follow it. When a reader comes first
  // (context x sequence parallelism), a regathered input whose shard
  // exists at the loss gradient moves up to the gradient op instead.
  layer.gradInput = layer.weightGrad.getInput();
  layer.gradWeight = layer.inputGrad.getWeight();
  auto place = [&](bool hoist) {
    layer.gradAt = layer.lossGrad;
    layer.hoistedGather = nullptr;
    for (Value operand : {layer.gradInput, layer.gradWeight}) {
      Operation *definition = operand.getDefiningOp();
      if (!definition)
        continue;
      if (definition->getBlock() != block)
        return false;
      if (!layer.gradAt->isBeforeInBlock(definition))
        continue;
      auto gather = dyn_cast<shard::AllGatherOp>(definition);
      if (hoist && operand == layer.gradInput && gather &&
          gather->hasOneUse() &&
          availableAt(gather.getInput(), layer.lossGrad)) {
        layer.hoistedGather = gather;
        continue;
      }
      layer.gradAt = definition->getNextNode();
    }
    for (Operation *gradient :
         {layer.inputGrad.getOperation(), layer.weightGrad.getOperation()})
      for (Operation *user : gradient->getUsers())
        if (user->getBlock() != block ||
            (user != layer.gradAt && !layer.gradAt->isBeforeInBlock(user)))
          return false;
    return true;
  };
  return place(/*hoist=*/false) || place(/*hoist=*/true);
}

std::optional<VocabOutputLayer> matchVocabOutputLayer(LinearOp linear) {
  if (linear.getBias())
    return std::nullopt;
  VocabOutputLayer layer;
  layer.linear = linear;
  for (OpOperand &use : linear.getResult().getUses()) {
    Operation *user = use.getOwner();
    if (user->getBlock() != linear->getBlock())
      return std::nullopt;
    if (addStatistic(layer, use))
      continue;
    auto grad = dyn_cast<VocabCrossEntropyGradOp>(user);
    if (!grad || layer.lossGrad || use.getOperandNumber() != 1 ||
        grad.getReduction() == LossReduction::None)
      return std::nullopt;
    layer.lossGrad = grad;
  }
  if (layer.partials.empty())
    return std::nullopt;
  if (!layer.lossGrad)
    return layer;
  Value input = linear.getInput(), weight = linear.getWeight();
  if (!matchVocabGradients(
          layer, [&](Value v) { return v == input || sameGather(v, input); },
          [&](Value v) { return v == weight; }))
    return std::nullopt;
  return layer;
}

/// The output layer of a pipeline's last stage after mt-split-forward-backward:
/// the linear and cross_entropy in the forward function, which stashes the
/// logits (and the labels and the linear's input) for the backward
/// function's cross_entropy_grad and gradient GEMMs. Stash k is the
/// forward's result k + 1 and the backward's argument k (docs/Pipeline.md).
struct SplitOutputLayer {
  func::FuncOp forward, backward;
  LinearOp linear;
  CrossEntropyOp loss;
  unsigned logitsStash;
  CrossEntropyGradOp lossGrad;
  LinearOp inputGrad;
  LinearWeightGradOp weightGrad;
};

/// The stash index of each value the forward returns after its output.
DenseMap<Value, unsigned> stashIndices(func::FuncOp forward) {
  DenseMap<Value, unsigned> stash;
  Operation *ret = forward.getBody().front().getTerminator();
  for (unsigned i = 1; i < ret->getNumOperands(); ++i)
    stash.try_emplace(ret->getOperand(i), i - 1);
  return stash;
}

/// Whether `backwardValue` is the backward's stash argument of
/// `forwardValue`.
bool isStashOf(Value backwardValue, Value forwardValue,
               const DenseMap<Value, unsigned> &stash,
               func::FuncOp backward) {
  auto found = stash.find(forwardValue);
  return found != stash.end() && found->second + 1 < backward.getNumArguments() &&
         backwardValue == backward.getArgument(found->second);
}

/// The split output layer of `forward` and `backward` (one stage's), when it
/// has exactly the shape the fused op stands for: matchOutputLayer's, with
/// the logits, the labels and the linear's input reaching the backward
/// through the stash only, and the backward's GEMMs reading the same
/// parameter as the forward's.
std::optional<SplitOutputLayer> matchSplitOutputLayer(func::FuncOp forward,
                                                      func::FuncOp backward) {
  DenseMap<Value, unsigned> stash = stashIndices(forward);
  Operation *ret = forward.getBody().front().getTerminator();
  for (LinearOp linear : forward.getOps<LinearOp>()) {
    if (linear.getBias())
      continue;
    SplitOutputLayer layer{forward, backward, linear, {}, 0, {}, {}, {}};
    bool stashed = false, other = false;
    for (OpOperand &use : linear->getUses()) {
      auto loss = dyn_cast<CrossEntropyOp>(use.getOwner());
      if (loss && !layer.loss && loss.getLogits() == linear.getResult()) {
        layer.loss = loss;
      } else if (use.getOwner() == ret && use.getOperandNumber() > 0 &&
                 !stashed) {
        stashed = true;
        layer.logitsStash = use.getOperandNumber() - 1;
      } else {
        other = true;
      }
    }
    if (other || !stashed || !layer.loss ||
        layer.loss.getReduction() == LossReduction::None ||
        layer.logitsStash + 1 >= backward.getNumArguments() ||
        !availableAt(layer.loss.getLabels(), linear))
      continue;
    FlatSymbolRefAttr parameter = parameterRead(linear.getWeight());
    if (!parameter)
      continue;
    // The backward reads the logits once, in cross_entropy_grad.
    Value logits = backward.getArgument(layer.logitsStash);
    if (!logits.hasOneUse())
      continue;
    auto grad = dyn_cast<CrossEntropyGradOp>(*logits.getUsers().begin());
    if (!grad || grad.getLogits() != logits ||
        grad.getReduction() != layer.loss.getReduction() ||
        grad.getIgnoreIndex() != layer.loss.getIgnoreIndex() ||
        !isStashOf(grad.getLabels(), layer.loss.getLabels(), stash, backward))
      continue;
    layer.lossGrad = grad;
    bool matched = true;
    for (Operation *user : grad.getResult().getUsers()) {
      if (auto data = dyn_cast<LinearOp>(user)) {
        if (layer.inputGrad || data.getInput() != grad.getResult() ||
            data.getBias() || parameterRead(data.getWeight()) != parameter ||
            data.getTransposeWeight() == linear.getTransposeWeight())
          matched = false;
        layer.inputGrad = data;
      } else if (auto weight = dyn_cast<LinearWeightGradOp>(user)) {
        if (layer.weightGrad ||
            !isStashOf(weight.getInput(), linear.getInput(), stash,
                       backward) ||
            weight.getOutputGrad() != grad.getResult() ||
            weight.getTransposeWeight() != linear.getTransposeWeight())
          matched = false;
        layer.weightGrad = weight;
      } else {
        matched = false;
      }
    }
    if (matched && layer.inputGrad && layer.weightGrad)
      return layer;
  }
  return std::nullopt;
}

/// The split vocabulary-parallel output layer of `forward` and `backward`
/// (one stage's): the linear and its statistics in the forward, which
/// stashes the logits; in the backward, the stashed logits read only by
/// vocab_cross_entropy_grad, whose gradient the data GEMM (the same
/// parameter) and the weight gradient of the stashed input read.
std::optional<VocabOutputLayer>
matchSplitVocabOutputLayer(func::FuncOp forward, func::FuncOp backward) {
  DenseMap<Value, unsigned> stash = stashIndices(forward);
  Operation *ret = forward.getBody().front().getTerminator();
  for (LinearOp linear : forward.getOps<LinearOp>()) {
    if (linear.getBias())
      continue;
    VocabOutputLayer layer;
    layer.linear = linear;
    layer.forward = forward;
    layer.backward = backward;
    bool other = false;
    for (OpOperand &use : linear->getUses()) {
      if (addStatistic(layer, use))
        continue;
      if (use.getOwner() == ret && use.getOperandNumber() > 0 &&
          !layer.logitsStash)
        layer.logitsStash = use.getOperandNumber() - 1;
      else
        other = true;
    }
    FlatSymbolRefAttr parameter = parameterRead(linear.getWeight());
    if (other || !layer.logitsStash || layer.partials.empty() || !parameter ||
        *layer.logitsStash >= backward.getNumArguments())
      continue;
    Value logits = backward.getArgument(*layer.logitsStash);
    if (!logits.hasOneUse())
      continue;
    auto grad = dyn_cast<VocabCrossEntropyGradOp>(*logits.getUsers().begin());
    if (!grad || grad.getLogits() != logits ||
        grad.getReduction() == LossReduction::None)
      continue;
    layer.lossGrad = grad;
    // The input stashed, or (sequence parallelism) its shard stashed and
    // gathered again in the backward as the forward gathered it.
    Value input = linear.getInput();
    auto isInput = [&](Value v) {
      if (isStashOf(v, input, stash, backward))
        return true;
      auto gather = v.getDefiningOp<shard::AllGatherOp>();
      auto forwardGather = input.getDefiningOp<shard::AllGatherOp>();
      return gather && forwardGather &&
             isStashOf(gather.getInput(), forwardGather.getInput(), stash,
                       backward) &&
             gather.getType() == forwardGather.getType() &&
             gather.getGridAttr() == forwardGather.getGridAttr() &&
             gather.getGridAxesAttr() == forwardGather.getGridAxesAttr() &&
             gather.getGatherAxisAttr() == forwardGather.getGatherAxisAttr();
    };
    if (matchVocabGradients(layer, isInput, [&](Value v) {
          return parameterRead(v) == parameter;
        }))
      return layer;
  }
  return std::nullopt;
}

/// The forward and backward functions of each pipeline stage
/// (mt.pipeline_stage, names ending in _forward and _backward).
SmallVector<std::pair<func::FuncOp, func::FuncOp>>
pipelineStagePairs(ModuleOp module) {
  std::map<int64_t, std::pair<func::FuncOp, func::FuncOp>> byStage;
  for (auto function : module.getOps<func::FuncOp>()) {
    auto stage = function->getAttrOfType<IntegerAttr>("mt.pipeline_stage");
    if (!stage || function.isExternal())
      continue;
    if (function.getSymName().ends_with("_forward"))
      byStage[stage.getInt()].first = function;
    else if (function.getSymName().ends_with("_backward"))
      byStage[stage.getInt()].second = function;
  }
  SmallVector<std::pair<func::FuncOp, func::FuncOp>> pairs;
  for (auto &[stage, pair] : byStage)
    if (pair.first && pair.second)
      pairs.push_back(pair);
  return pairs;
}

/// Tokens per chunk: `rows` when they fit in `chunkBytes` of logits of
/// `logitBytes` each; else as many chunks as the most rows that fit
/// (rounded down to a multiple of 64 when above 64) need, made even: the
/// rows over that count, rounded up to a multiple of 64 when the most that
/// fit is one (so never more than fit). Even chunks: 4 of 8192 of
/// gpt2-124m's 32768 tokens rather than 3 of 10624 and one of 896.
int64_t chooseChunkRows(int64_t rows, int64_t vocab, int64_t chunkRows,
                        int64_t chunkBytes, int64_t logitBytes) {
  if (chunkRows > 0)
    return std::min(chunkRows, rows);
  int64_t fit = std::max<int64_t>(1, chunkBytes / (logitBytes * vocab));
  if (fit > 64)
    fit -= fit % 64;
  if (fit >= rows)
    return rows;
  int64_t chunks = (rows + fit - 1) / fit;
  int64_t even = (rows + chunks - 1) / chunks;
  if (fit % 64 == 0 && even % 64 != 0)
    even += 64 - even % 64;
  return std::min(even, fit);
}

struct FuseLinearCrossEntropyPass
    : mt::impl::FuseLinearCrossEntropyPassBase<FuseLinearCrossEntropyPass> {
  using Base::Base;

  void runOnOperation() override {
    int64_t rows = chunkRows, bytes = chunkBytes;
    if (rows < 0 || bytes < 1) {
      getOperation().emitError()
          << "mt-fuse-linear-cross-entropy: chunk-rows is " << rows
          << " and chunk-bytes " << bytes
          << "; expected chunk-rows >= 0 (0: from chunk-bytes) and "
             "chunk-bytes >= 1";
      return signalPassFailure();
    }
    // mt-mixed-precision, later, types the op as the unfused output layer:
    // under bf16 its input, and so the chunk's logits, are bf16.
    auto model = getOperation()->getAttrOfType<ModelAttr>(kModelAttrName);
    logitBytes = model && model.getPrecision() == "bf16" ? 2 : 4;
    SmallVector<OutputLayer> layers;
    getOperation().walk([&](LinearOp linear) {
      if (std::optional<OutputLayer> layer = matchOutputLayer(linear))
        layers.push_back(*layer);
    });
    for (OutputLayer &layer : layers)
      fuse(layer);
    for (auto [forward, backward] : pipelineStagePairs(getOperation()))
      if (std::optional<SplitOutputLayer> layer =
              matchSplitOutputLayer(forward, backward))
        fuse(*layer);
    SmallVector<VocabOutputLayer> vocabLayers;
    getOperation().walk([&](LinearOp linear) {
      if (std::optional<VocabOutputLayer> layer = matchVocabOutputLayer(linear))
        vocabLayers.push_back(std::move(*layer));
    });
    for (VocabOutputLayer &layer : vocabLayers)
      fuse(layer);
    for (auto [forward, backward] : pipelineStagePairs(getOperation()))
      if (std::optional<VocabOutputLayer> layer =
              matchSplitVocabOutputLayer(forward, backward))
        fuse(*layer);
  }

  /// The vocabulary-parallel case: each reader of the block's logits
  /// becomes its chunked op where it stands, so the all-reduces between
  /// them keep their places; the backward's GEMMs leave with the gradient.
  void fuse(VocabOutputLayer &layer) {
    LinearOp linear = layer.linear;
    auto logits = cast<RankedTensorType>(linear.getType());
    int64_t vocab = logits.getShape().back();
    int64_t rows = logits.getNumElements() / std::max<int64_t>(1, vocab);
    IntegerAttr chunk = OpBuilder(linear).getI64IntegerAttr(
        chooseChunkRows(rows, vocab, chunkRows, chunkBytes, logitBytes));
    Value input = linear.getInput(), weight = linear.getWeight();
    UnitAttr transpose = linear.getTransposeWeightAttr();
    auto fusedLoc = [&](Operation *op) {
      return FusedLoc::get(op->getContext(), {linear->getLoc(), op->getLoc()});
    };
    // The linear's attributes (its layer), then the replaced op's.
    auto copyAttrs = [&](Operation *from, Operation *to) {
      for (Operation *source : {linear.getOperation(), from})
        for (NamedAttribute attr : source->getDiscardableAttrs())
          to->setDiscardableAttr(attr.getName(), attr.getValue());
    };
    for (VocabMaxOp max : layer.maxima) {
      OpBuilder builder(max);
      auto fused =
          LinearVocabMaxOp::create(builder, fusedLoc(max), max.getType(), input,
                                   weight, chunk, transpose);
      copyAttrs(max, fused);
      max.getResult().replaceAllUsesWith(fused.getResult());
      max->erase();
    }
    for (VocabPartialsOp partials : layer.partials) {
      OpBuilder builder(partials);
      auto fused = LinearVocabPartialsOp::create(
          builder, fusedLoc(partials), partials.getType(), input, weight,
          partials.getLabels(), partials.getMax(), chunk, transpose,
          partials.getVocabShardAxesAttr());
      copyAttrs(partials, fused);
      partials.getResult().replaceAllUsesWith(fused.getResult());
      partials->erase();
    }
    if (VocabCrossEntropyGradOp grad = layer.lossGrad) {
      if (layer.hoistedGather)
        layer.hoistedGather->moveBefore(layer.gradAt);
      OpBuilder builder(layer.gradAt);
      auto fused = LinearVocabCrossEntropyGradOp::create(
          builder, fusedLoc(grad), layer.inputGrad.getType(),
          layer.weightGrad.getType(), layer.gradInput, layer.gradWeight,
          grad.getLabels(), grad.getMax(), grad.getPartials(),
          grad.getLossGrad(), grad.getReductionAttr(),
          grad.getIgnoreIndexAttr(), chunk, transpose,
          grad.getVocabShardAxesAttr());
      copyAttrs(grad, fused);
      layer.inputGrad.getResult().replaceAllUsesWith(fused.getInputGrad());
      layer.weightGrad.getResult().replaceAllUsesWith(fused.getWeightGrad());
      layer.inputGrad->erase();
      layer.weightGrad->erase();
      grad->erase();
    }
    if (layer.logitsStash) {
      // The stash slot of the logits, now unread by the backward, goes
      // with the other unread stashes (the input stays stashed for the
      // gradient op).
      Operation *ret = layer.forward.getBody().front().getTerminator();
      ret->setOperand(*layer.logitsStash + 1, input);
      linear->erase();
      syncFunctionTypes(layer.forward, layer.backward);
      dropUnreadStashes(layer.forward, layer.backward);
    } else {
      linear->erase();
    }
    ++numFused;
  }

  /// The fused op in place of `linear` and `loss` (its loss replaces
  /// theirs; the caller erases them).
  LinearCrossEntropyOp formFusedOp(LinearOp linear, CrossEntropyOp loss) {
    auto logits = cast<RankedTensorType>(linear.getType());
    int64_t vocab = logits.getShape().back();
    int64_t rows = logits.getNumElements() / std::max<int64_t>(1, vocab);
    int64_t chunk =
        chooseChunkRows(rows, vocab, chunkRows, chunkBytes, logitBytes);
    OpBuilder builder(linear);
    Location loc =
        FusedLoc::get(linear->getContext(), {linear->getLoc(), loss->getLoc()});
    Value input = linear.getInput(), weight = linear.getWeight();
    auto fused = LinearCrossEntropyOp::create(
        builder, loc, loss.getType(), input.getType(), weight.getType(), input,
        weight, loss.getLabels(), loss.getReductionAttr(),
        loss.getIgnoreIndexAttr(), builder.getI64IntegerAttr(chunk),
        linear.getTransposeWeightAttr());
    for (NamedAttribute attr : linear->getDiscardableAttrs())
      fused->setDiscardableAttr(attr.getName(), attr.getValue());
    loss.getResult().replaceAllUsesWith(fused.getLoss());
    return fused;
  }

  /// The gradients for a loss gradient of one (`unitInputGrad`,
  /// `unitWeightGrad`) times the seed, in place of the backward's gradient
  /// GEMMs, before cross_entropy_grad; erases the three.
  void scaleBySeed(CrossEntropyGradOp lossGrad, LinearOp inputGrad,
                   LinearWeightGradOp weightGrad, Value unitInputGrad,
                   Value unitWeightGrad) {
    OpBuilder builder(lossGrad);
    Value seed = lossGrad.getLossGrad();
    auto scale = [&](Operation *old, Value unit) {
      auto scaled = ScaleOp::create(builder, old->getLoc(), unit.getType(),
                                    unit, seed);
      for (NamedAttribute attr : old->getDiscardableAttrs())
        scaled->setDiscardableAttr(attr.getName(), attr.getValue());
      old->getResult(0).replaceAllUsesWith(scaled.getResult());
    };
    scale(inputGrad, unitInputGrad);
    scale(weightGrad, unitWeightGrad);
    inputGrad->erase();
    weightGrad->erase();
    lossGrad->erase();
  }

  void fuse(OutputLayer &layer) {
    LinearCrossEntropyOp fused = formFusedOp(layer.linear, layer.loss);
    // The seed is the backward pass's; the scaled gradients take the place
    // of cross_entropy_grad, before both of their old producers.
    scaleBySeed(layer.lossGrad, layer.inputGrad, layer.weightGrad,
                fused.getInputGrad(), fused.getWeightGrad());
    layer.loss->erase();
    layer.linear->erase();
    ++numFused;
  }

  /// The split case: the forward stashes the unit gradients, dx in the
  /// logits' slot and dW right after it, and the backward scales them; the
  /// stashes left unread (the labels, the linear's input) are dropped.
  void fuse(SplitOutputLayer &layer) {
    LinearCrossEntropyOp fused = formFusedOp(layer.linear, layer.loss);
    func::FuncOp forward = layer.forward, backward = layer.backward;
    Operation *ret = forward.getBody().front().getTerminator();
    unsigned slot = layer.logitsStash;
    DictionaryAttr stashAttrs = forward.getResultAttrDict(slot + 1);
    ret->setOperand(slot + 1, fused.getInputGrad());
    ret->insertOperands(slot + 2, fused.getWeightGrad());
    Type dxType = fused.getInputGrad().getType(),
         dwType = fused.getWeightGrad().getType();
    if (failed(forward.insertResult(slot + 2, dwType, stashAttrs)) ||
        failed(backward.insertArgument(slot + 1, dwType,
                                       backward.getArgAttrDict(slot),
                                       backward.getArgument(slot).getLoc())))
      return signalPassFailure();
    BlockArgument dx = backward.getArgument(slot);
    dx.setType(dxType);
    layer.loss->erase();
    layer.linear->erase();
    scaleBySeed(layer.lossGrad, layer.inputGrad, layer.weightGrad, dx,
                backward.getArgument(slot + 1));
    syncFunctionTypes(forward, backward);
    dropUnreadStashes(forward, backward);
    ++numFused;
  }

  /// Sets both functions' types from their entry blocks and returns.
  static void syncFunctionTypes(func::FuncOp forward, func::FuncOp backward) {
    for (func::FuncOp function : {forward, backward}) {
      Block &body = function.getBody().front();
      function.setFunctionType(FunctionType::get(
          function.getContext(), body.getArgumentTypes(),
          body.getTerminator()->getOperandTypes()));
    }
  }

  /// Removes each stash the backward no longer reads from both functions.
  void dropUnreadStashes(func::FuncOp forward, func::FuncOp backward) {
    Operation *ret = forward.getBody().front().getTerminator();
    unsigned stashes = ret->getNumOperands() - 1;
    llvm::BitVector results(ret->getNumOperands()), arguments(
                                                        backward.getNumArguments());
    for (unsigned k = 0; k < stashes && k + 1 < backward.getNumArguments(); ++k)
      if (backward.getArgument(k).use_empty()) {
        results.set(k + 1);
        arguments.set(k);
      }
    if (arguments.none())
      return;
    for (int k = static_cast<int>(stashes); k >= 1; --k)
      if (results.test(k))
        ret->eraseOperand(k);
    if (failed(forward.eraseResults(results)) ||
        failed(backward.eraseArguments(arguments)))
      return signalPassFailure();
  }

  /// Bytes of one logit in the chunk: the training precision's.
  int64_t logitBytes = 4;
};

} // namespace
