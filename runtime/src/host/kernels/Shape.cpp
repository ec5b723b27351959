// Copy kernels for shapes: transpose by any permutation, split and concat along an axis.
#include "host/kernels/KernelSupport.h"

#include <algorithm>
#include <vector>

namespace mtrt::host {

void inversePermutation(int rank, const int64_t *permutation,
                        int64_t *inverse) {
  for (int i = 0; i < rank; ++i)
    inverse[permutation[i]] = i;
}

// Output rows (all dimensions but the last) are independent; within a row
// the input is read with the stride of the output's last dimension.
template <typename T>
void transposeForward(ThreadPool &pool, int rank, const int64_t *shape,
                      const int64_t *permutation, const T *in, T *out) {
  int64_t total = 1;
  for (int d = 0; d < rank; ++d)
    total *= shape[d];
  if (rank <= 1 || total == 0) {
    std::copy(in, in + total, out);
    return;
  }
  std::vector<int64_t> inStride(static_cast<size_t>(rank));
  inStride[rank - 1] = 1;
  for (int d = rank - 2; d >= 0; --d)
    inStride[d] = inStride[d + 1] * shape[d + 1];
  // Output dimension i has size shape[permutation[i]] and input stride
  // inStride[permutation[i]].
  std::vector<int64_t> outShape(static_cast<size_t>(rank));
  std::vector<int64_t> stride(static_cast<size_t>(rank));
  for (int i = 0; i < rank; ++i) {
    outShape[i] = shape[permutation[i]];
    stride[i] = inStride[permutation[i]];
  }
  int64_t width = outShape[rank - 1];
  int64_t innerStride = stride[rank - 1];
  pool.parallelFor(
      0, total / width,
      [&](int64_t begin, int64_t end) {
        for (int64_t row = begin; row < end; ++row) {
          int64_t offset = 0;
          for (int64_t i = rank - 2, rest = row; i >= 0; --i) {
            offset += (rest % outShape[i]) * stride[i];
            rest /= outShape[i];
          }
          const T *src = in + offset;
          T *dst = out + row * width;
          for (int64_t j = 0; j < width; ++j)
            dst[j] = src[j * innerStride];
        }
      },
      detail::rowGrain(width));
}

template <typename T>
void splitForward(ThreadPool &pool, int64_t outer, int64_t inner, int count,
                  const int64_t *sizes, const T *in, T *const *outputs) {
  int64_t axis = 0;
  for (int p = 0; p < count; ++p)
    axis += sizes[p];
  pool.parallelFor(
      0, outer,
      [&](int64_t begin, int64_t end) {
        for (int64_t o = begin; o < end; ++o) {
          const T *src = in + o * axis * inner;
          for (int p = 0; p < count; ++p) {
            int64_t length = sizes[p] * inner;
            std::copy(src, src + length, outputs[p] + o * length);
            src += length;
          }
        }
      },
      detail::rowGrain(axis * inner));
}

template <typename T>
void concatForward(ThreadPool &pool, int64_t outer, int64_t inner, int count,
                   const int64_t *sizes, const T *const *inputs, T *out) {
  int64_t axis = 0;
  for (int p = 0; p < count; ++p)
    axis += sizes[p];
  pool.parallelFor(
      0, outer,
      [&](int64_t begin, int64_t end) {
        for (int64_t o = begin; o < end; ++o) {
          T *dst = out + o * axis * inner;
          for (int p = 0; p < count; ++p) {
            int64_t length = sizes[p] * inner;
            const T *src = inputs[p] + o * length;
            std::copy(src, src + length, dst);
            dst += length;
          }
        }
      },
      detail::rowGrain(axis * inner));
}

#define MTRT_INSTANTIATE(T)                                                    \
  template void transposeForward<T>(ThreadPool &, int, const int64_t *,        \
                                    const int64_t *, const T *, T *);          \
  template void splitForward<T>(ThreadPool &, int64_t, int64_t, int,           \
                                const int64_t *, const T *, T *const *);       \
  template void concatForward<T>(ThreadPool &, int64_t, int64_t, int,          \
                                 const int64_t *, const T *const *, T *);
MTRT_INSTANTIATE_FLOAT_TYPES(MTRT_INSTANTIATE)
#undef MTRT_INSTANTIATE

} // namespace mtrt::host
