//===- MtShapeRules.cpp - Result types of mt ops, from their operands -----===//

#include "mt/IR/MtShapeRules.h"

#include "llvm/ADT/STLExtras.h"
#include "llvm/ADT/SmallVector.h"

using namespace mlir;
using namespace mlir::mt;

bool mt::areMixablePrecisions(Type a, Type b) {
  if (a == b)
    return true;
  auto narrow = [](Type t) { return t.isBF16() || t.isF16(); };
  return (a.isF32() && narrow(b)) || (b.isF32() && narrow(a));
}

bool mt::matchesUpToPrecision(Type actual, Type expected) {
  if (actual == expected)
    return true;
  auto a = dyn_cast<RankedTensorType>(actual);
  auto e = dyn_cast<RankedTensorType>(expected);
  return a && e && a.getShape() == e.getShape() &&
         areMixablePrecisions(a.getElementType(), e.getElementType());
}

/// The floating-point operands of an mt op share one element type, or mix
/// f32 with one 16-bit type (mixed precision): the model level has no
/// other implicit casts.
static LogicalResult verifySameElementType(ArrayRef<RankedTensorType> types,
                                           ArrayRef<StringRef> names,
                                           EmitErrorFn emitError) {
  for (auto [type, name] : llvm::zip(types.drop_front(), names.drop_front())) {
    if (type && !areMixablePrecisions(type.getElementType(),
                                      types.front().getElementType()))
      return emitError() << names.front() << " and " << name
                         << " must share one element type (or mix f32 with "
                            "bf16 or f16), got "
                         << types.front().getElementType() << " and "
                         << type.getElementType();
  }
  return success();
}

FailureOr<int64_t> mt::normalizeAxis(int64_t axis, int64_t rank,
                                     EmitErrorFn emitError) {
  if (axis < -rank || axis >= rank)
    return emitError() << "axis " << axis << " is out of range for rank "
                       << rank << "; expected a value in [" << -rank << ", "
                       << rank << ")";
  return axis < 0 ? axis + rank : axis;
}

FailureOr<RankedTensorType> mt::inferEmbeddingType(RankedTensorType table,
                                                   RankedTensorType ids,
                                                   EmitErrorFn emitError) {
  if (table.getRank() != 2)
    return emitError() << "table must be rank 2 (vocabulary x hidden), got "
                       << table;
  SmallVector<int64_t> shape(ids.getShape());
  shape.push_back(table.getDimSize(1));
  return RankedTensorType::get(shape, table.getElementType());
}

FailureOr<RankedTensorType> mt::inferNormType(RankedTensorType input,
                                              RankedTensorType weight,
                                              RankedTensorType bias,
                                              EmitErrorFn emitError) {
  if (failed(verifySameElementType({input, weight, bias},
                                   {"input", "weight", "bias"}, emitError)))
    return failure();
  if (input.getRank() < 1)
    return emitError() << "input must have rank >= 1, got " << input;
  int64_t hidden = input.getShape().back();
  std::pair<RankedTensorType, StringRef> params[] = {{weight, "weight"},
                                                     {bias, "bias"}};
  for (auto [type, name] : params) {
    if (type && (type.getRank() != 1 || type.getDimSize(0) != hidden))
      return emitError() << name << " must be "
                         << RankedTensorType::get({hidden},
                                                  input.getElementType())
                         << " (the input's last dimension), got " << type;
  }
  return input;
}

FailureOr<RankedTensorType> mt::inferLinearType(RankedTensorType input,
                                                RankedTensorType weight,
                                                RankedTensorType bias,
                                                bool transposeWeight,
                                                EmitErrorFn emitError) {
  if (failed(verifySameElementType({input, weight, bias},
                                   {"input", "weight", "bias"}, emitError)))
    return failure();
  if (input.getRank() < 1)
    return emitError() << "input must have rank >= 1, got " << input;
  if (weight.getRank() != 2)
    return emitError() << "weight must be rank 2 ("
                       << (transposeWeight ? "out x in" : "in x out")
                       << "), got " << weight;
  int64_t in = weight.getDimSize(transposeWeight ? 1 : 0);
  int64_t out = weight.getDimSize(transposeWeight ? 0 : 1);
  if (input.getShape().back() != in)
    return emitError() << "input's last dimension (" << input.getShape().back()
                       << ") must equal the weight's input dimension (" << in
                       << ") of " << weight
                       << (transposeWeight ? " (transposed, out x in)"
                                           : " (in x out)");
  if (bias && (bias.getRank() != 1 || bias.getDimSize(0) != out))
    return emitError() << "bias must be "
                       << RankedTensorType::get({out}, input.getElementType())
                       << " (the output dimension), got " << bias;
  SmallVector<int64_t> shape(input.getShape());
  shape.back() = out;
  return RankedTensorType::get(shape, input.getElementType());
}

