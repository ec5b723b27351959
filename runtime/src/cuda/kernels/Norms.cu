// Layer norm and RMS norm, forward and backward, and bias gradients.
//
// The norms keep a row in registers: a block of up to kMaxNormThreads
// threads covers a row, each thread a fixed set of columns (vectors of 4
// when the row and pointers allow), and one block reduction per row gives
// the row sums in double (sum of x, of x squared, and in the backward of g
// and g * x, g = dy * weight), from which one thread computes the
// statistics (as the host's formulas do) for the whole block; dx follows.
// The backward's blocks (one wave: as many as the device runs at once, at
// most one per 8 rows and 1024) each take an equal share of the rows and
// add up their columns' dweight and dbias terms in registers; a second
// kernel sums the blocks' partials in double, in a fixed order (the same
// bits on every run on one device).
// Rows of 16-byte aligned vectors up to 4096 elements, small enough for
// kNormStages copies in 96 KiB of shared memory (a backward's x and dy in
// fp32: hidden 2048), are staged: each block keeps its parameters and works
// through a share of the rows, copying the next rows into shared memory
// (cp.async) while it reduces the current one, with 8 or 16 elements a
// thread; others go through the registers' kernels, a row per block at a
// time.
// bf16 rows of a multiple of 256 elements up to 2048 (the models' hidden
// sizes), 16-byte aligned and without FP8 outputs, take neither: a warp
// owns each row there (normForwardWarpKernel, normBackwardWarpKernel; the
// backward's column sums in shared memory).
// Activations are read and written as float or bf16 (NormRows); the math is
// float, the sums double. Compiled without FMA contraction (CMakeLists.txt),
// so each float product and sum rounds like the host's.
#include "core/OpScratch.h"
#include "cuda/kernels/KernelSupport.cuh"
#include "cuda/kernels/NormFp8.h"

#include <cuda_fp8.h>

#include <map>
#include <set>
#include <tuple>
#include <type_traits>

