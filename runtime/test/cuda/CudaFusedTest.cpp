// The generated kernels of mt.fused groups (format version 3) against the
// host backend, which runs each group's ops one by one: fused-ops.mtb
// (runtime/test/cuda/data/fused-ops.mlir, written by megatron-translate)
// holds every op a group may hold; dropout, add and mul give the host's bits
// (no FMA contraction), SiLU and SwiGLU agree within 1e-5.
#include "CudaTestSupport.h"

#include "cuda/Executor.h"
#include "cuda/ParameterStore.h"
#include "host/Executor.h"
#include "host/ParameterStore.h"
#include "host/ThreadPool.h"

#include <cstring>
#include <iostream>

using namespace mtrt;
using namespace mtrt::test;

namespace {

TEST(CudaFusedTest, GeneratedKernelsMatchTheHost) {
  MTRT_REQUIRE_GPU();
  std::string path = bundleDirectory() + "/fused-ops.mtb";
  ASSERT_TRUE(fileExists(path))
      << "missing " << path
      << ": write it with megatron-translate --mlir-to-bundle "
         "runtime/test/cuda/data/fused-ops.mlir -o "
      << path;
  Bundle bundle = Bundle::load(path);
  ASSERT_EQ(bundle.fusedKernels().names.size(), 2u);
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
  for (uint64_t step : {0, 11, 12}) {
    std::vector<host::Tensor> expected = hostExecutor.run(views, step);
    std::vector<host::Tensor> actual = deviceExecutor.run(views, step);
    ASSERT_EQ(actual.size(), 4u);
    int64_t zeros = 0;
    for (size_t i = 0; i < actual.size(); ++i) {
      std::string what = "step " + std::to_string(step) + ", outputs[" +
                         std::to_string(i) + "]";
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
    std::cout << "[ parity   ] fused kernels, step " << step
              << ": dropout + add + mul bit-identical to the host (" << zeros
              << " dropped elements), silu + swiglu within "
              << relativeDifference(actual[3], expected[3]) << "\n";
  }
}

} // namespace
