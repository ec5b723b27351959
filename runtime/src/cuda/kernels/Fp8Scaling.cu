// FP8 training's small kernels (issue 26, docs/MixedPrecision.md "FP8"): a
// tensor's amax, the scales computed from amaxes with core/Fp8.h's
// arithmetic (the host's functions, compiled for the device: the same
// bits), delayed scaling's history update, the inverse scales the FP8 GEMMs
// take, and the byte transpose that gives cuBLASLt its k-contiguous
// operands.
#include "cuda/kernels/Fp8Scaling.h"
#include "cuda/kernels/KernelSupport.cuh"

namespace mtrt::cuda {

namespace {

using detail::blocksFor;
using detail::kThreads;

// The largest |x| as bits, joined per block and then with one atomicMax
// (the casts' rule, Precision.cu: one per warp serialized on the word): for
// non-negative floats (NaN above infinity above the finite values) the
// order of the bits is the order of the values.
__global__ void amaxKernel(int64_t n, InElements x, float *amax) {
  __shared__ unsigned warps[kThreads / 32];
  unsigned largest = 0;
  MTRT_GRID_STRIDE(i, n) {
    largest = max(largest, __float_as_uint(fabsf(detail::load(x, i))));
  }
  largest = detail::blockMax(largest, warps);
  if (threadIdx.x == 0)
    atomicMax(reinterpret_cast<unsigned *>(amax), largest);
}

__global__ void scaleFromAmaxKernel(const float *amax, float *scale,
                                    fp8::Format format, int margin) {
  *scale = fp8::scaleFromAmax(*amax, 1.0f, format, margin);
}

__global__ void updateMetaKernel(const float *amax, float *scale,
                                 float *history, int length,
                                 fp8::AmaxAlgorithm algorithm,
                                 fp8::Format format, int margin) {
  fp8::pushAmax(history, length, *amax);
  *scale = fp8::scaleFromAmax(fp8::historyAmax(history, length, algorithm),
                              *scale, format, margin);
}

__global__ void inverseScalesKernel(const float *scaleX, const float *scaleW,
                                    float *inverseX, float *inverseW) {
  *inverseX = 1.0f / *scaleX;
  *inverseW = 1.0f / *scaleW;
}

constexpr int kTile = 32;

// One 32 x 32 tile per block through shared memory (8 rows a pass).
__global__ void transposeBytesKernel(int64_t rows, int64_t cols,
                                     const uint8_t *x, uint8_t *y) {
  __shared__ uint8_t tile[kTile][kTile + 1];
  int64_t r0 = int64_t(blockIdx.y) * kTile, c0 = int64_t(blockIdx.x) * kTile;
  for (int i = threadIdx.y; i < kTile; i += blockDim.y) {
    int64_t r = r0 + i, c = c0 + threadIdx.x;
    if (r < rows && c < cols)
      tile[i][threadIdx.x] = x[r * cols + c];
  }
  __syncthreads();
  for (int i = threadIdx.y; i < kTile; i += blockDim.y) {
    int64_t c = c0 + i, r = r0 + threadIdx.x;
    if (r < rows && c < cols)
      y[c * rows + r] = tile[threadIdx.x][i];
  }
}

constexpr int kWideTile = 64;

// A 64 x 64 tile per block of 256 threads, 16 bytes a thread each way:
// rows and cols are multiples of 16 and both pointers 16-byte aligned, so
// a 16-byte chunk is wholly inside or outside the matrix. Rows of the
// shared tile are 68 bytes apart, which spreads a thread's 16 reads of one
// column over two banks rather than one.
__global__ void transposeBytesWide(int64_t rows, int64_t cols, const uint8_t *x,
                                   uint8_t *y) {
  constexpr int kStride = kWideTile + 4;
  __shared__ __align__(16) uint8_t tile[kWideTile * kStride];
  int64_t r0 = int64_t(blockIdx.y) * kWideTile,
          c0 = int64_t(blockIdx.x) * kWideTile;
  int t = threadIdx.x;
  {
    int r = t / 4, chunk = t % 4;
    int64_t row = r0 + r, col = c0 + 16 * chunk;
    if (row < rows && col < cols) {
      uint4 v = *reinterpret_cast<const uint4 *>(x + row * cols + col);
      auto *into =
          reinterpret_cast<unsigned *>(tile + r * kStride + 16 * chunk);
      into[0] = v.x;
      into[1] = v.y;
      into[2] = v.z;
      into[3] = v.w;
    }
  }
  __syncthreads();
  int c = t / 4, chunk = t % 4;
  int64_t col = c0 + c, row = r0 + 16 * chunk;
  if (col < cols && row < rows) {
    unsigned words[4];
    for (int w = 0; w < 4; ++w) {
      unsigned word = 0;
      for (int b = 0; b < 4; ++b)
        word |= unsigned(tile[(16 * chunk + 4 * w + b) * kStride + c])
                << (8 * b);
      words[w] = word;
    }
    *reinterpret_cast<uint4 *>(y + col * rows + row) =
        make_uint4(words[0], words[1], words[2], words[3]);
  }
}

} // namespace

void fp8Amax(cudaStream_t stream, int64_t n, InElements x, float *amax) {
  if (n > 0)
    amaxKernel<<<std::min(blocksFor(n), 2048u), kThreads, 0, stream>>>(n, x,
                                                                       amax);
}

void fp8ScaleFromAmax(cudaStream_t stream, const float *amax, float *scale,
                      fp8::Format format, int margin) {
  scaleFromAmaxKernel<<<1, 1, 0, stream>>>(amax, scale, format, margin);
}

void fp8UpdateMeta(cudaStream_t stream, const float *amax, float *scale,
                   float *history, int length, fp8::AmaxAlgorithm algorithm,
                   fp8::Format format, int margin) {
  updateMetaKernel<<<1, 1, 0, stream>>>(amax, scale, history, length, algorithm,
                                        format, margin);
}

void fp8InverseScales(cudaStream_t stream, const float *scaleX,
                      const float *scaleW, float *inverseX, float *inverseW) {
  inverseScalesKernel<<<1, 1, 0, stream>>>(scaleX, scaleW, inverseX, inverseW);
}

void transposeBytes(cudaStream_t stream, int64_t rows, int64_t cols,
                    const uint8_t *x, uint8_t *y) {
  if (rows <= 0 || cols <= 0)
    return;
  if (rows % 16 == 0 && cols % 16 == 0 &&
      reinterpret_cast<uintptr_t>(x) % 16 == 0 &&
      reinterpret_cast<uintptr_t>(y) % 16 == 0) {
    dim3 wide(unsigned((cols + kWideTile - 1) / kWideTile),
              unsigned((rows + kWideTile - 1) / kWideTile));
    transposeBytesWide<<<wide, kThreads, 0, stream>>>(rows, cols, x, y);
    return;
  }
  dim3 grid(unsigned((cols + kTile - 1) / kTile),
            unsigned((rows + kTile - 1) / kTile));
  transposeBytesKernel<<<grid, dim3(kTile, 8), 0, stream>>>(rows, cols, x, y);
}

} // namespace mtrt::cuda