namespace mtrt::cuda {

namespace {

using detail::blockSum;

//===----------------------------------------------------------------------===//
// The norms
//===----------------------------------------------------------------------===//

/// Threads of a norm block, at most; a row has at most 32 elements per
/// thread (kMaxNormHidden).
constexpr int kMaxNormThreads = 512;
constexpr int kMaxNormWarps = kMaxNormThreads / detail::kWarp;

static_assert(kMaxNormHidden == int64_t(kMaxNormThreads) * 32,
              "kMaxNormHidden is 32 elements per thread");

/// The backward's blocks (core/OpScratch.h: each writes one row of partial
/// sums per parameter gradient).
int64_t normBackwardBlocks(int64_t rows) {
  return mtrt::scratch::normBackwardBlocks(rows);
}

/// out = the kVec elements of `rows` from element `at` (zeros when not
/// `valid`).
template <int kVec>
__device__ inline void loadVector(NormRows rows, int64_t at, bool valid,
                                  float (&out)[kVec]) {
  if (!valid) {
#pragma unroll
    for (int e = 0; e < kVec; ++e)
      out[e] = 0.0f;
    return;
  }
  if (rows.bf16) {
    const auto *p = static_cast<const __nv_bfloat16 *>(rows.data) + at;
    if constexpr (kVec == 4) {
      uint2 raw = *reinterpret_cast<const uint2 *>(p);
      out[0] = __uint_as_float(raw.x << 16);
      out[1] = __uint_as_float(raw.x & 0xffff0000u);
      out[2] = __uint_as_float(raw.y << 16);
      out[3] = __uint_as_float(raw.y & 0xffff0000u);
    } else {
      out[0] = __bfloat162float(*p);
    }
  } else {
    const auto *p = static_cast<const float *>(rows.data) + at;
    if constexpr (kVec == 4) {
      float4 v = *reinterpret_cast<const float4 *>(p);
      out[0] = v.x;
      out[1] = v.y;
      out[2] = v.z;
      out[3] = v.w;
    } else {
      out[0] = *p;
    }
  }
}

/// A parameter's kVec floats from element `at` (zeros when not `valid`).
template <int kVec>
__device__ inline void loadParameter(const float *data, int64_t at, bool valid,
                                     float (&out)[kVec]) {
  loadVector<kVec>(NormRows{data, false}, at, valid, out);
}

/// Stores kVec elements at element `at` of `rows`, rounded to bf16 (to
/// nearest even) when the rows are bf16.
template <int kVec>
__device__ inline void storeVector(NormRowsOut rows, int64_t at,
                                   const float (&in)[kVec]) {
  if (rows.bf16) {
    auto *p = static_cast<__nv_bfloat16 *>(rows.data) + at;
    if constexpr (kVec == 4) {
      __nv_bfloat162 lo = __floats2bfloat162_rn(in[0], in[1]);
      __nv_bfloat162 hi = __floats2bfloat162_rn(in[2], in[3]);
      uint2 raw;
      raw.x = *reinterpret_cast<const uint32_t *>(&lo);
      raw.y = *reinterpret_cast<const uint32_t *>(&hi);
      *reinterpret_cast<uint2 *>(p) = raw;
    } else {
      *p = __float2bfloat16_rn(in[0]);
    }
  } else {
    auto *p = static_cast<float *>(rows.data) + at;
    if constexpr (kVec == 4)
      *reinterpret_cast<float4 *>(p) = make_float4(in[0], in[1], in[2], in[3]);
    else
      *p = in[0];
  }
}

/// The FP8 codes of kVec outputs at element `at`, as castToFp8 makes them
/// from the stored outputs (Precision.cu): each rounded to bf16 first when
/// the result is held in bf16, |value| into `largest` (as bits), the code
/// of value * scale saturated.
template <int kVec>
__device__ inline void storeCodes(bool bf16, NormFp8Out fp8, int64_t at,
                                  const float (&in)[kVec], unsigned &largest) {
  const float factor = *fp8.scale;
  const __nv_fp8_interpretation_t kind =
      fp8.format == fp8::Format::E4M3 ? __NV_E4M3 : __NV_E5M2;
  unsigned packed = 0;
#pragma unroll
  for (int e = 0; e < kVec; ++e) {
    float value = bf16 ? __bfloat162float(__float2bfloat16_rn(in[e])) : in[e];
    largest = max(largest, __float_as_uint(fabsf(value)));
    packed |=
        unsigned(__nv_cvt_float_to_fp8(value * factor, __NV_SATFINITE, kind))
        << (8 * e);
  }
  if constexpr (kVec == 4)
    *reinterpret_cast<unsigned *>(fp8.codes + at) = packed;
  else
    fp8.codes[at] = static_cast<uint8_t>(packed);
}

/// The block's largest |output| into *fp8.amax by one atomicMax, when the
/// outputs are FP8 codes. Every thread of the block calls it.
__device__ inline void recordNormAmax(NormFp8Out fp8, unsigned largest) {
  if (!fp8.codes)
    return;
  __shared__ unsigned warps[kMaxNormWarps];
  largest = detail::blockMax(largest, warps);
  if (threadIdx.x == 0)
    atomicMax(reinterpret_cast<unsigned *>(fp8.amax), largest);
}

/// The lane's value index in warpSumScattered: lane bits 4 and 3 for four
/// values, bit 4 for two.
template <int kN> __device__ inline int scatteredIndex(int lane) {
  if constexpr (kN == 4)
    return ((lane >> 4) & 1) * 2 + ((lane >> 3) & 1);
  else if constexpr (kN == 2)
    return (lane >> 4) & 1;
  else
    return 0;
}

/// The warp's sum of s[scatteredIndex<kN>(lane)] (kN 1, 2 or 4), in a fixed
/// order: a butterfly whose first levels halve the values each lane carries
/// (each lane keeps half and adds its partner's half of the other), then a
/// tree on the one left; 6 double shuffles for four values where a tree
/// per value takes 20. Lanes with the same index get the same bits.
template <int kN>
__device__ inline double warpSumScattered(const double (&s)[kN]) {
  constexpr unsigned kAll = 0xffffffffu;
  int lane = threadIdx.x % detail::kWarp;
  double v;
  int offset = detail::kWarp / 2;
  if constexpr (kN == 4) {
    bool high = lane & 16;
    double t0 = (high ? s[2] : s[0]) +
                __shfl_xor_sync(kAll, high ? s[0] : s[2], 16);
    double t1 = (high ? s[3] : s[1]) +
                __shfl_xor_sync(kAll, high ? s[1] : s[3], 16);
    bool odd = lane & 8;
    v = (odd ? t1 : t0) + __shfl_xor_sync(kAll, odd ? t0 : t1, 8);
    offset = 4;
  } else if constexpr (kN == 2) {
    bool high = lane & 16;
    v = (high ? s[1] : s[0]) + __shfl_xor_sync(kAll, high ? s[0] : s[1], 16);
    offset = 8;
  } else {
    v = s[0];
  }
  for (; offset > 0; offset /= 2)
    v += __shfl_xor_sync(kAll, v, offset);
  return v;
}

/// A row's statistics from its per-thread sums: each of sums[0..kN) summed
/// over the block in a fixed order (warpSumScattered, then the warps in
/// turn), `finish` of the totals computed once (thread 0: the statistics'
/// double divisions and square root once a row, not once a thread) and
/// returned to every thread. `shared` holds kMaxNormWarps * kN doubles;
/// two barriers a call keep each call's writes after the previous call's
/// reads.
template <int kN, typename Statistics, typename Finish>
__device__ inline Statistics blockStatistics(const double (&sums)[kN],
                                             double *shared,
                                             Statistics *result,
                                             Finish finish) {
  int lane = threadIdx.x % detail::kWarp, warp = threadIdx.x / detail::kWarp;
  int warps = blockDim.x / detail::kWarp;
  double v = warpSumScattered<kN>(sums);
  if ((lane & (detail::kWarp / kN - 1)) == 0)
    shared[warp * kN + scatteredIndex<kN>(lane)] = v;
  __syncthreads();
  if (threadIdx.x == 0) {
    double totals[kN] = {};
    for (int w = 0; w < warps; ++w) {
#pragma unroll
      for (int i = 0; i < kN; ++i)
        totals[i] += shared[w * kN + i];
    }
    *result = finish(totals);
  }
  __syncthreads();
  return *result;
}

/// The statistics of a row from its sums, as the host rounds them: mean
/// (0 for RMS norm) and rstd in float.
struct RowStatistics {
  float mean, rstd;
};

__device__ inline RowStatistics layerStatistics(double sum, double squares,
                                                int64_t hidden, double eps) {
  double n = static_cast<double>(hidden);
  double mu = sum / n;
  double variance = fmax(squares / n - mu * mu, 0.0);
  return {static_cast<float>(mu),
          static_cast<float>(1.0 / sqrt(variance + eps))};
}

__device__ inline RowStatistics rmsStatistics(double squares, int64_t hidden,
                                              double eps) {
  double meanSquare = squares / static_cast<double>(hidden);
  return {0.0f, static_cast<float>(1.0 / sqrt(meanSquare + eps))};
}

//===----------------------------------------------------------------------===//
// One row: its sums, statistics and outputs, shared by the kernels that
// hold rows in registers and those that stage them in shared memory
//===----------------------------------------------------------------------===//

/// Thread t owns vectors t, t + blockDim.x, ... (kItems of them) of kVec
/// elements of a row; vector k's index.
__device__ inline int64_t ownedVector(int k) {
  return threadIdx.x + static_cast<int64_t>(k) * blockDim.x;
}

/// This thread's vectors of row r of `rows` (zeros past the row's end).
template <int kVec, int kItems>
__device__ inline void loadRow(NormRows rows, int64_t r, int64_t vectors,
                               float (&out)[kItems][kVec]) {
#pragma unroll
  for (int k = 0; k < kItems; ++k) {
    int64_t v = ownedVector(k);
    loadVector<kVec>(rows, (r * vectors + v) * kVec, v < vectors, out[k]);
  }
}

/// This thread's parameters (zeros past the row's end or without `data`).
template <int kVec, int kItems>
__device__ inline void loadParameters(const float *data, int64_t vectors,
                                      float (&out)[kItems][kVec]) {
#pragma unroll
  for (int k = 0; k < kItems; ++k) {
    int64_t v = ownedVector(k);
    loadParameter<kVec>(data, v * kVec, data && v < vectors, out[k]);
  }
}

/// The forward's sums of this thread's elements: for layer norm sum x and
/// sum x^2, for RMS norm sum x^2.
template <bool kLayer> constexpr int forwardSums() { return kLayer ? 2 : 1; }

/// One element's terms of the forward's sums.
template <bool kLayer>
__device__ inline void addForwardTerms(float x,
                                       double (&sums)[forwardSums<kLayer>()]) {
  double value = x;
  sums[forwardSums<kLayer>() - 1] += value * value;
  if constexpr (kLayer)
    sums[0] += value;
}

template <int kVec, int kItems, bool kLayer>
__device__ inline void forwardRowSums(const float (&xv)[kItems][kVec],
                                      double (&sums)[forwardSums<kLayer>()]) {
#pragma unroll
  for (int i = 0; i < forwardSums<kLayer>(); ++i)
    sums[i] = 0;
#pragma unroll
  for (int k = 0; k < kItems; ++k)
#pragma unroll
    for (int e = 0; e < kVec; ++e)
      addForwardTerms<kLayer>(xv[k][e], sums);
}

template <bool kLayer>
__device__ inline RowStatistics
forwardStatistics(const double (&sums)[forwardSums<kLayer>()], int64_t hidden,
                  double eps) {
  constexpr int kSums = forwardSums<kLayer>();
  return kLayer ? layerStatistics(sums[0], sums[kSums - 1], hidden, eps)
                : rmsStatistics(sums[kSums - 1], hidden, eps);
}

/// The statistics of the row whose elements this thread holds in xv: its
/// sums reduced over the block (blockStatistics, through `shared`, which
/// holds kMaxNormWarps * forwardSums<kLayer>() doubles, and `statistics`).
template <int kVec, int kItems, bool kLayer>
__device__ inline RowStatistics
forwardRowStatistics(const float (&xv)[kItems][kVec], int64_t hidden,
                     double eps, double *shared, RowStatistics *statistics) {
  constexpr int kSums = forwardSums<kLayer>();
  double sums[kSums];
  forwardRowSums<kVec, kItems, kLayer>(xv, sums);
  return blockStatistics(
      sums, shared, statistics, [&](const double(&totals)[kSums]) {
        return forwardStatistics<kLayer>(totals, hidden, eps);
      });
}

/// One element of y = (x - mean) * rstd * weight (+ bias) for layer norm
/// (kLayer), else x * rstd * weight.
template <bool kLayer>
__device__ inline float forwardOutput(float x, RowStatistics s, float w,
                                      float b, bool hasBias) {
  if constexpr (kLayer) {
    float value = (x - s.mean) * s.rstd * w;
    return hasBias ? value + b : value;
  } else {
    return x * s.rstd * w;
  }
}

/// Row r of y (forwardOutput).
template <int kVec, int kItems, bool kLayer>
__device__ inline void
forwardRowOutputs(int64_t r, int64_t vectors, const float (&xv)[kItems][kVec],
                  const float (&w)[kItems][kVec],
                  const float (&b)[kItems][kVec], bool hasBias, RowStatistics s,
                  NormRowsOut y, NormFp8Out fp8, unsigned &largest) {
#pragma unroll
  for (int k = 0; k < kItems; ++k) {
    int64_t v = ownedVector(k);
    if (v >= vectors)
      continue;
    float out[kVec];
#pragma unroll
    for (int e = 0; e < kVec; ++e)
      out[e] = forwardOutput<kLayer>(xv[k][e], s, w[k][e], b[k][e], hasBias);
    if (fp8.codes)
      storeCodes<kVec>(y.bf16, fp8, (r * vectors + v) * kVec, out, largest);
    else
      storeVector<kVec>(y, (r * vectors + v) * kVec, out);
  }
}

/// The row sums the backward needs, in double: for layer norm sum x,
/// sum x^2, sum g, sum g x; for RMS norm sum x^2, sum g x (g = dy * weight).
template <bool kLayer> constexpr int backwardSums() { return kLayer ? 4 : 2; }

/// One element's terms of the backward's sums.
template <bool kLayer>
__device__ inline void
addBackwardTerms(float x, float dy, float w,
                 double (&sums)[backwardSums<kLayer>()]) {
  double value = x;
  double g = dy * w;
  if constexpr (kLayer) {
    sums[0] += value;
    sums[1] += value * value;
    sums[2] += g;
    sums[3] += g * value;
  } else {
    sums[0] += value * value;
    sums[1] += g * value;
  }
}

template <int kVec, int kItems, bool kLayer>
__device__ inline void backwardRowSums(const float (&xv)[kItems][kVec],
                                       const float (&dyv)[kItems][kVec],
                                       const float (&w)[kItems][kVec],
                                       double (&sums)[backwardSums<kLayer>()]) {
#pragma unroll
  for (int i = 0; i < backwardSums<kLayer>(); ++i)
    sums[i] = 0;
#pragma unroll
  for (int k = 0; k < kItems; ++k)
#pragma unroll
    for (int e = 0; e < kVec; ++e)
      addBackwardTerms<kLayer>(xv[k][e], dyv[k][e], w[k][e], sums);
}

/// A row's statistics for the backward, from its block-wide sums.
struct BackwardStatistics {
  RowStatistics s;
  float meanG, meanGXhat;
};

template <bool kLayer>
__device__ inline BackwardStatistics
backwardStatistics(const double (&sums)[backwardSums<kLayer>()],
                   int64_t hidden, double eps) {
  double n = static_cast<double>(hidden);
  BackwardStatistics b;
  if constexpr (kLayer) {
    b.s = layerStatistics(sums[0], sums[1], hidden, eps);
    b.meanG = static_cast<float>(sums[2] / n);
    b.meanGXhat = static_cast<float>(
        static_cast<double>(b.s.rstd) *
        (sums[3] - static_cast<double>(b.s.mean) * sums[2]) / n);
  } else {
    b.s = rmsStatistics(sums[0], hidden, eps);
    b.meanG = 0.0f;
    b.meanGXhat =
        static_cast<float>(static_cast<double>(b.s.rstd) * sums[1] / n);
  }
  return b;
}

/// The backward's statistics of the row whose elements this thread holds
/// in xv and dyv, reduced over the block as forwardRowStatistics does
/// (`shared` holds kMaxNormWarps * backwardSums<kLayer>() doubles).
template <int kVec, int kItems, bool kLayer>
__device__ inline BackwardStatistics backwardRowStatistics(
    const float (&xv)[kItems][kVec], const float (&dyv)[kItems][kVec],
    const float (&w)[kItems][kVec], int64_t hidden, double eps, double *shared,
    BackwardStatistics *statistics) {
  constexpr int kSums = backwardSums<kLayer>();
  double sums[kSums];
  backwardRowSums<kVec, kItems, kLayer>(xv, dyv, w, sums);
  return blockStatistics(
      sums, shared, statistics, [&](const double(&totals)[kSums]) {
        return backwardStatistics<kLayer>(totals, hidden, eps);
      });
}

/// One element of dx, its dweight term added to accW and its dbias term to
/// accB.
template <bool kLayer>
__device__ inline float backwardOutput(float x, float dy, float w,
                                       const BackwardStatistics &b, float &accW,
                                       float &accB) {
  RowStatistics s = b.s;
  float g = dy * w;
  float xhat = kLayer ? (x - s.mean) * s.rstd : x * s.rstd;
  accW += dy * xhat;
  accB += dy;
  return kLayer ? s.rstd * (g - b.meanG - xhat * b.meanGXhat)
                : s.rstd * (g - xhat * b.meanGXhat);
}

/// Row r of dx (if its data is not null), and its dweight and dbias terms
/// added to this thread's column sums (backwardOutput).
template <int kVec, int kItems, bool kLayer>
__device__ inline void
backwardRowOutputs(int64_t r, int64_t vectors, const float (&xv)[kItems][kVec],
                   const float (&dyv)[kItems][kVec],
                   const float (&w)[kItems][kVec], BackwardStatistics b,
                   float (&accW)[kItems][kVec], float (&accB)[kItems][kVec],
                   NormRowsOut dx) {
#pragma unroll
  for (int k = 0; k < kItems; ++k) {
    float out[kVec];
#pragma unroll
    for (int e = 0; e < kVec; ++e)
      out[e] = backwardOutput<kLayer>(xv[k][e], dyv[k][e], w[k][e], b,
                                      accW[k][e], accB[k][e]);
    int64_t v = ownedVector(k);
    if (dx.data && v < vectors)
      storeVector<kVec>(dx, (r * vectors + v) * kVec, out);
  }
}

/// Writes this thread's column sums as row blockIdx.x of partialW (and of
/// partialB, if not null).
template <int kVec, int kItems>
__device__ inline void writePartials(int64_t hidden, int64_t vectors,
                                     const float (&accW)[kItems][kVec],
                                     const float (&accB)[kItems][kVec],
                                     float *partialW, float *partialB) {
#pragma unroll
  for (int k = 0; k < kItems; ++k) {
    int64_t v = ownedVector(k);
    if (v >= vectors)
      continue;
    int64_t at = blockIdx.x * hidden + v * kVec;
#pragma unroll
    for (int e = 0; e < kVec; ++e) {
      partialW[at + e] = accW[k][e];
      if (partialB)
        partialB[at + e] = accB[k][e];
    }
  }
}

/// The backward's share of rows for this block: [rows * b / blocks,
/// rows * (b + 1) / blocks).
__device__ inline void blockRows(int64_t rows, int64_t &begin, int64_t &end) {
  int64_t blocks = gridDim.x;
  begin = rows * blockIdx.x / blocks;
  end = rows * (blockIdx.x + 1) / blocks;
}

//===----------------------------------------------------------------------===//
// Rows in registers (any hidden size up to kMaxNormHidden, any alignment)
//===----------------------------------------------------------------------===//

/// The forward, a block per row, rows strided by the grid.
template <int kVec, int kItems, bool kLayer>
__global__ void __launch_bounds__(kMaxNormThreads)
    normForwardKernel(int64_t rows, int64_t hidden, NormRows x,
                      const float *weight, const float *bias, double eps,
                      NormRowsOut y, NormFp8Out fp8) {
  constexpr int kSums = forwardSums<kLayer>();
  __shared__ double shared[kMaxNormWarps * kSums];
  __shared__ RowStatistics statistics;
  int64_t vectors = hidden / kVec;
  // The parameters first: their loads overlap the first row's.
  float w[kItems][kVec], b[kItems][kVec];
  loadParameters<kVec, kItems>(weight, vectors, w);
  loadParameters<kVec, kItems>(kLayer ? bias : nullptr, vectors, b);
  unsigned largest = 0;
  for (int64_t r = blockIdx.x; r < rows; r += gridDim.x) {
    float xv[kItems][kVec];
    loadRow<kVec, kItems>(x, r, vectors, xv);
    RowStatistics s = forwardRowStatistics<kVec, kItems, kLayer>(
        xv, hidden, eps, shared, &statistics);
    forwardRowOutputs<kVec, kItems, kLayer>(
        r, vectors, xv, w, b, bias != nullptr, s, y, fp8, largest);
  }
  recordNormAmax(fp8, largest);
}

/// dx from dy, x and weight, the statistics recomputed from x; block b
/// takes its share of the rows (blockRows) and writes row b of partialW
/// (and of partialB, for layer norm's bias, if not null): its rows' sums of
/// dy * xhat (and of dy), each column added in row order.
template <int kVec, int kItems, bool kLayer>
__global__ void __launch_bounds__(kMaxNormThreads)
    normBackwardKernel(int64_t rows, int64_t hidden, NormRows x, NormRows dy,
                       const float *weight, double eps, NormRowsOut dx,
                       float *partialW, float *partialB) {
  constexpr int kSums = backwardSums<kLayer>();
  // Two rows' loads in flight while a row reduces, when registers allow.
  constexpr bool kPrefetch = kVec * kItems <= 8;
  __shared__ double shared[kMaxNormWarps * kSums];
  __shared__ BackwardStatistics statistics;
  int64_t vectors = hidden / kVec;
  int64_t begin, end;
  blockRows(rows, begin, end);

  float w[kItems][kVec], accW[kItems][kVec] = {}, accB[kItems][kVec] = {};
  float xv[kItems][kVec], dyv[kItems][kVec];
  float xn[kItems][kVec], dyn[kItems][kVec];
  loadParameters<kVec, kItems>(weight, vectors, w);
  if (begin < end) {
    loadRow<kVec, kItems>(x, begin, vectors, xv);
    loadRow<kVec, kItems>(dy, begin, vectors, dyv);
  }
  for (int64_t r = begin; r < end; ++r) {
    if (kPrefetch && r + 1 < end) {
      loadRow<kVec, kItems>(x, r + 1, vectors, xn);
      loadRow<kVec, kItems>(dy, r + 1, vectors, dyn);
    }
    BackwardStatistics s = backwardRowStatistics<kVec, kItems, kLayer>(
        xv, dyv, w, hidden, eps, shared, &statistics);
    backwardRowOutputs<kVec, kItems, kLayer>(r, vectors, xv, dyv, w, s, accW,
                                             accB, dx);
    if constexpr (kPrefetch) {
#pragma unroll
      for (int k = 0; k < kItems; ++k)
#pragma unroll
        for (int e = 0; e < kVec; ++e) {
          xv[k][e] = xn[k][e];
          dyv[k][e] = dyn[k][e];
        }
    } else if (r + 1 < end) {
      loadRow<kVec, kItems>(x, r + 1, vectors, xv);
      loadRow<kVec, kItems>(dy, r + 1, vectors, dyv);
    }
  }
  writePartials<kVec, kItems>(hidden, vectors, accW, accB, partialW,
                              partialB);
}

//===----------------------------------------------------------------------===//
// Rows staged in shared memory (rows of 16-byte aligned vectors of 4 whose
// kNormStages copies fit in kMaxStagedBytes): each thread copies its own
// vectors of the next rows with cp.async while the block works on the
// current one, so that rows - not registers - bound the bytes in flight,
// and each block keeps its parameters for all its rows.
//===----------------------------------------------------------------------===//

/// Rows in shared memory per block: the one being worked on and the next
/// kNormStages - 1 in flight.
constexpr int kNormStages = 3;
/// Threads of a staged block, at most: 8 or 16 elements a thread, so hidden
/// sizes up to 4096.
constexpr int kStagedThreads = 256;
constexpr int64_t kMaxStagedHidden = 16 * kStagedThreads;
/// Blocks per processor the staged kernels' registers must allow: with
/// two vectors a thread (hidden <= 2048) the forward keeps 4 blocks of 256
/// threads, the backward 3; with four, both 2.
template <int kItems> constexpr int stagedForwardBlocks() {
  return kItems == 2 ? 4 : 2;
}
template <int kItems> constexpr int stagedBackwardBlocks() {
  return kItems == 2 ? 3 : 2;
}
/// Dynamic shared memory of a staged block, at most (opted into past the
/// default 48 KiB: allowStagedBytes): kNormStages rows of 4096 fp32
/// elements, or of a backward's x and dy of 2048 fp32 elements each.
constexpr int64_t kMaxStagedBytes = 96 * 1024;

/// Starts copying `kBytes` (8 or 16) from global to shared memory; the
/// copy lands at the waitStaged that covers its commitStaged group.
template <int kBytes>
__device__ inline void copyAsync(void *to, const void *from) {
  auto address = static_cast<unsigned>(__cvta_generic_to_shared(to));
  if constexpr (kBytes == 16)
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(address),
                 "l"(from)
                 : "memory");
  else
    asm volatile("cp.async.ca.shared.global [%0], [%1], 8;\n" ::"r"(address),
                 "l"(from)
                 : "memory");
}

/// Closes the group of copies started since the last one.
__device__ inline void commitStaged() {
  asm volatile("cp.async.commit_group;\n" ::: "memory");
}

/// Waits until at most kPending of this thread's groups are in flight.
template <int kPending> __device__ inline void waitStaged() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(kPending) : "memory");
}

