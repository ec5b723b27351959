// The C API's CUDA sessions against host sessions on tiny-gpt: the same
// batches give the host's losses (within 1e-5 over five steps); batches
// bound in device memory, copied from it, and copied from host memory give
// the same loss bit for bit; parameters read and written in device memory
// and through views; a checkpoint moves between the backends; fp16 loss
// scaling follows a host session's; sessions of several ranks (TP2, DP2
// with the distributed optimizer, PP2) follow host sessions of the same
// ranks. Skipped without a GPU.
#include "CudaTestSupport.h"

#include "mtrt/mtrt.h"

#include <cuda_runtime_api.h>

#include <cmath>
#include <filesystem>
#include <memory>
#include <string>
#include <thread>
#include <utility>
#include <vector>

using namespace mtrt;
using namespace mtrt::test;

namespace {

/// Fails the test with the status's message unless it is OK.
#define ASSERT_OK(expr)                                                        \
  do {                                                                         \
    mtrt_status_t statusValue = (expr);                                        \
    ASSERT_EQ(statusValue, nullptr)                                            \
        << #expr << ": " << mtrt_status_message(statusValue);                  \
  } while (0)

struct SessionDeleter {
  void operator()(mtrt_session_t s) const { mtrt_session_release(s); }
};
using Session = std::unique_ptr<mtrt_session_s, SessionDeleter>;

mtrt_tensor_t batchTensor(void *data, mtrt_backend_t backend) {
  mtrt_tensor_t t{};
  t.data = data;
  t.dtype = MTRT_DTYPE_I32;
  t.backend = backend;
  t.device = 0;
  t.rank = 2;
  t.shape[0] = 8;
  t.shape[1] = 128;
  return t;
}

class CudaSessionTest : public ::testing::Test {
protected:
  void SetUp() override {
    MTRT_REQUIRE_GPU();
    std::string path = testBundlePath("tiny-gpt");
    ASSERT_OK(mtrt_bundle_load(path.c_str(), &bundle));
    for (int k = 0; k < 5; ++k) {
      host::Tensor t = randomIds({8, 128}, 256, 10 + k);
      host::Tensor l = randomIds({8, 128}, 256, 20 + k);
      tokens.emplace_back(t.data<int32_t>(), t.data<int32_t>() + 1024);
      labels.emplace_back(l.data<int32_t>(), l.data<int32_t>() + 1024);
    }
  }
  void TearDown() override { mtrt_bundle_release(bundle); }

  Session create(mtrt_backend_t backend, double lr = 1e-3) {
    mtrt_session_options_t options;
    mtrt_session_options_initialize(&options);
    options.backend = backend;
    options.lr = lr;
    mtrt_session_t session = nullptr;
    mtrt_status_t status = mtrt_session_create(bundle, &options, &session);
    EXPECT_EQ(status, nullptr) << mtrt_status_message(status);
    mtrt_status_free(status);
    return Session(session);
  }
  double step(mtrt_session_t session, int k) {
    mtrt_tensor_t t = batchTensor(tokens[k].data(), MTRT_BACKEND_HOST);
    mtrt_tensor_t l = batchTensor(labels[k].data(), MTRT_BACKEND_HOST);
    EXPECT_EQ(mtrt_session_set_batch(session, &t, &l, MTRT_BATCH_COPY),
              nullptr);
    mtrt_step_metrics_t m{};
    m.struct_size = sizeof(m);
    EXPECT_EQ(mtrt_session_train_step(session, &m), nullptr);
    return m.loss;
  }

