//===- MtShapeRules.h - Result types of mt ops, from their operands -*- C++ -*-===//
//
// The one place where the mt dialect's shape rules live. Verifiers call these
// to check an op; front ends call them to build one. Each function reports a
// broken rule through `emitError`, naming the values and what was expected.
//
//===----------------------------------------------------------------------===//

#ifndef MT_IR_MTSHAPERULES_H
#define MT_IR_MTSHAPERULES_H

#include "mt/IR/MtDialect.h"

#include "mlir/IR/BuiltinTypes.h"
#include "mlir/IR/Diagnostics.h"
#include "llvm/ADT/STLFunctionalExtras.h"

namespace mlir::mt {

using EmitErrorFn = llvm::function_ref<InFlightDiagnostic()>;

/// Whether two floating-point element types may meet in one op: equal, or
/// one of them f32 and the other bf16 or f16 (mixed precision: a kernel
/// computes in f32 and reads or writes each operand and result in its own
/// type; `mt-mixed-precision` makes such ops). f64 never mixes.
bool areMixablePrecisions(Type a, Type b);

/// Whether `actual` is the shape rule's `expected` type, or the same shape
/// with an element type mixable with the expected one.
bool matchesUpToPrecision(Type actual, Type expected);

/// Returns `axis` in [0, rank), accepting negative axes counted from the end.
FailureOr<int64_t> normalizeAxis(int64_t axis, int64_t rank,
                                 EmitErrorFn emitError);

/// `table` is vocabulary x hidden; the result is ids.shape x hidden.
FailureOr<RankedTensorType> inferEmbeddingType(RankedTensorType table,
                                               RankedTensorType ids,
                                               EmitErrorFn emitError);

/// Layer and RMS norm, and bias_add: weight and bias (either may be null) are
/// [last dim of input].
FailureOr<RankedTensorType> inferNormType(RankedTensorType input,
                                          RankedTensorType weight,
                                          RankedTensorType bias,
                                          EmitErrorFn emitError);

/// input [..., in] times weight [in, out] ([out, in] when transposed), plus
/// an optional bias [out] (may be null).
FailureOr<RankedTensorType> inferLinearType(RankedTensorType input,
                                            RankedTensorType weight,
                                            RankedTensorType bias,
                                            bool transposeWeight,
                                            EmitErrorFn emitError);

/// [..., m, k] times [..., k, n] with equal batch dimensions.
FailureOr<RankedTensorType> inferMatmulType(RankedTensorType lhs,
                                            RankedTensorType rhs,
                                            bool transposeLhs,
                                            bool transposeRhs,
                                            EmitErrorFn emitError);

/// q [b, sq, hq, d], k [b, sk, hkv, d], v [b, sk, hkv, dv] -> [b, sq, hq, dv].
FailureOr<RankedTensorType> inferAttentionType(RankedTensorType query,
                                               RankedTensorType key,
                                               RankedTensorType value,
                                               bool causal,
                                               EmitErrorFn emitError);

/// logits [..., vocab], labels [...] -> f32 scalar, or f32 [...] for `none`.
FailureOr<RankedTensorType>
inferCrossEntropyType(RankedTensorType logits, RankedTensorType labels,
                      LossReduction reduction, EmitErrorFn emitError);

/// Result dimension i is input dimension permutation[i].
FailureOr<RankedTensorType> inferTransposeType(RankedTensorType input,
                                               ArrayRef<int64_t> permutation,
                                               EmitErrorFn emitError);

/// Joins `inputs` along `axis`.
FailureOr<RankedTensorType> inferConcatType(ArrayRef<RankedTensorType> inputs,
                                            int64_t axis,
                                            EmitErrorFn emitError);

/// Checks that the pieces of a split of `input` along `axis` cover it.
LogicalResult verifySplitTypes(RankedTensorType input,
                               ArrayRef<RankedTensorType> pieces, int64_t axis,
                               EmitErrorFn emitError);

/// Mixture of experts (MtMoeOps.td). Router logits [T, E] with `topk` in
/// [1, E] -> the routing weights [T, topk] (the logits' element type); the
/// indices are the same shape in i32.
FailureOr<RankedTensorType> inferMoeRouteType(RankedTensorType logits,
                                              int64_t topk,
                                              EmitErrorFn emitError);

/// The routing indices [T, K] (i32) and, when given, weights [T, K] beside
/// `tokens` tokens (-1: any count).
LogicalResult verifyMoeRouting(RankedTensorType indices, RankedTensorType probs,
                               int64_t tokens, EmitErrorFn emitError);

/// input [T, H], indices [T, K] (probs [T, K] or null) -> [T * K, H].
FailureOr<RankedTensorType> inferMoePermuteType(RankedTensorType input,
                                                RankedTensorType indices,
                                                RankedTensorType probs,
                                                EmitErrorFn emitError);

/// rows [T * K, H], indices [T, K] (probs [T, K] or null) -> [T, H].
FailureOr<RankedTensorType> inferMoeUnpermuteType(RankedTensorType rows,
                                                  RankedTensorType indices,
                                                  RankedTensorType probs,
                                                  EmitErrorFn emitError);

/// input [T * K, in] times weight [E, in, out] ([E, out, in] transposed)
/// grouped by indices [T, K] -> [T * K, out].
FailureOr<RankedTensorType>
inferMoeGroupedLinearType(RankedTensorType input, RankedTensorType weight,
                          RankedTensorType indices, bool transposeWeight,
                          EmitErrorFn emitError);

} // namespace mlir::mt

#endif // MT_IR_MTSHAPERULES_H
