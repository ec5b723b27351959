//===- Differentiate.cpp - Reverse-mode autodiff of a step function -------===//

#include "mt/IR/MtDialect.h"
#include "mt/IR/MtOps.h"
#include "mt/Transforms/Passes.h"

#include "mlir/Dialect/Func/IR/FuncOps.h"
#include "mlir/IR/Builders.h"
#include "llvm/ADT/MapVector.h"

namespace mlir::mt {
#define GEN_PASS_DEF_DIFFERENTIATEPASS
#include "mt/Transforms/Passes.h.inc"
} // namespace mlir::mt

using namespace mlir;
using namespace mlir::mt;

namespace {

/// The gradients built so far: one accumulated value per forward value, and
/// per parameter in the order the backward pass reaches them.
class GradientMap {
public:
  explicit GradientMap(OpBuilder &builder) : builder(builder) {}

  /// Adds `gradient` to what `value` has received.
  void add(Value value, Value gradient) {
    Value &slot = gradients[value];
    slot = slot ? sum(slot, gradient) : gradient;
  }
  void addToParameter(FlatSymbolRefAttr parameter, Value gradient) {
    Value &slot = parameterGradients[parameter];
    slot = slot ? sum(slot, gradient) : gradient;
  }
  Value lookup(Value value) const { return gradients.lookup(value); }
  const llvm::MapVector<Attribute, Value> &parameters() const {
    return parameterGradients;
  }

private:
  Value sum(Value a, Value b) {
    // In the layer of the gradient that arrives (it made `b`).
    Operation *producer = b.getDefiningOp();
    LayerScope layer(builder, producer ? getLayer(producer) : LayerAttr());
    return AddOp::create(builder, b.getLoc(), a.getType(), a, b);
  }

  OpBuilder &builder;
  DenseMap<Value, Value> gradients;
  llvm::MapVector<Attribute, Value> parameterGradients;
};

struct DifferentiatePass
    : public mt::impl::DifferentiatePassBase<DifferentiatePass> {
  using Base::Base;

  void runOnOperation() override {
    auto function = getOperation().lookupSymbol<func::FuncOp>(functionName);
    if (!function) {
      getOperation().emitError()
          << "mt-differentiate: no function named '" << functionName
          << "' to differentiate; pass function=<name>";
      return signalPassFailure();
    }
    if (failed(differentiate(function)))
      return signalPassFailure();
  }

  LogicalResult differentiate(func::FuncOp function);
};

} // namespace

LogicalResult DifferentiatePass::differentiate(func::FuncOp function) {
  if (!function.getBody().hasOneBlock())
    return function.emitOpError()
           << "must have one block to be differentiated, it has "
           << function.getBody().getBlocks().size();
  Block &body = function.getBody().front();
  auto ret = cast<func::ReturnOp>(body.getTerminator());
  auto lossType = ret.getNumOperands() > 0
                      ? dyn_cast<RankedTensorType>(ret.getOperand(0).getType())
                      : RankedTensorType();
  if (!lossType || lossType.getRank() != 0 || !lossType.getElementType().isF32())
    return function.emitOpError()
           << "must return the loss, a tensor<f32>, as its first result to be "
              "differentiated";
  OpBuilder builder(ret);
  Value seed = FillOp::create(builder, ret.getLoc(), lossType,
                              builder.getF64FloatAttr(1.0));
  // The runtime finds the seed by this mark to multiply it by fp16
  // training's loss scale (docs/BundleFormat.md, `loss_seed`).
  seed.getDefiningOp()->setAttr(kLossSeedAttrName, builder.getUnitAttr());
  FailureOr<SmallVector<Value>> inputGradients =
      appendBackwardPass(function, {seed}, {});
  if (failed(inputGradients))
    return failure();
  numGradients += llvm::range_size(body.getOps<AccumulateGradientOp>());
  return success();
}

FailureOr<SmallVector<Value>>
mlir::mt::appendBackwardPass(func::FuncOp function, ArrayRef<Value> seeds,
                             ArrayRef<Value> inputs) {
  Block &body = function.getBody().front();
  auto ret = cast<func::ReturnOp>(body.getTerminator());
  OpBuilder builder(ret);
  GradientMap gradients(builder);
  // Walk the forward ops backwards; the backward ops go before the return, so
  // they are not revisited. Ops made for the seeds are not forward ops.
  SmallVector<Operation *> forward;
  for (Operation &op : body.without_terminator())
    if (llvm::none_of(seeds,
                      [&](Value seed) { return seed.getDefiningOp() == &op; }))
      forward.push_back(&op);
  for (auto [result, seed] : llvm::zip(ret.getOperands(), seeds))
    gradients.add(result, seed);
  for (Operation *op : llvm::reverse(forward)) {
    SmallVector<Value> resultGradients;
    bool reachesLoss = false;
    for (Value result : op->getResults()) {
      resultGradients.push_back(gradients.lookup(result));
      reachesLoss |= static_cast<bool>(resultGradients.back());
    }
    if (!reachesLoss)
      continue;
    if (auto read = dyn_cast<GetParameterOp>(op)) {
      gradients.addToParameter(read.getNameAttr(), resultGradients.front());
      continue;
    }
    // A constant (an mt.fill) has nothing to pass its gradient on to.
    if (op->getNumOperands() == 0)
      continue;
    auto differentiable = dyn_cast<DifferentiableOpInterface>(op);
    if (!differentiable)
      return op->emitOpError()
             << "lies between the parameters and the loss of @"
             << function.getSymName() << " but has no VJP rule";
    // The backward ops of a layer's op belong to its layer.
    LayerScope layer(builder, getLayer(op));
    SmallVector<Value> operandGradients;
    if (failed(differentiable.buildVJP(builder, resultGradients,
                                       operandGradients)))
      return failure();
    for (auto [operand, gradient] :
         llvm::zip_equal(op->getOperands(), operandGradients))
      if (gradient)
        gradients.add(operand, gradient);
  }

  // One accumulation per parameter, in declaration order.
  auto module = function->getParentOfType<ModuleOp>();
  for (auto parameter : module.getOps<ParameterOp>()) {
    auto name = FlatSymbolRefAttr::get(parameter.getSymNameAttr());
    Value gradient = gradients.parameters().lookup(name);
    if (!gradient)
      continue;
    Operation *producer = gradient.getDefiningOp();
    LayerScope layer(builder, producer ? getLayer(producer) : LayerAttr());
    AccumulateGradientOp::create(builder, gradient.getLoc(), name, gradient);
  }
  return llvm::map_to_vector(inputs,
                             [&](Value input) { return gradients.lookup(input); });
}
