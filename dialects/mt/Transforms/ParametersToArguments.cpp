//===- ParametersToArguments.cpp - Parameters in, gradients out -----------===//

#include "mt/IR/MtOps.h"
#include "mt/Transforms/Passes.h"

#include "mlir/Dialect/Func/IR/FuncOps.h"
#include "mlir/IR/Builders.h"

namespace mlir::mt {
#define GEN_PASS_DEF_PARAMETERSTOARGUMENTSPASS
#include "mt/Transforms/Passes.h.inc"
} // namespace mlir::mt

using namespace mlir;
using namespace mlir::mt;

namespace {

struct ParametersToArgumentsPass
    : public mt::impl::ParametersToArgumentsPassBase<
          ParametersToArgumentsPass> {
  void runOnOperation() override {
    for (auto function : getOperation().getOps<func::FuncOp>())
      convert(function);
  }

  void convert(func::FuncOp function);
};

} // namespace

void ParametersToArgumentsPass::convert(func::FuncOp function) {
  if (function.isExternal())
    return;
  DenseMap<StringAttr, SmallVector<GetParameterOp>> reads;
  SmallVector<AccumulateGradientOp> gradients;
  function.walk([&](Operation *op) {
    if (auto read = dyn_cast<GetParameterOp>(op))
      reads[read.getNameAttr().getAttr()].push_back(read);
    else if (auto gradient = dyn_cast<AccumulateGradientOp>(op))
      gradients.push_back(gradient);
  });

  // Arguments in declaration order, so every step agrees on them.
  Block &body = function.getBody().front();
  for (auto parameter : getOperation().getOps<ParameterOp>()) {
    auto it = reads.find(parameter.getSymNameAttr());
    if (it == reads.end())
      continue;
    unsigned index = function.getNumArguments();
    if (failed(function.insertArgument(
            index, parameter.getTensorType(),
            DictionaryAttr::get(
                &getContext(),
                {NamedAttribute(StringAttr::get(&getContext(), "mt.parameter"),
                                FlatSymbolRefAttr::get(
                                    parameter.getSymNameAttr()))}),
            parameter.getLoc())))
      return signalPassFailure();
    for (GetParameterOp read : it->second) {
      read.replaceAllUsesWith(body.getArgument(index));
      read.erase();
    }
  }

  if (gradients.empty())
    return;
  auto ret = cast<func::ReturnOp>(body.getTerminator());
  SmallVector<Value> results(ret.getOperands());
  for (AccumulateGradientOp gradient : gradients) {
    unsigned index = function.getNumResults();
    if (failed(function.insertResult(
            index, gradient.getGradient().getType(),
            DictionaryAttr::get(
                &getContext(),
                {NamedAttribute(StringAttr::get(&getContext(), "mt.gradient"),
                                gradient.getParameterAttr())}))))
      return signalPassFailure();
    results.push_back(gradient.getGradient());
    gradient.erase();
  }
  OpBuilder builder(ret);
  func::ReturnOp::create(builder, ret.getLoc(), results);
  ret.erase();
}
