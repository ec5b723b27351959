// Ring attention's pieces on the device (context parallelism, issue 24):
// the attention of a block of the rank's queries against one block of keys
// and values at their global positions, returning what the online softmax's
// merge needs (the block's output and its logsumexp); the merge; the
// backward's delta; and a block's terms of dq, dk and dv from the whole
// row's logsumexp and delta. The same arithmetic as the host's
// (host/kernels/AttentionBlocks.cpp): the causal mask by position, the
// attention dropout keyed on the global element
// ((h * S + q_pos) * S + k_pos) of the whole sequence's probabilities.
//
// Straightforward kernels, as Attention.cu's: one thread block per query
// row for the forward and dq (the row's scores in shared memory), one per
// key row for dk and dv. q, k, v, dout and the outputs fp32 or bf16
// (InElements/OutElements, computed in fp32); logsumexp and delta fp32.
#ifndef MTRT_SRC_CUDA_KERNELS_ATTENTIONBLOCKS_H
#define MTRT_SRC_CUDA_KERNELS_ATTENTIONBLOCKS_H

#include "core/ContextLayout.h"
#include "cuda/kernels/Kernels.h"

#include <string>

namespace mtrt::cuda {

/// Where a block's queries and keys lie: query row i at
/// contextGlobalPosition(queries, i), key row j at
/// contextGlobalPosition(keys, j). A ring block's keys are one context
/// rank's (keys.first = that rank * seqK); the gathered block's are every
/// rank's in rank order (keys.first = 0).
struct AttentionBlockLayout {
  ContextTile queries, keys;
};

/// Empty when these kernels take the shapes (head dimensions up to 256,
/// the row's scores in shared memory), else why not.
std::string attentionBlockUnsupportedReason(const AttentionParams &params,
                                            int device);

/// out [batch, seqQ, headsQ, headDimV] and logsumexp [batch, headsQ, seqQ]
/// of the block alone; a row that sees no key of the block gets out 0 and
/// logsumexp -inf (host::attentionBlockForward).
void attentionBlockForward(cudaStream_t stream, const AttentionParams &params,
                           const AttentionBlockLayout &layout, InElements q,
                           InElements k, InElements v, OutElements out,
                           float *logsumexp);

/// The online softmax's merge of a block's (blockOut, blockLogsumexp) into
/// the running (out, logsumexp), written to (merged, mergedLogsumexp) in
/// double (host::attentionMergeBlock); the results may alias the running
/// pair or the block's. Outputs [batch, seq, heads, headDimV], logsumexps
/// [batch, heads, seq].
void attentionMerge(cudaStream_t stream, int64_t batch, int64_t seq,
                    int64_t heads, int64_t headDimV, InElements out,
                    const float *logsumexp, InElements blockOut,
                    const float *blockLogsumexp, OutElements merged,
                    float *mergedLogsumexp);

/// delta [batch, heads, seq] = rowsum(out * dout) in double
/// (host::attentionBackwardDelta).
void attentionDelta(cudaStream_t stream, int64_t batch, int64_t seq,
                    int64_t heads, int64_t headDimV, InElements out,
                    InElements dout, float *delta);

/// The block's dq, dk, dv (each written, not added; dk and dv of keys no
/// query sees are 0) from the whole row's logsumexp and delta
/// (host::attentionBlockBackward).
void attentionBlockBackward(cudaStream_t stream, const AttentionParams &params,
                            const AttentionBlockLayout &layout, InElements q,
                            InElements k, InElements v,
                            const float *logsumexp, const float *delta,
                            InElements dout, OutElements dq, OutElements dk,
                            OutElements dv);

} // namespace mtrt::cuda

#endif // MTRT_SRC_CUDA_KERNELS_ATTENTIONBLOCKS_H
