//===- MtExpertParallelOps.cpp - Verifiers of the expert dispatch ---------===//

#include "mt/IR/MtOps.h"

using namespace mlir;
using namespace mlir::mt;

/// The checks the three dispatch ops share: routing indices [T, K], experts
/// that divide among the ranks, and the rows' and blocks' shapes.
static LogicalResult verifyDispatch(Operation *op, RankedTensorType indices,
                                    int64_t experts, int64_t ranks,
                                    RankedTensorType rows,
                                    RankedTensorType blocks) {
  if (indices.getRank() != 2)
    return op->emitOpError() << "indices must be [tokens, topk], got rank "
                             << indices.getRank();
  if (ranks < 1 || experts < 1 || experts % ranks != 0)
    return op->emitOpError()
           << "num_experts " << experts
           << " must be a positive multiple of expert_ranks " << ranks;
  int64_t slots = indices.getDimSize(0) * indices.getDimSize(1);
  if (rows && (rows.getRank() != 2 || rows.getDimSize(0) != slots))
    return op->emitOpError()
           << "the permuted rows must be [tokens * topk = " << slots
           << ", hidden], got " << rows;
  int64_t width = rows ? rows.getDimSize(1) : 1;
  if (blocks.getRank() != 2 || blocks.getDimSize(0) != ranks * slots ||
      blocks.getDimSize(1) != width)
    return op->emitOpError()
           << "the dispatched blocks must be [expert_ranks * tokens * topk = "
           << ranks * slots << ", " << width << "], got " << blocks;
  if (rows && rows.getElementType() != blocks.getElementType())
    return op->emitOpError() << "rows and blocks must have one element type";
  return success();
}

LogicalResult MoeDispatchRowsOp::verify() {
  return verifyDispatch(*this, getIndices().getType(), getNumExperts(),
                        getExpertRanks(), getRows().getType(),
                        getType());
}

LogicalResult MoeDispatchExpertsOp::verify() {
  return verifyDispatch(*this, getIndices().getType(), getNumExperts(),
                        getExpertRanks(), RankedTensorType(), getType());
}

LogicalResult MoeCombineRowsOp::verify() {
  return verifyDispatch(*this, getIndices().getType(), getNumExperts(),
                        getExpertRanks(), getType(), getBlocks().getType());
}