  mtrt_bundle_t bundle = nullptr;
  std::vector<std::vector<int32_t>> tokens, labels;
};

TEST_F(CudaSessionTest, TrainingMatchesAHostSession) {
  Session host = create(MTRT_BACKEND_HOST), device = create(MTRT_BACKEND_CUDA);
  for (int k = 0; k < 5; ++k) {
    double expected = step(host.get(), k), actual = step(device.get(), k);
    EXPECT_LE(std::abs(actual - expected), 1e-5 * std::abs(expected))
        << "step " << k + 1 << ": host " << expected << ", cuda " << actual;
  }
}

TEST_F(CudaSessionTest, DeviceBatchesBoundOrCopiedGiveTheHostBatchLoss) {
  Session session = create(MTRT_BACKEND_CUDA);
  int32_t *device = nullptr;
  ASSERT_EQ(cudaMalloc(reinterpret_cast<void **>(&device),
                       2 * 1024 * sizeof(int32_t)),
            cudaSuccess);
  ASSERT_EQ(cudaMemcpy(device, tokens[0].data(), 1024 * sizeof(int32_t),
                       cudaMemcpyHostToDevice),
            cudaSuccess);
  ASSERT_EQ(cudaMemcpy(device + 1024, labels[0].data(), 1024 * sizeof(int32_t),
                       cudaMemcpyHostToDevice),
            cudaSuccess);
  double losses[3] = {0, 0, 0};
  mtrt_tensor_t t = batchTensor(tokens[0].data(), MTRT_BACKEND_HOST);
  mtrt_tensor_t l = batchTensor(labels[0].data(), MTRT_BACKEND_HOST);
  ASSERT_OK(mtrt_session_set_batch(session.get(), &t, &l, MTRT_BATCH_COPY));
  ASSERT_OK(mtrt_session_eval_step(session.get(), &losses[0]));
  t = batchTensor(device, MTRT_BACKEND_CUDA);
  l = batchTensor(device + 1024, MTRT_BACKEND_CUDA);
  ASSERT_OK(mtrt_session_set_batch(session.get(), &t, &l, MTRT_BATCH_BIND));
  ASSERT_OK(mtrt_session_eval_step(session.get(), &losses[1]));
  ASSERT_OK(mtrt_session_set_batch(session.get(), &t, &l, MTRT_BATCH_COPY));
  ASSERT_EQ(cudaMemset(device, 0, 1024 * sizeof(int32_t)), cudaSuccess);
  ASSERT_OK(mtrt_session_eval_step(session.get(), &losses[2]));
  EXPECT_EQ(losses[1], losses[0]);
  EXPECT_EQ(losses[2], losses[0]) << "a copied device batch was read late";

  // An id outside the vocabulary in a bound device batch: the kernels'
  // fault word reports it.
  int32_t bad = 300;
  ASSERT_EQ(cudaMemcpy(device + 5, &bad, sizeof(bad), cudaMemcpyHostToDevice),
            cudaSuccess);
  ASSERT_OK(mtrt_session_set_batch(session.get(), &t, &l, MTRT_BATCH_BIND));
  double loss = 0;
  mtrt_status_t status = mtrt_session_eval_step(session.get(), &loss);
  EXPECT_EQ(mtrt_status_code(status), MTRT_STATUS_OUT_OF_RANGE)
      << mtrt_status_message(status);
  mtrt_status_free(status);
  cudaFree(device);

  void *stream = nullptr;
  ASSERT_OK(mtrt_session_cuda_stream(session.get(), &stream));
  EXPECT_NE(stream, nullptr);
}

TEST_F(CudaSessionTest, ParametersInDeviceMemory) {
  Session session = create(MTRT_BACKEND_CUDA);
  const char *name = "transformer.ln_f.bias";
  mtrt_tensor_t view;
  ASSERT_OK(mtrt_session_parameter_view(session.get(), name, &view));
  EXPECT_EQ(view.backend, MTRT_BACKEND_CUDA);
  std::vector<float> values(128);
  for (size_t i = 0; i < values.size(); ++i)
    values[i] = static_cast<float>(i);
  mtrt_tensor_t source = view;
  source.data = values.data();
  source.backend = MTRT_BACKEND_HOST;
  ASSERT_OK(mtrt_session_parameter_set(session.get(), name, &source));
  float *device = nullptr;
  ASSERT_EQ(cudaMalloc(reinterpret_cast<void **>(&device),
                       128 * sizeof(float)),
            cudaSuccess);
  mtrt_tensor_t destination = view;
  destination.data = device;
  ASSERT_OK(mtrt_session_parameter_get(session.get(), name, &destination));
  std::vector<float> fromGet(128), fromView(128);
  ASSERT_EQ(cudaMemcpy(fromGet.data(), device, 128 * sizeof(float),
                       cudaMemcpyDeviceToHost),
            cudaSuccess);
  ASSERT_EQ(cudaMemcpy(fromView.data(), view.data, 128 * sizeof(float),
                       cudaMemcpyDeviceToHost),
            cudaSuccess);
  EXPECT_EQ(fromGet, values);
  EXPECT_EQ(fromView, values);
  cudaFree(device);
}

TEST_F(CudaSessionTest, ACheckpointMovesBetweenBackends) {
  Session device = create(MTRT_BACKEND_CUDA), host = create(MTRT_BACKEND_HOST);
  step(device.get(), 0);
  step(device.get(), 1);
  std::string directory = ::testing::TempDir() + "/cuda-session-checkpoint";
  std::filesystem::remove_all(directory);
  ASSERT_OK(mtrt_session_save_checkpoint(device.get(), directory.c_str()));
  ASSERT_OK(mtrt_session_load_checkpoint(host.get(), directory.c_str()));
  double expected = step(device.get(), 2), actual = step(host.get(), 2);
  EXPECT_LE(std::abs(actual - expected), 1e-5 * std::abs(expected));
  std::filesystem::remove_all(directory);
}

// fp16 (tiny-gpt-fp16-nodrop.mtb, megatron-compile --fp16 without dropout):
// the device's unscale, overflow check and skips follow a host session's
// loss scaler from 2^130 (inf in float), with a window of 4 so that the
// scale also grows: the same skipped steps and scales, losses within 1e-5.
TEST_F(CudaSessionTest, Fp16LossScalingFollowsAHostSession) {
  std::string path = testBundlePath(
      "tiny-gpt-fp16-nodrop", "compile models/tiny-gpt.yaml with --fp16 "
                              "--hidden-dropout 0 --attention-dropout 0");
  mtrt_bundle_t fp16 = nullptr;
  ASSERT_OK(mtrt_bundle_load(path.c_str(), &fp16));
  auto create16 = [&](mtrt_backend_t backend) {
    mtrt_session_options_t options;
    mtrt_session_options_initialize(&options);
    options.backend = backend;
    options.lr = 1e-3;
    options.initial_loss_scale = std::ldexp(1.0, 130);
    options.loss_scale_window = 4;
    mtrt_session_t session = nullptr;
    mtrt_status_t status = mtrt_session_create(fp16, &options, &session);
    EXPECT_EQ(status, nullptr) << mtrt_status_message(status);
    mtrt_status_free(status);
    return Session(session);
  };
  Session host = create16(MTRT_BACKEND_HOST),
          device = create16(MTRT_BACKEND_CUDA);
  ASSERT_TRUE(host && device);
  int skipped = 0, trained = 0;
  for (int k = 0; k < 30; ++k) {
    mtrt_step_metrics_t m[2];
    mtrt_session_t sessions[2] = {host.get(), device.get()};
    for (int s = 0; s < 2; ++s) {
      mtrt_tensor_t t = batchTensor(tokens[k % 5].data(), MTRT_BACKEND_HOST);
      mtrt_tensor_t l = batchTensor(labels[k % 5].data(), MTRT_BACKEND_HOST);
      ASSERT_OK(mtrt_session_set_batch(sessions[s], &t, &l, MTRT_BATCH_COPY));
      m[s] = {};
      m[s].struct_size = sizeof(m[s]);
      ASSERT_OK(mtrt_session_train_step(sessions[s], &m[s]));
    }
    EXPECT_EQ(m[1].skipped, m[0].skipped) << "step " << k + 1;
    EXPECT_EQ(m[1].loss_scale, m[0].loss_scale) << "step " << k + 1;
    EXPECT_LE(std::abs(m[1].loss - m[0].loss), 1e-5 * std::abs(m[0].loss))
        << "step " << k + 1;
    EXPECT_EQ(std::isnan(m[1].grad_norm), m[0].skipped != 0);
    skipped += m[0].skipped != 0;
    trained += m[0].skipped == 0;
  }
  EXPECT_GE(skipped, 2);
  EXPECT_GE(trained, 10);
  host.reset();
  device.reset();
  mtrt_bundle_release(fp16);
}

// Sessions of several ranks (in-process communicators, every rank on GPU 0,
// each on its own thread) follow host sessions of the same ranks: tensor
// parallelism, data parallelism with the distributed optimizer, and a
// pipeline (whose schedule runs at apply). Three steps of the same batches
// (each data rank its own); losses within 1e-5, gradient norms within 1e-4.
struct SeveralRanksCase {
  const char *bundle;
  int ranks, dataRanks, microBatches;
};

class CudaSessionRanksTest
    : public ::testing::TestWithParam<SeveralRanksCase> {};

TEST_P(CudaSessionRanksTest, FollowsHostSessions) {
  MTRT_REQUIRE_GPU();
  const SeveralRanksCase &c = GetParam();
  std::string path = testBundlePath(c.bundle);
  mtrt_bundle_t bundle = nullptr;
  ASSERT_OK(mtrt_bundle_load(path.c_str(), &bundle));
  constexpr int kSteps = 3;
  // [backend][rank][step]: the step's metrics.
  std::vector<std::vector<std::vector<mtrt_step_metrics_t>>> metrics(
      2, std::vector<std::vector<mtrt_step_metrics_t>>(
             c.ranks, std::vector<mtrt_step_metrics_t>(kSteps)));
  for (int b = 0; b < 2; ++b) {
    mtrt_backend_t backend = b ? MTRT_BACKEND_CUDA : MTRT_BACKEND_HOST;
    std::vector<mtrt_communicator_t> communicators(c.ranks);
    ASSERT_OK(mtrt_communicator_create_in_process(c.ranks,
                                                  communicators.data()));
    std::vector<std::string> errors(c.ranks);
    std::vector<std::thread> threads;
    for (int r = 0; r < c.ranks; ++r)
      threads.emplace_back([&, r] {
        mtrt_session_options_t options;
        mtrt_session_options_initialize(&options);
        options.backend = backend;
        options.lr = 1e-3;
        options.threads = 1;
        options.communicator = communicators[r];
        mtrt_session_t session = nullptr;
        auto fail = [&](mtrt_status_t status) {
          if (!status)
            return false;
          errors[r] = mtrt_status_message(status);
          mtrt_status_free(status);
          return true;
        };
        if (fail(mtrt_session_create(bundle, &options, &session)))
          return;
        int64_t rows = 0, columns = 0;
        mtrt_dtype_t dtype;
        if (fail(mtrt_session_batch_info(session, &rows, &columns, &dtype)))
          return;
        // The data-parallel case has one rank per data rank; the others
        // have one data rank.
        int dataRank = r % c.dataRanks;
        for (int k = 0; k < kSteps; ++k) {
          for (int m = 0; m < c.microBatches; ++m) {
            int key = (k * c.microBatches + m) * c.dataRanks + dataRank;
            host::Tensor t = randomIds({rows, columns}, 256, 100 + key);
            host::Tensor l = randomIds({rows, columns}, 256, 200 + key);
            mtrt_tensor_t tokens{}, labels{};
            for (auto [view, tensor] :
                 {std::pair{&tokens, &t}, std::pair{&labels, &l}}) {
              view->data = tensor->data<int32_t>();
              view->dtype = MTRT_DTYPE_I32;
              view->backend = MTRT_BACKEND_HOST;
              view->rank = 2;
              view->shape[0] = rows;
              view->shape[1] = columns;
            }
            if (fail(mtrt_session_set_batch(session, &tokens, &labels,
                                            MTRT_BATCH_COPY)) ||
                fail(mtrt_session_accumulate(session, nullptr)))
              return;
          }
          mtrt_step_metrics_t &out = metrics[b][r][k];
          out.struct_size = sizeof(out);
          if (fail(mtrt_session_apply(session, &out)))
            return;
        }
        mtrt_session_release(session);
      });
    for (std::thread &thread : threads)
      thread.join();
    for (int r = 0; r < c.ranks; ++r) {
      EXPECT_EQ(errors[r], "") << (b ? "cuda" : "host") << " rank " << r;
      mtrt_communicator_release(communicators[r]);
    }
  }
  for (int r = 0; r < c.ranks; ++r)
    for (int k = 0; k < kSteps; ++k) {
      const mtrt_step_metrics_t &host = metrics[0][r][k],
                                &device = metrics[1][r][k];
      EXPECT_LE(std::abs(device.loss - host.loss), 1e-5 * std::abs(host.loss))
          << "rank " << r << ", step " << k + 1;
      EXPECT_LE(std::abs(device.grad_norm - host.grad_norm),
                1e-4 * std::abs(host.grad_norm))
          << "rank " << r << ", step " << k + 1;
    }
  mtrt_bundle_release(bundle);
}

// The bundles of CudaTensorParallelTest, CudaDataParallelTest and
// CudaPipelineTest (bench/make-device-dir.sh).
INSTANTIATE_TEST_SUITE_P(
    Layouts, CudaSessionRanksTest,
    ::testing::Values(SeveralRanksCase{"tiny-gpt-nodrop-tp2", 2, 1, 1},
                      SeveralRanksCase{"tiny-gpt-nodrop-dp2-distopt", 2, 2, 1},
                      SeveralRanksCase{"tiny-gpt-l4-nodrop-pp2-1f1b", 2, 1, 4}),
    [](const ::testing::TestParamInfo<SeveralRanksCase> &info) {
      std::string name = info.param.bundle;
      for (char &ch : name)
        if (ch == '-')
          ch = '_';
      return name;
    });

} // namespace
