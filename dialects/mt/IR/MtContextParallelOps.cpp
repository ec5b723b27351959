//===- MtContextParallelOps.cpp - Verifiers of ring attention's blocks ----===//

#include "mt/IR/MtOps.h"
#include "mt/IR/MtShapeRules.h"

using namespace mlir;
using namespace mlir::mt;

namespace {

/// The types a block of attention produces.
struct BlockTypes {
  RankedTensorType output, logsumexp;
};

} // namespace

/// The checks shared by mt.attention_block and mt.attention_block_grad: the
/// attention's own rules, then the block's place in the load-balanced
/// sequence. Returns the forward's result types.
static FailureOr<BlockTypes> verifyAttentionBlock(
    Operation *op, RankedTensorType query, RankedTensorType key,
    RankedTensorType value, std::optional<APFloat> scale, double dropout,
    int64_t contextAxis, int64_t contextSize, std::optional<uint64_t> keyStep) {
  if (scale && !(scale->convertToDouble() > 0.0))
    return op->emitOpError()
           << "scale must be positive, got " << scale->convertToDouble();
  if (!(dropout >= 0.0 && dropout < 1.0))
    return op->emitOpError() << "dropout_p must be in [0, 1), got " << dropout;
  if (contextAxis < 0 || contextSize < 1)
    return op->emitOpError()
           << "context_axis must be a grid axis (>= 0) and context_size a "
              "positive number of ranks, got "
           << contextAxis << " and " << contextSize;
  if (keyStep && static_cast<int64_t>(*keyStep) >= contextSize)
    return op->emitOpError()
           << "key_step " << static_cast<int64_t>(*keyStep)
           << " must name a ring step in [0, context_size = " << contextSize
           << ")";
  // The causal mask is by global position, so the lengths need not match.
  FailureOr<RankedTensorType> output = inferAttentionType(
      query, key, value, /*causal=*/false, [&] { return op->emitOpError(); });
  if (failed(output))
    return failure();
  int64_t seq = query.getDimSize(1), keys = key.getDimSize(1);
  if (seq % 2 != 0)
    return op->emitOpError()
           << "query sequence " << seq
           << " must be even: a rank holds two equal chunks of the sequence";
  int64_t expected = keyStep ? seq : seq * contextSize;
  if (keys != expected)
    return op->emitOpError()
           << "key sequence " << keys << " must be "
           << (keyStep ? "the query sequence (one rank's block), "
                       : "context_size times the query sequence (every "
                         "rank's block, gathered), ")
           << expected;
  auto logsumexp =
      RankedTensorType::get({query.getDimSize(0), query.getDimSize(2), seq},
                            Float32Type::get(op->getContext()));
  return BlockTypes{*output, logsumexp};
}

/// Checks that the value named `what` has the type the rule derives.
static LogicalResult expectType(Operation *op, StringRef what, Type actual,
                                RankedTensorType expected) {
  if (!matchesUpToPrecision(actual, expected))
    return op->emitOpError() << what << " type " << actual
                             << " does not match the expected " << expected;
  return success();
}

LogicalResult AttentionBlockOp::verify() {
  FailureOr<BlockTypes> types = verifyAttentionBlock(
      *this, getQuery().getType(), getKey().getType(), getValue().getType(),
      getScale(), getDropoutP().convertToDouble(), getContextAxis(),
      getContextSize(), getKeyStep());
  if (failed(types) ||
      failed(expectType(*this, "result", getResult().getType(), types->output)))
    return failure();
  return expectType(*this, "logsumexp", getLogsumexp().getType(),
                    types->logsumexp);
}

/// A [batch, sequence, heads, value_dim] output and its [batch, heads,
/// sequence] row statistic.
static LogicalResult verifyRows(Operation *op, RankedTensorType output,
                                RankedTensorType rows, StringRef rowsName) {
  if (output.getRank() != 4)
    return op->emitOpError() << "output must be rank 4 (batch x sequence x "
                                "heads x value_dim), got "
                             << output;
  return expectType(
      op, rowsName, rows,
      RankedTensorType::get(
          {output.getDimSize(0), output.getDimSize(2), output.getDimSize(1)},
          rows.getElementType()));
}

LogicalResult AttentionMergeOp::verify() {
  return verifyRows(*this, getOutput().getType(), getLogsumexp().getType(),
                    "logsumexp");
}

LogicalResult AttentionDeltaOp::verify() {
  return verifyRows(*this, getOutput().getType(), getType(), "result");
}

LogicalResult AttentionBlockGradOp::verify() {
  FailureOr<BlockTypes> types = verifyAttentionBlock(
      *this, getQuery().getType(), getKey().getType(), getValue().getType(),
      getScale(), getDropoutP().convertToDouble(), getContextAxis(),
      getContextSize(), getKeyStep());
  if (failed(types) ||
      failed(expectType(*this, "output_grad", getOutputGrad().getType(),
                        types->output)) ||
      failed(expectType(*this, "logsumexp", getLogsumexp().getType(),
                        types->logsumexp)) ||
      failed(
          expectType(*this, "delta", getDelta().getType(), types->logsumexp)) ||
      failed(expectType(*this, "query_grad", getQueryGrad().getType(),
                        getQuery().getType())) ||
      failed(expectType(*this, "key_grad", getKeyGrad().getType(),
                        getKey().getType())))
    return failure();
  return expectType(*this, "value_grad", getValueGrad().getType(),
                    getValue().getType());
}