/// Starts copying this thread's vectors of row r of `rows` to `to` (at the
/// same offsets: each thread later reads only what it copied itself, so no
/// barrier is needed between the copy and the reads).
template <int kItems>
__device__ inline void stageRow(NormRows rows, int64_t r, int64_t vectors,
                                unsigned char *to) {
  int bytes = rows.bf16 ? 8 : 16;
  const auto *from =
      static_cast<const unsigned char *>(rows.data) + r * vectors * bytes;
#pragma unroll
  for (int k = 0; k < kItems; ++k) {
    int64_t v = ownedVector(k);
    if (v >= vectors)
      continue;
    if (rows.bf16)
      copyAsync<8>(to + v * 8, from + v * 8);
    else
      copyAsync<16>(to + v * 16, from + v * 16);
  }
}

/// This thread's vectors of a staged row.
template <int kItems>
__device__ inline void loadStaged(const unsigned char *row, bool bf16,
                                  int64_t vectors, float (&out)[kItems][4]) {
  loadRow<4, kItems>(NormRows{row, bf16}, 0, vectors, out);
}

/// Starts the copies of the block's first kNormStages - 1 rows of [begin,
/// end): stage(r, slot) starts row r's copies into stage `slot`.
template <typename Stage>
__device__ inline void primeStages(int64_t begin, int64_t end, Stage stage) {
#pragma unroll
  for (int s = 0; s < kNormStages - 1; ++s) {
    if (begin + s < end)
      stage(begin + s, s);
    commitStaged();
  }
}

