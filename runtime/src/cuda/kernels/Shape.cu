// Transpose by any permutation, fp32 or bf16 on either side (split, concat
// and reshape are copies the executor makes with cudaMemcpy2DAsync).
#include "cuda/kernels/KernelSupport.cuh"

namespace mtrt::cuda {

namespace {

struct TransposeGeometry {
  int rank;
  int64_t outShape[kMaxTransposeRank];
  /// The input stride of each output dimension.
  int64_t stride[kMaxTransposeRank];
};

__global__ void transposeKernel(int64_t total, TransposeGeometry geo,
                                InElements in, OutElements out) {
  MTRT_GRID_STRIDE(o, total) {
    int64_t offset = 0, rest = o;
    for (int i = geo.rank - 1; i >= 0; --i) {
      offset += (rest % geo.outShape[i]) * geo.stride[i];
      rest /= geo.outShape[i];
    }
    detail::store(out, o, detail::load(in, offset));
  }
}

} // namespace

void transpose(cudaStream_t stream, int rank, const int64_t *shape,
               const int64_t *permutation, InElements in, OutElements out) {
  int64_t total = 1;
  for (int d = 0; d < rank; ++d)
    total *= shape[d];
  if (total <= 0)
    return;
  if (rank <= 1 && in.bf16 == out.bf16) {
    cudaMemcpyAsync(out.data, in.data,
                    (in.bf16 ? sizeof(__nv_bfloat16) : sizeof(float)) *
                        static_cast<size_t>(total),
                    cudaMemcpyDeviceToDevice, stream);
    return;
  }
  TransposeGeometry geo{};
  geo.rank = rank;
  int64_t inStride[kMaxTransposeRank] = {};
  if (rank > 0) // rank 0: one element
    inStride[rank - 1] = 1;
  for (int d = rank - 2; d >= 0; --d)
    inStride[d] = inStride[d + 1] * shape[d + 1];
  for (int i = 0; i < rank; ++i) {
    geo.outShape[i] = shape[permutation[i]];
    geo.stride[i] = inStride[permutation[i]];
  }
  transposeKernel<<<detail::blocksFor(total), detail::kThreads, 0, stream>>>(
      total, geo, in, out);
}

} // namespace mtrt::cuda
