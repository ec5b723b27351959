// Tests of a function's memory_plan (docs/BundleFormat.md, "Memory plan"):
// a valid plan is read, with a result in place of an operand that dies at an
// elementwise op; plans that put a block outside the arena, overlap two live
// values, reuse memory in place for an op that cannot compute in place, give
// a parameter view memory or misalign a block are rejected, naming the value
// and the rule; side buffers (format version 3) are read and checked the same
// way; the host executor runs in the plan's arena; a device backend takes the
// plan's side-buffer blocks and refuses a plan that gives less than it needs;
// executors share one arena, the largest of theirs.
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
// Instructions: 0 get_parameter, 1 linear, 2 gelu, 3 add.
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
  firstMemoryPlan(m)["offsets"][4] = 768;
  expectManifestRejected(
      m, {"functions[0].memory_plan.offsets[4]",
          "found 768 (value 4, 256 bytes, ends at 1024)",
          "a block inside the arena of 768 bytes (arena_bytes)"});
}

TEST(BundleMemoryPlanTest, LiveValuesDoNotOverlap) {
  Json m = planManifest();
  firstMemoryPlan(m)["offsets"][2] =
      0; // y on the input x, which lives to the end
  firstMemoryPlan(m)["offsets"][3] = 0;
  expectManifestRejected(
      m, {"functions[0].memory_plan.offsets[2]",
          "value 2 at [0, 256) overlaps value 0 at [0, 256), both "
          "live at instructions[1]",
          "disjoint memory for blocks live at the same time"});
}

TEST(BundleMemoryPlanTest, OnlyElementwiseOpsComputeInPlace) {
  Json m = planManifest();
  // add reads z, which dies there: in place is fine. linear may not write
  // over the operand it reads.
  firstMemoryPlan(m)["offsets"] = {0, -1, 256, 256, 256};
  Bundle::parseManifest("p.mtb", m.dump());
  Json bad = planManifest();
  bad["functions"][0]["instructions"][2]["op"] = "linear";
  bad["functions"][0]["instructions"][2]["operands"] = {2, 1};
  bad["functions"][0]["instructions"][2].erase("attrs");
  expectManifestRejected(
      bad, {"functions[0].memory_plan.offsets[3]",
            "value 3 at [256, 512) overlaps value 2 at [256, 512)",
            "for ops that compute in place"});
}

TEST(BundleMemoryPlanTest, ParameterViewsTakeNoMemory) {
  Json m = planManifest();
  firstMemoryPlan(m)["offsets"][1] = 512;
  expectManifestRejected(m, {"functions[0].memory_plan.offsets[1]", "found 512",
                             "-1: value 1 is a parameter view"});
  Json n = planManifest();
  firstMemoryPlan(n)["offsets"][2] = -1;
  expectManifestRejected(n, {"functions[0].memory_plan.offsets[2]", "found -1",
                             "value 2 is not a parameter view"});
}

TEST(BundleMemoryPlanTest, OffsetsAreAlignedAndOnePerValue) {
  Json m = planManifest();
  firstMemoryPlan(m)["offsets"][4] = 500;
  expectManifestRejected(m, {"functions[0].memory_plan.offsets[4]", "found 500",
                             "a multiple of the alignment 256"});
  Json n = planManifest();
  firstMemoryPlan(n)["offsets"].erase(4);
  expectManifestRejected(n, {"functions[0].memory_plan.offsets",
                             "found 4 offsets", "one per value (5)"});
  Json a = planManifest();
  firstMemoryPlan(a)["alignment"] = 48;
  expectManifestRejected(
      a, {"functions[0].memory_plan.alignment", "found 48", "a power of two"});
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
    std::vector<host::Tensor> result = executor.run({input}, {});
    const float *t = result[0].data<float>();
    outputs.emplace_back(t, t + 64);
  }
  EXPECT_EQ(outputs[0], outputs[1]);
}

