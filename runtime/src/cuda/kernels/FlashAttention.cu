// Flash attention for mixed precision: the attention core (causal or not,
// grouped-query heads, dropout on the probabilities) tiled over 64 queries x
// 64 keys, with an online softmax, on the tensor cores (mma.sync
// m16n8k16, bf16 operands, fp32 accumulators). q, k, v and dout are read
// from device memory as fp32 (rounded to bf16 on their way to shared memory)
// or bf16 (copied as they are; the kernels' template parameter In); out, dq,
// dk and dv are written as fp32 or bf16 (FlashGeometry::outputsBf16, a
// uniform branch at the final stores only); the output kept for the
// gradient is bf16. Each tensor has its own strides (FlashLayout): packed
// [batch, positions, heads, D], or a piece of a larger tensor such as q, k
// and v read in place from the qkv GEMM's [batch, positions, heads, 3D].
//
// Kernels (FlashShape: 4 warps over blocks of 64 rows, or 8 warps over 128
// at head dimension 128 in the backward; warp w owns rows 16w .. 16w + 15
// of its block; the walked tiles are 64 rows):
// - forward: one block per (64 queries, query head, batch), or at head
//   dimension 128 per 128 queries with 32 rows a warp
//   (flashPairForwardKernel); out and the logsumexp of the scaled, masked
//   scores (before dropout), as the host. With dropout a kernel of its own
//   first draws the keep decisions as bits (flashDropoutMaskKernel), which
//   the forward reads and the gradient reuses.
// - backward: delta = rowsum(dout * out) first; then dq by query blocks (one
//   block per 64 or 128 queries walks the keys) and dk, dv by key blocks
//   (one block per 64 or 128 keys of a key/value head walks its group's
//   query heads and the queries that see the keys); with causal masks a
//   warp skips the tiles it cannot see. Every sum has a fixed order, so a
//   run gives the same bits every time. The keep decisions come from the
//   forward's bits (never recomputed).
// - fused backward (head dimension 128, bf16 inputs, unless the call asks
//   for a deterministic dq): delta (zeroing fp32 dq sums), then the dk/dv
//   kernel also adds each key block's share of dq, dS K, into the sums by
//   fp32 reductions (5 products a tile instead of the two kernels' 7;
//   dS^T goes through shared memory), then dq = scale * sums. dk and dv
//   are bit-identical to the two-kernel backward's; dq's additions come in
//   a varying order (its last bits vary between runs).
//
// Per-element work and occupancy are what bound these kernels
// (bench/NOTES.md), so: positions are 32-bit; scores are scaled into base-2
// exponents once (one FFMA and one ex2 per probability); only tiles on the
// causal diagonal or past the last key are masked; Q and dout fragments are
// read from shared memory where used (registers go to the accumulators, 3
// blocks a multiprocessor at head dimension 64); a tile's global loads are
// all in flight at once; and the dropout draws (core/Random.h's
// dropoutKeep: one 64-bit draw per four consecutive keys) are
// made by a kernel of their own (four threads a 64-bit mask word), so that
// the kernels of the matrix products spend no registers or issue slots on
// hashing (the forward reads a word per row and tile). Loading the next tiles
// behind the computation (into registers, or by cp.async into shared
// staging) was measured and gained nothing.
//
// Fragments of mma.m16n8k16 (g = lane / 4, t = lane % 4): A (16 x 16,
// rows x k) a0 = A[g][2t, 2t+1], a1 = A[g+8][2t, 2t+1], a2 = A[g][2t+8, +9],
// a3 = A[g+8][2t+8, +9]; B (16 x 8, k x n) b0 = B[2t, 2t+1][g],
// b1 = B[2t+8, +9][g]; C (16 x 8) c0, c1 = C[g][2t, 2t+1], c2, c3 =
// C[g+8][2t, 2t+1]. A score accumulator's C fragments of two neighbouring
// 8-key tiles are, repacked to bf16, the A fragment of the next product.
// Fragments come from shared memory by ldmatrix.x4 (four 8 x 8 matrices: an
// A fragment, or the B fragments of two neighbouring 8-column tiles; the
// transposing form for B = a [k][n] tile). Shared tiles are bf16
// [rows][cols + 8]: the padding puts the eight 16-byte rows of a matrix in
// different banks.
#include "core/Error.h"
#include "core/OpScratch.h"
#include "core/Random.h"
#include "cuda/kernels/AttentionMask.cuh"
#include "cuda/kernels/HopperAttention.h"
#include "cuda/kernels/KernelSupport.cuh"

#include <cuda_bf16.h>

#include <cmath>
#include <cstdlib>
#include <cstring>
#include <string>
#include <type_traits>

namespace mtrt::cuda {

namespace {

using detail::kWarp;

constexpr int kTile = 64; // rows of a walked tile (keys, or queries)
static_assert(kTile == mtrt::scratch::kFlashTile,
              "core/OpScratch.h sizes the dropout bits by this tile");
constexpr int kPad = 8;
constexpr float kLog2e = 1.4426950408889634f;
constexpr float kLn2 = 0.6931471805599453f;

/// The kernels' shape at head dimension D. kWarps warps of 16 rows own a
/// block's kRows rows (queries in the forward and the dq kernel, keys in
/// the dk/dv kernel) and walk tiles of kTile rows of the other side.
/// Narrow: 4 warps, 64 rows, the walked tiles loaded through registers
/// between two uses (3 blocks a multiprocessor at head dimension 64: 168
/// registers; 3 blocks ran the forward 20% and the backward 10% faster
/// than 2, 4 spilled). Wide: 8 warps, 128 rows, bf16 tiles copied by
/// cp.async (no registers held for the copy), with kStages == 2 into one
/// stage while the other is used. A block of 4 warps at 255 registers left
/// one warp per scheduler of a multiprocessor at head dimension 128.
template <int D, bool Wide, int Stages = 1> struct FlashShape {
  static constexpr int kD = D;
  static constexpr bool kWide = Wide;
  static constexpr int kWarps = Wide ? 8 : 4;
  static constexpr int kThreads = kWarps * kWarp;
  static constexpr int kRows = 16 * kWarps;
  static constexpr int kStages = Stages;
  /// Blocks per multiprocessor the register budget is cut for.
  static constexpr int kMinBlocks = D <= 64 ? 3 : 1;
};

/// The forward's and the backward kernels' shapes. The backward is wide
/// with two stages at head dimension 128 (its kernels need 240-255
/// registers a thread, so one block a multiprocessor: 8 warps rather than
/// 4, 11% faster at gpt-1.3b's shape). The forward is narrow; at head
/// dimension 128 flashPairForwardKernel (32 rows a warp) replaces it.
template <int D> using ForwardShape = FlashShape<D, false, 1>;
template <int D>
using BackwardShape = FlashShape<D, D >= 128, D >= 128 ? 2 : 1>;

struct FlashGeometry {
  int seqQ, seqK, headsQ, headsKv, group, keyBlocks;
  // Each tensor's strides (FlashLayout, resolved): q, dout, out and dq
  // over (batch, query, query head), k, v, dk, dv over (batch, key,
  // key/value head); `saved` is the forward's bf16 output copy (packed).
  FlashLayout q, k, v, dout, out, dq, dk, dv, saved;
  bool causal;
  float scale;     // the softmax scale
  float scaleLog2; // scale * log2(e): scores to base-2 exponents
  bool hasDropout;
  // The mask's keys: the op's seed, the micro-batch's first sample.
  uint64_t seedKey, firstSample;
  uint32_t threshold16;
  float dropoutScale;
  // The global position of this call's tensor (data- and tensor-parallel
  // ranks).
  int64_t batchOffset, headOffset, globalHeadsQ;
  bool outputsBf16; // out, dq, dk, dv in bf16 (else fp32)

  /// Element 0 of query i of head h in batch b of a tensor of `layout`.
  __device__ int64_t queryAt(const FlashLayout &layout, int b, int i,
                             int h) const {
    return (static_cast<int64_t>(b) * seqQ + i) * layout.position +
           static_cast<int64_t>(h) * layout.head;
  }
  /// Element 0 of key j of key/value head g in batch b.
  __device__ int64_t keyAt(const FlashLayout &layout, int b, int j,
                           int g) const {
    return (static_cast<int64_t>(b) * seqK + j) * layout.position +
           static_cast<int64_t>(g) * layout.head;
  }
  __device__ int64_t rowIndex(int b, int h, int i) const {
    return (static_cast<int64_t>(b) * headsQ + h) * seqQ + i;
  }
  /// The mask word of query i, key block kb: bit j % 64 of word
  /// rowIndex(b, h, i) * keyBlocks + j / 64 is P[b, h, i, j]'s keep
  /// decision.
  __device__ int64_t maskWord(int b, int h, int i, int kb) const {
    return rowIndex(b, h, i) * keyBlocks + kb;
  }
  /// The key of batch row b's sample (host AttentionGeometry::
  /// probabilityRow).
  __device__ uint64_t sampleKey(int b) const {
    return random::sampleKey(
        seedKey, firstSample + static_cast<uint64_t>(b + batchOffset));
  }
  /// The position of P[b, h, i, 0] in its sample's [headsQ, seqQ, seqK]
  /// of the global tensor.
  __device__ uint64_t probabilityRow(int h, int i) const {
    return static_cast<uint64_t>(
        ((static_cast<int64_t>(h) + headOffset) * seqQ + i) * seqK);
  }
  /// Whether a tile of keys [k0, k0 + 64) needs the causal or key-count
  /// mask for a warp's queries [row0, row0 + 16).
  __device__ bool masked(int row0, int k0) const {
    return k0 + kTile > seqK || (causal && k0 + kTile - 1 > row0);
  }
};

/// `layout`, or the packed [batch, positions, heads, headDim] one when it
/// is unset.
FlashLayout resolve(FlashLayout layout, int64_t heads, int64_t headDim) {
  if (layout.position == 0 && layout.head == 0)
    return {heads * headDim, headDim};
  return layout;
}

FlashGeometry makeGeometry(const AttentionParams &p, const FlashTensors &io) {
  FlashGeometry g{};
  g.outputsBf16 = io.outputsBf16;
  g.seqQ = static_cast<int>(p.seqQ);
  g.seqK = static_cast<int>(p.seqK);
  g.headsQ = static_cast<int>(p.headsQ);
  g.headsKv = static_cast<int>(p.headsKv);
  g.group = static_cast<int>(p.headsQ / p.headsKv);
  g.q = resolve(io.qLayout, p.headsQ, p.headDim);
  g.dout = resolve(io.doutLayout, p.headsQ, p.headDim);
  g.out = resolve(io.outLayout, p.headsQ, p.headDim);
  g.dq = resolve(io.dqLayout, p.headsQ, p.headDim);
  g.saved = resolve(FlashLayout(), p.headsQ, p.headDim);
  g.k = resolve(io.kLayout, p.headsKv, p.headDim);
  g.v = resolve(io.vLayout, p.headsKv, p.headDim);
  g.dk = resolve(io.dkLayout, p.headsKv, p.headDim);
  g.dv = resolve(io.dvLayout, p.headsKv, p.headDim);
  g.causal = p.causal;
  g.keyBlocks = static_cast<int>((p.seqK + kTile - 1) / kTile);
  double scale =
      p.scale > 0 ? p.scale : 1.0 / std::sqrt(static_cast<double>(p.headDim));
  g.scale = static_cast<float>(scale);
  g.scaleLog2 = static_cast<float>(scale * 1.4426950408889634);
  g.hasDropout = p.dropoutP > 0;
  g.seedKey = random::seedKey(p.seed);
  g.firstSample = p.firstSample;
  g.threshold16 = random::dropoutThreshold16(p.dropoutP);
  g.dropoutScale =
      static_cast<float>(p.dropoutP > 0 ? 1.0 / (1.0 - p.dropoutP) : 1.0);
  g.batchOffset = p.batchOffset;
  g.headOffset = p.headOffset;
  g.globalHeadsQ = p.globalHeadsQ ? p.globalHeadsQ : p.headsQ;
  return g;
}

__device__ inline uint32_t packBf16(float lo, float hi) {
  __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
  return *reinterpret_cast<uint32_t *>(&v);
}

__device__ inline float toFloat(float x) { return x; }
__device__ inline float toFloat(__nv_bfloat16 x) { return __bfloat162float(x); }

/// Two neighbouring elements (to: even) of an output in `T`.
__device__ inline void storePair(float *to, float lo, float hi) {
  *reinterpret_cast<float2 *>(to) = make_float2(lo, hi);
}
__device__ inline void storePair(__nv_bfloat16 *to, float lo, float hi) {
  *reinterpret_cast<__nv_bfloat162 *>(to) = __floats2bfloat162_rn(lo, hi);
}
/// The same, into an output of the geometry's type (outputsBf16).
__device__ inline void storeOutputPair(const FlashGeometry &geo, void *base,
                                       int64_t at, float lo, float hi) {
  if (geo.outputsBf16)
    storePair(static_cast<__nv_bfloat16 *>(base) + at, lo, hi);
  else
    storePair(static_cast<float *>(base) + at, lo, hi);
}

/// c += a b on the tensor cores.
__device__ inline void mma(float (&c)[4], const uint32_t (&a)[4],
                           const uint32_t (&b)[2]) {
  asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 "
               "{%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
               "{%0, %1, %2, %3};\n"
               : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
               : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]),
                 "r"(b[1]));
}

