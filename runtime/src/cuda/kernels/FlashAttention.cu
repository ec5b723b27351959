// Flash attention for mixed precision: the attention core (causal or not,
// grouped-query heads, dropout on the probabilities) tiled over 64 queries x
// 64 keys, with an online softmax, on the tensor cores (mma.sync
// m16n8k16, bf16 operands, fp32 accumulators). q, k, v and dout are read
// from device memory as fp32 (rounded to bf16 on their way to shared memory)
// or bf16 (copied as they are; the kernels' template parameter In); out, dq,
// dk and dv are written as fp32 or bf16 (FlashGeometry::outputsBf16, a
// uniform branch at the final stores only); the output kept for the
// gradient is bf16.
//
// Kernels (4 warps; warp w owns 16 rows of its block's 64):
// - forward: one block per (64 queries, query head, batch); out and the
//   logsumexp of the scaled, masked scores (before dropout), as the host,
//   and with dropout the keep decisions as bits for the gradient.
// - backward: delta = rowsum(dout * out) first; then dq by query blocks (one
//   block per 64 queries walks the keys) and dk, dv by key blocks (one block
//   per 64 keys of a key/value head walks its group's query heads and the
//   queries that see the keys). No atomics: every sum has a fixed order, so
//   a run gives the same bits every time. The keep decisions come from the
//   forward's bits (never recomputed).
//
// Per-element work and occupancy are what bound these kernels
// (bench/NOTES.md), so: positions are 32-bit; scores are scaled into base-2
// exponents once (one FFMA and one ex2 per probability); only tiles on the
// causal diagonal or past the last key are masked; Q and dout fragments are
// read from shared memory where used (registers go to the accumulators, 3
// blocks a multiprocessor at head dimension 64); a tile's global loads are
// all in flight at once; and the dropout draws (core/Random.h's
// attentionDropoutKeep: one 64-bit draw per four consecutive keys) are
// shared by the two lanes that hold a draw's four keys: lane t draws keys
// 4 (t / 2) .. +3 of an 8-key tile for row g (t even) or g + 8 (t odd), and
// the pair swaps the halves the other one holds. Loading the next tiles
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
#include "core/Random.h"
#include "cuda/kernels/KernelSupport.cuh"

#include <cuda_bf16.h>

#include <cmath>
#include <string>
#include <type_traits>

namespace mtrt::cuda {

namespace {

using detail::kWarp;

constexpr int kTile = 64;         // queries and keys per block
constexpr int kFlashThreads = 128; // 4 warps of 16 rows
constexpr int kPad = 8;
constexpr float kLog2e = 1.4426950408889634f;
constexpr float kLn2 = 0.6931471805599453f;

/// Blocks per multiprocessor each kernel's register budget is cut for: 3
/// (168 registers a thread) up to head dimension 64, 1 (255) above. At 64,
/// 3 blocks ran the forward 20% and the backward 10% faster than 2 (255
/// registers); 4 (128) spilled.
template <int D> constexpr int kForwardMinBlocks = D <= 64 ? 3 : 1;
template <int D> constexpr int kBackwardMinBlocks = D <= 64 ? 3 : 1;

struct FlashGeometry {
  int seqQ, seqK, headsQ, headsKv, group, keyBlocks;
  int64_t qStride, kStride; // elements between consecutive positions
  bool causal;
  float scale;     // the softmax scale
  float scaleLog2; // scale * log2(e): scores to base-2 exponents
  bool hasDropout;
  bool pairedDraws; // seqK % 4 == 0: a draw's four keys lie in one row
  uint64_t dropoutKey;
  uint32_t threshold16;
  float dropoutScale;
  // The global position of this call's tensor (tensor-parallel ranks).
  int64_t batchOffset, headOffset, globalHeadsQ;
  bool outputsBf16; // out, dq, dk, dv in bf16 (else fp32)

