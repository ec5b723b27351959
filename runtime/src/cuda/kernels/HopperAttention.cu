// The Hopper forward of flash attention, in FlashAttention-3's manner:
// warpgroup MMA (wgmma.mma_async, bf16 operands, fp32 accumulators), tiles
// copied by the tensor copy engine (TMA, cp.async.bulk.tensor) completing
// on mbarriers, and warp specialization. Compiled for sm_90a only (wgmma
// and setmaxnreg are not in plain sm_90); hopperAttentionUnsupportedReason
// names what it does not take. Outputs equal flashAttentionForward's
// definitions (FlashAttention.cu): out (fp32 or bf16, FlashLayout strides),
// the optional bf16 copy kept for the gradient, and the logsumexp of the
// scaled, masked scores before dropout; dropout reads the keep bits that
// flashDropoutMaskKernel draws (the host's mask), one 64-bit word per query
// row and 64 keys (AttentionMask.cuh). (Drawing them in the producer's idle
// warps instead made the forward 1.6x slower at dropout 0.1: 96 threads
// cannot keep up with the consumers; bench/NOTES.md, session 30.) The
// backward (hopperAttentionBackward, section "The backward" below) gives
// flashAttentionBackward's dq, dk, dv from the same saved state in the same
// manner.
//
// A block owns 64 queries a consumer warpgroup (HopperShape: 128) of one
// (query head, batch) and walks the keys in tiles of 128 (causal: those
// its queries see). Warpgroups:
// - warpgroup 0, the producer: one thread issues the copies of Q (once)
//   and of each K and V tile into two stages, each completing on its
//   stage's "full" barrier (transaction bytes), and waits on the stage's
//   "empty" barrier (an arrival from each consumer warp) before reusing it;
//   it gives its registers up (setmaxnreg 24).
// - warpgroups 1 and 2, the consumers (setmaxnreg 240; 160 with three),
//   64 queries each:
//   S = Q K^T by wgmma with both operands in shared memory (m64n128k16,
//   K-major), the online softmax in registers (scores scaled into base-2
//   exponents: one FFMA and one ex2 a probability, as the own kernel), P
//   rounded to bf16 in registers as the A operand of O += P V (wgmma with A
//   from registers, V as an MN-major B), then the stage released. By
//   default FlashAttention-3's overlap within a warpgroup: tile n's S and
//   tile n - 1's P V are issued together and the softmax of S runs while
//   P V completes (MTRT_CUDA_HOPPER_OVERLAP=0: one tile at a time), and
//   the consumer warpgroups take turns to issue their products (named
//   barriers), FlashAttention-3's ping-pong, so that one's softmax hides
//   behind another's products (MTRT_CUDA_HOPPER_PINGPONG=0: not). On the
//   H200 (bench/NOTES.md, session 17) the overlap gained 3-5% over one tile
//   at a time, the ping-pong up to 5% more at sequences 1024-2048 and
//   nothing at 8192. At the end a consumer writes its 64 rows of out (in
//   bf16) into its rows of the Q tile and stores them, and the copy, by
//   tensor stores (HopperGeometry::tensorStores; else plain stores from
//   the accumulators).
//
// Shared tiles are what the copy engine writes with 128-byte swizzling:
// rows of 64 bf16 (128 bytes), a head dimension of 128 in two such column
// chunks of [rows][64], each chunk 1024-byte aligned; 8 rows (1024 bytes)
// are a swizzle atom. Matrix descriptors: K-major (Q, K) stride 1024 bytes
// between 8-row groups, the k-th 16 columns at +32 k bytes within a chunk;
// V (keys x head dimension, MN-major B of P V) 1024 bytes between groups of
// 8 keys and a chunk's bytes between 64-column chunks, the k-th 16 keys at
// +2048 k bytes.
//
// Fragments: a wgmma accumulator m64nN gives warp w of the warpgroup rows
// 16w .. 16w + 15 and, for each 8 columns j, registers 4j .. 4j + 3 =
// C[g][8j + 2t, +1], C[g + 8][8j + 2t, +1] (g = lane / 4, t = lane % 4):
// mma.sync's C layout, so two neighbouring 8-key blocks of S, rounded to
// bf16, are the A fragment of P V, as in the own kernel.
#include "cuda/kernels/HopperAttention.h"

#include "cuda/kernels/AttentionMask.cuh"

#include "core/Error.h"
#include "core/OpScratch.h"
#include "core/Random.h"

#include <cuda.h>
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <mutex>
#include <string>

namespace mtrt::cuda {

namespace {

constexpr int kBlockN = 128; // keys of a tile
constexpr int kStages = 2;

/// The block's shape at head dimension D: consumer warpgroups of 64
/// queries each, and the producer. Two at both head dimensions: three at
/// 64 (FlashAttention-3's 192 queries, 160 registers a consumer thread;
/// passes the tests) ran gpt2-124m's shape at 206 TFLOP/s against two's
/// 213 (bench/NOTES.md, session 17: 1024 queries are 5.3 blocks of 192).
template <int D> struct HopperShape {
  static constexpr int kConsumers = 2;
  static constexpr int kBlockM = 64 * kConsumers; // queries of a block
  static constexpr int kThreads = 128 * (1 + kConsumers);
  static constexpr int kConsumerWarps = 4 * kConsumers;
  static constexpr int kConsumerRegisters = kConsumers == 3 ? 160 : 240;
};
constexpr float kLn2 = 0.6931471805599453f;

/// What the kernel reads of a call.
struct HopperGeometry {
  int seqQ, seqK, headsQ, group, keyBlocks;
  FlashLayout out, saved;
  bool causal, outputsBf16;
  float scaleLog2;  // the softmax scale times log2(e)
  float keptScale;  // dropout's 1 / (1 - p) (0 when nothing is kept), or 1
  /// FlashAttention-3's overlap of S = Q K^T with the last tile's P V
  /// within a warpgroup (else one tile at a time;
  /// MTRT_CUDA_HOPPER_OVERLAP=0).
  bool overlap;
  /// The consumer warpgroups take turns to issue their products (with
  /// overlap only; MTRT_CUDA_HOPPER_PINGPONG=0 turns it off).
  bool pingpong;
  /// out (bf16) and outCopy, those asked for, leave by the tensor maps
  /// outMap and copyMap from shared memory (rows at 16-byte boundaries),
  /// else by plain stores.
  bool tensorStores;

  __device__ int64_t rowIndex(int b, int h, int i) const {
    return (static_cast<int64_t>(b) * headsQ + h) * seqQ + i;
  }
  __device__ int64_t queryAt(const FlashLayout &layout, int b, int i,
                             int h) const {
    return (static_cast<int64_t>(b) * seqQ + i) * layout.position +
           static_cast<int64_t>(h) * layout.head;
  }
};

/// Bytes of a [rows][64] bf16 column chunk and of a [rows][D] tile.
constexpr uint32_t chunkBytes(int rows) { return rows * 64 * 2; }
template <int D> constexpr uint32_t tileBytes(int rows) {
  return chunkBytes(rows) * (D / 64);
}

/// Shared memory: Q, then K and V of each stage, then the barriers (1024
/// bytes of slack to align the start to a swizzle atom).
template <int D> constexpr size_t sharedBytes() {
  return 1024 + tileBytes<D>(HopperShape<D>::kBlockM) +
         2 * kStages * static_cast<size_t>(tileBytes<D>(kBlockN)) + 128;
}

__device__ inline uint32_t smem(const void *p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

//===--------------------------------------------------------------------===//
// mbarriers and the tensor copy engine
//===--------------------------------------------------------------------===//

__device__ inline void barrierInit(uint32_t bar, uint32_t count) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(bar),
               "r"(count)
               : "memory");
}
/// One arrival that also expects `bytes` of copies to complete on it.
__device__ inline void barrierExpect(uint32_t bar, uint32_t bytes) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::
                   "r"(bar),
               "r"(bytes)
               : "memory");
}
__device__ inline void barrierArrive(uint32_t bar) {
  asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];\n" ::"r"(bar)
               : "memory");
}
/// Waits until the phase of parity `parity` has completed.
__device__ inline void barrierWait(uint32_t bar, uint32_t parity) {
  asm volatile("{\n"
               ".reg .pred done;\n"
               "WAIT:\n"
               "mbarrier.try_wait.parity.shared::cta.b64 done, [%0], %1;\n"
               "@!done bra WAIT;\n"
               "}\n" ::"r"(bar),
               "r"(parity)
               : "memory");
}

/// The box at (column, head, position, batch) of the 4-dimensional tensor
/// map into shared `to`, completing on `bar`.
__device__ inline void copyTile(uint32_t to, const CUtensorMap *map,
                                uint32_t bar, int column, int head,
                                int position, int batch) {
  asm volatile("cp.async.bulk.tensor.4d.shared::cluster.global.tile."
               "mbarrier::complete_tx::bytes [%0], [%1, {%3, %4, %5, %6}], "
               "[%2];\n" ::"r"(to),
               "l"(reinterpret_cast<uint64_t>(map)), "r"(bar), "r"(column),
               "r"(head), "r"(position), "r"(batch)
               : "memory");
}

/// Shared `from` into the box at (column, head, position, batch) of the
/// 4-dimensional tensor map (rows past the tensor's end are not written),
/// in the issuing thread's bulk group.
__device__ inline void storeTile(const CUtensorMap *map, uint32_t from,
                                 int column, int head, int position,
                                 int batch) {
  asm volatile(
      "cp.async.bulk.tensor.4d.global.shared::cta.bulk_group "
      "[%0, {%2, %3, %4, %5}], [%1];\n" ::"l"(reinterpret_cast<uint64_t>(map)),
      "r"(from), "r"(column), "r"(head), "r"(position), "r"(batch)
      : "memory");
}

/// An accumulator pair of a wgmma fragment (row rows8 + g with rows8 a
/// multiple of 8, columns 8j + 2t and + 1) rounded to bf16 into a shared
/// tile laid out as copyRows lays out its loads: 64-column chunks
/// `chunkStride` bytes apart, 128-byte rows, 16-byte group (j % 8) ^ g of
/// the row (no bank conflicts across a warp's store), ready for storeTile.
__device__ inline void storeSwizzledPair(uint32_t tile, uint32_t chunkStride,
                                         int rows8, int g, int j, int t,
                                         float lo, float hi) {
  uint32_t at =
      (j / 8) * chunkStride + (rows8 + g) * 128 + (((j % 8) ^ g) * 16) + 4 * t;
  __nv_bfloat162 pair = __floats2bfloat162_rn(lo, hi);
  asm volatile("st.shared.b32 [%0], %1;\n" ::"r"(tile + at),
               "r"(*reinterpret_cast<uint32_t *>(&pair))
               : "memory");
}

/// Rows [row0, row0 + Rows) of one head into a shared [Rows][D] tile (its
/// 64-column chunks one after another).
template <int D, int Rows>
__device__ inline void copyRows(uint32_t to, const CUtensorMap *map,
                                uint32_t bar, int head, int row0, int batch) {
#pragma unroll
  for (int c = 0; c < D / 64; ++c)
    copyTile(to + c * chunkBytes(Rows), map, bar, 64 * c, head, row0, batch);
}

//===--------------------------------------------------------------------===//
// Warpgroup MMA
//===--------------------------------------------------------------------===//

/// A shared-memory matrix descriptor with 128-byte swizzling.
__device__ inline uint64_t descriptor(uint32_t address, uint32_t leading,
                                      uint32_t stride) {
  return static_cast<uint64_t>((address & 0x3FFFF) >> 4) |
         static_cast<uint64_t>((leading & 0x3FFFF) >> 4) << 16 |
         static_cast<uint64_t>((stride & 0x3FFFF) >> 4) << 32 |
         static_cast<uint64_t>(1) << 62;
}

__device__ inline void wgmmaFence() {
  asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory");
}
__device__ inline void wgmmaCommit() {
  asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory");
}
template <int Pending> __device__ inline void wgmmaWait() {
  asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(Pending)
               : "memory");
}
/// Keeps the compiler from moving accesses of accumulator registers across
/// the asynchronous products' issue and wait.
template <int N> __device__ inline void fenceRegisters(float (&d)[N]) {
#pragma unroll
  for (int i = 0; i < N; ++i)
    asm volatile("" : "+f"(d[i])::"memory");
}
/// The same for A fragments in registers (read by the products until they
/// complete: their registers must not be reused before).
template <int N>
__device__ inline void fenceRegisters(uint32_t (&a)[N][4]) {
#pragma unroll
  for (int i = 0; i < N; ++i)
#pragma unroll
    for (int j = 0; j < 4; ++j)
      asm volatile("" : "+r"(a[i][j])::"memory");
}

