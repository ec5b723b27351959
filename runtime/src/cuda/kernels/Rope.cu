// Rotate-half rotary position embedding, forward and inverse, with the host's
// angle table (computed in double, rounded to float). Compiled without FMA
// contraction (CMakeLists.txt), so each rotation rounds like the host's.
// x and y fp32 or bf16 each; the rotation is computed in fp32.
#include "core/OpScratch.h"
#include "cuda/kernels/KernelSupport.cuh"

namespace mtrt::cuda {

namespace {

/// cosines[s * half + i], sines[s * half + i] for the angle
/// position(s) * ropeInverseFrequency(i), times the attention factor, as
/// host ropeTables (row s at its global position under context
/// parallelism).
__global__ void ropeTableKernel(int64_t seq, int64_t half, int64_t rotaryDim,
                                RopeFrequencies frequencies, ContextTile rows,
                                float *cosines, float *sines) {
  MTRT_GRID_STRIDE(e, seq * half) {
    int64_t s = e / half, i = e % half;
    double inverseFrequency = ropeInverseFrequency(frequencies, i, rotaryDim);
    double angle =
        static_cast<double>(contextGlobalPosition(rows, s)) * inverseFrequency;
    cosines[e] = static_cast<float>(frequencies.attentionFactor * cos(angle));
    sines[e] = static_cast<float>(frequencies.attentionFactor * sin(angle));
  }
}

// Work item t of a row: t < half rotates the pair (t, t + half); the others
// copy feature rotaryDim + (t - half), which passes through. Index is
// uint32_t where every element index fits (the divisions that map an item
// to its row and position cost several times more in 64 bits, and were the
// kernel's cost: llama-1.5b's rope ran at a sixth of its memory traffic's
// speed), else int64_t; the arithmetic on the values is the same.
template <typename Index>
__global__ void ropeKernel(Index rows, Index seq, Index heads, Index headDim,
                           Index rotaryDim, const float *cosines,
                           const float *sines, float direction, InElements x,
                           OutElements y) {
  const Index half = rotaryDim / 2;
  const Index perRow = half + (headDim - rotaryDim);
  const Index items = rows * perRow;
  const Index stride = static_cast<Index>(gridDim.x) * blockDim.x;
  for (Index e = static_cast<Index>(blockIdx.x) * blockDim.x + threadIdx.x;
       e < items; e += stride) {
    const Index row = e / perRow, t = e - row * perRow;
    const Index r = row * headDim;
    if (t < half) {
      const Index s = (row / heads) % seq;
      float c = cosines[s * half + t];
      float sine = direction * sines[s * half + t];
      float x1 = detail::load(x, r + t), x2 = detail::load(x, r + t + half);
      detail::store(y, r + t, x1 * c - x2 * sine);
      detail::store(y, r + t + half, x2 * c + x1 * sine);
    } else {
      const Index f = r + rotaryDim + (t - half);
      detail::store(y, f, detail::load(x, f));
    }
  }
}

/// ropeKernel for bf16 x and y in groups of eight: work item t of a row
/// rotates the pairs (8t + i, 8t + i + half) for i < 8 when t < half / 8,
/// else copies the eight features 8 (t - half / 8) past rotaryDim, each in
/// 16-byte accesses (the angle tables' in two float4 each), with the scalar
/// kernel's arithmetic. Needs half and headDim - rotaryDim multiples of 8
/// and 16-byte aligned x, y (ropeBf16Octets). (Element by element, the
/// kernel moved 2 bytes an access: llama-1.5b's q rope ran at 1.1 TB/s.)
template <typename Index>
__global__ void
ropeBf16OctetKernel(Index rows, Index seq, Index heads, Index headDim,
                    Index rotaryDim, const float *cosines, const float *sines,
                    float direction, const __nv_bfloat16 *x, __nv_bfloat16 *y) {
  const Index half = rotaryDim / 2, groups = half / 8;
  const Index perRow = groups + (headDim - rotaryDim) / 8;
  const Index items = rows * perRow;
  const Index stride = static_cast<Index>(gridDim.x) * blockDim.x;
  auto unpack = [](uint4 raw, float (&out)[8]) {
    const unsigned words[4] = {raw.x, raw.y, raw.z, raw.w};
#pragma unroll
    for (int k = 0; k < 4; ++k) {
      out[2 * k] = __uint_as_float(words[k] << 16);
      out[2 * k + 1] = __uint_as_float(words[k] & 0xffff0000u);
    }
  };
  auto pack = [](const float (&in)[8]) {
    unsigned words[4];
#pragma unroll
    for (int k = 0; k < 4; ++k) {
      __nv_bfloat162 pair = __floats2bfloat162_rn(in[2 * k], in[2 * k + 1]);
      words[k] = *reinterpret_cast<unsigned *>(&pair);
    }
    return make_uint4(words[0], words[1], words[2], words[3]);
  };
  for (Index e = static_cast<Index>(blockIdx.x) * blockDim.x + threadIdx.x;
       e < items; e += stride) {
    const Index row = e / perRow, t = e - row * perRow;
    const Index r = row * headDim;
    if (t < groups) {
      const Index s = (row / heads) % seq, at = s * half + 8 * t;
      const auto *c4 = reinterpret_cast<const float4 *>(cosines + at);
      const auto *s4 = reinterpret_cast<const float4 *>(sines + at);
      const float4 c0 = c4[0], c1 = c4[1], s0 = s4[0], s1 = s4[1];
      const float c[8] = {c0.x, c0.y, c0.z, c0.w, c1.x, c1.y, c1.z, c1.w};
      const float sn[8] = {s0.x, s0.y, s0.z, s0.w, s1.x, s1.y, s1.z, s1.w};
      float x1[8], x2[8], o1[8], o2[8];
      unpack(*reinterpret_cast<const uint4 *>(x + r + 8 * t), x1);
      unpack(*reinterpret_cast<const uint4 *>(x + r + half + 8 * t), x2);
#pragma unroll
      for (int i = 0; i < 8; ++i) {
        float sine = direction * sn[i];
        o1[i] = x1[i] * c[i] - x2[i] * sine;
        o2[i] = x2[i] * c[i] + x1[i] * sine;
      }
      *reinterpret_cast<uint4 *>(y + r + 8 * t) = pack(o1);
      *reinterpret_cast<uint4 *>(y + r + half + 8 * t) = pack(o2);
    } else {
      const Index f = r + rotaryDim + 8 * (t - groups);
      *reinterpret_cast<uint4 *>(y + f) =
          *reinterpret_cast<const uint4 *>(x + f);
    }
  }
}

/// Whether ropeBf16OctetKernel takes these shapes and storage.
bool ropeBf16Octets(int64_t headDim, int64_t rotaryDim, InElements x,
                    OutElements y) {
  return x.bf16 && y.bf16 && (rotaryDim / 2) % 8 == 0 &&
         (headDim - rotaryDim) % 8 == 0 && detail::vectorizable(x.data) &&
         detail::vectorizable(y.data);
}

} // namespace

size_t ropeScratchBytes(int64_t seq, int64_t rotaryDim) {
  return mtrt::scratch::ropeTableBytes(seq, rotaryDim);
}

void rope(cudaStream_t stream, int64_t batch, int64_t seq, int64_t heads,
          int64_t headDim, int64_t rotaryDim,
          const RopeFrequencies &frequencies, bool inverse,
          InElements x, OutElements y, void *scratch,
          const ContextTile &positions) {
  int64_t rows = batch * seq * heads;
  int64_t half = rotaryDim / 2;
  if (rows <= 0 || headDim <= 0)
    return;
  auto *cosines = static_cast<float *>(scratch);
  float *sines = cosines + std::max<int64_t>(1, seq * half);
  if (half > 0)
    ropeTableKernel<<<detail::blocksFor(seq * half), detail::kThreads, 0,
                      stream>>>(seq, half, rotaryDim, frequencies, positions,
                                cosines, sines);
  int64_t work = rows * (half + (headDim - rotaryDim));
  float direction = inverse ? -1.0f : 1.0f;
  // Every element index (rows * headDim) and item below 2^32 - stride.
  bool fits32 = rows * headDim < (int64_t(1) << 31) &&
                seq * half < (int64_t(1) << 31);
  if (work > 0 && fits32 && ropeBf16Octets(headDim, rotaryDim, x, y))
    ropeBf16OctetKernel<uint32_t>
        <<<detail::blocksFor(work / 8), detail::kThreads, 0, stream>>>(
            static_cast<uint32_t>(rows), static_cast<uint32_t>(seq),
            static_cast<uint32_t>(heads), static_cast<uint32_t>(headDim),
            static_cast<uint32_t>(rotaryDim), cosines, sines, direction,
            static_cast<const __nv_bfloat16 *>(x.data),
            static_cast<__nv_bfloat16 *>(y.data));
  else if (work > 0 && fits32)
    ropeKernel<uint32_t><<<detail::blocksFor(work), detail::kThreads, 0,
                           stream>>>(
        static_cast<uint32_t>(rows), static_cast<uint32_t>(seq),
        static_cast<uint32_t>(heads), static_cast<uint32_t>(headDim),
        static_cast<uint32_t>(rotaryDim), cosines, sines, direction, x, y);
  else if (work > 0)
    ropeKernel<int64_t><<<detail::blocksFor(work), detail::kThreads, 0,
                          stream>>>(rows, seq, heads, headDim, rotaryDim,
                                    cosines, sines, direction, x, y);
}

} // namespace mtrt::cuda
