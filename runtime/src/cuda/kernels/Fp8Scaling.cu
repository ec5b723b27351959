// FP8 training's small kernels (issue 26, docs/MixedPrecision.md "FP8"): a
// tensor's amax, the scales computed from amaxes with core/Fp8.h's
// arithmetic (the host's functions, compiled for the device: the same
// bits), delayed scaling's history update, the inverse scales the FP8 GEMMs
// take, and the byte transpose that gives cuBLASLt its k-contiguous
// operands.
#include "cuda/kernels/Fp8Scaling.h"
#include "cuda/kernels/KernelSupport.cuh"

#include <cuda_fp8.h>

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

__global__ void updateMetasKernel(Fp8UpdateBatch batch, int length,
                                  fp8::AmaxAlgorithm algorithm, int margin) {
  int i = threadIdx.x;
  if (i >= batch.count)
    return;
  fp8::pushAmax(batch.history[i], length, *batch.amax[i]);
  *batch.scale[i] =
      fp8::scaleFromAmax(fp8::historyAmax(batch.history[i], length, algorithm),
                         *batch.scale[i], batch.format[i], margin);
}

__global__ void inverseTableKernel(int64_t count, const float *scales,
                                   float *table) {
  MTRT_GRID_STRIDE(i, count) {
    table[kFp8InverseTableStride * i] = 1.0f / scales[i];
  }
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
constexpr int kWideStride = kWideTile + 4;

// The second half of a wide tile's transpose: thread t of 256 writes 16
// bytes of column c0 + t / 4 of the staged tile (rows 68 bytes apart) as
// 16 consecutive bytes of row c0 + t / 4 of y, the [cols, rows] transpose.
__device__ void storeTransposedTile(const uint8_t *tile, int64_t r0,
                                    int64_t c0, int64_t rows, int64_t cols,
                                    uint8_t *y, int t) {
  int c = t / 4, chunk = t % 4;
  int64_t col = c0 + c, row = r0 + 16 * chunk;
  if (col >= cols || row >= rows)
    return;
  unsigned words[4];
  for (int w = 0; w < 4; ++w) {
    unsigned word = 0;
    for (int b = 0; b < 4; ++b)
      word |= unsigned(tile[(16 * chunk + 4 * w + b) * kWideStride + c])
              << (8 * b);
    words[w] = word;
  }
  *reinterpret_cast<uint4 *>(y + col * rows + row) =
      make_uint4(words[0], words[1], words[2], words[3]);
}

// A 64 x 64 tile per block of 256 threads, 16 bytes a thread each way:
// rows and cols are multiples of 16 and both pointers 16-byte aligned, so
// a 16-byte chunk is wholly inside or outside the matrix. Rows of the
// shared tile are 68 bytes apart, which spreads a thread's 16 reads of one
// column over two banks rather than one.
__global__ void transposeBytesWide(int64_t rows, int64_t cols, const uint8_t *x,
                                   uint8_t *y) {
  __shared__ __align__(16) uint8_t tile[kWideTile * kWideStride];
  int64_t r0 = int64_t(blockIdx.y) * kWideTile,
          c0 = int64_t(blockIdx.x) * kWideTile;
  int t = threadIdx.x;
  {
    int r = t / 4, chunk = t % 4;
    int64_t row = r0 + r, col = c0 + 16 * chunk;
    if (row < rows && col < cols) {
      uint4 v = *reinterpret_cast<const uint4 *>(x + row * cols + col);
      auto *into =
          reinterpret_cast<unsigned *>(tile + r * kWideStride + 16 * chunk);
      into[0] = v.x;
      into[1] = v.y;
      into[2] = v.z;
      into[3] = v.w;
    }
  }
  __syncthreads();
  storeTransposedTile(tile, r0, c0, rows, cols, y, t);
}

/// castTransposedKernel's grid: at most this many blocks (castToFp8's cap,
/// Precision.cu: one atomicMax a block).
constexpr int64_t kCastTransposedBlocks = 2048;

// castToFp8 with the codes' transpose: 64 x 64 tiles (a grid-stride loop
// over them), 256 threads, each converting 16 elements of a row (bf16 or
// fp32, read 16 bytes at a time; the conversion and the amax of
// castToFp8Vector) and storing their codes to
// the row and to a shared tile, then writing 16 bytes of a column of the
// tile as transposeBytesWide does. rows and cols are multiples of 16, the
// pointers 16-byte aligned.
__global__ void castTransposedKernel(int64_t rows, int64_t cols, InElements x,
                                     uint8_t *codes, uint8_t *transposed,
                                     fp8::Format format, const float *scale,
                                     float *amax) {
  __shared__ __align__(16) uint8_t tile[kWideTile * kWideStride];
  __shared__ unsigned warps[kThreads / 32];
  const float factor = *scale;
  const __nv_fp8_interpretation_t kind =
      format == fp8::Format::E4M3 ? __NV_E4M3 : __NV_E5M2;
  unsigned largest = 0;
  int64_t tilesAcross = (cols + kWideTile - 1) / kWideTile;
  int64_t tiles = tilesAcross * ((rows + kWideTile - 1) / kWideTile);
  int t = threadIdx.x;
  for (int64_t at = blockIdx.x; at < tiles; at += gridDim.x) {
    int64_t r0 = at / tilesAcross * kWideTile,
            c0 = at % tilesAcross * kWideTile;
    {
      int r = t / 4, chunk = t % 4;
      int64_t row = r0 + r, col = c0 + 16 * chunk;
      if (row < rows && col < cols) {
        int64_t first = row * cols + col;
        float v[16];
        if (x.bf16) {
          const auto *p = static_cast<const uint4 *>(x.data) + first / 8;
          uint4 halves[2] = {p[0], p[1]};
          for (int h = 0; h < 2; ++h) {
            unsigned words[4] = {halves[h].x, halves[h].y, halves[h].z,
                                 halves[h].w};
            for (int w = 0; w < 4; ++w) {
              v[8 * h + 2 * w] = __uint_as_float(words[w] << 16);
              v[8 * h + 2 * w + 1] = __uint_as_float(words[w] & 0xffff0000u);
            }
          }
        } else { // 64 bytes, 16-byte aligned (first is a multiple of 16)
          const auto *p = static_cast<const float4 *>(x.data) + first / 4;
          for (int q = 0; q < 4; ++q) {
            float4 f = p[q];
            v[4 * q] = f.x;
            v[4 * q + 1] = f.y;
            v[4 * q + 2] = f.z;
            v[4 * q + 3] = f.w;
          }
        }
        unsigned words[4] = {0, 0, 0, 0};
        for (int e = 0; e < 16; ++e) {
          largest = max(largest, __float_as_uint(fabsf(v[e])));
          unsigned code =
              __nv_cvt_float_to_fp8(v[e] * factor, __NV_SATFINITE, kind);
          words[e / 4] |= code << (8 * (e % 4));
        }
        *reinterpret_cast<uint4 *>(codes + first) =
            make_uint4(words[0], words[1], words[2], words[3]);
        auto *into =
            reinterpret_cast<unsigned *>(tile + r * kWideStride + 16 * chunk);
        for (int w = 0; w < 4; ++w)
          into[w] = words[w];
      }
    }
    __syncthreads();
    storeTransposedTile(tile, r0, c0, rows, cols, transposed, t);
    __syncthreads();
  }
  largest = detail::blockMax(largest, warps);
  if (threadIdx.x == 0)
    atomicMax(reinterpret_cast<unsigned *>(amax), largest);
}

} // namespace

