// Context parallelism on one GPU (issue 24; docs/Parallelism.md, "Context
// parallelism"):
// - the ring attention's kernels (kernels/AttentionBlocks.cu) called
//   directly against the host's in float64: every block of both ranks of
//   CP2 (each ring step and the gathered block), the merge of a rank's two
//   blocks, the backward's delta and each block's dq, dk, dv, with dropout
//   0.1 and grouped-query heads, fp32 and bf16 storage;
// - tiny Llama (RoPE, grouped-query heads) and tiny GPT (learned
//   positions) at sequence 256 with hidden and attention dropout 0.1,
//   compiled for CP2 and CP2 x TP2 + SP, run as in-process ranks sharing
//   the GPU: one train_step's loss and every gradient (the data x context
//   reduction of the gradient buffer included) against the one-rank
//   bundle on the GPU and on the host, and 5 training iterations against
//   the host trainer on the same bundle and the one-rank GPU trainer.
// fp32 within 1e-4 (loss and gradients); bf16 loss within 2e-2 and every
// gradient's cosine at least 0.999 (CudaTensorParallelTest's tolerances).
#include "CudaTestSupport.h"

#include "comm/InProcessWorld.h"
#include "comm/RankContext.h"
#include "comm/RunRanks.h"
#include "core/ContextLayout.h"
#include "cuda/DataParallel.h"
#include "cuda/Executor.h"
#include "cuda/ParameterStore.h"
#include "cuda/Trainer.h"
#include "cuda/kernels/AttentionBlocks.h"
#include "host/Executor.h"
#include "host/ParameterStore.h"
#include "host/ThreadPool.h"
#include "host/kernels/Kernels.h"
#include "train/Trainer.h"

#include <cstring>
#include <iostream>
#include <limits>
#include <mutex>
#include <optional>
#include <sstream>

using namespace mtrt;
using namespace mtrt::test;