/// d (+)= A B, m64n128k16: A and B from shared memory (K-major both).
__device__ inline void wgmmaSS128(float (&d)[64], uint64_t a, uint64_t b,
                                 int accumulate) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %66, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16 {"
      "%0, %1, %2, %3, %4, %5, %6, %7, "
      "%8, %9, %10, %11, %12, %13, %14, %15, "
      "%16, %17, %18, %19, %20, %21, %22, %23, "
      "%24, %25, %26, %27, %28, %29, %30, %31, "
      "%32, %33, %34, %35, %36, %37, %38, %39, "
      "%40, %41, %42, %43, %44, %45, %46, %47, "
      "%48, %49, %50, %51, %52, %53, %54, %55, "
      "%56, %57, %58, %59, %60, %61, %62, %63"
      "}, %64, %65, p, 1, 1, 0, 0;\n}\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]),
        "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]),
        "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]),
        "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]),
        "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]),
        "+f"(d[30]), "+f"(d[31]), "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]),
        "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]), "+f"(d[40]), "+f"(d[41]),
        "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]),
        "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]),
        "+f"(d[54]), "+f"(d[55]), "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]),
        "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63])
      : "l"(a), "l"(b), "r"(accumulate));
}

/// d (+)= A B, m64n128k16: A from registers (four bf16 pairs), B from
/// shared memory, MN-major (transposed).
__device__ inline void wgmmaRS128(float (&d)[64], const uint32_t (&a)[4],
                                 uint64_t b, int accumulate) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %69, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16 {"
      "%0, %1, %2, %3, %4, %5, %6, %7, "
      "%8, %9, %10, %11, %12, %13, %14, %15, "
      "%16, %17, %18, %19, %20, %21, %22, %23, "
      "%24, %25, %26, %27, %28, %29, %30, %31, "
      "%32, %33, %34, %35, %36, %37, %38, %39, "
      "%40, %41, %42, %43, %44, %45, %46, %47, "
      "%48, %49, %50, %51, %52, %53, %54, %55, "
      "%56, %57, %58, %59, %60, %61, %62, %63"
      "}, {%64, %65, %66, %67}, %68, p, 1, 1, 1;\n}\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]),
        "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]),
        "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]),
        "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]),
        "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]),
        "+f"(d[30]), "+f"(d[31]), "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]),
        "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]), "+f"(d[40]), "+f"(d[41]),
        "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]),
        "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]),
        "+f"(d[54]), "+f"(d[55]), "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]),
        "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b),
        "r"(accumulate));
}

/// d (+)= A B, m64n64k16: A from registers (four bf16 pairs), B from
/// shared memory, MN-major (transposed).
__device__ inline void wgmmaRS64(float (&d)[32], const uint32_t (&a)[4],
                                 uint64_t b, int accumulate) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %37, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 {"
      "%0, %1, %2, %3, %4, %5, %6, %7, "
      "%8, %9, %10, %11, %12, %13, %14, %15, "
      "%16, %17, %18, %19, %20, %21, %22, %23, "
      "%24, %25, %26, %27, %28, %29, %30, %31"
      "}, {%32, %33, %34, %35}, %36, p, 1, 1, 1;\n}\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]),
        "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]),
        "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]),
        "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]),
        "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]),
        "+f"(d[30]), "+f"(d[31])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b),
        "r"(accumulate));
}

/// The descriptor of the matrix `offset` bytes (a multiple of 16) into a
/// tile whose descriptor is `tile`: its address field (bits 0-13, the
/// address over 16) plus offset / 16, which cannot carry out of the field
/// since shared addresses stay below 2^18. One add for each of a tile's
/// steps instead of a descriptor built from the address at each.
__device__ inline uint64_t descriptorAt(uint64_t tile, uint32_t offset) {
  return tile + offset / 16;
}

/// A shared K-major tile's descriptor at its k-th 16 columns: chunk k / 4,
/// 32 bytes a step within its 128-byte rows.
template <int Rows>
__device__ inline uint64_t kMajor(uint32_t tile, int k) {
  return descriptorAt(descriptor(tile, 16, 1024),
                      (k / 4) * chunkBytes(Rows) + (k % 4) * 32);
}
/// V's descriptor at keys 16k .. 16k + 15 (MN-major: 1024 bytes between
/// groups of 8 keys, a chunk between 64 columns of the head dimension).
__device__ inline uint64_t mnMajor(uint32_t tile, int k) {
  return descriptorAt(descriptor(tile, chunkBytes(kBlockN), 1024),
                      k * 16 * 128);
}

/// O += P V for one tile: P's A fragments in registers, 8 steps of 16 keys.
template <int D>
__device__ inline void accumulatePV(float (&o)[D / 2],
                                    const uint32_t (&p)[kBlockN / 16][4],
                                    uint32_t vTile) {
#pragma unroll
  for (int k = 0; k < kBlockN / 16; ++k) {
    if constexpr (D == 128)
      wgmmaRS128(o, p[k], mnMajor(vTile, k), 1);
    else
      wgmmaRS64(o, p[k], mnMajor(vTile, k), 1);
  }
}

__device__ inline uint32_t packBf16(float lo, float hi) {
  __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
  return *reinterpret_cast<uint32_t *>(&v);
}
/// packBf16 of max(lo, 0) and max(hi, 0), in the conversion itself.
__device__ inline uint32_t packBf16Relu(float lo, float hi) {
  uint32_t v;
  asm("cvt.rn.relu.bf16x2.f32 %0, %1, %2;" : "=r"(v) : "f"(hi), "f"(lo));
  return v;
}
__device__ inline float fastExp2(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
  return y;
}
__device__ inline float quadMax(float x) {
  x = fmaxf(x, __shfl_xor_sync(0xffffffffu, x, 1));
  return fmaxf(x, __shfl_xor_sync(0xffffffffu, x, 2));
}
__device__ inline float quadSum(float x) {
  x += __shfl_xor_sync(0xffffffffu, x, 1);
  return x + __shfl_xor_sync(0xffffffffu, x, 2);
}

/// The barriers in shared memory: Q's, and each stage's full and empty
/// ones for K and for V.
struct Barriers {
  uint64_t q, kFull[kStages], vFull[kStages], kEmpty[kStages], vEmpty[kStages];
};
static_assert(sizeof(Barriers) <= 128, "sharedBytes reserves 128 bytes");