/// For each row r of [begin, end), after primeStages: starts the copies of
/// row r + kNormStages - 1, waits for row r's, then process(r, slot) with
/// row r in stage `slot`.
template <typename Stage, typename Process>
__device__ inline void forEachStagedRow(int64_t begin, int64_t end,
                                        Stage stage, Process process) {
  int slot = 0;
  for (int64_t r = begin; r < end; ++r) {
    int ahead = slot == 0 ? kNormStages - 1 : slot - 1;
    if (r + kNormStages - 1 < end)
      stage(r + kNormStages - 1, ahead);
    commitStaged();
    waitStaged<kNormStages - 1>();
    process(r, slot);
    slot = slot + 1 == kNormStages ? 0 : slot + 1;
  }
}

/// Bytes of a staged row of `hidden` elements, rounded up to 16.
int64_t stagedBytes(int64_t hidden, bool bf16) {
  return (hidden * (bf16 ? 2 : 4) + 15) / 16 * 16;
}

/// The forward over the block's rows (blockRows), kNormStages of
/// `rowBytes` (stagedBytes) in dynamic shared memory.
template <int kItems, bool kLayer>
__global__ void __launch_bounds__(kStagedThreads, stagedForwardBlocks<kItems>())
    normForwardStagedKernel(int64_t rows, int64_t hidden, NormRows x,
                            const float *weight, const float *bias, double eps,
                            NormRowsOut y, NormFp8Out fp8, int64_t rowBytes) {
  constexpr int kVec = 4;
  constexpr int kSums = forwardSums<kLayer>();
  __shared__ double shared[kMaxNormWarps * kSums];
  __shared__ RowStatistics statistics;
  extern __shared__ __align__(16) unsigned char staged[];
  int64_t vectors = hidden / kVec;
  int64_t begin, end;
  blockRows(rows, begin, end);
  auto stage = [&](int64_t r, int slot) {
    stageRow<kItems>(x, r, vectors, staged + slot * rowBytes);
  };
  primeStages(begin, end, stage);
  float w[kItems][kVec], b[kItems][kVec];
  loadParameters<kVec, kItems>(weight, vectors, w);
  loadParameters<kVec, kItems>(kLayer ? bias : nullptr, vectors, b);
  unsigned largest = 0;
  forEachStagedRow(begin, end, stage, [&](int64_t r, int slot) {
    float xv[kItems][kVec];
    loadStaged<kItems>(staged + slot * rowBytes, x.bf16, vectors, xv);
    RowStatistics s = forwardRowStatistics<kVec, kItems, kLayer>(
        xv, hidden, eps, shared, &statistics);
    forwardRowOutputs<kVec, kItems, kLayer>(
        r, vectors, xv, w, b, bias != nullptr, s, y, fp8, largest);
  });
  recordNormAmax(fp8, largest);
}

