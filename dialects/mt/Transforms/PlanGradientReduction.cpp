//===- PlanGradientReduction.cpp - One gradient reduction per iteration ---===//
//
// Megatron-LM reduces the data-parallel gradients once per iteration, after
// the micro-batches have accumulated into one contiguous buffer, not once per
// micro-batch. Partitioning leaves an all-reduce over the data axis on every
// weight gradient of train_step; this pass moves those reductions out of the
// step into functions of their own over the whole buffer.
//
//===----------------------------------------------------------------------===//

#include "mt/IR/MtOps.h"
#include "mt/Transforms/Passes.h"

#include "mlir/Dialect/Func/IR/FuncOps.h"
#include "mlir/Dialect/Shard/IR/ShardOps.h"
#include "llvm/ADT/STLExtras.h"
#include "llvm/Support/MathExtras.h"

#include <numeric>

namespace mlir::mt {
#define GEN_PASS_DEF_PLANGRADIENTREDUCTIONPASS
#include "mt/Transforms/Passes.h.inc"
} // namespace mlir::mt

using namespace mlir;
using namespace mlir::mt;

/// The grid axis of the data-parallel ranks (mt-annotate-shardings).
static constexpr int16_t kDataAxis = 0;

/// Megatron-LM pads the distributed optimizer's buffer so that every rank's
/// shard has the same size and starts aligned (a multiple of 128 elements
/// per rank, for the collectives' bandwidth).
static constexpr int64_t kShardAlignment = 128;

namespace {

struct PlanGradientReductionPass
    : public mt::impl::PlanGradientReductionPassBase<
          PlanGradientReductionPass> {
  using PlanGradientReductionPassBase::PlanGradientReductionPassBase;

  void runOnOperation() override;

private:
  /// Replaces the data-axis all-reduce that produces each gradient result
  /// of `function` by its operand (keeping the reduction over other axes).
  /// Returns the gradients' parameters, in result order.
  FailureOr<SmallVector<std::pair<FlatSymbolRefAttr, RankedTensorType>>>
  deferReductions(func::FuncOp function, shard::GridOp grid);
};

} // namespace

FailureOr<SmallVector<std::pair<FlatSymbolRefAttr, RankedTensorType>>>
PlanGradientReductionPass::deferReductions(func::FuncOp function,
                                           shard::GridOp grid) {
  SmallVector<std::pair<FlatSymbolRefAttr, RankedTensorType>> gradients;
  int64_t dataRanks = grid.getShape()[kDataAxis];
  auto ret = cast<func::ReturnOp>(function.getBody().front().getTerminator());
  for (OpOperand &result : ret->getOpOperands()) {
    auto parameter = function.getResultAttrOfType<FlatSymbolRefAttr>(
        result.getOperandNumber(), "mt.gradient");
    if (!parameter)
      continue;
    auto type = cast<RankedTensorType>(result.get().getType());
    gradients.push_back({parameter, type});
    auto reduce = result.get().getDefiningOp<shard::AllReduceOp>();
    bool overData =
        reduce && llvm::is_contained(reduce.getGridAxes(), kDataAxis);
    if (!overData || reduce.getReduction() != shard::ReductionKind::Sum) {
      if (dataRanks == 1)
        continue;
      return function.emitError()
             << "the gradient of " << parameter
             << " is not summed over the data-parallel grid axis (axis 0 of "
                "size "
             << dataRanks
             << "); every gradient of a data-parallel step must end in one "
                "shard.all_reduce over it, as shard-partition leaves them";
    }
    OpBuilder builder(reduce);
    SmallVector<int16_t> others = llvm::filter_to_vector(
        reduce.getGridAxes(), [](int16_t axis) { return axis != kDataAxis; });
    Value local = reduce.getInput();
    if (!others.empty())
      local = shard::AllReduceOp::create(builder, reduce.getLoc(),
                                         reduce.getType(), reduce.getGridAttr(),
                                         builder.getDenseI16ArrayAttr(others),
                                         local, reduce.getReductionAttr());
    result.set(local);
    if (reduce->use_empty())
      reduce->erase();
  }
  return gradients;
}

