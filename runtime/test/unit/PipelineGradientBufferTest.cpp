// Tests of a pipeline bundle's gradient_buffers (docs/BundleFormat.md,
// "Gradient reduction under pipeline parallelism", version 7): one buffer
// per pipeline rank, read and looked up by a rank's coordinates, and every
// way an edited manifest breaks it rejected with the field, what was found
// and what was expected.
#include "BundleTestBuilder.h"

using namespace mtrt;
using namespace mtrt::test;

namespace {

// Grid [2, 2, 1] (pp, dp, tp), two stages of one micro-batch under 1F1B;
// the stage functions pass a [4] value through. Parameters: w [4, 6] and
// u [6] on pipeline rank 0, v [6] on pipeline rank 1. Rank 0's buffer holds
// u then w (30 elements), rank 1's v (6), each padded to `size` with the
// distributed optimizer (reduced over the data axis 1).
Json pipelineManifest(bool distributed, int64_t size0 = 32,
                      int64_t size1 = 8) {
  Json functions = Json::array();
  auto passThrough = [&](const char *name, bool hasOutput) {
    FunctionBuilder f(name);
    int64_t x = f.input({4}, "f32");
    if (hasOutput)
      f.output(x);
    functions.push_back(f.build());
  };
  passThrough("s0f", true);
  passThrough("s0b", false);
  passThrough("s1f", true);
  passThrough("s1b", true);
  for (int64_t r = 0; r < 2; ++r) {
    int64_t size = r == 0 ? size0 : size1;
    std::string suffix = "_pp" + std::to_string(r);
    FunctionBuilder reduce("reduce_gradients" + suffix);
    int64_t in = reduce.input({size}, "f32");
    if (distributed)
      reduce.output(reduce.op(
          "reduce_scatter", {in}, {size / 2},
          {{"grid_axes", {1}}, {"scatter_axis", 0}, {"reduction", "sum"}}));
    else
      reduce.output(reduce.op("all_reduce", {in}, {size},
                              {{"grid_axes", {1}}, {"reduction", "sum"}}));
    functions.push_back(reduce.build());
    if (distributed) {
      FunctionBuilder gather("gather_parameters" + suffix);
      int64_t shard = gather.input({size / 2}, "f32");
      gather.output(gather.op("all_gather", {shard}, {size},
                              {{"grid_axes", {1}}, {"gather_axis", 0}}));
      functions.push_back(gather.build());
    }
  }
  Json parameters = {parameterJson("w", {4, 6}), parameterJson("u", {6}),
                     parameterJson("v", {6})};
  parameters[0]["pipeline_rank"] = 0;
  parameters[1]["pipeline_rank"] = 0;
  parameters[2]["pipeline_rank"] = 1;
  Json m = manifestJson(modelJson(8, 4, 3, 2, 2), parameters, functions);
  m["version"] = 7;
  m["grid"] = {{"shape", {2, 2, 1}}};
  auto step = [](const char *op, int64_t stage, int64_t peer = -1) {
    Json s = {{"op", op}, {"stage", stage}, {"micro_batch", 0}};
    if (peer >= 0)
      s["peer"] = peer;
    return s;
  };
  m["pipeline"] = {
      {"axis", 0},
      {"size", 2},
      {"virtual_stages", 1},
      {"micro_batches", 1},
      {"schedule", "1f1b"},
      {"layout", "even"},
      {"stages",
       {{{"stage", 0}, {"rank", 0}, {"first_layer", 0}, {"num_layers", 1},
         {"forward", "s0f"}, {"backward", "s0b"}, {"eval", "s0f"}},
        {{"stage", 1}, {"rank", 1}, {"first_layer", 1}, {"num_layers", 1},
         {"forward", "s1f"}, {"backward", "s1b"}, {"eval", "s1f"}}}},
      {"ranks",
       {{step("forward", 0), step("send_activation", 0, 1),
         step("recv_gradient", 0, 1), step("backward", 0)},
        {step("recv_activation", 1, 0), step("forward", 1),
         step("backward", 1), step("send_gradient", 1, 0)}}}};
  auto buffer = [&](int64_t rank, Json list, Json offsets, int64_t size) {
    std::string suffix = "_pp" + std::to_string(rank);
    Json b = {{"pipeline_rank", rank},
              {"reduce_function", "reduce_gradients" + suffix},
              {"parameters", list},
              {"offsets", offsets},
              {"size", size},
              {"grid_axes", {1}},
              {"distributed_optimizer", distributed}};
    if (distributed)
      b["gather_function"] = "gather_parameters" + suffix;
    return b;
  };
  m["gradient_buffers"] = {buffer(0, {1, 0}, {0, 6}, size0),
                           buffer(1, {2}, {0}, size1)};
  return m;
}

TEST(PipelineGradientBufferTest, EachPipelineRankHasItsBuffer) {
  for (bool distributed : {false, true}) {
    Bundle bundle = Bundle::parseManifest(
        "p.mtb", pipelineManifest(distributed, 32, 8).dump());
    ASSERT_TRUE(bundle.hasGradientBuffer());
    ASSERT_EQ(bundle.gradientBuffers().size(), 2u);
    const GradientBuffer &first = bundle.gradientBuffer({0, 1, 0});
    const GradientBuffer &second = bundle.gradientBuffer({1, 1, 0});
    EXPECT_EQ(first.pipelineRank, 0);
    EXPECT_EQ(first.parameters, (std::vector<int64_t>{1, 0}));
    EXPECT_EQ(first.size, 32);
    EXPECT_EQ(first.reduceFunction, "reduce_gradients_pp0");
    EXPECT_EQ(second.pipelineRank, 1);
    EXPECT_EQ(second.parameters, (std::vector<int64_t>{2}));
    EXPECT_EQ(second.size, 8);
    EXPECT_EQ(second.gridAxes, (std::vector<int64_t>{1}));
    EXPECT_EQ(second.reduceFunction, "reduce_gradients_pp1");
    EXPECT_EQ(second.distributedOptimizer, distributed);
    if (distributed) {
      EXPECT_EQ(second.gatherFunction, "gather_parameters_pp1");
    }
  }
}

// Expert parallelism: a parameter split over the buffer's data axis (an
// expert tensor, whole gradients on its rank) stays out of the buffer,
// with either optimizer.
TEST(PipelineGradientBufferTest, ParametersSplitOverTheDataAxisStayOut) {
  for (bool distributed : {false, true}) {
    Json m = pipelineManifest(distributed, 24);
    m["parameters"][1]["split_axes"] = Json::array({Json::array({1})});
    m["gradient_buffers"][0]["parameters"] = {0};
    m["gradient_buffers"][0]["offsets"] = {0};
    // The distributed optimizer steps it whole on its rank
    // (DistributedOptimizer's local parameters).
    Bundle bundle = Bundle::parseManifest("p.mtb", m.dump());
    EXPECT_EQ(bundle.gradientBuffer({0, 1, 0}).parameters,
              (std::vector<int64_t>{0}));
  }
}

TEST(PipelineGradientBufferTest, BadBuffersAreRejected) {
  Json m = pipelineManifest(true);
  m["version"] = 6;
  expectManifestRejected(
      m, {"gradient_buffers: found gradient_buffers in a version 6 "
          "manifest, expected none before format version 7"});
  m = pipelineManifest(true);
  m["gradient_buffer"] = m["gradient_buffers"][0];
  expectManifestRejected(
      m, {"gradient_buffer: found a gradient_buffer in a pipeline "
          "bundle, expected gradient_buffers, one per pipeline "
          "rank"});
  m = pipelineManifest(true);
  m["gradient_buffers"].erase(1);
  expectManifestRejected(
      m, {"gradient_buffers: found 1 buffers, expected 2, one per "
          "pipeline rank"});
  m = pipelineManifest(true);
  std::swap(m["gradient_buffers"][0], m["gradient_buffers"][1]);
  expectManifestRejected(m, {"gradient_buffers[0].pipeline_rank: found 1"});
  m = pipelineManifest(false, 36);
  m["gradient_buffers"][0]["parameters"] = {2, 1, 0};
  m["gradient_buffers"][0]["offsets"] = {0, 6, 12};
  expectManifestRejected(
      m, {"gradient_buffers[0].parameters[0]: found parameter 2 "
          "('v') of pipeline rank 1, expected a parameter of "
          "pipeline rank 0"});
  m = pipelineManifest(false, 24);
  m["gradient_buffers"][0]["parameters"] = {0};
  m["gradient_buffers"][0]["offsets"] = {0};
  expectManifestRejected(
      m, {"gradient_buffers[0].parameters: found no entry for "
          "parameter 1 ('u') of pipeline rank 0, expected every "
          "parameter of the rank"});
  m = pipelineManifest(false);
  m["gradient_buffers"][1]["grid_axes"] = {0};
  expectManifestRejected(m,
                         {"gradient_buffers[1].grid_axes: found axis 0 (the "
                          "pipeline axis), expected the data-parallel axis 1"});
  m = pipelineManifest(true);
  m["gradient_buffers"][1]["reduce_function"] = "reduce_gradients_pp9";
  expectManifestRejected(
      m, {"functions: found no function \"reduce_gradients_pp9\", "
          "expected reduce_gradients_pp9, which "
          "gradient_buffers[1] with distributed_optimizer needs"});
  m = pipelineManifest(true);
  m["gradient_buffers"][1]["reduce_function"] = "reduce_gradients_pp0";
  expectManifestRejected(
      m, {"functions.reduce_gradients_pp0: found [32] f32 -> [16] "
          "f32, expected [8] f32 -> [4] f32"});
  m = pipelineManifest(true);
  m["gradient_buffers"][0].erase("gather_function");
  expectManifestRejected(
      m, {"gradient_buffers[0].gather_function: found nothing"});
  m = pipelineManifest(false);
  m["gradient_buffers"][0]["gather_function"] = "gather_parameters_pp0";
  expectManifestRejected(m,
                         {"gradient_buffers[0].gather_function: found "
                          "\"gather_parameters_pp0\", expected none: only the "
                          "distributed optimizer gathers parameters"});
  m = pipelineManifest(false);
  m.erase("pipeline");
  expectManifestRejected(
      m, {"gradient_buffers: found gradient_buffers in a bundle "
          "without a pipeline section"});
}

} // namespace