// Grid (query blocks of HopperShape<D>::kBlockM, headsQ, batch),
// HopperShape<D>::kThreads threads, shared sharedBytes<D>(). Tensor maps: q
// over (D, headsQ, seqQ, batch), boxes of 64 columns x kBlockM positions;
// k and v over (D, headsKv, seqK, batch), boxes of 64 x 128.
template <int D, bool Dropout>
__global__ void __launch_bounds__(HopperShape<D>::kThreads, 1)
    hopperForwardKernel(const __grid_constant__ CUtensorMap qMap,
                        const __grid_constant__ CUtensorMap kMap,
                        const __grid_constant__ CUtensorMap vMap,
                        const __grid_constant__ CUtensorMap outMap,
                        const __grid_constant__ CUtensorMap copyMap,
                        HopperGeometry geo, void *out, __nv_bfloat16 *outCopy,
                        float *logsumexp, const uint64_t *mask) {
  using Shape = HopperShape<D>;
  constexpr int kBlockM = Shape::kBlockM;
  extern __shared__ unsigned char hopperShared[];
  // Swizzled tiles start at a 1024-byte boundary.
  uint32_t base = (smem(hopperShared) + 1023) & ~1023u;
  unsigned char *generic = hopperShared + (base - smem(hopperShared));
  uint32_t qTile = base;
  uint32_t kTiles = qTile + tileBytes<D>(kBlockM);
  uint32_t vTiles = kTiles + kStages * tileBytes<D>(kBlockN);
  auto *bars = reinterpret_cast<Barriers *>(
      generic + tileBytes<D>(kBlockM) + 2 * kStages * tileBytes<D>(kBlockN));

  int q0 = (gridDim.x - 1 - blockIdx.x) * kBlockM; // longest rows first
  int h = blockIdx.y, b = blockIdx.z, kvHead = h / geo.group;
  int keyEnd = geo.causal ? min(geo.seqK, q0 + kBlockM) : geo.seqK;
  int tiles = (keyEnd + kBlockN - 1) / kBlockN;
  int warpgroup = threadIdx.x / 128;

  if (threadIdx.x == 0) {
    barrierInit(smem(&bars->q), 1);
    for (int s = 0; s < kStages; ++s) {
      barrierInit(smem(&bars->kFull[s]), 1);
      barrierInit(smem(&bars->vFull[s]), 1);
      barrierInit(smem(&bars->kEmpty[s]), Shape::kConsumerWarps);
      barrierInit(smem(&bars->vEmpty[s]), Shape::kConsumerWarps);
    }
    asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
  }
  __syncthreads();

  if (warpgroup == 0) {
    asm volatile("setmaxnreg.dec.sync.aligned.u32 24;\n");
    if (threadIdx.x == 0) {
      barrierExpect(smem(&bars->q), tileBytes<D>(kBlockM));
      copyRows<D, kBlockM>(qTile, &qMap, smem(&bars->q), h, q0, b);
      for (int n = 0; n < tiles; ++n) {
        int s = n % kStages;
        uint32_t parity = ((n / kStages) & 1) ^ 1;
        barrierWait(smem(&bars->kEmpty[s]), parity);
        barrierExpect(smem(&bars->kFull[s]), tileBytes<D>(kBlockN));
        copyRows<D, kBlockN>(kTiles + s * tileBytes<D>(kBlockN), &kMap,
                             smem(&bars->kFull[s]), kvHead, n * kBlockN, b);
        barrierWait(smem(&bars->vEmpty[s]), parity);
        barrierExpect(smem(&bars->vFull[s]), tileBytes<D>(kBlockN));
        copyRows<D, kBlockN>(vTiles + s * tileBytes<D>(kBlockN), &vMap,
                             smem(&bars->vFull[s]), kvHead, n * kBlockN, b);
      }
    }
    return;
  }

  asm volatile(
      "setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(Shape::kConsumerRegisters));
  int consumer = warpgroup - 1;
  int warp = (threadIdx.x % 128) / 32, lane = threadIdx.x % 32;
  int g = lane / 4, t = lane % 4;
  int warpRow0 = q0 + 64 * consumer + 16 * warp;
  int rows[2] = {warpRow0 + g, warpRow0 + g + 8};
  // m: the running maxima in base-2 exponents; l: the sums of
  // probabilities (before dropout).
  float m[2] = {-INFINITY, -INFINITY}, l[2] = {0.f, 0.f};
  float o[D / 2];
#pragma unroll
  for (int i = 0; i < D / 2; ++i)
    o[i] = 0.f;
  float s[kBlockN / 2];
#pragma unroll
  for (int i = 0; i < kBlockN / 2; ++i)
    s[i] = 0.f;
  uint32_t p[kBlockN / 16][4];
#pragma unroll
  for (int k = 0; k < kBlockN / 16; ++k)
    p[k][0] = p[k][1] = p[k][2] = p[k][3] = 0u;
  uint32_t qA = qTile + 64 * consumer * 128; // this warpgroup's 64 rows

  // Issues S = Q K^T of tile n (uncommitted).
  auto issueScores = [&](int n) {
    uint32_t kTile = kTiles + (n % kStages) * tileBytes<D>(kBlockN);
#pragma unroll
    for (int k = 0; k < D / 16; ++k)
      wgmmaSS128(s, kMajor<kBlockM>(qA, k), kMajor<kBlockN>(kTile, k), k > 0);
  };
  // Issues O += P V of tile n (uncommitted).
  auto issueValues = [&](int n) {
    accumulatePV<D>(o, p, vTiles + (n % kStages) * tileBytes<D>(kBlockN));
  };
  auto release = [&](uint64_t *bar) {
    __syncwarp();
    if (lane == 0)
      barrierArrive(smem(bar));
  };
  // This lane's mask words of tile n (rows g, g + 8; its two 64-key
  // blocks), shifted right by 2t. Words a row never sees (causal: past its
  // block of 64; past the last key) are not read.
  auto maskWords = [&](int n, uint64_t(&words)[2][2]) {
#pragma unroll
    for (int r = 0; r < 2; ++r)
#pragma unroll
      for (int half = 0; half < 2; ++half) {
        int kb = n * kBlockN / kMaskWordKeys + half;
        bool seen = rows[r] < geo.seqQ &&
                    maskWordSeen(rows[r], kb, geo.keyBlocks, geo.causal);
        words[r][half] =
            seen ? __ldg(mask + geo.rowIndex(b, h, rows[r]) * geo.keyBlocks +
                         kb) >>
                       (2 * t)
                 : 0ull;
      }
  };
  // The online softmax of tile n's scores: masks, the new maxima, alpha
  // (the old sums' and outputs' factor), l, and the probabilities (dropped
  // ones zero) in place of the scores.
  auto softmax = [&](int n, const uint64_t (&words)[2][2],
                     float (&alpha)[2]) {
    int k0 = n * kBlockN;
    if (k0 + kBlockN > geo.seqK ||
        (geo.causal && k0 + kBlockN - 1 > warpRow0)) {
#pragma unroll
      for (int i = 0; i < kBlockN / 2; ++i) {
        int j = k0 + (i / 4) * 8 + 2 * t + (i % 2);
        if (j >= geo.seqK || (geo.causal && j > rows[(i / 2) % 2]))
          s[i] = -INFINITY;
      }
    }
    float tileMax[2] = {-INFINITY, -INFINITY};
#pragma unroll
    for (int i = 0; i < kBlockN / 2; ++i)
      tileMax[(i / 2) % 2] = fmaxf(tileMax[(i / 2) % 2], s[i]);
    float rowBase[2];
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      float next = fmaxf(m[r], quadMax(tileMax[r]) * geo.scaleLog2);
      rowBase[r] = next == -INFINITY ? 0.f : next;
      alpha[r] = fastExp2(m[r] - rowBase[r]);
      m[r] = next;
      l[r] *= alpha[r];
    }
#pragma unroll
    for (int i = 0; i < kBlockN / 2; ++i) {
      int r = (i / 2) % 2;
      float x = fastExp2(fmaf(s[i], geo.scaleLog2, -rowBase[r]));
      l[r] += x;
      if constexpr (Dropout) {
        int j = (i / 4) * 8 + (i % 2); // key within the tile, less 2t
        if (!((words[r][j / 64] >> (j % 64)) & 1))
          x = 0.f;
      }
      s[i] = x;
    }
  };
  auto rescale = [&](const float (&alpha)[2]) {
#pragma unroll
    for (int i = 0; i < D / 2; ++i)
      o[i] *= alpha[(i / 2) % 2];
  };
  // The probabilities in bf16 as the A fragments of P V.
  auto pack = [&] {
#pragma unroll
    for (int k = 0; k < kBlockN / 16; ++k) {
      p[k][0] = packBf16(s[8 * k + 0], s[8 * k + 1]);
      p[k][1] = packBf16(s[8 * k + 2], s[8 * k + 3]);
      p[k][2] = packBf16(s[8 * k + 4], s[8 * k + 5]);
      p[k][3] = packBf16(s[8 * k + 6], s[8 * k + 7]);
    }
  };

  barrierWait(smem(&bars->q), 0);
  if (!geo.overlap) {
    // One tile at a time: S, the softmax, P V.
    for (int n = 0; n < tiles; ++n) {
      int st = n % kStages;
      uint32_t parity = (n / kStages) & 1;
      uint64_t words[2][2] = {};
      barrierWait(smem(&bars->kFull[st]), parity);
      wgmmaFence();
      fenceRegisters(s);
      issueScores(n);
      wgmmaCommit();
      if constexpr (Dropout)
        maskWords(n, words);
      wgmmaWait<0>();
      fenceRegisters(s);
      release(&bars->kEmpty[st]);
      float alpha[2];
      softmax(n, words, alpha);
      rescale(alpha);
      pack();
      barrierWait(smem(&bars->vFull[st]), parity);
      wgmmaFence();
      fenceRegisters(o);
      issueValues(n);
      wgmmaCommit();
      wgmmaWait<0>();
      fenceRegisters(o);
      fenceRegisters(p);
      release(&bars->vEmpty[st]);
    }
  } else {
    // FlashAttention-3's overlap within a warpgroup: tile n's S = Q K^T
    // and tile n - 1's P V are in flight together, and the softmax of S
    // runs while P V completes (its probabilities wait in s until P's
    // registers are free). Tile 0 first, alone. With geo.pingpong the
    // warpgroups take turns to issue their products (consumer c waits on
    // named barrier 1 + c and passes to the next; consumer 0 first), so
    // that one's softmax runs while another's products do; turns: tile 0,
    // tiles 1 .. tiles - 1, the last P V.
    auto myTurn = [&] {
      if (geo.pingpong)
        asm volatile("bar.sync %0, 256;\n" ::"r"(1 + consumer) : "memory");
    };
    // Consumer 0 waits as many turns as the last consumer passes it: one
    // before the first, none after the last.
    auto passTurn = [&](bool last) {
      if (geo.pingpong && !(last && consumer == Shape::kConsumers - 1))
        asm volatile("bar.arrive %0, 256;\n" ::"r"(
                         1 + (consumer + 1) % Shape::kConsumers)
                     : "memory");
    };
    if (geo.pingpong && consumer == Shape::kConsumers - 1)
      asm volatile("bar.arrive 1, 256;\n" ::: "memory");
    {
      uint64_t words[2][2] = {};
      barrierWait(smem(&bars->kFull[0]), 0);
      myTurn();
      wgmmaFence();
      fenceRegisters(s);
      issueScores(0);
      wgmmaCommit();
      passTurn(false);
      if constexpr (Dropout)
        maskWords(0, words);
      wgmmaWait<0>();
      fenceRegisters(s);
      release(&bars->kEmpty[0]);
      float alpha[2];
      softmax(0, words, alpha);
      pack();
    }
    for (int n = 1; n < tiles; ++n) {
      int st = n % kStages, prev = (n - 1) % kStages;
      uint32_t parity = (n / kStages) & 1;
      uint32_t prevParity = ((n - 1) / kStages) & 1;
      uint64_t words[2][2] = {};
      barrierWait(smem(&bars->kFull[st]), parity);
      barrierWait(smem(&bars->vFull[prev]), prevParity);
      myTurn();
      wgmmaFence();
      fenceRegisters(s);
      fenceRegisters(o);
      issueScores(n);
      wgmmaCommit();
      issueValues(n - 1);
      wgmmaCommit();
      passTurn(false);
      if constexpr (Dropout)
        maskWords(n, words);
      wgmmaWait<1>(); // S done, P V may still run
      fenceRegisters(s);
      release(&bars->kEmpty[st]);
      float alpha[2];
      softmax(n, words, alpha);
      wgmmaWait<0>();
      fenceRegisters(o);
      fenceRegisters(p);
      release(&bars->vEmpty[prev]);
      rescale(alpha);
      pack();
    }
    {
      int n = tiles - 1, st = n % kStages;
      barrierWait(smem(&bars->vFull[st]), (n / kStages) & 1);
      myTurn();
      wgmmaFence();
      fenceRegisters(o);
      issueValues(n);
      wgmmaCommit();
      passTurn(true);
      wgmmaWait<0>();
      fenceRegisters(o);
      fenceRegisters(p);
      release(&bars->vEmpty[st]);
    }
  }

  float factors[2];
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    float sum = quadSum(l[r]);
    factors[r] = sum > 0.f ? geo.keptScale / sum : 0.f;
    if (t == 0 && rows[r] < geo.seqQ)
      logsumexp[geo.rowIndex(b, h, rows[r])] = (m[r] + log2f(sum)) * kLn2;
  }
  if (geo.tensorStores) {
    // Into this consumer's 64 rows of the Q tile (its own products, all
    // done, were their only readers; storeSwizzledPair), then one tensor store
    // a 64-column chunk to out and to outCopy; rows past seqQ are not
    // written. The warps leave once the stores have read shared memory.
#pragma unroll
    for (int r = 0; r < 2; ++r)
#pragma unroll
      for (int j = 0; j < D / 8; ++j)
        storeSwizzledPair(qA, chunkBytes(kBlockM), 16 * warp + 8 * r, g, j, t,
                          o[4 * j + 2 * r] * factors[r],
                          o[4 * j + 2 * r + 1] * factors[r]);
    asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
    asm volatile("bar.sync %0, 128;\n" ::"r"(3 + consumer) : "memory");
    if (threadIdx.x % 128 == 0) {
#pragma unroll
      for (int c = 0; c < D / 64; ++c) {
        uint32_t chunk = qA + c * chunkBytes(kBlockM);
        if (out)
          storeTile(&outMap, chunk, 64 * c, h, q0 + 64 * consumer, b);
        if (outCopy)
          storeTile(&copyMap, chunk, 64 * c, h, q0 + 64 * consumer, b);
      }
      asm volatile("cp.async.bulk.commit_group;\n" ::: "memory");
      asm volatile("cp.async.bulk.wait_group.read 0;\n" ::: "memory");
    }
    return;
  }
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    int row = rows[r];
    if (row >= geo.seqQ)
      continue;
    float factor = factors[r];
#pragma unroll
    for (int j = 0; j < D / 8; ++j) {
      float lo = o[4 * j + 2 * r] * factor, hi = o[4 * j + 2 * r + 1] * factor;
      int col = 8 * j + 2 * t;
      if (out) {
        int64_t at = geo.queryAt(geo.out, b, row, h) + col;
        if (geo.outputsBf16)
          *reinterpret_cast<__nv_bfloat162 *>(
              static_cast<__nv_bfloat16 *>(out) + at) =
              __floats2bfloat162_rn(lo, hi);
        else
          *reinterpret_cast<float2 *>(static_cast<float *>(out) + at) =
              make_float2(lo, hi);
      }
      if (outCopy)
        *reinterpret_cast<__nv_bfloat162 *>(
            outCopy + geo.queryAt(geo.saved, b, row, h) + col) =
            __floats2bfloat162_rn(lo, hi);
    }
  }
}

//===--------------------------------------------------------------------===//
// The backward
//===--------------------------------------------------------------------===//
//
// FlashAttention-3's backward in the same manner as the forward: a block
// owns kBackwardKeys = 128 keys of one key/value head (64 a consumer
// warpgroup) and walks the query tiles of 64 that see them, over every
// query head of its group (causal: the tiles from its first key on).
// The producer warpgroup's thread 0 copies K and V once and each step's Q
// and dout tiles into two stages by TMA; its warp 1 copies the step's
// logsumexps, deltas and dropout mask words (the two words of the block's
// keys for each of the 64 queries) by cp.async into the step's row stage,
// completing on an mbarrier. Consumer warpgroup c, keys k0 + 64c .. +63,
// per step (M = its 64 keys, N = the 64 queries):
//   S^T = K_c Q^T and dP^T = V_c dout^T (wgmma, both operands in shared
//   memory, K-major, m64n64k16), issued together;
//   P^T = exp2(S^T scale log2(e) - lse log2(e)) (masked: causal, keys past
//   seqK), rounded to bf16 with dropout applied (kept: P / (1 - p), else
//   0) as the register A operand of dV += P^T dout (dout an MN-major B);
//   dS^T = P^T (dP^T kept / (1 - p), else 0, less delta) as the register
//   A operand of dK += dS^T Q, and stored (bf16, 128-byte swizzled) into
//   the step's [128 keys][64 queries] dS^T buffer;
//   after a named barrier over both consumers (head dimension 128) or in
//   the next step (64: the late dQ, LateDq), dQ's share of the block,
//   dS K (A: dS^T as an MN-major operand, B: K MN-major), m64n64k16 over
//   the 128 keys: at head dimension 128 consumer c takes columns 64c ..
//   +63; at 64 the consumer of the step's parity takes all 64. Its fp32
//   accumulators go to a shared 64 x 64 tile (fragment order: 16-byte
//   stores, no bank conflicts) that one thread adds into dqSum (tiles of
//   64 queries x 64 columns, zeroed first) by one bulk reduction
//   (cp.reduce.async.bulk .add.f32); dq's additions come in a varying
//   order (not deterministic: the executor runs the own kernels for the
//   deterministic backward); a last kernel writes dq = scale dqSum.
//   (red.global.add.v2.f32 from the accumulators into [batch, headsQ,
//   seqQ, D] sums was up to 1.2x slower, session 18; each consumer its own
//   keys' share, no barrier between them, 0.76-0.95 of by columns on the
//   H200, session 18, and took gpt-1.3b's step from 37 to 42 ms, session
//   31: both gone.)
// dK (times the scale) and dV leave at the end: in bf16 through shared
// memory (the stages' tiles) by one tensor store a consumer each, else by
// plain stores from the accumulators.

constexpr int kBackwardKeys = 128;   // keys of a block
constexpr int kBackwardQueries = 64; // queries of a walked tile
constexpr int kBackwardThreads = 384;

/// What the backward kernel reads of a call.
struct HopperBackwardGeometry {
  int seqQ, seqK, headsQ, group, keyBlocks;
  int queryTiles; // tiles of 64 queries over seqQ (the bulk dq layout's)
  /// The (batch, key/value head) pairs whose blocks run together: blocks
  /// come in groups of pairGroup pairs (the last group may hold fewer), by
  /// key block first within a group (the longest walks first under a
  /// causal mask), so that the blocks running at one time share their
  /// pairs' Q, dout and dq sums in L2 (hopperAttentionBackward says when;
  /// MTRT_CUDA_HOPPER_PAIR_GROUP sets it, 0 for all pairs in one group).
  int pairGroup;
  FlashLayout dk, dv;
  bool causal, outputsBf16;
  /// dK and dV leave by the tensor maps dkMap and dvMap from shared memory
  /// (bf16, both asked for, rows at 16-byte boundaries), else by plain
  /// stores.
  bool tensorStores;
  float scale;        // the softmax scale (dk's factor)
  float scaleLog2;    // the scale times log2(e)
  /// With dropout, the consumers keep P' = P / (1 - p), with a dropped
  /// element's sign set: its exponent's bias log2(1 / (1 - p)) and the
  /// kept fraction 1 - p (0 and 1 without dropout, or where none is kept).
  float dropoutScaleLog2;
  float keptFraction;

