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

/// Metas one fp8UpdateMetas launch takes: their pointers travel as the
/// kernel's parameters (kFp8UpdateBatch * 25 bytes, inside the 4 KiB
/// every CUDA version takes).
constexpr int kFp8UpdateBatch = 128;

/// Delayed scaling's fp8_update (core/Fp8State.h's Fp8State::update) for
/// `count` metas (at most kFp8UpdateBatch) in one launch, a thread each:
/// *amax becomes the newest of history[0, length), and *scale is computed
/// from the newest or largest of it, kept when that amax is 0 or not
/// finite. This is what a training step's run of fp8_update instructions
/// does, without a launch per meta (288 of them at gpt-1.3b, 1.25 ms a
/// step: bench/NOTES.md, session 20).
struct Fp8UpdateBatch {
  const float *amax[kFp8UpdateBatch];
  float *scale[kFp8UpdateBatch];
  float *history[kFp8UpdateBatch];
  fp8::Format format[kFp8UpdateBatch];
  int count = 0;
};
void fp8UpdateMetas(cudaStream_t stream, const Fp8UpdateBatch &batch,
                    int length, fp8::AmaxAlgorithm algorithm, int margin);

/// *inverseX = 1 / *scaleX, *inverseW = 1 / *scaleW (in float, as the
/// host's fp8_linear divides).
void fp8InverseScales(cudaStream_t stream, const float *scaleX,
                      const float *scaleW, float *inverseX, float *inverseW);

/// Floats between two entries of fp8InverseTable's table: cuBLASLt takes
/// only 16-byte aligned scale pointers.
constexpr size_t kFp8InverseTableStride = 4;

/// table[kFp8InverseTableStride * i] = 1 / scales[i] for i < count (as
/// fp8InverseScales divides): the FP8 GEMMs' inverse scales of every meta
/// at once. `table` is 16-byte aligned.
void fp8InverseTable(cudaStream_t stream, int64_t count, const float *scales,
                     float *table);

/// castToFp8 of x [rows, cols] (codes, with the amax into *amax, which the
/// caller zeroes) that also writes the codes transposed, [cols, rows]: an
/// output gradient's cast for its data gradient and its weight gradient
/// (k-contiguous both), a weight's for its forward product and its data
/// gradient. False, with nothing launched, where rows and cols
/// are not multiples of 16 or a pointer is not 16-byte aligned.
bool castToFp8Transposed(cudaStream_t stream, int64_t rows, int64_t cols,
                         InElements x, uint8_t *codes, uint8_t *transposed,
                         fp8::Format format, const float *scale, float *amax);

/// y [cols, rows] = x [rows, cols]^T, bytes (FP8 codes).
void transposeBytes(cudaStream_t stream, int64_t rows, int64_t cols,
                    const uint8_t *x, uint8_t *y);

} // namespace mtrt::cuda

#endif // MTRT_SRC_CUDA_KERNELS_FP8SCALING_H
