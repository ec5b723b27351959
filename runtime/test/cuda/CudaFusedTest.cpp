// The generated kernels of mt.fused groups (format version 7) against the
// host backend, which runs each group's ops one by one: fused-ops.mtb
// (runtime/test/cuda/data/fused-ops.mlir, written by megatron-translate)
// holds every op a group may hold; in fp32 dropout, add and mul give the
// host's bits (no FMA contraction), SiLU and SwiGLU agree within 1e-5; in a
// bf16 bundle the values between groups are held in bf16.
#include "BundleTestBuilder.h"
#include "CudaTestSupport.h"

#include "cuda/Executor.h"
#include "cuda/ParameterStore.h"
#include "host/Executor.h"
#include "host/ParameterStore.h"
#include "host/ThreadPool.h"

#include <cstring>
#include <fstream>
#include <iostream>
#include <iterator>

using namespace mtrt;
using namespace mtrt::test;

namespace {

const char *const kHowToMake =
    "write it with megatron-translate --mlir-to-bundle "
    "runtime/test/cuda/data/fused-ops.mlir -o fused-ops.mtb";

TEST(CudaFusedTest, GeneratedKernelsMatchTheHost) {
  MTRT_REQUIRE_GPU();
  Bundle bundle = loadTestBundle("fused-ops", kHowToMake);
  ASSERT_EQ(bundle.fusedKernels().names.size(), 7u);
  ASSERT_TRUE(bundle.fusedKernels().typeMask);
  ASSERT_TRUE(bundle.fusedKernels().sampleKeys);
  host::ThreadPool pool(2);
  host::ParameterStore hostStore(bundle, DType::F32);
  cuda::Context context;
  cuda::ParameterStore deviceStore(bundle, context);
  host::Executor hostExecutor(bundle, "fused_ops", hostStore, pool);
  cuda::Executor deviceExecutor(bundle, "fused_ops", deviceStore);

  std::vector<host::Tensor> inputs;
  for (uint64_t seed : {1, 2, 3})
    inputs.push_back(randomTensor({4099}, seed));
  std::vector<host::TensorView> views;
  for (const host::Tensor &t : inputs)
    views.push_back(viewOf(t));
  for (uint64_t first : {0, 11, 12}) {
    std::vector<host::Tensor> expected = hostExecutor.run(views, {0, first});
    std::vector<host::Tensor> actual = deviceExecutor.run(views, {0, first});
    ASSERT_EQ(actual.size(), 4u);
    int64_t zeros = 0;
    for (size_t i = 0; i < actual.size(); ++i) {
      std::string what = "first sample " + std::to_string(first) +
                         ", outputs[" + std::to_string(i) + "]";
      ASSERT_EQ(actual[i].buffer.size(), expected[i].buffer.size()) << what;
      if (i == 3) { // SiLU and SwiGLU: expf against std::exp
        expectClose(actual[i], expected[i], 1e-5, what);
        continue;
      }
      EXPECT_EQ(std::memcmp(actual[i].buffer.data(), expected[i].buffer.data(),
                            actual[i].buffer.size()),
                0)
          << what << " differs from the host's bits";
      for (int64_t e = 0; e < actual[i].numElements(); ++e)
        zeros += elementAt(actual[i], e) == 0;
    }
    // Dropped elements exist (the masks are not all ones), about
    // 0.1 * 4099 * 2 + 0.625 * 4099 of them.
    EXPECT_GT(zeros, 2500);
    std::cout << "[ parity   ] fused kernels, first sample " << first
              << ": dropout + add + mul bit-identical to the host (" << zeros
              << " dropped elements), silu + swiglu within "
              << relativeDifference(actual[3], expected[3]) << "\n";
  }
}

// Tensors of whole samples (fused_rows): [6, 40, 24], whose pairs of groups
// of eight are four draws' positions each (one mapping, one sample key, the
// draws' counter stepped), and [5, 3, 8], whose pairs are not (groups of
// eight of two draws each, an odd group last): the host's bits, with the
// micro-batch's samples from 0 and from 5.
TEST(CudaFusedTest, GeneratedKernelsOnWholeSamples) {
  MTRT_REQUIRE_GPU();
  Bundle bundle = loadTestBundle("fused-ops", kHowToMake);
  host::ThreadPool pool(2);
  host::ParameterStore hostStore(bundle, DType::F32);
  cuda::Context context;
  cuda::ParameterStore deviceStore(bundle, context);
  host::Executor hostExecutor(bundle, "fused_rows", hostStore, pool);
  cuda::Executor deviceExecutor(bundle, "fused_rows", deviceStore);
  std::vector<host::Tensor> inputs;
  inputs.push_back(randomTensor({6, 40, 24}, 1));
  inputs.push_back(randomTensor({6, 40, 24}, 2));
  inputs.push_back(randomTensor({5, 3, 8}, 3));
  inputs.push_back(randomTensor({5, 3, 8}, 4));
  std::vector<host::TensorView> views;
  for (const host::Tensor &t : inputs)
    views.push_back(viewOf(t));
  for (uint64_t first : {0, 5}) {
    std::vector<host::Tensor> expected = hostExecutor.run(views, {0, first});
    std::vector<host::Tensor> actual = deviceExecutor.run(views, {0, first});
    ASSERT_EQ(actual.size(), 2u);
    for (size_t i = 0; i < actual.size(); ++i) {
      std::string what = "first sample " + std::to_string(first) +
                         ", outputs[" + std::to_string(i) + "]";
      ASSERT_EQ(actual[i].buffer.size(), expected[i].buffer.size()) << what;
      EXPECT_EQ(std::memcmp(actual[i].buffer.data(), expected[i].buffer.data(),
                            actual[i].buffer.size()),
                0)
          << what << " differs from the host's bits";
      int64_t zeros = 0;
      for (int64_t e = 0; e < actual[i].numElements(); ++e)
        zeros += elementAt(actual[i], e) == elementAt(inputs[2 * i + 1], e);
      EXPECT_GT(zeros, 0) << what << ": no element dropped";
    }
  }
}

/// A bundle file's manifest text and payload (parseManifest copies what it
/// keeps).
struct BundleFile {
  std::string manifest, payload;
};

BundleFile readBundleFile(const std::string &path) {
  std::ifstream in(path, std::ios::binary);
  std::string bytes((std::istreambuf_iterator<char>(in)),
                    std::istreambuf_iterator<char>());
  EXPECT_GE(bytes.size(), Bundle::kHeaderSize);
  uint64_t manifestLength = 0;
  std::memcpy(&manifestLength, bytes.data() + 16, sizeof(manifestLength));
  return {bytes.substr(Bundle::kHeaderSize, manifestLength),
          bytes.substr(Bundle::kHeaderSize + manifestLength)};
}

/// fused-ops.mtb as a version 7 bf16 bundle: its manifest given a model
/// with precision bf16, without its memory plans when `withoutPlans` (the
/// runtime then plans the arena itself: no result in place of an operand).
Bundle bf16FusedBundle(const std::string &path, bool withoutPlans) {
  BundleFile file = readBundleFile(path);
  Json manifest = Json::parse(file.manifest);
  manifest["model"] = modelJson(256, 8, 4, 2, 2);
  manifest["model"]["precision"] = "bf16";
  // A version 7 manifest: the runtime chooses which values to hold in bf16
  // (version 8 bundles declare them; CudaModelTest runs those). fused_chain's
  // dropouts have p = 0, since the runtime refuses a version 7 kernel's
  // dropout (OlderDropoutKernelsAreRefused).
  manifest["version"] = 7;
  if (withoutPlans)
    for (Json &function : manifest["functions"])
      function.erase("memory_plan");
  return Bundle::parseManifest("fused-ops-bf16", manifest.dump(),
                               file.payload);
}

// A version 7 to 9 bundle's kernels drew one dropout hash per element, the
// runtime draws one per four positions (version 10): their dropout is
// refused, naming the bundle's version and the fix; a version 10 manifest
// around the same kernels runs.
TEST(CudaFusedTest, OlderDropoutKernelsAreRefused) {
  MTRT_REQUIRE_GPU();
  std::string path = testBundlePath("fused-ops", kHowToMake);
  BundleFile file = readBundleFile(path);
  std::vector<host::Tensor> inputs;
  for (uint64_t seed : {1, 2, 3})
    inputs.push_back(randomTensor({4099}, seed));
  std::vector<host::TensorView> views;
  for (const host::Tensor &t : inputs)
    views.push_back(viewOf(t));
  for (int version : {9, 10}) {
    Json manifest = Json::parse(file.manifest);
    manifest["version"] = version;
    Bundle bundle =
        Bundle::parseManifest("fused-ops-v" + std::to_string(version),
                              manifest.dump(), file.payload);
    EXPECT_EQ(bundle.fusedKernels().fourPositionDraws, version >= 10);
    cuda::Context context;
    cuda::ParameterStore deviceStore(bundle, context);
    cuda::Executor deviceExecutor(bundle, "fused_ops", deviceStore);
    if (version >= 10) {
      EXPECT_EQ(deviceExecutor.run(views, {0, 0}).size(), 4u);
      continue;
    }
    try {
      deviceExecutor.run(views, {0, 0});
      ADD_FAILURE() << "a version 9 fused dropout ran";
    } catch (const Error &error) {
      std::string message = error.what();
      EXPECT_NE(message.find("(format version 9) draws one dropout hash per "
                             "element"),
                std::string::npos)
          << message;
      EXPECT_NE(message.find("recompile the bundle"), std::string::npos)
          << message;
    }
  }
}

// fused_chain in a bf16 bundle: its kernels take fp32 inputs and bf16
// values between the groups (the type mask), and agree with the host's fp32
// run within bf16 rounding. With the compiler's plan, the results computed
// in place of an operand whose chain ends in an fp32 output stay fp32: one
// value in bf16 (%t#1); planned by the runtime, three (%r#0, %t#0, %t#1).
TEST(CudaFusedTest, GeneratedKernelsReadAndWriteBf16Values) {
  MTRT_REQUIRE_GPU();
  std::string path = testBundlePath("fused-ops", kHowToMake);
  for (bool withoutPlans : {false, true}) {
    Bundle bundle = bf16FusedBundle(path, withoutPlans);
    host::ThreadPool pool(2);
    host::ParameterStore hostStore(bundle, DType::F32);
    cuda::Context context;
    cuda::ParameterStore deviceStore(bundle, context);
    host::Executor hostExecutor(bundle, "fused_chain", hostStore, pool);
    cuda::Executor deviceExecutor(bundle, "fused_chain", deviceStore);
    EXPECT_EQ(deviceExecutor.bf16ValueCount(), withoutPlans ? 3u : 1u);
    std::vector<host::Tensor> inputs;
    for (uint64_t seed : {4, 5, 6})
      inputs.push_back(randomTensor({4099}, seed));
    std::vector<host::TensorView> views;
    for (const host::Tensor &t : inputs)
      views.push_back(viewOf(t));
    for (uint64_t first : {0, 7}) {
      std::vector<host::Tensor> expected = hostExecutor.run(views, {0, first});
      std::vector<host::Tensor> actual = deviceExecutor.run(views, {0, first});
      ASSERT_EQ(actual.size(), 2u);
      for (size_t i = 0; i < actual.size(); ++i)
        expectClose(actual[i], expected[i], 2e-2,
                    std::string(withoutPlans ? "runtime" : "compiler") +
                        " plan, first sample " + std::to_string(first) +
                        ", outputs[" + std::to_string(i) + "]");
      std::cout << "[ parity   ] fused kernels in bf16 ("
                << deviceExecutor.bf16ValueCount() << " values in bf16, "
                << (withoutPlans ? "runtime" : "compiler")
                << " plan), first sample " << first << ": within "
                << std::max(relativeDifference(actual[0], expected[0]),
                            relativeDifference(actual[1], expected[1]))
                << "\n";
    }
  }
}

} // namespace