// Executors that never run at once (a pipeline rank's stage functions)
// share one arena, the largest of theirs: two executors of the plan above
// hold 768 bytes together, not 1536, and each run gives what an executor
// with its own arena gives, whatever ran in the arena before it.
TEST(BundleMemoryPlanTest, ExecutorsShareAnArena) {
  Bundle bundle = Bundle::parseManifest("p.mtb", planManifest().dump());
  host::ThreadPool pool(2);
  host::ParameterStore store(bundle, DType::F32);
  store.initialize(pool, 7);
  std::vector<float> x(64), x2(64);
  for (size_t i = 0; i < x.size(); ++i) {
    x[i] = 0.01f * static_cast<float>(i) - 0.3f;
    x2[i] = 0.5f - 0.02f * static_cast<float>(i);
  }
  host::TensorView input{DType::F32, {4, 16}, x.data()};
  host::TensorView input2{DType::F32, {4, 16}, x2.data()};
  auto values = [](const host::Tensor &t) {
    return std::vector<float>(t.data<float>(), t.data<float>() + 64);
  };
  host::Executor alone(bundle, "step", store, pool);
  std::vector<float> expected = values(alone.run({input}, {})[0]);
  std::vector<float> expected2 = values(alone.run({input2}, {})[0]);

  host::SharedArena arena;
  host::Executor first(bundle, "step", store, pool, nullptr, &arena);
  host::Executor second(bundle, "step", store, pool, nullptr, &arena);
  EXPECT_EQ(arena.bytes(), size_t(768));
  EXPECT_EQ(first.arenaBytes(), size_t(768));
  EXPECT_EQ(values(first.run({input}, {})[0]), expected);
  EXPECT_EQ(values(second.run({input2}, {})[0]), expected2);
  EXPECT_EQ(values(first.run({input}, {})[0]), expected);

  // Once allocated, the arena cannot grow under its executors.
  try {
    arena.reserve(1024);
    FAIL() << "reserve after the first run did not throw";
  } catch (const Error &e) {
    EXPECT_EQ(e.code(), MTRT_STATUS_FAILED_PRECONDITION);
    EXPECT_NE(std::string(e.what()).find(
                  "needs 1024 bytes after the arena was allocated with 768"),
              std::string::npos)
        << e.what();
  }
}

// The plan above with side buffers after the values: the linear's bf16
// copy of x (256 bytes at 768, kept through the add) and the gelu's kernel
// block (256 bytes at 1024); arena 1280.
Json sideBufferManifest() {
  Json m = planManifest();
  firstMemoryPlan(m)["arena_bytes"] = 1280;
  firstMemoryPlan(m)["side_buffers"] = {{1, 768, 256, 3, 0},
                                        {2, 1024, 256, 2, -1}};
  return m;
}

TEST(BundleMemoryPlanTest, SideBuffersAreRead) {
  Bundle bundle = Bundle::parseManifest("p.mtb", sideBufferManifest().dump());
  const MemoryPlan &p = *bundle.functions()[0].memoryPlan;
  ASSERT_TRUE(p.hasSideBuffers);
  ASSERT_EQ(p.sideBuffers.size(), 2u);
  EXPECT_EQ(p.sideBuffers[0].instruction, 1u);
  EXPECT_EQ(p.sideBuffers[0].offset, 768u);
  EXPECT_EQ(p.sideBuffers[0].bytes, 256u);
  EXPECT_EQ(p.sideBuffers[0].until, 3u);
  EXPECT_EQ(p.sideBuffers[0].copyOf, 0);
  EXPECT_EQ(p.sideBuffers[1].until, 2u);
  EXPECT_EQ(p.sideBuffers[1].copyOf, -1);
  EXPECT_FALSE(Bundle::parseManifest("p.mtb", planManifest().dump())
                   .functions()[0]
                   .memoryPlan->hasSideBuffers);
}

TEST(BundleMemoryPlanTest, SideBuffersDoNotOverlapLiveBlocks) {
  // Over x (an input, live to the end).
  Json m = sideBufferManifest();
  firstMemoryPlan(m)["side_buffers"][1][1] = 0;
  expectManifestRejected(m,
                         {"functions[0].memory_plan.side_buffers[1]",
                          "the kernel block of instructions[2] at [0, 256) "
                          "overlaps value 0 at [0, 256)",
                          "both live at instructions[2]", "disjoint memory"});
  // Over the copy of x, which lives through the add.
  Json n = sideBufferManifest();
  firstMemoryPlan(n)["side_buffers"][1][1] = 768;
  expectManifestRejected(n, {"functions[0].memory_plan.side_buffers[1]",
                             "overlaps the copy of value 0 at [768, 1024)"});
  // A block released at the gelu leaves its memory to the add's.
  Json ok = sideBufferManifest();
  firstMemoryPlan(ok)["side_buffers"] = {{1, 768, 256, 2, 0},
                                         {3, 768, 256, 3, -1}};
  EXPECT_NO_THROW(Bundle::parseManifest("p.mtb", ok.dump()));
}