namespace {

//===----------------------------------------------------------------------===//
// The kernels against the host's
//===----------------------------------------------------------------------===//

/// float -> bf16 bits, round to nearest even (finite values).
uint16_t toBf16(float value) {
  uint32_t word;
  std::memcpy(&word, &value, sizeof(word));
  word += 0x7fffu + ((word >> 16) & 1u);
  return static_cast<uint16_t>(word >> 16);
}

float fromBf16(uint16_t bits) {
  uint32_t word = static_cast<uint32_t>(bits) << 16;
  float value;
  std::memcpy(&value, &word, sizeof(value));
  return value;
}

/// Device elements of one storage type: fp32, or bf16.
class DeviceElements {
public:
  DeviceElements(size_t n, bool bf16)
      : n_(n), bf16_(bf16),
        buffer_(std::max<size_t>(1, n) * (bf16 ? 2 : 4), "test elements") {}
  /// Uploads `values` (rounded to bf16 when so held); returns what the
  /// device holds, widened.
  std::vector<double> upload(const std::vector<double> &values) {
    std::vector<double> held(n_);
    if (bf16_) {
      std::vector<uint16_t> bits(n_);
      for (size_t i = 0; i < n_; ++i) {
        bits[i] = toBf16(static_cast<float>(values[i]));
        held[i] = fromBf16(bits[i]);
      }
      check(cudaMemcpy(buffer_.data(), bits.data(), 2 * n_,
                       cudaMemcpyHostToDevice));
    } else {
      std::vector<float> floats(n_);
      for (size_t i = 0; i < n_; ++i) {
        floats[i] = static_cast<float>(values[i]);
        held[i] = floats[i];
      }
      check(cudaMemcpy(buffer_.data(), floats.data(), 4 * n_,
                       cudaMemcpyHostToDevice));
    }
    return held;
  }
  std::vector<double> download() const {
    std::vector<double> values(n_);
    check(cudaDeviceSynchronize());
    if (bf16_) {
      std::vector<uint16_t> bits(n_);
      check(cudaMemcpy(bits.data(), buffer_.data(), 2 * n_,
                       cudaMemcpyDeviceToHost));
      for (size_t i = 0; i < n_; ++i)
        values[i] = fromBf16(bits[i]);
    } else {
      std::vector<float> floats(n_);
      check(cudaMemcpy(floats.data(), buffer_.data(), 4 * n_,
                       cudaMemcpyDeviceToHost));
      for (size_t i = 0; i < n_; ++i)
        values[i] = floats[i];
    }
    return values;
  }
  cuda::InElements in() const {
    if (bf16_)
      return static_cast<const __nv_bfloat16 *>(buffer_.data());
    return static_cast<const float *>(buffer_.data());
  }
  cuda::OutElements out() {
    if (bf16_)
      return static_cast<__nv_bfloat16 *>(buffer_.data());
    return static_cast<float *>(buffer_.data());
  }
  float *floats() { return static_cast<float *>(buffer_.data()); }

private:
  static void check(cudaError_t status) {
    ASSERT_EQ(status, cudaSuccess) << cudaGetErrorString(status);
  }
  size_t n_;
  bool bf16_;
  cuda::DeviceBuffer buffer_;
};

void rethrowRankErrors(const std::vector<std::exception_ptr> &errors) {
  for (auto &error : errors) {
    if (!error)
      continue;
    try {
      std::rethrow_exception(error);
    } catch (const std::exception &e) {
      ADD_FAILURE() << "a rank failed: " << e.what();
    }
  }
}

std::vector<double> normals(size_t n, uint64_t seed, double scale) {
  std::vector<double> values(n);
  for (size_t i = 0; i < n; ++i)
    values[i] = scale * random::normal(seed, 23, static_cast<uint64_t>(i));
  return values;
}

/// The largest |a - b| over the largest |b| (b the reference); -inf must
/// meet -inf.
double relative(const std::vector<double> &a, const std::vector<double> &b,
                const std::string &what) {
  double difference = 0, largest = 0;
  for (size_t i = 0; i < b.size(); ++i) {
    if (std::isinf(b[i]) || std::isinf(a[i])) {
      EXPECT_EQ(a[i], b[i]) << what << " at " << i;
      continue;
    }
    EXPECT_FALSE(std::isnan(a[i])) << what << ": NaN at " << i;
    difference = std::max(difference, std::abs(a[i] - b[i]));
    largest = std::max(largest, std::abs(b[i]));
  }
  return largest > 0 ? difference / largest : difference;
}

struct KernelCase {
  bool bf16;
  double dropout;
  const char *name;
};

class CudaAttentionBlockKernelTest
    : public ::testing::TestWithParam<KernelCase> {};

// Both ranks of CP2 over a 64-long sequence (chunks of 16: rank 0 holds
// positions 0-15 and 48-63, rank 1 16-47), 2 samples, 4 query heads
// sharing 2 key/value heads of 16, a rank at head offset 4 of 8 and batch
// offset 2 (a tensor- and data-parallel rank's dropout positions): the
// ring's two blocks, merged; the gathered block; the delta; each block's
// gradients. Tolerances: fp32 1e-5 of the largest magnitude (5e-5 for
// the gradients, sums of 64 terms), bf16 storage 1e-2 (outputs rounded to
// bf16).
TEST_P(CudaAttentionBlockKernelTest, RingBlocksEqualTheHost) {
  MTRT_REQUIRE_GPU();
  const KernelCase &c = GetParam();
  const int64_t cp = 2, seq = 64, local = seq / cp;
  host::AttentionParams p;
  p.batch = 2;
  p.seqQ = local;
  p.headsQ = 4;
  p.headsKv = 2;
  p.headDim = 16;
  p.headDimV = 16;
  p.causal = true;
  p.dropoutP = c.dropout;
  p.seed = 7;
  p.firstSample = 11;
  p.batchOffset = 2;
  p.headOffset = 4;
  p.globalHeadsQ = 8;
  const size_t qN = static_cast<size_t>(p.batch * local * p.headsQ * 16);
  const size_t kvN = static_cast<size_t>(p.batch * local * p.headsKv * 16);
  const size_t rows = static_cast<size_t>(p.batch * p.headsQ * local);
  double outputTolerance = c.bf16 ? 1e-2 : 1e-5;
  double gradientTolerance = c.bf16 ? 1e-2 : 5e-5;
  host::ThreadPool pool(1);
  cudaStream_t stream = nullptr;

  // Every rank's keys and values (the ring's blocks come from them).
  std::vector<std::vector<double>> keys, values;
  std::vector<DeviceElements> kDevice, vDevice;
  for (int64_t r = 0; r < cp; ++r) {
    kDevice.emplace_back(kvN, c.bf16);
    vDevice.emplace_back(kvN, c.bf16);
    keys.push_back(kDevice.back().upload(normals(kvN, 100 + r, 1.0)));
    values.push_back(vDevice.back().upload(normals(kvN, 200 + r, 1.0)));
  }
  for (int64_t rank = 0; rank < cp; ++rank) {
    SCOPED_TRACE("context rank " + std::to_string(rank));
    DeviceElements qDevice(qN, c.bf16), doutDevice(qN, c.bf16);
    std::vector<double> q = qDevice.upload(normals(qN, 300 + rank, 1.0));
    std::vector<double> dout = doutDevice.upload(normals(qN, 400 + rank, 1.0));
    std::vector<int64_t> queryPositions(static_cast<size_t>(local));
    host::contextParallelPositions(rank, cp, seq, queryPositions.data());
    // The layout's positions are the host's.
    for (int64_t i = 0; i < local; ++i)
      ASSERT_EQ(contextGlobalPosition(ContextTile{rank * local, seq, cp}, i),
                queryPositions[static_cast<size_t>(i)]);

    // The ring: step s holds rank (rank - s) mod cp's keys.
    std::vector<double> mergedOut(qN, 0.0),
        mergedLse(rows, -std::numeric_limits<double>::infinity());
    DeviceElements outDevice(qN, c.bf16), blockDevice(qN, c.bf16);
    cuda::DeviceBuffer lse(rows * 4, "lse"), blockLse(rows * 4, "block lse");
    std::vector<std::vector<int64_t>> keyPositions(static_cast<size_t>(cp));
    for (int64_t step = 0; step < cp; ++step) {
      SCOPED_TRACE("ring step " + std::to_string(step));
      int64_t owner = (rank - step + cp) % cp;
      keyPositions[step].resize(static_cast<size_t>(local));
      host::contextParallelPositions(owner, cp, seq,
                                     keyPositions[step].data());
      host::AttentionParams hp = p;
      hp.seqK = local;
      host::AttentionBlock block{queryPositions.data(),
                                 keyPositions[step].data(), seq};
      std::vector<double> out(qN), blockLseHost(rows);
      host::attentionBlockForward<double>(pool, hp, block, q.data(),
                                          keys[owner].data(),
                                          values[owner].data(), out.data(),
                                          blockLseHost.data());
      cuda::AttentionBlockLayout layout{ContextTile{rank * local, seq, cp},
                                        ContextTile{owner * local, seq, cp}};
      // Step 0 writes the running pair, later steps a block to merge.
      DeviceElements &target = step == 0 ? outDevice : blockDevice;
      float *targetLse = static_cast<float *>(step == 0 ? lse.data()
                                                        : blockLse.data());
      cuda::attentionBlockForward(stream, hp, layout, qDevice.in(),
                                  kDevice[owner].in(), vDevice[owner].in(),
                                  target.out(), targetLse);
      ASSERT_EQ(cudaGetLastError(), cudaSuccess);
      std::vector<float> lseBits(rows);
      ASSERT_EQ(cudaMemcpy(lseBits.data(), targetLse, rows * 4,
                           cudaMemcpyDeviceToHost),
                cudaSuccess);
      std::vector<double> lseDevice(lseBits.begin(), lseBits.end());
      EXPECT_LE(relative(target.download(), out, "block out"),
                outputTolerance);
      EXPECT_LE(relative(lseDevice, blockLseHost, "block logsumexp"), 1e-5);
      host::attentionMergeBlock<double>(pool, hp, out.data(),
                                        blockLseHost.data(), mergedOut.data(),
                                        mergedLse.data());
      if (step > 0) {
        cuda::attentionMerge(stream, p.batch, local, p.headsQ, p.headDimV,
                             outDevice.in(),
                             static_cast<const float *>(lse.data()),
                             blockDevice.in(),
                             static_cast<const float *>(blockLse.data()),
                             outDevice.out(), static_cast<float *>(lse.data()));
        ASSERT_EQ(cudaGetLastError(), cudaSuccess);
      }
    }
    // The merged pair (in place, as the plan may give it).
    std::vector<float> lseBits(rows);
    ASSERT_EQ(cudaMemcpy(lseBits.data(), lse.data(), rows * 4,
                         cudaMemcpyDeviceToHost),
              cudaSuccess);
    std::vector<double> lseMerged(lseBits.begin(), lseBits.end());
    EXPECT_LE(relative(outDevice.download(), mergedOut, "merged out"),
              outputTolerance);
    EXPECT_LE(relative(lseMerged, mergedLse, "merged logsumexp"), 1e-5);

    // The gathered block (all_gather: every rank's keys in rank order).
    {
      std::vector<double> gatheredK, gatheredV;
      std::vector<int64_t> gatheredPositions;
      // [batch, cp * local, heads, dim]: each rank's rows, sample by sample.
      const size_t rowK = static_cast<size_t>(p.headsKv * 16);
      for (int64_t b = 0; b < p.batch; ++b)
        for (int64_t r = 0; r < cp; ++r)
          for (int64_t j = 0; j < local; ++j)
            for (size_t e = 0; e < rowK; ++e) {
              size_t from = static_cast<size_t>(b * local + j) * rowK + e;
              gatheredK.push_back(keys[r][from]);
              gatheredV.push_back(values[r][from]);
            }
      for (int64_t r = 0; r < cp; ++r)
        for (int64_t j = 0; j < local; ++j)
          gatheredPositions.push_back(
              contextGlobalPosition(ContextTile{r * local, seq, cp}, j));
      DeviceElements gk(gatheredK.size(), c.bf16), gv(gatheredV.size(), c.bf16);
      gk.upload(gatheredK);
      gv.upload(gatheredV);
      host::AttentionParams hp = p;
      hp.seqK = seq;
      host::AttentionBlock block{queryPositions.data(),
                                 gatheredPositions.data(), seq};
      std::vector<double> out(qN), lseHost(rows);
      host::attentionBlockForward<double>(pool, hp, block, q.data(),
                                          gatheredK.data(), gatheredV.data(),
                                          out.data(), lseHost.data());
      DeviceElements gathered(qN, c.bf16);
      cuda::DeviceBuffer gatheredLse(rows * 4, "gathered lse");
      cuda::attentionBlockForward(
          stream, hp,
          {ContextTile{rank * local, seq, cp}, ContextTile{0, seq, cp}},
          qDevice.in(), gk.in(), gv.in(), gathered.out(),
          static_cast<float *>(gatheredLse.data()));
      ASSERT_EQ(cudaGetLastError(), cudaSuccess);
      EXPECT_LE(relative(gathered.download(), out, "gathered block out"),
                outputTolerance);
      // The gathered block is the whole row: the ring's merge equals it.
      EXPECT_LE(relative(mergedOut, out, "ring vs gathered (host)"), 1e-12);
    }

    // The backward: delta from the merged output, then each block's terms.
    cuda::DeviceBuffer delta(rows * 4, "delta");
    cuda::attentionDelta(stream, p.batch, local, p.headsQ, p.headDimV,
                         outDevice.in(), doutDevice.in(),
                         static_cast<float *>(delta.data()));
    ASSERT_EQ(cudaGetLastError(), cudaSuccess);
    // The host's delta of the output the device holds (bf16: rounded).
    std::vector<double> heldOut = outDevice.download();
    std::vector<double> deltaHost(rows);
    host::attentionBackwardDelta<double>(pool, [&] {
      host::AttentionParams hp = p;
      hp.seqK = local;
      return hp;
    }(), heldOut.data(), dout.data(), deltaHost.data());
    std::vector<float> deltaBits(rows);
    ASSERT_EQ(cudaMemcpy(deltaBits.data(), delta.data(), rows * 4,
                         cudaMemcpyDeviceToHost),
              cudaSuccess);
    EXPECT_LE(relative(std::vector<double>(deltaBits.begin(), deltaBits.end()),
                       deltaHost, "delta"),
              1e-5);
    std::vector<double> lseAsUsed(lseBits.begin(), lseBits.end());
    std::vector<double> deltaAsUsed(deltaBits.begin(), deltaBits.end());
    for (int64_t step = 0; step < cp; ++step) {
      SCOPED_TRACE("gradient of ring step " + std::to_string(step));
      int64_t owner = (rank - step + cp) % cp;
      host::AttentionParams hp = p;
      hp.seqK = local;
      host::AttentionBlock block{queryPositions.data(),
                                 keyPositions[step].data(), seq};
      std::vector<double> dq(qN, 0.0), dk(kvN, 0.0), dv(kvN, 0.0);
      host::attentionBlockBackward<double>(
          pool, hp, block, q.data(), keys[owner].data(), values[owner].data(),
          lseAsUsed.data(), deltaAsUsed.data(), dout.data(), dq.data(),
          dk.data(), dv.data());
      DeviceElements dqDevice(qN, c.bf16), dkDevice(kvN, c.bf16),
          dvDevice(kvN, c.bf16);
      cuda::attentionBlockBackward(
          stream, hp,
          {ContextTile{rank * local, seq, cp},
           ContextTile{owner * local, seq, cp}},
          qDevice.in(), kDevice[owner].in(), vDevice[owner].in(),
          static_cast<const float *>(lse.data()),
          static_cast<const float *>(delta.data()), doutDevice.in(),
          dqDevice.out(), dkDevice.out(), dvDevice.out());
      ASSERT_EQ(cudaGetLastError(), cudaSuccess);
      EXPECT_LE(relative(dqDevice.download(), dq, "dq"), gradientTolerance);
      EXPECT_LE(relative(dkDevice.download(), dk, "dk"), gradientTolerance);
      EXPECT_LE(relative(dvDevice.download(), dv, "dv"), gradientTolerance);
    }
  }
}

INSTANTIATE_TEST_SUITE_P(
    Kernels, CudaAttentionBlockKernelTest,
    ::testing::Values(KernelCase{false, 0.0, "Fp32"},
                      KernelCase{false, 0.1, "Fp32Dropout"},
                      KernelCase{true, 0.1, "Bf16Dropout"}),
    [](const ::testing::TestParamInfo<KernelCase> &info) {
      return std::string(info.param.name);
    });

// Shapes the block kernels cannot take are named with the numbers: a head
// dimension over 256, a key block whose row of scores exceeds the device's
// shared memory; the shapes of the tests (and the long-context layout's
// 16384-key blocks) are taken.
TEST(CudaAttentionBlockLimitsTest, UnsupportedShapesAreNamed) {
  MTRT_REQUIRE_GPU();
  host::AttentionParams p;
  p.batch = 1;
  p.seqQ = 128;
  p.seqK = 128;
  p.headsQ = 8;
  p.headsKv = 2;
  p.headDim = 16;
  p.headDimV = 16;
  p.causal = true;
  EXPECT_EQ(cuda::attentionBlockUnsupportedReason(p, 0), "");
  p.seqQ = p.seqK = 16384;
  p.headDim = p.headDimV = 128;
  EXPECT_EQ(cuda::attentionBlockUnsupportedReason(p, 0), "");
  p.headDim = p.headDimV = 512;
  EXPECT_NE(cuda::attentionBlockUnsupportedReason(p, 0).find(
                "head dimensions 512 and 512 exceed the attention block "
                "kernels' 256"),
            std::string::npos);
  p.headDim = p.headDimV = 128;
  p.seqK = 65536;
  std::string reason = cuda::attentionBlockUnsupportedReason(p, 0);
  EXPECT_NE(reason.find("a block of 65536 keys needs 525312 bytes of shared "
                        "memory per thread block"),
            std::string::npos)
      << reason;
}

// A bundle whose blocks the kernels cannot take is refused when its
// executor is made, naming the instruction and the limit (tiny Llama with
// --kv-channels 512 under CP2).
TEST(CudaAttentionBlockLimitsTest, ABundleOverTheLimitIsRefusedAtLoad) {
  MTRT_REQUIRE_GPU();
  Bundle bundle = loadTestBundle(
      "tiny-llama-hd512-cp2",
      "megatron-compile models/tiny-llama.yaml --seq-length 64 "
      "--micro-batch-size 1 --global-batch-size 1 --kv-channels 512 "
      "--context-parallel-size 2");
  comm::InProcessWorld world(static_cast<int>(bundle.rankCount()));
  std::vector<std::string> messages(bundle.rankCount());
  auto errors = comm::runRanks(world, [&](comm::Communicator &c) {
    comm::RankContext rank(c, bundle.gridShape());
    cuda::Context context;
    cuda::ParameterStore store(bundle, context);
    try {
      cuda::Executor executor(bundle, "train_step", store, &rank);
    } catch (const Error &e) {
      EXPECT_EQ(e.code(), MTRT_STATUS_UNIMPLEMENTED);
      messages[static_cast<size_t>(c.rank())] = e.what();
    }
  });
  rethrowRankErrors(errors);
  for (const std::string &message : messages) {
    EXPECT_NE(message.find("the cuda backend cannot run this attention "
                           "block yet: head dimensions 512 and 512 exceed "
                           "the attention block kernels' 256"),
              std::string::npos)
        << "message: '" << message << "'";
  }
}

//===----------------------------------------------------------------------===//
// Compiled models on in-process ranks
//===----------------------------------------------------------------------===//

struct StepResult {
  double loss = 0;
  /// Per parameter, the global gradient (NaN where no rank wrote).
  std::vector<host::Tensor> gradients;
};

/// The micro-batch of 2 samples of 256 tokens every run reads.
struct GlobalBatch {
  host::Tensor tokens = randomIds({2, 256}, 256, 3);
  host::Tensor labels = randomIds({2, 256}, 256, 4);
};

/// The rank's chunks r and 2 cp - 1 - r of each sample, as the trainer
/// gives them (train::Trainer::readSamples).
host::Tensor rankChunks(const host::Tensor &global, int64_t cp, int64_t r) {
  int64_t batch = global.shape[0], seq = global.shape[1];
  int64_t chunk = seq / (2 * cp);
  host::Tensor local(DType::I32, {batch, seq / cp});
  for (int64_t b = 0; b < batch; ++b)
    for (int64_t half = 0; half < 2; ++half) {
      int64_t from = (half == 0 ? r : 2 * cp - 1 - r) * chunk;
      std::memcpy(local.data<int32_t>() + b * (seq / cp) + half * chunk,
                  global.data<int32_t>() + b * seq + from,
                  sizeof(int32_t) * static_cast<size_t>(chunk));
    }
  return local;
}

/// The grid axis of the bundle's context-parallel instructions and its size.
std::pair<int64_t, int64_t> contextAxis(const Bundle &bundle) {
  for (const Function &fn : bundle.functions())
    for (const Instruction &inst : fn.instructions)
      if (inst.op == Op::AttentionBlock)
        return {inst.attrs.contextAxis, inst.attrs.contextSize};
  return {-1, 1};
}

StepResult oneRankOnDevice(const Bundle &bundle, const GlobalBatch &batch) {
  host::ThreadPool pool(0);
  host::ParameterStore hostStore(bundle, DType::F32);
  hostStore.initialize(pool, 1234);
  hostStore.zeroGradients(pool);
  cuda::Context context;
  cuda::ParameterStore store(bundle, context);
  store.upload(hostStore);
  cuda::Executor executor(bundle, "train_step", store);
  StepResult result;
  result.loss = executor.run({viewOf(batch.tokens), viewOf(batch.labels)},
                             {5, 5})[0]
                    .data<float>()[0];
  for (size_t p = 0; p < store.size(); ++p)
    result.gradients.push_back(store.gradientToHost(p));
  return result;
}

StepResult oneRankOnHost(const Bundle &bundle, const GlobalBatch &batch) {
  host::ThreadPool pool(0);
  host::ParameterStore store(bundle, DType::F32);
  store.initialize(pool, 1234);
  store.zeroGradients(pool);
  host::Executor executor(bundle, "train_step", store, pool);
  StepResult result;
  result.loss = executor.run({viewOf(batch.tokens), viewOf(batch.labels)},
                             {5, 5})[0]
                    .data<float>()[0];
  for (size_t p = 0; p < store.size(); ++p) {
    const host::Tensor &g = store.gradient(p);
    host::Tensor copy(DType::F32, g.shape);
    std::memcpy(copy.data<float>(), g.data<float>(),
                sizeof(float) * static_cast<size_t>(g.numElements()));
    result.gradients.push_back(std::move(copy));
  }
  return result;
}

/// One train_step on every rank of `bundle` (threads sharing the GPU), the
/// gradient buffer reduced over its data x context group as the trainer
/// does; each rank's gradient shards written into the global gradients.
StepResult inProcessRanks(const Bundle &bundle, const GlobalBatch &batch) {
  auto [axis, cp] = contextAxis(bundle);
  EXPECT_GT(cp, 1) << "bundle '" << bundle.name()
                   << "' has no context-parallel attention";
  StepResult result;
  for (const Parameter &p : bundle.parameters()) {
    result.gradients.emplace_back(DType::F32, p.type.shape);
    float *data = result.gradients.back().data<float>();
    for (int64_t i = 0; i < p.type.numElements; ++i)
      data[i] = NAN;
  }
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
    int64_t r = rank.coordinates()[static_cast<size_t>(axis)];
    host::Tensor tokens = rankChunks(batch.tokens, cp, r);
    host::Tensor labels = rankChunks(batch.labels, cp, r);
    double loss =
        executor.run({viewOf(tokens), viewOf(labels)}, {5, 5})[0]
            .data<float>()[0];
    if (bundle.hasGradientBuffer()) {
      cuda::DataParallelBuffer buffer(bundle, store, rank);
      buffer.reduceGradients();
    }
    std::lock_guard<std::mutex> lock(mutex);
    losses[static_cast<size_t>(c.rank())] = loss;
    for (size_t p = 0; p < store.size(); ++p) {
      const Parameter &info = hostStore.info(p);
      host::Tensor shard = store.gradientToHost(p);
      std::vector<int64_t> offsets = hostStore.shardOffsets(p);
      for (int64_t i = 0; i < info.localType.numElements; ++i) {
        float &slot = result.gradients[p].data<float>()[shardElementIndex(
            info, offsets, i)];
        float value = shard.data<float>()[i];
        EXPECT_TRUE(std::isnan(slot) ||
                    std::abs(slot - value) <= 1e-6f * std::abs(value) + 1e-12f)
            << info.name << ": the ranks' replicas differ (" << slot << " vs "
            << value << ")";
        slot = value;
      }
    }
  });
  rethrowRankErrors(errors);
  for (double loss : losses)
    EXPECT_EQ(loss, losses[0]) << "the ranks report different losses";
  result.loss = losses[0];
  return result;
}