__device__ inline uint32_t sharedAddress(const __nv_bfloat16 *p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

/// Four 8 x 8 matrices of a shared tile, one ldmatrix: lanes 8i .. 8i + 7
/// address matrix i's rows; register i gets matrix i's element [g][2t, +1]
/// (transposed: [2t, +1][g]).
__device__ inline void loadMatrices(uint32_t (&m)[4],
                                    const __nv_bfloat16 *row) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 "
               "{%0, %1, %2, %3}, [%4];\n"
               : "=r"(m[0]), "=r"(m[1]), "=r"(m[2]), "=r"(m[3])
               : "r"(sharedAddress(row)));
}
__device__ inline void loadMatricesTransposed(uint32_t (&m)[4],
                                              const __nv_bfloat16 *row) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 "
               "{%0, %1, %2, %3}, [%4];\n"
               : "=r"(m[0]), "=r"(m[1]), "=r"(m[2]), "=r"(m[3])
               : "r"(sharedAddress(row)));
}

/// The A fragment at (row0, k0) of a row-major shared tile: matrices
/// (rows 0-7, k 0-7), (8-15, 0-7), (0-7, 8-15), (8-15, 8-15), so lane l
/// addresses row row0 + l % 16 at column k0 + 8 (l / 16).
__device__ inline void loadA(uint32_t (&a)[4], const __nv_bfloat16 *tile,
                             int ld, int row0, int k0, int lane) {
  loadMatrices(a, tile + (row0 + lane % 16) * ld + k0 + 8 * (lane / 16));
}

/// The B fragments at (k0, n0) and (k0, n0 + 8) of B = tile^T, tile [n][k]
/// row-major: matrices (n 0-7, k 0-7), (0-7, 8-15), (8-15, 0-7),
/// (8-15, 8-15), so lane l addresses row n0 + l % 8 + 8 (l / 16) at column
/// k0 + 8 ((l / 8) % 2).
__device__ inline void loadB(uint32_t (&b0)[2], uint32_t (&b1)[2],
                             const __nv_bfloat16 *tile, int ld, int n0,
                             int k0, int lane) {
  uint32_t m[4];
  loadMatrices(m, tile + (n0 + lane % 8 + 8 * (lane / 16)) * ld + k0 +
                      8 * (lane / 8 % 2));
  b0[0] = m[0];
  b0[1] = m[1];
  b1[0] = m[2];
  b1[1] = m[3];
}

/// The B fragments at (k0, n0) and (k0, n0 + 8) of B = tile, tile [k][n]
/// row-major, by the transposing load: matrices (k 0-7, n 0-7), (8-15,
/// 0-7), (0-7, 8-15), (8-15, 8-15), so lane l addresses row k0 + l % 16 at
/// column n0 + 8 (l / 16).
__device__ inline void loadBTransposed(uint32_t (&b0)[2], uint32_t (&b1)[2],
                                       const __nv_bfloat16 *tile, int ld,
                                       int k0, int n0, int lane) {
  uint32_t m[4];
  loadMatricesTransposed(m, tile + (k0 + lane % 16) * ld + n0 +
                                8 * (lane / 16));
  b0[0] = m[0];
  b0[1] = m[1];
  b1[0] = m[2];
  b1[1] = m[3];
}

/// The A fragment of 16 columns (two 8-column accumulator tiles) of a
/// 16-row accumulator, rounded to bf16.
__device__ inline void accumulatorToA(uint32_t (&a)[4], const float (&lo)[4],
                                      const float (&hi)[4]) {
  a[0] = packBf16(lo[0], lo[1]);
  a[1] = packBf16(lo[2], lo[3]);
  a[2] = packBf16(hi[0], hi[1]);
  a[3] = packBf16(hi[2], hi[3]);
}

/// acc += S * tile for a warp's 16 rows: S is the 16 x kTile accumulator s
/// (rounded to bf16 as the A operand), tile the bf16 shared [kTile][ld]
/// tile whose first D columns are read (as B, transposed by ldmatrix).
template <int D>
__device__ inline void accumulateTimesTile(float (&acc)[D / 8][4],
                                           const float (&s)[kTile / 8][4],
                                           const __nv_bfloat16 *tile, int ld,
                                           int lane) {
#pragma unroll
  for (int kc = 0; kc < kTile / 16; ++kc) {
    uint32_t a[4];
    accumulatorToA(a, s[2 * kc], s[2 * kc + 1]);
#pragma unroll
    for (int n = 0; n < D / 8; n += 2) {
      uint32_t b0[2], b1[2];
      loadBTransposed(b0, b1, tile, ld, kc * 16, n * 8, lane);
      mma(acc[n], a, b0);
      mma(acc[n + 1], a, b1);
    }
  }
}

/// One thread's share of rows [row0, row0 + Rows) of a [positions, stride]
/// tensor of T (D columns at `base`), held in registers between `load`
/// (which issues every global load at once: one round trip of latency a
/// tile) and `store` (which writes them, rounded to bf16 from fp32, into a
/// bf16 shared tile [Rows][D + kPad]); rows past `rows` are zeros.
template <int D, typename T, int Rows, int Threads> struct TileFetch;

template <int D, int Rows, int Threads>
struct TileFetch<D, float, Rows, Threads> {
  static constexpr int kQuads = D / 4;
  static constexpr int kPerThread = Rows * kQuads / Threads;
  static_assert(kPerThread * Threads == Rows * kQuads,
                "a tile's quads split evenly over the threads");
  float4 x[kPerThread];

  __device__ void load(const float *base, int64_t stride, int row0,
                       int rows) {
#pragma unroll
    for (int u = 0; u < kPerThread; ++u) {
      int c = threadIdx.x + u * Threads;
      int r = c / kQuads, col = (c % kQuads) * 4;
      x[u] = row0 + r < rows
                 ? __ldg(reinterpret_cast<const float4 *>(
                       base + (row0 + r) * stride + col))
                 : make_float4(0.f, 0.f, 0.f, 0.f);
    }
  }
  __device__ void store(__nv_bfloat16 *tile) const {
#pragma unroll
    for (int u = 0; u < kPerThread; ++u) {
      int c = threadIdx.x + u * Threads;
      int r = c / kQuads, col = (c % kQuads) * 4;
      __nv_bfloat16 *to = tile + r * (D + kPad) + col;
      *reinterpret_cast<__nv_bfloat162 *>(to) =
          __floats2bfloat162_rn(x[u].x, x[u].y);
      *reinterpret_cast<__nv_bfloat162 *>(to + 2) =
          __floats2bfloat162_rn(x[u].z, x[u].w);
    }
  }
};

/// bf16 in device memory: 16-byte chunks (8 elements) copied as they are
/// (D + kPad elements a shared row keep every chunk 16-byte aligned).
template <int D, int Rows, int Threads>
struct TileFetch<D, __nv_bfloat16, Rows, Threads> {
  static constexpr int kChunks = D / 8;
  static constexpr int kPerThread = Rows * kChunks / Threads;
  static_assert(kPerThread * Threads == Rows * kChunks,
                "a tile's chunks split evenly over the threads");
  uint4 x[kPerThread];

  __device__ void load(const __nv_bfloat16 *base, int64_t stride, int row0,
                       int rows) {
#pragma unroll
    for (int u = 0; u < kPerThread; ++u) {
      int c = threadIdx.x + u * Threads;
      int r = c / kChunks, col = (c % kChunks) * 8;
      x[u] = row0 + r < rows
                 ? __ldg(reinterpret_cast<const uint4 *>(
                       base + (row0 + r) * stride + col))
                 : make_uint4(0u, 0u, 0u, 0u);
    }
  }
  __device__ void store(__nv_bfloat16 *tile) const {
#pragma unroll
    for (int u = 0; u < kPerThread; ++u) {
      int c = threadIdx.x + u * Threads;
      int r = c / kChunks, col = (c % kChunks) * 8;
      *reinterpret_cast<uint4 *>(tile + r * (D + kPad) + col) = x[u];
    }
  }
};

