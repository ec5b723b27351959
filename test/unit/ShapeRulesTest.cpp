//===- ShapeRulesTest.cpp - Units for the mt dialect's shape rules --------===//

#include "mt/IR/MtShapeRules.h"

#include "mlir/IR/Builders.h"
#include "mlir/IR/MLIRContext.h"

#include "gtest/gtest.h"

using namespace mlir;
using namespace mlir::mt;

namespace {

class ShapeRulesTest : public ::testing::Test {
protected:
  ShapeRulesTest() : builder(&context) {
    context.loadDialect<MtDialect>();
    handler = std::make_unique<ScopedDiagnosticHandler>(
        &context, [this](Diagnostic &diag) {
          messages.push_back(diag.str());
          return success();
        });
  }

  RankedTensorType f32(ArrayRef<int64_t> shape) {
    return RankedTensorType::get(shape, builder.getF32Type());
  }
  RankedTensorType i32(ArrayRef<int64_t> shape) {
    return RankedTensorType::get(shape, builder.getI32Type());
  }
  // Owned here because EmitErrorFn is a non-owning function_ref.
  std::function<InFlightDiagnostic()> emitError = [this] {
    return mlir::emitError(builder.getUnknownLoc());
  };
  EmitErrorFn emitter() { return emitError; }

  MLIRContext context;
  OpBuilder builder;
  std::unique_ptr<ScopedDiagnosticHandler> handler;
  std::vector<std::string> messages;
};

TEST_F(ShapeRulesTest, LinearInOutAndTransposedWeight) {
  auto y = inferLinearType(f32({2, 8, 16}), f32({16, 48}), f32({48}),
                           /*transposeWeight=*/false, emitter());
  ASSERT_TRUE(succeeded(y));
  EXPECT_EQ(*y, f32({2, 8, 48}));
  auto logits = inferLinearType(f32({2, 8, 16}), f32({100, 16}), nullptr,
                                /*transposeWeight=*/true, emitter());
  ASSERT_TRUE(succeeded(logits));
  EXPECT_EQ(*logits, f32({2, 8, 100}));
  EXPECT_TRUE(messages.empty());
}

TEST_F(ShapeRulesTest, LinearNamesBothDimensionsWhenTheyDiffer) {
  EXPECT_TRUE(failed(inferLinearType(f32({2, 8, 16}), f32({32, 48}), nullptr,
                                     false, emitter())));
  ASSERT_EQ(messages.size(), 1u);
  EXPECT_NE(messages[0].find("(16)"), std::string::npos) << messages[0];
  EXPECT_NE(messages[0].find("(32)"), std::string::npos) << messages[0];
}

TEST_F(ShapeRulesTest, GroupedQueryAttentionKeepsQueryHeads) {
  auto out = inferAttentionType(f32({2, 16, 8, 32}), f32({2, 16, 2, 32}),
                                f32({2, 16, 2, 32}), /*causal=*/true,
                                emitter());
  ASSERT_TRUE(succeeded(out));
  EXPECT_EQ(*out, f32({2, 16, 8, 32}));
  EXPECT_TRUE(failed(inferAttentionType(f32({2, 16, 6, 32}),
                                        f32({2, 16, 4, 32}),
                                        f32({2, 16, 4, 32}), true, emitter())));
}

TEST_F(ShapeRulesTest, CrossEntropyReductions) {
  auto mean = inferCrossEntropyType(f32({2, 8, 100}), i32({2, 8}),
                                    LossReduction::Mean, emitter());
  ASSERT_TRUE(succeeded(mean));
  EXPECT_EQ(mean->getRank(), 0);
  auto none = inferCrossEntropyType(f32({2, 8, 100}), i32({2, 8}),
                                    LossReduction::None, emitter());
  ASSERT_TRUE(succeeded(none));
  EXPECT_EQ(*none, f32({2, 8}));
}

TEST_F(ShapeRulesTest, ConcatAndSplitAreInverse) {
  SmallVector<RankedTensorType> pieces = {f32({4, 8, 32}), f32({4, 8, 8}),
                                          f32({4, 8, 8})};
  auto whole = inferConcatType(pieces, /*axis=*/-1, emitter());
  ASSERT_TRUE(succeeded(whole));
  EXPECT_EQ(*whole, f32({4, 8, 48}));
  EXPECT_TRUE(succeeded(verifySplitTypes(*whole, pieces, 2, emitter())));
  EXPECT_TRUE(failed(verifySplitTypes(f32({4, 8, 50}), pieces, 2, emitter())));
}

TEST_F(ShapeRulesTest, TransposeRejectsRepeatedDimensions) {
  auto t = inferTransposeType(f32({2, 3, 4}), {2, 0, 1}, emitter());
  ASSERT_TRUE(succeeded(t));
  EXPECT_EQ(*t, f32({4, 2, 3}));
  EXPECT_TRUE(failed(inferTransposeType(f32({2, 3, 4}), {0, 0, 1}, emitter())));
}

TEST_F(ShapeRulesTest, NegativeAxesCountFromTheEnd) {
  EXPECT_EQ(*normalizeAxis(-1, 3, emitter()), 2);
  EXPECT_EQ(*normalizeAxis(0, 3, emitter()), 0);
  EXPECT_TRUE(failed(normalizeAxis(3, 3, emitter())));
  EXPECT_TRUE(failed(normalizeAxis(-4, 3, emitter())));
}

} // namespace
