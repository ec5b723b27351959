// Tensor parallelism on one GPU: tiny-gpt compiled for TP=2, run as two
// in-process ranks (threads, each with its own CUDA context and stream on
// device 0: the multi-rank instructions on the device, their collectives
// PeerGroup's kernels (ContextOptions::peerCollectives, on by default; as
// CUDA graphs under CUDA_MODULE_LOADING=EAGER)), against the same model
// compiled for one rank on the same GPU: one train_step's loss and every
// gradient (gathered from the shards), fp32 and bf16, with and without sequence
// parallelism. Both runs start from the same parameters (the host store
// initializes each shard with its global values). The -nodrop bundles run
// without dropout; tiny-gpt's own (GPT-2's dropout 0.1) draws its masks over
// split tensors, attention's heads and, with sequence parallelism, the hidden
// states' sequence tiles, keyed on the global samples and positions
// (core/Random.h), so the TP=2 run draws the one-rank run's masks.
#include "CudaTestSupport.h"

#include "comm/InProcessWorld.h"
#include "comm/RankContext.h"
#include "comm/RunRanks.h"
#include "cuda/DeviceCollective.h"
#include "cuda/Executor.h"
#include "cuda/ParameterStore.h"
#include "cuda/Trainer.h"
#include "host/ParameterStore.h"
#include "host/ThreadPool.h"

#include <cstring>
#include <iostream>
#include <mutex>
#include <sstream>

using namespace mtrt;
using namespace mtrt::test;

