// Test helpers for the CUDA backend: skipping without a GPU, deterministic
// inputs, and comparisons of device results with the host backend's.
#ifndef MTRT_TEST_CUDA_CUDATESTSUPPORT_H
#define MTRT_TEST_CUDA_CUDATESTSUPPORT_H

#include "core/Bundle.h"
#include "core/Error.h"
#include "core/Random.h"
#include "cuda/Context.h"
#include "host/HostTensor.h"

#include "gtest/gtest.h"

#include <cuda_runtime_api.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <fstream>
#include <string>

namespace mtrt::test {

/// Why the GPU tests cannot run on this machine ("no CUDA device:
/// cudaGetDeviceCount returned cudaErrorNoDevice (no CUDA-capable device is
/// detected)"), or "" when a CUDA device is visible.
inline std::string noGpuReason() {
  int count = 0;
  cudaError_t error = cudaGetDeviceCount(&count);
  if (error != cudaSuccess) {
    (void)cudaGetLastError();
    return std::string("no CUDA device: cudaGetDeviceCount returned ") +
           cudaGetErrorName(error) + " (" + cudaGetErrorString(error) + ")";
  }
  if (count == 0)
    return "no CUDA device: cudaGetDeviceCount returned 0 devices";
  return "";
}

/// Skips the current test, with the reason on the output, on a machine
/// without a CUDA device (CI); these tests run through the device tool.
#define MTRT_REQUIRE_GPU()                                                     \
  do {                                                                         \
    std::string mtrtNoGpu = ::mtrt::test::noGpuReason();                       \
    if (!mtrtNoGpu.empty())                                                    \
      GTEST_SKIP() << mtrtNoGpu                                                \
                   << "; the cuda backend's GPU tests are skipped";            \
  } while (false)

/// A fixture whose tests need a GPU: skipped without one, else given a
/// context (fp32 GEMMs without TF32, comparable with the host).
class CudaTest : public ::testing::Test {
protected:
  void SetUp() override {
    MTRT_REQUIRE_GPU();
    cuda::ContextOptions options;
    const char *sync = std::getenv("MTRT_CUDA_SYNC");
    options.syncEachInstruction = sync && std::string(sync) == "1";
    context = std::make_unique<cuda::Context>(options);
  }
  std::unique_ptr<cuda::Context> context;
};

/// Reads element i of an f32 or f64 tensor as double.
inline double elementAt(const host::Tensor &t, int64_t i) {
  return t.dtype == DType::F64 ? t.data<double>()[i]
                               : static_cast<double>(t.data<float>()[i]);
}

/// The largest |a - b| over all elements, divided by the largest |b|
/// (b is the reference); 0 when both are all zeros.
inline double relativeDifference(const host::Tensor &a, const host::Tensor &b) {
  double largestDifference = 0, largest = 0;
  for (int64_t i = 0; i < b.numElements(); ++i) {
    largestDifference =
        std::max(largestDifference, std::abs(elementAt(a, i) - elementAt(b, i)));
    largest = std::max(largest, std::abs(elementAt(b, i)));
  }
  return largest > 0 ? largestDifference / largest : largestDifference;
}

/// Cosine similarity of two tensors of one shape, in double.
inline double cosineSimilarity(const host::Tensor &a, const host::Tensor &b) {
  double dot = 0, aa = 0, bb = 0;
  for (int64_t i = 0; i < b.numElements(); ++i) {
    double x = elementAt(a, i), y = elementAt(b, i);
    dot += x * y;
    aa += x * x;
    bb += y * y;
  }
  return aa > 0 && bb > 0 ? dot / std::sqrt(aa * bb) : (aa == bb ? 1.0 : 0.0);
}

/// Expects `actual` to have `expected`'s shape and type and to agree within
/// `tolerance` relative to the largest magnitude of `expected`; NaN never
/// passes.
inline void expectClose(const host::Tensor &actual,
                        const host::Tensor &expected, double tolerance,
                        const std::string &what) {
  ASSERT_EQ(actual.shape, expected.shape) << what;
  ASSERT_EQ(actual.dtype, expected.dtype) << what;
  for (int64_t i = 0; i < actual.numElements(); ++i)
    ASSERT_FALSE(std::isnan(elementAt(actual, i)))
        << what << ": NaN at element " << i;
  double difference = relativeDifference(actual, expected);
  EXPECT_LE(difference, tolerance)
      << what << ": relative difference " << difference << " over "
      << actual.numElements() << " elements";
}

/// A float tensor of `shape` with normals * scale, keyed on `seed` (never
/// zeros: they hide unwritten outputs and wrong indexing).
inline host::Tensor randomTensor(std::vector<int64_t> shape, uint64_t seed,
                                 double scale = 1.0) {
  host::Tensor t(DType::F32, std::move(shape));
  for (int64_t i = 0; i < t.numElements(); ++i)
    t.data<float>()[i] = static_cast<float>(
        scale * random::normal(seed, 17, static_cast<uint64_t>(i)));
  return t;
}

/// Ids in [0, limit) as i32 or i64, keyed on `seed`.
inline host::Tensor randomIds(std::vector<int64_t> shape, int64_t limit,
                              uint64_t seed, DType dtype = DType::I32) {
  host::Tensor t(dtype, std::move(shape));
  for (int64_t i = 0; i < t.numElements(); ++i) {
    auto id = static_cast<int64_t>(random::randomBits(seed, 29, i) %
                                   static_cast<uint64_t>(limit));
    if (dtype == DType::I64)
      t.data<int64_t>()[i] = id;
    else
      t.data<int32_t>()[i] = static_cast<int32_t>(id);
  }
  return t;
}

inline host::TensorView viewOf(const host::Tensor &t) {
  return {t.dtype, t.shape, t.buffer.data()};
}

/// The multi-rank tests' corpus (about 40 KB of numbered sentences), the
/// same for every layout they compare.
inline std::string multiRankCorpus() {
  std::string text;
  for (int i = 0; text.size() < 40000; ++i)
    text += "The quick brown fox " + std::to_string(i * 7919 % 101) +
            " jumps over the lazy dog. ";
  return text;
}

/// Where the compiled test bundles are: $MTRT_CUDA_TEST_BUNDLES, else the
/// build's bundles/ folder (runtime/test/cuda/README.md says how to make
/// them).
inline std::string bundleDirectory() {
  if (const char *dir = std::getenv("MTRT_CUDA_TEST_BUNDLES"))
    return dir;
  return MTRT_CUDA_TEST_BUNDLES_DEFAULT;
}

inline bool fileExists(const std::string &path) {
  return std::ifstream(path).good();
}

/// The path of the compiled test bundle `name` (`name`.mtb in
/// bundleDirectory()). A missing file throws, failing the test with the
/// path, `howToMake` (the compile flags, where the test names them) and
/// where the bundles come from.
inline std::string testBundlePath(const std::string &name,
                                  const std::string &howToMake = "") {
  std::string path = bundleDirectory() + "/" + name + ".mtb";
  if (!fileExists(path))
    throw Error(MTRT_STATUS_NOT_FOUND,
                "missing " + path + ": " +
                    (howToMake.empty() ? "" : howToMake + "; ") +
                    "bench/make-device-dir.sh compiles every test bundle "
                    "(runtime/test/cuda/README.md), or point "
                    "MTRT_CUDA_TEST_BUNDLES at a folder holding it");
  return path;
}

/// The compiled test bundle `name`, loaded (testBundlePath's failure when
/// it is missing).
inline Bundle loadTestBundle(const std::string &name,
                             const std::string &howToMake = "") {
  return Bundle::load(testBundlePath(name, howToMake));
}

} // namespace mtrt::test

#endif // MTRT_TEST_CUDA_CUDATESTSUPPORT_H