TEST(BundleMemoryPlanTest, SideBuffersAreCheckedEntries) {
  Json m = sideBufferManifest();
  firstMemoryPlan(m)["side_buffers"][1] = {1, 1024, 256, 2, -1};
  expectManifestRejected(m, {"functions[0].memory_plan.side_buffers[1][0]",
                             "found 1", "kernel block (copy of -1) first"});
  Json n = sideBufferManifest();
  firstMemoryPlan(n)["side_buffers"][0][3] = 0;
  expectManifestRejected(
      n, {"functions[0].memory_plan.side_buffers[0][3]", "found 0"});
  Json o = sideBufferManifest();
  firstMemoryPlan(o)["side_buffers"][1][1] = 1100;
  expectManifestRejected(o, {"functions[0].memory_plan.side_buffers[1][1]",
                             "found 1100", "a multiple of the alignment 256"});
  Json q = sideBufferManifest();
  firstMemoryPlan(q)["side_buffers"][1][2] = 512;
  expectManifestRejected(q, {"functions[0].memory_plan.side_buffers[1][1]",
                             "ends at 1536", "inside the arena of 1280 bytes"});
  Json r = sideBufferManifest();
  firstMemoryPlan(r)["side_buffers"][1] = {2, 1024};
  expectManifestRejected(r, {"functions[0].memory_plan.side_buffers[1]",
                             "found 2 numbers",
                             "[instruction, offset, bytes, until, copy of]"});
  Json t = sideBufferManifest();
  firstMemoryPlan(t)["side_buffers"][1] = {2, 1024, 256, 2, 0};
  expectManifestRejected(t, {"functions[0].memory_plan.side_buffers[1][4]",
                             "found 0", "one copy per value"});
  Json u = sideBufferManifest();
  firstMemoryPlan(u)["side_buffers"][1][4] = 5;
  expectManifestRejected(
      u, {"functions[0].memory_plan.side_buffers[1][4]", "found 5"});
}

TEST(BundleMemoryPlanTest, DeviceBackendsRunInThePlanWithItsSideBuffers) {
  Bundle bundle = Bundle::parseManifest("p.mtb", sideBufferManifest().dump());
  const Function &f = bundle.functions()[0];
  auto declared = [&](int64_t v) { return planValueBytes(f.values[v]); };
  // The backend copies x at the linear (200 bytes, through the add) and
  // needs 256 bytes of scratch at the gelu: the plan's blocks.
  auto fits = [](size_t position) {
    if (position == 1)
      return std::vector<SideBufferNeed>{{0, 1, -1}, {200, 3, 0}};
    if (position == 2)
      return std::vector<SideBufferNeed>{{256, 2, -1}};
    return std::vector<SideBufferNeed>{};
  };
  std::optional<PlannedArena> arena =
      layOutPlannedArena(f, declared, fits, 256, "test");
  ASSERT_TRUE(arena.has_value());
  EXPECT_EQ(arena->bytes, 1280u);
  EXPECT_EQ(arena->kernelOffset, (std::vector<int64_t>{-1, -1, 1024, -1}));
  EXPECT_EQ(arena->copyOffset, (std::vector<int64_t>{768, -1, -1, -1, -1}));
  // bf16 storage of f32 values fits the plan; f64 storage does not, nor a
  // stricter alignment, nor a plan without side buffers, nor no plan.
  EXPECT_TRUE(layOutPlannedArena(
      f, [&](int64_t v) { return declared(v) / 2; }, fits, 256, "test"));
  EXPECT_FALSE(layOutPlannedArena(
      f, [&](int64_t v) { return declared(v) * 2; }, fits, 256, "test"));
  EXPECT_FALSE(layOutPlannedArena(f, declared, fits, 512, "test"));
  Bundle old = Bundle::parseManifest("p.mtb", planManifest().dump());
  EXPECT_FALSE(
      layOutPlannedArena(old.functions()[0], declared, fits, 256, "test"));
  Json m = planManifest();
  m["functions"][0].erase("memory_plan");
  Bundle without = Bundle::parseManifest("p.mtb", m.dump());
  EXPECT_FALSE(
      layOutPlannedArena(without.functions()[0], declared, fits, 256, "test"));
}

TEST(BundleMemoryPlanTest, ABackendThatNeedsMoreThanThePlanGivesIsRefused) {
  Bundle bundle = Bundle::parseManifest("p.mtb", sideBufferManifest().dump());
  const Function &f = bundle.functions()[0];
  auto declared = [&](int64_t v) { return planValueBytes(f.values[v]); };
  auto needing = [](size_t position, SideBufferNeed at) {
    return [=](size_t p) {
      return p == position ? std::vector<SideBufferNeed>{at}
                           : std::vector<SideBufferNeed>{};
    };
  };
  expectError(
      [&] {
        layOutPlannedArena(f, declared, needing(1, {512, 3, 0}), 256, "cuda");
      },
      MTRT_STATUS_FAILED_PRECONDITION,
      {"step: instructions[1] (linear): the cuda backend needs a bf16 copy "
       "of value 0 of 512 bytes through instructions[3]",
       "the bundle's memory plan gives 256 bytes through instructions[3]",
       "recompile the bundle"});
  expectError(
      [&] {
        layOutPlannedArena(f, declared, needing(2, {256, 3, -1}), 256, "cuda");
      },
      MTRT_STATUS_FAILED_PRECONDITION,
      {"instructions[2] (gelu)", "its kernel block", "through instructions[3]",
       "gives 256 bytes through instructions[2]"});
  expectError(
      [&] {
        layOutPlannedArena(f, declared, needing(1, {1, 1, -1}), 256, "cuda");
      },
      MTRT_STATUS_FAILED_PRECONDITION,
      {"instructions[1] (linear)", "its kernel block", "has none there"});
}

} // namespace