FailureOr<RankedTensorType> mt::inferMatmulType(RankedTensorType lhs,
                                                RankedTensorType rhs,
                                                bool transposeLhs,
                                                bool transposeRhs,
                                                EmitErrorFn emitError) {
  if (failed(verifySameElementType({lhs, rhs}, {"lhs", "rhs"}, emitError)))
    return failure();
  if (lhs.getRank() < 2 || lhs.getRank() != rhs.getRank())
    return emitError() << "operands must have one rank >= 2, got " << lhs
                       << " and " << rhs;
  int64_t rank = lhs.getRank();
  if (lhs.getShape().drop_back(2) != rhs.getShape().drop_back(2))
    return emitError() << "batch dimensions differ: " << lhs << " and " << rhs;
  int64_t m = lhs.getDimSize(rank - (transposeLhs ? 1 : 2));
  int64_t lhsK = lhs.getDimSize(rank - (transposeLhs ? 2 : 1));
  int64_t rhsK = rhs.getDimSize(rank - (transposeRhs ? 1 : 2));
  int64_t n = rhs.getDimSize(rank - (transposeRhs ? 2 : 1));
  if (lhsK != rhsK)
    return emitError() << "contraction dimensions differ: lhs has " << lhsK
                       << ", rhs has " << rhsK << " (after transpose_lhs="
                       << transposeLhs << ", transpose_rhs=" << transposeRhs
                       << ")";
  SmallVector<int64_t> shape(lhs.getShape().drop_back(2));
  shape.append({m, n});
  return RankedTensorType::get(shape, lhs.getElementType());
}

FailureOr<RankedTensorType> mt::inferAttentionType(RankedTensorType query,
                                                   RankedTensorType key,
                                                   RankedTensorType value,
                                                   bool causal,
                                                   EmitErrorFn emitError) {
  if (failed(verifySameElementType({query, key, value},
                                   {"query", "key", "value"}, emitError)))
    return failure();
  std::pair<RankedTensorType, StringRef> operands[] = {
      {query, "query"}, {key, "key"}, {value, "value"}};
  for (auto [type, name] : operands) {
    if (type.getRank() != 4)
      return emitError() << name
                         << " must be rank 4 (batch x sequence x heads x "
                            "head_dim), got "
                         << type;
  }
  if (key.getShape().drop_back() != value.getShape().drop_back())
    return emitError() << "key and value must agree on batch, sequence and "
                          "heads, got "
                       << key << " and " << value;
  if (query.getDimSize(0) != key.getDimSize(0))
    return emitError() << "query batch (" << query.getDimSize(0)
                       << ") must equal key batch (" << key.getDimSize(0)
                       << ")";
  if (query.getDimSize(3) != key.getDimSize(3))
    return emitError() << "query head_dim (" << query.getDimSize(3)
                       << ") must equal key head_dim (" << key.getDimSize(3)
                       << ")";
  int64_t queryHeads = query.getDimSize(2), kvHeads = key.getDimSize(2);
  if (queryHeads % kvHeads != 0)
    return emitError() << "query heads (" << queryHeads
                       << ") must be a multiple of key/value heads ("
                       << kvHeads << ") for grouped-query attention";
  if (causal && query.getDimSize(1) != key.getDimSize(1))
    return emitError() << "causal attention needs equal query and key "
                          "sequence lengths, got "
                       << query.getDimSize(1) << " and " << key.getDimSize(1);
  SmallVector<int64_t> shape(query.getShape());
  shape.back() = value.getDimSize(3);
  return RankedTensorType::get(shape, query.getElementType());
}

