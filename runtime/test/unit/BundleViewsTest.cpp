// Tests of a memory plan's attention views (docs/BundleFormat.md, `views`,
// issue 21): a view lies in its whole's block, at the whole's offset plus
// its own; a whole with its views is one block, live while any member is,
// lent to no result in place and free once the last member dies; undeclared
// or misplaced views are rejected, naming the value and the rule; the host
// executor runs in such a plan (the pieces in buffers of its own) and
// computes what it computes without a plan.
#include "BundleTestBuilder.h"
#include "ExecutorTestSupport.h"

#include "core/MemoryPlan.h"
#include "host/Executor.h"

using namespace mtrt;
using namespace mtrt::test;

namespace {

// x [4, 16] f32 (256 bytes) is an input; w [16, 16] a parameter view.
//   values: 0 x, 1 w, 2 y = linear(x, w), 3 a, 4 b = split(y, axis 1)
//           (y dies), 5 t = add(a, b) (a, b die), 6 u = gelu(t) (t dies;
//           the output)
// Plan: x at 0; y at 256 with its views a (byte 0) and b (byte 32); t at
// 512; u at 256, the group's block once a and b died; arena 768.
// Instructions: 0 get_parameter, 1 linear, 2 split, 3 add, 4 gelu.
Json viewManifest() {
  FunctionBuilder f("step");
  int64_t x = f.input({4, 16}, "f32");
  int64_t w = f.op("get_parameter", {}, {16, 16}, {{"parameter", 0}});
  int64_t y = f.op("linear", {x, w}, {4, 16});
  int64_t a = f.value({4, 8});
  int64_t b = f.value({4, 8});
  f.inst("split", {y}, {a, b}, {{"axis", 1}}, {y});
  int64_t t = f.op("add", {a, b}, {4, 8});
  f.freeLast(a);
  f.freeLast(b);
  int64_t u = f.op("gelu", {t}, {4, 8}, {{"approximate", "tanh"}});
  f.freeLast(t);
  f.output(u);
  Json function = f.build();
  function["memory_plan"] = {{"alignment", 256},
                             {"arena_bytes", 768},
                             {"offsets", {0, -1, 256, 256, 288, 512, 256}},
                             {"views", {{3, 2, 0}, {4, 2, 32}}}};
  return manifestJson(modelJson(8, 16, 4, 1, 1), {parameterJson("w", {16, 16})},
                      {function});
}

TEST(BundleViewsTest, ViewsAreReadAndAdmitted) {
  Bundle bundle = Bundle::parseManifest("p.mtb", viewManifest().dump());
  const MemoryPlan &p = *bundle.functions()[0].memoryPlan;
  EXPECT_TRUE(p.hasViews);
  EXPECT_EQ(p.wholeOf(3), 2);
  EXPECT_EQ(p.wholeOf(4), 2);
  EXPECT_EQ(p.wholeOf(2), -1);
  EXPECT_EQ(p.viewOffset[4], 32u);
  Json none = viewManifest();
  firstMemoryPlan(none)["views"] = Json::array();
  firstMemoryPlan(none)["arena_bytes"] = 1024;
  firstMemoryPlan(none)["offsets"] = {0, -1, 256, 512, 768, 256, 256};
  Bundle empty = Bundle::parseManifest("p.mtb", none.dump());
  const MemoryPlan &q = *empty.functions()[0].memoryPlan;
  EXPECT_TRUE(q.hasViews);
  EXPECT_EQ(q.wholeOf(3), -1);
}

TEST(BundleViewsTest, UndeclaredViewsAreRejected) {
  Json m = viewManifest();
  firstMemoryPlan(m).erase("views");
  expectManifestRejected(m, {"functions[0].memory_plan.offsets[4]", "found 288",
                             "a multiple of the alignment 256"});
  Json n = viewManifest();
  firstMemoryPlan(n)["views"] = {{4, 2, 32}};
  expectManifestRejected(
      n, {"functions[0].memory_plan.offsets[3]",
          "value 3 at [256, 384) overlaps value 2 (with its "
          "views) at [256, 512), both live at instructions[2]"});
}

TEST(BundleViewsTest, AViewIsAtItsWholesOffsetPlusItsOwn) {
  Json m = viewManifest();
  firstMemoryPlan(m)["offsets"][4] = 320;
  expectManifestRejected(m, {"functions[0].memory_plan.offsets[4]", "found 320",
                             "the offset of the whole (value 2, 256) plus the "
                             "view's 32 bytes (views)"});
  Json n = viewManifest();
  firstMemoryPlan(n)["views"][1][2] = 256;
  expectManifestRejected(n,
                         {"functions[0].memory_plan.views[1][2]", "found 256",
                          "an offset inside the whole's 256 bytes (value 2)"});
}

TEST(BundleViewsTest, ViewsAreCheckedEntries) {
  Json m = viewManifest();
  firstMemoryPlan(m)["views"][0] = {3, 3, 0};
  expectManifestRejected(m, {"functions[0].memory_plan.views[0][0]", "found 3",
                             "a value other than its whole"});
  Json n = viewManifest();
  firstMemoryPlan(n)["views"][0] = {3, 0, 0}; // the input x
  expectManifestRejected(n, {"functions[0].memory_plan.views[0][1]", "found 0",
                             "no input, output, parameter view"});
  Json o = viewManifest();
  firstMemoryPlan(o)["views"] = {{3, 2, 0}, {4, 3, 0}};
  expectManifestRejected(o, {"functions[0].memory_plan.views[1][1]", "found 3",
                             "a whole that is no view itself"});
  Json q = viewManifest();
  firstMemoryPlan(q)["views"].push_back({3, 2, 0});
  expectManifestRejected(q, {"functions[0].memory_plan.views[2][0]", "found 3",
                             "each value a view once"});
}

TEST(BundleViewsTest, AGroupIsOneBlockWhileAnyMemberLives) {
  // t in place of a: a is a view, its block the group's, which b still
  // holds at the add.
  Json m = viewManifest();
  firstMemoryPlan(m)["offsets"][5] = 256;
  firstMemoryPlan(m)["offsets"][6] = 512;
  expectManifestRejected(
      m, {"functions[0].memory_plan.offsets[5]",
          "value 5 at [256, 384) overlaps value 2 (with its "
          "views) at [256, 512), both live at instructions[3]"});
}

TEST(BundleViewsTest, TheHostExecutorRunsInAPlanWithViews) {
  Json without = viewManifest();
  without["functions"][0].erase("memory_plan");
  std::vector<float> x(64);
  for (size_t i = 0; i < x.size(); ++i)
    x[i] = 0.01f * static_cast<float>(i) - 0.3f;
  std::vector<std::vector<float>> outputs;
  for (const Json &m : {viewManifest(), without}) {
    Bundle bundle = Bundle::parseManifest("p.mtb", m.dump());
    host::ThreadPool pool(2);
    host::ParameterStore store(bundle, DType::F32);
    store.initialize(pool, 7);
    host::Executor executor(bundle, "step", store, pool);
    EXPECT_EQ(executor.arenaBytes(),
              bundle.functions()[0].memoryPlan ? size_t(768) : size_t(0));
    host::TensorView input{DType::F32, {4, 16}, x.data()};
    std::vector<host::Tensor> result = executor.run({input}, {});
    const float *u = result[0].data<float>();
    outputs.emplace_back(u, u + 32);
  }
  EXPECT_EQ(outputs[0], outputs[1]);
}

} // namespace