/// cp.async: `bytes` (4, 8 or 16) from global `from` to shared `to`, or
/// zeros when !valid (`from` is then not read).
template <int Bytes>
__device__ inline void copyAsync(void *to, const void *from, bool valid) {
  static_assert(Bytes == 4 || Bytes == 8 || Bytes == 16, "cp.async sizes");
  auto address = static_cast<uint32_t>(__cvta_generic_to_shared(to));
  int size = valid ? Bytes : 0;
  if constexpr (Bytes == 16)
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n"
                 ::"r"(address), "l"(from), "r"(size)
                 : "memory");
  else
    asm volatile("cp.async.ca.shared.global [%0], [%1], %2, %3;\n"
                 ::"r"(address), "l"(from), "n"(Bytes), "r"(size)
                 : "memory");
}
/// Closes this thread's group of cp.async copies (an empty group when it
/// issued none).
__device__ inline void commitCopies() {
  asm volatile("cp.async.commit_group;\n" ::: "memory");
}
/// Waits until at most `Pending` of this thread's newest groups are in
/// flight (the shared writes are then visible to the thread; a barrier
/// makes them visible to the block).
template <int Pending> __device__ inline void waitCopies() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(Pending) : "memory");
}

/// Whether Shape copies tiles of T by cp.async: wide shapes, bf16.
template <typename Shape, typename T>
constexpr bool kCopiesAsync =
    Shape::kWide && std::is_same_v<T, __nv_bfloat16>;

/// Rows [row0, row0 + Rows) of a tensor of T (D columns at `base`, `stride`
/// apart; rows past `rows` zeros) into the bf16 shared tile [Rows][D +
/// kPad]: by cp.async where kCopiesAsync (complete after commitCopies and
/// waitCopies), else loaded into registers and stored (complete on return).
template <typename Shape, int Rows, typename T>
__device__ inline void fetchTile(__nv_bfloat16 *tile, const T *base,
                                 int64_t stride, int row0, int rows) {
  constexpr int D = Shape::kD, kThreads = Shape::kThreads;
  if constexpr (kCopiesAsync<Shape, T>) {
    constexpr int kChunks = D / 8;
    constexpr int kPerThread = Rows * kChunks / kThreads;
    static_assert(kPerThread * kThreads == Rows * kChunks,
                  "a tile's chunks split evenly over the threads");
#pragma unroll
    for (int u = 0; u < kPerThread; ++u) {
      int c = threadIdx.x + u * kThreads;
      int r = c / kChunks, col = (c % kChunks) * 8;
      bool in = row0 + r < rows;
      int64_t at = in ? static_cast<int64_t>(row0 + r) * stride + col : 0;
      copyAsync<16>(tile + r * (D + kPad) + col, base + at, in);
    }
  } else {
    TileFetch<D, T, Rows, kThreads> fetch;
    fetch.load(base, stride, row0, rows);
    fetch.store(tile);
  }
}

/// The same for two tensors (through registers: every load of both issued
/// before the first store).
template <typename Shape, int Rows, typename T>
__device__ inline void fetchTiles(__nv_bfloat16 *tileA, __nv_bfloat16 *tileB,
                                  const T *baseA, int64_t strideA,
                                  const T *baseB, int64_t strideB, int row0,
                                  int rows) {
  constexpr int D = Shape::kD;
  if constexpr (kCopiesAsync<Shape, T>) {
    fetchTile<Shape, Rows>(tileA, baseA, strideA, row0, rows);
    fetchTile<Shape, Rows>(tileB, baseB, strideB, row0, rows);
  } else {
    constexpr int kThreads = Shape::kThreads;
    TileFetch<D, T, Rows, kThreads> a, b;
    a.load(baseA, strideA, row0, rows);
    b.load(baseB, strideB, row0, rows);
    a.store(tileA);
    b.store(tileB);
  }
}

/// 2^x by the multi-function unit (2^-inf = 0).
__device__ inline float fastExp2(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
  return y;
}

/// Sums over the four lanes that share an accumulator row.
__device__ inline float rowSum(float x) {
  x += __shfl_xor_sync(0xffffffffu, x, 1);
  x += __shfl_xor_sync(0xffffffffu, x, 2);
  return x;
}
__device__ inline float rowMax(float x) {
  x = fmaxf(x, __shfl_xor_sync(0xffffffffu, x, 1));
  x = fmaxf(x, __shfl_xor_sync(0xffffffffu, x, 2));
  return x;
}

/// Sets the scores of a 16-row accumulator tile that query rows `rows` may
/// not see (causal, or keys past seqK) to -infinity; k0 is the tile's first
/// key.
__device__ inline void maskScores(const FlashGeometry &geo,
                                  float (&s)[kTile / 8][4], const int (&rows)[2],
                                  int k0, int t) {
#pragma unroll
  for (int n = 0; n < kTile / 8; ++n)
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      int j = k0 + n * 8 + 2 * t + (e & 1);
      if (j >= geo.seqK || (geo.causal && j > rows[e / 2]))
        s[n][e] = -INFINITY;
    }
}

/// Threads of flashDropoutMaskKernel: four a row of a 64-row query block.
constexpr int kMaskThreads = 4 * kTile;

// Grid (query blocks of 64, headsQ, batch), kMaskThreads threads: for each
// key block kb the block's rows see (causal: kb <= q0 / 64, the same for
// all 64 rows; keys past seqK included), thread t draws bits 16 (t % 4) ..
// +15 of query row i = q0 + t / 4's word rowIndex(b, h, i) * keyBlocks + kb:
// bit j = dropoutKeep(sampleKey(b), probabilityRow(h, i) + 64 kb
// + j), four draws of four bits when the row starts at a multiple of 4
// (seqK % 4 == 0), else a draw a bit. The forwards read these words rather
// than draw in the kernels that hold the matrix products (there the hashing
// took a third of the forward at gpt-1.3b's shape: bench/NOTES.md), and
// the backward reads them again.
__global__ void __launch_bounds__(kMaskThreads)
    flashDropoutMaskKernel(FlashGeometry geo, uint64_t *mask) {
  int q0 = static_cast<int>(blockIdx.x) * kTile;
  int h = static_cast<int>(blockIdx.y), b = static_cast<int>(blockIdx.z);
  int i = q0 + static_cast<int>(threadIdx.x) / 4;
  int quarter = static_cast<int>(threadIdx.x) % 4;
  bool in = i < geo.seqQ; // the others only join the shuffles
  int row = in ? i : q0;
  uint64_t key = geo.sampleKey(b);
  uint64_t first = geo.probabilityRow(h, row) + 16 * quarter;
  uint64_t *rowWords = mask + geo.maskWord(b, h, row, 0);
  int blocksSeen =
      geo.causal ? min(geo.keyBlocks, q0 / kTile + 1) : geo.keyBlocks;
  const random::DropoutLanes lanes = random::dropoutLanes(geo.threshold16);
  for (int kb = 0; kb < blocksSeen; ++kb, first += kTile) {
    uint64_t word = quadMaskWord(
        drawMaskBits16(key, first, geo.threshold16, lanes), quarter);
    if (in && quarter == 0)
      rowWords[kb] = word;
  }
}

/// The mask words of the tile at k0 for this lane's rows of a 16-row
/// m-tile (rows g and g + 8); zero past seqQ.
__device__ inline void loadMaskWords(const FlashGeometry &geo,
                                     const uint64_t *mask, uint64_t (&words)[2],
                                     const int (&rows)[2], int b, int h,
                                     int k0) {
#pragma unroll
  for (int r = 0; r < 2; ++r)
    words[r] = rows[r] < geo.seqQ
                   ? __ldg(mask + geo.maskWord(b, h, rows[r], k0 / kTile))
                   : 0ull;
}

/// Whether loadMaskWords' words, each shifted right by 2t, keep element e
/// of this lane's accumulator tile n (key k0 + 8n + 2t + (e & 1) of row
/// e / 2).
__device__ inline bool kept(const uint64_t (&shifted)[2], int n, int e) {
  return (shifted[e / 2] >> (8 * n + (e & 1))) & 1;
}

/// The forward at head dimension 128: each warp owns 32 query rows, two
/// 16-row m-tiles that share every K and V fragment (a 16-row warp loads
/// each K/V fragment for 8 products, a 32-row one for 16), 4 warps over
/// 128 queries a block. K and V have one buffer each, refilled in turn
/// (FlashAttention-2's flow): a tile's V is copied while its scores are
/// computed, the next K while its probabilities are. The softmax scale is
/// folded into the base-2 exponent (one FFMA and one ex2 a probability),
/// the output's rescale is skipped when no row maximum of the warp grew, P
/// stays in registers as the A operand of P V, and dropout's 1 / (1 - p)
/// goes into the final normalization. A tile's mask words are copied into
/// shared memory with its V, so that no registers hold them during the
/// score products.
template <int D> struct PairForwardShape {
  static constexpr int kD = D;
  static constexpr int kWarps = 4;
  static constexpr int kThreads = kWarps * kWarp;
  static constexpr int kRows = 32 * kWarps;
  /// Tiles of bf16 copied by cp.async (kCopiesAsync; the kernel takes bf16
  /// inputs only: with fp32 ones, 64 more registers a thread for a tile's
  /// copy, it spilled and ran slower than the 16-row forward).
  static constexpr bool kWide = true;
  /// 2 blocks a multiprocessor: at most 255 registers a thread.
  static constexpr int kMinBlocks = 2;
};

/// Shared: Q [kRows][D + 8], K and V [64][D + 8] (bf16), then the mask
/// words of the current tile, one a row.
template <int D> constexpr size_t pairForwardShared() {
  return sizeof(__nv_bfloat16) * (PairForwardShape<D>::kRows + 2 * kTile) *
             (D + kPad) +
         sizeof(uint64_t) * PairForwardShape<D>::kRows;
}

// Grid (query blocks of 128, headsQ, batch). Shared: pairForwardShared.
// Outputs as flashForwardKernel's; `Dropout` is geo.hasDropout.
template <int D, typename In, bool Dropout>
__global__ void __launch_bounds__(PairForwardShape<D>::kThreads,
                                  PairForwardShape<D>::kMinBlocks)
    flashPairForwardKernel(FlashGeometry geo, const In *q, const In *k,
                           const In *v, void *out, __nv_bfloat16 *outCopy,
                           float *logsumexp, uint64_t *mask) {
  using Shape = PairForwardShape<D>;
  constexpr int ld = D + kPad;
  constexpr int kN = kTile / 8; // 8-key accumulator tiles of a walked tile
  extern __shared__ __align__(16) unsigned char flashShared[];
  auto *qs = reinterpret_cast<__nv_bfloat16 *>(flashShared);
  __nv_bfloat16 *ks = qs + Shape::kRows * ld, *vs = ks + kTile * ld;
  // The mask words of rows q0 .. q0 + 127 for the current tile.
  auto *maskStage = reinterpret_cast<uint64_t *>(vs + kTile * ld);
  static_assert(Shape::kThreads == Shape::kRows, "a thread copies a word");
  int q0 = (gridDim.x - 1 - blockIdx.x) * Shape::kRows; // longest rows first
  int h = blockIdx.y, b = blockIdx.z, grp = h / geo.group;
  int warp = threadIdx.x / kWarp, lane = threadIdx.x % kWarp;
  int g = lane / 4, t = lane % 4;
  const In *kBase = k + geo.keyAt(geo.k, b, 0, grp);
  const In *vBase = v + geo.keyAt(geo.v, b, 0, grp);
  static_assert(kCopiesAsync<Shape, In>, "bf16 tiles copied by cp.async");

  // Q and the first K in one group of copies.
  fetchTile<Shape, Shape::kRows>(qs, q + geo.queryAt(geo.q, b, 0, h),
                                 geo.q.position, q0, geo.seqQ);
  fetchTile<Shape, kTile>(ks, kBase, geo.k.position, 0, geo.seqK);
  commitCopies();

  int warpRow0 = q0 + warp * 32;
  // This lane's rows: m-tile i, half r (rows g and g + 8).
  int rows[2][2] = {{warpRow0 + g, warpRow0 + g + 8},
                    {warpRow0 + 16 + g, warpRow0 + 24 + g}};
  // m: the running maxima of the scores in base-2 exponents.
  float m[2][2], l[2][2];
#pragma unroll
  for (int i = 0; i < 2; ++i)
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      m[i][r] = -INFINITY;
      l[i][r] = 0.f;
    }
  float o[2][D / 8][4];