/// normBackwardKernel with x's and dy's rows staged: a stage holds x's row
/// (xBytes, stagedBytes) and then dy's, `stageBytes` in all.
template <int kItems, bool kLayer>
__global__ void
__launch_bounds__(kStagedThreads, stagedBackwardBlocks<kItems>())
    normBackwardStagedKernel(int64_t rows, int64_t hidden, NormRows x,
                             NormRows dy, const float *weight, double eps,
                             NormRowsOut dx, float *partialW, float *partialB,
                             int64_t xBytes, int64_t stageBytes) {
  constexpr int kVec = 4;
  constexpr int kSums = backwardSums<kLayer>();
  __shared__ double shared[kMaxNormWarps * kSums];
  __shared__ BackwardStatistics statistics;
  extern __shared__ __align__(16) unsigned char staged[];
  int64_t vectors = hidden / kVec;
  int64_t begin, end;
  blockRows(rows, begin, end);
  auto stage = [&](int64_t r, int slot) {
    unsigned char *to = staged + slot * stageBytes;
    stageRow<kItems>(x, r, vectors, to);
    stageRow<kItems>(dy, r, vectors, to + xBytes);
  };
  primeStages(begin, end, stage);
  float w[kItems][kVec], accW[kItems][kVec] = {}, accB[kItems][kVec] = {};
  loadParameters<kVec, kItems>(weight, vectors, w);
  forEachStagedRow(begin, end, stage, [&](int64_t r, int slot) {
    const unsigned char *row = staged + slot * stageBytes;
    float xv[kItems][kVec], dyv[kItems][kVec];
    loadStaged<kItems>(row, x.bf16, vectors, xv);
    loadStaged<kItems>(row + xBytes, dy.bf16, vectors, dyv);
    BackwardStatistics s = backwardRowStatistics<kVec, kItems, kLayer>(
        xv, dyv, w, hidden, eps, shared, &statistics);
    // Read again rather than kept across the reduction: fewer registers.
    loadStaged<kItems>(row, x.bf16, vectors, xv);
    loadStaged<kItems>(row + xBytes, dy.bf16, vectors, dyv);
    backwardRowOutputs<kVec, kItems, kLayer>(r, vectors, xv, dyv, w, s, accW,
                                             accB, dx);
  });
  writePartials<kVec, kItems>(hidden, vectors, accW, accB, partialW,
                              partialB);
}

//===----------------------------------------------------------------------===//
// Rows a warp each: bf16 rows of kPer * 256 elements (kPer <= 8: the
// models' hidden sizes 768, 1024, 2048), 16-byte aligned. Lane l holds
// 16-byte vectors l, l + 32, ... of the row; the row's double sums meet by
// shuffles alone (no shared memory, no barrier), and every lane computes
// the statistics. The staged kernels spent about
// 40 (forward) and 66 (backward) instructions an element on 64-bit
// indexing, bounds tests and barriers (bench/NOTES.md, session 24).
// The same per-element formulas; the row sums add in another order.
//===----------------------------------------------------------------------===//

constexpr int kWarpRowForwardThreads = 256;
constexpr int kWarpRowBackwardThreads = 128;

__device__ inline void unpackBf16x8(uint4 raw, float (&out)[8]) {
  const unsigned words[4] = {raw.x, raw.y, raw.z, raw.w};
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    out[2 * i] = __uint_as_float(words[i] << 16);
    out[2 * i + 1] = __uint_as_float(words[i] & 0xffff0000u);
  }
}

__device__ inline uint4 packBf16x8(const float (&in)[8]) {
  unsigned words[4];
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    __nv_bfloat162 pair = __floats2bfloat162_rn(in[2 * i], in[2 * i + 1]);
    words[i] = *reinterpret_cast<const unsigned *>(&pair);
  }
  return make_uint4(words[0], words[1], words[2], words[3]);
}

