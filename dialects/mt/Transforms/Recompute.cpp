//===- Recompute.cpp - Clones recomputed forward ops into the backward pass ===//

#include "mt/Transforms/Recompute.h"

#include "mt/IR/MtDialect.h"
#include "mt/IR/MtOps.h"
#include "mt/Transforms/Passes.h"

#include "mlir/IR/Builders.h"
#include "mlir/IR/IRMapping.h"
#include "llvm/ADT/MapVector.h"
#include "llvm/ADT/SetVector.h"

#include <limits>

namespace mlir::mt {
#define GEN_PASS_DEF_RECOMPUTEPASS
#include "mt/Transforms/Passes.h.inc"
} // namespace mlir::mt

using namespace mlir;
using namespace mlir::mt;

std::string RecomputePolicy::str() const {
  switch (granularity) {
  case RecomputeGranularity::None:
    return "none";
  case RecomputeGranularity::Selective:
    return "selective";
  case RecomputeGranularity::Full:
    return std::string("full ") +
           (method == RecomputeMethod::Uniform ? "uniform " : "block ") +
           std::to_string(numLayers);
  }
  return "none";
}

/// The recompute segment of a forward op under `policy`: ops of one segment
/// are recomputed together from the values they read from outside it.
/// Layers count from `firstLayer`, the function's first: a pipeline stage's
/// policy is Megatron-LM's per-stage one.
static std::optional<int64_t> segmentOf(Operation *op,
                                        const RecomputePolicy &policy,
                                        int64_t firstLayer) {
  LayerAttr tag = getLayer(op);
  if (!tag)
    return std::nullopt;
  const int64_t layer = tag.getIndex() - firstLayer;
  switch (policy.granularity) {
  case RecomputeGranularity::None:
    return std::nullopt;
  case RecomputeGranularity::Selective:
    if (!tag.getCoreAttention())
      return std::nullopt;
    return layer;
  case RecomputeGranularity::Full:
    if (policy.method == RecomputeMethod::Uniform)
      return layer / policy.numLayers;
    if (layer >= policy.numLayers)
      return std::nullopt;
    return layer;
  }
  return std::nullopt;
}

/// The scope of a forward op: a segment's result read by a forward op of
/// another scope (or of none) is a checkpoint. Selective recomputation's
/// segments are part of a layer; what the rest of the layer reads (the
/// attention output, for the output projection) is recomputed too.
static std::optional<int64_t> scopeOf(Operation *op,
                                      const RecomputePolicy &policy,
                                      int64_t firstLayer) {
  LayerAttr tag = getLayer(op);
  if (!tag)
    return std::nullopt;
  const int64_t layer = tag.getIndex() - firstLayer;
  if (policy.granularity == RecomputeGranularity::Full &&
      policy.method == RecomputeMethod::Uniform)
    return layer / policy.numLayers;
  return layer;
}