  __device__ int64_t rowIndex(int b, int h, int i) const {
    return (static_cast<int64_t>(b) * headsQ + h) * seqQ + i;
  }
  __device__ int64_t keyAt(const FlashLayout &layout, int b, int j,
                           int g) const {
    return (static_cast<int64_t>(b) * seqK + j) * layout.position +
           static_cast<int64_t>(g) * layout.head;
  }
};

/// A step's per-query values in shared memory (cp.async from warp 1 of the
/// producer): natural-log logsumexps, deltas, and the mask words of the
/// block's two 64-key blocks (zero where the mask kernel wrote none).
struct BackwardRows {
  float lse[kBackwardQueries];
  float delta[kBackwardQueries];
  uint64_t mask[kBackwardQueries][2];
};

struct BackwardBarriers {
  uint64_t kv, qFull[kStages], qEmpty[kStages], rowFull[kStages],
      rowEmpty[kStages];
};

/// Byte offsets of the backward's shared memory from its 1024-aligned base.
template <int D> struct BackwardSmem {
  static constexpr uint32_t kKeys = 0;
  static constexpr uint32_t kValues = tileBytes<D>(kBackwardKeys);
  /// Stage s: Q at kQueries + s kStageBytes, dout kStageBytes / 2 after.
  static constexpr uint32_t kQueries = 2 * tileBytes<D>(kBackwardKeys);
  static constexpr uint32_t kStageBytes = 2 * tileBytes<D>(kBackwardQueries);
  /// Two dS^T buffers [128 keys][64 queries] (one 128-byte swizzled chunk).
  static constexpr uint32_t kScores = kQueries + kStages * kStageBytes;
  static constexpr uint32_t kScoresBytes = chunkBytes(kBackwardKeys);
  /// Each consumer's dq share in fragment order (64 x 64 floats).
  static constexpr uint32_t kDq = kScores + 2 * kScoresBytes;
  static constexpr uint32_t kDqBytes = 64 * 64 * 4;
  static constexpr uint32_t kRows = kDq + 2 * kDqBytes;
  static constexpr uint32_t kBarriers = kRows + kStages * sizeof(BackwardRows);
  static constexpr size_t kTotal = 1024 + kBarriers + sizeof(BackwardBarriers);
};

/// d (+)= A B, m64n64k16, both from shared memory; TransA / TransB 1: that
/// operand is MN-major (transposed), else K-major.
template <int TransA, int TransB>
__device__ inline void wgmmaSS64(float (&d)[32], uint64_t a, uint64_t b,
                                 int accumulate) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %34, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 {"
      "%0, %1, %2, %3, %4, %5, %6, %7, "
      "%8, %9, %10, %11, %12, %13, %14, %15, "
      "%16, %17, %18, %19, %20, %21, %22, %23, "
      "%24, %25, %26, %27, %28, %29, %30, %31"
      "}, %32, %33, p, 1, 1, %35, %36;\n}\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]),
        "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]),
        "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]),
        "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]),
        "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]),
        "+f"(d[30]), "+f"(d[31])
      : "l"(a), "l"(b), "r"(accumulate), "n"(TransA), "n"(TransB));
}

/// An MN-major operand's descriptor at K rows 16k .. 16k + 15 of a tile of
/// `Rows` rows of 64-column chunks (1024 bytes between groups of 8 rows, a
/// chunk between 64 MN columns): mnMajor for any row count.
template <int Rows>
__device__ inline uint64_t mnMajorRows(uint32_t tile, int k) {
  return descriptorAt(descriptor(tile, chunkBytes(Rows), 1024), k * 16 * 128);
}

/// acc += A B over 64 K rows of B (4 steps of 16): A from registers, B an
/// MN-major [64][D] tile (dout or Q).
template <int D>
__device__ inline void accumulateRS(float (&acc)[D / 2],
                                    const uint32_t (&a)[4][4], uint32_t tile) {
#pragma unroll
  for (int k = 0; k < kBackwardQueries / 16; ++k) {
    if constexpr (D == 128)
      wgmmaRS128(acc, a[k], mnMajorRows<kBackwardQueries>(tile, k), 1);
    else
      wgmmaRS64(acc, a[k], mnMajorRows<kBackwardQueries>(tile, k), 1);
  }
}

__device__ inline void copyAsyncZeroFill(uint32_t to, const void *from,
                                         int bytes, bool valid) {
  if (bytes == 4)
    asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;\n" ::"r"(to),
                 "l"(from), "r"(valid ? 4 : 0)
                 : "memory");
  else
    asm volatile("cp.async.ca.shared.global [%0], [%1], 8, %2;\n" ::"r"(to),
                 "l"(from), "r"(valid ? 8 : 0)
                 : "memory");
}

// The bulk dq layout, dqSum ([batch, headsQ, queryTiles, D / 64] tiles of
// 64 x 64 floats): within a tile, float ((w 8 + j) 32 + lane) 4 + e is the
// wgmma accumulator element dq[4j + e] of lane `lane` of warp w, i.e. row
// 16w + lane / 4 + 8 (e / 2), column 8j + 2 (lane % 4) + e % 2; so a
// consumer writes its share with one 16-byte store a lane per j.