/// Eight floats of a parameter from element `at` (16-byte aligned).
__device__ inline void loadParameter8(const float *data, int at,
                                      float (&out)[8]) {
  float4 lo = __ldg(reinterpret_cast<const float4 *>(data + at));
  float4 hi = __ldg(reinterpret_cast<const float4 *>(data + at + 4));
  out[0] = lo.x, out[1] = lo.y, out[2] = lo.z, out[3] = lo.w;
  out[4] = hi.x, out[5] = hi.y, out[6] = hi.z, out[7] = hi.w;
}

/// The warp's sum of v in every lane: a butterfly, whose pairs every lane
/// adds in the same order, so that all lanes hold the same bits.
__device__ inline double warpAllSum(double v) {
#pragma unroll
  for (int offset = detail::kWarp / 2; offset > 0; offset /= 2)
    v += __shfl_xor_sync(0xffffffffu, v, offset);
  return v;
}

template <int kPer, bool kLayer>
__global__ void __launch_bounds__(kWarpRowForwardThreads)
    normForwardWarpKernel(int64_t rows, int hidden, const __nv_bfloat16 *x,
                          const float *weight, const float *bias, double eps,
                          __nv_bfloat16 *y) {
  const int lane = threadIdx.x % detail::kWarp;
  const int warpsPerBlock = blockDim.x / detail::kWarp;
  const int64_t warps = int64_t(gridDim.x) * warpsPerBlock;
  for (int64_t r =
           int64_t(blockIdx.x) * warpsPerBlock + threadIdx.x / detail::kWarp;
       r < rows; r += warps) {
    const auto *in = reinterpret_cast<const uint4 *>(x + r * hidden);
    float xv[kPer][8];
#pragma unroll
    for (int k = 0; k < kPer; ++k)
      unpackBf16x8(in[lane + detail::kWarp * k], xv[k]);
    double sums[forwardSums<kLayer>()] = {};
#pragma unroll
    for (int k = 0; k < kPer; ++k)
#pragma unroll
      for (int e = 0; e < 8; ++e)
        addForwardTerms<kLayer>(xv[k][e], sums);
#pragma unroll
    for (double &sum : sums)
      sum = warpAllSum(sum);
    RowStatistics s = forwardStatistics<kLayer>(sums, hidden, eps);
    auto *out = reinterpret_cast<uint4 *>(y + r * hidden);
#pragma unroll
    for (int k = 0; k < kPer; ++k) {
      int v = lane + detail::kWarp * k;
      float w[8], b[8] = {}, o[8];
      loadParameter8(weight, 8 * v, w);
      if (kLayer && bias)
        loadParameter8(bias, 8 * v, b);
#pragma unroll
      for (int e = 0; e < 8; ++e)
        o[e] = forwardOutput<kLayer>(xv[k][e], s, w[e], b[e], bias != nullptr);
      out[v] = packBf16x8(o);
    }
  }
}

/// The backward a warp a row: block b takes its share of the rows
/// (blockRows), its warps the rows in turn. Each warp's dweight and dbias
/// sums live in shared memory ([warp][which][k][half][lane] float4s: a
/// warp's accesses are contiguous), and a row waits across its reduction as
/// its raw bf16 vectors, all loads in flight at once; the block writes row b
/// of partialW (and partialB) as the sum of its warps' in warp order. (Sums
/// held in registers, 16 a lane-vector, took 255 registers at hidden 2048
/// and two blocks a multiprocessor: 5.19 against 4.06 ms a step at gpt-1.3b,
/// bench/NOTES.md, session 30.)
template <int kPer, bool kLayer>
__global__ void __launch_bounds__(kWarpRowBackwardThreads)
    normBackwardWarpKernel(int64_t rows, int hidden, const __nv_bfloat16 *x,
                           const __nv_bfloat16 *dy, const float *weight,
                           double eps, __nv_bfloat16 *dx, float *partialW,
                           float *partialB) {
  constexpr int kWarps = kWarpRowBackwardThreads / detail::kWarp;
  constexpr int kSums = backwardSums<kLayer>();
  constexpr int kWhich = kLayer ? 2 : 1;
  extern __shared__ float4 columnSums[];
  const int lane = threadIdx.x % detail::kWarp;
  const int warp = threadIdx.x / detail::kWarp;
  auto sumsAt = [&](int w, int which, int k, int half, int l) -> float4 & {
    return columnSums[(((w * kWhich + which) * kPer + k) * 2 + half) *
                          detail::kWarp +
                      l];
  };
#pragma unroll
  for (int which = 0; which < kWhich; ++which)
#pragma unroll
    for (int k = 0; k < kPer; ++k)
#pragma unroll
      for (int half = 0; half < 2; ++half)
        sumsAt(warp, which, k, half, lane) = make_float4(0.f, 0.f, 0.f, 0.f);
  int64_t begin, end;
  blockRows(rows, begin, end);
  for (int64_t r = begin + warp; r < end; r += kWarps) {
    const auto *xin = reinterpret_cast<const uint4 *>(x + r * hidden);
    const auto *dyin = reinterpret_cast<const uint4 *>(dy + r * hidden);
    uint4 xRaw[kPer], dyRaw[kPer];
#pragma unroll
    for (int k = 0; k < kPer; ++k) {
      xRaw[k] = xin[lane + detail::kWarp * k];
      dyRaw[k] = dyin[lane + detail::kWarp * k];
    }
    double sums[kSums] = {};
#pragma unroll
    for (int k = 0; k < kPer; ++k) {
      float xv[8], dyv[8], w[8];
      unpackBf16x8(xRaw[k], xv);
      unpackBf16x8(dyRaw[k], dyv);
      loadParameter8(weight, 8 * (lane + detail::kWarp * k), w);
#pragma unroll
      for (int e = 0; e < 8; ++e)
        addBackwardTerms<kLayer>(xv[e], dyv[e], w[e], sums);
    }
#pragma unroll
    for (int i = 0; i < kSums; ++i)
      sums[i] = warpAllSum(sums[i]);
    BackwardStatistics b = backwardStatistics<kLayer>(sums, hidden, eps);
    auto *out = reinterpret_cast<uint4 *>(dx + r * hidden);
#pragma unroll
    for (int k = 0; k < kPer; ++k) {
      float xv[8], dyv[8], w[8], o[8], accW[8], accB[8] = {};
      unpackBf16x8(xRaw[k], xv);
      unpackBf16x8(dyRaw[k], dyv);
      loadParameter8(weight, 8 * (lane + detail::kWarp * k), w);
#pragma unroll
      for (int which = 0; which < kWhich; ++which)
#pragma unroll
        for (int half = 0; half < 2; ++half) {
          float4 held = sumsAt(warp, which, k, half, lane);
          float *to = which ? accB : accW;
          to[4 * half] = held.x, to[4 * half + 1] = held.y;
          to[4 * half + 2] = held.z, to[4 * half + 3] = held.w;
        }
#pragma unroll
      for (int e = 0; e < 8; ++e)
        o[e] = backwardOutput<kLayer>(xv[e], dyv[e], w[e], b, accW[e], accB[e]);
#pragma unroll
      for (int which = 0; which < kWhich; ++which)
#pragma unroll
        for (int half = 0; half < 2; ++half) {
          const float *from = which ? accB : accW;
          sumsAt(warp, which, k, half, lane) =
              make_float4(from[4 * half], from[4 * half + 1],
                          from[4 * half + 2], from[4 * half + 3]);
        }
      if (dx)
        out[lane + detail::kWarp * k] = packBf16x8(o);
    }
  }
  __syncthreads();
  // The block's partial rows: its warps' column sums added in warp order.
  const auto *sums = reinterpret_cast<const float *>(columnSums);
  for (int which = 0; which < (kLayer && partialB ? 2 : 1); ++which) {
    float *partial = which ? partialB : partialW;
    for (int c = threadIdx.x; c < hidden; c += blockDim.x) {
      int k = c / 256, l = (c % 256) / 8, e = c % 8;
      float total = 0.0f;
#pragma unroll
      for (int v = 0; v < kWarps; ++v)
        total += sums[4 * ((((v * kWhich + which) * kPer + k) * 2 + e / 4) *
                               detail::kWarp +
                           l) +
                      e % 4];
      partial[int64_t(blockIdx.x) * hidden + c] = total;
    }
  }
}

