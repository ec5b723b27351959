// Tests of fused groups (format version 3, docs/BundleFormat.md, "Fused
// kernels"): a group's body is read and checked (its ops, what they read and
// define, its inner values, the kernel index and the payload ranges), the
// inner values take no arena memory, and the host executor runs a group's
// ops one by one with the unfused function's bits.
#include "BundleTestBuilder.h"
#include "ExecutorTestSupport.h"

#include "host/Executor.h"

#include <algorithm>

using namespace mtrt;
using namespace mtrt::test;

namespace {

// x, r [4, 16] f32 inputs; y = add(r, dropout(x)) as one group (values
// 0 x, 1 r, 2 y, 3 the inner dropout), or as two instructions.
Json groupManifest(bool fused) {
  FunctionBuilder f("step");
  int64_t x = f.input({4, 16}, "f32");
  int64_t r = f.input({4, 16}, "f32");
  int64_t y = f.value({4, 16});
  int64_t d = f.value({4, 16});
  Json dropout = {{"op", "dropout"},
                  {"operands", {x}},
                  {"results", {d}},
                  {"attrs", {{"p", 0.25}, {"seed", 9}}}};
  Json add = {{"op", "add"}, {"operands", {r, d}}, {"results", {y}}};
  if (fused) {
    Json &group = f.inst("fused", {x, r}, {y}, {{"kernel", 0}});
    group["body"] = Json::array({dropout, add});
  } else {
    f.inst("dropout", {x}, {d}, {{"p", 0.25}, {"seed", 9}});
    f.inst("add", {r, d}, {y}, Json::object(), {d});
  }
  f.output(y);
  Json function = f.build();
  function["memory_plan"] = {{"alignment", 256},
                             {"arena_bytes", fused ? 768 : 1024},
                             {"offsets", fused ? Json{0, 256, 512, -1}
                                               : Json{0, 256, 512, 768}}};
  Json manifest = manifestJson(modelJson(8, 16, 4, 1, 1), Json::array(),
                               Json::array({function}));
  manifest["version"] = 3;
  if (fused)
    manifest["kernels"] = {{"arch", "sm_90"},
                           {"names", {"mt_fused_0"}},
                           {"cubin", {{"offset", 0}, {"size", 4}}},
                           {"ptx", {{"offset", 4}, {"size", 3}}},
                           {"source", {{"offset", 7}, {"size", 0}}}};
  return manifest;
}

Bundle parse(const Json &manifest) {
  return Bundle::parseManifest("f.mtb", manifest.dump(), "CUBIPTX");
}

TEST(BundleFusedTest, ReadsTheGroupAndItsKernels) {
  Bundle bundle = Bundle::parseManifest("f.mtb", groupManifest(true).dump(),
                                        "CUBIPTX");
  const Function &f = bundle.functions()[0];
  ASSERT_EQ(f.instructions.size(), 1u);
  const Instruction &group = f.instructions[0];
  EXPECT_EQ(group.op, Op::Fused);
  EXPECT_EQ(group.attrs.kernel, 0);
  ASSERT_EQ(group.body.size(), 2u);
  EXPECT_EQ(group.body[0].op, Op::Dropout);
  EXPECT_EQ(group.body[1].op, Op::Add);
  EXPECT_EQ(f.innerValue, (std::vector<bool>{false, false, false, true}));
  const FusedKernels &kernels = bundle.fusedKernels();
  EXPECT_EQ(kernels.names, std::vector<std::string>{"mt_fused_0"});
  EXPECT_EQ(kernels.cubin, "CUBI");
  EXPECT_EQ(kernels.ptx, "PTX");
  // Version 3 kernels take f32 storage only; version 6's a type mask;
  // version 7's key their dropout on the samples.
  EXPECT_FALSE(kernels.typeMask);
  EXPECT_FALSE(kernels.sampleKeys);
  Json manifest = groupManifest(true);
  manifest["version"] = 6;
  EXPECT_TRUE(parse(manifest).fusedKernels().typeMask);
  EXPECT_FALSE(parse(manifest).fusedKernels().sampleKeys);
  manifest["version"] = 7;
  EXPECT_TRUE(parse(manifest).fusedKernels().typeMask);
  EXPECT_TRUE(parse(manifest).fusedKernels().sampleKeys);
}

TEST(BundleFusedTest, TheHostRunsTheGroupsOpsWithTheUnfusedBits) {
  std::vector<float> x(64), r(64);
  for (size_t i = 0; i < x.size(); ++i) {
    x[i] = 0.01f * static_cast<float>(i) - 0.3f;
    r[i] = 0.5f - 0.02f * static_cast<float>(i);
  }
  std::vector<std::vector<float>> outputs;
  for (bool fused : {true, false}) {
    Bundle bundle = Bundle::parseManifest(
        "f.mtb", groupManifest(fused).dump(), "CUBIPTX");
    host::ThreadPool pool(2);
    host::ParameterStore store(bundle, DType::F32);
    host::Executor executor(bundle, "step", store, pool);
    host::TensorView xs{DType::F32, {4, 16}, x.data()};
    host::TensorView rs{DType::F32, {4, 16}, r.data()};
    std::vector<host::Tensor> result = executor.run({xs, rs}, {3, 3});
    const float *y = result[0].data<float>();
    outputs.emplace_back(y, y + 64);
  }
  EXPECT_EQ(outputs[0], outputs[1]);
  EXPECT_NE(std::count(outputs[0].begin(), outputs[0].end(), 0.5f), 64);
}

TEST(BundleFusedTest, RejectsBadGroups) {
  {
    Json m = groupManifest(true);
    m["functions"][0]["instructions"][0].erase("body");
    expectError([&] { parse(m); }, MTRT_STATUS_INVALID_ARGUMENT,
                {"instructions[0].body: found no body",
                 "expected the group's ops (\"body\") for fused"});
  }
  {
    Json m = groupManifest(false);
    m["functions"][0]["instructions"][1]["body"] = Json::array();
    expectError([&] { parse(m); }, MTRT_STATUS_INVALID_ARGUMENT,
                {"instructions[1].body: found a body",
                 "expected a body only on fused instructions"});
  }
  {
    Json m = groupManifest(true);
    m["functions"][0]["instructions"][0]["attrs"]["kernel"] = 1;
    expectError([&] { parse(m); }, MTRT_STATUS_INVALID_ARGUMENT,
                {"instructions[0].attrs.kernel: found 1",
                 "one of the bundle's 1 fused kernels"});
  }
  {
    // The add reads the group's result before anything defines it.
    Json m = groupManifest(true);
    m["functions"][0]["instructions"][0]["body"][1]["operands"] = {1, 2};
    expectError([&] { parse(m); }, MTRT_STATUS_INVALID_ARGUMENT,
                {"body[1].operands[1]: found value 2",
                 "an operand of the group or a result of an earlier op"});
  }
  {
    Json m = groupManifest(true);
    m["functions"][0]["instructions"][0]["body"][1]["op"] = "gelu";
    m["functions"][0]["instructions"][0]["body"][1]["operands"] = {3};
    m["functions"][0]["instructions"][0]["body"][1]["attrs"] = {
        {"approximate", "tanh"}};
    expectError([&] { parse(m); }, MTRT_STATUS_INVALID_ARGUMENT,
                {"body[1].op: found \"gelu\"",
                 "an elementwise op a fused kernel computes"});
  }
  {
    Json m = groupManifest(true);
    m["functions"][0]["instructions"][0]["body"][1]["free"] = {3};
    expectError([&] { parse(m); }, MTRT_STATUS_INVALID_ARGUMENT,
                {"body[1].free: found a free list", "none inside a group"});
  }
  {
    // The dropout defines the result, the add an unlisted value: the
    // group's result 2 would be defined twice.
    Json m = groupManifest(true);
    m["functions"][0]["instructions"][0]["body"][0]["results"] = {2};
    m["functions"][0]["instructions"][0]["body"][1]["operands"] = {1, 2};
    expectError([&] { parse(m); }, MTRT_STATUS_INVALID_ARGUMENT,
                {"body[1].results[0]: found value 2, already defined"});
  }
  {
    Json m = groupManifest(true);
    m["functions"][0]["memory_plan"]["offsets"][3] = 768;
    m["functions"][0]["memory_plan"]["arena_bytes"] = 1024;
    expectError([&] { parse(m); }, MTRT_STATUS_INVALID_ARGUMENT,
                {"memory_plan.offsets[3]: found 768",
                 "lives inside a fused group"});
  }
  {
    Json m = groupManifest(true);
    m["kernels"]["ptx"]["size"] = 9;
    expectError([&] { parse(m); }, MTRT_STATUS_INVALID_ARGUMENT,
                {"kernels.ptx.size: found 9"});
  }
  {
    Json m = groupManifest(true);
    m["version"] = 2;
    expectError([&] { parse(m); }, MTRT_STATUS_INVALID_ARGUMENT,
                {"kernels: found a kernels section in a version 2 manifest",
                 "none before format version 3"});
  }
}

} // namespace