// Grid (key blocks of 128, headsKv, batch) walked longest first (causal:
// key block 0 sees every query), kBackwardThreads threads, shared
// BackwardSmem<D>::kTotal. Tensor maps: q and dout over (D, headsQ, seqQ,
// batch), boxes of 64 columns x 64 positions; k and v over (D, headsKv,
// seqK, batch), boxes of 64 x 128.
template <int D, bool Dropout, bool LateDq>
__global__ void __launch_bounds__(kBackwardThreads, 1)
    hopperBackwardKernel(const __grid_constant__ CUtensorMap qMap,
                         const __grid_constant__ CUtensorMap kMap,
                         const __grid_constant__ CUtensorMap vMap,
                         const __grid_constant__ CUtensorMap doutMap,
                         const __grid_constant__ CUtensorMap dkMap,
                         const __grid_constant__ CUtensorMap dvMap,
                         HopperBackwardGeometry geo, const float *logsumexp,
                         const float *delta, const uint64_t *mask, float *dqSum,
                         void *dk, void *dv) {
  using Smem = BackwardSmem<D>;
  extern __shared__ unsigned char hopperShared[];
  uint32_t base = (smem(hopperShared) + 1023) & ~1023u;
  unsigned char *generic = hopperShared + (base - smem(hopperShared));
  auto *bars = reinterpret_cast<BackwardBarriers *>(generic + Smem::kBarriers);
  auto *rowStages = reinterpret_cast<BackwardRows *>(generic + Smem::kRows);
  uint32_t kTile = base + Smem::kKeys, vTile = base + Smem::kValues;
  auto queryTile = [&](int st) {
    return base + Smem::kQueries + st * Smem::kStageBytes;
  };
  auto doutTile = [&](int st) {
    return queryTile(st) + Smem::kStageBytes / 2;
  };
  auto scoresTile = [&](int step) {
    return base + Smem::kScores + (step & 1) * Smem::kScoresBytes;
  };

  int pairs = gridDim.y * gridDim.z;
  int linear = blockIdx.x + gridDim.x * (blockIdx.y + gridDim.y * blockIdx.z);
  int group = linear / (geo.pairGroup * gridDim.x);
  int inGroup = linear % (geo.pairGroup * gridDim.x);
  int groupPairs = min(geo.pairGroup, pairs - group * geo.pairGroup);
  int keyBlock = inGroup / groupPairs;
  int pair = group * geo.pairGroup + inGroup % groupPairs;
  int kvHead = pair % gridDim.y, b = pair / gridDim.y;
  int k0 = keyBlock * kBackwardKeys;
  int queryBegin = geo.causal ? k0 : 0;
  int queryTiles =
      max(0, (geo.seqQ - queryBegin + kBackwardQueries - 1) / kBackwardQueries);
  int steps = geo.group * queryTiles;
  auto headOf = [&](int step) {
    return kvHead * geo.group + step / queryTiles;
  };
  auto firstQuery = [&](int step) {
    return queryBegin + step % queryTiles * kBackwardQueries;
  };
  int warpgroup = threadIdx.x / 128;

  if (threadIdx.x == 0) {
    barrierInit(smem(&bars->kv), 1);
    for (int s = 0; s < kStages; ++s) {
      barrierInit(smem(&bars->qFull[s]), 1);
      barrierInit(smem(&bars->qEmpty[s]), 8);
      barrierInit(smem(&bars->rowFull[s]), 32);
      barrierInit(smem(&bars->rowEmpty[s]), 8);
    }
    asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
  }
  __syncthreads();

  // The producer keeps 40 registers and the consumers 232 (40 x 128 + 232
  // x 256 <= 64 K): at 24 the producer's row copies spilled 28-68 bytes in
  // every instantiation (ptxas), now none without dropout.
  if (warpgroup == 0) {
    asm volatile("setmaxnreg.dec.sync.aligned.u32 40;\n");
    int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    if (threadIdx.x == 0) {
      barrierExpect(smem(&bars->kv), 2 * tileBytes<D>(kBackwardKeys));
      copyRows<D, kBackwardKeys>(kTile, &kMap, smem(&bars->kv), kvHead, k0,
                                 b);
      copyRows<D, kBackwardKeys>(vTile, &vMap, smem(&bars->kv), kvHead, k0,
                                 b);
      for (int step = 0; step < steps; ++step) {
        int st = step % kStages;
        uint32_t parity = ((step / kStages) & 1) ^ 1;
        barrierWait(smem(&bars->qEmpty[st]), parity);
        barrierExpect(smem(&bars->qFull[st]),
                      2 * tileBytes<D>(kBackwardQueries));
        copyRows<D, kBackwardQueries>(queryTile(st), &qMap,
                                      smem(&bars->qFull[st]), headOf(step),
                                      firstQuery(step), b);
        copyRows<D, kBackwardQueries>(doutTile(st), &doutMap,
                                      smem(&bars->qFull[st]), headOf(step),
                                      firstQuery(step), b);
      }
    } else if (warp == 1) {
      for (int step = 0; step < steps; ++step) {
        int st = step % kStages;
        uint32_t parity = ((step / kStages) & 1) ^ 1;
        barrierWait(smem(&bars->rowEmpty[st]), parity);
        BackwardRows *rowsTo = rowStages + st;
        int h = headOf(step), q0 = firstQuery(step);
#pragma unroll
        for (int half = 0; half < 2; ++half) {
          int r = lane + 32 * half, i = q0 + r;
          bool in = i < geo.seqQ;
          int64_t at = in ? geo.rowIndex(b, h, i) : 0;
          copyAsyncZeroFill(smem(&rowsTo->lse[r]), logsumexp + at, 4, in);
          copyAsyncZeroFill(smem(&rowsTo->delta[r]), delta + at, 4, in);
          if constexpr (Dropout) {
#pragma unroll
            for (int w = 0; w < 2; ++w) {
              int kb = k0 / kMaskWordKeys + w;
              bool seen = in && maskWordSeen(i, kb, geo.keyBlocks, geo.causal);
              copyAsyncZeroFill(smem(&rowsTo->mask[r][w]),
                                mask + (seen ? at * geo.keyBlocks + kb : 0),
                                8, seen);
            }
          }
        }
        asm volatile(
            "cp.async.mbarrier.arrive.noinc.shared::cta.b64 [%0];\n" ::"r"(
                smem(&bars->rowFull[st]))
            : "memory");
      }
      asm volatile("cp.async.wait_all;\n" ::: "memory");
    }
    return;
  }

  asm volatile("setmaxnreg.inc.sync.aligned.u32 232;\n");
  int consumer = warpgroup - 1;
  int warp = (threadIdx.x % 128) / 32, lane = threadIdx.x % 32;
  int g = lane / 4, t = lane % 4;
  int warpKey0 = k0 + 64 * consumer + 16 * warp;
  int keys[2] = {warpKey0 + g, warpKey0 + g + 8};
  // This lane's keys' bits in the consumer's mask word (its 64 keys are
  // one word: key block k0 / 64 + consumer).
  int keyBit = 16 * warp + g;
  float dkAcc[D / 2], dvAcc[D / 2];
#pragma unroll
  for (int i = 0; i < D / 2; ++i)
    dkAcc[i] = dvAcc[i] = 0.f;
  uint32_t kA = kTile + 64 * consumer * 128; // this consumer's 64 keys
  uint32_t vA = vTile + 64 * consumer * 128;
  auto release = [&](uint64_t *bar) {
    __syncwarp();
    if (lane == 0)
      barrierArrive(smem(bar));
  };

  // Named barriers of the late dQ (LateDq), each of 256 threads: one
  // consumer's 128 arrive, the other's 128 wait. kStored + 2 p + c: consumer
  // c has stored its dS^T half into buffer p; kRead + 2 p + c: consumer c's
  // dQ product has read buffer p. (1: both consumers, the order in step;
  // 2 + c: consumer c's own warps.)
  constexpr int kStored = 4, kRead = 8;
  int other = 1 - consumer;

  barrierWait(smem(&bars->kv), 0);
  for (int step = 0; step < steps + (LateDq ? 1 : 0); ++step) {
    // This step's products (all but the late dQ's extra last step), and
    // the step whose dQ it takes: the previous one with LateDq.
    bool walks = step < steps;
    int dqStep = LateDq ? step - 1 : step;
    int st = step % kStages;
    uint32_t parity = (step / kStages) & 1;
    uint32_t pA[4][4], dsA[4][4];
    if (walks) {
      int q0 = firstQuery(step);
      const BackwardRows &rowS = rowStages[st];
      float s[32], dp[32];
#pragma unroll
      for (int i = 0; i < 32; ++i)
        s[i] = dp[i] = 0.f;
      barrierWait(smem(&bars->qFull[st]), parity);
      wgmmaFence();
      fenceRegisters(s);
      fenceRegisters(dp);
#pragma unroll
      for (int k = 0; k < D / 16; ++k)
        wgmmaSS64<0, 0>(s, kMajor<kBackwardKeys>(kA, k),
                        kMajor<kBackwardQueries>(queryTile(st), k), k > 0);
      wgmmaCommit();
#pragma unroll
      for (int k = 0; k < D / 16; ++k)
        wgmmaSS64<0, 0>(dp, kMajor<kBackwardKeys>(vA, k),
                        kMajor<kBackwardQueries>(doutTile(st), k), k > 0);
      wgmmaCommit();
      barrierWait(smem(&bars->rowFull[st]), parity);
      // A lane's logsumexps and keep words of the step; at head dimension
      // 64 (where the consumers have the registers) read before the wait
      // for S^T, whose first use of them stalled on the shared loads
      // (bench/NOTES.md, session 36).
      auto lseAt = [&](int j) {
        return *reinterpret_cast<const float2 *>(&rowS.lse[8 * j + 2 * t]);
      };
      auto keepHalfAt = [&](int j, int c) {
        return reinterpret_cast<const uint32_t *>(
            &rowS.mask[8 * j + 2 * t + c][consumer])[keyBit / 32];
      };
      constexpr bool kRowsEarly = D == 64;
      constexpr int kEarly = kRowsEarly ? 8 : 1;
      float2 lseEarly[kEarly];
      uint32_t keepEarly[kEarly][2];
      if constexpr (kRowsEarly) {
#pragma unroll
        for (int j = 0; j < 8; ++j) {
          lseEarly[j] = lseAt(j);
          if constexpr (Dropout)
            for (int c = 0; c < 2; ++c)
              keepEarly[j][c] = keepHalfAt(j, c);
        }
      }
      wgmmaWait<1>();
      fenceRegisters(s);

      // P^T in place of S^T (element 4j + e: key keys[e / 2], query
      // q0 + 8j + 2t + e % 2), with dropout P' = P / (1 - p) from the
      // exponential itself and a dropped element's sign set; its dropped
      // bf16 copy (the conversion's relu) as A fragments.
      bool masked =
          warpKey0 + 16 > geo.seqK || (geo.causal && warpKey0 + 15 > q0);
      constexpr bool kMaskPass = Dropout || D == 64;
#pragma unroll
      for (int j = 0; j < 8; ++j) {
        int col = 8 * j + 2 * t;
        float2 lse2 = kRowsEarly ? lseEarly[j % kEarly] : lseAt(j);
        float lseLog2[2] = {lse2.x * 1.4426950408889634f,
                            lse2.y * 1.4426950408889634f};
        if constexpr (Dropout)
          for (float &bias : lseLog2)
            bias -= geo.dropoutScaleLog2;
        // Both of this lane's keys (bits keyBit and keyBit + 8) lie in one
        // 32-bit half of a word, read alone: keep[c][r] holds key r's bit
        // at bit 31.
        uint32_t keep[2][2] = {};
        if constexpr (Dropout) {
#pragma unroll
          for (int c = 0; c < 2; ++c) {
            uint32_t half =
                kRowsEarly ? keepEarly[j % kEarly][c] : keepHalfAt(j, c);
            keep[c][0] = half << (31 - keyBit % 32);
            keep[c][1] = half << (23 - keyBit % 32);
          }
        }
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          int r = e / 2, c = e % 2;
          float x = fastExp2(fmaf(s[4 * j + e], geo.scaleLog2, -lseLog2[c]));
          if (!kMaskPass && masked &&
              (keys[r] >= geo.seqK || (geo.causal && keys[r] > q0 + col + c)))
            x = 0.f;
          if constexpr (Dropout) {
            // A dropped element (its bit 0) keeps P' with the sign set.
            uint32_t sign = ~keep[c][r] & 0x80000000u;
            x = __uint_as_float(__float_as_uint(x) | sign);
          }
          s[4 * j + e] = x;
        }
      }
      // The masked tile's zeros in a pass of their own (P' = 0 of either
      // sign: dV's operand and dS both 0), so that the other steps run no
      // per-element compares: merged into the loop above, ptxas computed
      // all 32 predicates at every step (about 170 of a consumer warp's 960
      // instructions a step at head dimension 128). The main kernel took
      // 857 -> 753 us at gpt-1.3b's shape with dropout 0.1, 714 -> 670 at
      // gpt2-350m's (H100, bench/NOTES.md, session 37). Not at 128 without
      // dropout, where ptxas spilled 56 bytes with the pass.
      if (kMaskPass && masked) {
#pragma unroll
        for (int j = 0; j < 8; ++j)
#pragma unroll
          for (int e = 0; e < 4; ++e) {
            int key = keys[e / 2], query = q0 + 8 * j + 2 * t + e % 2;
            if (key >= geo.seqK || (geo.causal && key > query))
              s[4 * j + e] = 0.f;
          }
      }
#pragma unroll
      for (int k = 0; k < 4; ++k)
#pragma unroll
        for (int x = 0; x < 4; ++x)
          pA[k][x] = packBf16Relu(s[8 * k + 2 * x], s[8 * k + 2 * x + 1]);
      wgmmaFence();
      fenceRegisters(dvAcc);
      fenceRegisters(pA);
      accumulateRS<D>(dvAcc, pA, doutTile(st));
      wgmmaCommit();

      wgmmaWait<1>(); // dP^T done, dV may run on
      fenceRegisters(dp);
      // dS^T = P^T (dP^T kept / (1 - p) - delta).
#pragma unroll
      for (int j = 0; j < 8; ++j) {
        int col = 8 * j + 2 * t;
        float2 delta2 = *reinterpret_cast<const float2 *>(&rowS.delta[col]);
        float deltas[2] = {delta2.x, delta2.y};
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          int i = 4 * j + e;
          if constexpr (Dropout) {
            // P (dP kept / (1 - p) - delta) = |P'| (dP kept - delta (1 - p))
            // = max(P', 0) dP - |P'| delta (1 - p): one FMA.
            dp[i] = fmaf(fmaxf(s[i], 0.f), dp[i],
                         -fabsf(s[i]) * (deltas[e % 2] * geo.keptFraction));
          } else {
            dp[i] = s[i] * (dp[i] - deltas[e % 2]);
          }
        }
      }
#pragma unroll
      for (int k = 0; k < 4; ++k)
#pragma unroll
        for (int x = 0; x < 4; ++x)
          dsA[k][x] = packBf16(dp[8 * k + 2 * x], dp[8 * k + 2 * x + 1]);
      wgmmaFence();
      fenceRegisters(dkAcc);
      fenceRegisters(dsA);
      accumulateRS<D>(dkAcc, dsA, queryTile(st));
      wgmmaCommit();
      // dS^T into the step's buffer, 128-byte swizzled: key row
      // 64 consumer + 16 warp + g (+ 8), queries 16k + 2t (+1) (x = 0, 1) and
      // 16k + 8 + 2t (x = 2, 3), i.e. 16-byte column group 2k + x / 2. With
      // LateDq, once the other consumer's dQ of two steps back has read it.
      if constexpr (LateDq)
        if (step >= 2)
          asm volatile(
              "bar.sync %0, 256;\n" ::"r"(kRead + 2 * (step & 1) + other)
              : "memory");
      {
        unsigned char *scores = generic + (scoresTile(step) - base);
#pragma unroll
        for (int k = 0; k < 4; ++k)
#pragma unroll
          for (int x = 0; x < 4; ++x) {
            int row = 64 * consumer + 16 * warp + g + 8 * (x % 2);
            int group = 2 * k + x / 2;
            *reinterpret_cast<uint32_t *>(
                scores + row * 128 + ((group ^ g) * 16) + 4 * t) = dsA[k][x];
          }
      }
      asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
      if constexpr (LateDq) {
        asm volatile("bar.sync %0, 128;\n" ::"r"(2 + consumer) : "memory");
        asm volatile(
            "bar.arrive %0, 256;\n" ::"r"(kStored + 2 * (step & 1) + consumer)
            : "memory");
      } else {
        asm volatile("bar.sync 1, 256;\n" ::: "memory");
      }
    } // walks

    // dQ's share of dqStep, dS K: dS over the block's 128 keys times K's
    // columns [column0, column0 + 64) (at 128 consumer c takes 64c, at 64
    // the consumer of the step's parity all). With LateDq it is the
    // previous step's, once the other consumer has stored its half of that
    // dS^T: the consumers then meet only a step apart, and one's softmax
    // may run beside the other's products (FlashAttention-3's ping-pong,
    // which the forward schedules by barriers, here left to the warp
    // schedulers). (The product is issued whether or not dq is asked for:
    // under a condition ptxas spilled 300 bytes a thread at 128.)
    {
      // (At 128 even the late dQ's first step, of no step, reads a buffer
      // and adds nothing.)
      bool computesDq = D == 128 || (dqStep >= 0 && (dqStep & 1) == consumer);
      bool addsDq = dqSum && computesDq && dqStep >= 0;
      int column0 = D == 128 ? 64 * consumer : 0;
      float dq[32];
      if constexpr (LateDq)
        if (dqStep >= 0)
          asm volatile(
              "bar.sync %0, 256;\n" ::"r"(kStored + 2 * (dqStep & 1) + other)
              : "memory");
      if (computesDq) {
#pragma unroll
        for (int i = 0; i < 32; ++i)
          dq[i] = 0.f;
        wgmmaFence();
        fenceRegisters(dq);
#pragma unroll
        for (int k = 0; k < kBackwardKeys / 16; ++k)
          wgmmaSS64<1, 1>(
              dq, mnMajorRows<kBackwardKeys>(scoresTile(dqStep), k),
              mnMajorRows<kBackwardKeys>(
                  kTile + (column0 / 64) * chunkBytes(kBackwardKeys), k),
              k > 0);
        wgmmaCommit();
      }
      wgmmaWait<0>();
      fenceRegisters(dvAcc);
      fenceRegisters(dkAcc);
      if (walks) {
        fenceRegisters(pA);
        fenceRegisters(dsA);
        release(&bars->qEmpty[st]);
        release(&bars->rowEmpty[st]);
      }
      if (computesDq)
        fenceRegisters(dq);
      // This consumer has read buffer dqStep & 1; the other stores into it
      // again at dqStep + 2 (no arrival that no one waits for).
      if constexpr (LateDq)
        if (dqStep >= 0 && dqStep + 2 < steps)
          asm volatile(
              "bar.arrive %0, 256;\n" ::"r"(kRead + 2 * (dqStep & 1) + consumer)
              : "memory");
      int h = addsDq ? headOf(dqStep) : 0;
      int q0 = addsDq ? firstQuery(dqStep) : 0;
      if (addsDq) {
        // Through this consumer's shared tile: wait until the last bulk
        // reduction has read it, fill it, and one thread adds it into the
        // tile's sums.
        uint32_t dqTile = base + Smem::kDq + consumer * Smem::kDqBytes;
        if (threadIdx.x % 128 == 0)
          asm volatile("cp.async.bulk.wait_group.read 0;\n" ::: "memory");
        asm volatile("bar.sync %0, 128;\n" ::"r"(2 + consumer) : "memory");
#pragma unroll
        for (int j = 0; j < 8; ++j)
          asm volatile("st.shared.v4.f32 [%0], {%1, %2, %3, %4};\n" ::"r"(
                           dqTile + ((warp * 8 + j) * 32 + lane) * 16),
                       "f"(dq[4 * j]), "f"(dq[4 * j + 1]), "f"(dq[4 * j + 2]),
                       "f"(dq[4 * j + 3])
                       : "memory");
        asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
        asm volatile("bar.sync %0, 128;\n" ::"r"(2 + consumer) : "memory");
        if (threadIdx.x % 128 == 0) {
          int64_t tile = ((static_cast<int64_t>(b) * geo.headsQ + h) *
                              geo.queryTiles +
                          q0 / kBackwardQueries) *
                             (D / 64) +
                         column0 / 64;
          asm volatile("cp.reduce.async.bulk.global.shared::cta.bulk_group."
                       "add.f32 [%0], [%1], %2;\n" ::"l"(dqSum + tile * 4096),
                       "r"(dqTile), "n"(Smem::kDqBytes)
                       : "memory");
          asm volatile("cp.async.bulk.commit_group;\n" ::: "memory");
        }
      }
    }
  }
  // dK (times the scale) and dV: element 4j + 2r + c of this lane's
  // accumulators is key keys[r], column 8j + 2t + c.
  if (geo.tensorStores) {
    // Into this consumer's [64 keys][D] tiles of dK and dV in the stages'
    // shared memory (free once the last step's products are done;
    // storeSwizzledPair), then one bulk tensor store each. The block's
    // threads leave once the stores have read shared memory, the dQ
    // reductions' too; their writes to global memory complete without them.
    // The tiles overlay both stages' Q and dout, which the other consumer's
    // last products may still read: both consumers meet first (each has
    // waited for all of its own products).
    uint32_t dkTile = base + Smem::kQueries + consumer * tileBytes<D>(64);
    uint32_t dvTile = dkTile + 2 * tileBytes<D>(64);
    asm volatile("bar.sync 1, 256;\n" ::: "memory");
#pragma unroll
    for (int r = 0; r < 2; ++r)
#pragma unroll
      for (int j = 0; j < D / 8; ++j) {
        int rows8 = 16 * warp + 8 * r;
        storeSwizzledPair(dkTile, chunkBytes(64), rows8, g, j, t,
                          dkAcc[4 * j + 2 * r] * geo.scale,
                          dkAcc[4 * j + 2 * r + 1] * geo.scale);
        storeSwizzledPair(dvTile, chunkBytes(64), rows8, g, j, t,
                          dvAcc[4 * j + 2 * r], dvAcc[4 * j + 2 * r + 1]);
      }
    asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
    asm volatile("bar.sync %0, 128;\n" ::"r"(2 + consumer) : "memory");
    if (threadIdx.x % 128 == 0) {
#pragma unroll
      for (int c = 0; c < D / 64; ++c) {
        storeTile(&dkMap, dkTile + c * chunkBytes(64), 64 * c, kvHead,
                  k0 + 64 * consumer, b);
        storeTile(&dvMap, dvTile + c * chunkBytes(64), 64 * c, kvHead,
                  k0 + 64 * consumer, b);
      }
      asm volatile("cp.async.bulk.commit_group;\n" ::: "memory");
      asm volatile("cp.async.bulk.wait_group.read 0;\n" ::: "memory");
    }
    return;
  }
  // The bulk reductions have read shared memory before the block ends.
  if (threadIdx.x % 128 == 0)
    asm volatile("cp.async.bulk.wait_group.read 0;\n" ::: "memory");
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    int key = keys[r];
    if (key >= geo.seqK)
      continue;
    int64_t dkRow = geo.keyAt(geo.dk, b, key, kvHead),
            dvRow = geo.keyAt(geo.dv, b, key, kvHead);