bool castToFp8Transposed(cudaStream_t stream, int64_t rows, int64_t cols,
                         InElements x, uint8_t *codes, uint8_t *transposed,
                         fp8::Format format, const float *scale, float *amax) {
  auto aligned = [](const void *p) {
    return reinterpret_cast<uintptr_t>(p) % 16 == 0;
  };
  if (rows <= 0 || cols <= 0 || rows % 16 != 0 || cols % 16 != 0 ||
      !aligned(x.data) || !aligned(codes) || !aligned(transposed))
    return false;
  int64_t tiles = ((rows + kWideTile - 1) / kWideTile) *
                  ((cols + kWideTile - 1) / kWideTile);
  auto blocks = static_cast<unsigned>(std::min(tiles, kCastTransposedBlocks));
  castTransposedKernel<<<blocks, kThreads, 0, stream>>>(
      rows, cols, x, codes, transposed, format, scale, amax);
  return true;
}

void fp8Amax(cudaStream_t stream, int64_t n, InElements x, float *amax) {
  if (n > 0)
    amaxKernel<<<std::min(blocksFor(n), 2048u), kThreads, 0, stream>>>(n, x,
                                                                       amax);
}

void fp8ScaleFromAmax(cudaStream_t stream, const float *amax, float *scale,
                      fp8::Format format, int margin) {
  scaleFromAmaxKernel<<<1, 1, 0, stream>>>(amax, scale, format, margin);
}

void fp8UpdateMetas(cudaStream_t stream, const Fp8UpdateBatch &batch,
                    int length, fp8::AmaxAlgorithm algorithm, int margin) {
  if (batch.count > 0)
    updateMetasKernel<<<1, kFp8UpdateBatch, 0, stream>>>(batch, length,
                                                         algorithm, margin);
}

void fp8InverseTable(cudaStream_t stream, int64_t count, const float *scales,
                     float *table) {
  if (count > 0)
    inverseTableKernel<<<blocksFor(count), kThreads, 0, stream>>>(count, scales,
                                                                  table);
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