#pragma unroll
  for (int i = 0; i < 2; ++i)
#pragma unroll
    for (int n = 0; n < D / 8; ++n)
      o[i][n][0] = o[i][n][1] = o[i][n][2] = o[i][n][3] = 0.f;

  int keyEnd = geo.causal ? min(geo.seqK, q0 + Shape::kRows) : geo.seqK;
  int warpKeyEnd = geo.causal ? min(geo.seqK, warpRow0 + 32) : geo.seqK;
  for (int k0 = 0; k0 < keyEnd; k0 += kTile) {
    bool active = k0 < warpKeyEnd;
    waitCopies<0>();
    __syncthreads(); // K (and Q) in place; every warp done with the last V
    fetchTile<Shape, kTile>(vs, vBase, geo.v.position, k0, geo.seqK);
    if constexpr (Dropout) {
      int row = q0 + static_cast<int>(threadIdx.x);
      bool in = row < geo.seqQ;
      copyAsync<8>(maskStage + threadIdx.x,
                   mask + (in ? geo.maskWord(b, h, row, k0 / kTile) : 0), in);
    }
    commitCopies();
    float s[2][kN][4];
    if (active) {
#pragma unroll
      for (int i = 0; i < 2; ++i)
#pragma unroll
        for (int n = 0; n < kN; ++n)
          s[i][n][0] = s[i][n][1] = s[i][n][2] = s[i][n][3] = 0.f;
#pragma unroll
      for (int kk = 0; kk < D / 16; ++kk) {
        uint32_t qf[2][4];
        loadA(qf[0], qs, ld, warp * 32, kk * 16, lane);
        loadA(qf[1], qs, ld, warp * 32 + 16, kk * 16, lane);
#pragma unroll
        for (int n = 0; n < kN; n += 2) {
          uint32_t b0[2], b1[2];
          loadB(b0, b1, ks, ld, n * 8, kk * 16, lane);
#pragma unroll
          for (int i = 0; i < 2; ++i) {
            mma(s[i][n], qf[i], b0);
            mma(s[i][n + 1], qf[i], b1);
          }
        }
      }
    }
    waitCopies<0>();
    __syncthreads(); // V in place; every warp done with K
    // The next K, copied while this tile's probabilities and P V run.
    if (k0 + kTile < keyEnd) {
      fetchTile<Shape, kTile>(ks, kBase, geo.k.position, k0 + kTile,
                              geo.seqK);
      commitCopies();
    }
    if (active) {
      float base[2][2], alpha[2][2];
      bool grew = false;
#pragma unroll
      for (int i = 0; i < 2; ++i) {
        if (geo.masked(warpRow0 + 16 * i, k0))
          maskScores(geo, s[i], rows[i], k0, t);
        float blockMax[2] = {-INFINITY, -INFINITY};
#pragma unroll
        for (int n = 0; n < kN; ++n)
#pragma unroll
          for (int e = 0; e < 4; ++e)
            blockMax[e / 2] = fmaxf(blockMax[e / 2], s[i][n][e]);
#pragma unroll
        for (int r = 0; r < 2; ++r) {
          float next = fmaxf(m[i][r], rowMax(blockMax[r]) * geo.scaleLog2);
          base[i][r] = next == -INFINITY ? 0.f : next;
          alpha[i][r] = fastExp2(m[i][r] - base[i][r]);
          grew |= next != m[i][r];
          m[i][r] = next;
          l[i][r] *= alpha[i][r];
        }
      }
      // Unless some row of the warp has a new maximum, every factor is 1.
      if (__any_sync(0xffffffffu, grew)) {
#pragma unroll
        for (int i = 0; i < 2; ++i)
#pragma unroll
          for (int n = 0; n < D / 8; ++n) {
            o[i][n][0] *= alpha[i][0];
            o[i][n][1] *= alpha[i][0];
            o[i][n][2] *= alpha[i][1];
            o[i][n][3] *= alpha[i][1];
          }
      }
      // P (dropped probabilities zero) in bf16 as the A fragments of P V:
      // pf[i][kc] covers keys 16 kc .. 16 kc + 15 of m-tile i.
      uint32_t pf[2][kTile / 16][4];
#pragma unroll
      for (int i = 0; i < 2; ++i) {
        uint64_t keep[2] = {0ull, 0ull};
        if constexpr (Dropout) {
          keep[0] = maskStage[warp * 32 + 16 * i + g] >> (2 * t);
          keep[1] = maskStage[warp * 32 + 16 * i + g + 8] >> (2 * t);
        }
#pragma unroll
        for (int n = 0; n < kN; ++n)
#pragma unroll
          for (int e = 0; e < 4; ++e) {
            float p =
                fastExp2(fmaf(s[i][n][e], geo.scaleLog2, -base[i][e / 2]));
            l[i][e / 2] += p;
            if constexpr (Dropout)
              p = kept(keep, n, e) ? p : 0.f;
            s[i][n][e] = p;
          }
#pragma unroll
        for (int kc = 0; kc < kTile / 16; ++kc)
          accumulatorToA(pf[i][kc], s[i][2 * kc], s[i][2 * kc + 1]);
      }
#pragma unroll
      for (int kc = 0; kc < kTile / 16; ++kc)
#pragma unroll
        for (int n = 0; n < D / 8; n += 2) {
          uint32_t b0[2], b1[2];
          loadBTransposed(b0, b1, vs, ld, kc * 16, n * 8, lane);
#pragma unroll
          for (int i = 0; i < 2; ++i) {
            mma(o[i][n], pf[i][kc], b0);
            mma(o[i][n + 1], pf[i][kc], b1);
          }
        }
    }
  }
  // Dropout's 1 / (1 - p) for the kept probabilities (none kept at p >= 1).
  float keptScale = !Dropout                    ? 1.f
                    : geo.threshold16 > 0xFFFFu ? 0.f
                                                : geo.dropoutScale;
#pragma unroll
  for (int i = 0; i < 2; ++i)
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      float sum = rowSum(l[i][r]);
      int row = rows[i][r];
      if (row >= geo.seqQ)
        continue;
      float factor = sum > 0.f ? keptScale / sum : 0.f;
      if (t == 0)
        logsumexp[geo.rowIndex(b, h, row)] = (m[i][r] + log2f(sum)) * kLn2;
#pragma unroll
      for (int n = 0; n < D / 8; ++n) {
        float lo = o[i][n][2 * r] * factor, hi = o[i][n][2 * r + 1] * factor;
        int col = n * 8 + 2 * t;
        if (out)
          storeOutputPair(geo, out, geo.queryAt(geo.out, b, row, h) + col, lo,
                          hi);
        if (outCopy)
          storePair(outCopy + geo.queryAt(geo.saved, b, row, h) + col, lo,
                    hi);
      }
    }
}

template <int D> constexpr size_t forwardShared() {
  using Shape = ForwardShape<D>;
  return sizeof(__nv_bfloat16) * (Shape::kRows + 2 * Shape::kStages * kTile) *
         (D + kPad);
}

// Grid (query blocks, headsQ, batch). Shared: Q [kRows][D+8], then K and V
// [64][D+8]. With dropout the keep decisions come from `mask`
// (flashDropoutMaskKernel). out (geo.outputsBf16) and the bf16 outCopy may
// be null.
template <int D, typename In>
__global__ void __launch_bounds__(ForwardShape<D>::kThreads,
                                  ForwardShape<D>::kMinBlocks)
    flashForwardKernel(FlashGeometry geo, const In *q, const In *k,
                       const In *v, void *out, __nv_bfloat16 *outCopy,
                       float *logsumexp, uint64_t *mask) {
  using Shape = ForwardShape<D>;
  constexpr int ld = D + kPad;
  extern __shared__ __align__(16) unsigned char flashShared[];
  auto *qs = reinterpret_cast<__nv_bfloat16 *>(flashShared);
  __nv_bfloat16 *keyStage = qs + Shape::kRows * ld; // K, then V
  int q0 = (gridDim.x - 1 - blockIdx.x) * Shape::kRows; // longest rows first
  int h = blockIdx.y, b = blockIdx.z, grp = h / geo.group;
  int warp = threadIdx.x / kWarp, lane = threadIdx.x % kWarp;
  int g = lane / 4, t = lane % 4;
  const In *kBase = k + geo.keyAt(geo.k, b, 0, grp);
  const In *vBase = v + geo.keyAt(geo.v, b, 0, grp);

  // Q stays in shared memory: its fragments are loaded where used (registers
  // go to the accumulators).
  fetchTile<Shape, Shape::kRows>(qs, q + geo.queryAt(geo.q, b, 0, h),
                             geo.q.position, q0, geo.seqQ);

  int warpRow0 = q0 + warp * 16;
  int rows[2] = {warpRow0 + g, warpRow0 + g + 8};
  // m: the running maxima of the scores in base-2 exponents.
  float m[2] = {-INFINITY, -INFINITY}, l[2] = {0.f, 0.f};
  float o[D / 8][4];
#pragma unroll
  for (int n = 0; n < D / 8; ++n)
    o[n][0] = o[n][1] = o[n][2] = o[n][3] = 0.f;

  // The block's keys, and this warp's (causal: the tiles past its last row
  // are skipped).
  int keyEnd = geo.causal ? min(geo.seqK, q0 + Shape::kRows) : geo.seqK;
  int warpKeyEnd = geo.causal ? min(geo.seqK, warpRow0 + 16) : geo.seqK;
  fetchTiles<Shape, kTile>(keyStage, keyStage + kTile * ld, kBase, geo.k.position,
                       vBase, geo.v.position, 0, geo.seqK);
  commitCopies();
  for (int k0 = 0; k0 < keyEnd; k0 += kTile) {
    int next = k0 + kTile;
    static_assert(Shape::kStages == 1, "the forward walks one stage");
    const __nv_bfloat16 *ks = keyStage, *vs = keyStage + kTile * ld;
    waitCopies<0>();
    __syncthreads();
    if (k0 < warpKeyEnd) {
      // The tile's mask words, loaded while the scores are computed.
      uint64_t keep[2] = {0ull, 0ull};
      if (geo.hasDropout)
        loadMaskWords(geo, mask, keep, rows, b, h, k0);
      float s[kTile / 8][4];
#pragma unroll
      for (int n = 0; n < kTile / 8; ++n)
        s[n][0] = s[n][1] = s[n][2] = s[n][3] = 0.f;
#pragma unroll
      for (int kk = 0; kk < D / 16; ++kk) {
        uint32_t qf[4];
        loadA(qf, qs, ld, warp * 16, kk * 16, lane);
#pragma unroll
        for (int n = 0; n < kTile / 8; n += 2) {
          uint32_t b0[2], b1[2];
          loadB(b0, b1, ks, ld, n * 8, kk * 16, lane);
          mma(s[n], qf, b0);
          mma(s[n + 1], qf, b1);
        }
      }
      if (geo.masked(warpRow0, k0))
        maskScores(geo, s, rows, k0, t);
      float blockMax[2] = {-INFINITY, -INFINITY};
#pragma unroll
      for (int n = 0; n < kTile / 8; ++n)
#pragma unroll
        for (int e = 0; e < 4; ++e)
          blockMax[e / 2] = fmaxf(blockMax[e / 2], s[n][e]);
      float base[2], alpha[2];
#pragma unroll
      for (int r = 0; r < 2; ++r) {
        float next = fmaxf(m[r], rowMax(blockMax[r]) * geo.scaleLog2);
        base[r] = next == -INFINITY ? 0.f : next;
        alpha[r] = fastExp2(m[r] - base[r]);
        m[r] = next;
        l[r] *= alpha[r];
      }
      keep[0] >>= 2 * t;
      keep[1] >>= 2 * t;
#pragma unroll
      for (int n = 0; n < kTile / 8; ++n)
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          float p = fastExp2(fmaf(s[n][e], geo.scaleLog2, -base[e / 2]));
          l[e / 2] += p;
          if (geo.hasDropout)
            p = kept(keep, n, e) ? p * geo.dropoutScale : 0.f;
          s[n][e] = p;
        }
#pragma unroll
      for (int n = 0; n < D / 8; ++n) {
        o[n][0] *= alpha[0];
        o[n][1] *= alpha[0];
        o[n][2] *= alpha[1];
        o[n][3] *= alpha[1];
      }
      accumulateTimesTile<D>(o, s, vs, ld, lane);
    }
    if (next < keyEnd) {
      __syncthreads(); // every warp is done with the tiles refilled next
      fetchTiles<Shape, kTile>(keyStage, keyStage + kTile * ld, kBase,
                               geo.k.position, vBase, geo.v.position, next,
                               geo.seqK);
      commitCopies();
    }
  }
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    float sum = rowSum(l[r]);
    if (rows[r] >= geo.seqQ)
      continue;
    float inverse = sum > 0.f ? 1.f / sum : 0.f;
    if (t == 0)
      logsumexp[geo.rowIndex(b, h, rows[r])] = (m[r] + log2f(sum)) * kLn2;