FailureOr<RankedTensorType>
mt::inferCrossEntropyType(RankedTensorType logits, RankedTensorType labels,
                          LossReduction reduction, EmitErrorFn emitError) {
  if (logits.getRank() < 1 ||
      logits.getShape().drop_back() != labels.getShape())
    return emitError() << "labels " << labels
                       << " must have the logits' shape without its last "
                          "(vocabulary) dimension; logits are "
                       << logits;
  Type f32 = Float32Type::get(logits.getContext());
  if (reduction == LossReduction::None)
    return RankedTensorType::get(labels.getShape(), f32);
  return RankedTensorType::get({}, f32);
}

FailureOr<RankedTensorType> mt::inferTransposeType(RankedTensorType input,
                                                   ArrayRef<int64_t> permutation,
                                                   EmitErrorFn emitError) {
  int64_t rank = input.getRank();
  SmallVector<bool> seen(rank, false);
  bool valid = static_cast<int64_t>(permutation.size()) == rank;
  for (int64_t dim : permutation) {
    if (!valid)
      break;
    valid = dim >= 0 && dim < rank && !seen[dim];
    if (valid)
      seen[dim] = true;
  }
  if (!valid) {
    std::string dims;
    llvm::raw_string_ostream os(dims);
    llvm::interleaveComma(permutation, os);
    return emitError() << "permutation [" << dims
                       << "] is not a permutation of [0, " << rank << ") for "
                       << input;
  }
  SmallVector<int64_t> shape;
  for (int64_t dim : permutation)
    shape.push_back(input.getDimSize(dim));
  return RankedTensorType::get(shape, input.getElementType());
}

/// Checks that `pieces` agree with `whole` on element type, rank and every
/// dimension but `axis`, and returns the sum of their sizes along `axis`.
static FailureOr<int64_t> sumAlongAxis(RankedTensorType whole,
                                       ArrayRef<RankedTensorType> pieces,
                                       int64_t axis, EmitErrorFn emitError) {
  int64_t total = 0;
  for (auto [index, piece] : llvm::enumerate(pieces)) {
    bool sameOtherDims = piece.getRank() == whole.getRank() &&
                         piece.getElementType() == whole.getElementType();
    for (int64_t dim = 0; sameOtherDims && dim < whole.getRank(); ++dim)
      sameOtherDims = dim == axis || piece.getDimSize(dim) == whole.getDimSize(dim);
    if (!sameOtherDims)
      return emitError() << "piece #" << index << " " << piece
                         << " must match " << whole
                         << " in element type, rank and every dimension but "
                            "axis "
                         << axis;
    total += piece.getDimSize(axis);
  }
  return total;
}

FailureOr<RankedTensorType> mt::inferConcatType(ArrayRef<RankedTensorType> inputs,
                                                int64_t axis,
                                                EmitErrorFn emitError) {
  if (inputs.empty())
    return emitError() << "needs at least one input";
  FailureOr<int64_t> dim = normalizeAxis(axis, inputs.front().getRank(), emitError);
  if (failed(dim))
    return failure();
  FailureOr<int64_t> total = sumAlongAxis(inputs.front(), inputs, *dim, emitError);
  if (failed(total))
    return failure();
  SmallVector<int64_t> shape(inputs.front().getShape());
  shape[*dim] = *total;
  return RankedTensorType::get(shape, inputs.front().getElementType());
}

LogicalResult mt::verifySplitTypes(RankedTensorType input,
                                   ArrayRef<RankedTensorType> pieces,
                                   int64_t axis, EmitErrorFn emitError) {
  if (pieces.empty())
    return emitError() << "needs at least one result";
  FailureOr<int64_t> dim = normalizeAxis(axis, input.getRank(), emitError);
  if (failed(dim))
    return failure();
  FailureOr<int64_t> total = sumAlongAxis(input, pieces, *dim, emitError);
  if (failed(total))
    return failure();
  if (*total != input.getDimSize(*dim))
    return emitError() << "pieces add up to " << *total << " along axis "
                       << axis << " but the input has "
                       << input.getDimSize(*dim);
  return success();
}

//===----------------------------------------------------------------------===//
// Mixture of experts
//===----------------------------------------------------------------------===//