namespace {

struct StepResult {
  double loss = 0;
  /// Per parameter, the global gradient (NaN where no rank wrote).
  std::vector<host::Tensor> gradients;
  /// Rank 0's values held in bf16 (Executor::bf16ValueCount), and those of
  /// them that a multi-rank instruction reads or writes.
  size_t bf16Values = 0, rankBf16Values = 0;
};

/// How many of train_step's values that multi-rank instructions read or
/// write `executor` holds in bf16.
size_t rankValuesInBf16(const Bundle &bundle, const cuda::Executor &executor) {
  const Function &fn = *bundle.findFunction("train_step");
  std::vector<bool> touched(fn.values.size(), false);
  for (const Instruction &inst : fn.instructions)
    if (cuda::Executor::isRankInstruction(inst)) {
      for (int64_t v : inst.operands)
        touched[v] = true;
      for (int64_t v : inst.results)
        touched[v] = true;
    }
  size_t count = 0;
  for (size_t v = 0; v < touched.size(); ++v)
    count += touched[v] && executor.heldInBf16(static_cast<int64_t>(v));
  return count;
}

std::vector<host::Tensor> emptyGradients(const Bundle &bundle) {
  std::vector<host::Tensor> gradients;
  for (const Parameter &p : bundle.parameters()) {
    gradients.emplace_back(DType::F32, p.type.shape);
    float *data = gradients.back().data<float>();
    for (int64_t i = 0; i < p.type.numElements; ++i)
      data[i] = NAN;
  }
  return gradients;
}

/// Writes rank shard `shard` of parameter p into the global `whole`; the
/// replicas of an unsplit parameter must agree exactly (TP ranks compute
/// them from the same all-reduced values).
void scatterShard(const host::ParameterStore &store, size_t p,
                  const host::Tensor &shard, host::Tensor &whole) {
  const Parameter &info = store.info(p);
  std::vector<int64_t> offsets = store.shardOffsets(p);
  for (int64_t i = 0; i < info.localType.numElements; ++i) {
    int64_t index = shardElementIndex(info, offsets, i);
    float &slot = whole.data<float>()[index];
    float value = shard.data<float>()[i];
    EXPECT_TRUE(std::isnan(slot) || std::abs(slot - value) <=
                                        1e-6f * std::abs(value) + 1e-12f)
        << info.name << ": the ranks' replicas differ at element " << index
        << " (" << slot << " vs " << value << ")";
    slot = value;
  }
}

std::vector<host::TensorView> stepInputs(const Bundle &bundle,
                                         host::Tensor &tokens,
                                         host::Tensor &labels) {
  const Function *train = bundle.findFunction("train_step");
  std::vector<int64_t> shape = train->values[train->inputs[0]].shape;
  tokens = randomIds(shape, 256, 3);
  labels = randomIds(shape, 256, 4);
  return {viewOf(tokens), viewOf(labels)};
}

StepResult oneRank(const Bundle &bundle) {
  host::ThreadPool pool(0);
  host::ParameterStore hostStore(bundle, DType::F32);
  hostStore.initialize(pool, 1234);
  hostStore.zeroGradients(pool);
  cuda::Context context;
  cuda::ParameterStore store(bundle, context);
  store.upload(hostStore);
  cuda::Executor executor(bundle, "train_step", store);
  host::Tensor tokens, labels;
  auto inputs = stepInputs(bundle, tokens, labels);
  StepResult result;
  result.loss = executor.run(inputs, {5, 5})[0].data<float>()[0];
  for (size_t p = 0; p < store.size(); ++p)
    result.gradients.push_back(store.gradientToHost(p));
  return result;
}

StepResult inProcessRanks(const Bundle &bundle) {
  StepResult result;
  result.gradients = emptyGradients(bundle);
  std::vector<double> losses(bundle.rankCount(), NAN);
  std::mutex mutex;
  comm::InProcessWorld world(static_cast<int>(bundle.rankCount()));
  auto errors = comm::runRanks(world, [&](comm::Communicator &c) {
    comm::RankContext rank(c, bundle.gridShape());
    rank.prepare(bundle);
    host::ThreadPool pool(1);
    host::ParameterStore hostStore(bundle, DType::F32, rank.coordinates());
    hostStore.initialize(pool, 1234);
    hostStore.zeroGradients(pool);
    cuda::Context context;
    cuda::ParameterStore store(bundle, context);
    store.upload(hostStore);
    cuda::Executor executor(bundle, "train_step", store, &rank);
    host::Tensor tokens, labels;
    auto inputs = stepInputs(bundle, tokens, labels);
    double loss = executor.run(inputs, {5, 5})[0].data<float>()[0];
    std::lock_guard<std::mutex> lock(mutex);
    losses[static_cast<size_t>(c.rank())] = loss;
    if (c.rank() == 0) {
      result.bf16Values = executor.bf16ValueCount();
      result.rankBf16Values = rankValuesInBf16(bundle, executor);
    }
    for (size_t p = 0; p < store.size(); ++p)
      scatterShard(hostStore, p, store.gradientToHost(p), result.gradients[p]);
  });
  for (auto &error : errors) {
    if (!error)
      continue;
    try {
      std::rethrow_exception(error);
    } catch (const std::exception &e) {
      ADD_FAILURE() << "a rank failed: " << e.what();
    }
  }
  for (double loss : losses)
    EXPECT_EQ(loss, losses[0]) << "the ranks report different losses";
  result.loss = losses[0];
  return result;
}

double cosine(const host::Tensor &a, const host::Tensor &b) {
  double dot = 0, aa = 0, bb = 0;
  for (int64_t i = 0; i < a.numElements(); ++i) {
    double x = a.data<float>()[i], y = b.data<float>()[i];
    dot += x * y;
    aa += x * x;
    bb += y * y;
  }
  return aa == 0 && bb == 0 ? 1 : dot / std::sqrt(aa * bb);
}

/// Floats on the current device, copied from `values`.
cuda::DeviceBuffer deviceFloats(const std::vector<float> &values) {
  cuda::DeviceBuffer buffer(values.size() * sizeof(float), "test values");
  EXPECT_EQ(cudaMemcpy(buffer.data(), values.data(),
                       values.size() * sizeof(float), cudaMemcpyHostToDevice),
            cudaSuccess);
  return buffer;
}

std::vector<float> hostFloats(const cuda::DeviceBuffer &buffer, size_t n,
                              cudaStream_t stream) {
  std::vector<float> values(n);
  EXPECT_EQ(cudaStreamSynchronize(stream), cudaSuccess);
  EXPECT_EQ(cudaMemcpy(values.data(), buffer.data(), n * sizeof(float),
                       cudaMemcpyDeviceToHost),
            cudaSuccess);
  return values;
}

// DeviceCollective's staged path (the in-process communicator takes host
// memory): every call on device buffers of two ranks, exact results, the
// in-place forms included, ordered after work already on the stream.
TEST(DeviceCollectiveTest, StagesTheInProcessCommunicatorsCalls) {
  MTRT_REQUIRE_GPU();
  const size_t n = 5;
  comm::InProcessWorld world(2);
  auto errors = comm::runRanks(world, [&](comm::Communicator &c) {
    ASSERT_FALSE(c.takesDeviceMemory());
    cuda::Context context;
    cuda::DeviceCollective collective(context.stream(), "DeviceCollectiveTest");
    int r = c.rank();
    std::vector<float> mine(2 * n);
    for (size_t i = 0; i < mine.size(); ++i)
      mine[i] = static_cast<float>(100 * r + i);
    cuda::DeviceBuffer x = deviceFloats(std::vector<float>(2 * n, 0));
    cuda::DeviceBuffer y = deviceFloats(std::vector<float>(2 * n, -1));
    // Work already on the stream comes first: x is written there before
    // the all-reduce reads it.
    ASSERT_EQ(cudaMemcpyAsync(x.data(), mine.data(), n * sizeof(float),
                              cudaMemcpyHostToDevice, context.stream()),
              cudaSuccess);
    comm::CallInfo info{"DeviceCollectiveTest", 3};
    collective.allReduce(c, x.data(), y.data(), n, DType::F32,
                         comm::ReduceOp::Sum, info);
    std::vector<float> sum = hostFloats(y, n, context.stream());
    for (size_t i = 0; i < n; ++i)
      EXPECT_EQ(sum[i], static_cast<float>(100 + 2 * i));
    collective.allReduce(c, x.data(), x.data(), n, DType::F32,
                         comm::ReduceOp::Max, info);
    std::vector<float> max = hostFloats(x, n, context.stream());
    for (size_t i = 0; i < n; ++i)
      EXPECT_EQ(max[i], static_cast<float>(100 + i));
    // all_gather in place: rank r's block at r * n.
    cuda::DeviceBuffer g = deviceFloats(mine);
    collective.allGather(c, static_cast<float *>(g.data()) + r * n, g.data(),
                         n, DType::F32, info);
    std::vector<float> gathered = hostFloats(g, 2 * n, context.stream());
    for (size_t i = 0; i < n; ++i) {
      EXPECT_EQ(gathered[i], static_cast<float>(i));
      EXPECT_EQ(gathered[n + i], static_cast<float>(100 + n + i));
    }
    // reduce_scatter: block r of the sum.
    cuda::DeviceBuffer s = deviceFloats(mine);
    collective.reduceScatter(c, s.data(), y.data(), n, DType::F32,
                             comm::ReduceOp::Sum, info);
    std::vector<float> scattered = hostFloats(y, n, context.stream());
    for (size_t i = 0; i < n; ++i)
      EXPECT_EQ(scattered[i], static_cast<float>(100 + 2 * (r * n + i)));
    cuda::DeviceBuffer b = deviceFloats(mine);
    collective.broadcast(c, b.data(), 2 * n, DType::F32, 1, info);
    std::vector<float> broadcast = hostFloats(b, 2 * n, context.stream());
    for (size_t i = 0; i < 2 * n; ++i)
      EXPECT_EQ(broadcast[i], static_cast<float>(100 + i));
    cuda::DeviceBuffer e = deviceFloats(mine);
    collective.sendRecv(c, e.data(), 1 - r, y.data(), 1 - r, n, DType::F32,
                        info);
    std::vector<float> exchanged = hostFloats(y, n, context.stream());
    for (size_t i = 0; i < n; ++i)
      EXPECT_EQ(exchanged[i], static_cast<float>(100 * (1 - r) + i));
    if (r == 0)
      collective.send(c, e.data(), n, DType::F32, 1, info);
    else
      collective.recv(c, y.data(), n, DType::F32, 0, info);
    if (r == 1) {
      std::vector<float> received = hostFloats(y, n, context.stream());
      for (size_t i = 0; i < n; ++i)
        EXPECT_EQ(received[i], static_cast<float>(i));
    }
  });
  for (auto &error : errors)
    if (error) {
      try {
        std::rethrow_exception(error);
      } catch (const std::exception &e) {
        ADD_FAILURE() << "a rank failed: " << e.what();
      }
    }
}

/// bf16 bits of `value` (small integers: exact) and back.
uint16_t bf16Bits(float value) {
  uint32_t word;
  std::memcpy(&word, &value, sizeof(word));
  return static_cast<uint16_t>(word >> 16);
}

float bf16Value(uint16_t bits) {
  uint32_t word = static_cast<uint32_t>(bits) << 16;
  float value;
  std::memcpy(&value, &word, sizeof(value));
  return value;
}

// The staged path on bf16 buffers (the tensor-parallel collectives of a bf16
// bundle): widened to fp32 for the in-process communicator and rounded back,
// exact on these small integers; a sum that bf16 cannot hold rounds to
// nearest even once.
TEST(DeviceCollectiveTest, StagesBf16Buffers) {
  MTRT_REQUIRE_GPU();
  const size_t n = 4;
  comm::InProcessWorld world(2);
  auto errors = comm::runRanks(world, [&](comm::Communicator &c) {
    cuda::Context context;
    cuda::DeviceCollective collective(context.stream(), "StagesBf16Buffers");
    int r = c.rank();
    std::vector<uint16_t> mine(2 * n);
    for (size_t i = 0; i < mine.size(); ++i)
      mine[i] = bf16Bits(static_cast<float>(10 * r + i));
    // 256 + 1 (rank 0 + rank 1) is not a bf16: it rounds to 256 (even).
    mine[0] = bf16Bits(r == 0 ? 256.0f : 1.0f);
    auto upload = [&](const std::vector<uint16_t> &bits) {
      cuda::DeviceBuffer buffer(bits.size() * sizeof(uint16_t), "bf16 values");
      EXPECT_EQ(cudaMemcpy(buffer.data(), bits.data(),
                           bits.size() * sizeof(uint16_t),
                           cudaMemcpyHostToDevice),
                cudaSuccess);
      return buffer;
    };
    auto download = [&](const cuda::DeviceBuffer &buffer, size_t count) {
      std::vector<uint16_t> bits(count);
      EXPECT_EQ(cudaStreamSynchronize(context.stream()), cudaSuccess);
      EXPECT_EQ(cudaMemcpy(bits.data(), buffer.data(),
                           count * sizeof(uint16_t), cudaMemcpyDeviceToHost),
                cudaSuccess);
      std::vector<float> values;
      for (uint16_t b : bits)
        values.push_back(bf16Value(b));
      return values;
    };
    comm::CallInfo info{"StagesBf16Buffers", 1};
    cuda::DeviceBuffer x = upload(mine);
    cuda::DeviceBuffer y = upload(std::vector<uint16_t>(2 * n, 0));
    collective.allReduce(c, x.data(), y.data(), n, DType::BF16,
                         comm::ReduceOp::Sum, info);
    std::vector<float> sum = download(y, n);
    EXPECT_EQ(sum[0], 256.0f);
    for (size_t i = 1; i < n; ++i)
      EXPECT_EQ(sum[i], static_cast<float>(10 + 2 * i));
    cuda::DeviceBuffer g = upload(std::vector<uint16_t>(2 * n, 0));
    collective.allGather(c, static_cast<uint16_t *>(x.data()) + 1, g.data(),
                         n, DType::BF16, info);
    std::vector<float> gathered = download(g, 2 * n);
    for (size_t i = 0; i < n; ++i) {
      EXPECT_EQ(gathered[i], static_cast<float>(i + 1));
      EXPECT_EQ(gathered[n + i], static_cast<float>(10 + i + 1));
    }
    collective.reduceScatter(c, x.data(), y.data(), n, DType::BF16,
                             comm::ReduceOp::Sum, info);
    std::vector<float> scattered = download(y, n);
    for (size_t i = r == 0 ? 1 : 0; i < n; ++i)
      EXPECT_EQ(scattered[i], static_cast<float>(10 + 2 * (r * n + i)));
  });
  for (auto &error : errors)
    if (error) {
      try {
        std::rethrow_exception(error);
      } catch (const std::exception &e) {
        ADD_FAILURE() << "a rank failed: " << e.what();
      }
    }
}

/// Bundle pairs: (one rank, TP=2) and whether they are bf16; `name` names
/// the test. `rankBf16Values`: how many values of the TP=2 train_step that
/// multi-rank instructions read or write the bf16-values plan holds in bf16
/// (Bf16Values.cpp): the all-reduces' (or reduce-scatters' and gathers')
/// operands and results, bias_add's, the vocabulary block's logits and
/// dlogits, the vocabulary-parallel embedding's rows.
struct Pair {
  const char *one;
  const char *tp2;
  bool bf16;
  const char *name;
  size_t rankBf16Values;
};

class CudaTensorParallelTest : public ::testing::TestWithParam<Pair> {};

const char *const kHowToMake =
    "megatron-compile models/tiny-gpt.yaml [--hidden-dropout 0 "
    "--attention-dropout 0] [--bf16] [--tensor-model-parallel-size 2 "
    "[--sequence-parallel]] [--fuse-linear-cross-entropy "
    "--linear-cross-entropy-chunk-rows=300]";

TEST_P(CudaTensorParallelTest, TwoInProcessRanksEqualOneRank) {
  MTRT_REQUIRE_GPU();
  const Pair &pair = GetParam();
  Bundle one = loadTestBundle(pair.one, kHowToMake);
  Bundle tp2 = loadTestBundle(pair.tp2, kHowToMake);
  ASSERT_EQ(static_cast<int64_t>(tp2.rankCount()), 2);
  StepResult reference = oneRank(one);
  StepResult ranks = inProcessRanks(tp2);
  ASSERT_EQ(reference.gradients.size(), ranks.gradients.size());
  // The multi-rank instructions ran on bf16 values where the plan says so.
  EXPECT_EQ(ranks.rankBf16Values, pair.rankBf16Values)
      << "values of the multi-rank instructions held in bf16 ("
      << ranks.bf16Values << " values in bf16 in all)";
  double lossTolerance = pair.bf16 ? 2e-2 : 1e-5;
  double lossDifference =
      std::abs(ranks.loss - reference.loss) / std::abs(reference.loss);
  EXPECT_LE(lossDifference, lossTolerance)
      << "loss: one rank " << reference.loss << ", TP=2 " << ranks.loss;
  double worstRelative = 0, worstCosine = 1;
  for (size_t p = 0; p < reference.gradients.size(); ++p) {
    const std::string name = one.parameters()[p].name;
    for (int64_t i = 0; i < ranks.gradients[p].numElements(); ++i)
      ASSERT_FALSE(std::isnan(ranks.gradients[p].data<float>()[i]))
          << name << ": no rank wrote element " << i;
    double relative = relativeDifference(ranks.gradients[p],
                                         reference.gradients[p]);
    double similarity = cosine(ranks.gradients[p], reference.gradients[p]);
    worstRelative = std::max(worstRelative, relative);
    worstCosine = std::min(worstCosine, similarity);
    if (pair.bf16)
      EXPECT_GE(similarity, 0.999) << "gradient of " << name;
    else
      EXPECT_LE(relative, 1e-4) << "gradient of " << name;
  }
  std::cout << "[ tp2      ] " << pair.tp2 << " vs " << pair.one
            << ": loss " << ranks.loss << " vs " << reference.loss
            << " (relative " << lossDifference
            << "), largest relative gradient difference " << worstRelative
            << ", smallest gradient cosine " << worstCosine << "; "
            << ranks.bf16Values << " values in bf16, "
            << ranks.rankBf16Values << " of the multi-rank instructions\n";
}

// The training loop: 5 iterations of cuda::Trainer at TP=2 (two in-process
// ranks on the GPU, the gradient norm summed over the world as the host's)
// against the one-rank cuda::Trainer from the same seed and data.
TEST_P(CudaTensorParallelTest, TrainingTwoInProcessRanksEqualsOneRank) {
  MTRT_REQUIRE_GPU();
  const Pair &pair = GetParam();
  Bundle one = loadTestBundle(pair.one, kHowToMake);
  Bundle tp2 = loadTestBundle(pair.tp2, kHowToMake);
  train::TrainerOptions options;
  options.trainIters = 5;
  options.lr = 1e-3;
  options.lrWarmupIters = 2;
  options.evalInterval = 0;
  options.progressBar = false;
  options.seed = 1234;
  options.clipGrad = 0.5; // small enough to clip: the world's norm matters
  std::string corpus = multiRankCorpus();

  std::vector<train::IterationRecord> reference;
  {
    cuda::Trainer trainer(one, corpus, "corpus", options);
    std::ostringstream log;
    trainer.train(log);
    reference = trainer.history();
  }
  std::vector<std::vector<train::IterationRecord>> ranks(2);
  comm::InProcessWorld world(2);
  auto errors = comm::runRanks(world, [&](comm::Communicator &c) {
    comm::RankContext rank(c, tp2.gridShape());
    cuda::Trainer trainer(tp2, corpus, "corpus", options, {}, &rank);
    std::ostringstream log;
    trainer.train(log);
    ranks[static_cast<size_t>(c.rank())] = trainer.history();
  });
  for (auto &error : errors) {
    if (!error)
      continue;
    try {
      std::rethrow_exception(error);
    } catch (const std::exception &e) {
      ADD_FAILURE() << "a rank failed: " << e.what();
    }
  }
  double tolerance = pair.bf16 ? 2e-2 : 1e-5;
  ASSERT_EQ(reference.size(), 5u);
  double worst = 0;
  for (const auto &history : ranks) {
    ASSERT_EQ(history.size(), reference.size());
    for (size_t i = 0; i < reference.size(); ++i) {
      double relative = std::abs(history[i].loss - reference[i].loss) /
                        std::abs(reference[i].loss);
      worst = std::max(worst, relative);
      EXPECT_LE(relative, tolerance) << "iteration " << i + 1;
      EXPECT_NEAR(history[i].gradNorm, reference[i].gradNorm,
                  (pair.bf16 ? 5e-2 : 1e-4) * reference[i].gradNorm)
          << "iteration " << i + 1;
    }
  }
  std::cout << "[ tp2      ] " << pair.tp2 << " vs " << pair.one
            << ", 5 iterations: loss " << reference.front().loss << " -> "
            << reference.back().loss << " (one rank) / "
            << ranks[0].back().loss
            << " (TP=2); largest relative loss difference " << worst << "\n";
}

INSTANTIATE_TEST_SUITE_P(
    TinyGpt, CudaTensorParallelTest,
    ::testing::Values(
        Pair{"tiny-gpt-nodrop", "tiny-gpt-nodrop-tp2", false, "Fp32", 0},
        // Per layer: the two row-parallel outputs' all-reduces (operand and
        // result) and bias_adds (result), the two all-reduces of dx in the
        // backward; the embedding's rows and their all-reduce, the logits
        // and dlogits, and dlogits' dx all-reduce: 2 * 10 + 6 = 26.
        Pair{"tiny-gpt-bf16-nodrop", "tiny-gpt-bf16-nodrop-tp2", true, "Bf16",
             26},
        // Sequence parallelism (--sequence-parallel): the residual stream
        // split along the sequence, all_gather and reduce_scatter along it
        // (an inner axis: the ranks' blocks interleaved by strided copies).
        Pair{"tiny-gpt-nodrop", "tiny-gpt-nodrop-tp2-sp", false,
             "SequenceParallelFp32", 0},
        // The forward's reduce-scatters and all-gathers, bias_add and the
        // backward's reduce-scatters of dx and gathers of dy in bf16
        // (bias_grad reads dy in bf16; 41 while it read fp32). The backward
        // pass also gathers the column-parallel layers' inputs again for
        // their weight gradients (mt-regather-in-backward: QKV and the MLP's
        // first in each of the 2 layers, the output layer), 5 more values in
        // bf16. Measured on the H200: 51.
        Pair{"tiny-gpt-bf16-nodrop", "tiny-gpt-bf16-nodrop-tp2-sp", true,
             "SequenceParallelBf16", 51},
        // Dropout 0.1 over split tensors: attention's probabilities split
        // by heads, and with sequence parallelism the hidden dropouts'
        // sequence tiles; the masks are the one-rank run's.
        // The fused loss (--fuse-linear-cross-entropy, 300 tokens a chunk):
        // the vocabulary-parallel output layer's chunked ops, with the
        // all-reduces of the maxima and partials between them. bf16: the
        // block's logits and dlogits are gone (the chunked ops are not
        // multi-rank instructions), 26 - 2.
        Pair{"tiny-gpt-nodrop", "tiny-gpt-nodrop-tp2-lce", false,
             "FusedLossFp32", 0},
        Pair{"tiny-gpt-nodrop", "tiny-gpt-nodrop-tp2-sp-lce", false,
             "FusedLossSequenceParallelFp32", 0},
        Pair{"tiny-gpt-bf16-nodrop", "tiny-gpt-bf16-nodrop-tp2-lce", true,
             "FusedLossBf16", 24},
        Pair{"tiny-gpt", "tiny-gpt-tp2", false, "DropoutFp32", 0},
        Pair{"tiny-gpt", "tiny-gpt-tp2-sp", false,
             "DropoutSequenceParallelFp32", 0}),
    [](const ::testing::TestParamInfo<Pair> &info) {
      return std::string(info.param.name);
    });

} // namespace
