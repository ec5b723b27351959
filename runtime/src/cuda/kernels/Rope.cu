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
  if (work > 0 && fits32)
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