  __device__ int64_t qOffset(int b, int i, int h, int d) const {
    return (static_cast<int64_t>(b) * seqQ + i) * qStride +
           static_cast<int64_t>(h) * d;
  }
  __device__ int64_t kOffset(int b, int j, int g, int d) const {
    return (static_cast<int64_t>(b) * seqK + j) * kStride +
           static_cast<int64_t>(g) * d;
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
  /// The index of P[b, h, i, 0] in the global [batch, headsQ, seqQ, seqK]
  /// (host AttentionGeometry::probabilityRow).
  __device__ uint64_t probabilityRow(int b, int h, int i) const {
    return static_cast<uint64_t>(
        (((b + batchOffset) * globalHeadsQ + h + headOffset) * seqQ + i) *
        seqK);
  }
  /// Whether a tile of keys [k0, k0 + 64) needs the causal or key-count
  /// mask for queries [q0, q0 + 64).
  __device__ bool masked(int q0, int k0) const {
    return k0 + kTile > seqK || (causal && k0 + kTile - 1 > q0);
  }
};

FlashGeometry makeGeometry(const AttentionParams &p, bool outputsBf16) {
  FlashGeometry g{};
  g.outputsBf16 = outputsBf16;
  g.seqQ = static_cast<int>(p.seqQ);
  g.seqK = static_cast<int>(p.seqK);
  g.headsQ = static_cast<int>(p.headsQ);
  g.headsKv = static_cast<int>(p.headsKv);
  g.group = static_cast<int>(p.headsQ / p.headsKv);
  g.qStride = p.headsQ * p.headDim;
  g.kStride = p.headsKv * p.headDim;
  g.causal = p.causal;
  g.keyBlocks = static_cast<int>((p.seqK + kTile - 1) / kTile);
  double scale =
      p.scale > 0 ? p.scale : 1.0 / std::sqrt(static_cast<double>(p.headDim));
  g.scale = static_cast<float>(scale);
  g.scaleLog2 = static_cast<float>(scale * 1.4426950408889634);
  g.hasDropout = p.dropoutP > 0;
  g.pairedDraws = p.seqK % 4 == 0;
  g.dropoutKey = random::streamKey(p.seed, p.step);
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

/// One thread's share of rows [row0, row0 + 64) of a [positions, stride]
/// tensor of T (D columns at `base`), held in registers between `load`
/// (which issues every global load at once: one round trip of latency a
/// tile) and `store` (which writes them, rounded to bf16 from fp32, into a
/// bf16 shared tile [64][D + kPad]); rows past `rows` are zeros.
template <int D, typename T> struct TileFetch;

template <int D> struct TileFetch<D, float> {
  static constexpr int kQuads = D / 4;
  static constexpr int kPerThread = kTile * kQuads / kFlashThreads;
  float4 x[kPerThread];

  __device__ void load(const float *base, int64_t stride, int row0,
                       int rows) {
#pragma unroll
    for (int u = 0; u < kPerThread; ++u) {
      int c = threadIdx.x + u * kFlashThreads;
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
      int c = threadIdx.x + u * kFlashThreads;
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
template <int D> struct TileFetch<D, __nv_bfloat16> {
  static constexpr int kChunks = D / 8;
  static constexpr int kPerThread = kTile * kChunks / kFlashThreads;
  static_assert(kPerThread * kFlashThreads == kTile * kChunks,
                "a tile's chunks split evenly over the threads");
  uint4 x[kPerThread];

  __device__ void load(const __nv_bfloat16 *base, int64_t stride, int row0,
                       int rows) {
#pragma unroll
    for (int u = 0; u < kPerThread; ++u) {
      int c = threadIdx.x + u * kFlashThreads;
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
      int c = threadIdx.x + u * kFlashThreads;
      int r = c / kChunks, col = (c % kChunks) * 8;
      *reinterpret_cast<uint4 *>(tile + r * (D + kPad) + col) = x[u];
    }
  }
};

/// Loads and stores a tile through registers at once.
template <int D, typename T>
__device__ inline void loadTile(__nv_bfloat16 *tile, const T *base,
                                int64_t stride, int row0, int rows) {
  TileFetch<D, T> fetch;
  fetch.load(base, stride, row0, rows);
  fetch.store(tile);
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

/// The keep decisions of this lane's 32 probabilities of a 64-key tile at
/// k0: bit 2n + c of keep[r] is key k0 + 8n + 2t + c of row r (g, g + 8).
/// drawRow is probabilityRow of the row this lane draws for: rows[t & 1]
/// with paired draws, else unused (rowIndex gives both rows).
__device__ inline void dropoutBits(const FlashGeometry &geo, uint32_t (&keep)[2],
                                   uint64_t drawRow, const uint64_t (&rowIndex)[2],
                                   int k0, int t) {
  constexpr uint64_t kGolden = 0x9E3779B97F4A7C15ull;
  keep[0] = keep[1] = 0;
  if (geo.pairedDraws) {
    // This lane's draws: index (drawRow + k0) / 4 + t / 2 + 2n for tile n.
    uint64_t first =
        geo.dropoutKey + ((drawRow + k0) / 4 + t / 2 + 1) * kGolden;
    bool odd = t & 1;
#pragma unroll
    for (int n = 0; n < kTile / 8; ++n) {
      uint64_t bits = random::mix64(first + 2ull * n * kGolden);
      uint32_t lo = static_cast<uint32_t>(bits),
               hi = static_cast<uint32_t>(bits >> 32);
      // Keys 2t, 2t + 1 are lanes 2 (t & 1), +1 of this pair's draws: keep
      // that half of the own draw, send the other half to the partner.
      uint32_t own = odd ? hi : lo;
      uint32_t other = __shfl_xor_sync(0xffffffffu, odd ? lo : hi, 1);
      uint32_t top = odd ? other : own, bottom = odd ? own : other;
      keep[0] |= static_cast<uint32_t>((top & 0xFFFFu) >= geo.threshold16)
                     << (2 * n) |
                 static_cast<uint32_t>((top >> 16) >= geo.threshold16)
                     << (2 * n + 1);
      keep[1] |= static_cast<uint32_t>((bottom & 0xFFFFu) >= geo.threshold16)
                     << (2 * n) |
                 static_cast<uint32_t>((bottom >> 16) >= geo.threshold16)
                     << (2 * n + 1);
    }
    return;
  }
#pragma unroll
  for (int r = 0; r < 2; ++r)
#pragma unroll
    for (int n = 0; n < kTile / 8; ++n)
#pragma unroll
      for (int c = 0; c < 2; ++c)
        keep[r] |= static_cast<uint32_t>(random::attentionDropoutKeep(
                       geo.dropoutKey, rowIndex[r] + k0 + n * 8 + 2 * t + c,
                       geo.threshold16))
                   << (2 * n + c);
}

/// Rows row0 .. row0 + 63 of two tensors into the bf16 tiles tileA and
/// tileB (the next tiles of a walk).
template <int D, typename T>
__device__ inline void loadTiles(__nv_bfloat16 *tileA, __nv_bfloat16 *tileB,
                                 const T *baseA, const T *baseB,
                                 int64_t stride, int row0, int rows) {
  loadTile<D>(tileA, baseA, stride, row0, rows);
  loadTile<D>(tileB, baseB, stride, row0, rows);
}

template <int D> constexpr size_t forwardShared() {
  return sizeof(__nv_bfloat16) * 3 * kTile * (D + kPad);
}

// Grid (query blocks, headsQ, batch). Shared: Q, K, V [64][D+8]. With
// dropout and `mask`, also stores the keep decisions as mask words. out
// (geo.outputsBf16) and the bf16 outCopy may be null.
template <int D, typename In>
__global__ void __launch_bounds__(kFlashThreads, kForwardMinBlocks<D>)
    flashForwardKernel(FlashGeometry geo, const In *q, const In *k,
                       const In *v, void *out, __nv_bfloat16 *outCopy,
                       float *logsumexp, uint64_t *mask) {
  extern __shared__ __align__(16) unsigned char flashShared[];
  auto *qs = reinterpret_cast<__nv_bfloat16 *>(flashShared);
  __nv_bfloat16 *ks = qs + kTile * (D + kPad);
  __nv_bfloat16 *vs = ks + kTile * (D + kPad);
  constexpr int ld = D + kPad;
  int q0 = (gridDim.x - 1 - blockIdx.x) * kTile; // the longest rows first
  int h = blockIdx.y, b = blockIdx.z, grp = h / geo.group;
  int warp = threadIdx.x / kWarp, lane = threadIdx.x % kWarp;
  int g = lane / 4, t = lane % 4;
  const In *kBase = k + geo.kOffset(b, 0, grp, D);
  const In *vBase = v + geo.kOffset(b, 0, grp, D);

  // Q stays in shared memory: its fragments are loaded where used (registers
  // go to the accumulators).
  loadTile<D>(qs, q + geo.qOffset(b, 0, h, D), geo.qStride, q0, geo.seqQ);

  int rows[2] = {q0 + warp * 16 + g, q0 + warp * 16 + g + 8};
  uint64_t rowIndex[2] = {0, 0}, drawRow = 0;
  if (geo.hasDropout) {
    rowIndex[0] = geo.probabilityRow(b, h, rows[0]);
    rowIndex[1] = geo.probabilityRow(b, h, rows[1]);
    drawRow = t & 1 ? rowIndex[1] : rowIndex[0];
  }
  // m: the running maxima of the scores in base-2 exponents.
  float m[2] = {-INFINITY, -INFINITY}, l[2] = {0.f, 0.f};
  float o[D / 8][4];
#pragma unroll
  for (int n = 0; n < D / 8; ++n)
    o[n][0] = o[n][1] = o[n][2] = o[n][3] = 0.f;

  int keyEnd = geo.causal ? min(geo.seqK, q0 + kTile) : geo.seqK;
  loadTiles<D>(ks, vs, kBase, vBase, geo.kStride, 0, geo.seqK);
  __syncthreads();
  for (int k0 = 0; k0 < keyEnd; k0 += kTile) {
    int next = k0 + kTile;
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
    if (geo.masked(q0, k0))
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
    uint32_t keep[2];
    if (geo.hasDropout)
      dropoutBits(geo, keep, drawRow, rowIndex, k0, t);
#pragma unroll
    for (int n = 0; n < kTile / 8; ++n)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        float p = fastExp2(fmaf(s[n][e], geo.scaleLog2, -base[e / 2]));
        l[e / 2] += p;
        if (geo.hasDropout)
          p = (keep[e / 2] >> (2 * n + (e & 1))) & 1 ? p * geo.dropoutScale
                                                     : 0.f;
        s[n][e] = p;
      }
    if (geo.hasDropout && mask) {
#pragma unroll
      for (int r = 0; r < 2; ++r) {
        uint64_t word = 0;
#pragma unroll
        for (int n = 0; n < kTile / 8; ++n)
          word |= static_cast<uint64_t>((keep[r] >> (2 * n)) & 3u) << (8 * n);
        word <<= 2 * t;
        word |= __shfl_xor_sync(0xffffffffu, word, 1);
        word |= __shfl_xor_sync(0xffffffffu, word, 2);
        if (t == 0 && rows[r] < geo.seqQ)
          mask[geo.maskWord(b, h, rows[r], k0 / kTile)] = word;
      }
    }
#pragma unroll
    for (int n = 0; n < D / 8; ++n) {
      o[n][0] *= alpha[0];
      o[n][1] *= alpha[0];
      o[n][2] *= alpha[1];
      o[n][3] *= alpha[1];
    }
#pragma unroll
    for (int kc = 0; kc < kTile / 16; ++kc) {
      uint32_t pf[4];
      accumulatorToA(pf, s[2 * kc], s[2 * kc + 1]);
#pragma unroll
      for (int n = 0; n < D / 8; n += 2) {
        uint32_t b0[2], b1[2];
        loadBTransposed(b0, b1, vs, ld, kc * 16, n * 8, lane);
        mma(o[n], pf, b0);
        mma(o[n + 1], pf, b1);
      }
    }
    if (next < keyEnd) {
      __syncthreads();
      loadTiles<D>(ks, vs, kBase, vBase, geo.kStride, next, geo.seqK);
      __syncthreads();
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
      int64_t at = geo.qOffset(b, rows[r], h, D) + n * 8 + 2 * t;
      if (out)
        storeOutputPair(geo, out, at, lo, hi);
      if (outCopy)
        storePair(outCopy + at, lo, hi);
    }
  }
}

// delta[b, h, i] = dout_i . out_i, one warp per row.
template <int D, typename In>
__global__ void flashDeltaKernel(FlashGeometry geo, int64_t batch,
                                 const __nv_bfloat16 *out, const In *dout,
                                 float *delta) {
  int64_t rows = batch * geo.headsQ * geo.seqQ;
  int64_t row = (static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x) /
                kWarp;
  int lane = threadIdx.x % kWarp;
  if (row >= rows)
    return;
  int i = static_cast<int>(row % geo.seqQ),
      h = static_cast<int>(row / geo.seqQ % geo.headsQ),
      b = static_cast<int>(row / (static_cast<int64_t>(geo.seqQ) * geo.headsQ));
  int64_t offset = geo.qOffset(b, i, h, D);
  float sum = 0.f;
  for (int d = lane; d < D; d += kWarp)
    sum += __bfloat162float(out[offset + d]) * toFloat(dout[offset + d]);
  sum = detail::warpSum(sum);
  if (lane == 0)
    delta[row] = sum;
}

template <int D> constexpr size_t queryBackwardShared() {
  return sizeof(__nv_bfloat16) * 4 * kTile * (D + kPad);
}

// dq. Grid (query blocks, headsQ, batch). Shared: Q, dout, K, V [64][D+8].
// With dropout the keep decisions come from `mask`.
template <int D, typename In>
__global__ void __launch_bounds__(kFlashThreads, kBackwardMinBlocks<D>)
    flashQueryBackwardKernel(FlashGeometry geo, const In *q, const In *k,
                             const In *v, const float *logsumexp,
                             const float *delta, const uint64_t *mask,
                             const In *dout, void *dq) {
  extern __shared__ __align__(16) unsigned char flashShared[];
  auto *qs = reinterpret_cast<__nv_bfloat16 *>(flashShared);
  __nv_bfloat16 *dos = qs + kTile * (D + kPad);
  __nv_bfloat16 *ks = dos + kTile * (D + kPad);
  __nv_bfloat16 *vs = ks + kTile * (D + kPad);
  constexpr int ld = D + kPad;
  int q0 = (gridDim.x - 1 - blockIdx.x) * kTile; // the longest rows first
  int h = blockIdx.y, b = blockIdx.z, grp = h / geo.group;
  int warp = threadIdx.x / kWarp, lane = threadIdx.x % kWarp;
  int g = lane / 4, t = lane % 4;
  const In *kBase = k + geo.kOffset(b, 0, grp, D);
  const In *vBase = v + geo.kOffset(b, 0, grp, D);

  loadTile<D>(qs, q + geo.qOffset(b, 0, h, D), geo.qStride, q0, geo.seqQ);
  loadTile<D>(dos, dout + geo.qOffset(b, 0, h, D), geo.qStride, q0,
              geo.seqQ);
  int rows[2] = {q0 + warp * 16 + g, q0 + warp * 16 + g + 8};
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

  int keyEnd = geo.causal ? min(geo.seqK, q0 + kTile) : geo.seqK;
  loadTiles<D>(ks, vs, kBase, vBase, geo.kStride, 0, geo.seqK);
  __syncthreads();
  for (int k0 = 0; k0 < keyEnd; k0 += kTile) {
    int next = k0 + kTile;
    // This lane's keep bits: bit 8n + c is key k0 + 8n + 2t + c.
    uint64_t kept[2] = {0, 0};
    if (geo.hasDropout)
#pragma unroll
      for (int r = 0; r < 2; ++r)
        if (maskRow[r])
          kept[r] = maskRow[r][k0 / kTile] >> (2 * t);
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
    if (geo.masked(q0, k0))
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
#pragma unroll
    for (int kc = 0; kc < kTile / 16; ++kc) {
      uint32_t af[4];
      accumulatorToA(af, s[2 * kc], s[2 * kc + 1]);
#pragma unroll
      for (int n = 0; n < D / 8; n += 2) {
        uint32_t b0[2], b1[2];
        loadBTransposed(b0, b1, ks, ld, kc * 16, n * 8, lane);
        mma(acc[n], af, b0);
        mma(acc[n + 1], af, b1);
      }
    }
    if (next < keyEnd) {
      __syncthreads();
      loadTiles<D>(ks, vs, kBase, vBase, geo.kStride, next, geo.seqK);
      __syncthreads();
    }
  }
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    if (rows[r] >= geo.seqQ)
      continue;
    int64_t row = geo.qOffset(b, rows[r], h, D);
#pragma unroll
    for (int n = 0; n < D / 8; ++n)
      storeOutputPair(geo, dq, row + n * 8 + 2 * t, acc[n][2 * r] * geo.scale,
                      acc[n][2 * r + 1] * geo.scale);
  }
}

/// The dk/dv kernel's per-query values of a query tile (thread r < 64
/// holds query q0 + r's): logsumexp in base-2 exponents, delta, and the mask
/// word of the block's keys.
struct QueryRowFetch {
  float lse2 = 0.f, delta = 0.f;
  uint64_t mask = 0;

  __device__ void load(const FlashGeometry &geo, const float *logsumexp,
                       const float *deltas, const uint64_t *masks, int b,
                       int h, int q0, int keyBlock) {
    int r = threadIdx.x;
    bool in = r < kTile && q0 + r < geo.seqQ;
    int64_t at = geo.rowIndex(b, h, q0 + r);
    lse2 = in ? logsumexp[at] * kLog2e : 0.f;
    delta = in ? deltas[at] : 0.f;
    mask = in && geo.hasDropout ? masks[at * geo.keyBlocks + keyBlock] : 0;
  }
  __device__ void store(float *lseS, float *deltaS, uint64_t *maskS) const {
    int r = threadIdx.x;
    if (r < kTile) {
      lseS[r] = lse2;
      deltaS[r] = delta;
      maskS[r] = mask;
    }
  }
};

template <int D> constexpr size_t keyBackwardShared() {
  return sizeof(__nv_bfloat16) * 4 * kTile * (D + kPad) +
         (2 * sizeof(float) + sizeof(uint64_t)) * kTile;
}

// dk, dv. Grid (key blocks, headsKv, batch); warp w owns keys 16w..16w+15
// of the block. Shared: K, V, Q, dout [64][D+8], the query rows'
// logsumexp (base 2), delta and mask words.
template <int D, typename In>
__global__ void __launch_bounds__(kFlashThreads, kBackwardMinBlocks<D>)
    flashKeyBackwardKernel(FlashGeometry geo, const In *q, const In *k,
                           const In *v, const float *logsumexp,
                           const float *delta, const uint64_t *mask,
                           const In *dout, void *dk, void *dv) {
  extern __shared__ __align__(16) unsigned char flashShared[];
  auto *ks = reinterpret_cast<__nv_bfloat16 *>(flashShared);
  __nv_bfloat16 *vs = ks + kTile * (D + kPad);
  __nv_bfloat16 *qs = vs + kTile * (D + kPad);
  __nv_bfloat16 *dos = qs + kTile * (D + kPad);
  auto *maskS = reinterpret_cast<uint64_t *>(dos + kTile * (D + kPad));
  auto *lseS = reinterpret_cast<float *>(maskS + kTile);
  float *deltaS = lseS + kTile;
  constexpr int ld = D + kPad;
  int k0 = blockIdx.x * kTile;
  int grp = blockIdx.y, b = blockIdx.z;
  int warp = threadIdx.x / kWarp, lane = threadIdx.x % kWarp;
  int g = lane / 4, t = lane % 4;

  loadTile<D>(ks, k + geo.kOffset(b, 0, grp, D), geo.kStride, k0, geo.seqK);
  loadTile<D>(vs, v + geo.kOffset(b, 0, grp, D), geo.kStride, k0, geo.seqK);
  // The keys of this lane's rows: bits `keyBit` and keyBit + 8 of the
  // 32-bit half `keyHalf` of a query's mask word.
  int keyHalf = warp / 2, keyBit = 16 * (warp % 2) + g;
  const auto *maskHalves = reinterpret_cast<const uint32_t *>(maskS);
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
  QueryRowFetch rowNext;
  loadTile<D>(qs, q + geo.qOffset(b, 0, headOf(0), D), geo.qStride,
              firstQuery(0), geo.seqQ);
  loadTile<D>(dos, dout + geo.qOffset(b, 0, headOf(0), D), geo.qStride,
              firstQuery(0), geo.seqQ);
  rowNext.load(geo, logsumexp, delta, mask, b, headOf(0), firstQuery(0),
               k0 / kTile);
  rowNext.store(lseS, deltaS, maskS);
  __syncthreads();
  for (int step = 0; step < steps; ++step) {
    int q0 = firstQuery(step);
    bool more = step + 1 < steps;
    const In *qNextBase = q + geo.qOffset(b, 0, headOf(step + 1), D);
    const In *doNextBase = dout + geo.qOffset(b, 0, headOf(step + 1), D);
    if (more)
      rowNext.load(geo, logsumexp, delta, mask, b, headOf(step + 1),
                   firstQuery(step + 1), k0 / kTile);
    {
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
      // are never stored.
      if (geo.causal && q0 < k0 + kTile) {
#pragma unroll
        for (int n = 0; n < kTile / 8; ++n)
#pragma unroll
          for (int e = 0; e < 4; ++e) {
            int i = q0 + n * 8 + 2 * t + (e & 1);
            int j = k0 + warp * 16 + g + 8 * (e / 2);
            if (j > i)
              s[n][e] = -INFINITY;
          }
      }
      // s becomes the dropped P^T, dp becomes dS^T.
#pragma unroll
      for (int n = 0; n < kTile / 8; ++n)
#pragma unroll
        for (int c = 0; c < 2; ++c) {
          int col = n * 8 + 2 * t + c;
          float lse = lseS[col], dlt = deltaS[col];
          uint32_t word = geo.hasDropout ? maskHalves[2 * col + keyHalf] : 0u;
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
      }
    }
    if (more) {
      __syncthreads();
      loadTiles<D>(qs, dos, qNextBase, doNextBase, geo.qStride,
                   firstQuery(step + 1), geo.seqQ);
      rowNext.store(lseS, deltaS, maskS);
      __syncthreads();
    }
  }
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    int key = k0 + warp * 16 + g + 8 * r;
    if (key >= geo.seqK)
      continue;
    int64_t offset = geo.kOffset(b, key, grp, D);
#pragma unroll
    for (int n = 0; n < D / 8; ++n) {
      if (dk)
        storeOutputPair(geo, dk, offset + n * 8 + 2 * t,
                        dkAcc[n][2 * r] * geo.scale,
                        dkAcc[n][2 * r + 1] * geo.scale);
      if (dv)
        storeOutputPair(geo, dv, offset + n * 8 + 2 * t, dvAcc[n][2 * r],
                        dvAcc[n][2 * r + 1]);
    }
  }
}

template <typename Kernel> void allowShared(Kernel kernel, size_t bytes) {
  if (bytes > 48 * 1024)
    cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                         static_cast<int>(bytes));
}

unsigned blocks(int64_t n) {
  return static_cast<unsigned>((n + kTile - 1) / kTile);
}

template <int D, typename In>
void forward(cudaStream_t stream, const AttentionParams &p,
             const FlashTensors &io, __nv_bfloat16 *outCopy,
             float *logsumexp, uint64_t *mask) {
  size_t bytes = forwardShared<D>();
  allowShared(flashForwardKernel<D, In>, bytes);
  dim3 grid(blocks(p.seqQ), static_cast<unsigned>(p.headsQ),
            static_cast<unsigned>(p.batch));
  flashForwardKernel<D, In><<<grid, kFlashThreads, bytes, stream>>>(
      makeGeometry(p, io.outputsBf16), static_cast<const In *>(io.q),
      static_cast<const In *>(io.k), static_cast<const In *>(io.v), io.out,
      outCopy, logsumexp, mask);
}

template <int D, typename In>
void backward(cudaStream_t stream, const AttentionParams &p,
              const FlashTensors &io, const __nv_bfloat16 *out,
              const float *logsumexp, const uint64_t *mask, float *delta) {
  FlashGeometry geo = makeGeometry(p, io.outputsBf16);
  const auto *q = static_cast<const In *>(io.q);
  const auto *k = static_cast<const In *>(io.k);
  const auto *v = static_cast<const In *>(io.v);
  const auto *dout = static_cast<const In *>(io.dout);
  int64_t rows = p.batch * p.headsQ * p.seqQ;
  constexpr int kDeltaThreads = 256;
  flashDeltaKernel<D, In>
      <<<static_cast<unsigned>((rows * kWarp + kDeltaThreads - 1) /
                               kDeltaThreads),
         kDeltaThreads, 0, stream>>>(geo, p.batch, out, dout, delta);
  if (io.dq) {
    size_t bytes = queryBackwardShared<D>();
    allowShared(flashQueryBackwardKernel<D, In>, bytes);
    dim3 grid(blocks(p.seqQ), static_cast<unsigned>(p.headsQ),
              static_cast<unsigned>(p.batch));
    flashQueryBackwardKernel<D, In><<<grid, kFlashThreads, bytes, stream>>>(
        geo, q, k, v, logsumexp, delta, mask, dout, io.dq);
  }
  if (io.dk || io.dv) {
    size_t bytes = keyBackwardShared<D>();
    allowShared(flashKeyBackwardKernel<D, In>, bytes);
    dim3 grid(blocks(p.seqK), static_cast<unsigned>(p.headsKv),
              static_cast<unsigned>(p.batch));
    flashKeyBackwardKernel<D, In><<<grid, kFlashThreads, bytes, stream>>>(
        geo, q, k, v, logsumexp, delta, mask, dout, io.dk, io.dv);
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
  if (p.headDim != p.headDimV)
    return "the flash-attention kernels need equal query/key and value head "
           "dimensions, found " +
           std::to_string(p.headDim) + " and " + std::to_string(p.headDimV);
  if (p.headDim != 16 && p.headDim != 32 && p.headDim != 64 &&
      p.headDim != 128)
    return "the flash-attention kernels take head dimensions 16, 32, 64 or "
           "128, found " +
           std::to_string(p.headDim);
  if (p.causal && p.seqQ != p.seqK)
    return "causal flash attention needs as many queries as keys, found " +
           std::to_string(p.seqQ) + " and " + std::to_string(p.seqK);
  if (p.batch > 65535 || p.headsQ > 65535)
    return "the grid would exceed CUDA's limits (batch or heads over 65535)";
  constexpr int64_t kMaxSeq = (int64_t(1) << 31) - 2 * kTile;
  if (p.seqQ > kMaxSeq || p.seqK > kMaxSeq)
    return "the flash-attention kernels index positions in 32 bits: "
           "sequences up to " +
           std::to_string(kMaxSeq) + ", found " + std::to_string(p.seqQ) +
           " queries and " + std::to_string(p.seqK) + " keys";
  return std::string();
}

void flashAttentionForward(cudaStream_t stream, const AttentionParams &params,
                           const FlashTensors &io, __nv_bfloat16 *outCopy,
                           float *logsumexp, uint64_t *mask) {
  if (empty(params))
    return;
  withKernels(params, io, [&](auto d, auto in) {
    forward<decltype(d)::value, decltype(in)>(stream, params, io, outCopy,
                                               logsumexp, mask);
  });
}

size_t flashAttentionMaskBytes(const AttentionParams &params) {
  if (params.dropoutP <= 0)
    return 0;
  return sizeof(uint64_t) *
         static_cast<size_t>(params.batch * params.headsQ * params.seqQ *
                             ((params.seqK + kTile - 1) / kTile));
}

size_t flashAttentionSavedOutputBytes(const AttentionParams &params) {
  return sizeof(__nv_bfloat16) *
         static_cast<size_t>(params.batch * params.headsQ * params.seqQ *
                             params.headDimV);
}

size_t flashAttentionBackwardScratchBytes(const AttentionParams &params) {
  return sizeof(float) *
         static_cast<size_t>(params.batch * params.headsQ * params.seqQ);
}

void flashAttentionBackward(cudaStream_t stream, const AttentionParams &params,
                            const FlashTensors &io, const __nv_bfloat16 *out,
                            const float *logsumexp, const uint64_t *mask,
                            void *scratch) {
  if (empty(params))
    return;
  withKernels(params, io, [&](auto d, auto in) {
    backward<decltype(d)::value, decltype(in)>(
        stream, params, io, out, logsumexp, mask,
        static_cast<float *>(scratch));
  });
}

} // namespace mtrt::cuda