void PlanGradientReductionPass::runOnOperation() {
  ModuleOp module = getOperation();
  auto grids = llvm::to_vector(module.getOps<shard::GridOp>());
  if (grids.empty())
    return; // One rank: nothing to reduce, nothing to shard.
  shard::GridOp grid = grids.front();
  int64_t dataRanks = grid.getShape()[kDataAxis];
  if (dataRanks == 1 && !distributedOptimizer)
    return;

  auto step = module.lookupSymbol<func::FuncOp>(trainFunction);
  if (!step) {
    module.emitError() << "no function @" << trainFunction
                       << " to plan the gradient reduction of; name the "
                          "training step with train-function=";
    return signalPassFailure();
  }
  auto gradients = deferReductions(step, grid);
  if (failed(gradients))
    return signalPassFailure();

  // Megatron-LM's contiguous buffer holds the gradients in reverse order of
  // the parameters, the order in which the backward pass produces them.
  llvm::StringMap<int64_t> declared;
  for (auto [index, parameter] : llvm::enumerate(module.getOps<ParameterOp>()))
    declared[parameter.getSymName()] = index;
  llvm::sort(*gradients, [&](const auto &a, const auto &b) {
    return declared.lookup(a.first.getValue()) >
           declared.lookup(b.first.getValue());
  });
  Type elementType;
  int64_t elements = 0;
  SmallVector<int64_t> offsets;
  for (auto &[parameter, type] : *gradients) {
    offsets.push_back(elements);
    if (elementType && type.getElementType() != elementType) {
      step.emitError() << "the gradient of " << parameter << " is "
                       << type.getElementType() << " but earlier ones are "
                       << elementType
                       << "; one gradient buffer holds one element type";
      return signalPassFailure();
    }
    elementType = type.getElementType();
    elements += type.getNumElements();
  }
  if (gradients->empty())
    return;

  int64_t padded = elements;
  if (distributedOptimizer) {
    int64_t multiple = std::lcm(dataRanks, kShardAlignment);
    padded = llvm::alignTo(elements, multiple);
  }
  MLIRContext *context = &getContext();
  SmallVector<Attribute> layout = llvm::map_to_vector(
      *gradients, [](const auto &g) -> Attribute { return g.first; });
  auto layoutAttr = ArrayAttr::get(context, layout);
  auto bufferType = RankedTensorType::get({padded}, elementType);
  auto shardType = RankedTensorType::get({padded / dataRanks}, elementType);
  auto gridRef = FlatSymbolRefAttr::get(grid.getSymNameAttr());
  OpBuilder builder = OpBuilder::atBlockEnd(module.getBody());
  Location loc = step.getLoc();
  auto dataAxis = builder.getDenseI16ArrayAttr({kDataAxis});
  auto sum = shard::ReductionKindAttr::get(context, shard::ReductionKind::Sum);

  auto makeFunction = [&](StringRef name, RankedTensorType input,
                          RankedTensorType output, StringRef layoutName,
                          auto buildBody) {
    auto function = func::FuncOp::create(
        builder, loc, name, builder.getFunctionType({input}, {output}));
    function->setAttr(layoutName, layoutAttr);
    function->setAttr("mt.buffer_offsets",
                      builder.getDenseI64ArrayAttr(offsets));
    Block *body = function.addEntryBlock();
    OpBuilder inner = OpBuilder::atBlockBegin(body);
    Value result = buildBody(inner, body->getArgument(0));
    func::ReturnOp::create(inner, loc, result);
  };
  if (!distributedOptimizer) {
    makeFunction("reduce_gradients", bufferType, bufferType,
                 "mt.gradient_buffer", [&](OpBuilder &b, Value buffer) {
                   return shard::AllReduceOp::create(b, loc, bufferType,
                                                     gridRef, dataAxis, buffer,
                                                     sum)
                       .getResult();
                 });
    return;
  }
  // The distributed optimizer: each data rank receives the sum of its
  // shard of the buffer, updates those elements, and gathers the others.
  makeFunction("reduce_gradients", bufferType, shardType, "mt.gradient_buffer",
               [&](OpBuilder &b, Value buffer) {
                 return shard::ReduceScatterOp::create(
                            b, loc, shardType, gridRef, dataAxis, buffer, sum,
                            b.getIndexAttr(0))
                     .getResult();
               });
  makeFunction("gather_parameters", shardType, bufferType,
               "mt.parameter_buffer", [&](OpBuilder &b, Value shard) {
                 return shard::AllGatherOp::create(b, loc, bufferType, gridRef,
                                                   dataAxis, shard,
                                                   b.getIndexAttr(0))
                     .getResult();
               });
}