#pragma unroll
    for (int n = 0; n < D / 8; ++n) {
      float lo = o[n][2 * r] * inverse, hi = o[n][2 * r + 1] * inverse;
      int col = n * 8 + 2 * t;
      if (out)
        storeOutputPair(geo, out, geo.queryAt(geo.out, b, rows[r], h) + col,
                        lo, hi);
      if (outCopy)
        storePair(outCopy + geo.queryAt(geo.saved, b, rows[r], h) + col, lo,
                  hi);
    }
  }
}

// delta[b, h, i] = dout_i . out_i, one warp per row; with dqSum (the fused
// backward's fp32 dq accumulator, [batch, headsQ, seqQ, D]) also zeroes
// the row's D sums.
template <int D, typename In>
__global__ void flashDeltaKernel(FlashGeometry geo, int64_t batch,
                                 const __nv_bfloat16 *out, const In *dout,
                                 float *delta, float *dqSum) {
  int64_t rows = batch * geo.headsQ * geo.seqQ;
  int64_t row = (static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x) /
                kWarp;
  int lane = threadIdx.x % kWarp;
  if (row >= rows)
    return;
  int i = static_cast<int>(row % geo.seqQ),
      h = static_cast<int>(row / geo.seqQ % geo.headsQ),
      b = static_cast<int>(row / (static_cast<int64_t>(geo.seqQ) * geo.headsQ));
  const __nv_bfloat16 *outRow = out + geo.queryAt(geo.saved, b, i, h);
  const In *doutRow = dout + geo.queryAt(geo.dout, b, i, h);
  float sum = 0.f;
  for (int d = lane; d < D; d += kWarp)
    sum += __bfloat162float(outRow[d]) * toFloat(doutRow[d]);
  sum = detail::warpSum(sum);
  if (lane == 0)
    delta[row] = sum;
  if (dqSum)
    for (int d = lane; d < D; d += kWarp)
      dqSum[row * D + d] = 0.f;
}

template <int D> constexpr size_t queryBackwardShared() {
  using Shape = BackwardShape<D>;
  return sizeof(__nv_bfloat16) *
         (2 * Shape::kRows + 2 * Shape::kStages * kTile) * (D + kPad);
}

// dq. Grid (query blocks, headsQ, batch). Shared: Q, dout [kRows][D+8],
// then K and V [64][D+8] per stage. With dropout the keep decisions come
// from `mask`.
template <int D, typename In>
__global__ void __launch_bounds__(BackwardShape<D>::kThreads,
                                  BackwardShape<D>::kMinBlocks)
    flashQueryBackwardKernel(FlashGeometry geo, const In *q, const In *k,
                             const In *v, const float *logsumexp,
                             const float *delta, const uint64_t *mask,
                             const In *dout, void *dq) {
  using Shape = BackwardShape<D>;
  constexpr int ld = D + kPad;
  extern __shared__ __align__(16) unsigned char flashShared[];
  auto *qs = reinterpret_cast<__nv_bfloat16 *>(flashShared);
  __nv_bfloat16 *dos = qs + Shape::kRows * ld;
  // Stage i: K at keyStage + 2 i kTile ld, V kTile ld after it.
  __nv_bfloat16 *keyStage = dos + Shape::kRows * ld;
  int q0 = (gridDim.x - 1 - blockIdx.x) * Shape::kRows; // longest rows first
  int h = blockIdx.y, b = blockIdx.z, grp = h / geo.group;
  int warp = threadIdx.x / kWarp, lane = threadIdx.x % kWarp;
  int g = lane / 4, t = lane % 4;
  const In *kBase = k + geo.keyAt(geo.k, b, 0, grp);
  const In *vBase = v + geo.keyAt(geo.v, b, 0, grp);

  fetchTiles<Shape, Shape::kRows>(qs, dos, q + geo.queryAt(geo.q, b, 0, h),
                              geo.q.position,
                              dout + geo.queryAt(geo.dout, b, 0, h),
                              geo.dout.position, q0, geo.seqQ);
  int warpRow0 = q0 + warp * 16;
  int rows[2] = {warpRow0 + g, warpRow0 + g + 8};
  // lse2: the logsumexp in base-2 exponents.
  float lse2[2], dlt[2];
  const uint64_t *maskRow[2] = {nullptr, nullptr};
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    int64_t at = geo.rowIndex(b, h, rows[r]);
    bool in = rows[r] < geo.seqQ;
    lse2[r] = in ? logsumexp[at] * kLog2e : 0.f;
    dlt[r] = in ? delta[at] : 0.f;
    if (geo.hasDropout && in)
      maskRow[r] = mask + at * geo.keyBlocks;
  }
  float acc[D / 8][4];
#pragma unroll
  for (int n = 0; n < D / 8; ++n)
    acc[n][0] = acc[n][1] = acc[n][2] = acc[n][3] = 0.f;

  // The block's keys, and this warp's (causal: the tiles past its last row
  // are skipped).
  int keyEnd = geo.causal ? min(geo.seqK, q0 + Shape::kRows) : geo.seqK;
  int warpKeyEnd = geo.causal ? min(geo.seqK, warpRow0 + 16) : geo.seqK;
  fetchTiles<Shape, kTile>(keyStage, keyStage + kTile * ld, kBase, geo.k.position,
                       vBase, geo.v.position, 0, geo.seqK);
  commitCopies();
  for (int k0 = 0, tile = 0; k0 < keyEnd; k0 += kTile, ++tile) {
    int next = k0 + kTile;
    int stage = Shape::kStages == 2 ? tile & 1 : 0;
    const __nv_bfloat16 *ks = keyStage + 2 * stage * kTile * ld;
    const __nv_bfloat16 *vs = ks + kTile * ld;
    bool active = k0 < warpKeyEnd;
    // This lane's keep bits: bit 8n + c is key k0 + 8n + 2t + c.
    uint64_t kept[2] = {0, 0};
    if (geo.hasDropout && active)
#pragma unroll
      for (int r = 0; r < 2; ++r)
        if (maskRow[r])
          kept[r] = maskRow[r][k0 / kTile] >> (2 * t);
    waitCopies<0>();
    __syncthreads(); // as in the forward
    if (Shape::kStages == 2 && next < keyEnd) {
      __nv_bfloat16 *to = keyStage + 2 * (stage ^ 1) * kTile * ld;
      fetchTiles<Shape, kTile>(to, to + kTile * ld, kBase, geo.k.position,
                               vBase, geo.v.position, next, geo.seqK);
      commitCopies();
    }
    if (active) {
      float s[kTile / 8][4], dp[kTile / 8][4];
#pragma unroll
      for (int n = 0; n < kTile / 8; ++n)
#pragma unroll
        for (int e = 0; e < 4; ++e)
          s[n][e] = dp[n][e] = 0.f;
#pragma unroll
      for (int kk = 0; kk < D / 16; ++kk) {
        uint32_t qf[4], dof[4];
        loadA(qf, qs, ld, warp * 16, kk * 16, lane);
        loadA(dof, dos, ld, warp * 16, kk * 16, lane);
#pragma unroll
        for (int n = 0; n < kTile / 8; n += 2) {
          uint32_t b0[2], b1[2];
          loadB(b0, b1, ks, ld, n * 8, kk * 16, lane);
          mma(s[n], qf, b0);
          mma(s[n + 1], qf, b1);
          loadB(b0, b1, vs, ld, n * 8, kk * 16, lane);
          mma(dp[n], dof, b0);
          mma(dp[n + 1], dof, b1);
        }
      }
      if (geo.masked(warpRow0, k0))
        maskScores(geo, s, rows, k0, t);
        // dS = P (dP - delta), dP through the dropout; into s.
#pragma unroll
      for (int n = 0; n < kTile / 8; ++n)
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          float p = fastExp2(fmaf(s[n][e], geo.scaleLog2, -lse2[e / 2]));
          float dprob = dp[n][e];
          if (geo.hasDropout)
            dprob = (kept[e / 2] >> (8 * n + (e & 1))) & 1
                        ? dprob * geo.dropoutScale
                        : 0.f;
          s[n][e] = p * (dprob - dlt[e / 2]);
        }
      accumulateTimesTile<D>(acc, s, ks, ld, lane);
    }
    if (Shape::kStages == 1 && next < keyEnd) {
      __syncthreads(); // every warp is done with the tiles refilled next
      fetchTiles<Shape, kTile>(keyStage, keyStage + kTile * ld, kBase,
                               geo.k.position, vBase, geo.v.position, next,
                               geo.seqK);
      commitCopies();
    }
  }
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    if (rows[r] >= geo.seqQ)
      continue;
    int64_t row = geo.queryAt(geo.dq, b, rows[r], h);
