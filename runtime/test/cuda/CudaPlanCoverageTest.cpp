// The CUDA backend runs in the compiler's memory plan and allocates nothing
// it does not name (issue 21): the compiled plan holds every kernel block
// the backend needs (each op's size from core/OpScratch.h, the definition
// the compiler uses too) and cuBLASLt's workspace in each GEMM's block; the
// executor refuses a plan that lacks a block, naming the instruction and
// both figures; a plan from before the workspace was planned still loads
// (the Gemm then brings its own); flash attention's views are in the plan
// too (`memory_plan.views`): the executor's arena is the plan's.
#include "core/AttentionViews.h"
#include "core/Bundle.h"
#include "core/Error.h"
#include "core/OpScratch.h"
#include "core/ScratchPlan.h"
#include "cuda/Context.h"
#include "cuda/Executor.h"
#include "cuda/ParameterStore.h"
#include "host/ParameterStore.h"
#include "host/ThreadPool.h"

#include "CudaTestSupport.h"

#include "gtest/gtest.h"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cstring>
#include <fstream>
#include <functional>
#include <iostream>
#include <iterator>
#include <string>

using namespace mtrt;
using namespace mtrt::test;

namespace {

const char *const kBundle = "tiny-gpt-bf16";
const char *const kHowToMake =
    "megatron-compile models/tiny-gpt.yaml --bf16 -o tiny-gpt-bf16.mtb";

bool isGemm(const std::string &op) {
  return op == "linear" || op == "linear_gelu" || op == "linear_gelu_grad" ||
         op == "matmul" || op == "linear_weight_grad" ||
         op == "linear_weight_bias_grad";
}

/// The test bundle with `edit` applied to train_step's side buffers (given
/// its instructions' op names), read again from its manifest.
Bundle editedBundle(
    const std::function<void(nlohmann::json &sides,
                             const std::vector<std::string> &ops)> &edit) {
  std::ifstream in(testBundlePath(kBundle, kHowToMake), std::ios::binary);
  std::string bytes((std::istreambuf_iterator<char>(in)),
                    std::istreambuf_iterator<char>());
  uint64_t manifestSize = 0;
  std::memcpy(&manifestSize, bytes.data() + 16, sizeof(manifestSize));
  nlohmann::json manifest =
      nlohmann::json::parse(bytes.substr(Bundle::kHeaderSize, manifestSize));
  std::string payload = bytes.substr(Bundle::kHeaderSize + manifestSize);
  for (nlohmann::json &fn : manifest["functions"]) {
    if (fn["name"] != "train_step")
      continue;
    std::vector<std::string> ops;
    for (const nlohmann::json &inst : fn["instructions"])
      ops.push_back(inst["op"]);
    edit(fn["memory_plan"]["side_buffers"], ops);
  }
  return Bundle::parseManifest(kBundle, manifest.dump(), payload);
}

const Function &trainStep(const Bundle &bundle) {
  for (const Function &fn : bundle.functions())
    if (fn.name == "train_step")
      return fn;
  throw Error(MTRT_STATUS_NOT_FOUND, "no train_step");
}

// No GPU needed: the runtime's needs against the compiled plan.
TEST(CudaPlanCoverageTest, TheCompiledPlanHoldsEveryBlockAndTheWorkspace) {
  // The test bundles are compiled into the device folder
  // (bench/make-device-dir.sh); without a GPU, cuda-plan-check.test checks
  // the plans on the CPU.
  MTRT_REQUIRE_GPU();
  Bundle bundle = loadTestBundle(kBundle, kHowToMake);
  for (const Function &fn : bundle.functions()) {
    bool workspace = false;
    EXPECT_NO_THROW(checkCudaMemoryPlan(bundle, fn, workspace)) << fn.name;
    EXPECT_TRUE(workspace) << fn.name;
  }
  const Function &fn = trainStep(bundle);
  ScratchPlan needs = planScratch(fn, /*mixedPrecision=*/true,
                                  /*gemmWorkspace=*/true);
  std::vector<uint64_t> given(fn.instructions.size(), 0);
  for (const MemoryPlan::SideBuffer &side : fn.memoryPlan->sideBuffers)
    if (side.copyOf < 0)
      given[side.instruction] = side.bytes;
  size_t gemms = 0, attentions = 0;
  for (size_t i = 0; i < fn.instructions.size(); ++i) {
    std::string op = opName(fn.instructions[i].op);
    EXPECT_GE(given[i], needs.bytes[i]) << "instructions[" << i << "] " << op;
    if (isGemm(op)) {
      ++gemms;
      EXPECT_GE(needs.bytes[i], scratch::kGemmWorkspaceBytes) << op;
    }
    if (op == "attention") {
      ++attentions;
      // Flash attention keeps its state for the paired gradient.
      EXPECT_NE(needs.attentionPartner[i], ScratchPlan::kNoPartner);
      EXPECT_EQ(needs.keptUntil[i], needs.attentionPartner[i]);
    }
  }
  EXPECT_GT(gemms, 0u);
  EXPECT_GT(attentions, 0u);
}

// A plan from before the workspace was planned (no GEMM's block holds it)
// still loads: the Gemm allocates its own.
TEST(CudaPlanCoverageTest, APlanWithoutTheWorkspaceLeavesItToTheGemm) {
  // The test bundles are compiled into the device folder
  // (bench/make-device-dir.sh); without a GPU, cuda-plan-check.test checks
  // the plans on the CPU.
  MTRT_REQUIRE_GPU();
  Bundle bundle = editedBundle([](nlohmann::json &sides,
                                  const std::vector<std::string> &ops) {
    nlohmann::json kept = nlohmann::json::array();
    for (nlohmann::json &side : sides) {
      if (isGemm(ops[side[0].get<size_t>()]) && side[4] == -1) {
        uint64_t bytes = side[2].get<uint64_t>() - scratch::kGemmWorkspaceBytes;
        if (bytes == 0)
          continue;
        side[2] = bytes;
      }
      kept.push_back(side);
    }
    sides = kept;
  });
  const Function &fn = trainStep(bundle);
  EXPECT_FALSE(planHoldsGemmWorkspace(fn));
  bool workspace = true;
  EXPECT_NO_THROW(checkCudaMemoryPlan(bundle, fn, workspace));
  EXPECT_FALSE(workspace);
}

void expectRefused(const Bundle &bundle, const std::string &message) {
  cuda::Context context;
  cuda::ParameterStore store(bundle, context);
  try {
    cuda::Executor executor(bundle, "train_step", store);
    FAIL() << "expected the plan to be refused";
  } catch (const Error &e) {
    EXPECT_EQ(e.code(), MTRT_STATUS_FAILED_PRECONDITION) << e.what();
    EXPECT_NE(std::string(e.what()).find(message), std::string::npos)
        << e.what();
  }
}

TEST(CudaPlanCoverageTest, TheExecutorRefusesAPlanWithoutAGemmsWorkspace) {
  MTRT_REQUIRE_GPU();
  Bundle bundle = editedBundle([](nlohmann::json &sides,
                                  const std::vector<std::string> &ops) {
    for (auto it = sides.begin(); it != sides.end(); ++it)
      if (ops[(*it)[0].get<size_t>()] == "linear" && (*it)[4] == -1) {
        sides.erase(it);
        return;
      }
  });
  // The first linear, tiny GPT's qkv projection: cuBLASLt's workspace and
  // its bias rounded to bf16 (384 elements, 768 bytes).
  expectRefused(bundle, "(linear): the cuda backend needs its kernel block "
                        "(scratch, saved state) of 33555200 bytes");
  expectRefused(bundle, "the bundle's memory plan has none there");
}

TEST(CudaPlanCoverageTest, TheExecutorRefusesAPlanShortOfFlashState) {
  MTRT_REQUIRE_GPU();
  Bundle bundle = editedBundle([](nlohmann::json &sides,
                                  const std::vector<std::string> &ops) {
    for (nlohmann::json &side : sides)
      if (ops[side[0].get<size_t>()] == "attention" && side[4] == -1) {
        side[2] = side[2].get<uint64_t>() - 256;
        return;
      }
  });
  expectRefused(bundle, "(attention): the cuda backend needs its kernel "
                        "block (scratch, saved state) of ");
}

// The plan places flash attention's views (issue 21): the executor elides
// the splits and concats the bundle names, puts their pieces at the plan's
// offsets and allocates no region beside the plan.
TEST(CudaPlanCoverageTest, TheExecutorsArenaIsThePlanViewsIncluded) {
  MTRT_REQUIRE_GPU();
  Bundle bundle = loadTestBundle(kBundle, kHowToMake);
  cuda::Context context;
  cuda::ParameterStore store(bundle, context);
  for (const Function &fn : bundle.functions()) {
    AttentionViewLayout views = readAttentionViews(fn, true);
    EXPECT_GT(views.views, 0u) << fn.name;
    cuda::Executor executor(bundle, fn.name, store);
    EXPECT_EQ(executor.arenaBytes(), fn.memoryPlan->arenaBytes) << fn.name;
    EXPECT_EQ(executor.elidedCopyCount(),
              static_cast<size_t>(
                  std::count(views.elided.begin(), views.elided.end(), true)))
        << fn.name;
    std::cout << "[ views    ] " << fn.name << ": arena "
              << executor.arenaBytes() << " bytes, plan "
              << fn.memoryPlan->arenaBytes << " bytes, " << views.views
              << " views, " << executor.elidedCopyCount() << " copies elided\n";
  }
}

// Without dropout (tiny GPT in bf16, head dimension 64) attention and
// attention_grad run through cuDNN's fused attention, inside the compiled
// plan (its softmax sums, dq accumulator and workspace in attention_grad's
// kernel block: no allocation beside the plan), and a step's loss and
// gradients agree with the own kernels' (ContextOptions::cudnnAttention
// off, the default).
TEST(CudaPlanCoverageTest, CudnnAttentionRunsInThePlanAsTheOwnKernels) {
  MTRT_REQUIRE_GPU();
  Bundle bundle = loadTestBundle(
      "tiny-gpt-bf16-nodrop",
      "megatron-compile models/tiny-gpt.yaml --bf16 --hidden-dropout=0 "
      "--attention-dropout=0 -o tiny-gpt-bf16-nodrop.mtb");
  const Function *train = bundle.findFunction("train_step");
  ASSERT_NE(train, nullptr);
  std::vector<int64_t> shape = train->values[train->inputs[0]].shape;
  host::Tensor tokens = randomIds(shape, 256, 3),
               labels = randomIds(shape, 256, 4);
  std::vector<host::TensorView> inputs = {viewOf(tokens), viewOf(labels)};
  host::ThreadPool pool(0);
  host::ParameterStore initial(bundle, DType::F32);
  initial.initialize(pool, 1234);
  initial.zeroGradients(pool);
  struct Step {
    double loss = 0;
    std::vector<host::Tensor> gradients;
  };
  auto step = [&](bool cudnnAttention, bool *used) {
    cuda::ContextOptions options;
    options.cudnnAttention = cudnnAttention;
    cuda::Context context(options);
    cuda::ParameterStore store(bundle, context);
    store.upload(initial);
    cuda::Executor executor(bundle, "train_step", store);
    EXPECT_EQ(executor.arenaBytes(), train->memoryPlan->arenaBytes);
    *used = executor.cudnnAttentionCount() > 0;
    if (cudnnAttention && context.cudnnAttention()) {
      EXPECT_GT(executor.cudnnAttentionCount(), 0u)
          << executor.cudnnAttentionDeclined();
      std::cout << "[ cuDNN    ] " << executor.cudnnAttentionCount()
                << " attention instructions through cuDNN\n";
    } else if (cudnnAttention) {
      std::cout << "[ cuDNN    ] none: " << context.cudnnAttentionMissing()
                << "\n";
    }
    Step result;
    result.loss = executor.run(inputs, {5, 5})[0].data<float>()[0];
    for (size_t p = 0; p < store.size(); ++p)
      result.gradients.push_back(store.gradientToHost(p));
    return result;
  };
  bool used = false, ownUsed = true;
  Step viaCudnn = step(true, &used), own = step(false, &ownUsed);
  EXPECT_FALSE(ownUsed);
  EXPECT_NEAR(viaCudnn.loss, own.loss, 2e-3 * std::abs(own.loss));
  for (size_t p = 0; p < own.gradients.size(); ++p)
    EXPECT_LE(relativeDifference(viaCudnn.gradients[p], own.gradients[p]),
              5e-2)
        << "gradient " << p;
}

// Grouped-query heads at head dimension 64 without dropout stay on the own
// Hopper kernels where they take the shape (planCudnnAttention: faster in
// llama-1.5b's step than cuDNN's), and go through cuDNN with the Hopper
// kernels off.
TEST(CudaPlanCoverageTest, GroupedQueryAttentionStaysOnTheHopperKernels) {
  MTRT_REQUIRE_GPU();
  Bundle bundle = loadTestBundle(
      "tiny-llama-bf16-hd64", "megatron-compile models/tiny-llama.yaml --bf16 "
                              "--kv-channels 64 -o tiny-llama-bf16-hd64.mtb");
  int major = 0;
  ASSERT_EQ(
      cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, 0),
      cudaSuccess);
  {
    cuda::Context probe;
    if (!probe.cudnnAttention()) {
      GTEST_SKIP() << probe.cudnnAttentionMissing();
    }
  }
  auto cudnnCount = [&](bool hopperAttention) {
    cuda::ContextOptions options;
    options.hopperAttention = hopperAttention;
    cuda::Context context(options);
    cuda::ParameterStore store(bundle, context);
    cuda::Executor executor(bundle, "train_step", store);
    return executor.cudnnAttentionCount();
  };
  if (major == 9) {
    EXPECT_EQ(cudnnCount(true), 0u);
  }
  EXPECT_GT(cudnnCount(false), 0u);
}

} // namespace
