// Tests of a function's memory_plan (docs/BundleFormat.md, "Memory plan"):
// a valid plan is read, with a result in place of an operand that dies at an
// elementwise op; plans that put a block outside the arena, overlap two live
// values, reuse memory in place for an op that cannot compute in place, give
// a parameter view memory or misalign a block are rejected, naming the value
// and the rule; and the host executor runs in the plan's arena.
#include "BundleTestBuilder.h"
#include "ExecutorTestSupport.h"

#include "core/MemoryPlan.h"
#include "host/Executor.h"

using namespace mtrt;
using namespace mtrt::test;

namespace {

// x [4, 16] f32 (256 bytes) is an input; w [16, 16] a parameter view.
//   values: 0 x, 1 w, 2 y = linear(x, w), 3 z = gelu(y) (y dies),
//           4 t = add(z, x) (z dies; the output)
// Plan: x at 0, y at 256, z in place of y, t at 512; arena 768.
Json planManifest() {
  FunctionBuilder f("step");
  int64_t x = f.input({4, 16}, "f32");
  int64_t w = f.op("get_parameter", {}, {16, 16}, {{"parameter", 0}});
  int64_t y = f.op("linear", {x, w}, {4, 16});
  int64_t z = f.op("gelu", {y}, {4, 16}, {{"approximate", "tanh"}});
  f.freeLast(y);
  int64_t t = f.op("add", {z, x}, {4, 16});
  f.freeLast(z);
  f.output(t);
  Json function = f.build();
  function["memory_plan"] = {{"alignment", 256},
                             {"arena_bytes", 768},
                             {"offsets", {0, -1, 256, 256, 512}}};
  return manifestJson(modelJson(8, 16, 4, 1, 1), {parameterJson("w", {16, 16})},
                      {function});
}

Json &plan(Json &m) { return m["functions"][0]["memory_plan"]; }

void expectRejected(const Json &manifest,
                    std::initializer_list<std::string> parts) {
  expectError([&] { Bundle::parseManifest("p.mtb", manifest.dump()); },
              MTRT_STATUS_INVALID_ARGUMENT, parts);
}

TEST(BundleMemoryPlanTest, AValidPlanIsRead) {
  Bundle bundle = Bundle::parseManifest("p.mtb", planManifest().dump());
  const std::optional<MemoryPlan> &p = bundle.functions()[0].memoryPlan;
  ASSERT_TRUE(p.has_value());
  EXPECT_EQ(p->alignment, 256u);
  EXPECT_EQ(p->arenaBytes, 768u);
  EXPECT_EQ(p->offsets, (std::vector<int64_t>{0, -1, 256, 256, 512}));
}

TEST(BundleMemoryPlanTest, APlanIsOptional) {
  Json m = planManifest();
  m["functions"][0].erase("memory_plan");
  Bundle bundle = Bundle::parseManifest("p.mtb", m.dump());
  EXPECT_FALSE(bundle.functions()[0].memoryPlan.has_value());
}

TEST(BundleMemoryPlanTest, BlocksStayInsideTheArena) {
  Json m = planManifest();
  plan(m)["offsets"][4] = 768;
  expectRejected(m, {"functions[0].memory_plan.offsets[4]",
                     "found 768 (value 4, 256 bytes, ends at 1024)",
                     "a block inside the arena of 768 bytes (arena_bytes)"});
}

TEST(BundleMemoryPlanTest, LiveValuesDoNotOverlap) {
  Json m = planManifest();
  plan(m)["offsets"][2] = 0; // y on the input x, which lives to the end
  plan(m)["offsets"][3] = 0;
  expectRejected(m, {"functions[0].memory_plan.offsets[2]",
                     "value 2 at [0, 256) overlaps value 0 at [0, 256), both "
                     "live at instructions[1]",
                     "disjoint memory for values live at the same time"});
}

TEST(BundleMemoryPlanTest, OnlyElementwiseOpsComputeInPlace) {
  Json m = planManifest();
  // add reads z, which dies there: in place is fine. linear may not write
  // over the operand it reads.
  plan(m)["offsets"] = {0, -1, 256, 256, 256};
  Bundle::parseManifest("p.mtb", m.dump());
  Json bad = planManifest();
  bad["functions"][0]["instructions"][2]["op"] = "linear";
  bad["functions"][0]["instructions"][2]["operands"] = {2, 1};
  bad["functions"][0]["instructions"][2].erase("attrs");
  expectRejected(bad, {"functions[0].memory_plan.offsets[3]",
                       "value 3 at [256, 512) overlaps value 2 at [256, 512)",
                       "for ops that compute in place"});
}

TEST(BundleMemoryPlanTest, ParameterViewsTakeNoMemory) {
  Json m = planManifest();
  plan(m)["offsets"][1] = 512;
  expectRejected(m, {"functions[0].memory_plan.offsets[1]", "found 512",
                     "-1: value 1 is a parameter view"});
  Json n = planManifest();
  plan(n)["offsets"][2] = -1;
  expectRejected(n, {"functions[0].memory_plan.offsets[2]", "found -1",
                     "value 2 is not a parameter view"});
}

TEST(BundleMemoryPlanTest, OffsetsAreAlignedAndOnePerValue) {
  Json m = planManifest();
  plan(m)["offsets"][4] = 500;
  expectRejected(m, {"functions[0].memory_plan.offsets[4]", "found 500",
                     "a multiple of the alignment 256"});
  Json n = planManifest();
  plan(n)["offsets"].erase(4);
  expectRejected(n, {"functions[0].memory_plan.offsets", "found 4 offsets",
                     "one per value (5)"});
  Json a = planManifest();
  plan(a)["alignment"] = 48;
  expectRejected(a, {"functions[0].memory_plan.alignment", "found 48",
                     "a power of two"});
}

TEST(BundleMemoryPlanTest, TheHostExecutorRunsInThePlansArena) {
  Json withPlan = planManifest();
  Json without = planManifest();
  without["functions"][0].erase("memory_plan");
  std::vector<float> x(64);
  for (size_t i = 0; i < x.size(); ++i)
    x[i] = 0.01f * static_cast<float>(i) - 0.3f;
  std::vector<std::vector<float>> outputs;
  for (const Json &m : {withPlan, without}) {
    Bundle bundle = Bundle::parseManifest("p.mtb", m.dump());
    host::ThreadPool pool(2);
    host::ParameterStore store(bundle, DType::F32);
    store.initialize(pool, 7);
    host::Executor executor(bundle, "step", store, pool);
    EXPECT_EQ(executor.arenaBytes(), bundle.functions()[0].memoryPlan
                                         ? size_t(768)
                                         : size_t(0));
    host::TensorView input{DType::F32, {4, 16}, x.data()};
    std::vector<host::Tensor> result = executor.run({input}, 0);
    const float *t = result[0].data<float>();
    outputs.emplace_back(t, t + 64);
  }
  EXPECT_EQ(outputs[0], outputs[1]);
}

TEST(BundleMemoryPlanTest, DeviceBackendsLayOutThePlanWithScratchAfterIt) {
  Bundle bundle = Bundle::parseManifest("p.mtb", planManifest().dump());
  const Function &f = bundle.functions()[0];
  auto declared = [&](int64_t v) { return planValueBytes(f.values[v]); };
  std::optional<PlannedArena> arena = layOutPlannedArena(f, declared, 100, 256);
  ASSERT_TRUE(arena.has_value());
  EXPECT_EQ(arena->scratchOffset, 768u);
  EXPECT_EQ(arena->scratchBytes, 100u);
  EXPECT_EQ(arena->bytes, 868u);
  // bf16 storage of f32 values fits the plan; f64 storage does not, nor a
  // stricter alignment, nor a function without a plan.
  EXPECT_TRUE(layOutPlannedArena(
      f, [&](int64_t v) { return declared(v) / 2; }, 0, 256));
  EXPECT_FALSE(layOutPlannedArena(
      f, [&](int64_t v) { return declared(v) * 2; }, 0, 256));
  EXPECT_FALSE(layOutPlannedArena(f, declared, 0, 512));
  Json m = planManifest();
  m["functions"][0].erase("memory_plan");
  Bundle without = Bundle::parseManifest("p.mtb", m.dump());
  EXPECT_FALSE(layOutPlannedArena(without.functions()[0], declared, 0, 256));
}

} // namespace