struct ModelCase {
  const char *one; // the one-rank bundle
  const char *cp;  // the context-parallel one
  bool bf16;
  const char *name;
};

/// The vocabulary is padded to a multiple of make-vocab-size-divisible-by
/// times the tensor ranks: 512 for one rank and CP2, 256 x 2 for CP2 x TP2,
/// so that every bundle is one model (512 rows).
const char *const kHowToMake =
    "megatron-compile models/tiny-{llama,gpt}.yaml --seq-length 256 "
    "[--max-position-embeddings 256] --hidden-dropout 0.1 "
    "--attention-dropout 0.1 --micro-batch-size 2 --global-batch-size 2 "
    "[--bf16] (--make-vocab-size-divisible-by 512 [--context-parallel-size "
    "2] | --make-vocab-size-divisible-by 256 --context-parallel-size 2 "
    "--tensor-model-parallel-size 2 --sequence-parallel) "
    "(bench/run-context-parallel.sh)";

class CudaContextParallelTest : public ::testing::TestWithParam<ModelCase> {};

/// Compares `actual` with `reference` (named `against`): fp32 loss and
/// every gradient within 1e-4, bf16 loss within 2e-2 and every gradient's
/// cosine at least 0.999.
void compareSteps(const Bundle &bundle, const StepResult &actual,
                  const StepResult &reference, bool bf16,
                  const std::string &against) {
  ASSERT_EQ(actual.gradients.size(), reference.gradients.size());
  double lossDifference =
      std::abs(actual.loss - reference.loss) / std::abs(reference.loss);
  EXPECT_LE(lossDifference, bf16 ? 2e-2 : 1e-4)
      << "loss: " << against << " " << reference.loss << ", CP "
      << actual.loss;
  double worstRelative = 0, worstCosine = 1;
  for (size_t p = 0; p < reference.gradients.size(); ++p) {
    const std::string &name = bundle.parameters()[p].name;
    // One model: the same shapes (a vocabulary padded otherwise differs).
    ASSERT_EQ(actual.gradients[p].shape, reference.gradients[p].shape)
        << "gradient of " << name << " vs " << against;
    for (int64_t i = 0; i < actual.gradients[p].numElements(); ++i)
      ASSERT_FALSE(std::isnan(actual.gradients[p].data<float>()[i]))
          << name << ": no rank wrote element " << i;
    double relative =
        relativeDifference(actual.gradients[p], reference.gradients[p]);
    double cosine =
        cosineSimilarity(actual.gradients[p], reference.gradients[p]);
    worstRelative = std::max(worstRelative, relative);
    worstCosine = std::min(worstCosine, cosine);
    if (bf16)
      EXPECT_GE(cosine, 0.999) << "gradient of " << name << " vs " << against;
    else
      EXPECT_LE(relative, 1e-4) << "gradient of " << name << " vs " << against;
  }
  std::cout << "[ cp       ] " << bundle.name() << " vs " << against
            << ": loss " << actual.loss << " vs " << reference.loss
            << " (relative " << lossDifference
            << "), largest relative gradient difference " << worstRelative
            << ", smallest gradient cosine " << worstCosine << "\n";
}

