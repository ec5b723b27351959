//===- CostModelTest.cpp - Units for the cost model's op times ------------===//

#include "mt/Transforms/CostModel.h"
#include "megatron/InitAll.h"

#include "mlir/Dialect/Func/IR/FuncOps.h"
#include "mlir/IR/BuiltinOps.h"
#include "mlir/IR/MLIRContext.h"
#include "mlir/Parser/Parser.h"

#include "gtest/gtest.h"

using namespace mlir;

namespace {

// A train step's end: q's weight gradient straight from its GEMM, k's held
// in bf16, v's also read by another op, and a norm's gradient that is an
// argument here (any producer but a weight-gradient GEMM).
constexpr const char *kStep = R"mlir(
func.func @train_step(%x: tensor<2x8x16xf32>, %dy: tensor<2x8x32xf32>,
                      %xb: tensor<2x8x16xbf16>, %dyb: tensor<2x8x32xbf16>,
                      %norm: tensor<16xf32>)
    -> (tensor<32x16xf32> {mt.gradient = @q}, tensor<32x16xbf16> {mt.gradient = @k},
        tensor<32x16xf32> {mt.gradient = @v}, tensor<16xf32> {mt.gradient = @norm},
        tensor<32x16xf32>) {
  %q = mt.linear_weight_grad %x, %dy transpose_weight : (tensor<2x8x16xf32>, tensor<2x8x32xf32>) -> tensor<32x16xf32>
  %k = mt.linear_weight_grad %xb, %dyb transpose_weight : (tensor<2x8x16xbf16>, tensor<2x8x32xbf16>) -> tensor<32x16xbf16>
  %v = mt.linear_weight_grad %x, %dy transpose_weight : (tensor<2x8x16xf32>, tensor<2x8x32xf32>) -> tensor<32x16xf32>
  %twice = mt.add %v, %v : tensor<32x16xf32>
  return %q, %k, %v, %norm, %twice : tensor<32x16xf32>, tensor<32x16xbf16>, tensor<32x16xf32>, tensor<16xf32>, tensor<32x16xf32>
}
)mlir";

class CostModelTest : public ::testing::Test {
protected:
  CostModelTest() {
    DialectRegistry registry;
    megatron::registerAllDialects(registry);
    context.appendDialectRegistry(registry);
    context.loadAllAvailableDialects();
  }

  MLIRContext context;
};

// The runtime adds each returned gradient into its fp32 sum over
// micro-batches, except where the weight gradient's GEMM accumulates into
// the sum itself (the CUDA executor's planGemmAccumulation); the cost model
// prices the same.
TEST_F(CostModelTest, GemmAccumulatedWeightGradientsCostNothingAtTheReturn) {
  OwningOpRef<ModuleOp> module = parseSourceString<ModuleOp>(kStep, &context);
  ASSERT_TRUE(module);
  llvm::Expected<mt::CostModel> model = mt::CostModel::load("");
  ASSERT_TRUE(static_cast<bool>(model)) << llvm::toString(model.takeError());
  auto step = module->lookupSymbol<func::FuncOp>("train_step");
  auto ret = cast<func::ReturnOp>(step.getBody().front().getTerminator());
  auto kernelUs = [&](int64_t bytes) {
    return model->launchUs + double(bytes) / model->memoryBytesPerUs;
  };

  EXPECT_EQ(model->gradientAccumulationMicroseconds(ret.getOperand(0)), 0.0);
  EXPECT_DOUBLE_EQ(model->gradientAccumulationMicroseconds(ret.getOperand(1)),
                   kernelUs(32 * 16 * 2));
  EXPECT_DOUBLE_EQ(model->gradientAccumulationMicroseconds(ret.getOperand(2)),
                   kernelUs(32 * 16 * 4));
  EXPECT_DOUBLE_EQ(model->gradientAccumulationMicroseconds(ret.getOperand(3)),
                   kernelUs(16 * 4));
  // The return is no kernel: it costs the accumulations of its gradients
  // (not of the last result, which is none).
  EXPECT_DOUBLE_EQ(model->opMicroseconds(ret), kernelUs(32 * 16 * 2) +
                                                   kernelUs(32 * 16 * 4) +
                                                   kernelUs(16 * 4));
}

} // namespace