#pragma unroll
    for (int n = 0; n < D / 8; ++n)
      storeOutputPair(geo, dq, row + n * 8 + 2 * t, acc[n][2 * r] * geo.scale,
                      acc[n][2 * r + 1] * geo.scale);
  }
}

/// Where the dk/dv kernel keeps a query tile's per-query values in shared
/// memory (one stage): the mask words of the block's keys ([kTile][Words]),
/// the logsumexp and delta ([kTile] each).
template <int Words> struct QueryRows {
  uint64_t *mask;
  float *lse, *delta;
  static constexpr size_t kBytes =
      (Words * sizeof(uint64_t) + 2 * sizeof(float)) * kTile;

  __device__ static QueryRows at(unsigned char *base) {
    QueryRows rows;
    rows.mask = reinterpret_cast<uint64_t *>(base);
    rows.lse = reinterpret_cast<float *>(rows.mask + Words * kTile);
    rows.delta = rows.lse + kTile;
    return rows;
  }
};

/// The per-query values of the query tile at q0 of head h (thread r < 64
/// takes query q0 + r; zeros past seqQ, and for mask words past the row's
/// keyBlocks) for the key blocks keyBlock .. keyBlock + Words - 1. `load`
/// reads them into registers (the register path: `store` writes them to
/// shared memory), `copy` by cp.async.
template <int Words> struct QueryRowFetch {
  float lse = 0.f, delta = 0.f;
  uint64_t mask[Words] = {};

  __device__ void load(const FlashGeometry &geo, const float *logsumexp,
                       const float *deltas, const uint64_t *masks, int b,
                       int h, int q0, int keyBlock) {
    int r = threadIdx.x;
    bool in = r < kTile && q0 + r < geo.seqQ;
    int64_t at = geo.rowIndex(b, h, q0 + r);
    lse = in ? logsumexp[at] : 0.f;
    delta = in ? deltas[at] : 0.f;
#pragma unroll
    for (int w = 0; w < Words; ++w)
      mask[w] = in && geo.hasDropout && keyBlock + w < geo.keyBlocks
                    ? masks[at * geo.keyBlocks + keyBlock + w]
                    : 0;
  }
  __device__ void store(const QueryRows<Words> &to) const {
    int r = threadIdx.x;
    if (r < kTile) {
      to.lse[r] = lse;
      to.delta[r] = delta;
#pragma unroll
      for (int w = 0; w < Words; ++w)
        to.mask[r * Words + w] = mask[w];
    }
  }
  __device__ static void copy(const QueryRows<Words> &to,
                              const FlashGeometry &geo,
                              const float *logsumexp, const float *deltas,
                              const uint64_t *masks, int b, int h, int q0,
                              int keyBlock) {
    int r = threadIdx.x;
    if (r >= kTile)
      return;
    bool in = q0 + r < geo.seqQ;
    int64_t at = in ? geo.rowIndex(b, h, q0 + r) : 0;
    copyAsync<4>(to.lse + r, logsumexp + at, in);
    copyAsync<4>(to.delta + r, deltas + at, in);
    if (!geo.hasDropout)
      return; // the mask words are not read
#pragma unroll
    for (int w = 0; w < Words; ++w) {
      bool word = in && keyBlock + w < geo.keyBlocks;
      copyAsync<8>(to.mask + r * Words + w,
                   masks + (word ? at * geo.keyBlocks + keyBlock + w : 0),
                   word);
    }
  }
};

/// Row pitch of the fused backward's dS^T tile in shared memory ([kRows
/// keys][kTile queries] bf16; the padding spreads ldmatrix's rows over the
/// banks).
constexpr int kScoresLd = kTile + kPad;

template <int D, bool Dq> constexpr size_t keyBackwardShared() {
  using Shape = BackwardShape<D>;
  return sizeof(__nv_bfloat16) *
             (2 * Shape::kRows + 2 * Shape::kStages * kTile) * (D + kPad) +
         Shape::kStages * QueryRows<Shape::kRows / kTile>::kBytes +
         (Dq ? 2 * sizeof(__nv_bfloat16) * Shape::kRows * kScoresLd : 0);
}

/// red.global.add.v2.f32 (sm_90): at[0] += x, at[1] += y, no result.
__device__ inline void reduceAddPair(float *at, float x, float y) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("red.relaxed.gpu.global.add.v2.f32 [%0], {%1, %2};\n" ::"l"(at),
               "f"(x), "f"(y)
               : "memory");
#else
  atomicAdd(at, x);
  atomicAdd(at + 1, y);
#endif
}

/// The fused backward's share of dq from one query tile (the dk/dv kernel
/// with Dq; every warp's rows of dS^T in `scoresT`, a barrier ago): warp w
/// adds rows 16 (w % 4) .. + 15 of the tile's dS K over columns
/// (w / 4) D / 2 .. + D / 2 into dqSum, K being the block's [kRows][D +
/// kPad] tile at `ks`. Keys the warp's queries cannot see (causal) or past
/// seqK add nothing and are skipped (so are the rows of dS^T the skipped
/// warps of the dk/dv walk left unwritten).
template <typename Shape>
__device__ inline void addQueryGradient(const FlashGeometry &geo,
                                        const __nv_bfloat16 *scoresT,
                                        const __nv_bfloat16 *ks, float *dqSum,
                                        int b, int h, int q0, int k0,
                                        int warp, int lane) {
  constexpr int D = Shape::kD, ld = D + kPad;
  constexpr int kRowGroups = kTile / 16;
  constexpr int kColumnGroups = Shape::kWarps / kRowGroups;
  constexpr int kColumns = D / kColumnGroups;
  static_assert(kColumnGroups * kRowGroups == Shape::kWarps &&
                    kColumns % 16 == 0,
                "the warps split a query tile's dq evenly");
  int row0 = warp % kRowGroups * 16, col0 = warp / kRowGroups * kColumns;
  int g = lane / 4, t = lane % 4;
  int keyEnd = min(geo.seqK, k0 + Shape::kRows);
  if (geo.causal)
    keyEnd = min(keyEnd, q0 + row0 + 16);
  int chunks = (keyEnd - k0 + 15) / 16;
  if (keyEnd <= k0 || q0 + row0 >= geo.seqQ)
    return;
  float acc[kColumns / 8][4];
#pragma unroll
  for (int n = 0; n < kColumns / 8; ++n)
    acc[n][0] = acc[n][1] = acc[n][2] = acc[n][3] = 0.f;
  for (int c = 0; c < chunks; ++c) {
    // The A fragment of dS (queries x keys) from dS^T by the transposing
    // load: matrix i = lane / 8 is keys 16c + 8 (i / 2) .. +7, queries
    // row0 + 8 (i % 2) .. +7.
    uint32_t af[4];
    loadMatricesTransposed(af, scoresT +
                                   (c * 16 + lane % 8 + 8 * (lane / 16)) *
                                       kScoresLd +
                                   row0 + 8 * (lane / 8 % 2));
#pragma unroll
    for (int n = 0; n < kColumns / 8; n += 2) {
      uint32_t b0[2], b1[2];
      loadBTransposed(b0, b1, ks, ld, c * 16, col0 + n * 8, lane);
      mma(acc[n], af, b0);
      mma(acc[n + 1], af, b1);
    }
  }
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    int row = q0 + row0 + g + 8 * r;
    if (row >= geo.seqQ)
      continue;
    float *at = dqSum + geo.rowIndex(b, h, row) * D + col0 + 2 * t;
#pragma unroll
    for (int n = 0; n < kColumns / 8; ++n)
      reduceAddPair(at + n * 8, acc[n][2 * r], acc[n][2 * r + 1]);
  }
}