TEST_P(CudaContextParallelTest, OneStepEqualsOneRankOnTheGpuAndTheHost) {
  MTRT_REQUIRE_GPU();
  const ModelCase &c = GetParam();
  Bundle one = loadTestBundle(c.one, kHowToMake);
  Bundle cp = loadTestBundle(c.cp, kHowToMake);
  GlobalBatch batch;
  StepResult ranks = inProcessRanks(cp, batch);
  compareSteps(cp, ranks, oneRankOnDevice(one, batch), c.bf16,
               std::string("one rank on the GPU (") + c.one + ")");
  compareSteps(cp, ranks, oneRankOnHost(one, batch), c.bf16,
               std::string("one rank on the host (") + c.one + ")");
}

// 5 iterations of cuda::Trainer on the CP ranks (the trainer reads each
// rank's chunks, reduces the gradient buffer over data x context) against
// train::Trainer on the host running the same bundle's ranks, and against
// the one-rank cuda::Trainer, from the same seed and data.
TEST_P(CudaContextParallelTest, TrainingEqualsTheHostAndOneRank) {
  MTRT_REQUIRE_GPU();
  const ModelCase &c = GetParam();
  Bundle one = loadTestBundle(c.one, kHowToMake);
  Bundle cp = loadTestBundle(c.cp, kHowToMake);
  train::TrainerOptions options;
  options.trainIters = 5;
  options.lr = 1e-3;
  options.lrWarmupIters = 2;
  options.evalInterval = 0;
  options.progressBar = false;
  options.seed = 1234;
  options.clipGrad = 0.5; // small enough to clip: the world's norm matters
  std::string corpus = multiRankCorpus();

  std::vector<train::IterationRecord> oneRank;
  {
    cuda::Trainer trainer(one, corpus, "corpus", options);
    std::ostringstream log;
    trainer.train(log);
    oneRank = trainer.history();
  }
  auto runRanks = [&](bool device) {
    std::vector<std::vector<train::IterationRecord>> histories(cp.rankCount());
    comm::InProcessWorld world(static_cast<int>(cp.rankCount()));
    auto errors = comm::runRanks(world, [&](comm::Communicator &comm) {
      comm::RankContext rank(comm, cp.gridShape());
      std::ostringstream log;
      if (device) {
        cuda::Trainer trainer(cp, corpus, "corpus", options, {}, &rank);
        trainer.train(log);
        histories[static_cast<size_t>(comm.rank())] = trainer.history();
      } else {
        train::Trainer trainer(cp, corpus, "corpus", options, &rank);
        trainer.train(log);
        histories[static_cast<size_t>(comm.rank())] = trainer.history();
      }
    });
    rethrowRankErrors(errors);
    return histories;
  };
  auto onDevice = runRanks(true);
  auto onHost = runRanks(false);
  double lossTolerance = c.bf16 ? 2e-2 : 1e-4;
  double normTolerance = c.bf16 ? 5e-2 : 1e-4;
  double worstHost = 0, worstOne = 0;
  ASSERT_EQ(oneRank.size(), 5u);
  auto compare = [&](size_t r, size_t i,
                     const train::IterationRecord &reference, double &worst,
                     const char *what) {
    const train::IterationRecord &d = onDevice[r][i];
    double relative =
        std::abs(d.loss - reference.loss) / std::abs(reference.loss);
    worst = std::max(worst, relative);
    EXPECT_LE(relative, lossTolerance)
        << "rank " << r << ", iteration " << i + 1 << ", vs " << what;
    EXPECT_NEAR(d.gradNorm, reference.gradNorm,
                normTolerance * reference.gradNorm)
        << "rank " << r << ", iteration " << i + 1 << ", vs " << what;
  };
  for (size_t r = 0; r < onDevice.size(); ++r) {
    ASSERT_EQ(onDevice[r].size(), 5u) << "rank " << r;
    ASSERT_EQ(onHost[r].size(), 5u) << "rank " << r;
    for (size_t i = 0; i < 5; ++i) {
      compare(r, i, onHost[r][i], worstHost, "the host's ranks");
      compare(r, i, oneRank[i], worstOne, "one rank on the GPU");
    }
  }
  std::cout << "[ cp       ] " << c.cp << ", 5 iterations: loss "
            << onDevice[0].front().loss << " -> " << onDevice[0].back().loss
            << " (GPU ranks), " << onHost[0].back().loss << " (host ranks), "
            << oneRank.back().loss << " (one rank, GPU); largest relative loss "
            << "difference " << worstHost << " vs the host, " << worstOne
            << " vs one rank\n";
}

