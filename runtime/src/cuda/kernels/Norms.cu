// Layer norm and RMS norm, forward and backward, and bias gradients: row
// statistics and parameter-gradient column sums in double, as on the host.
// Compiled without FMA contraction (CMakeLists.txt), so each float product
// and sum rounds like the host's.
#include "cuda/kernels/KernelSupport.cuh"

namespace mtrt::cuda {

namespace {

using detail::blockSum;

constexpr int kNormThreads = 256;
/// Rows per partial sum of the column sums.
constexpr int64_t kRowsPerChunk = 64;

int64_t chunksFor(int64_t rows) {
  return std::max<int64_t>(1, (rows + kRowsPerChunk - 1) / kRowsPerChunk);
}

/// partial[c, j] = sum over rows of chunk c, in increasing order, of
/// double(term(r, j)).
template <typename Term>
__global__ void columnPartialsKernel(int64_t rows, int64_t hidden, Term term,
                                     double *partial) {
  int64_t j = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  int64_t chunk = blockIdx.y;
  if (j >= hidden)
    return;
  int64_t begin = chunk * kRowsPerChunk;
  int64_t end = detail::imin(rows, begin + kRowsPerChunk);
  double sum = 0;
  for (int64_t r = begin; r < end; ++r)
    sum += static_cast<double>(term(r, j));
  partial[chunk * hidden + j] = sum;
}

/// out[j] = float(sum over chunks, in order, of partial[c, j]).
__global__ void columnTotalsKernel(int64_t chunks, int64_t hidden,
                                   const double *partial, float *out) {
  int64_t j = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (j >= hidden)
    return;
  double sum = 0;
  for (int64_t c = 0; c < chunks; ++c)
    sum += partial[c * hidden + j];
  out[j] = static_cast<float>(sum);
}

template <typename Term>
void columnSums(cudaStream_t stream, int64_t rows, int64_t hidden, Term term,
                float *out, void *scratch) {
  if (hidden <= 0)
    return;
  int64_t chunks = chunksFor(rows);
  auto *partial = static_cast<double *>(scratch);
  unsigned columnBlocks =
      static_cast<unsigned>((hidden + detail::kThreads - 1) / detail::kThreads);
  if (rows > 0) {
    columnPartialsKernel<<<dim3(columnBlocks, static_cast<unsigned>(chunks)),
                           detail::kThreads, 0, stream>>>(rows, hidden, term,
                                                          partial);
  } else {
    cudaMemsetAsync(partial, 0, sizeof(double) * hidden, stream);
    chunks = 1;
  }
  columnTotalsKernel<<<columnBlocks, detail::kThreads, 0, stream>>>(
      chunks, hidden, partial, out);
}

struct DyTerm {
  const float *dy;
  int64_t hidden;
  __device__ float operator()(int64_t r, int64_t j) const {
    return dy[r * hidden + j];
  }
};

struct LayerNormWeightTerm {
  const float *x, *dy, *mean, *rstd;
  int64_t hidden;
  __device__ float operator()(int64_t r, int64_t j) const {
    float xhat = (x[r * hidden + j] - mean[r]) * rstd[r];
    return dy[r * hidden + j] * xhat;
  }
};

struct RmsNormWeightTerm {
  const float *x, *dy, *rstd;
  int64_t hidden;
  __device__ float operator()(int64_t r, int64_t j) const {
    return dy[r * hidden + j] * (x[r * hidden + j] * rstd[r]);
  }
};

__global__ void layerNormForwardKernel(int64_t hidden, const float *x,
                                       const float *weight, const float *bias,
                                       double eps, float *y, float *mean,
                                       float *rstd) {
  __shared__ double shared[kNormThreads / detail::kWarp];
  int64_t r = blockIdx.x;
  const float *xr = x + r * hidden;
  double sum = 0;
  for (int64_t j = threadIdx.x; j < hidden; j += blockDim.x)
    sum += xr[j];
  double mu = blockSum(sum, shared) / static_cast<double>(hidden);
  double squares = 0;
  for (int64_t j = threadIdx.x; j < hidden; j += blockDim.x) {
    double d = xr[j] - mu;
    squares += d * d;
  }
  double variance = blockSum(squares, shared) / static_cast<double>(hidden);
  float meanT = static_cast<float>(mu);
  float rstdT = static_cast<float>(1.0 / sqrt(variance + eps));
  if (threadIdx.x == 0) {
    mean[r] = meanT;
    rstd[r] = rstdT;
  }
  if (!y)
    return;
  float *yr = y + r * hidden;
  for (int64_t j = threadIdx.x; j < hidden; j += blockDim.x) {
    float value = (xr[j] - meanT) * rstdT * weight[j];
    yr[j] = bias ? value + bias[j] : value;
  }
}

__global__ void layerNormBackwardKernel(int64_t hidden, const float *x,
                                        const float *weight, const float *mean,
                                        const float *rstd, const float *dy,
                                        float *dx) {
  __shared__ double shared[kNormThreads / detail::kWarp];
  int64_t r = blockIdx.x;
  const float *xr = x + r * hidden, *dyr = dy + r * hidden;
  float meanR = mean[r], rstdR = rstd[r];
  double sumG = 0, sumGXhat = 0;
  for (int64_t j = threadIdx.x; j < hidden; j += blockDim.x) {
    float g = dyr[j] * weight[j];
    float xhat = (xr[j] - meanR) * rstdR;
    sumG += g;
    sumGXhat += static_cast<double>(g) * xhat;
  }
  sumG = blockSum(sumG, shared);
  sumGXhat = blockSum(sumGXhat, shared);
  float meanG = static_cast<float>(sumG / static_cast<double>(hidden));
  float meanGXhat = static_cast<float>(sumGXhat / static_cast<double>(hidden));
  float *dxr = dx + r * hidden;
  for (int64_t j = threadIdx.x; j < hidden; j += blockDim.x) {
    float g = dyr[j] * weight[j];
    float xhat = (xr[j] - meanR) * rstdR;
    dxr[j] = rstdR * (g - meanG - xhat * meanGXhat);
  }
}

__global__ void rmsNormForwardKernel(int64_t hidden, const float *x,
                                     const float *weight, double eps, float *y,
                                     float *rstd) {
  __shared__ double shared[kNormThreads / detail::kWarp];
  int64_t r = blockIdx.x;
  const float *xr = x + r * hidden;
  double squares = 0;
  for (int64_t j = threadIdx.x; j < hidden; j += blockDim.x)
    squares += static_cast<double>(xr[j]) * xr[j];
  double meanSquare = blockSum(squares, shared) / static_cast<double>(hidden);
  float rstdT = static_cast<float>(1.0 / sqrt(meanSquare + eps));
  if (threadIdx.x == 0)
    rstd[r] = rstdT;
  if (!y)
    return;
  float *yr = y + r * hidden;
  for (int64_t j = threadIdx.x; j < hidden; j += blockDim.x)
    yr[j] = xr[j] * rstdT * weight[j];
}

__global__ void rmsNormBackwardKernel(int64_t hidden, const float *x,
                                      const float *weight, const float *rstd,
                                      const float *dy, float *dx) {
  __shared__ double shared[kNormThreads / detail::kWarp];
  int64_t r = blockIdx.x;
  const float *xr = x + r * hidden, *dyr = dy + r * hidden;
  float rstdR = rstd[r];
  double sumGXhat = 0;
  for (int64_t j = threadIdx.x; j < hidden; j += blockDim.x)
    sumGXhat += static_cast<double>(dyr[j] * weight[j]) * (xr[j] * rstdR);
  sumGXhat = blockSum(sumGXhat, shared);
  float meanGXhat = static_cast<float>(sumGXhat / static_cast<double>(hidden));
  float *dxr = dx + r * hidden;
  for (int64_t j = threadIdx.x; j < hidden; j += blockDim.x) {
    float g = dyr[j] * weight[j];
    dxr[j] = rstdR * (g - xr[j] * rstdR * meanGXhat);
  }
}

unsigned rowBlocks(int64_t rows) { return static_cast<unsigned>(rows); }

} // namespace

size_t columnSumScratchBytes(int64_t rows, int64_t hidden) {
  return sizeof(double) * static_cast<size_t>(chunksFor(rows)) *
         static_cast<size_t>(std::max<int64_t>(hidden, 1));
}

void layerNormForward(cudaStream_t stream, int64_t rows, int64_t hidden,
                      const float *x, const float *weight, const float *bias,
                      double eps, float *y, float *mean, float *rstd) {
  if (rows > 0)
    layerNormForwardKernel<<<rowBlocks(rows), kNormThreads, 0, stream>>>(
        hidden, x, weight, bias, eps, y, mean, rstd);
}

void layerNormBackward(cudaStream_t stream, int64_t rows, int64_t hidden,
                       const float *x, const float *weight, const float *mean,
                       const float *rstd, const float *dy, float *dx,
                       float *dweight, float *dbias, void *scratch) {
  if (rows > 0 && dx)
    layerNormBackwardKernel<<<rowBlocks(rows), kNormThreads, 0, stream>>>(
        hidden, x, weight, mean, rstd, dy, dx);
  if (dweight)
    columnSums(stream, rows, hidden,
               LayerNormWeightTerm{x, dy, mean, rstd, hidden}, dweight,
               scratch);
  if (dbias)
    columnSums(stream, rows, hidden, DyTerm{dy, hidden}, dbias,
               static_cast<char *>(scratch) +
                   columnSumScratchBytes(rows, hidden));
}

void rmsNormForward(cudaStream_t stream, int64_t rows, int64_t hidden,
                    const float *x, const float *weight, double eps, float *y,
                    float *rstd) {
  if (rows > 0)
    rmsNormForwardKernel<<<rowBlocks(rows), kNormThreads, 0, stream>>>(
        hidden, x, weight, eps, y, rstd);
}

void rmsNormBackward(cudaStream_t stream, int64_t rows, int64_t hidden,
                     const float *x, const float *weight, const float *rstd,
                     const float *dy, float *dx, float *dweight,
                     void *scratch) {
  if (rows > 0 && dx)
    rmsNormBackwardKernel<<<rowBlocks(rows), kNormThreads, 0, stream>>>(
        hidden, x, weight, rstd, dy, dx);
  if (dweight)
    columnSums(stream, rows, hidden, RmsNormWeightTerm{x, dy, rstd, hidden},
               dweight, scratch);
}

void biasGrad(cudaStream_t stream, int64_t rows, int64_t out, const float *dy,
              float *dbias, void *scratch) {
  columnSums(stream, rows, out, DyTerm{dy, out}, dbias, scratch);
}

} // namespace mtrt::cuda
