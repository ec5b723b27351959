// Rotate-half rotary position embedding, forward and inverse, with the host's
// angle table (computed in double, rounded to float). Compiled without FMA
// contraction (CMakeLists.txt), so each rotation rounds like the host's.
// x and y fp32 or bf16 each; the rotation is computed in fp32.
#include "core/OpScratch.h"
#include "cuda/kernels/KernelSupport.cuh"

namespace mtrt::cuda {

namespace {

/// cosines[s * half + i], sines[s * half + i] for the angle
/// s * ropeInverseFrequency(i), times the attention factor, as host
/// ropeTables.
__global__ void ropeTableKernel(int64_t seq, int64_t half, int64_t rotaryDim,
                                RopeFrequencies frequencies, float *cosines,
                                float *sines) {
  MTRT_GRID_STRIDE(e, seq * half) {
    int64_t s = e / half, i = e % half;
    double inverseFrequency = ropeInverseFrequency(frequencies, i, rotaryDim);
    double angle = static_cast<double>(s) * inverseFrequency;
    cosines[e] = static_cast<float>(frequencies.attentionFactor * cos(angle));
    sines[e] = static_cast<float>(frequencies.attentionFactor * sin(angle));
  }
}

// Work item t of a row: t < half rotates the pair (t, t + half); the others
// copy feature rotaryDim + (t - half), which passes through.
__global__ void ropeKernel(int64_t rows, int64_t seq, int64_t heads,
                           int64_t headDim, int64_t rotaryDim,
                           const float *cosines, const float *sines,
                           float direction, InElements x, OutElements y) {
  int64_t half = rotaryDim / 2;
  int64_t perRow = half + (headDim - rotaryDim);
  MTRT_GRID_STRIDE(e, rows * perRow) {
    int64_t row = e / perRow, t = e % perRow;
    int64_t r = row * headDim;
    if (t < half) {
      int64_t s = (row / heads) % seq;
      float c = cosines[s * half + t];
      float sine = direction * sines[s * half + t];
      float x1 = detail::load(x, r + t), x2 = detail::load(x, r + t + half);
      detail::store(y, r + t, x1 * c - x2 * sine);
      detail::store(y, r + t + half, x2 * c + x1 * sine);
    } else {
      int64_t f = r + rotaryDim + (t - half);
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
          InElements x, OutElements y, void *scratch) {
  int64_t rows = batch * seq * heads;
  int64_t half = rotaryDim / 2;
  if (rows <= 0 || headDim <= 0)
    return;
  auto *cosines = static_cast<float *>(scratch);
  float *sines = cosines + std::max<int64_t>(1, seq * half);
  if (half > 0)
    ropeTableKernel<<<detail::blocksFor(seq * half), detail::kThreads, 0,
                      stream>>>(seq, half, rotaryDim, frequencies, cosines,
                                sines);
  int64_t work = rows * (half + (headDim - rotaryDim));
  if (work > 0)
    ropeKernel<<<detail::blocksFor(work), detail::kThreads, 0, stream>>>(
        rows, seq, heads, headDim, rotaryDim, cosines, sines,
        inverse ? -1.0f : 1.0f, x, y);
}

} // namespace mtrt::cuda