FailureOr<RankedTensorType> mt::inferMoeRouteType(RankedTensorType logits,
                                                  int64_t topk,
                                                  EmitErrorFn emitError) {
  if (logits.getRank() != 2)
    return emitError() << "router logits must be rank 2 (tokens x experts), "
                          "got "
                       << logits;
  int64_t experts = logits.getDimSize(1);
  if (topk < 1 || topk > experts)
    return emitError() << "topk " << topk << " must be in [1, " << experts
                       << "] (the number of experts)";
  return RankedTensorType::get({logits.getDimSize(0), topk},
                               logits.getElementType());
}

LogicalResult mt::verifyMoeRouting(RankedTensorType indices,
                                   RankedTensorType probs, int64_t tokens,
                                   EmitErrorFn emitError) {
  if (indices.getRank() != 2 ||
      (tokens >= 0 && indices.getDimSize(0) != tokens))
    return emitError() << "routing indices must be [" << tokens
                       << ", topk] (one row per token), got " << indices;
  if (probs && probs.getShape() != indices.getShape())
    return emitError() << "routing weights must have the indices' shape ["
                       << indices.getDimSize(0) << ", "
                       << indices.getDimSize(1) << "], got " << probs;
  return success();
}

FailureOr<RankedTensorType> mt::inferMoePermuteType(RankedTensorType input,
                                                    RankedTensorType indices,
                                                    RankedTensorType probs,
                                                    EmitErrorFn emitError) {
  if (failed(verifySameElementType({input, probs}, {"input", "probs"},
                                   emitError)))
    return failure();
  if (input.getRank() != 2)
    return emitError() << "tokens must be rank 2 (tokens x hidden), got "
                       << input;
  if (failed(verifyMoeRouting(indices, probs, input.getDimSize(0), emitError)))
    return failure();
  return RankedTensorType::get(
      {input.getDimSize(0) * indices.getDimSize(1), input.getDimSize(1)},
      input.getElementType());
}

FailureOr<RankedTensorType> mt::inferMoeUnpermuteType(RankedTensorType rows,
                                                      RankedTensorType indices,
                                                      RankedTensorType probs,
                                                      EmitErrorFn emitError) {
  if (failed(verifySameElementType({rows, probs}, {"rows", "probs"},
                                   emitError)))
    return failure();
  if (rows.getRank() != 2)
    return emitError() << "permuted rows must be rank 2 (tokens * topk x "
                          "hidden), got "
                       << rows;
  if (failed(verifyMoeRouting(indices, probs, -1, emitError)))
    return failure();
  int64_t tokens = indices.getDimSize(0), topk = indices.getDimSize(1);
  if (rows.getDimSize(0) != tokens * topk)
    return emitError() << "permuted rows must number tokens * topk = "
                       << tokens * topk << " (indices " << indices << "), got "
                       << rows.getDimSize(0);
  return RankedTensorType::get({tokens, rows.getDimSize(1)},
                               rows.getElementType());
}

FailureOr<RankedTensorType>
mt::inferMoeGroupedLinearType(RankedTensorType input, RankedTensorType weight,
                              RankedTensorType indices, bool transposeWeight,
                              EmitErrorFn emitError) {
  if (failed(verifySameElementType({input, weight}, {"input", "weight"},
                                   emitError)))
    return failure();
  if (input.getRank() != 2)
    return emitError() << "permuted rows must be rank 2 (tokens * topk x in), "
                          "got "
                       << input;
  if (weight.getRank() != 3)
    return emitError() << "expert weights must be rank 3 ("
                       << (transposeWeight ? "experts x out x in"
                                           : "experts x in x out")
                       << "), got " << weight;
  if (failed(verifyMoeRouting(indices, RankedTensorType(), -1, emitError)))
    return failure();
  int64_t rows = indices.getDimSize(0) * indices.getDimSize(1);
  if (input.getDimSize(0) != rows)
    return emitError() << "permuted rows must number tokens * topk = " << rows
                       << " (indices " << indices << "), got "
                       << input.getDimSize(0);
  int64_t in = weight.getDimSize(transposeWeight ? 2 : 1);
  int64_t out = weight.getDimSize(transposeWeight ? 1 : 2);
  if (input.getDimSize(1) != in)
    return emitError() << "input's last dimension (" << input.getDimSize(1)
                       << ") must equal the expert weights' input dimension ("
                       << in << ") of " << weight
                       << (transposeWeight ? " (transposed, experts x out x in)"
                                           : " (experts x in x out)");
  return RankedTensorType::get({rows, out}, input.getElementType());
}