// dk, dv. Grid (key blocks, headsKv, batch); warp w owns keys 16w..16w+15
// of the block's kRows. Shared: K, V [kRows][D+8], then per stage Q and
// dout [64][D+8], then per stage the query rows' mask words, logsumexp and
// delta (QueryRows), then with Dq two buffers of dS^T [kRows][kScoresLd].
//
// With Dq (the fused backward) the block also adds its keys' share of dq,
// dS K, into the fp32 sums dqSum ([batch, headsQ, seqQ, D], unscaled) by
// vector reductions: each query tile's dS^T (bf16, as dk uses it) goes to
// shared memory (buffer step % 2), and after the next step's barrier warp w
// computes rows 16 (w % 4) .. +15 of that tile's dq over columns (w / 4)
// D / 2 .. + D / 2 from it and the block's K (addQueryGradient; one
// barrier a step, as without Dq). The order of the additions varies
// between runs.
template <int D, typename In, bool Dq>
__global__ void __launch_bounds__(BackwardShape<D>::kThreads,
                                  BackwardShape<D>::kMinBlocks)
    flashKeyBackwardKernel(FlashGeometry geo, const In *q, const In *k,
                           const In *v, const float *logsumexp,
                           const float *delta, const uint64_t *mask,
                           const In *dout, void *dk, void *dv,
                           float *dqSum) {
  using Shape = BackwardShape<D>;
  static_assert(!Dq || kCopiesAsync<Shape, In>,
                "the fused backward is written for wide shapes, bf16 inputs");
  constexpr int ld = D + kPad;
  constexpr int kWords = Shape::kRows / kTile; // mask words a query row
  extern __shared__ __align__(16) unsigned char flashShared[];
  auto *ks = reinterpret_cast<__nv_bfloat16 *>(flashShared);
  __nv_bfloat16 *vs = ks + Shape::kRows * ld;
  // Stage i: Q at queryStage + 2 i kTile ld, dout kTile ld after it.
  __nv_bfloat16 *queryStage = vs + Shape::kRows * ld;
  auto *rowBase = reinterpret_cast<unsigned char *>(
      queryStage + 2 * Shape::kStages * kTile * ld);
  auto rowsOf = [&](int stage) {
    return QueryRows<kWords>::at(rowBase +
                                 stage * QueryRows<kWords>::kBytes);
  };
  auto *scoresBase = reinterpret_cast<__nv_bfloat16 *>(
      rowBase + Shape::kStages * QueryRows<kWords>::kBytes);
  auto scoresOf = [&](int step) {
    return scoresBase + (step & 1) * Shape::kRows * kScoresLd;
  };
  int keyBlock = blockIdx.x, grp = blockIdx.y, b = blockIdx.z;
  if constexpr (Dq) {
    // The longest blocks first (causal: the first key blocks see the most
    // queries): block i of the launch order takes key block i / (headsKv
    // batch) of every head, so that the last wave holds the shortest ones
    // (3% faster at gpt-1.3b's shape than key blocks fastest).
    int pairs = gridDim.y * gridDim.z;
    int linear = blockIdx.x + gridDim.x * (blockIdx.y + gridDim.y * blockIdx.z);
    keyBlock = linear / pairs;
    grp = linear % pairs % gridDim.y;
    b = linear % pairs / gridDim.y;
  }
  int k0 = keyBlock * Shape::kRows;
  int warp = threadIdx.x / kWarp, lane = threadIdx.x % kWarp;
  int g = lane / 4, t = lane % 4;
  int warpKey0 = k0 + warp * 16;

  fetchTiles<Shape, Shape::kRows>(ks, vs, k + geo.keyAt(geo.k, b, 0, grp),
                              geo.k.position,
                              v + geo.keyAt(geo.v, b, 0, grp),
                              geo.v.position, k0, geo.seqK);
  // The keys of this lane's rows: bits `keyBit` and keyBit + 8 of the
  // 32-bit half `keyHalf` of a query's kWords mask words.
  int keyHalf = warp / 4 * 2 + warp % 4 / 2, keyBit = 16 * (warp % 2) + g;
  float dkAcc[D / 8][4], dvAcc[D / 8][4];
#pragma unroll
  for (int n = 0; n < D / 8; ++n)
#pragma unroll
    for (int e = 0; e < 4; ++e)
      dkAcc[n][e] = dvAcc[n][e] = 0.f;

  // The walk: step = (query head - grp * group) * queryTiles + query tile.
  int queryBegin = geo.causal ? k0 : 0;
  int queryTiles = (geo.seqQ - queryBegin + kTile - 1) / kTile;
  int steps = geo.group * queryTiles;
  auto headOf = [&](int step) { return grp * geo.group + step / queryTiles; };
  auto firstQuery = [&](int step) {
    return queryBegin + step % queryTiles * kTile;
  };
  // Step `step`'s Q and dout tiles and query rows into stage `stage`.
  QueryRowFetch<kWords> rowNext;
  auto fetchStep = [&](int step, int stage) {
    __nv_bfloat16 *to = queryStage + 2 * stage * kTile * ld;
    fetchTiles<Shape, kTile>(to, to + kTile * ld,
                         q + geo.queryAt(geo.q, b, 0, headOf(step)),
                         geo.q.position,
                         dout + geo.queryAt(geo.dout, b, 0, headOf(step)),
                         geo.dout.position, firstQuery(step), geo.seqQ);
    if constexpr (kCopiesAsync<Shape, In>)
      QueryRowFetch<kWords>::copy(rowsOf(stage), geo, logsumexp, delta, mask,
                                  b, headOf(step), firstQuery(step),
                                  k0 / kTile);
  };
  fetchStep(0, 0);
  if constexpr (!kCopiesAsync<Shape, In>) {
    rowNext.load(geo, logsumexp, delta, mask, b, headOf(0), firstQuery(0),
                 k0 / kTile);
    rowNext.store(rowsOf(0));
  }
  commitCopies();
  for (int step = 0; step < steps; ++step) {
    int q0 = firstQuery(step);
    bool more = step + 1 < steps;
    int stage = Shape::kStages == 2 ? step & 1 : 0;
    const __nv_bfloat16 *qs = queryStage + 2 * stage * kTile * ld;
    const __nv_bfloat16 *dos = qs + kTile * ld;
    QueryRows<kWords> rowS = rowsOf(stage);
    const auto *maskHalves = reinterpret_cast<const uint32_t *>(rowS.mask);
    if constexpr (!kCopiesAsync<Shape, In>)
      if (Shape::kStages == 1 && more)
        rowNext.load(geo, logsumexp, delta, mask, b, headOf(step + 1),
                     firstQuery(step + 1), k0 / kTile);
    waitCopies<0>();
    __syncthreads(); // as in the forward
    if (Shape::kStages == 2 && more) {
      fetchStep(step + 1, stage ^ 1);
      if constexpr (!kCopiesAsync<Shape, In>) {
        rowNext.load(geo, logsumexp, delta, mask, b, headOf(step + 1),
                     firstQuery(step + 1), k0 / kTile);
        rowNext.store(rowsOf(stage ^ 1));
      }
      commitCopies();
    }
    if constexpr (Dq)
      if (step > 0)
        addQueryGradient<Shape>(geo, scoresOf(step - 1), ks, dqSum, b,
                                headOf(step - 1), firstQuery(step - 1), k0,
                                warp, lane);
    // Causal: skip the tiles whose queries all precede this warp's keys.
    if (!geo.causal || warpKey0 <= q0 + kTile - 1) {
      // S^T [keys][queries] and dP^T = V dout^T.
      float s[kTile / 8][4], dp[kTile / 8][4];
#pragma unroll
      for (int n = 0; n < kTile / 8; ++n)
#pragma unroll
        for (int e = 0; e < 4; ++e)
          s[n][e] = dp[n][e] = 0.f;
#pragma unroll
      for (int kk = 0; kk < D / 16; ++kk) {
        uint32_t kf[4], vf[4];
        loadA(kf, ks, ld, warp * 16, kk * 16, lane);
        loadA(vf, vs, ld, warp * 16, kk * 16, lane);
#pragma unroll
        for (int n = 0; n < kTile / 8; n += 2) {
          uint32_t b0[2], b1[2];
          loadB(b0, b1, qs, ld, n * 8, kk * 16, lane);
          mma(s[n], kf, b0);
          mma(s[n + 1], kf, b1);
          loadB(b0, b1, dos, ld, n * 8, kk * 16, lane);
          mma(dp[n], vf, b0);
          mma(dp[n + 1], vf, b1);
        }
      }
      // Only the causal diagonal needs a mask: queries past seqQ have zero
      // rows of Q and dout (their dS and P dout vanish), and keys past seqK
      // are never stored; with Dq their dS is read (times zero rows of K),
      // so it is masked to zero too (exp(-lse) may overflow).
      if ((geo.causal && q0 < warpKey0 + 16) ||
          (Dq && warpKey0 + 16 > geo.seqK)) {
#pragma unroll
        for (int n = 0; n < kTile / 8; ++n)
#pragma unroll
          for (int e = 0; e < 4; ++e) {
            int i = q0 + n * 8 + 2 * t + (e & 1);
            int j = warpKey0 + g + 8 * (e / 2);
            if ((geo.causal && j > i) || j >= geo.seqK)
              s[n][e] = -INFINITY;
          }
      }
      // s becomes the dropped P^T, dp becomes dS^T.
#pragma unroll
      for (int n = 0; n < kTile / 8; ++n)
#pragma unroll
        for (int c = 0; c < 2; ++c) {
          int col = n * 8 + 2 * t + c;
          float lse = rowS.lse[col] * kLog2e, dlt = rowS.delta[col];
          uint32_t word =
              geo.hasDropout ? maskHalves[2 * kWords * col + keyHalf] : 0u;
#pragma unroll
          for (int r = 0; r < 2; ++r) {
            int e = 2 * r + c;
            float p = fastExp2(fmaf(s[n][e], geo.scaleLog2, -lse));
            float dprob = dp[n][e], dropped = p;
            if (geo.hasDropout) {
              bool keep = (word >> (keyBit + 8 * r)) & 1;
              dprob = keep ? dprob * geo.dropoutScale : 0.f;
              dropped = keep ? p * geo.dropoutScale : 0.f;
            }
            s[n][e] = dropped;
            dp[n][e] = p * (dprob - dlt);
          }
        }
#pragma unroll
      for (int kc = 0; kc < kTile / 16; ++kc) {
        uint32_t pf[4], sf[4];
        accumulatorToA(pf, s[2 * kc], s[2 * kc + 1]);
        accumulatorToA(sf, dp[2 * kc], dp[2 * kc + 1]);
#pragma unroll
        for (int n = 0; n < D / 8; n += 2) {
          uint32_t b0[2], b1[2];
          loadBTransposed(b0, b1, dos, ld, kc * 16, n * 8, lane);
          mma(dvAcc[n], pf, b0);
          mma(dvAcc[n + 1], pf, b1);
          loadBTransposed(b0, b1, qs, ld, kc * 16, n * 8, lane);
          mma(dkAcc[n], sf, b0);
          mma(dkAcc[n + 1], sf, b1);
        }
        if constexpr (Dq) {
          // This warp's rows of dS^T: keys 16 warp + g (+ 8), queries
          // 16 kc + 2t (+1, +8, +9), as the A fragment above holds them.
          __nv_bfloat16 *row = scoresOf(step) + (warp * 16 + g) * kScoresLd +
                               kc * 16 + 2 * t;
          *reinterpret_cast<uint32_t *>(row) = sf[0];
          *reinterpret_cast<uint32_t *>(row + 8 * kScoresLd) = sf[1];
          *reinterpret_cast<uint32_t *>(row + 8) = sf[2];
          *reinterpret_cast<uint32_t *>(row + 8 * kScoresLd + 8) = sf[3];
        }
      }
    }
    if (Shape::kStages == 1 && more) {
      __syncthreads(); // every warp is done with the stage refilled next
      fetchStep(step + 1, 0);
      if constexpr (!kCopiesAsync<Shape, In>)
        rowNext.store(rowsOf(0));
      commitCopies();
    }
  }
  if constexpr (Dq) {
    __syncthreads(); // the last tile's dS^T is complete
    if (steps > 0)
      addQueryGradient<Shape>(geo, scoresOf(steps - 1), ks, dqSum, b,
                              headOf(steps - 1), firstQuery(steps - 1), k0,
                              warp, lane);
  }
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    int key = warpKey0 + g + 8 * r;
    if (key >= geo.seqK)
      continue;
    int64_t dkRow = geo.keyAt(geo.dk, b, key, grp),
            dvRow = geo.keyAt(geo.dv, b, key, grp);
#pragma unroll
    for (int n = 0; n < D / 8; ++n) {
      if (dk)
        storeOutputPair(geo, dk, dkRow + n * 8 + 2 * t,
                        dkAcc[n][2 * r] * geo.scale,
                        dkAcc[n][2 * r + 1] * geo.scale);
      if (dv)
        storeOutputPair(geo, dv, dvRow + n * 8 + 2 * t, dvAcc[n][2 * r],
                        dvAcc[n][2 * r + 1]);
    }
  }
}