/// Shared bytes of normBackwardWarpKernel<kPer, kLayer>.
template <int kPer, bool kLayer> constexpr size_t warpSharedSumBytes() {
  return size_t(kWarpRowBackwardThreads / detail::kWarp) * (kLayer ? 2 : 1) *
         kPer * 2 * detail::kWarp * sizeof(float4);
}

/// A norm launch's shape: vector width (4 when the row and every pointer
/// allow), vectors per thread, threads (a multiple of 32, at most
/// kMaxNormThreads) with at most 4, 8, 16, then 32 elements per thread.
struct NormShape {
  int vec, items, threads;
};

NormShape normShape(int64_t hidden, bool aligned) {
  int vec = aligned && hidden % 4 == 0 ? 4 : 1;
  for (int elements : {4, 8, 16, 32}) {
    int64_t threads = (hidden + elements - 1) / elements;
    threads = (threads + detail::kWarp - 1) / detail::kWarp * detail::kWarp;
    if (threads <= kMaxNormThreads)
      return {vec, elements / vec, static_cast<int>(std::max<int64_t>(
                                       threads, detail::kWarp))};
  }
  return {vec, 32 / vec, kMaxNormThreads}; // checked by the executor
}

/// The staged kernels' shape (hidden <= kMaxStagedHidden): vectors of 4,
/// 8 elements a thread (two vectors: fewer threads, so a cheaper block
/// reduction per row and more blocks per processor), 16 where
/// kStagedThreads needs it.
NormShape stagedShape(int64_t hidden) {
  int elements = hidden <= 8 * kStagedThreads ? 8 : 16;
  int64_t threads = (hidden + elements - 1) / elements;
  threads = (threads + detail::kWarp - 1) / detail::kWarp * detail::kWarp;
  return {4, elements / 4,
          static_cast<int>(std::max<int64_t>(threads, detail::kWarp))};
}

/// Whether a norm's rows go through the staged kernels: vectors of 4
/// 16-byte aligned, kNormStages rows of `stageBytes` in kMaxStagedBytes.
bool usesStagedKernels(int64_t hidden, bool aligned, int64_t stageBytes) {
  return aligned && hidden % 4 == 0 && hidden <= kMaxStagedHidden &&
         kNormStages * stageBytes <= kMaxStagedBytes;
}

/// Lets `kernel` take up to kMaxStagedBytes of dynamic shared memory on the
/// current device (once per thread, kernel and device; a failure shows at
/// the launch).
template <typename Kernel> void allowStagedBytes(Kernel kernel) {
  int device = 0;
  if (cudaGetDevice(&device) != cudaSuccess)
    return;
  thread_local std::set<std::pair<const void *, int>> allowed;
  if (allowed.emplace(reinterpret_cast<const void *>(kernel), device).second)
    (void)cudaFuncSetAttribute(kernel,
                               cudaFuncAttributeMaxDynamicSharedMemorySize,
                               static_cast<int>(kMaxStagedBytes));
}

bool aligned16(const void *p) {
  return reinterpret_cast<uintptr_t>(p) % 16 == 0;
}

template <int kValue> using Int = std::integral_constant<int, kValue>;

/// Calls body(Int<vec>, Int<items>) for the shape's instantiation.
template <typename Body> void withNormShape(NormShape shape, Body &&body) {
  if (shape.vec == 4) {
    switch (shape.items) {
    case 1:
      return body(Int<4>(), Int<1>());
    case 2:
      return body(Int<4>(), Int<2>());
    case 4:
      return body(Int<4>(), Int<4>());
    default:
      return body(Int<4>(), Int<8>());
    }
  }
  switch (shape.items) {
  case 4:
    return body(Int<1>(), Int<4>());
  case 8:
    return body(Int<1>(), Int<8>());
  case 16:
    return body(Int<1>(), Int<16>());
  default:
    return body(Int<1>(), Int<32>());
  }
}

/// Calls body(Int<items>) for a staged shape's instantiation.
template <typename Body> void withStagedShape(NormShape shape, Body &&body) {
  if (shape.items == 2)
    return body(Int<2>());
  return body(Int<4>());
}

/// The widest rows the warp kernels take, in 16-byte vectors a lane.
constexpr int kMaxWarpRowForwardVectors = 8;
constexpr int kMaxWarpRowBackwardVectors = 8;

/// hidden / 256 (a lane's 16-byte bf16 vectors) when the warp kernels take
/// rows of `hidden`, else 0.
int warpRowVectors(int64_t hidden, int most) {
  if (hidden % 256 != 0 || hidden / 256 > most)
    return 0;
  int per = static_cast<int>(hidden / 256);
  return per == 7 ? 0 : per; // 1792: not instantiated (withWarpRowVectors)
}

/// Calls body(Int<vectors>) for warpRowVectors' result.
template <typename Body> void withWarpRowVectors(int per, Body &&body) {
  switch (per) {
  case 1:
    return body(Int<1>());
  case 2:
    return body(Int<2>());
  case 3:
    return body(Int<3>());
  case 4:
    return body(Int<4>());
  case 5:
    return body(Int<5>());
  case 6:
    return body(Int<6>());
  default:
    return body(Int<8>());
  }
}

template <bool kLayer>
void normForward(cudaStream_t stream, int64_t rows, int64_t hidden, NormRows x,
                 const float *weight, const float *bias, double eps,
                 NormRowsOut y, NormFp8Out fp8 = {}) {
  if (rows <= 0 || hidden <= 0)
    return;
  bool aligned = aligned16(x.data) && aligned16(weight) &&
                 (!bias || aligned16(bias)) && aligned16(y.data);
  if (int per = warpRowVectors(hidden, kMaxWarpRowForwardVectors);
      per && aligned && weight && x.bf16 && y.bf16 && !fp8.codes) {
    withWarpRowVectors(per, [&](auto vectors) {
      auto kernel = normForwardWarpKernel<decltype(vectors)::value, kLayer>;
      constexpr int64_t kWarpsPerBlock = kWarpRowForwardThreads / detail::kWarp;
      int64_t blocks =
          std::min((rows + kWarpsPerBlock - 1) / kWarpsPerBlock,
                   detail::residentBlocks(kernel, kWarpRowForwardThreads));
      kernel<<<static_cast<unsigned>(blocks), kWarpRowForwardThreads, 0,
               stream>>>(rows, static_cast<int>(hidden),
                         static_cast<const __nv_bfloat16 *>(x.data), weight,
                         bias, eps, static_cast<__nv_bfloat16 *>(y.data));
    });
    return;
  }
  int64_t rowBytes = stagedBytes(hidden, x.bf16);
  if (usesStagedKernels(hidden, aligned, rowBytes)) {
    NormShape shape = stagedShape(hidden);
    auto sharedBytes = static_cast<size_t>(kNormStages * rowBytes);
    withStagedShape(shape, [&](auto items) {
      auto kernel = normForwardStagedKernel<decltype(items)::value, kLayer>;
      allowStagedBytes(kernel);
      int64_t blocks = std::min(
          rows, detail::residentBlocks(kernel, shape.threads, sharedBytes));
      kernel<<<static_cast<unsigned>(blocks), shape.threads, sharedBytes,
               stream>>>(rows, hidden, x, weight, bias, eps, y, fp8, rowBytes);
    });
    return;
  }
  NormShape shape = normShape(hidden, aligned);
  auto grid = static_cast<unsigned>(std::min<int64_t>(rows, int64_t(1) << 30));
  withNormShape(shape, [&](auto vec, auto items) {
    normForwardKernel<decltype(vec)::value, decltype(items)::value, kLayer>
        <<<grid, shape.threads, 0, stream>>>(rows, hidden, x, weight, bias, eps,
                                             y, fp8);
  });
}

