// FP8 training's small kernels (Fp8Scaling.cu, issue 26): a tensor's amax,
// scales from amaxes with core/Fp8.h's arithmetic, delayed scaling's
// update, the FP8 GEMMs' inverse scales and byte transposes.
#ifndef MTRT_SRC_CUDA_KERNELS_FP8SCALING_H
#define MTRT_SRC_CUDA_KERNELS_FP8SCALING_H

#include "cuda/kernels/Kernels.h"

namespace mtrt::cuda {

/// *amax = max(*amax, the largest |x[i]|) (NaN if any x[i] is): the caller
/// sets *amax to 0 first.
void fp8Amax(cudaStream_t stream, int64_t n, InElements x, float *amax);

/// *scale = fp8::scaleFromAmax(*amax, 1, format, margin): tensorwise
/// (current) scaling's scale.
void fp8ScaleFromAmax(cudaStream_t stream, const float *amax, float *scale,
                      fp8::Format format, int margin);

/// Delayed scaling's fp8_update (core/Fp8State.h's Fp8State::update): *amax
/// becomes the newest of history[0, length), and *scale is computed from
/// the newest or largest of it, kept when that amax is 0 or not finite.
void fp8UpdateMeta(cudaStream_t stream, const float *amax, float *scale,
                   float *history, int length, fp8::AmaxAlgorithm algorithm,
                   fp8::Format format, int margin);

/// *inverseX = 1 / *scaleX, *inverseW = 1 / *scaleW (in float, as the
/// host's fp8_linear divides).
void fp8InverseScales(cudaStream_t stream, const float *scaleX,
                      const float *scaleW, float *inverseX, float *inverseW);

/// y [cols, rows] = x [rows, cols]^T, bytes (FP8 codes).
void transposeBytes(cudaStream_t stream, int64_t rows, int64_t cols,
                    const uint8_t *x, uint8_t *y);

} // namespace mtrt::cuda

#endif // MTRT_SRC_CUDA_KERNELS_FP8SCALING_H