FailureOr<int64_t> mt::recomputeActivations(func::FuncOp function,
                                            const RecomputePolicy &policy) {
  if (policy.granularity == RecomputeGranularity::None)
    return 0;
  if (policy.numLayers <= 0)
    return function.emitOpError()
           << "cannot be recomputed with num-layers " << policy.numLayers
           << "; give a positive number of layers";
  if (!function.getBody().hasOneBlock())
    return function.emitOpError()
           << "must have one block to be recomputed, it has "
           << function.getBody().getBlocks().size();
  Block &body = function.getBody().front();
  auto ret = cast<func::ReturnOp>(body.getTerminator());
  Operation *lossOp = ret.getNumOperands() > 0
                          ? ret.getOperand(0).getDefiningOp()
                          : nullptr;
  if (!lossOp || lossOp->getBlock() != &body)
    return function.emitOpError()
           << "must return a loss computed in its body to be recomputed "
              "(run mt-differentiate first)";

  // Forward ops come up to the loss; the backward pass follows.
  DenseMap<Operation *, int64_t> position;
  for (Operation &op : body)
    position[&op] = position.size();
  const int64_t lossPosition = position[lossOp];
  auto isForward = [&](Operation *op) {
    auto it = position.find(op);
    return it != position.end() && it->second <= lossPosition;
  };
  auto isBackward = [&](Operation *op) {
    auto it = position.find(op);
    return it != position.end() && it->second > lossPosition &&
           !isa<func::ReturnOp>(op);
  };

  // A pipeline stage's layers start where its model part does.
  int64_t firstLayer = std::numeric_limits<int64_t>::max();
  for (Operation &op : body)
    if (LayerAttr tag = getLayer(&op))
      firstLayer = std::min(firstLayer, tag.getIndex());
  if (firstLayer == std::numeric_limits<int64_t>::max() &&
      policy.granularity != RecomputeGranularity::None)
    return function.emitOpError()
           << "has no op with a layer attribute (" << kLayerAttrName
           << " = #mt.layer<i>), which recomputation segments by; the front "
              "end (megatron-compile --emit mlir) tags each layer's ops";

  // Candidates per segment: forward ops with results, but not parameter
  // views (they cost no memory).
  llvm::MapVector<int64_t, SmallVector<Operation *>> segments;
  for (Operation &op : body) {
    if (!isForward(&op))
      break;
    if (op.getNumResults() == 0 || isa<GetParameterOp>(op))
      continue;
    if (std::optional<int64_t> s = segmentOf(&op, policy, firstLayer)) {
      segments[*s].push_back(&op);
    }
  }

  int64_t cloned = 0;
  OpBuilder builder(function.getContext());
  for (auto &[id, ops] : segments) {
    // A result read by a forward op outside the segment is its checkpoint
    // (the next layer's input): it is saved, not recomputed.
    llvm::SetVector<Operation *> members;
    for (Operation *op : ops) {
      bool checkpoint = llvm::any_of(op->getUsers(), [&](Operation *user) {
        if (!isForward(user))
          return false;
        std::optional<int64_t> scope = scopeOf(user, policy, firstLayer);
        return !scope || *scope != id;
      });
      if (!checkpoint)
        members.insert(op);
    }
    // What the backward pass reads, and what computing it needs.
    llvm::SetVector<Operation *> needed;
    SmallVector<Operation *> worklist;
    for (Operation *op : members)
      if (llvm::any_of(op->getUsers(), isBackward))
        worklist.push_back(op);
    while (!worklist.empty()) {
      Operation *op = worklist.pop_back_val();
      if (!needed.insert(op))
        continue;
      for (Value operand : op->getOperands())
        if (Operation *producer = operand.getDefiningOp();
            producer && members.contains(producer))
          worklist.push_back(producer);
    }
    if (needed.empty())
      continue;

    // Right before the first backward op that reads a recomputed value.
    Operation *insertBefore = nullptr;
    for (Operation *op : needed)
      for (Operation *user : op->getUsers())
        if (isBackward(user) &&
            (!insertBefore || position[user] < position[insertBefore]))
          insertBefore = user;
    SmallVector<Operation *> ordered(needed.begin(), needed.end());
    llvm::sort(ordered, [&](Operation *a, Operation *b) {
      return position[a] < position[b];
    });
    builder.setInsertionPoint(insertBefore);
    IRMapping mapping;
    for (Operation *op : ordered) {
      Operation *clone = builder.clone(*op, mapping);
      clone->setAttr(kRecomputedAttrName, builder.getUnitAttr());
      ++cloned;
    }
    for (Operation *op : ordered)
      for (Value result : op->getResults())
        result.replaceUsesWithIf(mapping.lookup(result), [&](OpOperand &use) {
          return isBackward(use.getOwner());
        });
  }
  return cloned;
}

namespace {

struct RecomputePass : public mt::impl::RecomputePassBase<RecomputePass> {
  using Base::Base;

  void runOnOperation() override {
    ModuleOp module = getOperation();
    RecomputePolicy policy;
    if (granularity == "none")
      policy.granularity = RecomputeGranularity::None;
    else if (granularity == "selective")
      policy.granularity = RecomputeGranularity::Selective;
    else if (granularity == "full")
      policy.granularity = RecomputeGranularity::Full;
    else {
      module.emitError() << "mt-recompute: granularity '" << granularity
                         << "' is not none, selective or full";
      return signalPassFailure();
    }
    if (method == "uniform")
      policy.method = RecomputeMethod::Uniform;
    else if (method == "block")
      policy.method = RecomputeMethod::Block;
    else {
      module.emitError() << "mt-recompute: method '" << method
                         << "' is not uniform or block";
      return signalPassFailure();
    }
    policy.numLayers = numLayers;
    SmallVector<func::FuncOp> functions;
    if (stages) {
      std::string prefix = functionName + "_stage";
      for (auto function : module.getOps<func::FuncOp>())
        if (function->hasAttr("mt.pipeline_stage") &&
            function.getSymName().starts_with(prefix))
          functions.push_back(function);
    } else if (auto function =
                   module.lookupSymbol<func::FuncOp>(functionName)) {
      functions.push_back(function);
    }
    if (functions.empty()) {
      module.emitError() << "mt-recompute: no function named '"
                         << functionName << (stages ? "_stage<k>" : "")
                         << "'; pass function=<name>";
      return signalPassFailure();
    }
    for (func::FuncOp function : functions) {
      FailureOr<int64_t> count = recomputeActivations(function, policy);
      if (failed(count))
        return signalPassFailure();
      numRecomputed += *count;
    }
  }
};

} // namespace