#pragma unroll
    for (int j = 0; j < D / 8; ++j) {
      int col = 8 * j + 2 * t;
      float dk0 = dkAcc[4 * j + 2 * r] * geo.scale,
            dk1 = dkAcc[4 * j + 2 * r + 1] * geo.scale;
      float dv0 = dvAcc[4 * j + 2 * r], dv1 = dvAcc[4 * j + 2 * r + 1];
      if (geo.outputsBf16) {
        if (dk)
          *reinterpret_cast<__nv_bfloat162 *>(
              static_cast<__nv_bfloat16 *>(dk) + dkRow + col) =
              __floats2bfloat162_rn(dk0, dk1);
        if (dv)
          *reinterpret_cast<__nv_bfloat162 *>(
              static_cast<__nv_bfloat16 *>(dv) + dvRow + col) =
              __floats2bfloat162_rn(dv0, dv1);
      } else {
        if (dk)
          *reinterpret_cast<float2 *>(static_cast<float *>(dk) + dkRow + col) =
              make_float2(dk0, dk1);
        if (dv)
          *reinterpret_cast<float2 *>(static_cast<float *>(dv) + dvRow + col) =
              make_float2(dv0, dv1);
      }
    }
  }
}

/// The threads of the backward's side kernels (delta, dq's conversion).
constexpr int kSideThreads = 256;

/// The sum of the products of two octets of bf16 (one 16-byte load each).
__device__ inline float dotOctet(uint4 a, uint4 b) {
  const auto *x = reinterpret_cast<const __nv_bfloat162 *>(&a);
  const auto *y = reinterpret_cast<const __nv_bfloat162 *>(&b);
  float sum = 0.f;
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    float2 u = __bfloat1622float2(x[i]), v = __bfloat1622float2(y[i]);
    sum = fmaf(u.x, v.x, sum);
    sum = fmaf(u.y, v.y, sum);
  }
  return sum;
}

// For one query tile (64 queries) of one (query head, batch):
// delta[row] = dout_row . out_row (the forward's bf16 copy, packed), and the
// tile's D / 64 bulk tiles of dq sums zeroed (rows past seqQ too). A row's
// D / 8 octets go to as many neighbouring lanes (16-byte loads), summed by
// shuffles; the zeros are 16-byte stores. Grid (query tiles, headsQ,
// batch), kSideThreads threads. (One warp a row with 4-byte loads after a
// cudaMemsetAsync of the sums took 97 us at gpt-1.3b's shape on the H200,
// this kernel 74: bench/NOTES.md, session 34.)
template <int D>
__global__ void __launch_bounds__(kSideThreads)
    hopperDeltaKernel(int seqQ, int queryTiles, FlashLayout doutLayout,
                      const __nv_bfloat16 *out, const __nv_bfloat16 *dout,
                      float *delta, float *dqSum) {
  constexpr int kOctets = D / 8; // a row's octets, one a lane
  constexpr int kChunks = kBackwardQueries * kOctets;
  static_assert(kChunks % kSideThreads == 0 && 32 % kOctets == 0,
                "every lane of a warp takes part in each round of shuffles");
  int tile = blockIdx.x, h = blockIdx.y, b = blockIdx.z, headsQ = gridDim.y;
  int q0 = tile * kBackwardQueries;
  int64_t headRow = (static_cast<int64_t>(b) * headsQ + h) * seqQ;
#pragma unroll
  for (int c = threadIdx.x; c < kChunks; c += kSideThreads) {
    int r = c / kOctets, part = c % kOctets, i = q0 + r;
    float sum = 0.f;
    if (i < seqQ) {
      uint4 o = *reinterpret_cast<const uint4 *>(
          out + ((static_cast<int64_t>(b) * seqQ + i) * headsQ + h) * D +
          8 * part);
      uint4 g = *reinterpret_cast<const uint4 *>(
          dout + (static_cast<int64_t>(b) * seqQ + i) * doutLayout.position +
          static_cast<int64_t>(h) * doutLayout.head + 8 * part);
      sum = dotOctet(o, g);
    }
#pragma unroll
    for (int offset = kOctets / 2; offset > 0; offset /= 2)
      sum += __shfl_xor_sync(0xffffffffu, sum, offset);
    if (part == 0 && i < seqQ)
      delta[headRow + i] = sum;
  }
  if (!dqSum)
    return;
  auto *zeros = reinterpret_cast<float4 *>(
      dqSum + ((static_cast<int64_t>(b) * headsQ + h) * queryTiles + tile) *
                  (D / 64) * 4096);
  constexpr int count = kBackwardQueries * D / 4; // float4s
  for (int at = threadIdx.x; at < count; at += kSideThreads)
    zeros[at] = make_float4(0.f, 0.f, 0.f, 0.f);
}

// dq = scale * dqSum into dq's layout and type, from the bulk layout: one
// 64 x 64 tile a block, a thread reading four sums of the fragment order by
// one 16-byte load (rows 16w + g and 16w + g + 8, columns 8j + 2t and
// 8j + 2t + 1 of the bulk layout). With `rowStores` (bf16 dq whose rows
// start at 16-byte boundaries) the pairs go to the tile's rows in shared
// memory and leave as 16-byte stores, a warp four whole 128-byte rows;
// otherwise each thread writes its two pairs (4 bytes of every 16 of a row
// a lane group: half of each 32-byte sector a store). Grid (query tiles x
// D / 64, headsQ, batch), kSideThreads threads. (At gpt-1.3b's shape: two
// elements a thread in dq's order, reading the sums 8 bytes of every 16,
// 115 us on the H200; the pairs 86 (session 34); the rows 52.5 on the
// H200, 71.4 against 113.6 on the H100 (session 35; bench/NOTES.md).)
template <int D>
__global__ void __launch_bounds__(kSideThreads)
    hopperQueryGradientKernel(int seqQ, int queryTiles, FlashLayout dqLayout,
                              float scale, bool outputsBf16, bool rowStores,
                              const float *dqSum, void *dq) {
  int h = blockIdx.y, b = blockIdx.z, headsQ = gridDim.y;
  int queryTile = blockIdx.x / (D / 64), chunk = blockIdx.x % (D / 64);
  int64_t tile =
      ((static_cast<int64_t>(b) * headsQ + h) * queryTiles + queryTile) *
          (D / 64) +
      chunk;
  const auto *sums = reinterpret_cast<const float4 *>(dqSum + tile * 4096);
  if (rowStores) {
    // Row r's 32 bf16 pairs at words 36 r ..: 144-byte rows keep 16-byte
    // alignment, and lane (g, t)'s pair 4j + t of row 16w + g falls in
    // bank 4g + t (+ 4j, the same for the warp): no conflicts.
    __shared__ alignas(16) uint32_t rows[kBackwardQueries][36];
#pragma unroll
    for (int f = threadIdx.x; f < 1024; f += kSideThreads) {
      float4 s = sums[f];
      int w = f / 256, j = f / 32 % 8, g = f % 32 / 4, t = f % 4;
      rows[16 * w + g][4 * j + t] = packBf16(s.x * scale, s.y * scale);
      rows[16 * w + g + 8][4 * j + t] = packBf16(s.z * scale, s.w * scale);
    }
    __syncthreads();
#pragma unroll
    for (int c = threadIdx.x; c < kBackwardQueries * 8; c += kSideThreads) {
      int r = c / 8, part = c % 8, i = queryTile * kBackwardQueries + r;
      if (i >= seqQ)
        continue;
      int64_t to = (static_cast<int64_t>(b) * seqQ + i) * dqLayout.position +
                   static_cast<int64_t>(h) * dqLayout.head + 64 * chunk +
                   8 * part;
      *reinterpret_cast<uint4 *>(static_cast<__nv_bfloat16 *>(dq) + to) =
          *reinterpret_cast<const uint4 *>(&rows[r][4 * part]);
    }
    return;
  }
#pragma unroll
  for (int f = threadIdx.x; f < 1024; f += kSideThreads) {
    float4 s = sums[f];
    int w = f / 256, j = f / 32 % 8, g = f % 32 / 4, t = f % 4;
    int col = 64 * chunk + 8 * j + 2 * t;
#pragma unroll
    for (int high = 0; high < 2; ++high) {
      int i = queryTile * kBackwardQueries + 16 * w + g + 8 * high;
      if (i >= seqQ)
        continue;
      float x = (high ? s.z : s.x) * scale, y = (high ? s.w : s.y) * scale;
      int64_t to = (static_cast<int64_t>(b) * seqQ + i) * dqLayout.position +
                   static_cast<int64_t>(h) * dqLayout.head + col;
      if (outputsBf16)
        *reinterpret_cast<__nv_bfloat162 *>(static_cast<__nv_bfloat16 *>(dq) +
                                            to) = __floats2bfloat162_rn(x, y);
      else
        *reinterpret_cast<float2 *>(static_cast<float *>(dq) + to) =
            make_float2(x, y);
    }
  }
}

//===--------------------------------------------------------------------===//
// Host side
//===--------------------------------------------------------------------===//

using EncodeTiled = CUresult (*)(CUtensorMap *, CUtensorMapDataType,
                                 cuuint32_t, void *, const cuuint64_t *,
                                 const cuuint64_t *, const cuuint32_t *,
                                 const cuuint32_t *, CUtensorMapInterleave,
                                 CUtensorMapSwizzle, CUtensorMapL2promotion,
                                 CUtensorMapFloatOOBfill);

