// The mixture-of-experts layer's CUDA kernels (Moe.cu): routing and its
// auxiliary losses, the routing's layout, and token permutation. The device
// twins of host/kernels/Moe.cpp, under the conventions of kernels/Kernels.h;
// the experts' GEMMs are cuBLASLt's (cuda/MoeGemm.cpp).
#ifndef MTRT_SRC_CUDA_KERNELS_MOEKERNELS_H
#define MTRT_SRC_CUDA_KERNELS_MOEKERNELS_H

#include "cuda/kernels/Kernels.h"

namespace mtrt::cuda {

using host::MoeRouter;

/// The most experts the layout kernel counts (its shared memory holds a
/// count per expert and warp), the most slots per token the routing
/// kernels keep in registers, and the most groups of group-limited routing
/// (a token's kept groups are the bits of a 64-bit word).
constexpr int64_t kMoeMaxExperts = 256;
constexpr int64_t kMoeMaxTopk = 32;
constexpr int64_t kMoeMaxGroups = 64;

/// The routing's layout on the device: for `slots` routing indices (-1 for
/// a dropped slot), offsets[e] the first permuted row of expert e (`experts`
/// + 1 entries, the last the kept slots), position[s] the row of slot s (-1
/// when dropped: token order within an expert, as host::moeLayout), and
/// slotAt[p] the slot at row p (may be null). An index outside [-1,
/// experts) raises the fault and counts as dropped. One block.
void moeLayout(cudaStream_t stream, int64_t slots, int64_t experts,
               const int32_t *indices, int32_t *offsets, int32_t *position,
               int32_t *slotAt, unsigned *fault, unsigned tag);

/// The device scratch of moeRouteForward (capacity routing: a layout and
/// the drop marks), moeAuxLoss* and moeZLossForward.
size_t moeRouteScratchBytes(const MoeRouter &router);
size_t moeAuxLossScratchBytes(const MoeRouter &router);

/// host::moeRouteForward: probs and indices [tokens, topk]; the weights in
/// double as the host's. `expertBias` is the device's [experts] f32 bias
/// of aux-loss-free balancing, or null (router.expertBias, the host's, is
/// not read).
void moeRouteForward(cudaStream_t stream, const MoeRouter &router,
                     const float *logits, const float *expertBias, float *probs,
                     int32_t *indices, void *scratch);
void moeRouteBackward(cudaStream_t stream, const MoeRouter &router,
                      const float *logits, const float *expertBias,
                      const int32_t *indices, const float *dprobs,
                      float *dlogits);
/// host::moeAuxLossForward and Backward; the sums in double, each of a
/// fixed shape (the same bits on every run).
void moeAuxLossForward(cudaStream_t stream, const MoeRouter &router,
                       double coeff, const float *logits, float *loss,
                       void *scratch);
void moeAuxLossBackward(cudaStream_t stream, const MoeRouter &router,
                        double coeff, const float *logits, const float *dloss,
                        float *dlogits, void *scratch);
/// counts[e] (f32, `experts` entries): the routing indices (`slots` of
/// them) equal to e (mt.moe_tokens_per_expert; -1 and any index outside
/// [0, experts) count for none). Exact: the counts are integers below 2^24.
void moeTokensPerExpert(cudaStream_t stream, int64_t slots, int64_t experts,
                        const int32_t *indices, float *counts);
void moeZLossForward(cudaStream_t stream, int64_t tokens, int64_t experts,
                     double coeff, const float *logits, float *loss);
void moeZLossBackward(cudaStream_t stream, int64_t tokens, int64_t experts,
                      double coeff, const float *logits, const float *dloss,
                      float *dlogits);

/// host::moePermute: rows [tokens * topk, hidden] from x [tokens, hidden]
/// by `position` (moeLayout), times probs when given; rows from
/// offsets[experts] on are zero.
void moePermute(cudaStream_t stream, int64_t tokens, int64_t topk,
                int64_t hidden, int64_t experts, const int32_t *offsets,
                const int32_t *position, InElements x, const float *probs,
                OutElements rows);
/// host::moeUnpermute: y [tokens, hidden], each token's rows (times probs
/// when given) summed in slot order.
void moeUnpermute(cudaStream_t stream, int64_t tokens, int64_t topk,
                  int64_t hidden, const int32_t *position, InElements rows,
                  const float *probs, OutElements y);
/// host::moeProbsGrad: dprobs[t, k] = x[t] . rows[position(t, k)] (0 when
/// dropped), one warp per slot.
void moeProbsGrad(cudaStream_t stream, int64_t tokens, int64_t topk,
                  int64_t hidden, const int32_t *position, InElements x,
                  InElements rows, float *dprobs);

/// Expert parallelism's blocks (host::moeDispatchBlocks): `ranks` ranks
/// hold experts / ranks experts each, and `offsets` is the routing's layout
/// over every expert (moeLayout, experts + 1 entries, on the device).
/// Dispatch: block d of `to` [ranks * slots, hidden] holds rows [offsets[d
/// E/N], offsets[(d + 1) E/N]) of `from` [slots, hidden], then zero rows.
/// `combine`: the blocks of `from` back into `to` [slots, hidden] at those
/// rows, zero rows after the kept ones.
void moeDispatchRows(cudaStream_t stream, int64_t slots, int64_t hidden,
                     int64_t ranks, int64_t experts, const int32_t *offsets,
                     bool combine, InElements from, OutElements to);
/// host::moeDispatchExperts: each block row's expert less its destination's
/// first, -1 for the zero rows; [ranks * slots].
void moeDispatchExperts(cudaStream_t stream, int64_t slots, int64_t ranks,
                        int64_t experts, const int32_t *offsets,
                        int32_t *destinationExperts);

} // namespace mtrt::cuda

#endif // MTRT_SRC_CUDA_KERNELS_MOEKERNELS_H