INSTANTIATE_TEST_SUITE_P(
    TinyModels, CudaContextParallelTest,
    ::testing::Values(
        ModelCase{"tiny-llama-s256", "tiny-llama-s256-cp2", false,
                  "LlamaCp2Fp32"},
        ModelCase{"tiny-llama-s256", "tiny-llama-s256-cp2-tp2-sp", false,
                  "LlamaCp2Tp2Fp32"},
        ModelCase{"tiny-llama-s256-bf16", "tiny-llama-s256-bf16-cp2", true,
                  "LlamaCp2Bf16"},
        ModelCase{"tiny-llama-s256-bf16", "tiny-llama-s256-bf16-cp2-tp2-sp",
                  true, "LlamaCp2Tp2Bf16"},
        ModelCase{"tiny-gpt-s256", "tiny-gpt-s256-cp2", false, "GptCp2Fp32"},
        ModelCase{"tiny-gpt-s256", "tiny-gpt-s256-cp2-tp2-sp", false,
                  "GptCp2Tp2Fp32"},
        ModelCase{"tiny-gpt-s256-bf16", "tiny-gpt-s256-bf16-cp2", true,
                  "GptCp2Bf16"},
        ModelCase{"tiny-gpt-s256-bf16", "tiny-gpt-s256-bf16-cp2-tp2-sp", true,
                  "GptCp2Tp2Bf16"}),
    [](const ::testing::TestParamInfo<ModelCase> &info) {
      return std::string(info.param.name);
    });

} // namespace