/// The driver's cuTensorMapEncodeTiled, through the runtime's entry point
/// (the runtime links no driver library), or null.
EncodeTiled encodeTiled() {
  static EncodeTiled fn = [] {
    void *entry = nullptr;
    cudaDriverEntryPointQueryResult found{};
    if (cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &entry,
                                         12000, cudaEnableDefault,
                                         &found) != cudaSuccess ||
        found != cudaDriverEntryPointSuccess)
      return static_cast<EncodeTiled>(nullptr);
    return reinterpret_cast<EncodeTiled>(entry);
  }();
  return fn;
}

/// `layout`, or the packed [batch, positions, heads, headDim] one.
FlashLayout resolve(FlashLayout layout, int64_t heads, int64_t headDim) {
  if (layout.position == 0 && layout.head == 0)
    return {heads * headDim, headDim};
  return layout;
}

/// The tensor map of a bf16 tensor [batch][positions] of rows `layout`
/// apart, `heads` heads of D columns: dimensions (D, heads, positions,
/// batch), boxes of 64 columns x `rows` positions, 128-byte swizzling,
/// rows past the end read as zeros.
CUtensorMap tensorMap(const void *data, FlashLayout layout, int64_t heads,
                      int64_t positions, int64_t batch, int64_t d, int rows) {
  CUtensorMap map;
  std::memset(&map, 0, sizeof(map));
  cuuint64_t dims[4] = {static_cast<cuuint64_t>(d),
                        static_cast<cuuint64_t>(heads),
                        static_cast<cuuint64_t>(positions),
                        static_cast<cuuint64_t>(batch)};
  cuuint64_t strides[3] = {
      static_cast<cuuint64_t>(layout.head) * 2,
      static_cast<cuuint64_t>(layout.position) * 2,
      static_cast<cuuint64_t>(layout.position * positions) * 2};
  cuuint32_t box[4] = {64, 1, static_cast<cuuint32_t>(rows), 1};
  cuuint32_t elementStrides[4] = {1, 1, 1, 1};
  CUresult result = encodeTiled()(
      &map, CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, 4, const_cast<void *>(data),
      dims, strides, box, elementStrides, CU_TENSOR_MAP_INTERLEAVE_NONE,
      CU_TENSOR_MAP_SWIZZLE_128B, CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
      CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
  if (result != CUDA_SUCCESS)
    throw Error(MTRT_STATUS_INTERNAL,
                "the Hopper attention kernels: cuTensorMapEncodeTiled failed (" +
                    std::to_string(static_cast<int>(result)) + ")");
  return map;
}

template <int D, bool Dropout>
void launch(cudaStream_t stream, const AttentionParams &p,
            const FlashTensors &io, const HopperGeometry &geo,
            __nv_bfloat16 *outCopy, float *logsumexp, const uint64_t *mask) {
  using Shape = HopperShape<D>;
  CUtensorMap qMap = tensorMap(io.q, resolve(io.qLayout, p.headsQ, D),
                               p.headsQ, p.seqQ, p.batch, D, Shape::kBlockM);
  CUtensorMap kMap = tensorMap(io.k, resolve(io.kLayout, p.headsKv, D),
                               p.headsKv, p.seqK, p.batch, D, kBlockN);
  CUtensorMap vMap = tensorMap(io.v, resolve(io.vLayout, p.headsKv, D),
                               p.headsKv, p.seqK, p.batch, D, kBlockN);
  // Boxes of 64 rows: a consumer's half of the block.
  CUtensorMap outMap{}, copyMap{};
  if (geo.tensorStores && io.out)
    outMap = tensorMap(io.out, geo.out, p.headsQ, p.seqQ, p.batch, D, 64);
  if (geo.tensorStores && outCopy)
    copyMap = tensorMap(outCopy, geo.saved, p.headsQ, p.seqQ, p.batch, D, 64);
  auto kernel = hopperForwardKernel<D, Dropout>;
  constexpr size_t bytes = sharedBytes<D>();
  cudaError_t status =
      cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                           static_cast<int>(bytes));
  if (status != cudaSuccess)
    throw Error(MTRT_STATUS_INTERNAL,
                std::string("hopperAttentionForward: cudaFuncSetAttribute (") +
                    std::to_string(bytes) +
                    " bytes of shared memory): " + cudaGetErrorString(status));
  dim3 grid(static_cast<unsigned>((p.seqQ + Shape::kBlockM - 1) /
                                   Shape::kBlockM),
            static_cast<unsigned>(p.headsQ), static_cast<unsigned>(p.batch));
  kernel<<<grid, Shape::kThreads, bytes, stream>>>(
      qMap, kMap, vMap, outMap, copyMap, geo, io.out, outCopy, logsumexp, mask);
}

/// Whether the current device is of compute capability 9.0 (what sm_90a
/// code runs on), else why not.
std::string deviceReason() {
  int device = 0, major = 0, minor = 0;
  if (cudaGetDevice(&device) != cudaSuccess ||
      cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor,
                             device) != cudaSuccess ||
      cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor,
                             device) != cudaSuccess) {
    cudaGetLastError();
    return "the Hopper attention kernel found no CUDA device";
  }
  if (major != 9 || minor != 0)
    return "the Hopper attention kernel is built for sm_90a (compute "
           "capability 9.0), the device is " +
           std::to_string(major) + "." + std::to_string(minor);
  return std::string();
}

bool aligned16(const void *p) {
  return reinterpret_cast<uintptr_t>(p) % 16 == 0;
}

/// Whether the rows of `layout` over `data` start at 16-byte boundaries
/// (bf16), as tensor maps need.
bool rowsAligned(const FlashLayout &layout, const void *data) {
  return layout.position % 8 == 0 && layout.head % 8 == 0 && aligned16(data);
}

template <int D, bool Dropout, bool LateDq>
void launchBackward(cudaStream_t stream, const AttentionParams &p,
                    const FlashTensors &io, const HopperBackwardGeometry &geo,
                    const float *logsumexp, const float *delta,
                    const uint64_t *mask, float *dqSum) {
  CUtensorMap qMap =
      tensorMap(io.q, resolve(io.qLayout, p.headsQ, D), p.headsQ, p.seqQ,
                p.batch, D, kBackwardQueries);
  CUtensorMap doutMap =
      tensorMap(io.dout, resolve(io.doutLayout, p.headsQ, D), p.headsQ,
                p.seqQ, p.batch, D, kBackwardQueries);
  CUtensorMap kMap = tensorMap(io.k, resolve(io.kLayout, p.headsKv, D),
                               p.headsKv, p.seqK, p.batch, D, kBackwardKeys);
  CUtensorMap vMap = tensorMap(io.v, resolve(io.vLayout, p.headsKv, D),
                               p.headsKv, p.seqK, p.batch, D, kBackwardKeys);
  // Boxes of 64 keys: a consumer's half of the block.
  CUtensorMap dkMap{}, dvMap{};
  if (geo.tensorStores) {
    dkMap = tensorMap(io.dk, geo.dk, p.headsKv, p.seqK, p.batch, D, 64);
    dvMap = tensorMap(io.dv, geo.dv, p.headsKv, p.seqK, p.batch, D, 64);
  }
  auto kernel = hopperBackwardKernel<D, Dropout, LateDq>;
  constexpr size_t bytes = BackwardSmem<D>::kTotal;
  cudaError_t status = cudaFuncSetAttribute(
      kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
      static_cast<int>(bytes));
  if (status != cudaSuccess)
    throw Error(MTRT_STATUS_INTERNAL,
                std::string("hopperAttentionBackward: cudaFuncSetAttribute (") +
                    std::to_string(bytes) + " bytes of shared memory): " +
                    cudaGetErrorString(status));
  dim3 grid(static_cast<unsigned>((p.seqK + kBackwardKeys - 1) /
                                   kBackwardKeys),
            static_cast<unsigned>(p.headsKv), static_cast<unsigned>(p.batch));
  kernel<<<grid, kBackwardThreads, bytes, stream>>>(
      qMap, kMap, vMap, doutMap, dkMap, dvMap, geo, logsumexp, delta, mask,
      dqSum, io.dk, io.dv);
}

/// MTRT_CUDA_HOPPER_TIMING=1: the backward's three kernels (delta with the
/// zeroing of dq's sums, the main kernel, dq's conversion) timed by
/// events outside stream capture, the means of every 48 calls printed to
/// stderr; a diagnostic, to compare the kernels in a step with the same
/// kernels in mtrt-attention-bench. Calls read their events only once the
/// GPU has passed them (cudaEventQuery), so the stream is never waited on.
/// One timer a process: for processes that drive one GPU.
class BackwardTimer {
public:
  static BackwardTimer *get(cudaStream_t stream) {
    static const bool asked = [] {
      const char *timing = std::getenv("MTRT_CUDA_HOPPER_TIMING");
      return timing && std::strcmp(timing, "1") == 0;
    }();
    if (!asked)
      return nullptr;
    cudaStreamCaptureStatus capture = cudaStreamCaptureStatusNone;
    if (cudaStreamIsCapturing(stream, &capture) != cudaSuccess ||
        capture != cudaStreamCaptureStatusNone)
      return nullptr;
    static BackwardTimer timer;
    return &timer;
  }

  /// Records mark `part` (0 before the delta kernel, 1-3 after each kernel)
  /// of the current call.
  void mark(cudaStream_t stream, int part) {
    std::lock_guard<std::mutex> lock(mutex_);
    if (part == 0) {
      harvest();
      pending_.emplace_back();
      for (cudaEvent_t &event : pending_.back())
        if (cudaEventCreate(&event) != cudaSuccess)
          event = nullptr;
    }
    if (!pending_.empty() && pending_.back()[part])
      cudaEventRecord(pending_.back()[part], stream);
  }

private:
  using Marks = std::array<cudaEvent_t, 4>;

  void harvest() {
    // (A call whose last event could not be made is dropped untimed.)
    while (!pending_.empty() &&
           (!pending_.front()[3] ||
            cudaEventQuery(pending_.front()[3]) == cudaSuccess)) {
      Marks &marks = pending_.front();
      for (int part = 0; part < 3; ++part) {
        float ms = 0;
        if (marks[part] && marks[part + 1] &&
            cudaEventElapsedTime(&ms, marks[part], marks[part + 1]) ==
                cudaSuccess)
          sums_[part] += ms;
      }
      for (cudaEvent_t event : marks)
        if (event)
          cudaEventDestroy(event);
      pending_.pop_front();
      if (++calls_ == kReport) {
        std::fprintf(stderr,
                     "hopper backward, mean of %d calls (us): delta and "
                     "zeroing %.1f, main %.1f, dq %.1f\n",
                     kReport, 1000 * sums_[0] / kReport,
                     1000 * sums_[1] / kReport, 1000 * sums_[2] / kReport);
        sums_ = {};
        calls_ = 0;
      }
    }
  }

  static constexpr int kReport = 48;
  std::mutex mutex_;
  std::deque<Marks> pending_;
  std::array<double, 3> sums_{};
  int calls_ = 0;
};

} // namespace

std::string hopperAttentionUnsupportedReason(const AttentionParams &p,
                                             const FlashTensors &io) {
  std::string reason = flashAttentionUnsupportedReason(p);
  if (!reason.empty())
    return reason;
  if (p.headDim != 64 && p.headDim != 128)
    return "the Hopper attention kernel takes head dimensions 64 and 128, "
           "found " +
           std::to_string(p.headDim);
  if (!io.inputsBf16)
    return "the Hopper attention kernel takes bf16 q, k and v (fp32 given)";
  const FlashLayout layouts[3] = {resolve(io.qLayout, p.headsQ, p.headDim),
                                  resolve(io.kLayout, p.headsKv, p.headDim),
                                  resolve(io.vLayout, p.headsKv, p.headDim)};
  const void *data[3] = {io.q, io.k, io.v};
  const char *names[3] = {"q", "k", "v"};
  for (int i = 0; i < 3; ++i)
    if (layouts[i].position % 8 || layouts[i].head % 8 || !aligned16(data[i]))
      return std::string("the Hopper attention kernel copies tiles by TMA, "
                         "which needs 16-byte aligned rows: ") +
             names[i] + "'s data or strides (position " +
             std::to_string(layouts[i].position) + ", head " +
             std::to_string(layouts[i].head) +
             " elements) are not multiples of 8 elements";
  if (!encodeTiled())
    return "the Hopper attention kernel found no cuTensorMapEncodeTiled in "
           "the CUDA driver";
  static std::once_flag once;
  static std::string device;
  std::call_once(once, [] { device = deviceReason(); });
  return device;
}