// dq = scale * dqSum (the fused backward's fp32 sums, [batch, headsQ, seqQ,
// D]) into dq's layout and type, four elements a thread.
template <int D>
__global__ void flashQueryGradientKernel(FlashGeometry geo, int64_t batch,
                                         const float *dqSum, void *dq) {
  int64_t quads = batch * geo.headsQ * geo.seqQ * (D / 4);
  int64_t at = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (at >= quads)
    return;
  int64_t row = at / (D / 4);
  int col = static_cast<int>(at % (D / 4)) * 4;
  int i = static_cast<int>(row % geo.seqQ),
      h = static_cast<int>(row / geo.seqQ % geo.headsQ),
      b = static_cast<int>(row / (static_cast<int64_t>(geo.seqQ) * geo.headsQ));
  float4 sum = reinterpret_cast<const float4 *>(dqSum)[at];
  int64_t to = geo.queryAt(geo.dq, b, i, h) + col;
  storeOutputPair(geo, dq, to, sum.x * geo.scale, sum.y * geo.scale);
  storeOutputPair(geo, dq, to + 2, sum.z * geo.scale, sum.w * geo.scale);
}

template <typename Kernel> void allowShared(Kernel kernel, size_t bytes) {
  if (bytes > 48 * 1024)
    cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                         static_cast<int>(bytes));
}

/// Blocks of `rows` rows over n.
unsigned blocks(int64_t n, int rows) {
  return static_cast<unsigned>((n + rows - 1) / rows);
}

/// Whether the forward runs flashPairForwardKernel (32 query rows a warp):
/// at head dimension 128 with bf16 inputs (bench/NOTES.md, attnfwd; with
/// fp32 inputs it spills and the 16-row kernel is faster), unless
/// MTRT_CUDA_FLASH_FORWARD=narrow asks for the 16-row kernel (timings).
bool pairForwardChosen() {
  static const char *choice = std::getenv("MTRT_CUDA_FLASH_FORWARD");
  return !(choice && std::strcmp(choice, "narrow") == 0);
}

template <int D, typename In, bool Dropout>
void pairForward(cudaStream_t stream, const AttentionParams &p,
                 const FlashTensors &io, __nv_bfloat16 *outCopy,
                 float *logsumexp, uint64_t *mask) {
  using Shape = PairForwardShape<D>;
  size_t bytes = pairForwardShared<D>();
  allowShared(flashPairForwardKernel<D, In, Dropout>, bytes);
  dim3 grid(blocks(p.seqQ, Shape::kRows), static_cast<unsigned>(p.headsQ),
            static_cast<unsigned>(p.batch));
  flashPairForwardKernel<D, In, Dropout>
      <<<grid, Shape::kThreads, bytes, stream>>>(
          makeGeometry(p, io), static_cast<const In *>(io.q),
          static_cast<const In *>(io.k), static_cast<const In *>(io.v),
          io.out, outCopy, logsumexp, mask);
}

template <int D, typename In>
void forward(cudaStream_t stream, const AttentionParams &p,
             const FlashTensors &io, __nv_bfloat16 *outCopy,
             float *logsumexp, uint64_t *mask) {
  if constexpr (D == 128 && std::is_same_v<In, __nv_bfloat16>) {
    if (pairForwardChosen()) {
      if (p.dropoutP > 0)
        pairForward<D, In, true>(stream, p, io, outCopy, logsumexp, mask);
      else
        pairForward<D, In, false>(stream, p, io, outCopy, logsumexp, mask);
      return;
    }
  }
  size_t bytes = forwardShared<D>();
  allowShared(flashForwardKernel<D, In>, bytes);
  using Shape = ForwardShape<D>;
  dim3 grid(blocks(p.seqQ, Shape::kRows), static_cast<unsigned>(p.headsQ),
            static_cast<unsigned>(p.batch));
  flashForwardKernel<D, In><<<grid, Shape::kThreads, bytes, stream>>>(
      makeGeometry(p, io), static_cast<const In *>(io.q),
      static_cast<const In *>(io.k), static_cast<const In *>(io.v), io.out,
      outCopy, logsumexp, mask);
}

/// Whether the backward at head dimension D with inputs In runs fused (one
/// dk/dv kernel adding dq by fp32 reductions): wide shapes with bf16
/// inputs, unless the call asks for a deterministic dq.
template <int D, typename In>
bool fusedBackward(const FlashTensors &io) {
  return kCopiesAsync<BackwardShape<D>, In> && io.dq && !io.deterministic;
}

/// Bytes of the backward's delta (one float a query row), rounded up so
/// that the fused backward's dq sums after it are aligned.
size_t deltaBytes(const AttentionParams &p) {
  return mtrt::scratch::flashAttentionDeltaBytes(mtrt::scratch::attentionShapeOf(p));
}

template <int D, typename In>
void backward(cudaStream_t stream, const AttentionParams &p,
              const FlashTensors &io, const __nv_bfloat16 *out,
              const float *logsumexp, const uint64_t *mask, void *scratch) {
  using Shape = BackwardShape<D>;
  FlashGeometry geo = makeGeometry(p, io);
  const auto *q = static_cast<const In *>(io.q);
  const auto *k = static_cast<const In *>(io.k);
  const auto *v = static_cast<const In *>(io.v);
  const auto *dout = static_cast<const In *>(io.dout);
  int64_t rows = p.batch * p.headsQ * p.seqQ;
  auto *delta = static_cast<float *>(scratch);
  float *dqSum = nullptr;
  if constexpr (kCopiesAsync<Shape, In>)
    if (fusedBackward<D, In>(io))
      dqSum = reinterpret_cast<float *>(static_cast<char *>(scratch) +
                                        deltaBytes(p));
  constexpr int kDeltaThreads = 256;
  flashDeltaKernel<D, In>
      <<<static_cast<unsigned>((rows * kWarp + kDeltaThreads - 1) /
                               kDeltaThreads),
         kDeltaThreads, 0, stream>>>(geo, p.batch, out, dout, delta, dqSum);
  if (dqSum) {
    if constexpr (kCopiesAsync<Shape, In>) {
      size_t bytes = keyBackwardShared<D, true>();
      allowShared(flashKeyBackwardKernel<D, In, true>, bytes);
      dim3 grid(blocks(p.seqK, Shape::kRows), static_cast<unsigned>(p.headsKv),
                static_cast<unsigned>(p.batch));
      flashKeyBackwardKernel<D, In, true>
          <<<grid, Shape::kThreads, bytes, stream>>>(
              geo, q, k, v, logsumexp, delta, mask, dout, io.dk, io.dv, dqSum);
      constexpr int kThreads = 256;
      int64_t quads = rows * (D / 4);
      flashQueryGradientKernel<D>
          <<<static_cast<unsigned>((quads + kThreads - 1) / kThreads),
             kThreads, 0, stream>>>(geo, p.batch, dqSum, io.dq);
    }
    return;
  }
  if (io.dq) {
    size_t bytes = queryBackwardShared<D>();
    allowShared(flashQueryBackwardKernel<D, In>, bytes);
    dim3 grid(blocks(p.seqQ, Shape::kRows), static_cast<unsigned>(p.headsQ),
              static_cast<unsigned>(p.batch));
    flashQueryBackwardKernel<D, In><<<grid, Shape::kThreads, bytes, stream>>>(
        geo, q, k, v, logsumexp, delta, mask, dout, io.dq);
  }
  if (io.dk || io.dv) {
    size_t bytes = keyBackwardShared<D, false>();
    allowShared(flashKeyBackwardKernel<D, In, false>, bytes);
    dim3 grid(blocks(p.seqK, Shape::kRows), static_cast<unsigned>(p.headsKv),
              static_cast<unsigned>(p.batch));
    flashKeyBackwardKernel<D, In, false>
        <<<grid, Shape::kThreads, bytes, stream>>>(geo, q, k, v, logsumexp,
                                                   delta, mask, dout, io.dk,
                                                   io.dv, nullptr);
  }
}

bool empty(const AttentionParams &p) {
  return p.batch <= 0 || p.seqQ <= 0 || p.headsQ <= 0 || p.seqK <= 0;
}

/// Calls body(std::integral_constant<int, D>) for the supported head
/// dimension.
template <typename Body> void withHeadDim(int64_t headDim, Body &&body) {
  switch (headDim) {
  case 16:
    body(std::integral_constant<int, 16>());
    break;
  case 32:
    body(std::integral_constant<int, 32>());
    break;
  case 64:
    body(std::integral_constant<int, 64>());
    break;
  case 128:
    body(std::integral_constant<int, 128>());
    break;
  default:
    break;
  }
}

/// Calls body<D, In>() through withHeadDim for the call's input type.
template <typename Body>
void withKernels(const AttentionParams &p, const FlashTensors &io,
                 Body &&body) {
  withHeadDim(p.headDim, [&](auto d) {
    if (io.inputsBf16)
      body(d, __nv_bfloat16());
    else
      body(d, float());
  });
}

} // namespace

std::string flashAttentionUnsupportedReason(const AttentionParams &p) {
  return mtrt::scratch::flashAttentionUnsupportedReason(mtrt::scratch::attentionShapeOf(p));
}

void flashAttentionForward(cudaStream_t stream, const AttentionParams &params,
                           const FlashTensors &io, __nv_bfloat16 *outCopy,
                           float *logsumexp, uint64_t *mask) {
  if (empty(params))
    return;
  if (params.dropoutP > 0) {
    if (!mask)
      throw Error(MTRT_STATUS_INTERNAL,
                  "flashAttentionForward: dropout needs a mask of "
                  "flashAttentionMaskBytes");
    flashAttentionDropoutMask(stream, params, mask);
  }
  withKernels(params, io, [&](auto d, auto in) {
    forward<decltype(d)::value, decltype(in)>(stream, params, io, outCopy,
                                               logsumexp, mask);
  });
}

void flashAttentionDropoutMask(cudaStream_t stream,
                               const AttentionParams &params, uint64_t *mask) {
  if (empty(params) || params.dropoutP <= 0)
    return;
  FlashGeometry geo = makeGeometry(params, FlashTensors());
  dim3 grid(blocks(params.seqQ, kTile), static_cast<unsigned>(params.headsQ),
            static_cast<unsigned>(params.batch));
  flashDropoutMaskKernel<<<grid, kMaskThreads, 0, stream>>>(geo, mask);
}

size_t flashAttentionMaskBytes(const AttentionParams &params) {
  return mtrt::scratch::flashAttentionMaskBytes(mtrt::scratch::attentionShapeOf(params));
}

size_t flashAttentionSavedOutputBytes(const AttentionParams &params) {
  return mtrt::scratch::flashAttentionSavedOutputBytes(mtrt::scratch::attentionShapeOf(params));
}

size_t flashAttentionBackwardScratchBytes(const AttentionParams &params) {
  return mtrt::scratch::flashAttentionBackwardScratchBytes(mtrt::scratch::attentionShapeOf(params));
}

void flashAttentionBackward(cudaStream_t stream, const AttentionParams &params,
                            const FlashTensors &io, const __nv_bfloat16 *out,
                            const float *logsumexp, const uint64_t *mask,
                            void *scratch) {
  if (empty(params))
    return;
  withKernels(params, io, [&](auto d, auto in) {
    backward<decltype(d)::value, decltype(in)>(stream, params, io, out,
                                               logsumexp, mask, scratch);
  });
}

} // namespace mtrt::cuda
