// The blocked GEMM and the linear and matmul kernels built on it, forward and backward.
#include "host/kernels/KernelSupport.h"

#include <algorithm>
#include <cstring>
#include <vector>

namespace mtrt::host {

namespace {

// C is cut into tiles of kRowsPerTile x kCols<T> elements; a thread computes
// whole tiles. Inside a tile, the micro-kernel computes kMicroRows x kCols<T>
// elements with accumulators held in vector registers, sweeping p = 0..k-1
// in order over packed, contiguous copies of the operands, in the canonical
// tree of halves over p (KernelSupport.h). Each element's sum is thus
// accumulated in one order, whatever the tiling, the vector width or the
// thread count. Vectors are GCC/Clang vector extensions of 16
// bytes (SSE2, the x86-64 baseline; NEON on arm64), sized so that the
// accumulators fit the 16 registers; elementwise vector arithmetic rounds
// exactly like scalar arithmetic.
constexpr int64_t kMicroRows = 2;
constexpr int64_t kRowsPerTile = 64;
constexpr int64_t kVectorBytes = 16;
constexpr int64_t kVectorsPerRow = 4;
template <typename T>
constexpr int64_t kLanes = kVectorBytes / static_cast<int64_t>(sizeof(T));
template <typename T> constexpr int64_t kCols = kLanes<T> * kVectorsPerRow;

template <typename T> struct VectorOf {
  typedef T type __attribute__((vector_size(kVectorBytes)));
};

/// The element (i, p) of op(A) [rows, cols], stored [rows, cols] or, when
/// transposed, [cols, rows].
template <typename T> struct Operand {
  const T *data;
  bool transposed;
  int64_t rows, cols;
};

/// Packs op(B)[0..k, j0..j0+kCols) into bp[k][kCols], zero beyond n.
template <typename T>
void packB(const Operand<T> &b, int64_t j0, T *__restrict bp) {
  constexpr int64_t nr = kCols<T>;
  int64_t k = b.rows, n = b.cols;
  int64_t width = std::min(nr, n - j0);
  for (int64_t p = 0; p < k; ++p) {
    T *dst = bp + p * nr;
    if (!b.transposed) {
      const T *src = b.data + p * n + j0;
      for (int64_t j = 0; j < width; ++j)
        dst[j] = src[j];
    } else {
      for (int64_t j = 0; j < width; ++j)
        dst[j] = b.data[(j0 + j) * k + p];
    }
    for (int64_t j = width; j < nr; ++j)
      dst[j] = T(0);
  }
}

/// Packs rows [i0, i0 + kRowsPerTile) of op(A) (clipped to m) into
/// micro-panels: ap[g][p][r] = op(A)[i0 + g * kMicroRows + r][p], zero
/// beyond m. Returns the number of micro-panels.
template <typename T>
int64_t packA(const Operand<T> &a, int64_t i0, T *__restrict ap) {
  int64_t m = a.rows, k = a.cols;
  int64_t height = std::min(kRowsPerTile, m - i0);
  int64_t panels = (height + kMicroRows - 1) / kMicroRows;
  // Blocks of 64 p keep the source rows read for all panels in L1 (a
  // transposed A is read along its rows).
  constexpr int64_t kBlock = 64;
  for (int64_t p0 = 0; p0 < k; p0 += kBlock) {
    int64_t p1 = std::min(k, p0 + kBlock);
    for (int64_t g = 0; g < panels; ++g) {
      T *dst = ap + g * k * kMicroRows;
      int64_t rowsHere = std::min(kMicroRows, height - g * kMicroRows);
      int64_t first = i0 + g * kMicroRows;
      for (int64_t p = p0; p < p1; ++p) {
        for (int64_t r = 0; r < kMicroRows; ++r) {
          T value = T(0);
          if (r < rowsHere)
            value = a.transposed ? a.data[p * m + first + r]
                                 : a.data[(first + r) * k + p];
          dst[p * kMicroRows + r] = value;
        }
      }
    }
  }
  return panels;
}

/// acc[r][j] = sum_p ap[p][r] * bp[p][j], p increasing from zero.
template <typename T>
inline void microKernel(int64_t k, const T *__restrict ap,
                        const T *__restrict bp,
                        T (&acc)[kMicroRows][kCols<T>]) {
  using V = typename VectorOf<T>::type;
  constexpr int64_t lanes = kLanes<T>;
  constexpr int64_t nr = kCols<T>;
  // Fully unrolled so that the accumulators stay in registers at -O2 too.
  V c[kMicroRows][kVectorsPerRow];
  _Pragma("GCC unroll 8") for (int64_t r = 0; r < kMicroRows; ++r)
    _Pragma("GCC unroll 8") for (int64_t v = 0; v < kVectorsPerRow; ++v)
      c[r][v] = V{};
  for (int64_t p = 0; p < k; ++p) {
    V b[kVectorsPerRow];
    _Pragma("GCC unroll 8") for (int64_t v = 0; v < kVectorsPerRow; ++v)
      __builtin_memcpy(&b[v], bp + p * nr + v * lanes, sizeof(V));
    const T *a = ap + p * kMicroRows;
    _Pragma("GCC unroll 8") for (int64_t r = 0; r < kMicroRows; ++r)
      _Pragma("GCC unroll 8") for (int64_t v = 0; v < kVectorsPerRow; ++v)
        c[r][v] += b[v] * a[r];
  }
  _Pragma("GCC unroll 8") for (int64_t r = 0; r < kMicroRows; ++r)
    _Pragma("GCC unroll 8") for (int64_t v = 0; v < kVectorsPerRow; ++v)
      __builtin_memcpy(&acc[r][v * lanes], &c[r][v], sizeof(V));
}

/// microKernel over p in the canonical order: halves added as a tree down to
/// leaves of at most kCanonicalLeaf terms (detail::splitsInHalves), so a
/// product whose k is split over ranks is put back together bit for bit by
/// the all-reduce. The packed panels are contiguous in p.
template <typename T>
void canonicalMicroKernel(int64_t k, const T *__restrict ap,
                          const T *__restrict bp,
                          T (&acc)[kMicroRows][kCols<T>]) {
  if (!detail::splitsInHalves(k)) {
    microKernel<T>(k, ap, bp, acc);
    return;
  }
  int64_t half = k / 2;
  T right[kMicroRows][kCols<T>];
  canonicalMicroKernel<T>(half, ap, bp, acc);
  canonicalMicroKernel<T>(half, ap + half * kMicroRows, bp + half * kCols<T>,
                          right);
  for (int64_t r = 0; r < kMicroRows; ++r)
    for (int64_t j = 0; j < kCols<T>; ++j)
      acc[r][j] += right[r][j];
}

/// One tile of C: rows [i0, i0 + kRowsPerTile) of columns [j0, j0 + kCols),
/// clipped to C, with op(B)'s panel already packed in bp.
template <typename T>
void gemmTile(const Operand<T> &a, int64_t i0, int64_t j0, int64_t n,
              const T *bp, T *ap, T *c, bool accumulate) {
  constexpr int64_t nr = kCols<T>;
  int64_t m = a.rows, k = a.cols;
  int64_t panels = packA(a, i0, ap);
  int64_t width = std::min(nr, n - j0);
  T acc[kMicroRows][nr];
  for (int64_t g = 0; g < panels; ++g) {
    canonicalMicroKernel<T>(k, ap + g * k * kMicroRows, bp, acc);
    int64_t i = i0 + g * kMicroRows;
    int64_t height = std::min(kMicroRows, m - i);
    for (int64_t r = 0; r < height; ++r) {
      T *cr = c + (i + r) * n + j0;
      if (accumulate)
        for (int64_t j = 0; j < width; ++j)
          cr[j] += acc[r][j];
      else
        for (int64_t j = 0; j < width; ++j)
          cr[j] = acc[r][j];
    }
  }
}

} // namespace

template <typename T>
void gemm(ThreadPool &pool, int64_t batch, int64_t m, int64_t n, int64_t k,
          const T *a, bool transA, const T *b, bool transB, T *c,
          bool accumulate) {
  if (batch <= 0 || m <= 0 || n <= 0)
    return;
  if (k == 0) {
    if (!accumulate)
      std::fill(c, c + batch * m * n, T(0));
    return;
  }
  constexpr int64_t nr = kCols<T>;
  int64_t rowTiles = (m + kRowsPerTile - 1) / kRowsPerTile;
  int64_t colTiles = (n + nr - 1) / nr;
  int64_t tilesPerMatrix = rowTiles * colTiles;
  // Small products are not worth waking threads: about 2^18 multiply-adds
  // per chunk at least.
  int64_t flopsPerTile = std::min(m, kRowsPerTile) * std::min(n, nr) * k;
  int64_t grain = std::max<int64_t>(1, (int64_t(1) << 18) / flopsPerTile);
  pool.parallelFor(
      0, batch * tilesPerMatrix,
      [&](int64_t begin, int64_t end) {
        std::vector<T> bp(static_cast<size_t>(k * nr));
        std::vector<T> ap(static_cast<size_t>(k * kRowsPerTile));
        int64_t packedMatrix = -1, packedColTile = -1;
        // Tiles run column tile by column tile, so the packed panel of op(B)
        // serves all the row tiles of one column tile.
        for (int64_t t = begin; t < end; ++t) {
          int64_t matrix = t / tilesPerMatrix;
          int64_t colTile = (t % tilesPerMatrix) / rowTiles;
          int64_t rowTile = t % rowTiles;
          Operand<T> opA{a + matrix * m * k, transA, m, k};
          Operand<T> opB{b + matrix * k * n, transB, k, n};
          if (matrix != packedMatrix || colTile != packedColTile) {
            packB(opB, colTile * nr, bp.data());
            packedMatrix = matrix;
            packedColTile = colTile;
          }
          gemmTile(opA, rowTile * kRowsPerTile, colTile * nr, n, bp.data(),
                   ap.data(), c + matrix * m * n, accumulate);
        }
      },
      grain);
}

template <typename T>
void linearForward(ThreadPool &pool, int64_t rows, int64_t in, int64_t out,
                   const T *x, const T *weight, bool transposeWeight,
                   const T *bias, T *y) {
  gemm(pool, 1, rows, out, in, x, false, weight, transposeWeight, y, false);
  if (!bias)
    return;
  pool.parallelFor(
      0, rows,
      [&](int64_t begin, int64_t end) {
        for (int64_t r = begin; r < end; ++r) {
          T *yr = y + r * out;
          for (int64_t j = 0; j < out; ++j)
            yr[j] += bias[j];
        }
      },
      detail::rowGrain(out));
}

template <typename T>
void linearBackward(ThreadPool &pool, int64_t rows, int64_t in, int64_t out,
                    const T *x, const T *weight, bool transposeWeight,
                    const T *dy, T *dx, T *dweight, T *dbias, bool accumulate,
                    int64_t sequence) {
  // op(W) is [in, out]; dx [rows, in] = dy [rows, out] @ op(W)^T.
  if (dx)
    gemm(pool, 1, rows, in, out, dy, false, weight, !transposeWeight, dx,
         false);
  if (dweight) {
    if (!transposeWeight) // dW [in, out] = x^T @ dy
      gemm(pool, 1, in, out, rows, x, true, dy, false, dweight, accumulate);
    else // dW [out, in] = dy^T @ x
      gemm(pool, 1, out, in, rows, dy, true, x, false, dweight, accumulate);
  }
  if (dbias)
    detail::canonicalRowSums<T, T>(
        pool, rows, sequence, out, dbias, accumulate,
        [&](int64_t r, int64_t j) { return dy[r * out + j]; });
}

template <typename T>
void matmulForward(ThreadPool &pool, int64_t batch, int64_t m, int64_t n,
                   int64_t k, const T *lhs, bool transposeLhs, const T *rhs,
                   bool transposeRhs, T *y) {
  gemm(pool, batch, m, n, k, lhs, transposeLhs, rhs, transposeRhs, y, false);
}

template <typename T>
void matmulBackward(ThreadPool &pool, int64_t batch, int64_t m, int64_t n,
                    int64_t k, const T *lhs, bool transposeLhs, const T *rhs,
                    bool transposeRhs, const T *dy, T *dlhs, T *drhs,
                    bool accumulate) {
  // With A = op(lhs) [m, k], B = op(rhs) [k, n]: dA = dy B^T, dB = A^T dy.
  if (dlhs) {
    if (!transposeLhs) // dlhs [m, k] = dy [m, n] @ B^T
      gemm(pool, batch, m, k, n, dy, false, rhs, !transposeRhs, dlhs,
           accumulate);
    else // dlhs [k, m] = dA^T = B @ dy^T
      gemm(pool, batch, k, m, n, rhs, transposeRhs, dy, true, dlhs,
           accumulate);
  }
  if (drhs) {
    if (!transposeRhs) // drhs [k, n] = A^T @ dy
      gemm(pool, batch, k, n, m, lhs, !transposeLhs, dy, false, drhs,
           accumulate);
    else // drhs [n, k] = dB^T = dy^T @ A
      gemm(pool, batch, n, k, m, dy, true, lhs, transposeLhs, drhs,
           accumulate);
  }
}

#define MTRT_INSTANTIATE(T)                                                    \
  template void gemm<T>(ThreadPool &, int64_t, int64_t, int64_t, int64_t,      \
                        const T *, bool, const T *, bool, T *, bool);          \
  template void linearForward<T>(ThreadPool &, int64_t, int64_t, int64_t,      \
                                 const T *, const T *, bool, const T *, T *);  \
  template void linearBackward<T>(ThreadPool &, int64_t, int64_t, int64_t,     \
                                  const T *, const T *, bool, const T *, T *,  \
                                  T *, T *, bool, int64_t);                    \
  template void matmulForward<T>(ThreadPool &, int64_t, int64_t, int64_t,      \
                                 int64_t, const T *, bool, const T *, bool,    \
                                 T *);                                         \
  template void matmulBackward<T>(ThreadPool &, int64_t, int64_t, int64_t,     \
                                  int64_t, const T *, bool, const T *, bool,   \
                                  const T *, T *, T *, bool);
MTRT_INSTANTIATE_FLOAT_TYPES(MTRT_INSTANTIATE)
#undef MTRT_INSTANTIATE

} // namespace mtrt::host