void hopperAttentionForward(cudaStream_t stream, const AttentionParams &p,
                            const FlashTensors &io, __nv_bfloat16 *outCopy,
                            float *logsumexp, uint64_t *mask) {
  if (p.batch <= 0 || p.seqQ <= 0 || p.headsQ <= 0 || p.seqK <= 0)
    return;
  std::string reason = hopperAttentionUnsupportedReason(p, io);
  if (!reason.empty())
    throw Error(MTRT_STATUS_INTERNAL, "hopperAttentionForward: " + reason);
  bool dropout = p.dropoutP > 0;
  if (dropout) {
    if (!mask)
      throw Error(MTRT_STATUS_INTERNAL,
                  "hopperAttentionForward: dropout needs a mask of "
                  "flashAttentionMaskBytes");
    flashAttentionDropoutMask(stream, p, mask);
  }
  HopperGeometry geo{};
  geo.seqQ = static_cast<int>(p.seqQ);
  geo.seqK = static_cast<int>(p.seqK);
  geo.headsQ = static_cast<int>(p.headsQ);
  geo.group = static_cast<int>(p.headsQ / p.headsKv);
  geo.keyBlocks =
      static_cast<int>((p.seqK + kMaskWordKeys - 1) / kMaskWordKeys);
  geo.out = resolve(io.outLayout, p.headsQ, p.headDim);
  geo.saved = resolve(FlashLayout(), p.headsQ, p.headDim);
  geo.causal = p.causal;
  geo.outputsBf16 = io.outputsBf16;
  // out and its copy by tensor stores where they can: 0.581 -> 0.532 ms at
  // gpt-1.3b's shape with dropout 0.1, 0.570 -> 0.525 at gpt2-350m's (H100,
  // bench/NOTES.md, session 36).
  geo.tensorStores =
      (io.out || outCopy) &&
      (!io.out || (io.outputsBf16 && rowsAligned(geo.out, io.out))) &&
      (!outCopy || aligned16(outCopy));
  double scale =
      p.scale > 0 ? p.scale : 1.0 / std::sqrt(static_cast<double>(p.headDim));
  geo.scaleLog2 = static_cast<float>(scale * 1.4426950408889634);
  // As the own forward: 1 / (1 - p) for the kept probabilities, none kept
  // at p >= 1.
  geo.keptScale =
      !dropout ? 1.f
      : random::dropoutThreshold16(p.dropoutP) > 0xFFFFu
          ? 0.f
          : static_cast<float>(1.0 / (1.0 - p.dropoutP));
  const char *overlap = std::getenv("MTRT_CUDA_HOPPER_OVERLAP");
  geo.overlap = !(overlap && std::strcmp(overlap, "0") == 0);
  const char *pingpong = std::getenv("MTRT_CUDA_HOPPER_PINGPONG");
  geo.pingpong = !(pingpong && std::strcmp(pingpong, "0") == 0);
  auto run = [&](auto d) {
    constexpr int D = decltype(d)::value;
    if (dropout)
      launch<D, true>(stream, p, io, geo, outCopy, logsumexp, mask);
    else
      launch<D, false>(stream, p, io, geo, outCopy, logsumexp, mask);
  };
  if (p.headDim == 128)
    run(std::integral_constant<int, 128>());
  else
    run(std::integral_constant<int, 64>());
}

std::string hopperAttentionBackwardUnsupportedReason(
    const AttentionParams &p, const FlashTensors &io) {
  if (io.deterministic)
    return "the Hopper backward adds dq by fp32 reductions in a varying "
           "order; the deterministic backward runs the own kernels";
  std::string reason = hopperAttentionUnsupportedReason(p, io);
  if (!reason.empty())
    return reason;
  FlashLayout dout = resolve(io.doutLayout, p.headsQ, p.headDim);
  if (dout.position % 8 || dout.head % 8 || !aligned16(io.dout))
    return "the Hopper attention kernel copies tiles by TMA, which needs "
           "16-byte aligned rows: dout's data or strides (position " +
           std::to_string(dout.position) + ", head " +
           std::to_string(dout.head) +
           " elements) are not multiples of 8 elements";
  return std::string();
}

void hopperAttentionBackward(cudaStream_t stream, const AttentionParams &p,
                             const FlashTensors &io, const __nv_bfloat16 *out,
                             const float *logsumexp, const uint64_t *mask,
                             void *scratch) {
  if (p.batch <= 0 || p.seqQ <= 0 || p.headsQ <= 0 || p.seqK <= 0)
    return;
  std::string reason = hopperAttentionBackwardUnsupportedReason(p, io);
  if (!reason.empty())
    throw Error(MTRT_STATUS_INTERNAL, "hopperAttentionBackward: " + reason);
  bool dropout = p.dropoutP > 0;
  if (dropout && !mask)
    throw Error(MTRT_STATUS_INTERNAL,
                "hopperAttentionBackward: dropout needs the forward's mask "
                "(of flashAttentionMaskBytes)");
  auto *delta = static_cast<float *>(scratch);
  float *dqSum =
      io.dq ? reinterpret_cast<float *>(
                  static_cast<char *>(scratch) +
                  scratch::flashAttentionDeltaBytes(
                      scratch::attentionShapeOf(p)))
            : nullptr;
  HopperBackwardGeometry geo{};
  geo.seqQ = static_cast<int>(p.seqQ);
  geo.seqK = static_cast<int>(p.seqK);
  geo.headsQ = static_cast<int>(p.headsQ);
  geo.group = static_cast<int>(p.headsQ / p.headsKv);
  geo.keyBlocks =
      static_cast<int>((p.seqK + kMaskWordKeys - 1) / kMaskWordKeys);
  geo.queryTiles =
      static_cast<int>((p.seqQ + kBackwardQueries - 1) / kBackwardQueries);
  // Where one group of all pairs would run fewer than two blocks of a pair
  // at a time (more pairs than half the multiprocessors), groups of the
  // pairs whose key blocks fill the multiprocessors once; else one group,
  // the longest walks of every pair first. On the H200 (bench/NOTES.md,
  // session 20; dropout 0.1, ms) the groups took the backward from 4.50 to
  // 3.81 at 4 x 32 heads x 4096, 1.31 to 1.20 at 8 x 16 x 2048 and 0.79 to
  // 0.78 at 32 x 12 x 1024 (a pair's key blocks had run a wave apart, its
  // Q, dout and dq sums leaving L2 between them), but from 3.39 to 3.52 at
  // 2 x 16 x 8192, where one group already ran four blocks of a pair
  // together and the longest walks of the last group ran last. Where a
  // pair has 16 key blocks or fewer, a group holds 16 pairs at least: in
  // gpt-1.3b's step (8 x 16 x 2048, 16 key blocks a pair) 16 pairs took
  // the backward from 37.0-38.4 to 34.9 ms a step on the H100 (8: 36.4,
  // 12: 37.1, 24: 36.7, 32: 35.6; session 31), where filling the
  // multiprocessors once gave 9; at 1024 (8 key blocks) once is 17 pairs
  // already, and 4096 (32 key blocks) keeps the 5 measured above.
  int pairs = static_cast<int>(p.batch * p.headsKv);
  int keyBlocks =
      static_cast<int>((p.seqK + kBackwardKeys - 1) / kBackwardKeys);
  int device = 0, processors = 0;
  cudaError_t found = cudaGetDevice(&device);
  if (found == cudaSuccess)
    found = cudaDeviceGetAttribute(&processors, cudaDevAttrMultiProcessorCount,
                                   device);
  if (found != cudaSuccess)
    throw Error(MTRT_STATUS_INTERNAL,
                std::string("hopperAttentionBackward: the device's "
                            "multiprocessor count: ") +
                    cudaGetErrorString(found));
  constexpr int kMinPairGroup = 16, kMinPairGroupKeyBlocks = 16;
  int fill = (processors + keyBlocks - 1) / keyBlocks;
  if (keyBlocks <= kMinPairGroupKeyBlocks)
    fill = std::max(fill, kMinPairGroup);
  geo.pairGroup = 2 * pairs > processors ? fill : pairs;
  if (const char *group = std::getenv("MTRT_CUDA_HOPPER_PAIR_GROUP"))
    geo.pairGroup = std::atoi(group);
  if (geo.pairGroup <= 0 || geo.pairGroup > pairs)
    geo.pairGroup = pairs;
  geo.dk = resolve(io.dkLayout, p.headsKv, p.headDim);
  geo.dv = resolve(io.dvLayout, p.headsKv, p.headDim);
  geo.causal = p.causal;
  geo.outputsBf16 = io.outputsBf16;
  // dK and dV by tensor stores where they can: the main kernel 918 -> 864
  // us at gpt-1.3b's shape with dropout 0.1, 767 -> 717 at gpt2-350m's
  // (H100; the blocks' plain stores had their warps wait at the end for
  // every write: bench/NOTES.md, session 36). In the steps (dropout 0.1,
  // interleaved runs): gpt-1.3b 272.2 -> 268.3 ms, gpt2-350m 169.3 ->
  // 167.9, llama-1.5b 138.2 -> 137.6.
  geo.tensorStores = io.outputsBf16 && io.dk && io.dv &&
                     rowsAligned(geo.dk, io.dk) && rowsAligned(geo.dv, io.dv);
  double scale =
      p.scale > 0 ? p.scale : 1.0 / std::sqrt(static_cast<double>(p.headDim));
  geo.scale = static_cast<float>(scale);
  geo.scaleLog2 = static_cast<float>(scale * 1.4426950408889634);
  // P' = P / (1 - p) in the consumers (HopperBackwardGeometry), in place
  // of a word of keep bits tested twice: 176 and 152 fewer SASS
  // instructions at head dimensions 128 and 64, the main kernel 980 -> 913
  // us at gpt-1.3b's shape with dropout 0.1, 821 -> 767 at gpt2-350m's
  // (H100, bench/NOTES.md, session 36). None kept (as the forward's
  // keptScale): every P' dropped, P itself.
  bool anyKept = dropout && random::dropoutThreshold16(p.dropoutP) <= 0xFFFFu;
  geo.dropoutScaleLog2 =
      static_cast<float>(anyKept ? -std::log2(1.0 - p.dropoutP) : 0.0);
  geo.keptFraction = static_cast<float>(anyKept ? 1.0 - p.dropoutP : 1.0);
  FlashLayout doutLayout = resolve(io.doutLayout, p.headsQ, p.headDim);
  FlashLayout dqLayout = resolve(io.dqLayout, p.headsQ, p.headDim);
  const auto *dout = static_cast<const __nv_bfloat16 *>(io.dout);
  BackwardTimer *timer = BackwardTimer::get(stream);
  auto mark = [&](int part) {
    if (timer)
      timer->mark(stream, part);
  };
  auto run = [&](auto d) {
    constexpr int D = decltype(d)::value;
    dim3 tiles(static_cast<unsigned>(geo.queryTiles),
               static_cast<unsigned>(p.headsQ), static_cast<unsigned>(p.batch));
    mark(0);
    hopperDeltaKernel<D><<<tiles, kSideThreads, 0, stream>>>(
        geo.seqQ, geo.queryTiles, doutLayout, out, dout, delta, dqSum);
    mark(1);
    // dQ's product a step late at head dimension 64 (on the H200 the
    // backward took 0.853 -> 0.781 ms at gpt2-124m's shape with dropout 0.1,
    // 1.133 -> 1.036 at gpt2-350m's, 0.734 -> 0.623 and 0.978 -> 0.825
    // without); in its step at 128, where the late one made the main kernel
    // 5% slower (998 -> 1048 us at gpt-1.3b's; bench/NOTES.md, session 34).
    constexpr bool kLateDq = D == 64;
    if (dropout)
      launchBackward<D, true, kLateDq>(stream, p, io, geo, logsumexp, delta,
                                       mask, dqSum);
    else
      launchBackward<D, false, kLateDq>(stream, p, io, geo, logsumexp, delta,
                                        mask, dqSum);
    mark(2);
    if (dqSum) {
      dim3 chunks(static_cast<unsigned>(geo.queryTiles * (D / 64)),
                  static_cast<unsigned>(p.headsQ),
                  static_cast<unsigned>(p.batch));
      bool rowStores = io.outputsBf16 && dqLayout.position % 8 == 0 &&
                       dqLayout.head % 8 == 0 && aligned16(io.dq);
      hopperQueryGradientKernel<D><<<chunks, kSideThreads, 0, stream>>>(
          geo.seqQ, geo.queryTiles, dqLayout, geo.scale, io.outputsBf16,
          rowStores, dqSum, io.dq);
    }
    mark(3);
  };
  if (p.headDim == 128)
    run(std::integral_constant<int, 128>());
  else
    run(std::integral_constant<int, 64>());
  cudaError_t status = cudaGetLastError();
  if (status != cudaSuccess)
    throw Error(MTRT_STATUS_INTERNAL,
                std::string("hopperAttentionBackward: a launch failed: ") +
                    cudaGetErrorString(status));
}

} // namespace mtrt::cuda
