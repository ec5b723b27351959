// fp16 loss scaling on the cuda backend: the unscale-and-check kernel, and
// training with the device's unscale, skips and scale updates against the
// host's.
#include "BundleTestBuilder.h"
#include "CudaTestSupport.h"

#include "cuda/CudaCheck.h"
#include "cuda/ParameterStore.h"
#include "cuda/Trainer.h"
#include "cuda/kernels/LossScale.h"
#include "host/ParameterStore.h"
#include "train/Trainer.h"

#include <cmath>
#include <limits>
#include <sstream>
#include <vector>

using namespace mtrt;
using namespace mtrt::test;

namespace {

class CudaLossScaleTest : public CudaTest {
protected:
  /// Runs the kernel on `values` with `factor`: the products and the flag.
  std::pair<std::vector<float>, int> unscale(const std::vector<float> &values,
                                             float factor) {
    size_t bytes = values.size() * sizeof(float);
    cuda::DeviceBuffer data(bytes, "test gradients"),
        flag(sizeof(int), "test flag");
    cudaStream_t stream = context->stream();
    MTRT_CUDA_CHECK(cudaMemcpyAsync(data.data(), values.data(), bytes,
                                    cudaMemcpyHostToDevice, stream),
                    "test");
    MTRT_CUDA_CHECK(cudaMemsetAsync(flag.data(), 0, sizeof(int), stream),
                    "test");
    MTRT_CUDA_CHECK_LAUNCH(
        cuda::unscaleAndCheckFinite(stream, int64_t(values.size()),
                                    data.as<float>(), factor, flag.as<int>()),
        "test");
    std::vector<float> out(values.size());
    int found = -1;
    MTRT_CUDA_CHECK(cudaMemcpyAsync(out.data(), data.data(), bytes,
                                    cudaMemcpyDeviceToHost, stream),
                    "test");
    MTRT_CUDA_CHECK(cudaMemcpyAsync(&found, flag.data(), sizeof(int),
                                    cudaMemcpyDeviceToHost, stream),
                    "test");
    context->synchronize("test");
    return {out, found};
  }
};

TEST_F(CudaLossScaleTest, UnscaleIsExactAndFindsInfAndNan) {
  std::vector<float> x(1 << 20), expected(x.size());
  for (size_t i = 0; i < x.size(); ++i) {
    expected[i] = std::sin(float(i)) * 1e3f;
    x[i] = expected[i] * 65536.0f;
  }
  auto [clean, cleanFlag] = unscale(x, 1.0f / 65536.0f);
  EXPECT_EQ(cleanFlag, 0);
  EXPECT_EQ(clean, expected); // a power of two: exact
  x[777777] = std::numeric_limits<float>::infinity();
  EXPECT_EQ(unscale(x, 0.5f).second, 1);
  x[777777] = 0;
  x[12] = std::nanf("");
  EXPECT_EQ(unscale(x, 0.5f).second, 1);
  x[12] = 3e38f; // finite, overflows when doubled
  EXPECT_EQ(unscale(x, 2.0f).second, 1);
}

std::string corpus() {
  std::string text;
  for (int i = 0; i < 120; ++i)
    text += "the cat sat on the mat; the dog ate the hat. ";
  return text;
}

train::TrainerOptions fp16Options(double initialScale) {
  train::TrainerOptions o;
  o.trainIters = 12;
  o.lr = 3e-2;
  o.lrWarmupIters = 3;
  o.evalInterval = 0;
  o.threads = 2;
  o.progressBar = false;
  o.lossScaling = train::LossScalerOptions{};
  o.lossScaling->initialScale = initialScale;
  o.lossScaling->window = 4; // the scale grows (and overflows) in the run
  return o;
}

// The device's unscale, skips and scale updates follow the host's: with a
// start of 2^130 (inf in float) both skip iterations 1 to 4, then train;
// every loss scale and skip agrees, the losses within 1e-5 relative (fp32).
TEST_F(CudaLossScaleTest, Fp16TrainingFollowsTheHost) {
  Bundle bundle = Bundle::parseManifest(
      "bigram.mtb", bigramManifest(256, 16, 4, 16, 8).dump());
  train::TrainerOptions o = fp16Options(std::ldexp(1.0, 130));
  train::Trainer host(bundle, corpus(), "corpus", o);
  cuda::Trainer device(bundle, corpus(), "corpus", o);
  std::ostringstream hostLog, deviceLog;
  host.train(hostLog);
  device.train(deviceLog);
  const auto &expected = host.history();
  const auto &actual = device.history();
  ASSERT_EQ(actual.size(), expected.size());
  int skipped = 0;
  for (size_t i = 0; i < expected.size(); ++i) {
    EXPECT_EQ(actual[i].skipped, expected[i].skipped) << "iteration " << i + 1;
    EXPECT_EQ(actual[i].lossScale, expected[i].lossScale)
        << "iteration " << i + 1;
    EXPECT_NEAR(actual[i].loss, expected[i].loss, 1e-5 * expected[i].loss)
        << "iteration " << i + 1;
    EXPECT_EQ(actual[i].learningRate, expected[i].learningRate);
    skipped += expected[i].skipped;
  }
  EXPECT_GE(skipped, 4);
  EXPECT_TRUE(expected[3].skipped);
  EXPECT_FALSE(expected[4].skipped);
  std::cout << "cuda log:\n" << deviceLog.str();
}

// Skipped iterations leave the device's parameters and moments alone.
TEST_F(CudaLossScaleTest, OverflowingIterationsLeaveTheParameters) {
  Bundle bundle = Bundle::parseManifest(
      "bigram.mtb", bigramManifest(256, 16, 4, 16, 8).dump());
  train::TrainerOptions o = fp16Options(std::ldexp(1.0, 130));
  o.trainIters = 4;
  cuda::Trainer device(bundle, corpus(), "corpus", o);
  std::vector<std::vector<float>> before;
  host::ParameterStore &store = device.host().parameters();
  for (size_t p = 0; p < store.size(); ++p)
    before.emplace_back(store.value(p).data<float>(),
                        store.value(p).data<float>() +
                            store.value(p).numElements());
  std::ostringstream log;
  device.train(log);
  for (const train::IterationRecord &r : device.history())
    EXPECT_TRUE(r.skipped) << "iteration " << r.iteration;
  device.copyParametersToHost();
  for (size_t p = 0; p < store.size(); ++p) {
    std::vector<float> after(store.value(p).data<float>(),
                             store.value(p).data<float>() +
                                 store.value(p).numElements());
    EXPECT_EQ(after, before[p]) << store.info(p).name;
    for (int64_t i = 0; i < store.expAvg(p).numElements(); ++i)
      ASSERT_EQ(store.expAvg(p).data<float>()[i], 0.0f) << store.info(p).name;
  }
}

} // namespace