template <bool kLayer>
void normBackward(cudaStream_t stream, int64_t rows, int64_t hidden,
                  NormRows x, const float *weight, NormRows dy, double eps,
                  NormRowsOut dx, float *dweight, float *dbias,
                  void *scratch) {
  if (hidden <= 0)
    return;
  if (rows <= 0) { // no rows: zero parameter gradients
    cudaMemsetAsync(dweight, 0, sizeof(float) * hidden, stream);
    if (dbias)
      cudaMemsetAsync(dbias, 0, sizeof(float) * hidden, stream);
    return;
  }
  // The partials' rows: normBackwardBlocks(rows) at most (the scratch);
  // partialB's start keeps partialW's alignment when hidden % 4 == 0.
  int64_t most = normBackwardBlocks(rows), blocks = most;
  auto *partialW = static_cast<float *>(scratch);
  float *partialB = dbias ? partialW + most * hidden : nullptr;
  bool aligned = aligned16(x.data) && aligned16(dy.data) &&
                 aligned16(weight) && (!dx.data || aligned16(dx.data)) &&
                 aligned16(partialW) && (!partialB || aligned16(partialB));
  int64_t xBytes = stagedBytes(hidden, x.bf16);
  int64_t stageBytes = xBytes + stagedBytes(hidden, dy.bf16);
  int per = warpRowVectors(hidden, kMaxWarpRowBackwardVectors);
  bool warpRows =
      per && aligned && weight && x.bf16 && dy.bf16 && (!dx.data || dx.bf16);
  if (warpRows) {
    withWarpRowVectors(per, [&](auto vectors) {
      constexpr int kPer = decltype(vectors)::value;
      auto kernel = normBackwardWarpKernel<kPer, kLayer>;
      constexpr size_t bytes = warpSharedSumBytes<kPer, kLayer>();
      static_assert(bytes <= kMaxStagedBytes, "allowStagedBytes' limit");
      allowStagedBytes(kernel);
      blocks = std::min(
          most, detail::residentBlocks(kernel, kWarpRowBackwardThreads, bytes));
      kernel<<<static_cast<unsigned>(blocks), kWarpRowBackwardThreads, bytes,
               stream>>>(rows, static_cast<int>(hidden),
                         static_cast<const __nv_bfloat16 *>(x.data),
                         static_cast<const __nv_bfloat16 *>(dy.data), weight,
                         eps, static_cast<__nv_bfloat16 *>(dx.data), partialW,
                         partialB);
    });
  } else if (usesStagedKernels(hidden, aligned, stageBytes)) {
    NormShape shape = stagedShape(hidden);
    auto sharedBytes = static_cast<size_t>(kNormStages * stageBytes);
    withStagedShape(shape, [&](auto items) {
      auto kernel = normBackwardStagedKernel<decltype(items)::value, kLayer>;
      allowStagedBytes(kernel);
      blocks = std::min(
          most, detail::residentBlocks(kernel, shape.threads, sharedBytes));
      kernel<<<static_cast<unsigned>(blocks), shape.threads, sharedBytes,
               stream>>>(rows, hidden, x, dy, weight, eps, dx, partialW,
                         partialB, xBytes, stageBytes);
    });
  } else {
    NormShape shape = normShape(hidden, aligned);
    withNormShape(shape, [&](auto vec, auto items) {
      auto kernel =
          normBackwardKernel<decltype(vec)::value, decltype(items)::value,
                             kLayer>;
      blocks = std::min(most, detail::residentBlocks(kernel, shape.threads));
      kernel<<<static_cast<unsigned>(blocks), shape.threads, 0, stream>>>(
          rows, hidden, x, dy, weight, eps, dx, partialW, partialB);
    });
  }
  dim3 grid(static_cast<unsigned>((hidden + detail::kWarp - 1) / detail::kWarp),
            dbias ? 2 : 1);
  detail::partialRowTotalsKernel<<<grid, dim3(detail::kWarp, detail::kWarp), 0,
                                   stream>>>(blocks, hidden, partialW, dweight,
                                             partialB, dbias);
}

} // namespace

size_t normBackwardScratchBytes(int64_t rows, int64_t hidden) {
  return mtrt::scratch::normBackwardPartialBytes(rows, hidden);
}

void layerNormForward(cudaStream_t stream, int64_t rows, int64_t hidden,
                      NormRows x, const float *weight, const float *bias,
                      double eps, NormRowsOut y) {
  normForward<true>(stream, rows, hidden, x, weight, bias, eps, y);
}

void rmsNormForward(cudaStream_t stream, int64_t rows, int64_t hidden,
                    NormRows x, const float *weight, double eps,
                    NormRowsOut y) {
  normForward<false>(stream, rows, hidden, x, weight, nullptr, eps, y);
}

void layerNormBackward(cudaStream_t stream, int64_t rows, int64_t hidden,
                       NormRows x, const float *weight, NormRows dy,
                       double eps, NormRowsOut dx, float *dweight,
                       float *dbias, void *scratch) {
  normBackward<true>(stream, rows, hidden, x, weight, dy, eps, dx, dweight,
                     dbias, scratch);
}

void layerNormToFp8(cudaStream_t stream, int64_t rows, int64_t hidden,
                    NormRows x, const float *weight, const float *bias,
                    double eps, NormRowsOut y, NormFp8Out fp8) {
  normForward<true>(stream, rows, hidden, x, weight, bias, eps, y, fp8);
}

void rmsNormToFp8(cudaStream_t stream, int64_t rows, int64_t hidden, NormRows x,
                  const float *weight, double eps, NormRowsOut y,
                  NormFp8Out fp8) {
  normForward<false>(stream, rows, hidden, x, weight, nullptr, eps, y, fp8);
}

void rmsNormBackward(cudaStream_t stream, int64_t rows, int64_t hidden,
                     NormRows x, const float *weight, NormRows dy, double eps,
                     NormRowsOut dx, float *dweight, void *scratch) {
  normBackward<false>(stream, rows, hidden, x, weight, dy, eps, dx, dweight,
                      nullptr, scratch);
}

} // namespace mtrt::cuda
